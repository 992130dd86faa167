"""Connection limits for the HTTP endpoint: a head deadline, a connection cap, quiet accept errors.

Why this exists: aiohttp's server has a keep-alive timeout and caps on line and header sizes, but
no deadline for *receiving* a request head. A client that sends ``GET /he`` and stops holds its
socket (one file descriptor) until the keep-alive timer fires, and nothing bounds how many such
sockets there are. A few hundred of them take the descriptors the scraper needs (``ulimit -n`` is
often 1024, and ``scrape.concurrency`` connections come out of the same budget) and stop
``/healthz`` from being accepted at all.

The approach, chosen as the least invasive one that is robust: aiohttp's ``web.Server`` is an
asyncio protocol factory; :class:`ConnectionGuard` wraps each protocol it makes in a thin
:class:`asyncio.Protocol` proxy that forwards every callback unchanged and adds a state per
connection, ``head`` (bytes of a request head may be arriving), ``body`` (a handler waits for the
request body), ``busy`` (a handler runs) or ``idle`` (between keep-alive requests). A middleware
(:func:`guard_middleware`) marks a request ``busy`` when aiohttp has parsed its head and ``idle``
when the handler is done; the first byte on an ``idle`` connection makes it ``head`` again. So no
aiohttp internals are touched:

* **head deadline**: entering ``head`` arms a timer (``server.header_timeout``, 10 s); if no
  complete head has reached a handler by then, the connection is answered ``408`` and closed.
* **connection cap**: at ``server.max_connections`` (256) a new connection first closes the
  oldest one still sending its head, else the oldest still sending a body, else the oldest idle
  keep-alive one (or one whose client is slow to read its response); only if all are busy is
  the newcomer turned away (``503``). An attacker's half-sent requests therefore age out in
  favour of fresh ones (a probe's). The process holds at most the cap plus two accept batches
  (asyncio accepts up to the listen backlog, 64, before any protocol runs, and an evicted
  socket's descriptor is freed one loop turn later): 256 + 2 x 64 + the scraper's 2 x 256 (a pool
  for the targets that answered, one for those that failed) + 64 for the state database, logs and
  sinks = 960 (with ``scrape.concurrency: 0``, one per target instead of 512). The daemon raises
  its soft ``ulimit -n`` to the hard limit at start and warns (also in ``/api/v1/status``) when
  that is still lower than the sum.
* **accept errors**: should the process still run out of descriptors, asyncio reports every
  failed ``accept()`` (EMFILE) through the loop's exception handler with a traceback, once a
  second. :class:`AcceptErrorLog` turns that into one warning per minute with a count.

TLS handshakes happen before the proxy sees a connection; they are bounded by asyncio's
``ssl_handshake_timeout``, which :func:`agent.app.listener.serve` sets to the head deadline.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import structlog
from aiohttp import web

__all__ = ["AcceptErrorLog", "ConnectionGuard", "guard_middleware", "raise_open_file_limit"]

log = structlog.get_logger(__name__)

State = Literal["head", "body", "busy", "idle"]
_ACCEPT_MESSAGE = "socket.accept() out of system resource"  # asyncio's selector_events wording
_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_FULL_RESPONSE = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class _GuardedProtocol(asyncio.Protocol):
    """Forwards every protocol callback to aiohttp's handler; keeps the connection's state and timer."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self.transport: asyncio.Transport | None = None
        self.state: State = "head"
        self.rejected = False
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._guard._admit(self):
            self.rejected = True
            transport.write(_FULL_RESPONSE)
            transport.close()
            return
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.rejected:
            return
        if self.state == "idle":  # a keep-alive connection starts its next request
            self.state = "head"
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.rejected else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._guard._forget(self)
        if not self.rejected:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.rejected:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.rejected:
            self._inner.resume_writing()

    # -- state ------------------------------------------------------------------------------------
    def started(self) -> None:
        self.state = "busy"
        self._disarm()

    def finished(self) -> None:
        self.state = "idle"

    def reading_body(self, reading: bool) -> None:
        if self.state in ("busy", "body"):
            self.state = "body" if reading else "busy"

    def close(self, reason: str, response: bytes | None = None) -> None:
        """Close this connection (``response`` first, if any) and count why."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._guard.closed[reason] += 1
        self._disarm()
        if response is not None:
            transport.write(response)
        transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(self._guard.header_timeout_s, self._head_expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_expired(self) -> None:
        self._timer = None
        if self.state == "head":
            self.close("header_timeout", _TIMEOUT_RESPONSE)


class ConnectionGuard:
    """Tracks the endpoint's connections: the head deadline and the cap (module docstring).

    ``closed`` counts connections the guard closed, by reason: ``header_timeout``, ``evicted``
    (made room for a newer one) and ``rejected`` (the cap was reached with every connection busy).
    """

    def __init__(self, *, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.closed: Counter[str] = Counter()
        self.accepted = 0
        self._conns: dict[_GuardedProtocol, None] = {}  # insertion order = age
        self._by_transport: dict[asyncio.BaseTransport, _GuardedProtocol] = {}

    @property
    def open(self) -> int:
        """Connections held now."""
        return len(self._conns)

    def states(self) -> Counter[str]:
        return Counter(c.state for c in self._conns)

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory to give ``loop.create_server``: ``inner`` (aiohttp's server) wrapped."""
        return lambda: _GuardedProtocol(self, inner())

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.started()

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.finished()

    def reading_body(self, transport: asyncio.BaseTransport | None, reading: bool) -> None:
        """A handler starts (``True``) or ends waiting for its request body: evictable meanwhile."""
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.reading_body(reading)

    def close_all(self) -> None:
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.abort()

    def _admit(self, conn: _GuardedProtocol) -> bool:
        self.accepted += 1
        if len(self._conns) >= self.max_connections:
            victim = self._oldest("head") or self._oldest("body") or self._oldest("idle")
            if victim is None:
                self.closed["rejected"] += 1
                return False
            victim.close("evicted")
            self._forget(victim)  # its connection_lost comes later; its slot is free now
        self._conns[conn] = None
        if conn.transport is not None:
            self._by_transport[conn.transport] = conn
        return True

    def _oldest(self, state: State) -> _GuardedProtocol | None:
        return next((c for c in self._conns if c.state == state), None)

    def _forget(self, conn: _GuardedProtocol) -> None:
        self._conns.pop(conn, None)
        if conn.transport is not None and self._by_transport.get(conn.transport) is conn:
            del self._by_transport[conn.transport]


