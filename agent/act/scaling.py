"""Scale-out and scale-in decisions: bounds, cooldowns, hysteresis, and the request they produce.

An action of type ``scale_out``/``scale_in`` calls :meth:`Scaler.decide` for an alert;
the scaler picks the service (by name, or the first whose matchers fit the alert's
labels) and decides from the persisted :class:`~agent.act.state.ScaleState`:

* **current** replicas = what the receiver last reported (``ScaleState.replicas``), else
  ``initial_replicas``, else ``min_replicas``;
* **out**: ``min(current + step, max)``; refused at ``max_replicas`` or within
  ``scale_out_cooldown`` of the last scale-out (a new vLLM replica needs minutes to load
  its weights; asking again before it serves would overshoot);
* **in**: ``max(current - step, min)``; refused at ``min_replicas``, within
  ``scale_in_cooldown`` of the last scale-in *or scale-out*, or until the service has
  been healthy (no pending/firing scale-out alert, see :meth:`Scaler.mark_unhealthy`)
  for ``scale_in_healthy_for``. "Healthy since" is never earlier than the agent's start:
  after a restart it has not watched the service long enough to shrink it. Scale-in is
  deliberately slower than scale-out (hysteresis), like the HPA's stabilization window.

Acting writes the new desired count with its cooldown stamp, queues the scale request
in the outbox (when the service has a webhook) and records an incident event, all in
one state-database transaction: a crash between "decided" and "queued" can neither
lose the request nor, after the restart, send a second one (the cooldown stamp and the
queued request commit together). The request names an absolute replica count, not a
delta, and carries an idempotency key, so a retried or repeated request cannot scale
twice. The key is deterministic (:func:`idempotency_key`): two central replicas with the
same config, evaluating the same data at the same aligned timestamps, ask for the same
step under the same key, and a receiver that de-duplicates by it acts once. Dry-run logs
and records what it would do and changes nothing persisted; it keeps
what the state would have become in memory, so its "would scale" lines are paced by the
same cooldowns and bounds as real ones (decide runs every evaluation while an alert
fires). Refusals are logged at info when they start or change kind, then at debug.

Timestamps are Unix milliseconds passed in by the caller; a stamp of 0 means "never".
Without a webhook the exported ``sre_agent_desired_replicas`` is the output (an HPA or
KEDA reads it) and the scaler assumes it is followed; with one, the replica count the
receiver reports in its reply (:meth:`Scaler.on_ack`) is the truth.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import structlog

from agent.act.notification import AlertSnapshot, Notification, json_number
from agent.act.queues import scale_queue
from agent.act.state import ScaleState, StateDB
from agent.config import ScalingConfig, ScalingServiceConfig, format_duration
from agent.matchers import AlertMatcher, matchers_from, matches_all
from agent.series import iso_ms

__all__ = ["OUTCOMES", "Decision", "Direction", "Scaler", "idempotency_key"]

log = structlog.get_logger(__name__)

Direction = Literal["out", "in"]

UNHEALTHY_WRITE_INTERVAL_MS = 1000  # mark_unhealthy persists at most this often per service
#: Outcomes of a decision, as ``sre_agent_scale_actions_total{outcome}`` counts them.
OUTCOMES = ("acted", "dry_run", "refused")


@dataclass(frozen=True)
class Decision:
    """What :meth:`Scaler.decide` concluded. ``acted`` is true only when the new desired
    count was persisted (and the request queued, if the service has a webhook);
    ``dry_run`` is true when it would have acted but the service is in dry-run. A refusal
    has ``to_replicas == from_replicas`` and says why in ``reason``."""

    service: str
    direction: str
    from_replicas: int
    to_replicas: int
    acted: bool
    dry_run: bool
    reason: str
    notification: Notification | None = None


def idempotency_key(service: str, direction: str, from_replicas: int, to_replicas: int, *,
                    started_ms: int, now_ms: int, cooldown_s: float) -> str:
    """The key a receiver de-duplicates a scale request by (also its outbox key).

    Built only from what every replica of an HA pair shares, never from a local clock
    reading or a random value: the service, the direction, the step (``from->to``, where
    ``from`` is what the receiver last reported) and the cooldown window the decision falls
    in, counted from the firing alert's start (its ``startsAt``, the same on both replicas
    because they evaluate at the same aligned timestamps, see :mod:`agent.rules.timing`).
    Two replicas asking for the same scale-out in the same window therefore send one key; the
    same step asked again a cooldown later (the receiver never confirmed it) is a new window and
    so a new request. An alert without a start counts windows from the Unix epoch.
    """
    window_ms = max(int(cooldown_s * 1000), 1)
    anchor = started_ms if 0 < started_ms <= now_ms else 0
    window = anchor + (now_ms - anchor) // window_ms * window_ms
    return f"scale:{service}:{direction}:{from_replicas}->{to_replicas}:{window}"


@dataclass(frozen=True)
class _Plan:
    """One scale step that passed every check."""

    svc: ScalingServiceConfig
    direction: str
    current: int
    target: int
    now_ms: int
    reason: str
    key: str

    def detail(self) -> dict[str, Any]:
        """The incident event's detail."""
        return {"action": f"scale_{self.direction}", "service": self.svc.name, "from_replicas": self.current,
                "to_replicas": self.target, "reason": self.reason, "idempotency_key": self.key}

    def payload(self, alert: AlertSnapshot, values: Mapping[str, float]) -> dict[str, Any]:
        """The scale request body; ``replicas`` is the absolute target the receiver applies."""
        return {
            "service": self.svc.name,
            "direction": self.direction,
            "from_replicas": self.current,
            "to_replicas": self.target,
            "replicas": self.target,
            "step": self.svc.step,
            "reason": self.reason,
            "alert": {
                "name": alert.labels.get("alertname", ""),
                "labels": dict(alert.labels),
                "annotations": dict(alert.annotations),
                "startsAt": iso_ms(alert.starts_at_ms),
                "fingerprint": alert.fingerprint,
            },
            "values": {k: json_number(v) for k, v in {"alert_value": alert.value, **values}.items()},
            "idempotency_key": self.key,
            "dry_run": False,
            "decided_at": iso_ms(self.now_ms),
        }


