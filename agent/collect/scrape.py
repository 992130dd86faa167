"""Scraping vLLM/LMDeploy ``/metrics`` targets into the store, one target never delaying another.

A scrape cycle starts every target's scrape through ``concurrency`` slots (0: all at once), the
slowest of the last cycle first, and each has its own timeout. Targets whose last scrape failed take
their slots from a second pool of the same size, so targets that hang until the timeout never hold
the slots of those that answer: a hung or slow target costs the others nothing. Per target the
scraper keeps what Prometheus keeps:

* a **series cache**: the series text as written (``name{labels}``) -> the store's
  series. A steady-state scrape parses no labels at all: one dict lookup and one
  array append per kept sample. Labels are parsed and validated only for new text.
* **staleness**: a series present in the previous scrape and absent now gets the
  staleness marker; a failed scrape or a removed target marks all its series stale.
* **atomic scrapes**: a payload is parsed completely before anything is written, so
  a truncated or malformed body stores nothing and marks the target down with the
  parser's error (line number included).
* **isolation**: any exception while scraping, parsing or storing one target, foreseen
  (:class:`ScrapeError`) or not (a bug), marks only that target down with the cause as
  ``last_error`` and writes ``up`` 0; the cycle and the other targets go on.
* **timestamp bounds**: a sample whose own timestamp is more than :data:`MAX_AHEAD_MS`
  after the scrape, or older than the store's retention, is dropped alone ("out of bounds",
  as Prometheus does); the target stays up and ``last_error`` says what was dropped. A
  timestamp that is not an int64 fails the scrape, as Prometheus' parser does.
* **limits** (Prometheus' ``sample_limit``, ``label_limit``, ``label_name_length_limit``,
  ``label_value_length_limit``, with its messages, plus ``new_series_limit``: series new to
  the store per scrape): over one, the scrape fails and nothing of it is stored. When the
  store is full (``store.max_series``) a new series is refused alone and the target says so.
* the synthetic series ``up``, ``scrape_duration_seconds``, ``scrape_samples_scraped``
  and ``scrape_body_size_bytes`` with the target's ``job``/``instance`` labels.

We ask for ``text/plain; version=0.0.4`` (DESIGN.md decision 4: with OpenMetrics,
recent prometheus_client rewrites ``vllm:`` names) and accept OpenMetrics if a target
sends it anyway.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from agent import __version__
from agent.collect.discovery import TargetSpec
from agent.collect.exposition import OPENMETRICS_MEDIA_TYPE, Scanner
from agent.errors import ExpositionError, ScrapeError
from agent.series import METRIC_NAME, STALE_NAN, Labels
from agent.store import AppendResult, Series, Store

__all__ = ["ACCEPT_HEADER", "Scraper", "Target"]

log = structlog.get_logger(__name__)

#: Prometheus' own Accept header when OpenMetrics is disabled.
ACCEPT_HEADER = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_CHUNK = 1 << 16
#: The series a scrape writes for each target itself, besides what the target served.
_SYNTHETIC = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_body_size_bytes")
_MAX_TS_MS, _MIN_TS_MS = 2**63 - 1, -(2**63)  # what the store's int64 timestamps hold
#: How far after the scrape time a sample's own timestamp may be. Prometheus 2.42's scrape loop
#: appends through a time-limit appender with ``maxAheadTime = 10 * time.Minute`` and drops later
#: samples as "out of bounds" (checked against the real 2.42 binary: +9m stored, +1h and +30d
#: dropped, the target stays up). A clock that far ahead is wrong, and such a sample would sit at
#: the end of its series and reject every later sample as out of order.
MAX_AHEAD_MS = 10 * 60_000


@dataclass
class Target:
    """One target's identity, health and series cache."""

    spec: TargetSpec
    health: str = "unknown"  # "up" | "down" | "unknown" (never scraped)
    last_error: str = ""
    last_scrape_ms: int = 0
    duration_s: float = 0.0
    samples: int = 0  # samples in the last payload, kept or not
    stored: int = 0  # samples written to the store by the last scrape
    body_bytes: int = 0
    scrapes: int = 0
    failures: int = 0
    out_of_bounds: int = 0  # samples of the last scrape dropped for their timestamp
    refused_series: int = 0  # new series of the last scrape the full store refused
    # series text -> [series, iteration last seen]
    cache: dict[str, list[Any]] = field(default_factory=dict, repr=False)
    iteration: int = 0

    @property
    def url(self) -> str:
        return self.spec.url

    def as_json(self) -> dict[str, Any]:
        """The object ``/api/v1/targets`` and ``run --once`` return per target."""
        return {
            "url": self.url,
            "job": self.spec.job,
            "instance": self.spec.instance,
            "labels": dict(self.spec.labels),
            "health": self.health,
            "last_error": self.last_error,
            "last_scrape": self.last_scrape_ms / 1000 if self.last_scrape_ms else None,
            "duration_seconds": round(self.duration_s, 6),
            "samples": self.samples,
            "stored_samples": self.stored,
            "body_bytes": self.body_bytes,
            "series": len(self.cache),
            "out_of_bounds_samples": self.out_of_bounds,
            "refused_series": self.refused_series,
        }


