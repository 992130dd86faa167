"""The act layer's wiring: state database, router, receivers, scaler and dispatcher.

The daemon owns one :class:`ActLayer`. It is built from the config at start-up (so a
bad receiver or route stops the agent before anything runs), opens the state
database, restores alert state into the rule manager, and from then on takes each
rule group's evaluation (:meth:`ActLayer.observe`) and runs the dispatch tick.
Receivers are keyed by their outbox queue name (:mod:`agent.act.queues`) and built by the
sink registry (:mod:`agent.act.sinks.registry`).

Why state work is *held* when a write fails: a full disk or an I/O error must not lose the
firing event that was evaluated while it lasted. Each evaluation and finding is state work that
either commits as a whole (:meth:`~agent.act.dispatch.Dispatcher.apply`) or leaves no trace; one
that fails stays in a FIFO in memory and is applied again, in order and before any new work,
at the next evaluation or dispatch round, so its notification goes out once the disk is back.
Meanwhile :attr:`ActLayer.state_problem` makes ``/readyz`` and ``/api/v1/status`` say degraded
and ``sre_agent_state_write_failures_total`` counts the failures (``SREAgentStateWritesFailing``).

Alerts an Alertmanager posts (:mod:`agent.act.intake`) are the exception to holding in memory: the
webhook is answered 2xx only once :meth:`ActLayer.accept_webhook` committed them to the state
database, and 503 when it could not (Alertmanager retries a 5xx), so they are never held. Each
dispatch round processes the inbox before flushing groups (:meth:`ActLayer.tick`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp
import structlog

from agent.act import finding_intake, intake
from agent.act.dispatch import DiagnoseHook, Dispatcher
from agent.act.leadership import Leadership
from agent.act.notification import AlertSnapshot, fingerprint
from agent.act.queues import QueueName
from agent.act.routing import Router
from agent.act.scaling import Scaler
from agent.act.sinks import Sink, registry
from agent.act.state import StateDB
from agent.act.state.history import MAX_SILENCE_MS
from agent.act.telemetry import ActCollector, ActViews, IntakeStats, StateHealth
from agent.config import Config, parse_duration
from agent.diagnose.findings import Finding
from agent.errors import StateError
from agent.rules.manager import RESOLVED_RETENTION_MS, AlertEvent, AlertState, Group, RuleManager

__all__ = ["ActCollector", "ActLayer", "ActViews", "StateHealth", "WriterRefs", "build_sinks"]

log = structlog.get_logger(__name__)


def build_sinks(config: Config, db: StateDB, session: aiohttp.ClientSession, *,
                stream: TextIO | None = None) -> dict[QueueName, Sink]:
    """One sink per outbox queue (:mod:`agent.act.queues`), Slack's message refs on the writer thread."""
    return registry.build_sinks(config, registry.SinkContext(session, WriterRefs(db), stream,
                                                         config.server.external_url))


@dataclass(frozen=True)
class _Held:
    """State work whose write failed, kept in memory until it commits (see the module docstring)."""

    what: str  # "evaluation" or "finding", for logs
    group: str | None  # set for an evaluation without events: the group's next evaluation supersedes it
    run: Callable[[int], None]  # the work, given the time it runs at


_INTAKE_BATCH = 1000  # inbox transitions processed in one dispatch round


class WriterRefs:
    """The Slack sink's message references in the notification log, read and written on the state
    database's writer thread (:class:`~agent.act.sinks.MessageRefs`)."""

    def __init__(self, db: StateDB) -> None:
        self._db = db

    async def get_ref(self, receiver: str, group_key: str) -> tuple[str, str] | None:
        return await self._db.run(self._db.nflog.get_ref, receiver, group_key)

    async def put_ref(self, receiver: str, group_key: str, channel: str, ts: str) -> None:
        await self._db.run(self._db.nflog.put_ref, receiver, group_key, channel, ts)

    async def delete_ref(self, receiver: str, group_key: str) -> None:
        await self._db.run(self._db.nflog.delete_ref, receiver, group_key)