class Scaler:
    """Decides scale-outs and scale-ins for the configured services, over the state database."""

    def __init__(self, config: ScalingConfig, db: StateDB, *, started_ms: int) -> None:
        self._config = config
        self._db = db
        self._started_ms = started_ms
        self._services = {s.name: s for s in config.services}
        self._matchers: list[tuple[ScalingServiceConfig, list[AlertMatcher]]] = [
            (s, matchers_from(s.matchers, s.match, s.match_re)) for s in config.services
        ]
        self._unhealthy_ms: dict[str, int] = {}  # latest mark, written or not
        self._unhealthy_written_ms: dict[str, int] = {}  # latest mark persisted
        self._dry: dict[str, ScaleState] = {}  # dry-run: what the state would be, in memory only
        self._refused: dict[tuple[str, str], str] = {}  # (service, direction) -> last refusal logged at info
        # (service, direction, outcome) -> decisions; written on the writer thread, read by /metrics
        self._actions: Counter[tuple[str, str, str]] = Counter()
        self._actions_lock = threading.Lock()

    # -- lookups ------------------------------------------------------------------------------
    def service_for(self, labels: Mapping[str, str], name: str | None = None) -> ScalingServiceConfig | None:
        """The service called ``name`` if given, else the first whose matchers match ``labels``."""
        if name is not None:
            return self._services.get(name)
        return next((s for s, ms in self._matchers if matches_all(ms, labels)), None)

    def desired_replicas(self) -> dict[str, int]:
        """Service -> desired replicas, for ``sre_agent_desired_replicas{service}``."""
        out: dict[str, int] = {}
        for name, svc in self._services.items():
            state = self._db.cooldowns.get(name)
            out[name] = state.desired if state is not None else _initial(svc)
        return out

    def actions(self) -> dict[tuple[str, str, str], int]:
        """(service, direction, outcome) -> decisions since start, every configured service and
        direction included at 0, for ``sre_agent_scale_actions_total``."""
        with self._actions_lock:
            counts = dict(self._actions)
        for name in self._services:
            for direction in ("out", "in"):
                for outcome in OUTCOMES:
                    counts.setdefault((name, direction, outcome), 0)
        return counts

    def _count(self, decision: Decision) -> Decision:
        outcome = "acted" if decision.acted else "dry_run" if decision.dry_run else "refused"
        with self._actions_lock:
            self._actions[(decision.service, decision.direction, outcome)] += 1
        return decision

    # -- inputs -------------------------------------------------------------------------------
    def mark_unhealthy(self, service: str, now_ms: int) -> None:
        """Note that ``service`` has a pending or firing scale-out alert at ``now_ms``.

        Called every evaluation; persisted at most once a second per service (the
        in-memory mark is always current, the database's at most a second behind).
        """
        svc = self._services.get(service)
        if svc is None:
            log.warning("unhealthy mark for an unknown scaling service", service=service)
            return
        self._unhealthy_ms[service] = max(self._unhealthy_ms.get(service, 0), now_ms)
        written = self._unhealthy_written_ms.get(service)
        if written is not None and now_ms - written < UNHEALTHY_WRITE_INTERVAL_MS:
            return
        with self._db.transaction():
            state = self._state(svc)
            self._db.cooldowns.put(replace(state, last_unhealthy_ms=max(state.last_unhealthy_ms, now_ms)))
        self._unhealthy_written_ms[service] = now_ms

    def on_ack(self, n: Notification, reply: Mapping[str, Any] | None) -> None:
        """The receiver acknowledged a scale request: its reported ``replicas`` become current."""
        if n.kind != "scale" or n.scale is None or reply is None:
            return
        replicas = reply.get("replicas")
        svc = self._services.get(str(n.scale.get("service", "")))
        if svc is None or not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            return
        with self._db.transaction():
            state = self._state(svc)
            self._db.cooldowns.put(replace(state, replicas=replicas))
        log.info("scale acknowledged", service=svc.name, replicas=replicas, key=n.key,
                 applied=reply.get("applied"))  # fmt: skip

    # -- decisions ----------------------------------------------------------------------------
    def decide(
        self, direction: Literal["out", "in"], alert: AlertSnapshot, *, service: str | None, now_ms: int,
        values: Mapping[str, float] | None = None,
    ) -> Decision:  # fmt: skip
        """Decide (and, unless refused or dry-run, act on) one scale step for ``alert``."""
        svc = self.service_for(alert.labels, service)
        if svc is None:
            why = f"no scaling service named {service!r}" if service else "no scaling service matches the alert"
            log.warning("scale refused", direction=direction, alertname=alert.labels.get("alertname", ""),
                        reason=why)  # fmt: skip
            return self._count(Decision(service or "", direction, 0, 0, acted=False, dry_run=False, reason=why))
        dry_run = self._config.dry_run or svc.dry_run
        state = self._dry.get(svc.name) if dry_run else None
        if state is None:
            state = self._db.cooldowns.get(svc.name)
        current = state.replicas if state is not None else _initial(svc)
        if direction == "out":
            target = min(current + svc.step, svc.max_replicas)
            refusal = self._refuse_out(svc, state, current, now_ms)
        else:
            target = max(current - svc.step, svc.min_replicas)
            refusal = self._refuse_in(svc, state, current, now_ms)
        if refusal is not None:
            self._log_refusal(svc.name, direction, current, *refusal)
            return self._count(Decision(svc.name, direction, current, current, acted=False, dry_run=False,
                                        reason=refusal[1]))
        self._refused.pop((svc.name, direction), None)
        reason = _reason(alert)
        cooldown = svc.scale_out_cooldown if direction == "out" else svc.scale_in_cooldown
        key = idempotency_key(svc.name, direction, current, target, started_ms=alert.starts_at_ms, now_ms=now_ms,
                              cooldown_s=cooldown)  # fmt: skip
        plan = _Plan(svc, direction, current, target, now_ms, reason, key)
        if dry_run:
            log.info("would scale", service=svc.name, direction=direction, from_replicas=current,
                     to_replicas=target, reason=reason)  # fmt: skip
            self._db.incidents.add_event(alert.fingerprint, at_ms=now_ms, kind="action",
                                        detail={**plan.detail(), "dry_run": True})  # fmt: skip
            # Pace the next "would scale" as a real run would be paced (cooldowns, bounds),
            # so a firing alert does not record one every evaluation; nothing is persisted.
            self._dry[svc.name] = _stepped(state if state is not None else self._fresh(svc), plan, target)
            return self._count(Decision(svc.name, direction, current, target, acted=False, dry_run=True,
                                        reason=reason))
        notification = None
        if svc.webhook is not None:
            notification = Notification(key=plan.key, receiver=scale_queue(svc.name), kind="scale", created_ms=now_ms,
                                        scale=plan.payload(alert, values or {}))  # fmt: skip
        self._act(plan, notification, alert)
        log.info("scale decided", service=svc.name, direction=direction, from_replicas=current,
                 to_replicas=target, queued=notification is not None, key=plan.key, reason=reason)  # fmt: skip
        return self._count(Decision(svc.name, direction, current, target, acted=True, dry_run=False,
                                    reason=reason, notification=notification))

    def _act(self, plan: _Plan, notification: Notification | None, alert: AlertSnapshot) -> None:
        """Persist the decision, queue its request and record it, as one transaction."""
        # With a webhook the receiver's reply (on_ack) sets replicas; without one the
        # exported desired count is the output and is assumed to be followed.
        replicas = plan.current if notification is not None else plan.target
        with self._db.transaction():
            self._db.cooldowns.put(_stepped(self._state(plan.svc), plan, replicas))  # re-read: keep others' fields
            if notification is not None and not self._db.outbox.enqueue(notification, now_ms=plan.now_ms):
                log.warning("scale request already queued", service=plan.svc.name, key=notification.key)
            self._db.incidents.add_event(alert.fingerprint, at_ms=plan.now_ms, kind="action",
                                        detail={**plan.detail(), "dry_run": False,
                                                "queued": notification is not None})  # fmt: skip

    def _refuse_out(self, svc: ScalingServiceConfig, state: ScaleState | None, current: int, now_ms: int
                    ) -> tuple[str, str] | None:  # fmt: skip
        """(kind, reason) if a scale-out is not allowed now."""
        if current >= svc.max_replicas:
            return "bound", f"at max_replicas ({svc.max_replicas})"
        if state is not None and _within(state.last_out_ms, now_ms, svc.scale_out_cooldown):
            return "cooldown", _cooldown_text("scale_out_cooldown", "scale-out", state.last_out_ms, now_ms,
                                              svc.scale_out_cooldown)  # fmt: skip
        return None

    def _refuse_in(self, svc: ScalingServiceConfig, state: ScaleState | None, current: int, now_ms: int
                   ) -> tuple[str, str] | None:  # fmt: skip
        """(kind, reason) if a scale-in is not allowed now."""
        if current <= svc.min_replicas:
            return "bound", f"at min_replicas ({svc.min_replicas})"
        if state is not None:
            for stamp, what in ((state.last_in_ms, "scale-in"), (state.last_out_ms, "scale-out")):
                if _within(stamp, now_ms, svc.scale_in_cooldown):
                    return "cooldown", _cooldown_text("scale_in_cooldown", what, stamp, now_ms, svc.scale_in_cooldown)
        persisted = state.last_unhealthy_ms if state is not None else 0
        since = max(persisted, self._unhealthy_ms.get(svc.name, 0), self._started_ms)
        healthy_ms = now_ms - since
        if healthy_ms < svc.scale_in_healthy_for * 1000:
            start = " since the agent started" if since == self._started_ms else ""
            return "unhealthy", (f"healthy for {format_duration(max(healthy_ms, 0) / 1000)}{start}, "
                                 f"scale_in_healthy_for is {format_duration(svc.scale_in_healthy_for)}")
        return None

    def _log_refusal(self, service: str, direction: str, replicas: int, kind: str, reason: str) -> None:
        """Info when a refusal starts or changes kind; debug while it repeats (decide runs every evaluation)."""
        key = (service, direction)
        level = log.debug if self._refused.get(key) == kind else log.info
        self._refused[key] = kind
        level("scale refused", service=service, direction=direction, replicas=replicas, reason=reason)

    # -- state --------------------------------------------------------------------------------
    def _state(self, svc: ScalingServiceConfig) -> ScaleState:
        state = self._db.cooldowns.get(svc.name)
        return state if state is not None else self._fresh(svc)

    def _fresh(self, svc: ScalingServiceConfig) -> ScaleState:
        n = _initial(svc)
        return ScaleState(service=svc.name, replicas=n, desired=n, last_out_ms=0, last_in_ms=0, last_unhealthy_ms=0)


