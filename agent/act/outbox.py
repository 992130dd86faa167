"""Outbox delivery: send what the dispatcher queued, one FIFO queue per receiver, until acknowledged.

The dispatcher (:mod:`agent.act.dispatch`) decides *what* to send and writes it to the SQLite
outbox; this module gets it *out*. Each receiver (outbox queue name) has its own FIFO
queue, so one that is down delays nobody else; once its head is acknowledged the rest of a
backlog follows at once. An item leaves the outbox only when its receiver acknowledged it.
After the n-th failed attempt of an item the next waits ``cap/2 + rng × cap/2`` with
``cap = min(retry_max, retry_initial × 2^(n-1))`` (exponential, "equal jitter"), or the
receiver's ``Retry-After`` when longer (capped at
:data:`~agent.act.sinks.http.RETRY_AFTER_CAP_S`), but never past the item's give-up time, so its
last attempt is made then; a rejection (4xx) or a failure at or past ``notify.give_up_after``
moves the item to failed. Every outcome lands in the alerts'
incidents (``notified`` / ``notify_failed``) and in :class:`DeliveryStats` for /metrics.

A notification that cannot be rendered or encoded for its receiver (a sink raising
``ValueError``, ``TypeError``, ``OverflowError`` or ``RecursionError``, or
:class:`~agent.errors.RenderError`; an outbox row that no longer decodes) fails the same way
on every attempt: it is failed at once, logged and counted (``unrenderable``), and the queue
goes on with the next item instead of retrying the head until ``give_up_after``. Other
unexpected exceptions from a sink stay retryable (a bug that may not repeat).

In an HA pair (:mod:`agent.act.leadership`) the queues of direct receivers are delivered only
while this replica leads, checked before each send; a follower's held items at or below the
leader's watermark (less the margin) are *settled*: they leave the outbox as delivered by the
leader. A leader publishes its own watermark every round.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from agent.act.leadership import Leadership
from agent.act.notification import Notification
from agent.act.queues import QueueName
from agent.act.scaling import Scaler
from agent.act.sinks import Sink
from agent.act.sinks.http import RETRY_AFTER_CAP_S
from agent.act.state import OutboxItem, StateDB
from agent.config import NotifyConfig
from agent.errors import DeliveryError, RenderError

__all__ = ["DeliveryStats", "OutboxDelivery"]

log = structlog.get_logger(__name__)

#: Added to a sink's own ``deadline_s`` before the outbox cancels a send (a retryable failure).
SEND_GRACE_S = 1.0
#: What a sink raises when the payload itself cannot be rendered or encoded: failing again cannot help.
_RENDER_ERRORS = (ValueError, TypeError, OverflowError, RecursionError)


@dataclass
class DeliveryStats:
    """Per-receiver outcome counters for the agent's /metrics."""

    sent: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)  # HA: held items the leader delivered
    unrenderable: dict[str, int] = field(default_factory=dict)  # failed at once: could not be rendered (in failed)

    def bump(self, which: dict[str, int], receiver: str) -> None:
        which[receiver] = which.get(receiver, 0) + 1


