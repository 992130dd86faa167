"""The dispatcher: rule-state events in, notifications and actions out, through the outbox.

After every rule-group evaluation the daemon hands the group's alerts to
:meth:`Dispatcher.observe`. From there, three paths:

* **Grouped receivers** (console, Slack, webhook) follow Alertmanager's dispatcher:
  each matching route puts the alert into an aggregation group (route + ``group_by``
  values); a group is flushed ``group_wait`` after it appears and then every
  ``group_interval``, and a flush sends only if the notification log says something
  changed (a new firing alert, a newly resolved one with ``send_resolved``) or
  ``repeat_interval`` passed — Alertmanager's ``DedupStage.needsUpdate``. The
  notification log is persisted, so a restart does not re-page for alerts already sent.
* **Alertmanager receivers** follow Prometheus' own sending rules instead: no grouping
  (Alertmanager groups), every firing alert re-sent every ``resend_delay`` with
  ``endsAt = now + 4 × max(eval interval, resend delay)``, resolved alerts re-sent for
  as long as the rule manager keeps them (15 min), one queue per Alertmanager URL.
* **Actions**: ``scale_out`` / ``scale_in`` go to the :class:`~agent.act.scaling.Scaler`
  on every evaluation while the alert fires (its cooldowns decide); ``diagnose`` calls
  the diagnostics hook once when the alert starts firing.

Every notification is written to the SQLite outbox before anything is sent and
leaves it only when the receiver acknowledged: :meth:`Dispatcher.tick` hands the due
queues to :class:`~agent.act.outbox.OutboxDelivery` (one FIFO queue per receiver,
retries with jittered exponential backoff, ``Retry-After``, giving up). The notification
log is written when a notification is queued (the outbox makes "queued" as good as "sent").
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from agent.act.incident_summary import one_line
from agent.act.leadership import Leadership
from agent.act.notification import (
    VALIDITY_FACTOR,
    AlertSnapshot,
    Notification,
    Status,
    fingerprint,
    group_key_hash,
    json_number,
)
from agent.act.outbox import DeliveryStats, OutboxDelivery
from agent.act.queues import QueueName, alertmanager_queue, forward_queue, receiver_queue
from agent.act.routing import Route, Router, active_silences, group_for, muted_by
from agent.act.scaling import Scaler
from agent.act.sinks import Sink
from agent.act.state import NflogEntry, StateDB
from agent.config import ActionConfig, Config
from agent.diagnose.findings import Finding
from agent.errors import StateError
from agent.matchers import AlertMatcher
from agent.rules.manager import Alert, AlertEvent, AlertState

__all__ = ["DeliveryStats", "DiagnoseHook", "Dispatcher", "Evaluation"]

log = structlog.get_logger(__name__)

_INCIDENT_REFS = 10  # incidents a message links (a Slack message shows no more)

DiagnoseHook = Callable[[AlertSnapshot], None]


@dataclass(frozen=True)
class Evaluation:
    """One rule group's evaluation as the dispatcher takes it (:meth:`Dispatcher.evaluation`): its
    events and a snapshot of its alerts, which do not change when the rule manager's do."""

    group: str
    events: tuple[AlertEvent, ...]
    snaps: tuple[AlertSnapshot, ...]  # firing and resolved alerts, one per fingerprint
    pending: tuple[AlertSnapshot, ...]
    interval_s: float
    to_alertmanagers: bool = True  # False for alerts that came from an Alertmanager (agent.act.intake)


@dataclass
class _AggGroup:
    route: Route
    key: str
    labels: dict[str, str]
    alerts: dict[str, AlertSnapshot]
    next_flush_ms: int


