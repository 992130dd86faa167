"""How fast one client may guess the API token at ``POST /login``: a few tries, then back-off.

The token is long and compared in constant time, but a login form that answers every guess at
once lets anyone who reaches the port try as fast as the agent can answer (and spend the CPU
the scraper needs on it). So each client address gets :data:`FREE_FAILURES` wrong tokens; after
that it must wait before the next try, twice as long after each further failure
(:data:`FIRST_WAIT_S`, then doubling up to :data:`MAX_WAIT_S`), as OpenSSH's ``PerSourcePenalties``
and fail2ban-style lockouts do. A try inside the wait is answered ``429`` with ``Retry-After``
and not checked at all, so it neither counts nor reveals anything. A right token clears the
client's record.

Refusing costs nothing: no sleep holds a connection or a task. Records are kept for
:data:`MAX_CLIENTS` addresses (the least recently failing go first) and forgotten once their
wait is long over. Behind a reverse proxy every client is the proxy's address, so one person's
typos delay everyone's login for a while: the price of not trusting ``X-Forwarded-For``, which
any client can write.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FIRST_WAIT_S", "FREE_FAILURES", "MAX_CLIENTS", "MAX_WAIT_S", "LoginThrottle"]

FREE_FAILURES = 5  # typos and a stale password manager entry, not a guessing run
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 300.0  # five minutes: 288 guesses a day per address once at the cap
MAX_CLIENTS = 4096


@dataclass
class _Record:
    failures: int
    until: float  # monotonic time before which the next try is refused


class LoginThrottle:
    """Failed logins per client address, and how long each must wait (``clock``: monotonic seconds)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, free: int = FREE_FAILURES,
                 first_wait_s: float = FIRST_WAIT_S, max_wait_s: float = MAX_WAIT_S,
                 max_clients: int = MAX_CLIENTS) -> None:
        self._clock = clock
        self._free = free
        self._first = first_wait_s
        self._max_wait = max_wait_s
        self._max_clients = max_clients
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must still wait before its next try is checked (0: try now)."""
        record = self._records.get(client)
        if record is None:
            return 0.0
        now = self._clock()
        if record.until + 2 * self._max_wait <= now:  # quiet for long: start afresh
            del self._records[client]
            return 0.0
        return max(0.0, record.until - now)

    def failed(self, client: str) -> float:
        """Count a wrong token from ``client``; returns the wait before its next try (0 while free)."""
        record = self._records.pop(client, None) or _Record(0, 0.0)
        record.failures += 1
        over = record.failures - self._free
        wait = 0.0 if over <= 0 else min(self._max_wait, self._first * 2 ** min(over - 1, 30))
        record.until = self._clock() + wait
        self._records[client] = record  # most recent last
        while len(self._records) > self._max_clients:
            self._records.popitem(last=False)
        return wait

    def succeeded(self, client: str) -> None:
        """A right token: ``client`` starts afresh."""
        self._records.pop(client, None)

    def __len__(self) -> int:
        return len(self._records)
