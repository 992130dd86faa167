"""Tests for ``plan --from-target`` (agent.cli.plan_live) against real local servers on 127.0.0.1 that
misbehave: a reply that trickles or stalls past the deadline, a body over the scraper's cap, a
non-2xx status. Each is exit 2 with the reason, within a bounded time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from agent.cli import main
from agent.cli.plan_live import DEFAULT_TIMEOUT_S, MAX_BODY_BYTES, fetch_url
from agent.config import ScrapeConfig
from agent.errors import ScrapeError
from tests.conftest import FIXTURES, Handler

AIBRIX = FIXTURES / "vllm" / "v0_0.7_aibrix_qwen15b_metrics.txt"
Start = Callable[[Handler], Awaitable[str]]
CHUNK = b"# " + b"x" * 65_532 + b"\n"  # 64 KiB of comment lines
GIVE_UP_S = 30.0  # a misbehaving handler stops on its own after this, long after the client gave up


def _misbehaving(kind: str, released: asyncio.Event) -> Handler:
    """A /metrics handler that answers in one of the ways a target may misbehave."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if kind in ("500", "404", "204-then-nothing"):
            return web.Response(status=int(kind[:3]), text="")
        if kind == "stall":  # accepts, never sends headers
            await asyncio.wait_for(released.wait(), GIVE_UP_S)
            return web.Response(text="")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
        if kind == "declared-oversize":
            resp.content_length = MAX_BODY_BYTES + 1
        await resp.prepare(request)
        deadline = asyncio.get_running_loop().time() + GIVE_UP_S
        while not released.is_set() and asyncio.get_running_loop().time() < deadline:
            if kind == "trickle":  # a byte at a time, forever: no single read ever waits long
                await resp.write(b"#")
                await asyncio.sleep(0.02)
            else:  # "endless" / "declared-oversize": bytes as fast as the client takes them
                await resp.write(CHUNK)
        return resp

    return handler


async def _plan(*argv: str) -> tuple[int, float]:
    """``main(["plan", *argv])`` in a worker thread (it runs its own event loop); exit code and seconds."""
    start = time.monotonic()
    try:
        code = await asyncio.wait_for(asyncio.to_thread(main, ["plan", *argv]), GIVE_UP_S + 10)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, time.monotonic() - start


def test_the_caps_are_the_scrapers() -> None:
    """The body cap and default deadline are the daemon's scrape.body_limit (16 MiB) and scrape.timeout."""
    assert (ScrapeConfig().body_limit, ScrapeConfig().timeout) == (MAX_BODY_BYTES, DEFAULT_TIMEOUT_S)
    assert MAX_BODY_BYTES == 16 * 2**20


@pytest.mark.parametrize(("kind", "reason"), [
    ("trickle", "no complete answer within 0.5s (--timeout)"),
    ("stall", "no complete answer within 0.5s (--timeout)"),
])
async def test_a_reply_slower_than_the_deadline_is_no_answer(kind: str, reason: str, http_server: Start,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A target that trickles its body a byte at a time, or never sends headers, is cut at --timeout
    (connect to last byte, not per read): exit 2 with the reason, in about the timeout."""
    released = asyncio.Event()
    url = await http_server(_misbehaving(kind, released))
    try:
        code, took = await _plan("--from-target", url, "--timeout", "500ms", "--max-model-len", "4096")
    finally:
        released.set()
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {url}: no answer ({reason})" in err
    assert took < 5.0  # the deadline held (0.5 s, plus start-up); a per-read timeout would wait GIVE_UP_S
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["endless", "declared-oversize"])
async def test_a_body_over_the_scrapers_cap_is_no_answer(kind: str, http_server: Start,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An endless body, or one whose Content-Length says it is over 16 MiB, is refused at the cap: exit 2."""
    released = asyncio.Event()
    url = await http_server(_misbehaving(kind, released))
    try:
        code, _ = await _plan("--from-target", url, "--max-model-len", "4096")
    finally:
        released.set()
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {url}: no answer (body of more than {MAX_BODY_BYTES:,} bytes" in err


@pytest.mark.parametrize("status", ["500", "404", "204-then-nothing"])
async def test_a_status_other_than_2xx_is_no_answer(status: str, http_server: Start,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """5xx and 4xx are exit 2 naming the status; a 2xx without a vLLM body is exit 2 for that reason."""
    url = await http_server(_misbehaving(status, asyncio.Event()))
    code, _ = await _plan("--from-target", url, "--max-model-len", "4096")
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    if status.startswith("2"):
        assert f"error: {url}: no vllm:cache_config_info" in err
    else:
        assert f"error: {url}: no answer (HTTP status {status}" in err


async def test_a_real_vllm_body_within_the_limits_is_read(http_server: Start,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The real fetch reads a captured vLLM /metrics served over HTTP: the replica's capacity is printed."""
    body = AIBRIX.read_bytes()

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="text/plain")

    url = await http_server(handler)
    code, _ = await _plan("--from-target", url, "--max-model-len", "32768", "--timeout", "10s")
    out = capsys.readouterr().out
    assert code == 0
    assert "1,308,272 tokens" in out


async def test_fetch_url_caps_any_body_it_is_given(http_server: Start) -> None:
    """fetch_url's own cap: a 4 KiB limit refuses a 64 KiB chunk with ScrapeError naming the limit."""
    released = asyncio.Event()
    url = await http_server(_misbehaving("endless", released))
    try:
        with pytest.raises(ScrapeError, match="body of more than 4,096 bytes"):
            await asyncio.to_thread(fetch_url, url, timeout_s=10.0, max_bytes=4096)
    finally:
        released.set()


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e999", "-1", "0", '"4096"', "true", "[4096]"])
def test_a_served_max_model_len_that_is_no_length_is_ignored(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """/v1/models answering an infinite, NaN, negative, string or boolean max_model_len: the replica is
    reported without one (as for a server that does not say), never a traceback."""
    from agent.cli import _parser  # the real argument parser, with a fake network
    from agent.cli.plan_live import run_live

    bodies = {"http://h:8000/metrics": AIBRIX.read_bytes(),
              "http://h:8000/v1/models": f'{{"data": [{{"id": "q", "max_model_len": {value}}}]}}'.encode()}

    def fetch(url: str) -> bytes:
        return bodies[url]

    code = run_live(_parser().parse_args(["plan", "--from-target", "h:8000", "--json"]), fetch=fetch,
                    clock=lambda: 1_750_000_000.0)
    (rep,) = json.loads(capsys.readouterr().out)["replicas"]
    assert code == 0
    assert (rep["max_model_len"], rep["kv_cache_tokens"]) == (None, 1_308_272)