def guard_middleware(guard: ConnectionGuard) -> Any:
    """Marks the request's connection ``busy`` while its handler runs (the head is complete)."""

    @web.middleware
    async def track(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        guard.request_started(request.transport)
        try:
            return await handler(request)
        finally:
            guard.request_finished(request.transport)

    return track


class AcceptErrorLog:
    """A loop exception handler that logs failed ``accept()`` calls (out of descriptors) at most once
    per ``interval_s``, with how many were folded in; everything else goes to the previous handler."""

    def __init__(self, *, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.errors = 0
        self._clock = clock
        self._last: float | None = None
        self._suppressed = 0
        self._previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def uninstall(self) -> None:
        if self._loop is not None and self._loop.get_exception_handler() is self:
            self._loop.set_exception_handler(self._previous)
        self._loop = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.errors += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._suppressed += 1
            return
        exc = context.get("exception")
        log.warning("cannot accept HTTP connections: out of file descriptors or memory; retrying",
                    error=str(exc) if exc is not None else "", similar_since_last=self._suppressed)
        self._last = now
        self._suppressed = 0


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as Go programs (Prometheus, vmagent) do at
    start: the soft limit is often 1,024 while the hard one is far higher, and the scraper's
    connections (2 x ``scrape.concurrency``, or one per target with 0) come out of it. Returns the soft
    limit (before, after); unchanged where the system refuses (the start-up warning then says what
    is short)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if resource.RLIM_INFINITY in (hard, soft) or soft >= hard:
        return soft, soft  # nothing to gain (an infinite hard limit: leave the soft one, as Go does)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard
