"""The daemon's capacity advice with the max_model_len replicas serve (agent.app.served), over real HTTP
against the fleet simulator's /v1/models on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from agent.act.notification import AlertSnapshot
from agent.app.served import ServedLengths, models_url
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
