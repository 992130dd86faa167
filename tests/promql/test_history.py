"""agent.promql.history over a real local HTTP server: range queries end by their deadline when the server
trickles, refuse an answer past the size cap, and turn every malformed answer into a SourceError; the
instant path (agent.promql.remote, aiohttp) keeps its total deadline against the same trickle."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.promql.history import RemoteHistory
from agent.promql.remote import RemoteSource
from tests.receivers import RecordingServer, Responder, reply, trickle

T0_MS = 1_767_225_600_000
MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"__name__": "up", "job": "vllm"}, "values": [[T0_MS / 1000, "1"], [T0_MS / 1000 + 15, "2"]]}]}}


def _history(url: str, timeout: str = "1500ms", **kw: Any) -> RemoteHistory:
    return RemoteHistory(_source(url, timeout), **kw)


def _source(url: str, timeout: str) -> SourceConfig:
    return SourceConfig.model_validate({"type": "prometheus", "url": url, "timeout": timeout})


@pytest.mark.parametrize(("per_second", "timeout"), [(1, "1500ms"), (1, "2s"), (8, "1s")])
async def test_a_trickling_range_answer_ends_by_the_deadline(per_second: int, timeout: str) -> None:
    """A body trickled a few bytes a second (per read well under the timeout) fails at the total deadline."""
    async with RecordingServer(responder=trickle(json.dumps(MATRIX).encode(), per_second=per_second)) as srv:
        history = _history(srv.url(""), timeout)
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"answer not complete within [\d.]+s \(\d+ bytes had arrived\)"):
            await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000)
        took = time.monotonic() - t0
    assert took < history.deadline_s + 1.0, took


async def test_a_callers_earlier_deadline_wins() -> None:
    """A report's own budget (a monotonic deadline) ends the query before the source's timeout."""
    async with RecordingServer(responder=trickle(json.dumps(MATRIX).encode())) as srv:
        history = _history(srv.url(""), "30s")
        t0 = time.monotonic()
        with pytest.raises(SourceError, match="not complete"):
            await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000, deadline=t0 + 1.0)
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(SourceError, match="deadline passed before it was sent"):
            await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000, deadline=t0 - 1)


@pytest.mark.parametrize("size", [1025, 4096, 200_000])
async def test_an_answer_past_the_size_cap_is_refused(size: int) -> None:
    """An answer larger than the cap is refused while it arrives, whatever its shape."""
    async with RecordingServer(responder=reply(text="x" * size)) as srv:
        history = _history(srv.url(""), max_bytes=1024)
        with pytest.raises(SourceError, match="answer larger than 1024 bytes"):
            await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000)


@pytest.mark.parametrize(("answer", "message"), [
    (reply(json_body={"status": "success"}), "'data' is missing"),
    (reply(json_body=[MATRIX]), "not a JSON object"),
    (reply(json_body={"status": "success", "data": {"resultType": "vector", "result": []}}), "not a matrix"),
    (reply(json_body={"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {}, "values": [["NaN", "1"]]}]}}), "timestamp is not a number"),
    (reply(text="<html>bad gateway</html>", status=502), "HTTP 502.*not the query API's JSON"),
    (reply(json_body={"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400),
     r"HTTP 400.*query failed \(bad_data\): parse error"),
    (reply(json_body=MATRIX, status=500), "HTTP 500"),
])
async def test_malformed_answers_over_http_are_source_errors(answer: Responder, message: str) -> None:
    """Both entry points (query_range for reports, fetch for diagnoses) raise SourceError naming the query."""
    async with RecordingServer(responder=answer) as srv:
        history = _history(srv.url(""))
        with pytest.raises(SourceError, match=f"range query 'up'.*{message}"):
            await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000)
        with pytest.raises(SourceError, match=message):
            await asyncio.to_thread(history.fetch, ["up"], T0_MS, T0_MS + 60_000)


async def test_a_good_answer_is_read_with_the_deadline_sent_as_the_apis_timeout() -> None:
    """The answer's series come back in ms; the request carries the range, the step and a Go duration timeout."""
    async with RecordingServer(responder=reply(json_body=MATRIX)) as srv:
        history = _history(srv.url(""))
        series = await asyncio.to_thread(history.query_range, "up", T0_MS, T0_MS + 60_000, step_s=15)
        store = await asyncio.to_thread(history.fetch, ["up"], T0_MS, T0_MS + 60_000)
    assert series == [({"__name__": "up", "job": "vllm"}, [T0_MS, T0_MS + 15_000], [1.0, 2.0])]
    assert store.series_count == 1
    (req, _) = srv.requests
    assert req.method == "GET" and req.path == "/api/v1/query_range"


async def test_the_instant_path_ends_a_trickling_answer_by_its_total_deadline() -> None:
    """aiohttp's total timeout covers the body too: the rule evaluation's query ends by the source's timeout."""
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    async with RecordingServer(responder=trickle(json.dumps(vector).encode())) as srv:
        source = RemoteSource(_source(srv.url(""), "1500ms"))
        t0 = time.monotonic()
        try:
            with pytest.raises(SourceError, match=r"no answer within 1\.5s"):
                await source.instant("up", T0_MS)
        finally:
            await source.close()
        assert time.monotonic() - t0 < 3.0