class ActLayer:
    """The daemon's act layer: opened (and alert state restored) when the Agent is built, so a
    bad state path stops start-up; receivers get their HTTP session in :meth:`start`.

    Every piece of state work runs on the state database's writer thread (:meth:`StateDB.run`):
    the dispatcher's evaluation handling and flushes, findings, the API's silences and incidents.
    The event loop only awaits it, so a slow ``fsync`` delays no scrape and no ``/healthz``.
    """

    def __init__(self, config: Config, rules: RuleManager, *, clock: Callable[[], float] = time.time,
                 diagnose: DiagnoseHook | None = None, stream: TextIO | None = None,
                 leadership: Leadership | None = None) -> None:
        self.config = config
        self.leadership = leadership  # HA: only the leader delivers direct receivers (agent.act.leadership)
        self._rules = rules
        self._clock = clock
        self._stream = stream
        self.db = StateDB(config.state.path)
        now_ms = int(clock() * 1000)
        # start-up, before the loop serves anything: the one place state is read on the caller's thread
        restored = rules.restore(self.db.alert_states.load(), now_ms,
                                 outage_tolerance_ms=int(config.rules.outage_tolerance * 1000))
        if restored:
            log.info("alert state restored", alerts=restored, state=config.state.path)
        self.router = Router(config)
        self.scaler = Scaler(config.scaling, self.db, started_ms=now_ms)
        self._diagnose = diagnose
        self._session: aiohttp.ClientSession | None = None
        self.dispatcher: Dispatcher | None = None
        self.views = ActViews()
        self._posting: set[asyncio.Task[None]] = set()
        self._held: deque[_Held] = deque()  # only touched on the writer thread
        self._flush_failed = False
        self.health = StateHealth()
        self.intake_stats = IntakeStats()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        sinks = build_sinks(self.config, self.db, self._session, stream=self._stream)
        self.dispatcher = Dispatcher(self.config, self.db, self.router, sinks, scaler=self.scaler,
                                     diagnose=self._on_loop(asyncio.get_running_loop()), clock=self._clock,
                                     leadership=self.leadership)
        self.views = await self.db.run(self._read_views)
        await self.db.run(self._regroup_intake)
        if self.views.outbox_depth:
            log.info("outbox has undelivered notifications from before; delivering", queues=self.views.outbox_depth)

    def _on_loop(self, loop: asyncio.AbstractEventLoop) -> DiagnoseHook:
        """The diagnose hook as the dispatcher calls it from the writer thread: handed to the loop,
        where the diagnostics read the store and start their tasks."""
        def hook(alert: AlertSnapshot) -> None:
            if self._diagnose is not None:
                loop.call_soon_threadsafe(self._diagnose, alert)
        return hook

    def set_diagnose_hook(self, hook: DiagnoseHook) -> None:
        self._diagnose = hook

    async def observe(self, group: Group, events: list[AlertEvent], now_ms: int) -> None:
        """After a group's evaluation: persist its alert state, then notify and act (on the writer thread;
        the group's next evaluation waits for this, so its alerts do not change meanwhile). A failed write
        keeps the work in memory and retries it (see the module docstring); this never raises for it."""
        await self.db.run(self._observe, group, events, now_ms)

    def _observe(self, group: Group, events: list[AlertEvent], now_ms: int) -> None:
        saved = self._rules.export_group(group)  # now: the group's alerts change at its next evaluation
        d = self.dispatcher
        ev = None if d is None else d.evaluation(group.spec.name, events, [a for r in group.rules
                                                                           for a in r.alerts.values()],
                                                 interval_s=group.interval_s)

        def run(at_ms: int) -> None:
            with self.db.transaction():
                for key, alerts in saved.items():
                    self.db.alert_states.save(key, alerts, now_ms)
            if d is not None and ev is not None:
                d.apply(ev, now_ms=at_ms)

        self._submit(_Held("evaluation", None if events else group.spec.name, run))

    def _submit(self, item: _Held) -> None:
        """Queue state work behind any held before it and run what is queued (writer thread)."""
        if item.group is not None:  # an evaluation without events only repeats what the next one says
            self._held = deque(h for h in self._held if h.group != item.group)
        self._held.append(item)
        self._run_held()

    def _run_held(self) -> bool:
        """Run the held work in order; stop at the first failed write (it stays first). True if all ran."""
        while self._held:
            try:
                self._held[0].run(self.now_ms())
            except StateError as exc:
                self._write_failed(exc, self._held[0].what)
                return False
            except Exception:  # a bug, not the disk: retrying cannot help, and it must not block what follows
                log.exception("state work failed and is dropped", work=self._held[0].what)
            self._held.popleft()
            self._update_health()
        return True

    def _write_failed(self, exc: StateError, what: str) -> None:
        """Count a failed write; the first of a run of them is an error in the log, the rest debug
        (every round retries: the counter and /readyz tell the rest)."""
        h = self.health
        h.write_failures += 1
        first = not h.failing_since_ms
        if first:
            h.failing_since_ms = self.now_ms()
        h.last_error = str(exc)
        self._update_health()
        (log.error if first else log.debug)("state write failed; the work is held in memory and retried",
                                            work=what, held=h.held, error=str(exc))

    def _update_health(self) -> None:
        h = self.health
        h.held = len(self._held)
        if h.failing_since_ms and not self._held and not self._flush_failed:
            log.info("state writes recovered", failures=h.write_failures,
                     failing_for_s=(self.now_ms() - h.failing_since_ms) / 1000)
            h.failing_since_ms = 0

    @property
    def state_problem(self) -> str | None:
        """Why the agent is degraded (state work held in memory, flushes failing), else None."""
        h = self.health
        if not h.failing_since_ms:
            return None
        return f"state database writes failing ({h.held} held in memory): {h.last_error}"

    async def tick(self) -> None:
        """One dispatch round: held state work first, then due aggregation groups, then delivery."""
        d = self.dispatcher
        if d is not None:
            now_ms = self.now_ms()
            await self.db.run(self._round, now_ms)
            try:
                await d.deliver_due(now_ms)
            except StateError as exc:
                log.error("outbox not read; delivery waits for the next round", error=str(exc))
        try:
            self.views = await self.db.run(self._read_views)
        except StateError as exc:
            log.error("state views not read; /metrics shows the previous ones", error=str(exc))

    def _round(self, now_ms: int) -> None:
        if self.dispatcher is None or not self._run_held():  # held work fails: new work would too
            return
        try:
            self._process_intake(self.dispatcher, now_ms)
            self.dispatcher.flush_due(now_ms)
        except StateError as exc:
            self._flush_failed = True
            self._write_failed(exc, "flush")
            return
        self._flush_failed = False
        self._update_health()

    def _read_views(self) -> ActViews:
        now_ms = self.now_ms()
        return ActViews(self.db.outbox.depth(), self.scaler.desired_replicas(),
                        sum(s.active(now_ms) for s in self.db.silences.list(now_ms=now_ms)), self.db.intake.depth())

    # -- Alertmanager intake (agent.act.intake) ---------------------------------------------------
    async def accept_webhook(self, body: dict[str, Any]) -> dict[str, Any]:
        """Check an Alertmanager webhook and commit its transitions to the inbox; processed by the next
        dispatch round. ``ValueError`` (a bad payload: answer 400) names the problem; ``StateError`` (the
        write failed: answer 5xx so that Alertmanager retries) propagates.

        Alerts this agent raised itself (the same label set as an alert its rules hold now, pending,
        firing or recently resolved) came back through an Alertmanager it sends to: they were routed,
        diagnosed and recorded when they fired here, and are skipped (``own``)."""
        hook = intake.parse_webhook(body)  # the HTTP layer counts a refusal (intake_stats.rejected)
        ours = {fingerprint(dict(a.labels)) for a in self._rules.alerts(
            states=(AlertState.PENDING, AlertState.FIRING, AlertState.INACTIVE))}  # on the loop, like evaluations
        theirs = [a for a in hook.alerts if fingerprint(a.labels) not in ours]
        try:
            accepted = await self.db.run(self.db.intake.accept, theirs, now_ms=self.now_ms())
        except StateError as exc:
            self.intake_stats.unstored += 1
            log.error("alertmanager webhook not stored; answered 503 for Alertmanager to retry",
                      receiver=hook.receiver, alerts=len(hook.alerts), error=str(exc))
            raise
        own = len(hook.alerts) - len(theirs)
        stats = self.intake_stats.alerts
        stats["accepted"] += accepted.new
        stats["duplicate"] += accepted.duplicates
        stats["own"] += own
        # Alertmanager re-sends every group_interval change and repeat_interval: news at info, re-sends at debug
        (log.info if accepted.new else log.debug)(
            "alertmanager webhook accepted", receiver=hook.receiver, source=hook.external_url,
            group_key=hook.group_key, status=hook.status, alerts=len(hook.alerts), new=accepted.new,
            duplicates=accepted.duplicates, own=own, truncated=hook.truncated)
        return {"alerts": len(hook.alerts), "accepted": accepted.new, "duplicates": accepted.duplicates,
                "own": own}

    def _process_intake(self, d: Dispatcher, now_ms: int) -> None:
        """Apply the oldest inbox transitions like an evaluation; the inbox items are deleted in the same
        transaction as what applying them wrote (writer thread), so each is processed exactly once."""
        items = self.db.intake.pending(_INTAKE_BATCH)
        if not items:
            return
        ids = [i.id for i in items]
        try:
            d.apply(intake.evaluation(items), now_ms=now_ms, also=lambda: self.db.intake.done(ids))
        except StateError:
            raise  # the disk, not the items: they stay in the inbox for the next round
        except Exception:  # a bug, not the disk: retrying cannot help, and it must not block what follows
            log.exception("alertmanager alerts could not be processed and are dropped", transitions=len(ids))
            self.db.intake.done(ids)
            return
        self.intake_stats.processed += len(items)
        for i in items:
            a = i.alert
            log.info("alertmanager alert processed", alertname=a.labels.get("alertname", ""), status=a.status,
                     fingerprint=a.fingerprint, source=a.source)

    def _regroup_intake(self) -> None:
        """At start: the intake's firing (and just resolved) alerts back into their aggregation groups."""
        d = self.dispatcher
        if d is None:
            return
        now_ms = self.now_ms()
        alerts = self.db.intake.current(now_ms=now_ms, resolved_keep_ms=RESOLVED_RETENTION_MS)
        d.regroup((intake.snapshot(a) for a in alerts), now_ms)
        if alerts:
            log.info("alertmanager alerts regrouped", alerts=len(alerts))

    # -- findings forwarded by node agents (agent.act.finding_intake) -----------------------------
    async def accept_finding(self, body: dict[str, Any]) -> dict[str, Any]:
        """A finding a node agent forwarded: recorded in the incident of the firing alert it is about (or
        an incident of its own) and routed like a local finding, all committed before this returns.
        ``ValueError`` (answer 400) names what is wrong; ``StateError`` (answer 503: the node agent's
        outbox retries) propagates. A key recorded before is a retry: ``duplicate``, nothing more done."""
        f = finding_intake.parse_forwarded(body)
        d = self.dispatcher
        if d is None:
            raise StateError("the act layer has not started")
        rule_alerts = [d.snapshot(a) for a in self._rules.alerts(states=(AlertState.FIRING,))]  # on the loop
        try:
            out = await self.db.run(finding_intake.record, self.db, d, f, rule_alerts, self.now_ms())
        except StateError as exc:
            self.intake_stats.findings["unstored"] += 1
            log.error("forwarded finding not stored; answered 503 for the node agent to retry", key=f.key,
                      kind=f.finding.kind, error=str(exc))
            raise
        outcome = "duplicate" if out["duplicate"] else "matched" if out["alertname"] else "unmatched"
        self.intake_stats.findings[outcome] += 1
        (log.debug if out["duplicate"] else log.info)(
            "forwarded finding accepted", key=f.key, kind=f.finding.kind, outcome=outcome,
            alertname=out["alertname"], node=f.identity().get("node", ""))
        return out

    def post_finding(self, finding: Finding, alert: AlertSnapshot | None) -> None:
        """Queue a finding for its receivers: handed to the writer thread; :meth:`stop` waits for it."""
        d = self.dispatcher
        if d is None:
            return
        at_ms = self.now_ms()  # in the notification keys: a retry is the same notification

        def run(_: int) -> None:
            d.post_finding(finding, alert, now_ms=at_ms)

        task = asyncio.get_running_loop().create_task(self.db.run(self._submit, _Held("finding", None, run)))
        self._posting.add(task)
        task.add_done_callback(self._posted)

    def _posted(self, task: asyncio.Task[Any]) -> None:
        self._posting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("finding not queued", error=repr(task.exception()))

    async def stop(self) -> None:
        if self._posting:
            await asyncio.wait(list(self._posting), timeout=5.0)
        if self._held and not await self.db.run(self._run_held):
            log.error("state work lost at shutdown: the state database still refuses writes",
                      held=len(self._held), error=self.health.last_error)
        if self.dispatcher is not None:
            await self.dispatcher.drain(timeout_s=5.0)
            for sink in self.dispatcher.sinks.values():
                await sink.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.db.aclose()

    # -- views ------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def incidents_json(self, limit: int = 50) -> list[dict[str, Any]]:
        return [i.to_json() for i in await self.db.run(self.db.incidents.list, limit=limit)]

    async def add_silence(self, body: dict[str, Any]) -> dict[str, Any]:
        """``{"matchers": ['alertname="X"'], "duration": "2h", "createdBy": ..., "comment": ...}``
        (or ``"endsAt"`` in Unix seconds); ValueError says what is wrong."""
        matchers = body.get("matchers")
        if not isinstance(matchers, list) or not matchers or not all(isinstance(m, str) for m in matchers):
            raise ValueError("matchers must be a non-empty list of strings like 'alertname=\"X\"'")
        unknown = sorted(set(body) - _SILENCE_KEYS)
        if unknown:
            names = ", ".join(repr(k[:40]) for k in unknown[:5])
            raise ValueError(f"unknown key(s) {names}; a silence takes {', '.join(sorted(_SILENCE_KEYS))}")
        created_by, comment = body.get("createdBy", "api"), body.get("comment", "")
        for name, text in (("createdBy", created_by), ("comment", comment)):
            if not isinstance(text, str) or len(text) > _MAX_TEXT:
                raise ValueError(f"{name} must be a string of at most {_MAX_TEXT} characters")
        now_ms = self.now_ms()
        ends_ms = _silence_end_ms(body, now_ms)
        if ends_ms <= now_ms:
            raise ValueError("the silence would end in the past")
        try:
            silence = await self.db.run(self.db.silences.add, list(matchers), starts_ms=now_ms,
                                        ends_ms=ends_ms, created_by=created_by, comment=comment)
        except RecursionError as exc:  # a pathological regex the matcher parser did not catch itself
            raise ValueError("a matcher is nested too deeply") from exc
        log.info("silence added", id=silence.id, matchers=matchers, ends_ms=ends_ms)
        self.views = await self.db.run(self._read_views)
        return {"silenceID": silence.id}

    async def expire_silence(self, silence_id: str) -> bool:
        expired = await self.db.run(self.db.silences.expire, silence_id, now_ms=self.now_ms())
        self.views = await self.db.run(self._read_views)
        return expired

    async def silences_json(self) -> list[dict[str, Any]]:
        silences = await self.db.run(self.db.silences.list, now_ms=self.now_ms(), include_expired=True)
        return [s.to_json() for s in silences]


