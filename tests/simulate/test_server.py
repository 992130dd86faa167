"""The simulated fleet over real localhost HTTP: exposition, health, scaling and a dying replica."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect import catalog
from agent.errors import SimulatorError
from agent.simulate.server import CONTENT_TYPE, Fleet, FleetConfig

StartFleet = Callable[..., Awaitable[Fleet]]


@pytest.fixture
async def start_fleet() -> AsyncIterator[StartFleet]:
    """Start fleets on free 127.0.0.1 ports (fast model time) and stop them after the test."""
    fleets: list[Fleet] = []

    async def start(**overrides: object) -> Fleet:
        options: dict[str, object] = {"replicas": 2, "base_port": 0, "speed": 20.0, "step_s": 0.05}
        options.update(overrides)
        fleet = Fleet(FleetConfig(**options))  # type: ignore[arg-type]
        await fleet.start()
        fleets.append(fleet)
        return fleet

    yield start
    for fleet in fleets:
        await fleet.stop()


async def fetch(url: str, **headers: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """Family name -> (type, label keys) as prometheus_client's own parser reads the text."""
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        keys = set().union(*(set(s.labels) for s in fam.samples)) - {"le"}
        out[fam.name] = (fam.type, keys)
    return out


def sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_v1_metrics_have_v1_names_and_labels(start_fleet: StartFleet) -> None:
    """A V1 replica serves text format 0.0.4 with V1 names, model_name and engine labels."""
    fleet = await start_fleet()
    await asyncio.sleep(0.3)
    status, ctype, text = await fetch(fleet.targets[0], Accept="application/openmetrics-text; version=1.0.0")
    assert (status, ctype) == (200, CONTENT_TYPE)
    fams = families(text)
    assert fams["vllm:kv_cache_usage_perc"] == ("gauge", {"model_name", "engine"})
    assert fams["vllm:inter_token_latency_seconds"][0] == "histogram"
    assert fams["vllm:request_success"] == ("counter", {"model_name", "engine", "finished_reason"})
    assert "vllm:gpu_cache_usage_perc" not in fams
    assert {"engine", "num_gpu_blocks", "block_size"} <= fams["vllm:cache_config_info"][1]
    assert 'le="2560.0"' in text and "vllm:prompt_tokens_created" in text
    gen = catalog.detect_generation(sample_names(text), label_names={"model_name", "engine"})
    assert gen.track == catalog.Track.V1 and gen.min_version == (0, 11, 0)


async def test_v0_metrics_when_asked(start_fleet: StartFleet) -> None:
    """generation="v0" serves V0 names and HELP texts without the engine label or _created series."""
    fleet = await start_fleet(generation="v0")
    status, _, text = await fetch(fleet.targets[1])
    fams = families(text)
    assert status == 200
    assert fams["vllm:gpu_cache_usage_perc"] == ("gauge", {"model_name"})
    assert fams["vllm:time_per_output_token_seconds"][0] == "histogram"
    assert "vllm:kv_cache_usage_perc" not in fams and "vllm:inter_token_latency_seconds" not in fams
    assert "# HELP vllm:num_requests_running Number of requests currently running on GPU." in text
    assert "_created" not in text
    assert catalog.detect_generation(sample_names(text)).track == catalog.Track.V0
    _, _, version = await fetch(fleet.targets[1].replace("/metrics", "/version"))
    assert '"0.7.3"' in version


async def test_lmdeploy_replica_serves_lmdeploy_names(start_fleet: StartFleet) -> None:
    """An LMDeploy replica comes after the vLLM ones and exposes lmdeploy: families."""
    fleet = await start_fleet(replicas=1, lmdeploy_replicas=1)
    await asyncio.sleep(0.3)
    assert len(fleet.targets) == 2
    _, _, text = await fetch(fleet.targets[1])
    fams = families(text)
    assert fams["lmdeploy:prefix_cache_hit_rate"] == ("gauge", {"model_name", "engine"})
    assert fams["lmdeploy:cached_tokens"][0] == "counter" and "lmdeploy:cached_tokens_total" in text
    assert fams["lmdeploy:iter_token_latency"][0] == "histogram"
    assert not any(name.startswith("vllm:") for name in fams)


async def test_health_and_version_answer(start_fleet: StartFleet) -> None:
    """/health is 200 with an empty body and /version names the simulated vLLM release."""
    fleet = await start_fleet(replicas=1)
    base = fleet.targets[0].removesuffix("/metrics")
    assert (await fetch(base + "/health"))[0::2] == (200, "")
    assert '"version": "0.11.0"' in (await fetch(base + "/version"))[2]
    assert (await fetch(base + "/nope"))[0] == 404


