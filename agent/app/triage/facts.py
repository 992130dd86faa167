"""What the triage report knows about one incident, gathered from the state database and the rules.

Everything here is a fact the agent recorded or loaded, not an interpretation: the incident and its
events (fired, notified with the attempts it took, notification given up, scale actions with their
from/to replicas, findings, resolved), the notifications still waiting in the outbox for it (a
receiver that is down: retrying, with the last error), the silences whose matchers match its
labels and whose time overlaps it, and its alerting rule (:mod:`.rule`). :func:`read_state` is the
only part that touches SQLite; the daemon runs it on the state database's writer thread
(:meth:`~agent.act.state.StateDB.run`) and the CLI calls it directly. :func:`facts` is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.act.state import Incident, OutboxItem, Silence, StateDB
from agent.app.triage.rule import RuleInfo, find_rule
from agent.errors import NotFoundError
from agent.matchers import parse_matcher
from agent.rules.files import GroupSpec

__all__ = ["Facts", "Finding", "NotificationOutcome", "ScaleAction", "SilenceFact", "StateRead", "facts",
           "facts_json", "read_state"]


@dataclass(frozen=True)
class StateRead:
    """The state database's rows for one incident (see :func:`read_state`)."""

    incident: Incident
    waiting: list[OutboxItem]  # outbox items carrying the incident's alert, not delivered yet
    silences: list[Silence]  # every silence, expired ones too; :func:`facts` picks the matching ones


def read_state(db: StateDB, incident_id: int | None, *, now_ms: int) -> StateRead:
    """The incident ``incident_id`` (None: the latest) and its outbox items and silences.
    :class:`~agent.errors.NotFoundError` when there is no such incident."""
    iid = db.incidents.latest_id() if incident_id is None else incident_id
    incident = db.incidents.get(iid) if iid is not None else None
    if incident is None:
        raise NotFoundError("there are no incidents yet" if incident_id is None else
                            f"no incident {incident_id} in the state database (sre-agent incidents lists them)")
    waiting = [i for i in db.outbox.pending() if any(a.fingerprint == incident.fingerprint
                                                     for a in i.notification().alerts)]
    return StateRead(incident, waiting, db.silences.list(now_ms=now_ms, include_expired=True))


@dataclass(frozen=True)
class NotificationOutcome:
    """One notification to one receiver: ``delivered``, ``failed`` (given up) or ``retrying`` (in the outbox)."""

    at_ms: int
    receiver: str
    outcome: str
    status: str  # firing | resolved (what the message said), "" if unknown
    attempts: int  # 0: not recorded (an incident from before attempts were recorded)
    error: str = ""
    kind: str = "alerts"  # alerts | finding (a finding posted into the alert's thread) | scale


@dataclass(frozen=True)
class ScaleAction:
    at_ms: int
    action: str  # scale_out | scale_in
    service: str
    from_replicas: int
    to_replicas: int
    dry_run: bool
    reason: str


@dataclass(frozen=True)
class Finding:
    at_ms: int
    kind: str
    summary: str
    setting: str
    value: str  # the suggested value of the setting
    runbook_url: str


@dataclass(frozen=True)
class SilenceFact:
    id: str
    matchers: list[str]
    starts_ms: int
    ends_ms: int
    created_by: str
    comment: str


@dataclass(frozen=True)
class Facts:
    """One incident as the report tells it. ``pending_ms``: when the alert went pending (``estimated``:
    derived as fired − ``for`` because the incident was recorded before that time was kept)."""

    incident: Incident
    now_ms: int
    rule: RuleInfo | None
    pending_ms: int | None
    pending_estimated: bool
    fired_value: float | None
    notifications: list[NotificationOutcome] = field(default_factory=list)
    actions: list[ScaleAction] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    silences: list[SilenceFact] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return self.incident.labels

    @property
    def start_ms(self) -> int:
        """The incident window's start: pending if known, else fired."""
        return self.pending_ms if self.pending_ms is not None else self.incident.started_ms

    @property
    def end_ms(self) -> int:
        """Resolved, or now while it is open."""
        return self.incident.resolved_ms or self.now_ms


def facts(state: StateRead, groups: Iterable[GroupSpec], *, now_ms: int) -> Facts:
    """The facts of ``state``'s incident, with its rule from ``groups`` (the loaded rule files)."""
    inc = state.incident
    rule = find_rule(groups, inc.alertname)
    fired = next((e for e in inc.events if e.kind == "fired"), None)
    pending_ms, estimated = None, False
    if fired is not None and isinstance(fired.detail.get("active_at_ms"), int) and fired.detail["active_at_ms"] > 0:
        pending_ms = min(int(fired.detail["active_at_ms"]), inc.started_ms)
    elif rule is not None and rule.for_s > 0:
        pending_ms, estimated = inc.started_ms - int(rule.for_s * 1000), True
    value = fired.detail.get("value") if fired is not None else None
    out = Facts(inc, now_ms, rule, pending_ms, estimated, float(value) if isinstance(value, int | float) else None)
    for e in inc.events:
        d = e.detail
        if e.kind in ("notified", "notify_failed"):
            out.notifications.append(NotificationOutcome(
                e.at_ms, str(d.get("receiver", "")), "delivered" if e.kind == "notified" else "failed",
                str(d.get("status", "")), int(d.get("attempts", 0) or 0),
                str(d.get("error") or d.get("last_error") or ""), str(d.get("kind") or "alerts")))
        elif e.kind == "action":
            out.actions.append(ScaleAction(e.at_ms, str(d.get("action", "")), str(d.get("service", "")),
                                           int(d.get("from_replicas", 0)), int(d.get("to_replicas", 0)),
                                           bool(d.get("dry_run")), str(d.get("reason", ""))))
        elif e.kind == "finding":
            out.findings.append(Finding(e.at_ms, str(d.get("kind", "")), str(d.get("summary", "")),
                                        str(d.get("setting") or ""), str(d.get("suggested_value") or ""),
                                        str(d.get("runbook_url") or "")))
    for item in state.waiting:
        n = item.notification()
        out.notifications.append(NotificationOutcome(item.created_ms, item.receiver, "retrying", n.status,
                                                     item.attempts, item.last_error, n.kind))
    out.notifications.sort(key=lambda n: n.at_ms)
    out.silences.extend(_silences(state.silences, inc.labels, out.start_ms, out.end_ms))
    return out


def _silences(silences: list[Silence], labels: dict[str, str], start_ms: int, end_ms: int) -> Iterable[SilenceFact]:
    """Silences matching the incident's labels whose time overlaps the incident."""
    for s in silences:
        try:
            matchers = [parse_matcher(m) for m in s.matchers]
        except ValueError:  # stored by this agent, so valid; a hand-edited row is skipped, not fatal
            continue
        if s.starts_ms <= end_ms and s.ends_ms >= start_ms and all(m.matches(labels) for m in matchers):
            yield SilenceFact(s.id, list(s.matchers), s.starts_ms, s.ends_ms, s.created_by, s.comment)


def facts_json(f: Facts) -> dict[str, Any]:
    """The facts as the report's JSON shows them (times in Unix ms)."""
    return {
        "incident": f.incident.to_json() | {"report_now_ms": f.now_ms},
        "rule": f.rule.to_json() if f.rule is not None else None,
        "pending_ms": f.pending_ms, "pending_estimated": f.pending_estimated, "fired_value": f.fired_value,
        "notifications": [vars(n) for n in f.notifications],
        "actions": [vars(a) for a in f.actions],
        "findings": [vars(x) for x in f.findings],
        "silences": [vars(s) for s in f.silences],
    }
