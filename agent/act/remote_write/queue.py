"""One remote-write endpoint's queue: batches persisted in the state database, sent in order until acknowledged.

What goes in: the samples the daemon hands over after each rule evaluation (recording results,
``ALERTS``, ``ALERTS_FOR_STATE``; scraped samples where configured). :meth:`RemoteWriteQueue.enqueue`
encodes them (:mod:`~agent.act.remote_write.wire`) in batches of at most ``max_samples_per_send``
and writes them to the ``remote_write`` table, on the state database's writer thread: no encoding,
query or ``fsync`` on the event loop. Past ``queue.capacity`` pending samples the *oldest* batches are
dropped (the freshest alert state matters most; vmagent drops the same way) and counted in
``dropped["queue_full"]``.

What comes out: one sender task per remote takes the oldest batches that fit in one request (rows
joined: see the wire module), compresses them, and POSTs them. One request at a time, in queue order,
so each series' samples reach the remote in time order even across retries.

* **2xx**: the batches are deleted. Only then: a restart re-sends exactly what was not acknowledged.
  A crash between the 2xx and the delete re-sends that one request (at-least-once); Prometheus
  accepts an identical sample again silently, VictoriaMetrics with ``-dedup.minScrapeInterval``.
* **429, 5xx, timeouts, connection errors** (:func:`~agent.act.sinks.http.check_status`): the same
  request again after ``min_backoff``, doubling to ``max_backoff``, or the server's ``Retry-After``
  when longer (up to :data:`~agent.act.sinks.http.RETRY_AFTER_CAP_S`, the cap every sink shares). Retried
  forever: the capacity bounds what waits.
* **any other 4xx**: retrying cannot help (a sample too old, a malformed label): the batches are
  deleted, counted as failed, and the server's message is logged.

A state database failure (disk full) is logged and retried with the same backoff; acknowledged
batches whose delete failed are deleted before the next request is built, so they are never sent
twice while the process lives. Remote write is what the agent reports, not how it alerts: nothing
here can stop an evaluation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import structlog

from agent.act.remote_write.wire import CONTENT_HEADERS, Encoder, compress
from agent.act.sinks.http import RETRY_AFTER_CAP_S, check_status, user_agent
from agent.act.state import StateDB
from agent.config.remote_write import RemoteWriteConfig
from agent.errors import DeliveryError, StateError
from agent.series import Labels

__all__ = ["RETRY_AFTER_CAP_S", "RemoteWriteQueue", "RemoteWriteStats", "Sample"]

log = structlog.get_logger(__name__)

Sample = tuple[Labels, float, int]  # labels, value, timestamp in ms

#: How long :meth:`RemoteWriteQueue.stop` lets a request in flight finish (then it is sent again after a restart).
STOP_GRACE_S = 5.0
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass
class RemoteWriteStats:
    """One remote's counters for /metrics (samples, except ``sent_bytes``)."""

    sent: int = 0  # acknowledged with 2xx
    failed: int = 0  # refused with a 4xx other than 429: not retried
    retried: int = 0  # in requests that failed and will be sent again
    dropped: Counter[str] = field(default_factory=Counter)  # by reason: queue_full, invalid
    pending: int = 0  # in the state database, waiting
    sent_bytes: int = 0  # compressed request bodies acknowledged
    last_send_s: float = 0.0  # wall time of the last 2xx
    last_error: str = ""