class Scraper:
    """Owns the targets and the HTTP session; call :meth:`scrape_all` each interval."""

    def __init__(
        self,
        store: Store,
        *,
        timeout_s: float,
        body_limit: int,
        concurrency: int,
        sample_limit: int = 0,
        label_limit: int = 0,
        label_name_length_limit: int = 0,
        label_value_length_limit: int = 0,
        new_series_limit: int = 0,
        clock: Callable[[], float] = time.time,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.body_limit = body_limit
        self.sample_limit = sample_limit
        self.limits = _LabelLimits(label_limit, label_name_length_limit, label_value_length_limit)
        self.new_series_limit = new_series_limit
        self._clock = clock
        self._session = session
        self._own_session = session is None
        # Two pools: targets that answered last time, and those that failed (they may hang for the whole
        # timeout). 0: no cap (every target at once); a nullcontext keeps one code path in scrape().
        self._pools: tuple[asyncio.Semaphore | contextlib.nullcontext[None], ...] = tuple(
            asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext() for _ in range(2))
        self._concurrency = concurrency
        self.targets: dict[str, Target] = {}
        #: Told every sample a scrape stored (staleness markers and ``up``/``scrape_*`` too), one call per
        #: target scrape: remote write's ``scraped`` feed. None (the default) collects nothing.
        self.observer: Callable[[list[tuple[Labels, float, int]]], None] | None = None

    # -- lifecycle ---------------------------------------------------------------
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=2 * self._concurrency, ttl_dns_cache=300)  # 0: no limit
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"User-Agent": f"sre-agent/{__version__}"},
                auto_decompress=True,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    # -- targets -----------------------------------------------------------------
    def set_targets(self, specs: Iterable[TargetSpec]) -> None:
        """Replace the target set; removed targets get staleness markers."""
        wanted = {s.url: s for s in specs}
        now = self._now_ms()
        for url in list(self.targets):
            old = self.targets[url]
            if url not in wanted or wanted[url] != old.spec:
                self._mark_stale(old, now, synthetic=True)
                del self.targets[url]
                log.info("target removed", target=url)
        for url, spec in wanted.items():
            if url not in self.targets:
                self.targets[url] = Target(spec)
                log.info("target added", target=url, job=spec.job, source=spec.source)

    # -- scraping ----------------------------------------------------------------
    async def scrape_all(self) -> None:
        # scrape() never raises; return_exceptions is the second guard, so that even a failure in
        # recording a failure (the store itself broken) ends that target's scrape, not the cycle.
        # The slowest first (by their last scrape): under the concurrency cap, slow targets then wait it
        # out together from the start of the cycle, beside the fast ones, instead of taking slots late and
        # stretching the cycle each time they come round. (The ones that hang failed last time: their
        # slots are not the others'.)
        targets = sorted(self.targets.values(), key=lambda t: t.duration_s, reverse=True)
        results = await asyncio.gather(*(self.scrape(t) for t in targets), return_exceptions=True)
        for target, result in zip(targets, results, strict=True):
            if isinstance(result, Exception):
                log.error("scrape bookkeeping failed", target=target.url, error=f"{type(result).__name__}: {result}")
            elif isinstance(result, BaseException):  # CancelledError, KeyboardInterrupt: not ours to swallow
                raise result

    async def scrape(self, target: Target) -> None:
        """Scrape one target; never raises (errors become the target's ``last_error``)."""
        async with self._pools[target.health == "down"]:
            start_ms = self._now_ms()
            t0 = time.perf_counter()
            body_bytes = 0
            try:
                text, openmetrics, body_bytes = await self._fetch(target)
                parsed = self._parse(target, text, openmetrics, start_ms)
                self._commit(target, parsed, start_ms, time.perf_counter() - t0, body_bytes)
            except ScrapeError as exc:
                self._record_failure(target, start_ms, time.perf_counter() - t0, str(exc), body_bytes)
            except Exception as exc:  # a bug for one target must not cost the others
                # Not a failure we foresaw (a parser or store bug, a payload that trips one): the
                # traceback goes to the log for a bug report; the target is down with the cause.
                log.exception("scrape failed unexpectedly", target=target.url, job=target.spec.job)
                error = f"internal error while scraping: {type(exc).__name__}: {exc}"
                self._record_failure(target, start_ms, time.perf_counter() - t0, error, body_bytes)

    def ingest(self, target: Target, text: str, now_ms: int, *, openmetrics: bool = False) -> None:
        """Parse and store one payload for ``target`` exactly as a scrape does after its
        HTTP fetch (used by benchmarks and tests; raises :class:`ScrapeError`)."""
        self._commit(target, self._parse(target, text, openmetrics, now_ms), now_ms, 0.0, len(text))

    async def _fetch(self, target: Target) -> tuple[str, bool, int]:
        headers = {
            "Accept": ACCEPT_HEADER,
            "Accept-Encoding": "gzip",
            "X-Prometheus-Scrape-Timeout-Seconds": f"{self.timeout_s:g}",
        }
        spec = target.spec
        if spec.bearer_token is not None:
            headers["Authorization"] = f"Bearer {spec.bearer_token.get_secret_value()}"
        elif spec.basic_auth is not None:
            pair = f"{spec.basic_auth.username}:{spec.basic_auth.password.get_secret_value()}"  # Go's SetBasicAuth
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._http().get(target.url, headers=headers, allow_redirects=True) as resp:
                    if resp.status != 200:
                        raise ScrapeError(f"server returned HTTP status {resp.status} {resp.reason or ''}".strip())
                    ctype = resp.headers.get("Content-Type", "")
                    openmetrics = _check_content_type(ctype)
                    if resp.content_length is not None and resp.content_length > self.body_limit:
                        raise ScrapeError(self._too_big(resp.content_length))
                    chunks, size = [], 0
                    async for chunk in resp.content.iter_chunked(_CHUNK):
                        size += len(chunk)
                        if size > self.body_limit:
                            raise ScrapeError(self._too_big(size, at_least=True))
                        chunks.append(chunk)
        except TimeoutError as exc:
            raise ScrapeError(f"scrape timed out after {self.timeout_s:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise ScrapeError(f"connection failed: {exc.os_error.strerror or exc}") from exc
        except aiohttp.ClientError as exc:
            raise ScrapeError(f"HTTP error: {type(exc).__name__}: {exc}") from exc
        body = b"".join(chunks)
        try:
            return body.decode("utf-8"), openmetrics, size
        except UnicodeDecodeError as exc:
            raise ScrapeError(f"body is not valid UTF-8 at byte {exc.start}") from exc

    def _too_big(self, size: int, at_least: bool = False) -> str:
        more = "more than " if at_least else ""
        return f"body of {more}{size} bytes exceeds the limit of {self.body_limit} bytes (scrape.body_limit)"

    def _parse(self, target: Target, text: str, openmetrics: bool, now_ms: int) -> _Parsed:
        """Parse the whole payload before writing anything (atomic scrape)."""
        scanner = Scanner(self.store.keep, openmetrics=openmetrics)
        cache = target.cache
        rows: list[tuple[list[Any], float, int | None]] = []
        new: dict[str, list[Any]] = {}
        # Prometheus' bounds: at most MAX_AHEAD_MS after the scrape, not older than what the store
        # keeps (its TSDB refuses samples before the head's minimum valid time the same way).
        lo, hi = now_ms - self.store.retention_ms, now_ms + MAX_AHEAD_MS
        refused: list[tuple[str, int]] = []
        limits, store, new_series = self.limits, self.store, 0
        new_limit = self.new_series_limit or float("inf")
        try:
            for key, value, ts in scanner.scan(text):
                if ts is not None and not lo <= ts <= hi:
                    if not _MIN_TS_MS <= ts <= _MAX_TS_MS:  # not an int64: Prometheus' parser fails the scrape
                        raise ScrapeError(f"sample timestamp out of range: {key} at {ts} ms")
                    refused.append((key, ts))  # dropped alone, like Prometheus' ErrOutOfBounds
                    continue
                entry = cache.get(key) or new.get(key)
                if entry is None:  # only here, for text this target's cache has not seen: the slow path
                    name, labels = scanner.labels_of(key)
                    full = _target_labels(target.spec.labels, name, labels)
                    if limits:
                        limits.check(name, full)
                    if not store.has(name, full):
                        new_series += 1
                        if new_series > new_limit:  # stop here: the rest would cost memory and CPU for nothing
                            raise ScrapeError(f"new series limit exceeded: more than {new_limit} series new to "
                                              "the store in one scrape (scrape.new_series_limit)")
                    entry = new[key] = [full, -1]
                rows.append((entry, value, ts))
        except ExpositionError as exc:
            raise ScrapeError(f"invalid exposition format: {exc}") from exc
        if self.sample_limit and len(rows) > self.sample_limit:
            raise ScrapeError(f"sample limit exceeded: {len(rows)} > {self.sample_limit} (scrape.sample_limit)")
        return _Parsed(rows, new, scanner.samples_total, refused)

    def _commit(self, target: Target, parsed: _Parsed, now_ms: int, duration: float, body_bytes: int) -> None:
        store, cache = self.store, target.cache
        full = 0
        for key, entry in parsed.new.items():
            series = store.try_series(entry[0])  # labels -> the store's series, created once
            if series is None:  # the store holds store.max_series already: this new series is refused
                full += 1
                entry[0] = None
                continue
            entry[0] = series
            cache[key] = entry
        target.iteration += 1
        it = target.iteration
        rows = [r for r in parsed.rows if r[0][0] is not None] if full else parsed.rows
        observed: list[tuple[Labels, float, int]] | None = None
        if self.observer is None:
            for entry, value, ts in rows:
                entry[1] = it
                series, t = entry[0], now_ms if ts is None else ts
                stamps = series.ts
                if stamps and t <= stamps[-1]:  # the rare case: let Series apply the TSDB rules
                    store.note_rejected(series.append(t, value))
                else:  # the hot path, Series.append inlined
                    stamps.append(t)
                    series.vals.append(value)
        else:
            observed = self._append_observed(rows, it, now_ms)
        for key in [k for k, e in cache.items() if e[1] != it]:  # gone since the last scrape
            series = cache.pop(key)[0]
            if series.mark_stale(now_ms) and observed is not None:
                observed.append((series.labels, STALE_NAN, series.ts[-1]))
        target.health, target.last_error = "up", ""
        target.samples, target.stored = parsed.samples_total, len(rows)
        target.out_of_bounds, target.refused_series = len(parsed.refused), full
        notes = []
        if parsed.refused:  # the target stays up, as in Prometheus; last_error says what was dropped
            key, ts = parsed.refused[0]
            notes.append(
                f"{len(parsed.refused)} sample(s) out of bounds (timestamp more than "
                f"{MAX_AHEAD_MS // 60_000}m after the scrape or older than the store's retention), "
                f"dropped; first: {key} at {ts} ms, scrape at {now_ms} ms"
            )
            log.warning("Error on ingesting samples that are too old or are too far into the future",
                        target=target.url, job=target.spec.job, num_dropped=len(parsed.refused))
        if full:
            notes.append(f"{full} new series refused: the store holds store.max_series={store.max_series} series")
            log.warning("new series refused: the store is full", target=target.url, job=target.spec.job,
                        refused=full, max_series=store.max_series)
        target.last_error = "; ".join(notes)
        self._finish(target, now_ms, duration, body_bytes, up=1.0, observed=observed)

    def _append_observed(self, rows: list[tuple[list[Any], float, int | None]], it: int,
                         now_ms: int) -> list[tuple[Labels, float, int]]:
        """:meth:`_commit`'s appends when an observer listens: the same, plus the list of what was appended
        (a sample the store refuses, or a repeat of the last one, is not passed on: the remote would refuse
        the whole request over it)."""
        store, out = self.store, []
        for entry, value, ts in rows:
            entry[1] = it
            series, t = entry[0], now_ms if ts is None else ts
            stamps = series.ts
            if stamps and t <= stamps[-1]:
                store.note_rejected(series.append(t, value))
            else:
                stamps.append(t)
                series.vals.append(value)
                out.append((series.labels, value, t))
        return out

    def _record_failure(self, target: Target, now_ms: int, duration: float, error: str, body_bytes: int) -> None:
        if target.last_error != error or target.health != "down":
            log.warning("scrape failed", target=target.url, job=target.spec.job, error=error)
        observed = self._mark_stale(target, now_ms, synthetic=False)
        target.health, target.last_error = "down", error
        target.failures += 1
        target.samples = target.stored = target.out_of_bounds = target.refused_series = 0
        self._finish(target, now_ms, duration, body_bytes, up=0.0, observed=observed)

    def _finish(self, target: Target, now_ms: int, duration: float, body_bytes: int, up: float, *,
                observed: list[tuple[Labels, float, int]] | None = None) -> None:
        target.scrapes += 1
        target.last_scrape_ms, target.duration_s, target.body_bytes = now_ms, duration, body_bytes
        for name, value in (  # up last: if writing this scrape fails half-way, up=1 was not written (_SYNTHETIC)
            ("scrape_duration_seconds", duration),
            ("scrape_samples_scraped", float(target.samples)),
            ("scrape_body_size_bytes", float(body_bytes)),
            ("up", up),
        ):
            series = self._synthetic(target, name)
            if series.append(now_ms, value) is AppendResult.OK and observed is not None:
                observed.append((series.labels, value, now_ms))
        if observed and self.observer is not None:
            self.observer(observed)

    def _synthetic(self, target: Target, name: str) -> Series:
        # the target's labels are sorted already: cheaper than labels_from(), 4 times per target per scrape
        return self.store.series(tuple(sorted((*target.spec.labels, (METRIC_NAME, name)))))

    def _mark_stale(self, target: Target, now_ms: int, *, synthetic: bool) -> list[tuple[Labels, float, int]] | None:
        """Staleness markers for every series of the target; the markers written, if an observer listens."""
        observed: list[tuple[Labels, float, int]] | None = None if self.observer is None else []
        series = [entry[0] for entry in target.cache.values()]
        target.cache.clear()
        if synthetic:
            series += [self._synthetic(target, name) for name in _SYNTHETIC]
        for s in series:
            if s.mark_stale(now_ms) and observed is not None:
                observed.append((s.labels, STALE_NAN, s.ts[-1]))
        if synthetic and observed and self.observer is not None:  # a removed target: no _finish follows
            self.observer(observed)
        return observed

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def targets_json(self) -> list[dict[str, Any]]:
        return [t.as_json() for t in self.targets.values()]


@dataclass(slots=True)
class _Parsed:
    rows: list[tuple[list[Any], float, int | None]]
    new: dict[str, list[Any]]
    samples_total: int
    refused: list[tuple[str, int]]  # (series text, timestamp) of samples dropped as out of bounds


@dataclass(frozen=True, slots=True)
class _LabelLimits:
    """Prometheus' label limits (``verifyLabelLimits`` in scrape/scrape.go), checked on the full label
    set (``__name__`` and target labels included) of each series new to the target's cache; lengths
    in bytes, as Go's ``len``. 0 = unlimited."""

    count: int
    name_length: int
    value_length: int

    def __bool__(self) -> bool:
        return bool(self.count or self.name_length or self.value_length)

    def check(self, metric: str, labels: Labels) -> None:
        if self.count and len(labels) > self.count:
            raise ScrapeError(f"label_limit exceeded (metric: {metric[:50]}, number of labels: {len(labels)}, "
                              f"limit: {self.count})")
        for name, value in labels:
            if self.name_length and (n := len(name.encode())) > self.name_length:
                raise ScrapeError(f"label_name_length_limit exceeded (metric: {metric[:50]}, label name: "
                                  f"{name[:50]}, length: {n}, limit: {self.name_length})")
            if self.value_length and (n := len(value.encode())) > self.value_length:
                raise ScrapeError(f"label_value_length_limit exceeded (metric: {metric[:50]}, label name: "
                                  f"{name[:50]}, value: {_go_quote(value[:50])}, length: {n}, "
                                  f"limit: {self.value_length})")


def _go_quote(text: str) -> str:
    """Go's ``%q`` for the printable text a label value usually is (backslash, quote and control escapes)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def _check_content_type(ctype: str) -> bool:
    """True for OpenMetrics, False for the text format; anything else is an error."""
    media = ctype.split(";", 1)[0].strip().lower()  # as content_type_is_openmetrics() reads it
    if media == OPENMETRICS_MEDIA_TYPE:
        return True
    if media in ("", "text/plain"):
        return False
    raise ScrapeError(
        f"unexpected Content-Type {ctype!r}: expected text/plain (Prometheus text format) or "
        "application/openmetrics-text; is this URL really a /metrics endpoint?"
    )


def _target_labels(target: Labels, name: str, scraped: dict[str, str]) -> Labels:
    """Attach target labels; a scraped label that clashes becomes ``exported_<name>``
    (Prometheus' ``honor_labels: false``). Empty label values are dropped."""
    out = {k: v for k, v in scraped.items() if v != ""}
    for k, v in target:
        if k in out:
            out[f"exported_{k}"] = out.pop(k)
        out[k] = v
    out[METRIC_NAME] = name
    return tuple(sorted(out.items()))
