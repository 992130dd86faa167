"""Simulated GPUs: dcgm-exporter names and labels, values that follow the replica model, the exporter port."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.cli import fleet_config
from agent.collect import catalog
from agent.simulate.gpu import GpuBank, GpuParams, SimGpu
from agent.simulate.model import Load, ReplicaModel, ReplicaParams
from agent.simulate.render import bounds_for
from agent.simulate.server import CONTENT_TYPE, Fleet, FleetConfig

SAMPLE = re.compile(r'(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')
BUSY = Load(arrival_rate=11.0)


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample as (name, labels, value); the sample names as written (prometheus_client's parser
    would append ``_total`` to dcgm-exporter's counters, which Prometheus does not)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.fullmatch(line)
        assert match is not None, line
        labels = dict(LABEL.findall(match["labels"] or ""))
        out.append((match["name"], labels, float(match["value"])))
    return out


def samples(text: str) -> dict[tuple[str, str], float]:
    """(metric, gpu) -> value for the per-GPU series (not the per-link ones)."""
    return {(name, labels.get("gpu", "")): v for name, labels, v in parse(text) if "link" not in labels}


def run(model: ReplicaModel, bank: GpuBank, gpus: list[SimGpu], seconds: float, *, load: Load = BUSY,
        oom: float | None = None) -> None:
    """Step the model and its GPUs together, one model second at a time."""
    for _ in range(int(seconds)):
        model.step(model.now, 1.0, load)
        bank.step(gpus, model, load, now=model.now, dt=1.0, oom_progress=oom)


def replica(flavor: str = "v1") -> ReplicaModel:
    params = ReplicaParams()
    return ReplicaModel(params, bounds_for(flavor, params.max_model_len), seed=1)


def test_every_reading_has_a_dcgm_exporter_name_and_labels() -> None:
    """The exporter text names only dcgm-exporter fields (and the agent's GPU families) with its labels."""
    bank = GpuBank(ReplicaParams(), hostname="node-7")
    model, gpus = replica(), bank.allocate("vllm-0", "v1")
    run(model, bank, gpus, 3)
    known = {"DCGM_FI_DEV_" + f for f in catalog.DCGM_FIELDS} | set(catalog.SRE_AGENT_GPU_FAMILIES)
    text = bank.render(model.now).decode()
    assert list(text_string_to_metric_families(text))  # well-formed for a standard parser too
    found = parse(text)
    names = {name for name, _, _ in found}
    assert names <= known, names - known
    assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"} <= names
    used = next(labels for name, labels, _ in found if name == "DCGM_FI_DEV_FB_USED")
    assert {"gpu": "0", "Hostname": "node-7", "modelName": "NVIDIA A100-SXM4-40GB"}.items() <= used.items()
    assert used["UUID"].startswith("GPU-")


def test_framebuffer_is_the_memory_budget_while_up_and_free_after_death() -> None:
    """FB used is gpu_memory_utilization of the CUDA total while the engine runs, 0 once it died."""
    bank = GpuBank(ReplicaParams(gpu_memory_utilization=0.9), hostname="h")
    model, gpus = replica(), bank.allocate("vllm-0", "v1")
    run(model, bank, gpus, 5)
    s = samples(bank.render(model.now).decode())
    cuda_total = s[("DCGM_FI_DEV_FB_USED", "0")] + s[("DCGM_FI_DEV_FB_FREE", "0")]
    assert cuda_total == round(39.4 * 1024)
    assert s[("DCGM_FI_DEV_FB_TOTAL", "0")] == cuda_total + s[("DCGM_FI_DEV_FB_RESERVED", "0")] == 40960
    assert s[("DCGM_FI_DEV_FB_USED", "0")] / cuda_total == pytest.approx(0.9, abs=0.001)
    model.alive = False
    run(model, bank, gpus, 1)
    assert samples(bank.render(model.now).decode())[("DCGM_FI_DEV_FB_USED", "0")] == 0


def test_a_replica_that_dies_of_oom_fills_its_gpu_first() -> None:
    """Towards its OOM death a replica's framebuffer climbs past the GPUMemoryNearFull line (95 %)."""
    bank = GpuBank(ReplicaParams(), hostname="h")
    model, gpus = replica(), bank.allocate("vllm-0", "v1")
    run(model, bank, gpus, 2, oom=0.99)
    s = samples(bank.render(model.now).decode())
    assert s[("DCGM_FI_DEV_FB_USED", "0")] / (s[("DCGM_FI_DEV_FB_USED", "0")] + s[("DCGM_FI_DEV_FB_FREE", "0")]) > 0.95


def test_load_drives_utilization_power_temperature_and_clocks() -> None:
    """Busy GPUs run hot at full clock; idle ones report 0 % utilization, idle power and the GpuIdle reason."""
    bank = GpuBank(ReplicaParams(), hostname="h")
    model, gpus = replica(), bank.allocate("vllm-0", "v1")
    idle = bank.allocate("spare", "v1")
    bank.release(idle)
    for _ in range(120):
        run(model, bank, gpus, 1)
        bank.step(idle, None, BUSY, now=model.now, dt=1.0)
    s = samples(bank.render(model.now).decode())
    assert s[("DCGM_FI_DEV_GPU_UTIL", "0")] > 80 and s[("DCGM_FI_DEV_GPU_UTIL", "1")] == 0
    assert s[("DCGM_FI_DEV_POWER_USAGE", "0")] > 2 * s[("DCGM_FI_DEV_POWER_USAGE", "1")]
    assert s[("DCGM_FI_DEV_GPU_TEMP", "0")] > s[("DCGM_FI_DEV_GPU_TEMP", "1")] + 10
    assert s[("DCGM_FI_DEV_SM_CLOCK", "0")] == GpuParams().sm_clock_max_mhz
    assert (s[("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "0")], s[("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "1")]) == (0, 1)
    assert s[("DCGM_FI_DEV_FB_USED", "1")] == 0 and s[("DCGM_FI_DEV_XID_ERRORS", "0")] == 0


def test_tensor_parallel_traffic_crosses_nvlink_or_pcie_when_the_links_are_down() -> None:
    """TP=2 all-reduces show as NVLink bandwidth; with the links down (slow_interconnect) they move to PCIe."""
    bank = GpuBank(ReplicaParams(), hostname="h", tensor_parallel=2)
    model, gpus = replica(), bank.allocate("vllm-0", "v1")
    assert [g.index for g in gpus] == [0, 1]
    run(model, bank, gpus, 3)
    bank.render(model.now)
    run(model, bank, gpus, 2)
    text = bank.render(model.now).decode()
    s = samples(text)
    assert s[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "1")] > 100  # MB/s
    links = [v for name, _, v in parse(text) if name == "sre_agent_gpu_nvlink_up"]
    assert links == [1.0] * 24  # 12 NVLinks per A100-SXM4, all up
    pcie_nvlink = s[("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "0")]
    slow = Load(arrival_rate=11.0, tp_efficiency=0.1)
    run(model, bank, gpus, 2, load=slow)
    s = samples(bank.render(model.now).decode())
    assert s[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "0")] == 0
    assert s[("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "0")] > 10 * pcie_nvlink
    assert all(g.links_up is False for g in gpus)


def test_lmdeploy_takes_weights_plus_its_cache_share() -> None:
    """An LMDeploy replica's GPU holds the weights plus cache_max_entry_count (0.8) of what is left."""
    params, gpu = ReplicaParams(), GpuParams()
    bank = GpuBank(params, gpu, hostname="h")
    model, gpus = replica("lmdeploy"), bank.allocate("lmdeploy-0", "lmdeploy")
    run(model, bank, gpus, 2)
    total = 39.4 * 1024
    want = gpu.weights_gib * 1024 + 0.8 * (total - gpu.weights_gib * 1024)
    assert samples(bank.render(model.now).decode())[("DCGM_FI_DEV_FB_USED", "0")] == pytest.approx(want, abs=1)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet(FleetConfig(replicas=2, lmdeploy_replicas=1, base_port=0, speed=20.0, step_s=0.05))
    await f.start()
    yield f
    await f.stop()


async def test_the_gpu_exporter_port_serves_every_replicas_gpus(fleet: Fleet) -> None:
    """The exporter port serves one GPU per replica in text format 0.0.4; scale-in frees GPUs, scale-out reuses them."""
    await asyncio.sleep(0.3)
    assert fleet.dcgm_url is not None and fleet.dcgm_url not in fleet.targets
    async with aiohttp.ClientSession() as session:
        async with session.get(fleet.dcgm_url) as resp:
            assert resp.headers["Content-Type"] == CONTENT_TYPE
            text = await resp.text()
        async with session.get(fleet.control_url + "/state") as resp:
            state = await resp.json()
    assert {g for (name, g) in samples(text) if name == "DCGM_FI_DEV_GPU_UTIL"} == {"0", "1", "2"}
    assert state["gpu_exporter"] == fleet.dcgm_url
    assert [g["owner"] for g in state["gpus"]] == ["vllm-0", "vllm-1", "lmdeploy-0"]
    await fleet.scale_to(1)
    assert [g.owner for g in fleet.gpus.gpus] == ["vllm-0", "", "lmdeploy-0"]
    await fleet.scale_to(3)
    assert [g.owner for g in fleet.gpus.gpus] == ["vllm-0", "vllm-1", "lmdeploy-0", "vllm-2"]


async def test_no_gpu_exporter_when_dcgm_port_is_none() -> None:
    """dcgm_port=None starts no exporter (the simulator's replica and control ports are unchanged)."""
    f = Fleet(FleetConfig(replicas=1, base_port=0, dcgm_port=None))
    await f.start()
    try:
        assert f.dcgm_url is None and len(f.targets) == 1
    finally:
        await f.stop()


def test_cli_puts_the_exporter_two_ports_below_the_replicas() -> None:
    """`sre-agent simulate --port 8000` serves the GPUs on 7998; --dcgm-port -1 turns them off."""
    def cfg(**over: object) -> FleetConfig:
        base = {"replicas": 1, "lmdeploy": 0, "port": 8000, "scenario": "steady", "generation": "v1", "seed": 0,
                "speed": 1.0, "log_dir": None, "dcgm_port": None, "tensor_parallel": 1,
                "balance": "even"}
        return fleet_config(argparse.Namespace(**{**base, **over}))

    assert cfg().dcgm_port == 7998
    assert cfg(port=0).dcgm_port == 0
    assert cfg(dcgm_port=-1).dcgm_port is None
    assert cfg(dcgm_port=9400, tensor_parallel=4).tensor_parallel == 4


async def test_gpu_fault_injects_an_xid_and_a_down_nvlink(fleet: Fleet) -> None:
    """POST /gpu_fault records an XID as NVML's event would (63 adds a row remap) and takes one NVLink down."""
    async with aiohttp.ClientSession() as session:
        for body in ({"gpu": 1, "xid": 63}, {"gpu": 1, "nvlink_down": 4}):
            async with session.post(fleet.control_url + "/gpu_fault", json=body) as resp:
                assert resp.status == 200, await resp.text()
        async with session.post(fleet.control_url + "/gpu_fault", json={"gpu": 9, "xid": 79}) as resp:
            assert resp.status == 400 and "no GPU 9" in (await resp.json())["error"]
        await asyncio.sleep(0.2)  # the next model step renders the fault
        async with session.get(str(fleet.dcgm_url)) as resp:
            found = parse(await resp.text())
    s = {(n, lab.get("gpu"), lab.get("xid"), lab.get("link")): v for n, lab, v in found}
    assert s[("DCGM_FI_DEV_XID_ERRORS", "1", None, None)] == 63
    assert s[("sre_agent_gpu_xid_errors_total", "1", "63", None)] == 1
    assert s[("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "1", None, None)] == 1
    assert s[("sre_agent_gpu_nvlink_up", "1", None, "4")] == 0
    assert s[("sre_agent_gpu_nvlink_up", "1", None, "3")] == 1
    assert s[("DCGM_FI_DEV_XID_ERRORS", "0", None, None)] == 0
