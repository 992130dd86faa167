"""``sre-agent rules test``: promtool's rule unit-test format, run on the agent's own engine.

The same test files run under ``promtool test rules`` (Go, Prometheus 2.42) and here;
CI runs both, so any disagreement between the agent's PromQL/alerting semantics and
Prometheus' shows up as one passing and one failing (the parity check).

The procedure is promtool's (``cmd/promtool/unittest.go``): load ``input_series`` in
Prometheus' expanding notation at multiples of ``interval``; evaluate every group at
``0, evaluation_interval, 2*evaluation_interval, ...`` up to the last ``eval_time``
(groups in ``group_eval_order`` or file order); an ``alert_rule_test`` at
``eval_time`` compares the *firing* alerts of that rule after the evaluation at the
last step not after ``eval_time``; ``promql_expr_test`` queries run on the final store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.config import parse_duration
from agent.errors import AgentError, PromQLError, RuleError
from agent.gocompat import yamlv3
from agent.promql import Engine, Sample, Scalar, parse
from agent.promql.notation import parse_series_line
from agent.rules.files import load_rule_files
from agent.rules.manager import AlertState, RuleManager
from agent.series import Labels, labels_from
from agent.store import Store

__all__ = ["TestResult", "run_test_file"]


@dataclass
class TestResult:
    file: str
    failures: list[str] = field(default_factory=list)
    tests: int = 0
    failed_groups: list[str] = field(default_factory=list)  # test-group names, as promtool prints them

    @property
    def ok(self) -> bool:
        return not self.failures


def run_test_file(path: str | Path) -> TestResult:
    """Run every test group in one promtool test file."""
    path = Path(path)
    res = TestResult(str(path))
    try:
        doc: Any = yamlv3.load_file(path)
    except (OSError, yaml.YAMLError) as exc:
        res.failures.append(f"cannot read test file: {exc}")
        return res
    if not isinstance(doc, dict):
        res.failures.append("test file must be a mapping")
        return res
    rule_files = [str((path.parent / f).resolve()) if not Path(f).is_absolute() else f
                  for f in doc.get("rule_files") or []]
    try:
        eval_interval = parse_duration(doc.get("evaluation_interval", "1m"))
        groups = load_rule_files(rule_files)
    except (ValueError, RuleError) as exc:
        res.failures.append(str(exc))
        return res
    order = doc.get("group_eval_order") or []
    if order:
        rank = {name: i for i, name in enumerate(order)}
        groups = sorted(groups, key=lambda g: rank.get(g.name, len(rank)))
    for i, test in enumerate(doc.get("tests") or []):
        res.tests += 1
        name = test.get("name") or f"tests[{i}]"
        try:
            errs = _run_one(test, groups, eval_interval)
        except (AgentError, ValueError, KeyError, TypeError) as exc:
            errs = [f"{type(exc).__name__}: {exc}"]
        res.failures.extend(f"{name}: {e}" for e in errs)
        if errs:
            res.failed_groups.append(name)
    return res


def _run_one(test: dict[str, Any], groups: list[Any], eval_interval_s: float) -> list[str]:
    interval_ms = int(parse_duration(test.get("interval", f"{eval_interval_s:g}s")) * 1000)
    step_ms = int(eval_interval_s * 1000)
    store = Store(retention_ms=2**62)
    for item in test.get("input_series") or []:
        labels, values = parse_series_line(f"{item['series']} {item['values']}")
        for i, v in enumerate(values):
            if v is not None:
                store.append(labels, i * interval_ms, v)
    engine = Engine(store, subquery_step_ms=step_ms)  # promtool: SubqueryInterval = evaluation_interval
    manager = RuleManager(groups, store, engine, default_interval_s=eval_interval_s,
                          external_labels={str(k): str(v) for k, v in (test.get("external_labels") or {}).items()},
                          external_url=str(test.get("external_url") or ""))
    alert_tests = sorted(test.get("alert_rule_test") or [], key=lambda t: parse_duration(t["eval_time"]))
    expr_tests = test.get("promql_expr_test") or []
    max_ms = max([int(parse_duration(t["eval_time"]) * 1000) for t in [*alert_tests, *expr_tests]] or [0])
    errors: list[str] = []
    pending = list(alert_tests)
    ts = 0
    while ts <= max_ms:
        for g in manager.groups:
            manager.eval_group(g, ts)
        rule_errors = [f"rule: {r.spec.name}, time: {_go_duration(ts)}, err: {r.last_error}"
                       for g in manager.groups for r in g.rules if r.health == "err"]
        if rule_errors:  # promtool stops the test group at the first evaluation errors
            return errors + rule_errors
        while pending and ts <= parse_duration(pending[0]["eval_time"]) * 1000 < ts + step_ms:
            errors.extend(_check_alerts(manager, pending.pop(0)))
        ts += step_ms
    for t in expr_tests:
        errors.extend(_check_expr(engine, t))
    return errors


def _check_alerts(manager: RuleManager, t: dict[str, Any]) -> list[str]:
    name = t["alertname"]
    got = sorted(
        (a.labels, sorted(a.annotations.items()))
        for g in manager.groups for r in g.rules if r.spec.name == name
        for a in r.alerts.values() if a.state is AlertState.FIRING
    )
    want = sorted(
        (labels_from(None, {**{str(k): str(v) for k, v in (e.get("exp_labels") or {}).items()}, "alertname": name}),
         sorted((str(k), str(v)) for k, v in (e.get("exp_annotations") or {}).items()))
        for e in t.get("exp_alerts") or []
    )
    if got == want:
        return []
    return [f"alertname: {name}, time: {t['eval_time']},\n    exp:{_fmt_alerts(want)},\n    got:{_fmt_alerts(got)}"]


def _fmt_alerts(alerts: list[Any]) -> str:
    return "[" + ", ".join(f"{{labels: {dict(lab)}, annotations: {dict(ann)}}}" for lab, ann in alerts) + "]"


def _check_expr(engine: Engine, t: dict[str, Any]) -> list[str]:
    at_ms = int(parse_duration(t["eval_time"]) * 1000)
    try:
        result = engine.instant(parse(t["expr"]), at_ms)
    except PromQLError as exc:
        return [f"expr: {t['expr']!r}, time: {t['eval_time']}, err: {exc}"]
    got: list[tuple[Labels, float]] = (
        [((), result.value)] if isinstance(result, Scalar)
        else [(s.labels, s.value) for s in result if isinstance(s, Sample)] if isinstance(result, list)
        else []
    )
    want: list[tuple[Labels, float]] = []
    for e in t.get("exp_samples") or []:
        text = e.get("labels") or "{}"
        labels, _ = parse_series_line(f"{text} 0")
        want.append((labels, float(e["value"])))
    if _same_samples(got, want):
        return []
    return [f"expr: {t['expr']!r}, time: {t['eval_time']},\n"
            f"    exp: {_fmt_samples(want)}\n    got: {_fmt_samples(got)}"]


def _same_samples(got: list[tuple[Labels, float]], want: list[tuple[Labels, float]]) -> bool:
    if len(got) != len(want):
        return False
    for (gl, gv), (wl, wv) in zip(sorted(got, key=lambda s: s[0]), sorted(want, key=lambda s: s[0]), strict=True):
        if gl != wl:
            return False
        if gv != wv:  # exact, NaN never equal: promtool compares with reflect.DeepEqual
            return False
    return True


def _fmt_samples(samples: list[tuple[Labels, float]]) -> str:
    return "[" + ", ".join(f"{dict(lab)} {v}" for lab, v in sorted(samples, key=lambda s: s[0])) + "]"


def _go_duration(ms: int) -> str:
    """Go's Duration.String() for whole milliseconds (``1m30s``, ``0s``)."""
    if ms == 0:
        return "0s"
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s = rest / 1000
    out = (f"{h}h" if h else "") + (f"{m}m" if h or m else "")
    return out + f"{s:g}s"
