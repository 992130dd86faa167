"""The incident's timeline: one row per thing that happened, in time order.

Pending, firing, each notification per receiver with its outcome and the attempts it took,
each scale action with its from/to replicas, each finding, each silence that covered the alert
(created, and expired or ended while the incident was on), and the resolve. Rows carry plain
text; the templates escape it, so a label value holding markup stays text.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.act.incident_summary import format_value, human_duration
from agent.app.triage.facts import Facts

__all__ = ["Entry", "timeline"]


@dataclass(frozen=True)
class Entry:
    """One row: when, what kind (``pending``, ``firing``, ``notification``, ``action``, ``finding``,
    ``silence``, ``resolved``), what happened and how it ended (``ok``, ``failed``, ``retrying``, "")."""

    at_ms: int
    kind: str
    text: str
    outcome: str = ""

    def to_json(self) -> dict[str, object]:
        return {"at_ms": self.at_ms, "kind": self.kind, "text": self.text, "outcome": self.outcome}


def _attempts(n: int) -> str:
    if n <= 0:
        return ""
    return " on the first attempt" if n == 1 else f" after {n} attempts ({n - 1} retries)"


def timeline(f: Facts) -> list[Entry]:
    """Every row of ``f``'s incident, oldest first (rows at the same time keep the order above)."""
    inc, rows = f.incident, []
    rule = f.rule
    if f.pending_ms is not None:
        cond = f" ({rule.value_expr} {rule.condition})" if rule is not None and rule.condition else ""
        how = "estimated from the rule's for" if f.pending_estimated else "the condition first held"
        rows.append(Entry(f.pending_ms, "pending", f"pending: {how}{cond}"))
    wait = f" after {human_duration(inc.started_ms - f.pending_ms)} pending" if f.pending_ms else ""
    value = f" at value {format_value(f.fired_value)}" if f.fired_value is not None else ""
    rows.append(Entry(inc.started_ms, "firing", f"firing{value}{wait}"))
    for n in f.notifications:
        what = ("finding" if n.kind == "finding" else f"{n.status} notification" if n.status else "notification")
        if n.outcome == "delivered":
            text = f"{what} delivered to {n.receiver}{_attempts(n.attempts)}"
            ok = "ok"
        elif n.outcome == "failed":
            text = f"{what} to {n.receiver} failed for good{_attempts(n.attempts)}: {n.error}"
            ok = "failed"
        else:
            text = f"{what} to {n.receiver} queued, {n.attempts} attempt(s) so far" + (
                f", last error: {n.error}" if n.error else "")
            ok = "retrying"
        rows.append(Entry(n.at_ms, "notification", text, ok))
    for a in f.actions:
        verb = a.action.replace("_", "-")
        prefix = "dry run: would " if a.dry_run else ""
        text = f"{prefix}{verb} {a.service} from {a.from_replicas} to {a.to_replicas} replicas"
        rows.append(Entry(a.at_ms, "action", text + (f" ({a.reason})" if a.reason else ""), "ok"))
    for x in f.findings:
        change = f": set {x.setting} to {x.value}" if x.setting and x.value else (f": check {x.setting}"
                                                                                if x.setting else "")
        rows.append(Entry(x.at_ms, "finding", f"finding {x.kind}{change}. {x.summary}".strip()))
    for s in f.silences:
        who = f" by {s.created_by}" if s.created_by else ""
        why = f": {s.comment}" if s.comment else ""
        rows.append(Entry(max(s.starts_ms, f.start_ms), "silence",
                          f"silenced ({', '.join(s.matchers)}){who}{why}"))
        if s.ends_ms <= f.end_ms:
            rows.append(Entry(s.ends_ms, "silence", f"silence {s.id[:8]} ended"))
    if inc.resolved_ms:
        rows.append(Entry(inc.resolved_ms, "resolved",
                          f"resolved after {human_duration(inc.resolved_ms - inc.started_ms)} firing",
                          "ok"))
    order = {"pending": 0, "firing": 1, "action": 2, "notification": 3, "finding": 4, "silence": 5, "resolved": 6}
    return sorted(rows, key=lambda r: (r.at_ms, order.get(r.kind, 9)))
