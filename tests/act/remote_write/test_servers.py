"""Remote write into a real Prometheus 2.42 (``--web.enable-remote-write-receiver``) and a real VictoriaMetrics
(``/api/v1/write``): the samples are queried back with exact counts, also across a restart of the server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.act.remote_write.queue import RemoteWriteQueue, Sample
from agent.act.state import StateDB
from agent.config import RemoteWriteConfig
from agent.series import STALE_NAN, labels_from
from tests.act.remote_write.test_queue import until
from tests.prometheus import Prometheus
from tests.victoriametrics import VictoriaMetrics

TSDB = Prometheus | VictoriaMetrics
SERIES = 3
PER_SERIES = 400  # one sample a second over the last ~7 minutes: inside Prometheus' head and VictoriaMetrics' range


@pytest.fixture(params=["prometheus", "victoriametrics"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TSDB]:
    srv: TSDB = (Prometheus(tmp_path / "prom", [], remote_write_receiver=True) if request.param == "prometheus"
                 else VictoriaMetrics(tmp_path / "vm"))
    async with srv:
        yield srv


async def count(server: TSDB, expr: str, at: float, expect: dict[str, float]) -> dict[str, float]:
    """``count_over_time`` per series of ``expr`` over the last hour at ``at``, by label ``i``, once it is
    ``expect`` or the wait for it ran out (VictoriaMetrics shows a write within a second or two)."""
    def by_i(result: list[dict[str, Any]]) -> dict[str, float]:
        return {r["metric"].get("i", ""): float(r["value"][1]) for r in result}
    return by_i(await server.settled(f"count_over_time({expr}[1h])", at, until=lambda r: by_i(r) == expect))


def rows(name: str, start_ms: int) -> list[Sample]:
    """SERIES x PER_SERIES samples, a second apart, interleaved the way evaluations write them."""
    return [(labels_from(name, {"i": str(i), "job": "rules"}), float(t * 10 + i), start_ms + t * 1000)
            for t in range(PER_SERIES) for i in range(SERIES)]


def config(url: str) -> RemoteWriteConfig:
    return RemoteWriteConfig.model_validate({"url": url, "queue": {"max_samples_per_send": 100,
                                                                    "min_backoff": "20ms", "max_backoff": "200ms"}})


async def test_samples_arrive_exactly_once_across_a_server_restart(server: TSDB, tmp_path: Path) -> None:
    """1,200 samples of 3 series reach the server, half of them queued while it is down for a restart:
    afterwards each series holds exactly its 400 samples (none lost, none twice), with the right values."""
    now_ms = int(time.time() * 1000)
    data = rows("sre_rw_test:value", now_ms - PER_SERIES * 1000)
    db = StateDB(tmp_path / "state.db")
    q = RemoteWriteQueue(config(f"{server.url}/api/v1/write"), db)
    q.start()
    try:
        half = len(data) // 2
        for i in range(0, half, 60):  # one "evaluation" = 20 timestamps x 3 series
            await q.enqueue(data[i:i + 60], now_ms)
        await until(lambda: q.stats.sent == half, "the first half sent")
        await server.stop()
        for i in range(half, len(data), 60):
            await q.enqueue(data[i:i + 60], now_ms)
        await until(lambda: q.stats.retried > 0, "a send that failed while the server was down")
        await server.start_again()
        await until(lambda: q.stats.sent == len(data), "everything sent after the restart", timeout=60)
    finally:
        await q.stop()
        await db.aclose()
    assert q.stats.failed == 0 and q.stats.dropped == {}
    at = now_ms / 1000 + 1
    want = {str(i): float(PER_SERIES) for i in range(SERIES)}
    assert await count(server, "sre_rw_test:value", at, want) == want
    sums = await server.settled("sum by (i) (sum_over_time(sre_rw_test:value[1h]))", at)
    assert {r["metric"]["i"]: float(r["value"][1]) for r in sums} == {
        str(i): float(sum(t * 10 + i for t in range(PER_SERIES))) for i in range(SERIES)}


async def test_staleness_markers_end_a_series(server: TSDB, tmp_path: Path) -> None:
    """A resolved alert's ALERTS series ends with Prometheus' staleness marker: right after it, the server
    returns no sample for it, though the last real sample is within the lookback."""
    now_ms = int(time.time() * 1000)
    alerts = labels_from("ALERTS", {"alertname": "SomethingHigh", "alertstate": "firing", "i": "0"})
    written = [(alerts, 1.0, now_ms - 30_000), (alerts, 1.0, now_ms - 15_000), (alerts, STALE_NAN, now_ms - 14_999)]
    db = StateDB(tmp_path / "state.db")
    q = RemoteWriteQueue(config(f"{server.url}/api/v1/write"), db)
    q.start()
    try:
        await q.enqueue(written, now_ms)
        await until(lambda: q.stats.sent == 3, "sent")
    finally:
        await q.stop()
        await db.aclose()
    series = 'ALERTS{alertname="SomethingHigh"}'
    assert await count(server, series, now_ms / 1000, {"0": 2.0}) == {"0": 2.0}  # the marker is no sample
    assert [r["value"][1] for r in await server.query(series, now_ms / 1000 - 20)] == ["1"]
    assert await server.settled(series, now_ms / 1000 - 5, until=lambda r: r == []) == []


async def test_many_requests_in_a_row(server: TSDB, tmp_path: Path) -> None:
    """Back-to-back requests (a backlog after an outage) all land: 30 requests of 100 samples."""
    now_ms = int(time.time() * 1000)
    data = [(labels_from("sre_rw_backlog", {"i": str(i % 10)}), 1.0, now_ms - 300_000 + (i // 10) * 1000)
            for i in range(3000)]
    db = StateDB(tmp_path / "state.db")
    q = RemoteWriteQueue(config(f"{server.url}/api/v1/write"), db)
    await q.enqueue(data, now_ms)
    q.start()
    try:
        await until(lambda: q.stats.sent == 3000, "the backlog sent", timeout=30)
    finally:
        await q.stop()
        await db.aclose()
    got = await server.settled("sum(count_over_time(sre_rw_backlog[1h]))", now_ms / 1000 + 1,
                               until=lambda r: bool(r) and r[0]["value"][1] == "3000")
    assert float(got[0]["value"][1]) == 3000.0
