"""Loading and validating Prometheus rule files, the way ``promtool check rules`` does.

A rule file is plain Prometheus (``groups:`` of ``record``/``alert`` rules), so the very
files the agent evaluates load unchanged into a real Prometheus (DESIGN.md decision 1).
Everything is checked here, once, at load time: structure and unknown keys, names,
durations, the PromQL (including whether it is inside the engine's subset) and every
label and annotation template. All problems are reported together, each naming file,
group and rule like promtool (``rules/vllm.rules.yaml: group "vllm", rule 3,
"VLLMKVCacheSaturated": could not parse expression: ...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from agent.config import parse_duration
from agent.errors import PromQLError, RuleError, TemplateError, UnsupportedError
from agent.gocompat import yamlv3
from agent.promql import Expr, metric_names, parse
from agent.promql.rewrite import Matcher, rewrite
from agent.rules.template import Template, compile_template
from agent.series import is_label_name

__all__ = ["GroupSpec", "RuleSpec", "load_rule_files", "parse_rule_file"]

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_GROUP_KEYS = {"name", "interval", "limit", "rules"}
_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


@dataclass(frozen=True)
class RuleSpec:
    """One validated rule. ``kind`` is ``"alert"`` or ``"record"``."""

    kind: str
    name: str
    expr_text: str
    expr: Expr = field(compare=False, repr=False)
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    label_templates: dict[str, Template] = field(default_factory=dict, compare=False, repr=False)
    annotation_templates: dict[str, Template] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class GroupSpec:
    name: str
    file: str
    interval_s: float | None  # None: the configured default evaluation interval
    limit: int
    rules: tuple[RuleSpec, ...]

    def metric_names(self) -> tuple[frozenset[str], bool]:
        """Metric names the group's expressions select, and whether any selector has no
        fixed name (then the store must keep everything)."""
        names: set[str] = set()
        unnamed = False
        for r in self.rules:
            n, u = metric_names(r.expr)
            names |= n
            unnamed |= u
        return frozenset(names), unnamed


def parametrize(groups: list[GroupSpec], *, selector: list[Matcher] | None = None,
                by: list[str] | None = None) -> list[GroupSpec]:
    """``groups`` with every expression rewritten for many clusters in one TSDB (the mixin parameters
    of :mod:`agent.promql.rewrite`): ``selector`` on every series selector, ``by`` labels kept apart."""
    if not selector and not by:
        return groups
    out, errors = [], []
    for g in groups:
        rules = []
        for r in g.rules:
            try:
                text = rewrite(r.expr_text, selector=selector, by=by)
                rules.append(replace(r, expr_text=text, expr=parse(text)))
            except PromQLError as exc:
                errors.append(f'{g.file}: group "{g.name}", rule "{r.name}": {exc}')
        out.append(replace(g, rules=tuple(rules)))
    if errors:
        raise RuleError(errors)
    return out


def load_rule_files(paths: Iterable[str | Path]) -> list[GroupSpec]:
    """Every group of every file, in order; raises one RuleError listing all problems."""
    groups: list[GroupSpec] = []
    errors: list[str] = []
    for path in paths:
        try:
            groups.extend(parse_rule_file(Path(path)))
        except RuleError as exc:
            errors.extend(exc.errors)
    if errors:
        raise RuleError(errors)
    return groups


def parse_rule_file(path: Path) -> list[GroupSpec]:
    try:
        data: Any = yamlv3.load_file(path)
    except OSError as exc:
        raise RuleError(f"{path}: cannot read rule file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise RuleError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) - {"groups"}:
        extra = sorted(set(data) - {"groups"}) if isinstance(data, dict) else []
        raise RuleError(f"{path}: expected a mapping with only 'groups'" + (f" (unknown: {extra})" if extra else ""))
    errors: list[str] = []
    groups: list[GroupSpec] = []
    seen: set[str] = set()
    for gi, g in enumerate(data.get("groups") or []):
        if not isinstance(g, dict) or not isinstance(g.get("name"), str) or not g["name"]:
            errors.append(f"{path}: groups[{gi}]: a group needs a non-empty 'name'")
            continue
        name = g["name"]
        where = f'{path}: group "{name}"'
        if name in seen:
            errors.append(f'{where}: groupname: "{name}" is repeated in the same file')
        seen.add(name)
        for key in sorted(set(g) - _GROUP_KEYS):
            errors.append(f"{where}: unknown field {key!r}")
        interval = _duration(g.get("interval"), f"{where}: interval", errors)
        limit = g.get("limit", 0)
        if not isinstance(limit, int) or limit < 0:
            errors.append(f"{where}: limit must be a non-negative integer")
            limit = 0
        rules = []
        raw_rules = g.get("rules") or []
        if not isinstance(raw_rules, list):
            errors.append(f"{where}: rules must be a list")
            raw_rules = []
        for ri, raw in enumerate(raw_rules, start=1):
            rule = _rule(raw, ri, where, errors)
            if rule is not None:
                rules.append(rule)
        groups.append(GroupSpec(name, str(path), interval, limit, tuple(rules)))
    if errors:
        raise RuleError(errors)
    return groups


def _duration(value: object, where: str, errors: list[str]) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        errors.append(f"{where}: {exc}")
        return None


def _rule(raw: object, index: int, group_where: str, errors: list[str]) -> RuleSpec | None:
    if not isinstance(raw, dict):
        errors.append(f"{group_where}, rule {index}: expected a mapping")
        return None
    record, alert = raw.get("record"), raw.get("alert")
    name = str(record or alert or "")
    where = f'{group_where}, rule {index}, "{name}"'
    before = len(errors)
    for key in sorted(set(raw) - _RULE_KEYS):
        errors.append(f"{where}: unknown field {key!r}")
    if record is None and alert is None:
        errors.append(f"{where}: one of 'record' or 'alert' must be set")
        return None
    if record is not None and alert is not None:
        errors.append(f"{where}: only one of 'record' and 'alert' must be set")
        return None
    kind = "record" if record is not None else "alert"
    if kind == "record" and not _METRIC_NAME.match(name):
        errors.append(f"{where}: invalid recording rule name: {name!r}")
    if kind == "alert" and not name:
        errors.append(f"{where}: alert name must not be empty")
    if kind == "record":
        for key in ("annotations", "for", "keep_firing_for"):
            if key in raw:
                errors.append(f"{where}: invalid field '{key}' in recording rule")
    labels = _string_map(raw.get("labels"), f"{where}: labels", errors)
    annotations = _string_map(raw.get("annotations"), f"{where}: annotations", errors)
    for lname in labels:
        if not is_label_name(lname) or lname == "__name__":
            errors.append(f"{where}: invalid label name: {lname!r}")
    expr_text = raw.get("expr")
    expr: Any = None
    if not isinstance(expr_text, str) or not expr_text.strip():
        errors.append(f"{where}: field 'expr' must be set in rule")
    else:
        try:
            expr = parse(expr_text)
        except UnsupportedError as exc:
            errors.append(f"{where}: expression uses {exc.construct}, which the agent's PromQL engine does not "
                          f"support{f' ({exc})' if str(exc) else ''}")
        except PromQLError as exc:
            errors.append(f"{where}: could not parse expression: {exc}")
    for_s = _duration(raw.get("for"), f"{where}: for", errors) or 0.0
    keep_s = _duration(raw.get("keep_firing_for"), f"{where}: keep_firing_for", errors) or 0.0
    label_t = _templates(labels, f"{where}: label", errors) if kind == "alert" else {}
    annot_t = _templates(annotations, f"{where}: annotation", errors)
    if len(errors) > before:
        return None
    return RuleSpec(kind, name, expr_text.strip() if isinstance(expr_text, str) else "", expr, for_s, keep_s,
                    labels, annotations, label_t, annot_t)


def _string_map(value: object, where: str, errors: list[str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"{where}: expected a mapping")
        return {}
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            errors.append(f"{where}: {k}: expected a string")
            continue
        out[str(k)] = str(v)
    return out


def _templates(values: dict[str, str], where: str, errors: list[str]) -> dict[str, Template]:
    out = {}
    for key, text in values.items():
        try:
            out[key] = compile_template(text, where=f"{where} {key}")
        except TemplateError as exc:
            errors.append(f"{where} {key}: {exc}")
    return out
