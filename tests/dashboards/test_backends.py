"""Every panel query of every dashboard returns data on a real Prometheus 2.42 and a real VictoriaMetrics.

One stack per module (:class:`tests.dashboards.stack.Stack`: the simulated fleets with their
GPUs, the agent, Prometheus, VictoriaMetrics with vmagent and vmalert) runs the scenarios;
the fixture polls every query of every dashboard on both backends, with Grafana's All for
each variable, until all of them return at least one sample with a number (not NaN) in one
round, or the deadline passes. A failure lists each dashboard, panel and query that came back
empty or with an error, per backend.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from tests.dashboards.queries import ALL_VALUES, dashboards, panel_queries, substitute
from tests.dashboards.stack import BACKENDS, QueryError, Stack

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dashboard-backends")]

DEADLINE_S = 75.0  # from a started stack; a run on an idle 2-core machine needs about 25 s
CONCURRENCY = 8  # queries in flight per backend


@dataclass(frozen=True)
class Outcome:
    """One panel query on one backend: how many series came back, how many with a number."""

    uid: str
    panel: str
    expr: str
    series: int = 0
    numbers: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.numbers > 0 and not self.error

    def line(self) -> str:
        why = self.error or (f"{self.series} series, all NaN" if self.series else "no data")
        return f"  {self.uid} / {self.panel!r}: {why}\n      {self.expr}"


def all_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, query with every variable at All) for every dashboard."""
    return [(uid, title, substitute(expr, ALL_VALUES))
            for uid, board in dashboards().items() for title, expr in panel_queries(board)]


def _numbers(result: list[dict[str, Any]]) -> int:
    return sum(1 for s in result if not math.isnan(float(s["value"][1])))


async def _round(stack: Stack, backend: str, queries: list[tuple[str, str, str]]) -> list[Outcome]:
    gate = asyncio.Semaphore(CONCURRENCY)
    at = time.time()

    async def one(uid: str, title: str, expr: str) -> Outcome:
        async with gate:
            try:
                result = await stack.query(backend, expr, at)
            except QueryError as exc:
                return Outcome(uid, title, expr, error=str(exc)[:300])
        return Outcome(uid, title, expr, len(result), _numbers(result))

    return list(await asyncio.gather(*(one(*q) for q in queries)))


async def poll_until_data(stack: Stack, queries: list[tuple[str, str, str]],
                          deadline_s: float = DEADLINE_S) -> dict[str, list[Outcome]]:
    """Query everything on both backends until one round has data everywhere (or the deadline)."""
    deadline = time.monotonic() + deadline_s
    while True:
        rounds = await asyncio.gather(*(_round(stack, b, queries) for b in BACKENDS))
        outcomes = dict(zip(BACKENDS, rounds, strict=True))
        if all(o.ok for b in BACKENDS for o in outcomes[b]) or time.monotonic() > deadline:
            return outcomes
        await asyncio.sleep(1.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def outcomes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """The last polling round's outcomes per backend, with the time the stack took."""
    queries = all_queries()
    if not queries:
        pytest.skip("no dashboards/*.json yet")
    started = time.monotonic()
    async with Stack(tmp_path_factory.mktemp("stack")) as stack:
        ready = time.monotonic() - started
        found = await poll_until_data(stack, queries)
        logs = "" if all(o.ok for b in BACKENDS for o in found[b]) else stack.logs()
    yield {"outcomes": found, "start_s": ready, "total_s": time.monotonic() - started, "logs": logs}


def _check(outcomes: dict[str, Any], backend: str) -> None:
    found: list[Outcome] = outcomes["outcomes"][backend]
    bad = [o for o in found if not o.ok]
    per_board = {}
    for o in found:
        ok, n = per_board.get(o.uid, (0, 0))
        per_board[o.uid] = (ok + o.ok, n + 1)
    summary = ", ".join(f"{uid} {ok}/{n}" for uid, (ok, n) in per_board.items())
    print(f"{backend}: {summary} (stack up in {outcomes['start_s']:.1f}s, done in {outcomes['total_s']:.1f}s)")
    assert not bad, (f"{len(bad)} of {len(found)} panel queries returned no data on {backend} "
                     f"within {DEADLINE_S:g}s ({summary}):\n" + "\n".join(o.line() for o in bad)
                     + "\n" + outcomes["logs"])


def test_every_panel_query_returns_data_on_prometheus(outcomes: dict[str, Any]) -> None:
    """On Prometheus 2.42 with our recording rules, every panel query of every dashboard returns a number."""
    _check(outcomes, "prometheus")


def test_every_panel_query_returns_data_on_victoriametrics(outcomes: dict[str, Any]) -> None:
    """On VictoriaMetrics (vmagent scraping, vmalert recording), every panel query of every dashboard has a number."""
    _check(outcomes, "victoriametrics")