def _stepped(base: ScaleState, plan: _Plan, replicas: int) -> ScaleState:
    """``base`` after ``plan``: the new desired count and the direction's cooldown stamp."""
    if plan.direction == "out":
        return replace(base, replicas=replicas, desired=plan.target, last_out_ms=plan.now_ms)
    return replace(base, replicas=replicas, desired=plan.target, last_in_ms=plan.now_ms)


def _initial(svc: ScalingServiceConfig) -> int:
    return svc.initial_replicas if svc.initial_replicas is not None else svc.min_replicas


def _within(stamp_ms: int, now_ms: int, window_s: float) -> bool:
    """True if ``stamp_ms`` (0 = never) is less than ``window_s`` before ``now_ms``."""
    return stamp_ms > 0 and now_ms - stamp_ms < window_s * 1000


def _cooldown_text(setting: str, what: str, stamp_ms: int, now_ms: int, window_s: float) -> str:
    return (f"{setting}: last {what} {format_duration(max(now_ms - stamp_ms, 0) / 1000)} ago, "
            f"cooldown {format_duration(window_s)}")


def _reason(alert: AlertSnapshot) -> str:
    name = alert.labels.get("alertname", "alert")
    summary = alert.annotations.get("summary", "")
    return f"{name} {alert.status}: {summary}" if summary else f"{name} {alert.status}"


