"""The daemon's triage reports: built on demand for ``GET /incidents/{id}``, cached per incident version.

Where each step runs, so a report never stalls a scrape or ``/healthz``:

* the state database read on the state database's writer thread (:meth:`StateDB.run`);
* the series: in embedded mode range queries on the agent's own engine, *on the event loop*,
  because the store is written there and is single-threaded by design (one plot at a time, yielding
  between plots: each is about 240 instant evaluations of a few selectors); in Prometheus mode range
  queries on the source (:mod:`agent.promql.history`), in a worker thread of the reports' own pool,
  all of one report's queries within :data:`QUERY_BUDGET` times one query's deadline;
* the drawing (matplotlib: 0.3-0.6 s a plot on a loaded 2-core machine, measured) and the rendering
  in a worker thread of the same pool, one report drawn at a time (a lock: matplotlib's caches are shared).

The pool (:class:`~agent.app.workpool.WorkPool`) is not the loop's default executor, which scraping
needs, and admits a few reports at once: one more is refused with :class:`~agent.errors.BusyError`
(503 and ``Retry-After``), never queued; a report served from the cache needs no slot.

Cache: a rendered report is kept under (incident id, format, version), where the version is what
changes the report: the number of timeline events, the resolve time, the silences and outbox
items that touch it, and, while its plots still grow (open, or resolved under an hour ago), the minute. A resolved
incident's report is therefore drawn once. The cache holds the last :data:`CACHE_SIZE` renderings.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import structlog

from agent.act.state import StateDB
from agent.app.triage.facts import StateRead, facts, read_state
from agent.app.triage.render import render
from agent.app.triage.report import Report, assemble, draw_all
from agent.app.triage.series import PlotData, RangeQuery, fetch, local_query, plot_specs, remote_query, window
from agent.app.workpool import WorkPool
from agent.promql import Engine
from agent.promql.history import RemoteHistory
from agent.rules.files import GroupSpec

__all__ = ["CACHE_SIZE", "QUERY_BUDGET", "Reports"]

log = structlog.get_logger(__name__)

CACHE_SIZE = 32
#: A report's range queries together may take this many times one query's deadline (``source.timeout``):
#: six plots of a healthy server take a second; a server that does not answer costs one report that much.
QUERY_BUDGET = 2.0
_GROWS_MS = 3_600_000  # the plots run on past the resolve for up to an hour (agent.app.triage.series.window)


class Reports:
    """Triage reports of one agent: ``engine`` (embedded mode) or ``history`` (Prometheus mode) answers
    the plots' range queries; ``groups`` are the loaded rule files; ``pool`` the threads reports are built
    on (default: a pool of four of their own)."""

    def __init__(self, db: StateDB, groups: Callable[[], Iterable[GroupSpec]], *, engine: Engine | None = None,
                 history: RemoteHistory | None = None, clock: Callable[[], float] = time.time,
                 min_step_ms: int = 1000, pool: WorkPool | None = None) -> None:
        self._db = db
        self._groups = groups
        self._engine = engine
        self._history = history
        self._clock = clock
        self._min_step_ms = min_step_ms
        self.pool = pool if pool is not None else WorkPool("reports")
        self._cache: OrderedDict[tuple[int, str, str], str] = OrderedDict()
        self._draw_lock = threading.Lock()
        self.built = 0  # reports built (not served from the cache), for tests and logs

    @property
    def source(self) -> str:
        if self._history is not None:
            return f"the source {self._history.url} (range queries)"
        return "the agent's own store" if self._engine is not None else "nowhere (no store or source)"

    async def render(self, incident_id: int, fmt: str) -> str:
        """The report of incident ``incident_id`` in ``fmt``; NotFoundError when there is none, BusyError
        when the pool has no free slot to build it."""
        now_ms = int(self._clock() * 1000)
        state = await self._db.run(read_state, self._db, incident_id, now_ms=now_ms)
        key = (state.incident.id, fmt, _version(state, now_ms))
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        with self.pool.admit():
            text = await self._build(state, fmt, now_ms)
        self._cache[key] = text
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return text

    async def _build(self, state: StateRead, fmt: str, now_ms: int) -> str:
        t0 = time.perf_counter()
        f = facts(state, self._groups(), now_ms=now_ms)
        w = window(f, min_step_ms=self._min_step_ms)
        specs = plot_specs(f, w)
        plots: list[PlotData]
        if self._history is not None:
            deadline = time.monotonic() + QUERY_BUDGET * self._history.deadline_s
            query: RangeQuery = remote_query(self._history, deadline=deadline)
            plots = await self.pool.run(lambda: [fetch(s, w, query, f.labels) for s in specs])
        elif self._engine is not None:
            query, plots = local_query(self._engine), []
            for s in specs:  # on the loop (the store's thread), yielding between plots
                plots.append(fetch(s, w, query, f.labels))
                await asyncio.sleep(0)
        else:
            plots = [PlotData(s, errors=["no store or source to read series from"]) for s in specs]
        report = assemble(f, w, plots, self.source)
        text = await self.pool.run(self._draw_and_render, report, fmt)
        self.built += 1
        log.debug("triage report built", incident=state.incident.id, format=fmt,
                  seconds=round(time.perf_counter() - t0, 3))
        return text

    def _draw_and_render(self, report: Report, fmt: str) -> str:
        if fmt == "html":
            with self._draw_lock:
                report.images = draw_all(report)
        return render(report, fmt)


def _version(state: StateRead, now_ms: int) -> str:
    """What changes the report (see the module docstring)."""
    inc = state.incident
    parts = [str(len(inc.events)), str(inc.resolved_ms),
             ",".join(f"{s.id}:{s.starts_ms}:{s.ends_ms}" for s in state.silences),
             ",".join(f"{i.id}:{i.attempts}" for i in state.waiting)]
    if not inc.resolved_ms or now_ms - inc.resolved_ms < _GROWS_MS:
        parts.append(str(now_ms // 60_000))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