_SILENCE_KEYS = frozenset({"matchers", "duration", "endsAt", "createdBy", "comment"})
_MAX_TEXT = 4096
_MAX_SILENCE_S = MAX_SILENCE_MS / 1000


def _silence_end_ms(body: dict[str, Any], now_ms: int) -> int:
    """The silence's end from ``endsAt`` (Unix seconds, a finite number) or ``duration`` (``2h``)."""
    if "endsAt" in body and "duration" in body:
        raise ValueError("give endsAt or duration, not both")
    if "endsAt" in body:
        ends = body["endsAt"]
        if isinstance(ends, bool) or not isinstance(ends, int | float):
            raise ValueError(f"endsAt must be a number (Unix seconds), not {type(ends).__name__}")
        if not math.isfinite(ends) or not now_ms / 1000 - _MAX_SILENCE_S < ends < now_ms / 1000 + _MAX_SILENCE_S:
            raise ValueError(f"endsAt must be a Unix time within 10 years of now (got {ends!r:.40})")
        return int(ends * 1000)
    duration = body.get("duration", "1h")
    if not isinstance(duration, str):
        raise ValueError(f"duration must be a string like '2h' or '90m', not {type(duration).__name__}")
    seconds = parse_duration(duration[:64])
    if seconds > _MAX_SILENCE_S:
        raise ValueError(f"duration {duration[:64]!r} is longer than the 10 years a silence may last")
    return now_ms + int(seconds * 1000)