class RemoteWriteQueue:
    """One ``remote_write`` entry: its persisted queue and its sender (see the module docstring).

    Build it on the event loop that runs it; :meth:`load` (start-up, on the writer thread) reads what
    an earlier process left pending, :meth:`start` starts the sender, :meth:`stop` ends it.
    """

    def __init__(self, config: RemoteWriteConfig, db: StateDB, *, external_labels: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.name = config.queue_name
        self.url = config.url
        self._db = db
        self._clock = clock
        self._encoder = Encoder({**(external_labels or {}), **config.external_labels})
        self.stats = RemoteWriteStats()
        self._stored = 0  # pending samples, as the writer thread counts them (only touched there)
        self._sending: frozenset[int] = frozenset()  # ids of the request being sent: never dropped (writer thread)
        self._acked: list[int] = []  # batch ids acknowledged whose delete failed (writer thread)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- the writer thread ---------------------------------------------------------------------------
    def load(self) -> int:
        """Pending samples an earlier process left (writer thread, or before the loop runs)."""
        self._stored = self._db.remote_write.pending().get(self.name, 0)
        self.stats.pending = self._stored
        return self._stored

    def _append(self, samples: Sequence[Sample], now_ms: int) -> tuple[int, int, int]:
        """Encode and store; drop the oldest past capacity. ``(queued, dropped full, dropped invalid)``."""
        step, invalid = self.config.queue.max_samples_per_send, 0
        batches: list[tuple[int, bytes]] = []
        for i in range(0, len(samples), step):
            chunk = samples[i:i + step]
            try:
                batches.append((len(chunk), self._encoder.encode(chunk)))
            except (ValueError, TypeError) as exc:  # a label that is not UTF-8 (protobuf strings must be)
                invalid += len(chunk)
                log.warning("remote write: samples not encodable, dropped", remote=self.name, samples=len(chunk),
                            error=str(exc))
        if not batches:
            return 0, 0, invalid
        table = self._db.remote_write
        with self._db.transaction():
            queued = table.append(self.name, batches, now_ms=now_ms)
            over = self._stored + queued - self.config.queue.capacity
            full = table.drop_oldest(self.name, over, keep=self._sending) if over > 0 else 0
        self._stored += queued - full
        return queued, full, invalid

    def _take(self) -> tuple[list[int], int, bytes] | None:
        """The next request: ``(batch ids, samples, compressed body)``, or None when the queue is empty."""
        if self._acked:  # acknowledged before, their delete failed: never send them again
            self._stored -= self._db.remote_write.delete(self._acked)
            self._acked = []
        batches = self._db.remote_write.head(self.name, self.config.queue.max_samples_per_send)
        self._sending = frozenset(b.id for b in batches)
        if not batches:
            return None
        body = compress(b"".join(b.payload for b in batches))  # joined WriteRequests are one WriteRequest
        return [b.id for b in batches], sum(b.samples for b in batches), body

    def _delete(self, ids: list[int], *, acknowledged: bool) -> None:
        try:
            self._stored -= self._db.remote_write.delete(ids)
            self._sending = frozenset()
        except StateError:
            if acknowledged:
                self._acked.extend(ids)
            raise

    # -- the event loop --------------------------------------------------------------------------------
    async def enqueue(self, samples: Sequence[Sample], now_ms: int) -> None:
        """Queue ``samples`` (persisted before this returns); a state failure drops and counts them."""
        if not samples:
            return
        try:
            queued, full, invalid = await self._db.run(self._append, samples, now_ms)
        except StateError as exc:
            self.stats.dropped["state_error"] += len(samples)
            log.error("remote write: cannot queue samples, dropped", remote=self.name, samples=len(samples),
                      error=str(exc))
            return
        if full:
            self.stats.dropped["queue_full"] += full
            log.warning("remote write: queue full, oldest samples dropped", remote=self.name, dropped=full,
                        capacity=self.config.queue.capacity)
        if invalid:
            self.stats.dropped["invalid"] += invalid
        self.stats.pending = self._stored
        if queued:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._session = aiohttp.ClientSession(headers=self._headers(), connector=aiohttp.TCPConnector(
                ssl=self.config.tls.context() if self.url.startswith("https:") else False, limit=1))
            self._task = asyncio.create_task(self._run(), name=f"remote-write {self.name}")

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Let a request in flight finish (up to ``grace_s``), then end the sender; what is left stays queued."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except TimeoutError:
                log.info("remote write: request in flight at shutdown; it is sent again after a restart",
                         remote=self.name)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {**self.config.headers, **CONTENT_HEADERS, "User-Agent": user_agent()}
        if self.config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.config.bearer_token.get_secret_value()}"
        elif self.config.basic_auth is not None:
            ba = self.config.basic_auth
            pair = f"{ba.username}:{ba.password.get_secret_value()}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return headers

    async def _run(self) -> None:
        qc = self.config.queue
        backoff = qc.min_backoff
        while not self._stopping:
            self._wake.clear()
            try:
                took = await self._db.run(self._take)
            except StateError as exc:
                log.error("remote write: cannot read the queue", remote=self.name, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, qc.max_backoff)
                continue
            if took is None:
                self.stats.pending = self._stored
                await self._wake.wait()
                continue
            ids, samples, body = took
            self._idle.clear()
            try:
                delay = await self._send(ids, samples, body)
            finally:
                self._idle.set()
                self.stats.pending = self._stored
            if delay is None:
                backoff = qc.min_backoff
                continue
            delay, backoff = max(delay, backoff), min(backoff * 2, qc.max_backoff)
            await asyncio.sleep(delay)

    async def _send(self, ids: list[int], samples: int, body: bytes) -> float | None:
        """POST one request and settle it; None when done with it, else the seconds to wait before a retry."""
        try:
            await self._post(body)
        except DeliveryError as exc:
            if not exc.permanent:
                self.stats.retried += samples
                if self.stats.last_error != str(exc):
                    log.warning("remote write failed, retrying", remote=self.name, samples=samples, error=str(exc))
                self.stats.last_error = str(exc)
                return min(exc.retry_after_s or 0.0, RETRY_AFTER_CAP_S)
            self.stats.failed += samples
            self.stats.last_error = str(exc)
            log.error("remote write refused, samples dropped (not retried)", remote=self.name, samples=samples,
                      error=str(exc))
            return await self._settle(ids, acknowledged=False)
        self.stats.sent += samples
        self.stats.sent_bytes += len(body)
        self.stats.last_send_s = self._clock()
        if self.stats.last_error:
            log.info("remote write recovered", remote=self.name)
            self.stats.last_error = ""
        return await self._settle(ids, acknowledged=True)

    async def _settle(self, ids: list[int], *, acknowledged: bool) -> float | None:
        try:
            await self._db.run(self._delete, ids, acknowledged=acknowledged)
        except StateError as exc:
            log.error("remote write: cannot delete sent batches", remote=self.name, error=str(exc))
            return self.config.queue.max_backoff
        return None

    async def _post(self, body: bytes) -> None:
        assert self._session is not None, "start() first"
        timeout = self.config.timeout
        try:
            async with self._session.post(self.url, data=body, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.content.read(_ERROR_BODY_LIMIT)
                status, headers = resp.status, resp.headers
        except TimeoutError as exc:
            raise DeliveryError(f"{self.url}: no answer within {timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        check_status(status, raw.decode("utf-8", errors="replace"), headers, what=self.url, now=self._clock())
