"""The daemon's capacity advice with the max_model_len replicas serve (agent.app.served), over real HTTP
against the fleet simulator's /v1/models on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from agent.act.notification import AlertSnapshot
from agent.app.served import MAX_ANSWER_BYTES, ServedLengths, models_url
from agent.app.triggers import Diagnostics
from agent.config import Config
from agent.diagnose.findings import Finding
from agent.simulate.server import Fleet, FleetConfig
from tests.receivers import free_port
from tests.simstore import MODEL as SIM_MODEL
from tests.simstore import simulated_store

T0 = 1_750_000_000.0
DEADLINE_S = 60.0


async def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {DEADLINE_S:g}s waiting for {what}")
        await asyncio.sleep(0.05)


def _alert() -> AlertSnapshot:
    return AlertSnapshot(labels={"alertname": "VLLMKVCacheSaturated", "severity": "warning",
                                 "instance": "gpu-node-1:8000", "job": "vllm", "model_name": SIM_MODEL},
                         annotations={}, status="firing", starts_at_ms=int((T0 - 900) * 1000))


async def _advice(url: Callable[[str], str]) -> tuple[Finding, ServedLengths]:
    store = simulated_store("kv_pressure", 900, t0_s=T0 - 900)
    posted: list[Finding] = []
    served = ServedLengths(url=url, clock=lambda: T0)
    config = Config.model_validate({"state": {"path": ":memory:"}})
    d = Diagnostics(config, store, lambda f, a: posted.append(f), clock=lambda: T0, served=served)
    d.on_alert(_alert())
    await _until(lambda: posted, "the capacity finding")
    (f,) = posted
    return f, served


def test_models_url() -> None:
    assert models_url("gpu-node-1:8000") == "http://gpu-node-1:8000/v1/models"
    assert models_url("https://h:8443/metrics") == "https://h:8443/v1/models"


async def test_kv_saturation_advice_speaks_of_full_length_sequences() -> None:
    """The replica's /v1/models says max_model_len 8,192: the finding counts full-length sequences
    (8,192 blocks / 512 per sequence = 16) and names where the length came from."""
    fleet = Fleet(FleetConfig(replicas=1, base_port=0, speed=20.0, step_s=0.05, dcgm_port=None))
    await fleet.start()
    try:
        target = fleet.targets[0]
        f, served = await _advice(lambda instance: models_url(target))
        assert await served.max_model_len("gpu-node-1:8000") == 8192  # cached: no second request needed
    finally:
        await fleet.stop()
    assert f.details["max_model_len"] == 8192 and f.details["full_length_seqs"] == 16
    assert f"= 16 full-length sequences of 8,192 tokens (max_model_len from {models_url(target)})" in f.evidence


async def test_replica_that_does_not_answer_leaves_the_length_out() -> None:
    """Nothing listens on the port: the advice comes anyway, without full-length sequences."""
    port = free_port()
    f, _ = await _advice(lambda instance: f"http://127.0.0.1:{port}/v1/models")
    assert f.kind == "kv-cache-capacity" and f.details["max_model_len"] is None
    assert not any("full-length" in line for line in f.evidence)


HOSTILE_ANSWERS = {
    "huge": None,  # streamed: 64 MiB of a models list that never closes
    "overflow": b'{"data": [{"id": "m", "max_model_len": 1e400}]}',
    "nan": b'{"data": [{"id": "m", "max_model_len": NaN}]}',
    "bool": b'{"data": [{"id": "m", "max_model_len": true}]}',
    "string": b'{"data": [{"id": "m", "max_model_len": "8192"}]}',
    "negative": b'{"data": [{"id": "m", "max_model_len": -8192}]}',
    "fraction": b'{"data": [{"id": "m", "max_model_len": 8192.5}]}',
    "deep": b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not-a-list": b'{"data": {"id": "m"}}',
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_ANSWERS))
async def test_a_hostile_models_answer_is_no_answer(kind: str) -> None:
    """A replica's /v1/models answer that is huge, deeply nested or holds a length that is not a positive
    integer gives None (advice without full-length figures), never an exception; a huge one is cut at the
    cap, not read whole."""
    sent = [0]

    async def models(request: web.Request) -> web.StreamResponse:
        body = HOSTILE_ANSWERS[kind]
        if body is not None:
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        chunk = b'{"data": [' + b" " * (1 << 20)
        try:
            for _ in range(64):
                await resp.write(chunk)
                sent[0] += len(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        served = ServedLengths(url=lambda instance: f"http://127.0.0.1:{port}/v1/models", clock=lambda: T0)
        assert await served.max_model_len("gpu-node-1:8000", "m") is None
    finally:
        await runner.cleanup()
    if kind == "huge":
        assert sent[0] < 64 * (1 << 20), sent  # the reader stopped before the replica finished
        assert sent[0] >= MAX_ANSWER_BYTES // 2
