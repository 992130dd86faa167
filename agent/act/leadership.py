"""Who may send to direct receivers in an HA pair, and what a follower may forget (docs/ha.md).

Both replicas queue every notification in their own outbox. Items for a *direct* receiver (Slack,
a webhook: nothing downstream de-duplicates them) are sent only while this replica is the leader;
a follower keeps them *held*. The leader keeps a *watermark* W per direct receiver queue: every
item of that queue it created at or before W has been handled (acknowledged or given up); one per
queue, so a receiver that is down holds back only its own watermark. A follower settles its held
items created at or before its own copy of W less ``margin`` (its twin of such an item was created
at most ``margin`` later, so the leader handled it) and keeps the rest; when it becomes leader it
sends what it still holds. So a takeover loses nothing, and what the new leader sends twice is
bounded by the notifications created in the last few lease renewals before the old leader died.

Why no clock is compared with another (client-go's elector works the same way: it trusts the local
time at which it *observed* a change of the lease record, never the times written in it). W is a
time on the leader's wall clock and the follower's items carry times on its own; two machines'
clocks may be any distance apart (a leader a minute ahead would otherwise make its follower settle,
and lose, notifications the leader had not even created yet). So nothing absolute crosses the wire:

* the leader writes, per queue, how far W lies *behind* the moment of the write (``now - W``, a
  duration on its own clock, :meth:`to_publish`);
* the follower notes its own clock when each lease read *starts*. A read that returns a record
  version it has not seen proves the write came after its previous read was served, so after that
  read started (Kubernetes serves a GET without ``resourceVersion`` from etcd, consistently). Its
  copy of W is therefore ``previous read start - behind - write_allowance`` on its own clock
  (:meth:`observed`), where ``write_allowance`` (the lease API's request timeout) covers a write
  committed a little after the leader computed ``behind``. A ``behind`` below zero (a hostile or
  broken annotation claiming the future) counts as zero; the first record a replica reads proves
  nothing and moves no watermark.

What remains: ``margin`` covers only how far apart the two replicas create the same notification
(their evaluations, their dispatch rounds), plus clock *rate* error over that interval (ppm: nothing);
a step of one replica's own clock between stamping an item and settling it still counts against it,
as any wall-clock time stored in its outbox does. The price of the bound: a follower's W trails the
leader's by up to one read interval and ``write_allowance`` (one ``retry_period``) more, so settling
takes about ``margin + 4 x retry_period`` instead of ``margin + 2 x retry_period`` (measured in
tests/app/test_ha.py: 6 s with a 2 s margin and a 1 s retry period), and the at-least-once window
after a takeover is that much longer.

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
    """The leader flag (lease-bound, see the module docstring) and the watermarks, the leader's and the
    follower's copy of them.

    The elector calls :meth:`acquired` after every successful create or renew of the lease with
    this identity, :meth:`lost` when it gives the lease up, :meth:`now_ms` as a read of the lease
    starts and :meth:`observed` with what that read returned, and :meth:`to_publish` for the
    annotation of a renew; the outbox calls :meth:`is_leader` at send time, :meth:`publish` as leader
    and :meth:`watermarks` as follower. ``clock`` is the agent's wall clock (the one that stamps outbox
    items), ``monotonic`` bounds the flag.
    """

    def __init__(self, identity: str, *, renew_deadline_s: float, margin_s: float,
                 queues: Iterable[QueueName], monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], float] = time.time, write_allowance_s: float = 0.0) -> None:
        self.identity = identity
        self.queues = frozenset(queues)
        self.margin_ms = int(margin_s * 1000)
        self.write_allowance_ms = int(write_allowance_s * 1000)
        self._renew_deadline_s = renew_deadline_s
        self._monotonic = monotonic
        self._clock = clock
        self._lock = threading.Lock()
        self._valid_until = float("-inf")  # monotonic seconds
        self._was_leader = False
        self._holder: str | None = None
        self._observed: dict[str, int] = {}  # the leader's watermarks per queue, on this replica's clock
        self._published: dict[str, int] = {}  # this replica's watermarks (its clock), for its next renew
        self._version: str | None = None  # the lease record version the last read returned
        self._last_read_ms: int | None = None  # when that read started, on this replica's clock
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

    def now_ms(self) -> int:
        """This replica's wall clock in Unix ms: the elector notes it as each read of the lease starts."""
        return int(self._clock() * 1000)

    def observed(self, holder: str | None, behind: dict[str, int] | None, *, version: str,
                 read_started_ms: int) -> None:
        """What a read of the lease returned: its holder, the ``behind`` durations that holder wrote
        (queue -> ms, :meth:`to_publish`), the record's version, and when (this replica's clock) the
        read started. A version not returned by the previous read was written after that read started:
        the leader's watermarks are taken as that start less ``behind`` and the write allowance
        (module docstring)."""
        with self._lock:
            written_after_ms = self._last_read_ms if version != self._version else None
            self._version, self._last_read_ms = version, read_started_ms
            if holder != self.identity:
                self._holder = holder
                if behind is not None and written_after_ms is not None:
                    self._observed = {q: written_after_ms - max(b, 0) - self.write_allowance_ms
                                      for q, b in behind.items()}
        self._transition()

    def to_publish(self) -> dict[str, int]:
        """For the annotation of the renew being written now: per queue, how many ms the watermark lies
        behind this moment on this replica's clock (empty: none computed yet)."""
        now_ms = self.now_ms()
        with self._lock:
            return {q: max(now_ms - w, 0) for q, w in self._published.items()}

    # -- the outbox's side (the event loop) ------------------------------------------------------
    def is_leader(self) -> bool:
        """True while the last successful renew is younger than ``renew_deadline``."""
        with self._lock:
            leading = self._monotonic() < self._valid_until
        if leading != self._was_leader:
            self._transition()
        return leading

    def publish(self, watermarks: dict[str, int]) -> None:
        """As leader: the watermark per queue, Unix ms on this replica's clock."""
        with self._lock:
            self._published = dict(watermarks)

    def watermarks(self) -> dict[str, int]:
        """The leader's watermarks per queue, on this replica's clock (empty: none observed yet)."""
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
