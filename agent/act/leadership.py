"""Who may send to direct receivers in an HA pair, and what a follower may forget (docs/ha.md).

Both replicas queue every notification in their own outbox. Items for a *direct* receiver (Slack,
a webhook: nothing downstream de-duplicates them) are sent only while this replica is the leader;
a follower keeps them *held*. The leader publishes a *watermark* W per direct receiver queue: every
item of that queue it created at or before W has been handled (acknowledged or given up); one per
queue, so a receiver that is down holds back only its own watermark. A follower settles its held items created
at or before ``W - margin`` (its twin of such an item was created at most ``margin`` later, so the
leader handled it) and keeps the rest; when it becomes leader it sends what it still holds. So a
takeover loses nothing, and what the new leader sends twice is bounded by the notifications
created between the old leader's last published watermark (less the margin) and its death.

:class:`Leadership` is shared between the thread that runs the elector (the kubernetes client's
leader election is thread-based and blocking, :mod:`agent.app.leader`) and the event loop that
delivers the outbox, so its state sits behind a lock. Leadership is *lease-bound*: the flag is
true only until ``renew_deadline`` after the last successful renew, checked at send time, so a
leader whose renewals fail stops sending direct items within one renew deadline, before the lease
expires for anyone else, whether or not its elector thread has noticed yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import structlog

from agent.act.queues import QueueName, receiver_queue
from agent.config import Config

__all__ = ["DIRECT_KINDS", "Leadership", "direct_queues"]

log = structlog.get_logger(__name__)

#: Receiver kinds nothing downstream de-duplicates: only the leader sends them. Alertmanager
#: receivers de-duplicate (every replica sends), console receivers write to the replica's own
#: output, and scale requests carry deterministic keys for a de-duplicating scaler.
DIRECT_KINDS = frozenset({"slack", "webhook"})


def direct_queues(config: Config) -> frozenset[QueueName]:
    """The outbox queues that only the leader delivers."""
    return frozenset(receiver_queue(r.name) for r in config.receivers if r.kind in DIRECT_KINDS)


class Leadership:
    """The leader flag (lease-bound, see the module docstring) and the two watermarks.

    The elector calls :meth:`acquired` after every successful create or renew of the lease with
    this identity, :meth:`lost` when it gives the lease up, and :meth:`observed` with the holder and
    the watermark it read from the lease; the outbox calls :meth:`is_leader` at send time,
    :meth:`publish` as leader and :meth:`watermark_ms` as follower.
    """

    def __init__(self, identity: str, *, renew_deadline_s: float, margin_s: float,
                 queues: Iterable[QueueName], monotonic: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.queues = frozenset(queues)
        self.margin_ms = int(margin_s * 1000)
        self._renew_deadline_s = renew_deadline_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._valid_until = float("-inf")  # monotonic seconds
        self._was_leader = False
        self._holder: str | None = None
        self._observed: dict[str, int] = {}  # the leader's watermarks per queue, as this replica last read them
        self._published: dict[str, int] = {}  # this replica's watermarks, to write on its next renew
        self.transitions = 0

    # -- the elector's side (its own thread) ----------------------------------------------------
    def acquired(self) -> None:
        """The lease was created or renewed with this identity just now."""
        with self._lock:
            self._valid_until = self._monotonic() + self._renew_deadline_s
            self._holder = self.identity
        self._transition()

    def lost(self) -> None:
        """The elector stopped leading (a renew failed past the deadline)."""
        with self._lock:
            self._valid_until = float("-inf")
            if self._holder == self.identity:
                self._holder = None
        self._transition()

    def observed(self, holder: str | None, watermarks: dict[str, int] | None) -> None:
        """What the lease said when it was read: its holder and the watermarks that holder published."""
        with self._lock:
            if holder != self.identity:
                self._holder = holder
                if watermarks is not None:
                    self._observed = dict(watermarks)
        self._transition()

    def to_publish(self) -> dict[str, int]:
        """The watermarks to write on the lease at the next renew (empty: none computed yet)."""
        with self._lock:
            return dict(self._published)

    # -- the outbox's side (the event loop) ------------------------------------------------------
    def is_leader(self) -> bool:
        """True while the last successful renew is younger than ``renew_deadline``."""
        with self._lock:
            leading = self._monotonic() < self._valid_until
        if leading != self._was_leader:
            self._transition()
        return leading

    def publish(self, watermarks: dict[str, int]) -> None:
        with self._lock:
            self._published = dict(watermarks)

    def watermarks(self) -> dict[str, int]:
        """The leader's watermarks per queue as last read from the lease (empty: none read yet)."""
        with self._lock:
            return dict(self._observed)

    @property
    def holder(self) -> str | None:
        with self._lock:
            return self._holder

    def _transition(self) -> None:
        """Log a change of the flag once (whichever thread sees it first)."""
        with self._lock:
            leading = self._monotonic() < self._valid_until
            if leading == self._was_leader:
                return
            self._was_leader = leading
            self.transitions += 1
            holder = self._holder
        if leading:
            log.info("became leader: sending to direct receivers", identity=self.identity)
        else:
            log.warning("no longer leader: direct receivers held", identity=self.identity, holder=holder)