class Dispatcher:
    """Turns rule-group evaluations into queued notifications and actions, and delivers the outbox.

    The daemon calls :meth:`observe` after each group evaluation and :meth:`tick` every
    ``notify.dispatch_interval``; everything external (state database, sinks, scaler,
    clock, jitter source) is passed in. The synchronous methods (:meth:`observe`,
    :meth:`flush_due`, :meth:`post_finding`) touch the state database: in the daemon they run
    on its writer thread (:meth:`~agent.act.state.StateDB.run`), one at a time, which also
    keeps this object's own maps single-threaded; :meth:`tick` hands its flush there itself.
    """

    def __init__(
        self,
        config: Config,
        db: StateDB,
        router: Router,
        sinks: Mapping[QueueName, Sink],
        *,
        scaler: Scaler | None = None,
        diagnose: DiagnoseHook | None = None,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        leadership: Leadership | None = None,
    ) -> None:
        self._config = config
        self._db = db
        self._router = router
        self._scaler = scaler
        self._diagnose = diagnose
        self._clock = clock
        self._delivery = OutboxDelivery(db, sinks, config.notify, scaler=scaler, clock=clock, rng=rng,
                                        leadership=leadership)
        self.sinks = self._delivery.sinks  # one dict: the delivery sends through what callers see here
        self.stats = self._delivery.stats
        self._kinds = {r.name: r.kind for r in config.receivers}
        self._am_urls = {r.name: r.alertmanager.urls for r in config.receivers if r.alertmanager is not None}
        self._am_resend_s = {r.name: r.alertmanager.resend_delay for r in config.receivers
                             if r.alertmanager is not None}
        self._external_url = config.rules.external_url
        self._groups: dict[tuple[str, str], _AggGroup] = {}
        self._am_sent: dict[tuple[str, str], tuple[int, bool]] = {}  # (receiver, fingerprint) -> (ms, as resolved)

    # -- input: one rule group's evaluation ---------------------------------------------
    def observe(self, group: str, events: Iterable[AlertEvent], alerts: Iterable[Alert], *,
                interval_s: float, now_ms: int) -> None:
        """Take the alerts of one rule group right after it was evaluated."""
        self.apply(self.evaluation(group, events, alerts, interval_s=interval_s), now_ms=now_ms)

    def evaluation(self, group: str, events: Iterable[AlertEvent], alerts: Iterable[Alert], *,
                   interval_s: float) -> Evaluation:
        """One group's evaluation, frozen (the rule manager's alerts change at its next evaluation),
        so that :meth:`apply` can take it now or, after a failed write, later."""
        frozen = tuple(replace(e, alert=replace(e.alert, annotations=dict(e.alert.annotations))) for e in events)
        snaps: dict[str, AlertSnapshot] = {}
        pending: list[AlertSnapshot] = []
        for alert in alerts:
            snap = self._snapshot(alert)
            if alert.state is AlertState.PENDING:
                pending.append(snap)
            else:
                snaps[snap.fingerprint] = snap
        return Evaluation(group, frozen, tuple(snaps.values()), tuple(pending), interval_s)

    def apply(self, ev: Evaluation, *, now_ms: int, also: Callable[[], None] | None = None) -> None:
        """Record, queue and act on one evaluation, all or nothing: the state writes (incidents,
        Alertmanager batches, scale decisions, and ``also``'s: the intake marks its inbox items done)
        commit in one transaction, and only after the commit does anything change in memory
        (aggregation groups, the Alertmanager resend map) or leave the process (the ``diagnose``
        hook). A :class:`~agent.errors.StateError` (disk full, I/O error) therefore leaves no trace,
        and applying the same evaluation again is not a duplicate."""
        to_alertmanagers: list[tuple[AlertSnapshot, set[str]]] = []
        grouped: list[tuple[Route, AlertSnapshot]] = []
        for snap in ev.snaps:
            receivers: set[str] = set()
            for route in self._router.routes_for(snap.labels):
                if self._kinds.get(route.receiver) == "alertmanager":
                    if ev.to_alertmanagers:
                        receivers.add(route.receiver)
                else:
                    grouped.append((route, snap))
            if receivers:
                to_alertmanagers.append((snap, receivers))
        with self._db.transaction():
            self._record_incidents(ev.events)
            am_sent = self._send_to_alertmanagers(to_alertmanagers, interval_s=ev.interval_s, now_ms=now_ms)
            diagnose = self._run_actions(ev.events, ev.snaps, ev.pending, now_ms)
            if also is not None:
                also()
        self._am_sent = am_sent
        for route, snap in grouped:
            self._insert(route, snap, now_ms)
        hook = self._diagnose
        if hook is None:
            return
        for snap in diagnose:
            try:
                hook(snap)
            except Exception:  # a diagnostic must never stop notifications
                log.exception("diagnosis hook failed", alertname=snap.labels.get("alertname", ""))

    def snapshot(self, alert: Alert) -> AlertSnapshot:
        """A rule alert as receivers see it (the findings intake matches forwarded findings to these)."""
        return self._snapshot(alert)

    def _snapshot(self, alert: Alert) -> AlertSnapshot:
        labels = dict(alert.labels)
        resolved = alert.state is AlertState.INACTIVE
        return AlertSnapshot(
            labels=labels, annotations=dict(alert.annotations), status="resolved" if resolved else "firing",
            starts_at_ms=alert.fired_at_ms or alert.active_at_ms, ends_at_ms=alert.resolved_at_ms if resolved else 0,
            value=alert.value, generator_url=self._external_url,
        )

    def _record_incidents(self, events: Iterable[AlertEvent]) -> None:
        for e in events:
            labels = dict(e.alert.labels)
            fp = fingerprint(labels)
            if e.kind == "firing":
                with self._db.transaction():
                    self._db.incidents.open(fingerprint=fp, alertname=e.rule, labels=labels,
                                           severity=labels.get("severity", ""),
                                           summary=e.alert.annotations.get("summary", ""), started_ms=e.at_ms)
                    self._db.incidents.add_event(fp, at_ms=e.at_ms, kind="fired",
                                                detail={"value": json_number(e.alert.value),
                                                        "active_at_ms": e.alert.active_at_ms})
            elif e.kind == "resolved":
                with self._db.transaction():
                    self._db.incidents.add_event(fp, at_ms=e.at_ms, kind="resolved", detail={})
                    self._db.incidents.resolve(fp, resolved_ms=e.at_ms)

    # -- grouped receivers (Alertmanager's dispatcher) --------------------------------------
    def regroup(self, snaps: Iterable[AlertSnapshot], now_ms: int) -> None:
        """Put alerts back into their aggregation groups after a restart, without recording or acting
        on them again: the notification log decides what is news (the intake's alerts, which no rule
        re-evaluates)."""
        for snap in snaps:
            for route in self._router.routes_for(snap.labels):
                if self._kinds.get(route.receiver) != "alertmanager":
                    self._insert(route, snap, now_ms)

    def _insert(self, route: Route, snap: AlertSnapshot, now_ms: int) -> None:
        key, labels = group_for(route, snap.labels)
        ag = self._groups.get((route.path, key))
        if ag is None:
            ag = self._groups[(route.path, key)] = _AggGroup(route, key, labels, {},
                                                            now_ms + int(route.group_wait_s * 1000))
        ag.alerts[snap.fingerprint] = snap

    def flush_due(self, now_ms: int) -> int:
        """Flush every aggregation group whose timer is due; returns notifications queued.

        A group whose write fails (:class:`~agent.errors.StateError`: disk full, I/O error) stays as
        it was, due, so the next round flushes it again; the others go on, and the first error is
        raised at the end for the caller to count."""
        queued = 0
        due = [gid for gid, ag in self._groups.items() if ag.next_flush_ms <= now_ms]
        if not due:
            return 0
        silences = active_silences(self._db.silences.list(now_ms=now_ms), now_ms)  # read and parsed once a round
        failed: StateError | None = None
        for gid in due:
            ag = self._groups[gid]
            try:
                queued += self._flush(ag, silences, now_ms)
            except StateError as exc:
                failed = failed or exc
                continue
            ag.next_flush_ms = now_ms + int(ag.route.group_interval_s * 1000)
            for fp, snap in list(ag.alerts.items()):  # resolved ones were reported (or never will be)
                if snap.status == "resolved":
                    del ag.alerts[fp]
            if not ag.alerts:
                del self._groups[gid]
        if failed is not None:
            raise failed
        return queued

    def _flush(self, ag: _AggGroup, silences: list[tuple[str, tuple[AlertMatcher, ...]]], now_ms: int) -> int:
        route = ag.route
        unmuted = [a for a in ag.alerts.values() if not muted_by(a.labels, silences)]  # MuteStage
        firing = [a for a in unmuted if a.status == "firing"]
        resolved = [a for a in unmuted if a.status == "resolved"]
        if not firing and not resolved:  # everything silenced: Alertmanager's MuteStage stops here
            return 0
        entry = self._db.nflog.get(route.receiver, ag.key)
        fset, rset = frozenset(a.fingerprint for a in firing), frozenset(a.fingerprint for a in resolved)
        if not _needs_update(entry, fset, rset, send_resolved=route.send_resolved,
                             repeat_ms=int(route.repeat_interval_s * 1000), now_ms=now_ms):
            return 0
        shown = firing + (resolved if route.send_resolved else [])
        if not shown:  # everything resolved, send_resolved off: just forget what was sent
            self._db.nflog.delete(route.receiver, ag.key)
            return 0
        digest = hashlib.sha256(",".join([*sorted(fset), "|", *sorted(rset)]).encode()).hexdigest()[:12]
        n = Notification(
            key=f"{route.receiver}:{group_key_hash(route.receiver, ag.key)}:{digest}:{now_ms}",
            receiver=receiver_queue(route.receiver), kind="alerts", created_ms=now_ms, group_key=ag.key,
            group_labels=ag.labels, status="firing" if firing else "resolved",
            alerts=tuple(sorted(shown, key=lambda a: (a.status, sorted(a.labels.items())))),
            external_url=self._external_url, incidents=self._incident_refs(shown, now_ms),
        )
        with self._db.transaction():
            self._db.outbox.enqueue(n, now_ms=now_ms)
            if firing:
                self._db.nflog.put(route.receiver, ag.key, NflogEntry(fset, rset, now_ms))
            else:
                self._db.nflog.delete(route.receiver, ag.key)
        log.info("notification queued", receiver=route.receiver, group=ag.key, firing=len(firing),
                 resolved=len(resolved))
        return 1

    def _incident_refs(self, alerts: list[AlertSnapshot], now_ms: int) -> dict[str, dict[str, Any]]:
        """The incidents of a message's first alerts (links to their reports), with the one-line summary
        of those resolved (the resolve update says it)."""
        shown = alerts[:_INCIDENT_REFS]
        ids = self._db.incidents.current_ids([a.fingerprint for a in shown])
        refs: dict[str, dict[str, Any]] = {fp: {"id": i} for fp, i in ids.items()}
        for a in shown:
            if a.status == "resolved" and a.fingerprint in ids:
                incident = self._db.incidents.get(ids[a.fingerprint])
                if incident is not None:
                    refs[a.fingerprint]["summary"] = one_line(incident, now_ms=now_ms)
        return refs

    # -- Alertmanager receivers (Prometheus' notifier rules) -----------------------------------
    def _send_to_alertmanagers(self, routed: list[tuple[AlertSnapshot, set[str]]], *, interval_s: float,
                               now_ms: int) -> dict[tuple[str, str], tuple[int, bool]]:
        """``routed``: each alert with the Alertmanager receivers its routes reach. Returns the resend
        map as it is once the batches are queued (the caller keeps it once they are committed)."""
        def resend_ms(receiver: str) -> int:
            return int(self._am_resend_s[receiver] * 1000)

        # An entry older than its resend delay decides like a missing one: drop it, so the map
        # holds only alerts sent recently however many label sets come and go.
        am_sent = {k: v for k, v in self._am_sent.items() if now_ms - v[0] <= resend_ms(k[0])}
        batches: dict[str, list[AlertSnapshot]] = {}
        for snap, receivers in routed:
            resolved = snap.status == "resolved"
            for receiver in receivers:
                k = (receiver, snap.fingerprint)
                sent = am_sent.get(k)
                # Sent within the delay in the same state: nothing new. A resolve is news, and so is a
                # firing after a resolve: Prometheus makes a new alert of it, never sent yet.
                if sent is not None and sent[1] == resolved:
                    continue
                am_sent[k] = (now_ms, resolved)
                valid_ms = VALIDITY_FACTOR * int(max(interval_s, self._am_resend_s[receiver]) * 1000)
                out = snap if resolved else replace(snap, ends_at_ms=now_ms + valid_ms)
                batches.setdefault(receiver, []).append(out)
        for receiver, alerts in batches.items():
            for i, _url in enumerate(self._am_urls[receiver]):
                self._enqueue_am(alertmanager_queue(receiver, i), alerts, now_ms)
        return am_sent

    def _enqueue_am(self, queue: QueueName, alerts: list[AlertSnapshot], now_ms: int) -> None:
        """Queue a batch for one Alertmanager, merged into a queued batch not yet in flight:
        after an outage the Alertmanager gets each alert's latest state once, not a
        backlog of stale ``endsAt`` values that would flap it."""
        last = self._db.outbox.tail(queue)
        if last is not None and self._delivery.sending(queue) != last.id:
            old = last.notification()
            merged = tuple(({a.fingerprint: a for a in old.alerts} | {a.fingerprint: a for a in alerts}).values())
            self._db.outbox.replace_payload(last.id, replace(old, alerts=merged, status=_status(merged)))
            return
        n = Notification(key=f"{queue}:{now_ms}:{len(alerts)}", receiver=queue, kind="alerts", created_ms=now_ms,
                         status=_status(alerts), alerts=tuple(alerts), external_url=self._external_url)
        self._db.outbox.enqueue(n, now_ms=now_ms)

    # -- actions ------------------------------------------------------------------------------------
    def _run_actions(self, events: Iterable[AlertEvent], snaps: Iterable[AlertSnapshot],
                     pending: Iterable[AlertSnapshot], now_ms: int) -> list[AlertSnapshot]:
        """Scale decisions (written now, in the caller's transaction); returns the alerts to diagnose
        (the caller calls the hook once that transaction committed)."""
        diagnose: list[AlertSnapshot] = []
        started = {fingerprint(dict(e.alert.labels)) for e in events if e.kind == "firing"}
        for snap in pending:  # a pending scale-out alert already means "not healthy" for scale-in
            for action in self._router.actions_for(snap.labels):
                self._scale(action, snap, now_ms, decide=False)
        for snap in snaps:
            if snap.status != "firing":
                continue
            for action in self._router.actions_for(snap.labels):
                if action.type in ("scale_out", "scale_in"):
                    self._scale(action, snap, now_ms, decide=True)
                elif snap.fingerprint in started and self._diagnose is not None:
                    diagnose.append(snap)
        return diagnose

    def _scale(self, action: ActionConfig, snap: AlertSnapshot, now_ms: int, *, decide: bool) -> None:
        """A scale-out alert marks its service unhealthy (holding off scale-in); a firing one
        also asks the scaler every evaluation, whose cooldowns and bounds decide."""
        if self._scaler is None or action.type not in ("scale_out", "scale_in"):
            return
        service = self._scaler.service_for(snap.labels, action.service)
        if service is None:
            return
        if action.type == "scale_out":
            self._scaler.mark_unhealthy(service.name, now_ms)
        if not decide:
            return
        decision = self._scaler.decide("out" if action.type == "scale_out" else "in", snap,
                                       service=service.name, now_ms=now_ms)
        if decision.acted or decision.dry_run:
            log.info("scale decision", service=decision.service, direction=decision.direction,
                     from_replicas=decision.from_replicas, to_replicas=decision.to_replicas,
                     dry_run=decision.dry_run, reason=decision.reason)

    # -- findings ---------------------------------------------------------------------------------------
    def post_finding(self, finding: Finding, alert: AlertSnapshot | None, *, now_ms: int,
                     forward: bool = True) -> int:
        """Queue a finding for the receivers of ``alert`` (into its Slack thread) and record it in
        the alert's incident. A finding with no alert (a tailed log, a target that went down) is
        routed by its own labels (``finding=<kind>``, ``severity``, ``instance``...) and recorded
        as an incident of its own, opened and closed at once. With ``forward:`` set (a node agent)
        it is also queued for the central agent's intake, unless ``forward`` is False (a finding
        that arrived through this agent's own intake: it is not sent on, so no loop)."""
        labels = alert.labels if alert is not None else {"finding": finding.kind, "severity": finding.severity,
                                                           **finding.labels}
        fp = alert.fingerprint if alert is not None else fingerprint(labels)
        digest = hashlib.sha256(repr(sorted(finding.to_json().items())).encode()).hexdigest()[:12]
        queued = 0
        with self._db.transaction():
            if alert is None:
                self._db.incidents.open(fingerprint=fp, alertname=finding.kind, labels=labels,
                                       severity=finding.severity, summary=finding.summary, started_ms=now_ms)
            self._db.incidents.add_event(fp, at_ms=now_ms, kind="finding",
                                        detail={"kind": finding.kind, "summary": finding.summary,
                                                "setting": finding.setting, "suggested_value": finding.suggested_value,
                                                "runbook_url": finding.runbook_url})
            if alert is None:
                self._db.incidents.resolve(fp, resolved_ms=now_ms)
            for route in self._router.routes_for(labels):
                if self._kinds.get(route.receiver) == "alertmanager":
                    continue
                gkey = group_for(route, labels)[0] if alert is not None else ""
                if alert is not None:
                    self._flush_early(route, gkey, now_ms)
                n = Notification(key=f"finding:{route.receiver}:{digest}:{now_ms}",
                                 receiver=receiver_queue(route.receiver), kind="finding", created_ms=now_ms,
                                 group_key=gkey,
                                 alerts=(alert,) if alert is not None else (), finding=finding.to_json(),
                                 external_url=self._external_url)
                queued += int(self._db.outbox.enqueue(n, now_ms=now_ms))
            if forward and self._config.forward is not None:
                n = Notification(key=f"finding:forward:{digest}:{now_ms}", receiver=forward_queue(), kind="finding",
                                 created_ms=now_ms, alerts=(alert,) if alert is not None else (),
                                 finding=finding.to_json(), external_url=self._external_url)
                queued += int(self._db.outbox.enqueue(n, now_ms=now_ms))
        return queued

    def _flush_early(self, route: Route, group_key: str, now_ms: int) -> None:
        """A finding about an alert whose group was never notified (it is still in ``group_wait``)
        flushes the group now, so that the group's message is queued before the finding and the finding
        becomes a reply in its thread (one queue per receiver, delivered in order), not a message of its own."""
        ag = self._groups.get((route.path, group_key))
        if ag is None or ag.next_flush_ms <= now_ms or self._db.nflog.get(route.receiver, ag.key) is not None:
            return
        silences = active_silences(self._db.silences.list(now_ms=now_ms), now_ms)
        if self._flush(ag, silences, now_ms):
            ag.next_flush_ms = now_ms + int(route.group_interval_s * 1000)

    # -- delivery (agent.act.outbox) -------------------------------------------------------------
    async def tick(self) -> None:
        """One dispatch round: flush due groups, start delivering each queue whose head is due."""
        now_ms = int(self._clock() * 1000)
        try:
            await self._db.run(self.flush_due, now_ms)
        finally:  # a failed flush delays no notification queued before it
            await self.deliver_due(now_ms)

    async def deliver_due(self, now_ms: int) -> None:
        """Start delivering each outbox queue whose head is due (the second half of :meth:`tick`)."""
        await self._delivery.start_due(now_ms)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait for deliveries in flight (shutdown, tests)."""
        await self._delivery.drain(timeout_s)



def _needs_update(entry: NflogEntry | None, firing: frozenset[str], resolved: frozenset[str], *,
                  send_resolved: bool, repeat_ms: int, now_ms: int) -> bool:
    """Alertmanager's ``DedupStage.needsUpdate``."""
    if entry is None:
        return bool(firing)
    if not firing <= entry.firing:
        return True
    if not firing:
        return bool(entry.firing)
    if send_resolved and not resolved <= entry.resolved:
        return True
    return entry.sent_ms + repeat_ms <= now_ms


def _status(alerts: Iterable[AlertSnapshot]) -> Status:
    """A batch is firing if any alert in it fires (Alertmanager's group status)."""
    return "firing" if any(a.status == "firing" for a in alerts) else "resolved"


