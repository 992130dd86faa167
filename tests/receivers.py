"""Test helper: one local HTTP server that records every request and answers as the test says.

The HTTP sinks (webhook, Alertmanager, scale) and the end-to-end tests are checked
against a real server on 127.0.0.1, not a mocked client session, so what a test sees is
what went over the wire: method, path, headers and the exact body bytes. Every such
receiver in the suite is a :class:`RecordingServer`:

* what it answers: ``status`` (mutable while it runs; ``retry_after`` adds a
  ``Retry-After`` header to a 429), or a ``responder`` callable for anything else
  (:func:`reply` builds a fixed answer; a test writes its own to hang or to branch);
* what it records: one :class:`Recorded` per request, stamped by ``clock`` (wall time,
  or the test's fake clock) with the status it answered;
* ``stop()`` closes the port (the next request is refused) and ``start()`` reopens the
  same port, so a sink configured with :meth:`RecordingServer.url` sees a receiver go
  down and come back;
* ``ssl_context`` makes it HTTPS.

Use it as ``async with RecordingServer() as rec:`` or ``await RecordingServer().start()``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from multidict import CIMultiDict

__all__ = ["Recorded", "RecordingServer", "Responder", "free_port", "reply", "trickle"]

Responder = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (nothing listens there unless someone takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def reply(status: int = 200, *, text: str | None = None, json_body: Any = None,
          headers: Mapping[str, str] | None = None, content_type: str | None = None) -> Responder:
    """A responder giving every request the same answer (a fresh response each time, as aiohttp needs)."""
    async def respond(request: web.Request, body: bytes) -> web.StreamResponse:
        if json_body is not None:
            return web.json_response(json_body, status=status, headers=headers)
        return web.Response(status=status, text=text, headers=headers, content_type=content_type)
    return respond


@dataclass
class Recorded:
    """One request the server got, when (by the server's clock), and the status it answered (0 until answered)."""

    at: float
    method: str
    path: str
    headers: CIMultiDict[str]  # case-insensitive, as HTTP header names are
    body: bytes
    status: int = 0

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    @property
    def key(self) -> str:
        """The ``Idempotency-Key`` header ("" without one)."""
        return self.headers.get("Idempotency-Key", "")


class RecordingServer:
    """An aiohttp server on 127.0.0.1 that records every request (any method, any path) in ``requests``.

    Without a ``responder`` it answers ``status``: ``ok`` below 300, otherwise a short error
    text, with ``Retry-After: <retry_after>`` on a 429 when set. Both attributes may be
    changed while it runs.
    """

    def __init__(self, *, status: int = 200, retry_after: str | None = None, responder: Responder | None = None,
                 ssl_context: ssl.SSLContext | None = None, clock: Callable[[], float] = time.time) -> None:
        self.status = status
        self.retry_after = retry_after
        self.responder = responder
        self.ssl_context = ssl_context
        self.clock = clock
        self.requests: list[Recorded] = []
        self.port = 0  # picked by the first start(), then kept
        self._runner: web.AppRunner | None = None

    async def start(self) -> Self:
        """Listen: on a free port the first time, on the same port after a stop()."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context,
                          reuse_address=True).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        """Close the port: connections are refused until the next start(). The record is kept."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def url(self, path: str = "/hook") -> str:
        """The URL of ``path`` on this server (https with an ``ssl_context``)."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def posts(self, path: str | None = None) -> list[Recorded]:
        """POSTs (to ``path``, if given), oldest first."""
        return [r for r in self.requests if r.method == "POST" and path in (None, r.path)]

    def accepted(self, path: str | None = None) -> list[Recorded]:
        """POSTs (to ``path``, if given) answered 2xx, oldest first."""
        return [r for r in self.posts(path) if 200 <= r.status < 300]

    def refused(self, path: str | None = None) -> list[Recorded]:
        """POSTs (to ``path``, if given) answered with a status of 300 or more, oldest first."""
        return [r for r in self.posts(path) if r.status >= 300]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = Recorded(self.clock(), request.method, request.path, CIMultiDict(request.headers), body)
        self.requests.append(record)  # before answering: a responder that hangs is still seen
        response = await (self.responder or self._answer)(request, body)
        record.status = response.status
        return response

    async def _answer(self, request: web.Request, body: bytes) -> web.StreamResponse:
        status = self.status
        if status < 300:
            return web.Response(status=status, text="ok\n")
        headers = {"Retry-After": self.retry_after} if self.retry_after is not None and status == 429 else {}
        return web.Response(status=status, text="receiver unavailable (test fault)\n", headers=headers)


def trickle(body: bytes, *, per_second: int = 1) -> Responder:
    """A responder that sends its headers at once, then ``per_second`` bytes of ``body`` a second: a server
    whose every read is quick but whose answer takes minutes."""
    async def respond(request: web.Request, _: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(body)
        await resp.prepare(request)
        try:
            for i in range(0, len(body), per_second):
                await resp.write(body[i:i + per_second])
                await asyncio.sleep(1)  # the server's pace, which is what such a test is about
        except (ConnectionError, RuntimeError):
            pass  # the client gave up
        return resp
    return respond