class OutboxDelivery:
    """Delivers the outbox's queues through the sinks (see the module docstring).

    :meth:`start_due` (each dispatch round) starts a delivery task for every queue whose head
    is due and that has none running; everything external (state database, sinks, the
    scaler that hears about acknowledged scale requests, clock, jitter source) is passed in.
    """

    def __init__(
        self,
        db: StateDB,
        sinks: Mapping[QueueName, Sink],
        notify: NotifyConfig,
        *,
        scaler: Scaler | None,
        clock: Callable[[], float],
        rng: Callable[[], float],
        leadership: Leadership | None = None,
    ) -> None:
        self._db = db
        self._leadership = leadership
        self.sinks = dict(sinks)
        self._notify = notify
        self._scaler = scaler
        self._clock = clock
        self._rng = rng
        self._in_flight: dict[str, asyncio.Task[None]] = {}  # outbox receiver -> its delivery task
        self._sending: dict[str, int] = {}  # outbox receiver -> id of the item being sent now
        self.stats = DeliveryStats()

    def sending(self, receiver: str) -> int | None:
        """The id of the item of this queue being sent right now, if any (it must not change)."""
        return self._sending.get(receiver)

    async def start_due(self, now_ms: int) -> None:
        """Start delivering each queue whose head is due and that has no delivery running."""
        if self._leadership is not None:
            await self._db.run(self._handover, self._leadership, now_ms)
        for item in await self._db.run(self._db.outbox.due, now_ms):
            if item.receiver in self._in_flight or self._held(item):
                continue
            task = asyncio.create_task(self._run_queue(item), name=f"deliver {item.receiver}")
            self._in_flight[item.receiver] = task
            task.add_done_callback(functools.partial(self._done, item.receiver))

    async def _run_queue(self, item: OutboxItem | None) -> None:
        """Deliver one receiver's queue in order while its head is due and acknowledged, so a
        backlog left by an outage goes out in one go; stop at the first failure (its backoff), except one that
        cannot be rendered: it is failed for good and the next item goes at once."""
        while item is not None:
            if self._held(item):  # checked before every send: a lost lease stops the rest of a backlog
                return
            self._sending[item.receiver] = item.id
            try:
                delivered = await self._deliver(item)
            finally:
                self._sending.pop(item.receiver, None)
            if not delivered:
                return
            head = await self._db.run(self._db.outbox.head, item.receiver)
            item = head if head is not None and head.next_attempt_ms <= int(self._clock() * 1000) else None

    def _held(self, item: OutboxItem) -> bool:
        """A direct receiver's item while this replica does not lead: kept, not sent."""
        lead = self._leadership
        return lead is not None and item.receiver in lead.queues and not lead.is_leader()

    def _handover(self, lead: Leadership, now_ms: int) -> None:
        """On the state thread. Leader: publish each direct queue's watermark (everything of the queue it
        created before its oldest undelivered item there, or before now, is handled). Follower: settle held
        items at or below the leader's watermark less the margin (module docstring of
        :mod:`agent.act.leadership`)."""
        if lead.is_leader():
            oldest = self._db.outbox.oldest_created(lead.queues)
            lead.publish({q: min(oldest.get(q, now_ms), now_ms) - 1 for q in lead.queues})
            return
        watermarks = lead.watermarks()
        for receiver, watermark in sorted(watermarks.items()):
            if receiver not in lead.queues:
                continue
            n = self._db.outbox.settle_through(receiver, created_ms=watermark - lead.margin_ms, now_ms=now_ms,
                                               keep=self._sending.get(receiver))
            if n:
                self.stats.settled[receiver] = self.stats.settled.get(receiver, 0) + n
                log.info("held notifications settled: the leader delivered them", receiver=receiver, items=n,
                         watermark_ms=watermark, leader=lead.holder)

    def _done(self, receiver: str, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(receiver, None)
        if not task.cancelled() and task.exception() is not None:  # the state database failed: log, go on
            log.error("delivery task failed", receiver=receiver, error=repr(task.exception()))

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait for deliveries in flight (shutdown, tests)."""
        tasks = list(self._in_flight.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def _deliver(self, item: OutboxItem) -> bool:
        """One attempt at one item; True when the queue may go on with its next item: the receiver
        acknowledged it, or it failed for good because it cannot be rendered (it must hold back nothing)."""
        now_ms = int(self._clock() * 1000)
        bound = log.bind(receiver=item.receiver, key=item.key, attempt=item.attempts + 1)
        sink = self.sinks.get(item.receiver)
        if sink is None:
            await self._db.run(self._db.outbox.fail, item.id, error="receiver is no longer configured", now_ms=now_ms)
            self.stats.bump(self.stats.failed, item.receiver)
            bound.warning("notification dropped: receiver no longer configured")
            return False
        try:
            n = item.notification()
        except (ValueError, TypeError, KeyError) as exc:  # a row that no longer decodes: it never will
            error = f"the notification cannot be rendered: its stored payload does not decode ({exc!r:.200})"
            await self._db.run(self._db.outbox.fail, item.id, error=error, now_ms=now_ms)
            self.stats.bump(self.stats.failed, item.receiver)
            self.stats.bump(self.stats.unrenderable, item.receiver)
            bound.error("notification failed for good", error=error, reason="cannot be rendered")
            return True  # the queue goes on with the next item
        wait_ms = self._backoff_ms(item.attempts)  # set before sending: a crash mid-send retries then too
        await self._db.run(self._db.outbox.begin_attempt, item.id, next_attempt_ms=now_ms + wait_ms)
        try:
            reply = await asyncio.wait_for(sink.send(n, attempt=item.attempts), timeout=sink.deadline_s + SEND_GRACE_S)
        except (DeliveryError, TimeoutError) as exc:
            await self._failed(item, n, exc, bound, wait_ms)
            return isinstance(exc, RenderError)  # the queue goes on with the next item
        except _RENDER_ERRORS as exc:
            bound.exception("sink could not render the notification")
            await self._failed(item, n, RenderError(f"the notification cannot be rendered for {item.receiver}: "
                                                    f"{type(exc).__name__}: {exc}"), bound, wait_ms)
            return True
        except Exception as exc:  # a sink bug must not kill the dispatcher; treat as retryable
            bound.exception("sink raised an unexpected error")
            await self._failed(item, n, DeliveryError(f"unexpected {type(exc).__name__}: {exc}"), bound, wait_ms)
            return False
        await self._db.run(self._acked, item, n, reply, int(self._clock() * 1000))
        self.stats.bump(self.stats.sent, item.receiver)
        bound.info("notification delivered", kind=n.kind, status=n.status, alerts=len(n.alerts))
        return True

    def _acked(self, item: OutboxItem, n: Notification, reply: dict[str, Any] | None, done_ms: int) -> None:
        """On the state thread: the item leaves the outbox, its incidents hear of it, the scaler too."""
        with self._db.transaction():
            self._db.outbox.ack(item.id, now_ms=done_ms)
            for a in n.alerts:
                self._db.incidents.add_event(a.fingerprint, at_ms=done_ms, kind="notified",
                                             detail={"receiver": item.receiver, "status": n.status, "kind": n.kind,
                                                     "attempts": item.attempts + 1,
                                                     "last_error": item.last_error})
        if n.kind == "scale" and self._scaler is not None:
            self._scaler.on_ack(n, reply)

    def _given_up(self, item: OutboxItem, n: Notification, error: str, now_ms: int) -> None:
        """On the state thread: the item moves to failed, its incidents hear of it."""
        with self._db.transaction():
            self._db.outbox.fail(item.id, error=error, now_ms=now_ms)
            for a in n.alerts:
                self._db.incidents.add_event(a.fingerprint, at_ms=now_ms, kind="notify_failed",
                                             detail={"receiver": item.receiver, "error": error,
                                                     "attempts": item.attempts + 1})

    async def _failed(self, item: OutboxItem, n: Notification, exc: Exception, bound: Any, wait_ms: int) -> None:
        now_ms = int(self._clock() * 1000)
        permanent = isinstance(exc, DeliveryError) and exc.permanent
        give_up_ms = item.created_ms + int(self._notify.give_up_after * 1000)
        too_old = now_ms >= give_up_ms
        error = str(exc) or type(exc).__name__
        if permanent or too_old:
            await self._db.run(self._given_up, item, n, error, now_ms)
            self.stats.bump(self.stats.failed, item.receiver)
            reason = "rejected by receiver" if permanent else "gave up after notify.give_up_after"
            if isinstance(exc, RenderError):
                self.stats.bump(self.stats.unrenderable, item.receiver)
                reason = "cannot be rendered"
            bound.error("notification failed for good", error=error, reason=reason)
            return
        delay = wait_ms
        hint = exc.retry_after_s if isinstance(exc, DeliveryError) else None
        if hint is not None:  # parsed within RETRY_AFTER_CAP_S already; capped again for any other source
            delay = max(delay, int(min(hint, RETRY_AFTER_CAP_S) * 1000))
        delay = min(delay, give_up_ms - now_ms)  # the last attempt at the give-up time, never a wait past it
        await self._db.run(self._db.outbox.retry, item.id, next_attempt_ms=now_ms + delay, error=error)
        self.stats.bump(self.stats.retried, item.receiver)
        bound.warning("notification not delivered; will retry", error=error, retry_in_s=round(delay / 1000, 1))

    def _backoff_ms(self, attempts: int) -> int:
        """The wait after the (``attempts`` + 1)-th failed attempt: exponential backoff with "equal
        jitter" (half fixed, half random), ``cap = min(retry_max, retry_initial × 2^attempts)``."""
        cap = min(self._notify.retry_max, self._notify.retry_initial * 2 ** min(attempts, 30))
        return int(1000 * (cap / 2 + self._rng() * cap / 2))

