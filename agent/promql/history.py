"""Range queries on the rule source, for diagnostics and triage reports in Prometheus mode.

In Prometheus mode the agent's store holds only its own series, so a diagnosis that needs a
GPU's memory over the last 15 minutes (the OOM context) or a report's plot asks the server
instead: a synchronous ``GET /api/v1/query_range`` now and then, run in a worker thread so it
never blocks the event loop, with the source's credentials, TLS settings and timeout.

Why requests directly and not prometheus-api-client (which this module used first): its
``custom_query_range`` keeps only ``data.result`` (so a wrong ``resultType`` cannot be seen),
turns a body without ``data`` into a ``KeyError``, retries three times with back-off inside one
call and reads the body with a per-read timeout only, so a server that trickles its answer a
byte a second held a worker thread for minutes. Here every query has a **total deadline**
(:func:`~agent.promql.answer.deadline_s` of ``source.timeout``, or the caller's, the earlier
wins), checked between reads with the socket's timeout shortened to what is left, a **size cap**
(:data:`~agent.promql.answer.MAX_ANSWER_BYTES`), no retry, and the answer is checked by
:func:`~agent.promql.answer.parse_range_response`, the validator the instant path shares. Every
failure is a :class:`~agent.errors.SourceError` that says what went wrong.

What the deadline does not cover: a server that trickles its *headers* (http.client reads them
before this module sees the response); each of those reads is still bounded by the timeout.

The rule evaluation hot path does not use this module (see :mod:`agent.promql.remote`).
"""

from __future__ import annotations

import time
from typing import Any

import requests
import urllib3

from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.promql.answer import MAX_ANSWER_BYTES, RangeSeries, deadline_s, decode, parse_range_response
from agent.series import labels_from
from agent.store import Store

__all__ = ["RemoteHistory"]

_RETENTION_MS = 24 * 3600 * 1000  # the scratch store keeps whatever range was asked for
_CHUNK = 64 * 1024


class RemoteHistory:
    """Range queries against ``config.url``; every method is blocking (call it in a thread) and
    safe to call from several threads at once (one requests session, a pool of connections)."""

    def __init__(self, config: SourceConfig, *, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        if config.url is None:
            raise SourceError("a remote source needs a URL")
        session = requests.Session()
        tls = config.tls
        session.verify = False if tls.insecure_skip_verify else (tls.ca_file or True)
        if tls.cert_file is not None and tls.key_file is not None:
            session.cert = (tls.cert_file, tls.key_file)
        # identity: the size cap counts what arrives, and no compressed trickle can decode to nothing for ever
        session.headers.update({**config.headers, "Accept": "application/json", "Accept-Encoding": "identity"})
        if config.bearer_token is not None:
            session.headers["Authorization"] = f"Bearer {config.bearer_token.get_secret_value()}"
        elif config.basic_auth is not None:
            session.auth = (config.basic_auth.username, config.basic_auth.password.get_secret_value())
        self.url = config.url
        #: seconds one query may take, first byte sent to last byte read
        self.deadline_s = deadline_s(config.timeout)
        self._session = session
        self._max_bytes = max_bytes

    def query_range(self, expr: str, start_ms: int, end_ms: int, *, step_s: float = 15.0,
                    deadline: float | None = None) -> list[RangeSeries]:
        """One range query: each series' labels, times (ms) and values, as the server answered.

        ``deadline`` is a :func:`time.monotonic` time the answer must be complete by (a report's
        own budget); the query's :attr:`deadline_s` applies as well, the earlier wins.
        :class:`SourceError` when the server does not answer in time, answers too much, refuses
        the query, or answers something that is not a matrix (the triage report then draws that
        plot empty and says why)."""
        now = time.monotonic()
        end = now + self.deadline_s if deadline is None else min(deadline, now + self.deadline_s)
        params = {"query": expr, "start": f"{start_ms / 1000:.3f}", "end": f"{end_ms / 1000:.3f}",
                  "step": f"{step_s:g}", "timeout": f"{max(1, int((end - now) * 1000))}ms"}  # a Go duration
        url = f"{self.url}/api/v1/query_range"
        try:
            status, raw = self._get(url, params, end)
        except SourceError as exc:
            raise SourceError(f"range query {expr[:200]!r} failed: {exc}") from exc
        try:
            series, _warnings, _partial = parse_range_response(decode(raw))
        except SourceError as exc:
            raise SourceError(f"range query {expr[:200]!r} failed: {url}: HTTP {status}: {exc}") from exc
        if status >= 400:  # a success body with an error status: believe the status
            raise SourceError(f"range query {expr[:200]!r} failed: {url}: HTTP {status}")
        return series

    def _get(self, url: str, params: dict[str, str], end: float) -> tuple[int, bytes]:
        """``(status, body)`` of one GET, complete by ``end`` (monotonic) and at most ``max_bytes``."""
        left = end - time.monotonic()
        if left <= 0:
            raise SourceError(f"{url}: no time left for the query (deadline passed before it was sent)")
        try:
            with self._session.get(url, params=params, stream=True, timeout=(left, left)) as resp:
                return resp.status_code, self._read(resp, url, end)
        except requests.Timeout as exc:
            raise SourceError(f"{url}: no answer within {self.deadline_s:g}s") from exc
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError(f"{url}: {exc.__class__.__name__}: {exc}") from exc

    def _read(self, resp: requests.Response, url: str, end: float) -> bytes:
        """The body, read a chunk at a time: a deadline checked between reads (each read's socket timeout
        is what is left), a size cap checked as it grows."""
        raw: Any = resp.raw
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        chunks: list[bytes] = []
        size = 0
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise SourceError(f"{url}: answer not complete within {self.deadline_s:g}s "
                                  f"({size} bytes had arrived)")
            if sock is not None:
                sock.settimeout(left)
            try:
                chunk: bytes = raw.read1(_CHUNK)
            except (TimeoutError, urllib3.exceptions.ReadTimeoutError) as exc:
                raise SourceError(f"{url}: answer not complete within {self.deadline_s:g}s "
                                  f"({size} bytes had arrived)") from exc
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self._max_bytes:
                raise SourceError(f"{url}: answer larger than {self._max_bytes} bytes; refused")
            chunks.append(chunk)

    def fetch(self, selectors: list[str], start_ms: int, end_ms: int, *, step_s: float = 15.0) -> Store:
        """Every series ``selectors`` select between ``start_ms`` and ``end_ms``, at ``step_s``, in a new store.

        :class:`SourceError` when the server does not answer or refuses a query; the caller
        diagnoses without the history then. A series without a metric name (an answer no selector
        gives) is skipped: the store holds named series only.
        """
        store = Store(_RETENTION_MS)
        for selector in selectors:
            for labels, ts, vs in self.query_range(selector, start_ms, end_ms, step_s=step_s):
                if not labels.get("__name__"):  # a selector's series has its name; the store keeps only named ones
                    continue
                key = labels_from(None, labels)
                for t, v in zip(ts, vs, strict=True):
                    store.append(key, t, v)
        return store
