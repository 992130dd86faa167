"""Findings intake: what node agents forward (``POST /api/v1/findings``), read strictly and matched to an alert.

A node agent (``forward:``, :mod:`agent.act.sinks.forward`) posts one finding per request::

    {"version": "1", "key": "finding:forward:3f2a...:1717...", "labels": {"node": "gpu-node-7"},
     "finding": {<Finding.to_json()>}, "alert": {"labels": {...}, "startsAt": 1717...}}

:func:`parse_forwarded` checks all of it (types, sizes, the finding's fields and no others, the
severity scale, ``details`` at most 8 levels deep and 10,000 values, ``alert.startsAt`` a Unix time in
milliseconds the agent can store) and raises :class:`ValueError` naming the first problem by its path
(``finding.evidence[3]: ...``), which the HTTP layer answers with 400. Unlike the Alertmanager
webhook, unknown keys are refused: both ends are this agent, so an unknown key is a version skew
worth saying, not a newer sender to tolerate.

**Which incident.** The central agent holds the fleet's alerts; a finding belongs in the incident of
the firing alert about the same thing. :func:`match` compares *identity labels*: ``instance``,
``gpu``, ``UUID`` and the node, which dcgm-exporter calls ``Hostname`` (``hostname`` on its main
branch) and Kubernetes relabelling usually ``node``: the three are one identity here. The finding's
identity is the node agent's ``forward.labels``, the finding's own labels and, when the node agent
raised the finding for one of its alerts, that alert's labels. An alert matches when every identity
label both carry is equal, they share at least one, and its ``alertname`` is the node alert's when
one is given. Of several, the one sharing the most identity labels wins, then the latest to fire.
No match: the finding is routed by its own labels and recorded as an incident of its own, as a local
finding without an alert is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.act import intake
from agent.act.dispatch import Dispatcher
from agent.act.notification import AlertSnapshot, fingerprint
from agent.act.state import StateDB
from agent.diagnose.findings import Finding

__all__ = ["IDENTITY_LABELS", "MAX_BODY_BYTES", "Forwarded", "identity", "match", "parse_forwarded", "record"]

#: The largest request body taken (413 above it): a finding's evidence is a few log lines.
MAX_BODY_BYTES = 256 * 1024
_VERSION = "1"
_KEY = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII, no spaces: the outbox's keys
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}")
_SEVERITIES = ("critical", "warning", "info")
_MAX_LABELS = 64
_MAX_VALUE = 1024  # characters of a label value
_MAX_TEXT = 8192  # characters of a summary or an evidence line
_MAX_EVIDENCE = 200
#: ``details`` is free-form JSON: a diagnosis writes a few levels (per-GPU lists of numbers). Bounded so that
#: what is stored, hashed and rendered later can never recurse too deep or grow without end (a 400 here).
_DETAILS_DEPTH = 8
_DETAILS_VALUES = 10_000
_TOP = frozenset({"version", "key", "labels", "finding", "alert"})
_ALERT = frozenset({"labels", "startsAt"})
_STRINGS = {"kind": 128, "summary": _MAX_TEXT, "severity": 16, "setting": 256, "suggested_value": 256,
            "runbook_url": 2048}
_FINDING = frozenset({*_STRINGS, "ok", "evidence", "details", "labels"})
#: Identity label -> the identity it stands for (the node's three spellings are one).
IDENTITY_LABELS = {"instance": "instance", "gpu": "gpu", "UUID": "UUID",
                   "node": "node", "Hostname": "node", "hostname": "node"}


@dataclass(frozen=True)
class Forwarded:
    """One forwarded finding, checked."""

    key: str
    finding: Finding
    labels: dict[str, str]  # the node agent's forward.labels
    alert_labels: dict[str, str]  # the node agent's alert the finding is about; empty when none

    @property
    def alertname(self) -> str:
        return self.alert_labels.get("alertname", "")

    def identity(self) -> dict[str, str]:
        """The identity labels of what the finding is about (see the module docstring)."""
        return identity({**self.alert_labels, **self.finding.labels, **self.labels})


def identity(labels: Mapping[str, str]) -> dict[str, str]:
    """The identity labels among ``labels``, the node's spellings folded into ``node``."""
    out: dict[str, str] = {}
    for name, value in labels.items():
        ident = IDENTITY_LABELS.get(name)
        if ident is not None and value:
            out.setdefault(ident, value)
    return out


def match(forwarded: Forwarded, alerts: Iterable[AlertSnapshot]) -> AlertSnapshot | None:
    """The firing alert the finding belongs to (see the module docstring), else None."""
    want = forwarded.identity()
    name = forwarded.alertname
    best: tuple[int, int] | None = None
    found: AlertSnapshot | None = None
    for a in alerts:
        if a.status != "firing" or (name and a.labels.get("alertname") != name):
            continue
        have = identity(a.labels)
        shared = want.keys() & have.keys()
        if not shared or any(want[k] != have[k] for k in shared):
            continue
        rank = (len(shared), a.starts_at_ms)
        if best is None or rank > best:
            best, found = rank, a
    return found