async def test_dying_replica_fails_health_but_still_serves_metrics(start_fleet: StartFleet) -> None:
    """Between engine death and shutdown /health answers 503 (V1) or 500 (V0) while /metrics stays up."""
    for generation, code in (("v1", 503), ("v0", 500)):
        fleet = await start_fleet(replicas=1, generation=generation, step_s=5.0)
        fleet._vllm[0].status = "dying"
        base = fleet.targets[0].removesuffix("/metrics")
        assert (await fetch(base + "/health"))[0] == code
        assert (await fetch(base + "/metrics"))[0] == 200


async def test_metrics_render_once_per_step(start_fleet: StartFleet) -> None:
    """Scrapes within one model step reuse the rendered bytes instead of rendering again."""
    fleet = await start_fleet(replicas=1, step_s=5.0)
    for _ in range(3):
        assert (await fetch(fleet.targets[0]))[0] == 200
    assert fleet._vllm[0].renderer.renders == 1


async def test_scale_changes_targets_and_is_idempotent(start_fleet: StartFleet) -> None:
    """POST /scale adds or removes replicas; the same idempotency key applies only once."""
    fleet = await start_fleet(replicas=2)
    async with aiohttp.ClientSession() as session:
        body = {"delta": 1, "idempotency_key": "alert-123"}
        async with session.post(fleet.control_url + "/scale", json=body) as resp:
            first = await resp.json()
        async with session.post(fleet.control_url + "/scale", json=body) as resp:
            again = await resp.json()
        assert (first["replicas"], first["applied"]) == (3, True)
        assert (again["replicas"], again["applied"]) == (3, False)
        assert len(fleet.targets) == 3

        async def post(body: dict[str, object]) -> dict[str, object]:
            async with session.post(fleet.control_url + "/scale", json=body) as resp:
                return await resp.json()  # type: ignore[no-any-return]

        racing = await asyncio.gather(*(post({"delta": 1, "idempotency_key": "alert-456"}) for _ in range(4)))
        assert sorted(r["applied"] for r in racing) == [False, False, False, True]
        assert len(fleet.targets) == 4
        assert (await fetch(fleet.targets[2]))[0] == 200
        async with session.post(fleet.control_url + "/scale", json={"replicas": 1}) as resp:
            assert (await resp.json())["replicas"] == 1  # newest replicas go first
        async with session.post(fleet.control_url + "/scale", json={"replicas": "many"}) as resp:
            assert resp.status == 400
        async with session.get(fleet.control_url + "/state") as resp:
            state = await resp.json()
    assert [r["name"] for r in state["replicas"]] == ["vllm-0"]
    assert state["replicas"][0]["arrival_rate"] == pytest.approx(2 * 11.0)


async def test_oom_kills_a_replica_and_logs_the_cuda_error(start_fleet: StartFleet, tmp_path: Path) -> None:
    """In the oom scenario replica 0 dies: connection refused, a CUDA OOM line in its log, peers fine."""
    fleet = await start_fleet(replicas=2, scenario="oom", speed=90.0, log_dir=tmp_path)
    dead, alive = fleet.targets
    for _ in range(100):
        await asyncio.sleep(0.05)
        if fleet.state()[0]["status"] == "dead":
            break
    with pytest.raises(aiohttp.ClientConnectorError):
        await fetch(dead)
    assert (await fetch(alive))[0] == 200
    log = (tmp_path / "vllm-0.log").read_text()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in log
    assert "OutOfMemoryError" not in (tmp_path / "vllm-1.log").read_text()
    assert fleet.state()[1]["arrival_rate"] == pytest.approx(2 * 11.0)  # the survivor takes all traffic


def test_config_rejects_unknown_scenario_and_generation() -> None:
    """FleetConfig names the problem when the scenario or generation does not exist."""
    with pytest.raises(SimulatorError, match="scenario"):
        FleetConfig(scenario="meltdown")
    with pytest.raises(SimulatorError, match="generation"):
        FleetConfig(generation="v2")


