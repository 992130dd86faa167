"""Tests for agent.act.remote_write.queue against a real local HTTP receiver: what is sent, retried, refused, dropped,
and what a restart over the same state database sends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from agent.act.remote_write import RemoteWrite, RemoteWriteCollector
from agent.act.remote_write.queue import RemoteWriteQueue, Sample
from agent.act.remote_write.wire import decode
from agent.act.state import StateDB
from agent.config import RemoteWriteConfig
from agent.series import labels_from
from tests.receivers import RecordingServer

DEADLINE_S = 15.0


async def until(check: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> None:
    """Wait for ``check()`` to be true, with a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.02)


def samples(n: int, start: int = 0, name: str = "job:rate:sum") -> list[Sample]:
    return [(labels_from(name, {"i": str(i % 7)}), float(i), 1_000_000 + i) for i in range(start, start + n)]


def received(rec: RecordingServer) -> list[tuple[Any, int, float]]:
    """Every sample the receiver acknowledged, in arrival order."""
    return [(labels, ts, v) for r in rec.accepted("/api/v1/write") for labels, ss in decode(r.body) for ts, v in ss]


def expected(rows: list[Sample]) -> list[tuple[Any, int, float]]:
    return [(labels, ts, v) for labels, v, ts in rows]


def config(rec: RecordingServer, **queue: Any) -> RemoteWriteConfig:
    return RemoteWriteConfig.model_validate(
        {"url": rec.url("/api/v1/write"), "bearer_token_env": "TOKEN",
         "queue": {"min_backoff": "10ms", "max_backoff": "100ms", **queue}},
        context={"environ": {"TOKEN": "s3cret"}})


@pytest.fixture
async def rec() -> AsyncIterator[RecordingServer]:
    async with RecordingServer() as server:
        yield server


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    state = StateDB(tmp_path / "state.db")
    yield state
    state.close()


async def test_sends_in_batches_with_the_protocol_headers_and_deletes_after_2xx(rec: RecordingServer,
                                                                               db: StateDB) -> None:
    """5,000 samples go as 3 requests of at most 2,000, in order, with remote write's headers and the bearer
    token; once acknowledged the queue is empty."""
    q = RemoteWriteQueue(config(rec, max_samples_per_send=2000), db)
    rows = samples(5000)
    await q.enqueue(rows, 0)
    q.start()
    try:
        await until(lambda: q.stats.sent == 5000, "all samples sent")
    finally:
        await q.stop()
    posts = rec.accepted("/api/v1/write")
    assert [len(decode(r.body)) for r in posts] == [2000, 2000, 1000]
    assert received(rec) == expected(rows)
    h = posts[0].headers
    assert (h["Content-Encoding"], h["Content-Type"], h["X-Prometheus-Remote-Write-Version"]) == (
        "snappy", "application/x-protobuf", "0.1.0")
    assert h["Authorization"] == "Bearer s3cret"
    assert h["User-Agent"].startswith("sre-agent/")
    assert q.stats.pending == 0 and db.remote_write.pending() == {}
    assert q.stats.last_send_s > 0 and q.stats.sent_bytes == sum(len(r.body) for r in posts)


async def test_small_batches_are_joined_into_one_request(rec: RecordingServer, db: StateDB) -> None:
    """Ten evaluations queued while the sender was not running go out as one request, in order."""
    q = RemoteWriteQueue(config(rec), db)
    rows = samples(100)
    for i in range(10):
        await q.enqueue(rows[i * 10:(i + 1) * 10], i)
    q.start()
    try:
        await until(lambda: q.stats.sent == 100, "all samples sent")
    finally:
        await q.stop()
    assert len(rec.accepted()) == 1
    assert received(rec) == expected(rows)


async def test_a_receiver_that_answers_500_then_recovers_gets_everything_once(rec: RecordingServer,
                                                                             db: StateDB) -> None:
    """5xx is retried with backoff, the same request again, until accepted: every sample arrives exactly once,
    in order, and the retries are counted."""
    rec.status = 500
    q = RemoteWriteQueue(config(rec, max_samples_per_send=300), db)
    rows = samples(700)
    await q.enqueue(rows, 0)
    q.start()
    try:
        await until(lambda: len(rec.refused()) >= 3, "three refused attempts")
        assert q.stats.sent == 0 and q.stats.retried >= 900 and q.stats.pending == 700
        more = samples(50, start=700)
        await q.enqueue(more, 1)  # queued behind the failing request
        rec.status = 200
        await until(lambda: q.stats.sent == 750, "all samples sent after the recovery")
    finally:
        await q.stop()
    assert received(rec) == expected(rows + more)
    assert q.stats.failed == 0 and q.stats.pending == 0 and q.stats.last_error == ""