def record(db: StateDB, d: Dispatcher, f: Forwarded, rule_alerts: list[AlertSnapshot], now_ms: int) -> dict[str, Any]:
    """On the state database's writer thread: match ``f`` among the rule alerts and the firing intake
    alerts, then record its key and the finding (incident event, notifications) in one transaction.
    A key recorded before changes nothing (``duplicate``). The finding carries the node's labels."""
    firing = [intake.snapshot(a) for a in db.intake.current(now_ms=now_ms, resolved_keep_ms=0) if a.status == "firing"]
    finding = replace(f.finding, labels={**f.labels, **f.finding.labels})
    alert = match(f, [*rule_alerts, *firing])
    fp = alert.fingerprint if alert is not None else fingerprint(
        {"finding": finding.kind, "severity": finding.severity, **finding.labels})
    with db.transaction():
        known = db.forwarded.get(f.key)
        if known is not None:
            return {"key": f.key, "duplicate": True, "fingerprint": known, "alertname": "", "queued": 0}
        db.forwarded.add(f.key, fingerprint=fp, now_ms=now_ms)
        queued = d.post_finding(finding, alert, now_ms=now_ms, forward=False)
    return {"key": f.key, "duplicate": False, "fingerprint": fp, "queued": queued,
            "alertname": alert.labels.get("alertname", "") if alert is not None else ""}


def parse_forwarded(data: Mapping[str, Any]) -> Forwarded:
    """A forwarded finding (a JSON object) -> :class:`Forwarded`; ``ValueError`` names what is wrong."""
    _known(data, _TOP, "")
    version = intake.json_field(data, "version", str, "")
    if version != _VERSION:
        raise ValueError(f"version: expected {_VERSION!r} (the findings intake format), not {version[:20]!r}")
    key = intake.json_field(data, "key", str, "")
    if not _KEY.fullmatch(key):
        raise ValueError("key: 1 to 256 printable ASCII characters without spaces")
    labels = _labels(data.get("labels", {}), "labels")
    alert_labels: dict[str, str] = {}
    if "alert" in data:
        alert = intake.json_field(data, "alert", dict, "")
        _known(alert, _ALERT, "alert")
        alert_labels = _labels(intake.json_field(alert, "labels", dict, "alert"), "alert.labels")
        if "startsAt" in alert:
            intake.check_time_ms(intake.json_field(alert, "startsAt", int, "alert"), "alert.startsAt")
    finding = _finding(intake.json_field(data, "finding", dict, ""))
    intake.check_nesting(data, "the body", max_depth=_DETAILS_DEPTH + 3)  # lone surrogates anywhere
    return Forwarded(key, finding, labels, alert_labels)


def _finding(raw: Mapping[str, Any]) -> Finding:
    _known(raw, _FINDING, "finding")
    values: dict[str, Any] = {}
    for name, limit in _STRINGS.items():
        if name in raw or name in ("kind", "summary"):
            text = intake.json_field(raw, name, str, "finding")
            if len(text) > limit:
                raise ValueError(f"finding.{name}: {len(text)} characters, more than the {limit} taken")
            values[name] = text
    if not _KIND.fullmatch(values["kind"]):
        raise ValueError(f"finding.kind: expected a name like 'gpu-oom-runtime', not {values['kind'][:40]!r}")
    if not values["summary"].strip():
        raise ValueError("finding.summary: empty")
    if values.setdefault("severity", "warning") not in _SEVERITIES:
        raise ValueError(f"finding.severity: one of {', '.join(_SEVERITIES)}, not {values['severity']!r}")
    if "ok" in raw:
        values["ok"] = intake.json_field(raw, "ok", bool, "finding")
    evidence = intake.json_field(raw, "evidence", list, "finding") if "evidence" in raw else []
    if len(evidence) > _MAX_EVIDENCE:
        raise ValueError(f"finding.evidence: {len(evidence)} lines, more than the {_MAX_EVIDENCE} taken")
    for i, line in enumerate(evidence):
        if not isinstance(line, str) or len(line) > _MAX_TEXT:
            raise ValueError(f"finding.evidence[{i}]: must be a string of at most {_MAX_TEXT} characters")
    values["evidence"] = list(evidence)
    details = intake.json_field(raw, "details", dict, "finding") if "details" in raw else {}
    intake.check_nesting(details, "finding.details", max_depth=_DETAILS_DEPTH, max_values=_DETAILS_VALUES)
    values["details"] = dict(details)
    values["labels"] = _labels(raw.get("labels", {}), "finding.labels")
    return Finding(**values)


def _known(obj: Mapping[str, Any], keys: frozenset[str], path: str) -> None:
    unknown = sorted(set(obj) - keys)
    if unknown:
        where = f"{path}: " if path else ""
        raise ValueError(f"{where}unknown key {unknown[0][:40]!r}; expected {', '.join(sorted(keys))}")


def _labels(raw: Any, path: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must be an object, not {intake.type_name(raw)}")
    if len(raw) > _MAX_LABELS:
        raise ValueError(f"{path}: {len(raw)} labels, more than the {_MAX_LABELS} taken")
    for name, value in raw.items():
        if not _LABEL.fullmatch(name):
            raise ValueError(f"{path}: {name[:40]!r} is not a label name")
        if not isinstance(value, str) or len(value) > _MAX_VALUE:
            raise ValueError(f"{path}.{name}: must be a string of at most {_MAX_VALUE} characters")
    return dict(raw)