async def test_busy_port_raises_and_leaves_nothing_listening() -> None:
    """A replica port already in use fails start() with SimulatorError and closes what was opened."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fleet = Fleet(FleetConfig(replicas=1, base_port=port, control_port=0))
        with pytest.raises(SimulatorError, match=str(port)):
            await fleet.start()
    assert fleet._control is None and fleet._task is None


async def test_v1_models_reports_max_model_len_as_vllm_does(start_fleet: StartFleet) -> None:
    """/v1/models lists the served model with vLLM's max_model_len; LMDeploy's card carries none."""
    fleet = await start_fleet(replicas=1, lmdeploy_replicas=1)
    vllm_url, lmdeploy_url = (t.removesuffix("/metrics") + "/v1/models" for t in fleet.targets)
    async with aiohttp.ClientSession() as session:
        async with session.get(vllm_url) as resp:
            (card,) = (await resp.json())["data"]
        async with session.get(lmdeploy_url) as resp:
            (lm_card,) = (await resp.json())["data"]
    assert (card["id"], card["owned_by"], card["max_model_len"]) == ("meta-llama/Llama-3.1-8B-Instruct", "vllm", 8192)
    assert lm_card["owned_by"] == "lmdeploy" and "max_model_len" not in lm_card


async def test_scale_key_from_the_header_is_remembered_for_an_hour() -> None:
    """The ``Idempotency-Key`` header (what the agent's scale sink sends) de-duplicates like the body field:
    a repeat answers 200 with the remembered result, not the current count; an hour later the key is new."""
    shift = [0.0]
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, speed=20.0, step_s=0.05),
                  clock=lambda: time.monotonic() + shift[0])
    await fleet.start()
    try:
        async with aiohttp.ClientSession() as session:
            async def post(body: dict[str, object], key: str) -> tuple[int, dict[str, object]]:
                async with session.post(fleet.control_url + "/scale", json=body,
                                        headers={"Idempotency-Key": key}) as resp:
                    return resp.status, await resp.json()

            assert await post({"replicas": 3}, "scale:vllm:out:2->3:1") == (
                200, {"replicas": 3, "targets": fleet.targets, "applied": True})
            assert (await post({"delta": 1}, "other"))[1]["replicas"] == 4
            # the same key again (the other replica of an HA pair): the result it got first, nothing applied
            status, again = await post({"replicas": 3}, "scale:vllm:out:2->3:1")
            assert (status, again["replicas"], again["applied"]) == (200, 3, False)
            assert len(fleet.targets) == 4
            shift[0] = 3601.0
            status, later = await post({"replicas": 3}, "scale:vllm:out:2->3:1")
            assert (status, later["replicas"], later["applied"]) == (200, 3, True)
            async with session.get(fleet.control_url + "/state") as resp:
                log = (await resp.json())["scale_requests"]
        assert [(e["key"], e["replicas"], e["applied"]) for e in log] == [
            ("scale:vllm:out:2->3:1", 3, True), ("other", 4, True), ("scale:vllm:out:2->3:1", 3, False),
            ("scale:vllm:out:2->3:1", 3, True)]
    finally:
        await fleet.stop()


async def test_behind_least_request_new_replicas_take_the_queue_s_arrivals(start_fleet: StartFleet) -> None:
    """Scaled out under a surge, the new replicas get most of the new arrivals while the old ones
    drain their queues; demand is conserved. Behind the even balancer every replica gets the same."""
    fleet = await start_fleet(replicas=2, scenario="surge", balance="least_request", lmdeploy_replicas=0,
                              dcgm_port=None)

    async def state() -> list[dict[str, Any]]:
        return [r for r in fleet.state() if r["kind"] == "vllm"]

    deadline = asyncio.get_running_loop().time() + 60
    while min(int(r["waiting"]) for r in await state()) < 100:  # model minutes pass in wall seconds
        assert asyncio.get_running_loop().time() < deadline, await state()
        await asyncio.sleep(0.05)
    await fleet.scale_to(4)
    after = await state()
    old, new = after[:2], after[2:]
    # the two fresh replicas of four hold ranks 0 and 1 (7/16 and 5/16 of arrivals, or 6/16 each while tied
    # at zero), the old ones 3/16 and 1/16: the smaller new share is at least 5/3 of the larger old one
    assert min(float(r["arrival_rate"]) for r in new) >= 1.6 * max(float(r["arrival_rate"]) for r in old)
    demand = fleet.scenario.rate_per_replica * 2 * fleet.scenario.demand(float(after[0]["time"]))
    assert sum(float(r["arrival_rate"]) for r in after) == pytest.approx(demand, rel=0.01)


def test_config_rejects_an_unknown_balancer() -> None:
    with pytest.raises(SimulatorError, match="least_request"):
        FleetConfig(balance="random")