async def test_400_is_not_retried_and_the_servers_message_is_logged(db: StateDB) -> None:
    """A 4xx other than 429 cannot succeed on retry: one attempt, counted as failed, deleted, the server's
    reason in the log; the next batch is sent normally."""
    answers = [web.Response(status=400, text="out of bounds: sample too old\n")]

    async def respond(request: web.Request, body: bytes) -> web.StreamResponse:
        return answers.pop(0) if answers else web.Response(status=204)

    async with RecordingServer(responder=respond) as rec:
        q = RemoteWriteQueue(config(rec, max_samples_per_send=10), db)
        with capture_logs() as logs:
            await q.enqueue(samples(15), 0)
            q.start()
            try:
                await until(lambda: q.stats.failed == 10 and q.stats.sent == 5, "one refused, one sent")
            finally:
                await q.stop()
    assert len(rec.posts()) == 2
    refused = [e for e in logs if e["event"].startswith("remote write refused")]
    assert len(refused) == 1 and "sample too old" in refused[0]["error"] and "HTTP 400" in refused[0]["error"]
    assert q.stats.retried == 0 and db.remote_write.pending() == {}


async def test_429_waits_for_retry_after(rec: RecordingServer, db: StateDB) -> None:
    """A 429 with Retry-After: 1 is retried after a second, not after the 10 ms backoff."""
    rec.status, rec.retry_after = 429, "1"
    q = RemoteWriteQueue(config(rec), db)
    await q.enqueue(samples(3), 0)
    q.start()
    try:
        await until(lambda: len(rec.posts()) == 1, "the first attempt")
        rec.status = 200
        await until(lambda: q.stats.sent == 3, "the retry")
    finally:
        await q.stop()
    first, second = rec.posts()
    assert second.at - first.at >= 0.95


async def test_queue_bound_drops_the_oldest_and_counts(rec: RecordingServer, db: StateDB) -> None:
    """Past queue.capacity the oldest batches are dropped (counted as queue_full); the newest are sent."""
    q = RemoteWriteQueue(config(rec, capacity=100, max_samples_per_send=50), db)
    rows = samples(250)
    for i in range(5):
        await q.enqueue(rows[i * 50:(i + 1) * 50], i)
    assert q.stats.dropped["queue_full"] == 150 and q.stats.pending == 100
    q.start()
    try:
        await until(lambda: q.stats.sent == 100, "the kept samples sent")
    finally:
        await q.stop()
    assert received(rec) == expected(rows[150:])
    text = metrics_text(RemoteWrite.__new__(RemoteWrite), [q])
    assert (f'sre_agent_remote_write_dropped_samples_total{{reason="queue_full",remote_name="{q.name}",'
            f'url="{q.url}"}} 150.0') in text


def metrics_text(rw: RemoteWrite, queues: list[RemoteWriteQueue]) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    rw.queues = queues
    registry = CollectorRegistry()
    registry.register(RemoteWriteCollector(rw))
    return generate_latest(registry).decode()


async def test_a_new_queue_over_the_same_state_db_sends_what_was_pending(tmp_path: Path) -> None:
    """An agent restarted while its remote was down sends, after the restart, exactly what was pending;
    what the remote had acknowledged before the restart is not sent again."""
    rec = RecordingServer()
    await rec.start()
    path = tmp_path / "state.db"
    db1 = StateDB(path)
    q1 = RemoteWriteQueue(config(rec), db1)
    first, second = samples(40), samples(60, start=40)
    await q1.enqueue(first, 0)
    q1.start()
    await until(lambda: q1.stats.sent == 40, "the first samples sent")
    await rec.stop()  # the remote goes down; the agent goes on, then stops
    await q1.enqueue(second, 1)
    await until(lambda: q1.stats.retried >= 60, "a failed attempt")
    await q1.stop()
    await db1.aclose()

    db2 = StateDB(path)
    rw = RemoteWrite([config(rec)], db2)  # what the daemon builds at start-up
    [q2] = rw.queues
    assert q2.stats.pending == 60
    await rec.start()
    rw.start()
    try:
        await until(lambda: q2.stats.sent == 60, "the pending samples sent after the restart")
    finally:
        await rw.stop()
        await rec.stop()
        await db2.aclose()
    assert received(rec) == expected(first + second)


async def test_queues_of_remotes_no_longer_configured_are_dropped(rec: RecordingServer, tmp_path: Path) -> None:
    """A remote removed from the config leaves no rows behind that nobody would send."""
    db = StateDB(tmp_path / "state.db")
    gone = RemoteWriteQueue(config(rec).model_copy(update={"name": "old"}), db)
    await gone.enqueue(samples(5), 0)
    with capture_logs() as logs:
        RemoteWrite([config(rec)], db)
    assert db.remote_write.pending() == {}
    assert any(e["event"].startswith("remote write: dropped the queue") and e["samples"] == 5 for e in logs)
    await db.aclose()
