"""Tests for agent.app.triggers: OOM evidence in tailed logs, a target that went down with its GPU
memory full, the diagnose action on alerts (GPU memory, nccl-tests with its cooldown), the
findings metrics, and one end-to-end OOM story through the in-process daemon and a real simulator.

Expected numbers are worked out by hand from the fixture lines and the stored samples; the
comments show the arithmetic.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.act.notification import AlertSnapshot
from agent.app.daemon import Agent
from agent.app.triggers import Diagnostics, DiagnosticsCollector
from agent.cli import main
from agent.config import Config, load_config
from agent.diagnose.findings import Finding
from agent.diagnose.nccl.run import run_nccl
from agent.diagnose.oom.evidence import parse_evidence
from agent.errors import ConfigError
from agent.series import labels_from
from agent.simulate.server import Fleet, FleetConfig
from agent.store import Store
from tests.conftest import FIXTURES, REPO
from tests.receivers import RecordingServer, free_port
from tests.simstore import MODEL as SIM_MODEL
from tests.simstore import simulated_store

LOGS = FIXTURES / "logs"
FAKE_NCCL = REPO / "tests" / "fake_all_reduce_perf.py"
T0 = 1_750_000_000.0  # 2025-06-15 15:06:40 UTC
MIB = 2**20
TOTAL_MIB = 80_000  # FB_USED + FB_FREE of the GPUs below (78.125 GiB)
DEADLINE_S = 60.0

Posted = list[tuple[Finding, AlertSnapshot | None]]


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fixture(name: str) -> list[str]:
    """A log fixture's lines without its ``# source:`` line."""
    lines = (LOGS / name).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source:")
    return lines[1:]


def _line(name: str, needle: str) -> str:
    (line,) = [ln for ln in _fixture(name) if needle in ln]
    return line


def _append(path: Path, *lines: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _config(**diagnostics: Any) -> Config:
    return Config.model_validate({"state": {"path": ":memory:"}, "diagnostics": diagnostics})


def _diagnostics(config: Config, store: Store | None = None, clock: Clock | None = None,
                 runner: Callable[..., Any] = run_nccl) -> tuple[Diagnostics, Posted]:
    posted: Posted = []
    d = Diagnostics(config, store or Store(3_600_000), lambda f, a: posted.append((f, a)),
                    clock=clock or Clock(), runner=runner)
    return d, posted


async def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {DEADLINE_S:g}s waiting for {what}")
        await asyncio.sleep(0.05)


# The runtime OOM of a vLLM V1 worker: 270 MiB requested on a 21.98 GiB GPU (1.2 %), so the
# advice gives back the default step of 0.05 from --gpu-memory-utilization.
V1_OOM = _line("torch_cuda_oom_v1_worker.txt", "torch.OutOfMemoryError")
# The real V1 engine start line (Qwen2-0.5B, not a planner preset), with tensor_parallel_size
# changed from 1 to 4 so that the weights advice (double the TP) shows where it came from.
ENGINE_TP4 = _line("vllm_v1_engine_start.txt", "with config:").replace("tensor_parallel_size=1,",
                                                                       "tensor_parallel_size=4,")
# The shape of vLLM's API-server start-up line (vllm/entrypoints log_non_default_args).
ARGS_095 = ("(APIServer pid=1) INFO 06-14 04:56:37 [api_utils.py:273] non-default args: "
            "{'model': '/home/nbw/model/Qwen2-0.5B/', 'gpu_memory_utilization': 0.95}")
ARGS_080 = ("(APIServer pid=1) INFO 06-14 05:10:02 [api_utils.py:273] non-default args: "
            "{'model': '/home/nbw/model/Qwen2-0.5B/', 'gpu_memory_utilization': 0.8}")


# ---- poll_logs ----------------------------------------------------------------------------------------


def test_oom_line_appended_to_a_tailed_log_is_a_runtime_finding(tmp_path: Path) -> None:
    """An OOM line appended after start is posted as gpu-oom-runtime with the line and log file; older ones are not."""
    log = tmp_path / "vllm.log"
    _append(log, _line("torch_cuda_oom_legacy_runtimeerror.txt", "CUDA out of memory"))
    d, posted = _diagnostics(_config(oom={"log_files": [str(log)]}))
    assert d.poll_logs() == [] and posted == []
    _append(log, V1_OOM)
    (f,) = d.poll_logs()
    assert (f.kind, f.severity, f.evidence) == ("gpu-oom-runtime", "critical", [V1_OOM])
    assert f.labels == {"gpu": "1", "log_file": str(log)}
    # --gpu-memory-utilization unknown: vLLM's default 0.9 is assumed, 0.9 - 0.05 = 0.85
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.85")
    assert posted == [(f, None)]
    assert d.findings_total == {"gpu-oom-runtime": 1}


def test_the_same_oom_line_again_within_ten_minutes_is_not_posted(tmp_path: Path) -> None:
    """The same evidence 5 minutes later posts nothing; 10 minutes and 1 second after the first post it does."""
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    d, posted = _diagnostics(_config(oom={"log_files": [str(log)]}), clock=clock)
    _append(log, V1_OOM)
    assert len(d.poll_logs()) == 1
    clock.now = T0 + 300
    _append(log, V1_OOM)
    assert d.poll_logs() == [] and len(posted) == 1
    clock.now = T0 + 601
    _append(log, V1_OOM)
    assert len(d.poll_logs()) == 1 and len(posted) == 2
    assert d.findings_total == {"gpu-oom-runtime": 2}


def test_engine_start_line_earlier_in_the_file_is_context(tmp_path: Path) -> None:
    """A weights OOM after the engine line's TP 4 advises TP 8; in a file without that line, 1 -> 2."""
    weights = _fixture("torch_cuda_oom_legacy_weights_vllm.txt")
    with_engine, without = tmp_path / "a.log", tmp_path / "b.log"
    with_engine.touch()
    without.touch()
    d, _ = _diagnostics(_config(oom={"log_files": [str(tmp_path / "*.log")]}))
    _append(with_engine, "INFO 12-04 23:05:30 [api_server.py:1880] vLLM API server version 0.12.0", ENGINE_TP4)
    assert d.poll_logs() == []
    _append(with_engine, *weights)
    _append(without, *weights)
    found = {f.labels["log_file"]: f for f in d.poll_logs()}
    a, b = found[str(with_engine)], found[str(without)]
    assert (a.kind, a.setting, a.suggested_value) == ("gpu-oom-startup-weights", "--tensor-parallel-size", "8")
    assert a.details["tensor_parallel_size"] == 4
    assert (b.kind, b.setting, b.suggested_value) == ("gpu-oom-startup-weights", "--tensor-parallel-size", "2")
    assert a.evidence == b.evidence == [weights[-1]]


def test_arguments_logged_before_the_agent_started_are_context(tmp_path: Path) -> None:
    """Utilization 0.95 logged before the agent started: a later runtime OOM advises 0.95 - 0.05 = 0.90."""
    log = tmp_path / "vllm.log"
    _append(log, ARGS_095, ENGINE_TP4, "INFO 06-14 04:58:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0")
    d, _ = _diagnostics(_config(oom={"log_files": [str(log)]}))
    _append(log, V1_OOM)
    (f,) = d.poll_logs()
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.90")
    assert f.details["gpu_memory_utilization"] == 0.95 and f.details["gpu_memory_utilization_assumed"] is False


#: Request-log lines (vLLM's request logger, three generations) whose prompt quotes the start-up lines.
QUOTED_START_UP = [
    "INFO 06-14 05:00:00 logger.py:37] Received request cmpl-1: prompt: {q!r}, params: SamplingParams(n=1), "
    "prompt_token_ids: [1], lora_request: None.",
    "(APIServer pid=1) DEBUG 06-14 05:00:00 [logger.py:35] Request chatcmpl-1 details: prompt: {q!r}, "
    "prompt_token_ids: [1], prompt_embeds shape: None.",
    "(APIServer pid=1) INFO 06-14 05:00:00 [logger.py:41] Received request chatcmpl-1: params: "
    "SamplingParams(n=1, stop=[{q!r}]), lora_request: None.",
]


@pytest.mark.parametrize("shape", QUOTED_START_UP)
@pytest.mark.parametrize("primed", [True, False])
def test_a_prompt_quoting_start_up_lines_is_not_context(tmp_path: Path, shape: str, primed: bool) -> None:
    """A prompt that quotes start-up lines (args at 0.1, a 1 MB prompt) neither replaces the engine's real
    ones (0.95) nor starts a new run, whether it was logged before the agent started or after: 0.90."""
    log = tmp_path / "vllm.log"
    prompt = ARGS_080.replace("0.8", "0.1") + " " + ENGINE_TP4 + " " + "x" * (1 << 20)
    _append(log, ARGS_095)
    if primed:
        _append(log, shape.format(q=prompt))
    d, _ = _diagnostics(_config(oom={"log_files": [str(log)]}))
    if not primed:
        _append(log, shape.format(q=prompt))
        assert d.poll_logs() == []
    _append(log, V1_OOM)
    (f,) = d.poll_logs()
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.90")
    assert f.details["gpu_memory_utilization"] == 0.95


def test_a_restarted_server_drops_the_previous_runs_start_up_lines(tmp_path: Path) -> None:
    """A server restart (args 0.8) drops the first run's TP 4 (weights: 1 -> 2); a runtime OOM gives 0.75."""
    log = tmp_path / "vllm.log"
    log.touch()
    d, _ = _diagnostics(_config(oom={"log_files": [str(log)]}))
    _append(log, ARGS_095, ENGINE_TP4)
    assert d.poll_logs() == []
    _append(log, ARGS_080)
    assert d.poll_logs() == []
    _append(log, *_fixture("torch_cuda_oom_legacy_weights_vllm.txt"))
    (weights,) = d.poll_logs()
    assert (weights.kind, weights.suggested_value) == ("gpu-oom-startup-weights", "2")
    _append(log, V1_OOM)
    (runtime,) = d.poll_logs()
    assert (runtime.kind, runtime.suggested_value) == ("gpu-oom-runtime", "0.75")


def test_kernel_oom_killer_lines_are_host_oom(tmp_path: Path) -> None:
    """Two kernel 'Out of memory: Killed process' lines: one host-oom finding, assumed 4 GiB --swap-space -> 2."""
    log = tmp_path / "kern.log"
    log.touch()
    d, posted = _diagnostics(_config(oom={"log_files": [str(log)]}))
    lines = _fixture("kernel_oom_killer_journald.txt")
    _append(log, *lines)
    (f,) = d.poll_logs()
    assert (f.kind, f.setting, f.suggested_value) == ("host-oom", "--swap-space", "2")
    assert f.evidence == [lines[0], lines[2]]
    assert f.details["killed"] == ["(resolved) (15925)", "python3 (15784)"]
    assert f.labels == {"log_file": str(log)} and posted == [(f, None)]


def test_no_log_files_configured_polls_nothing() -> None:
    """Without diagnostics.oom.log_files there is nothing to tail."""
    d, posted = _diagnostics(_config())
    assert d.poll_logs() == [] and posted == []


# ---- check_targets --------------------------------------------------------------------------------------


def _gpu(store: Store, host: str, gpu: str, used_mib: dict[float, float]) -> None:
    """dcgm-exporter's FB_USED/FB_FREE (MiB) for one GPU at the given times (seconds)."""
    labels = {"Hostname": host, "gpu": gpu, "UUID": f"GPU-{host}-{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
              "device": f"nvidia{gpu}", "instance": f"{host}.dcgm:9400", "job": "dcgm-exporter"}
    for t, used in sorted(used_mib.items()):
        store.append(labels_from("DCGM_FI_DEV_FB_USED", labels), int(t * 1000), used)
        store.append(labels_from("DCGM_FI_DEV_FB_FREE", labels), int(t * 1000), TOTAL_MIB - used)


def _history(peak_mib: float, peak_at: float, base_mib: float = 70_000) -> dict[float, float]:
    """Every 15 s over the last 10 minutes at ``base_mib``, ``peak_mib`` at ``peak_at``."""
    points = {T0 - 600 + 15 * i: base_mib for i in range(41)}
    points[peak_at] = peak_mib
    return points


def test_target_down_after_gpu_memory_near_full_is_critical() -> None:
    """Up -> down after its host's GPU hit 97 %: critical gpu-oom-runtime with instance, peak and 0.92 -> 0.87."""
    store = Store(3_600_000)
    _gpu(store, "gpu-node-1", "0", _history(77_600, T0 - 60))  # 77600 / 80000 = 97.0 %
    _gpu(store, "gpu-node-2", "0", _history(79_900, T0 - 30))
    info = {"instance": "gpu-node-1:8000", "job": "vllm", "gpu_memory_utilization": "0.92", "block_size": "16"}
    store.append(labels_from("vllm:cache_config_info", info), int((T0 - 15) * 1000), 1.0)
    d, posted = _diagnostics(_config(), store)
    assert d.check_targets([("gpu-node-1:8000", "up")]) == []
    (f,) = d.check_targets([("gpu-node-1:8000", "down")])
    assert (f.kind, f.severity, f.labels) == ("gpu-oom-runtime", "critical", {"instance": "gpu-node-1:8000"})
    assert f.summary.startswith("gpu-node-1:8000 went down after GPU memory reached 97%")
    # 77600 MiB = 75.78 GiB of 80000 MiB = 78.125 GiB, at T0 - 60 s = 15:05:40 UTC
    assert f.evidence == ["gpu-node-1:8000: GPU memory peaked at 97.0% (75.8 of 78.1 GiB) at 2025-06-15 15:05:40Z",
                          "gpu-node-1:8000: scrape failed right after (target down)"]
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.87")
    assert f.details["gpu_memory_used_bytes"] == 77_600 * MIB and f.details["gpu_memory_total_bytes"] == 80_000 * MIB
    assert posted == [(f, None)]


def test_flapping_target_is_reported_once() -> None:
    """Down, up, down again with the same peak: the second down posts nothing (same finding within 10 min)."""
    store = Store(3_600_000)
    _gpu(store, "gpu-node-1", "0", _history(77_600, T0 - 60))
    d, posted = _diagnostics(_config(), store)
    for health in ("up", "down", "up", "down"):
        d.check_targets([("gpu-node-1:8000", health)])
    assert len(posted) == 1


@pytest.mark.parametrize(("peak_mib", "peak_at"), [
    (64_000, T0 - 60),  # 80 %: well below the 95 % threshold
    (77_600, T0 - 360),  # 97 %, but six minutes ago: only the last 5 minutes count
])
def test_target_down_without_a_recent_near_full_peak_is_not_an_oom(peak_mib: float, peak_at: float) -> None:
    """Up -> down with the GPU at most 87.5 % in the last 5 minutes: no finding."""
    store = Store(3_600_000)
    _gpu(store, "gpu-node-1", "0", _history(peak_mib, peak_at))
    d, posted = _diagnostics(_config(), store)
    assert d.check_targets([("gpu-node-1:8000", "up")]) == []
    assert d.check_targets([("gpu-node-1:8000", "down")]) == [] and posted == []


def test_target_that_was_never_up_is_not_examined() -> None:
    """Unknown -> down and down -> down (never up) post nothing even with the GPU at 97 %."""
    store = Store(3_600_000)
    _gpu(store, "gpu-node-1", "0", _history(77_600, T0 - 60))
    d, posted = _diagnostics(_config(), store)
    assert d.check_targets([("gpu-node-1:8000", "down")]) == []
    assert d.check_targets([("gpu-node-1:8000", "unknown"), ("gpu-node-2:8000", "down")]) == []
    assert d.check_targets([("gpu-node-1:8000", "down"), ("gpu-node-2:8000", "down")]) == []
    assert posted == []


# ---- on_alert ----------------------------------------------------------------------------------------


def _alert(name: str, **labels: str) -> AlertSnapshot:
    return AlertSnapshot(labels={"alertname": name, "severity": "warning", **labels}, annotations={},
                         status="firing", starts_at_ms=int((T0 - 900) * 1000))


def test_gpu_memory_alert_gets_the_memory_picture_of_its_gpu() -> None:
    """GPUMemoryNearFull for GPU 1 of gpu-node-1: a warning with the alert, on GPU 1's 96 %, not GPU 0's 99 %."""
    store = Store(3_600_000)
    _gpu(store, "gpu-node-1", "0", _history(79_200, T0 - 120))
    _gpu(store, "gpu-node-1", "1", _history(76_800, T0 - 120))  # 76800 / 80000 = 96 %, 75.0 GiB
    _gpu(store, "gpu-node-2", "0", _history(79_900, T0 - 120))
    d, posted = _diagnostics(_config(), store)
    alert = _alert("GPUMemoryNearFull", Hostname="gpu-node-1", gpu="1", UUID="GPU-gpu-node-1-1",
                   instance="gpu-node-1.dcgm:9400", job="dcgm-exporter")
    d.on_alert(alert)
    ((f, with_alert),) = posted
    assert with_alert is alert
    assert (f.kind, f.severity) == ("gpu-oom-runtime", "warning")
    assert f.summary.startswith("GPU memory on gpu-node-1 reached 96%")
    assert f.evidence == ["gpu-node-1: GPU memory peaked at 96.0% (75.0 of 78.1 GiB) at 2025-06-15 15:04:40Z"]
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.85")


def test_gpu_memory_alert_without_memory_history_posts_nothing() -> None:
    """No DCGM series for the alert's GPU: nothing to say."""
    d, posted = _diagnostics(_config())
    d.on_alert(_alert("GPUMemoryNearFull", Hostname="gpu-node-1", gpu="0"))
    d.on_alert(_alert("VLLMKVCacheSaturated", instance="gpu-node-1:8000"))
    assert posted == []


def _nccl_config(oom: dict[str, Any] | None = None, **nccl: Any) -> Config:
    # 1, 2, 4 and 8 GiB on 8 fake GPUs at a 20 GB/s plateau: the 8 GiB row's busbw is
    # 20 x 8192 / (8192 + 64) = 19.845, printed "19.84"; the footer's average is 20 / 2 = 10.
    return _config(nccl={"enabled": True, "launcher": [sys.executable], "binary": str(FAKE_NCCL),
                         "args": ["-b", "1G", "-e", "8G", "-f", "2", "--fake-busbw", "20"], "gpus": 8,
                         "expected_gbps": 230, "timeout": "60s", **nccl}, oom=oom or {})


class CountingRunner:
    """The real runner, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, cmd: list[str], *, timeout_s: float) -> tuple[int, str]:
        self.calls.append(cmd)
        return await run_nccl(cmd, timeout_s=timeout_s)


async def test_throughput_alert_runs_nccl_tests_once_per_cooldown() -> None:
    """The throughput alert runs nccl-tests (19.84 of 230 GB/s: low, posted with it); again only after cooldown."""
    clock, runner = Clock(), CountingRunner()
    d, posted = _diagnostics(_nccl_config(), clock=clock, runner=runner)
    alert = _alert("VLLMGenerationThroughputLow", instance="gpu-node-1:8000", model_name="m")
    d.on_alert(alert)
    await _until(lambda: d.nccl_last is not None, "the nccl-tests run")
    assert d.nccl_last is not None
    result, verdict, at_ms = d.nccl_last
    assert (verdict, result.peak_busbw_gbps, result.avg_busbw_gbps, result.ranks) == ("low", 19.84, 10.0, 8)
    assert at_ms == T0 * 1000
    assert runner.calls == [[sys.executable, str(FAKE_NCCL), "-b", "1G", "-e", "8G", "-f", "2", "--fake-busbw", "20",
                             "-g", "8"]]
    ((f, with_alert),) = posted
    assert with_alert is alert and (f.kind, f.severity) == ("nccl-bandwidth-low", "warning")
    assert f.summary.startswith("peak busbw 19.84 GB/s is 9% of the 230 GB/s expected")  # 19.84 / 230 = 8.6 %

    clock.now = T0 + 60
    d.on_alert(alert)
    await asyncio.sleep(0)  # a task created by on_alert would have called the runner by now
    assert len(runner.calls) == 1

    clock.now = T0 + 3601
    d.on_alert(alert)
    await _until(lambda: d.nccl_last is not None and d.nccl_last[2] == (T0 + 3601) * 1000, "the second run")
    assert len(runner.calls) == 2


async def test_nccl_disabled_runs_nothing() -> None:
    """diagnostics.nccl.enabled false: the throughput alert starts no run."""
    runner = CountingRunner()
    d, posted = _diagnostics(_nccl_config(enabled=False), runner=runner)
    d.on_alert(_alert("VLLMGenerationThroughputLow", instance="gpu-node-1:8000"))
    await asyncio.sleep(0)
    assert runner.calls == [] and d.nccl_last is None and posted == []


async def test_first_alert_run_is_allowed_with_a_clock_that_starts_near_zero() -> None:
    """A monotonic-style clock at 100 s is not mistaken for 'a run 100 s ago' by the cooldown."""
    ran: list[list[str]] = []

    async def runner(cmd: list[str], *, timeout_s: float) -> tuple[int, str]:
        ran.append(cmd)
        return 0, (REPO / "tests" / "fixtures" / "nccl" / "a100x8_nvswitch_allreduce.txt").read_text()

    d, _ = _diagnostics(_nccl_config(), clock=Clock(100.0), runner=runner)
    d.on_alert(_alert("VLLMGenerationThroughputLow"))
    await _until(lambda: d.nccl_last is not None, "the nccl-tests run")
    assert len(ran) == 1


def test_unknown_interconnect_is_refused_at_start_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A diagnostics.nccl.interconnect missing from the bandwidth table stops `check`, `run` and the
    diagnostics themselves with a config error naming the key and the known keys."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("diagnostics: {nccl: {enabled: true, interconnect: no-such-link}}\n")
    for command in (["check", "--config", str(cfg)], ["run", "--once", "--config", str(cfg)],
                    ["nccl", "--config", str(cfg), "--parse", str(cfg)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "diagnostics.nccl.interconnect: unknown interconnect 'no-such-link'" in err, command
        assert "a100-nvswitch" in err
    with pytest.raises(ConfigError, match=r"diagnostics\.nccl\.interconnect: unknown interconnect"):
        _diagnostics(load_config(cfg, {}))


async def test_log_scan_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While megabytes of hostile log (a 1 MB prompt quoting an OOM, lines of backtracking bait) are read
    and matched, the event loop keeps ticking: the scan runs in a worker thread; the real OOM behind them
    is still found, and the cut lines are counted on /metrics."""
    log = tmp_path / "vllm.log"
    log.touch()
    d, _ = _diagnostics(_config(oom={"log_files": [str(log)]}))
    scanned_on: set[int] = set()

    def parse(lines: list[str]) -> Any:
        scanned_on.add(threading.get_ident())
        return parse_evidence(lines)

    monkeypatch.setattr("agent.app.logwatch.parse_evidence", parse)
    prompt = ("CUDA out of memory. Tried to allocate 1.00 GiB " + " " * 64) * ((1 << 20) // 112)  # 1 MB
    _append(log, f"INFO 05-08 14:46:11 [logger.py:39] Received request x: prompt: {prompt!r}, params: None",
            *["Killed process 1 (" * ((16 << 10) // 18)] * 64, "1" * (2 << 20), V1_OOM)  # 64 x 16 KiB, 2 MB
    ticks: list[float] = []

    async def heartbeat() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    beat = asyncio.get_running_loop().create_task(heartbeat())
    found: list[Finding] = []
    try:
        await _until(lambda: ticks, "the first heartbeat")
        deadline = time.monotonic() + DEADLINE_S
        while not found and time.monotonic() < deadline:
            found += await d.poll_logs_async()
        ticks.append(time.monotonic())
    finally:
        beat.cancel()
    assert [f.kind for f in found] == ["gpu-oom-runtime"] and found[0].evidence == [V1_OOM]
    assert scanned_on and threading.get_ident() not in scanned_on
    assert max(b - a for a, b in itertools.pairwise(ticks)) < 0.5
    registry = CollectorRegistry()
    registry.register(DiagnosticsCollector(d))
    assert [s.value for s in _families(registry)["sre_agent_oom_log_lines_cut"].samples] == [2.0]


# ---- DiagnosticsCollector ----------------------------------------------------------------------------


def _families(registry: CollectorRegistry) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


async def test_collector_exports_findings_and_the_last_nccl_run(tmp_path: Path) -> None:
    """After an OOM finding and an nccl-tests run: findings by kind, busbw by stat, ok 0, wrong 0, run time."""
    log = tmp_path / "vllm.log"
    log.touch()
    d, _ = _diagnostics(_nccl_config(oom={"log_files": [str(log)]}))
    registry = CollectorRegistry()
    registry.register(DiagnosticsCollector(d))
    before = _families(registry)
    assert before["sre_agent_findings"].samples == [] and "sre_agent_nccl_ok" not in before

    _append(log, V1_OOM)
    d.poll_logs()
    await d.run_nccl_now(reason="test")
    fams = _families(registry)
    found = {(s.name, s.labels["kind"]): s.value for s in fams["sre_agent_findings"].samples}
    assert found == {("sre_agent_findings_total", "gpu-oom-runtime"): 1.0,
                     ("sre_agent_findings_total", "nccl-bandwidth-low"): 1.0}
    busbw = {s.labels["stat"]: s.value for s in fams["sre_agent_nccl_busbw_gbps"].samples}
    assert busbw == {"peak": 19.84, "avg": 10.0}
    assert {s.labels["collective"] for s in fams["sre_agent_nccl_busbw_gbps"].samples} == {"all_reduce"}
    assert [s.value for s in fams["sre_agent_nccl_ok"].samples] == [0.0]
    assert [s.value for s in fams["sre_agent_nccl_wrong_total"].samples] == [0.0]
    assert [s.value for s in fams["sre_agent_nccl_last_run_timestamp_seconds"].samples] == [T0]


# ---- end to end: the in-process daemon, the simulator's OOM, a webhook receiver ----------------------------


async def test_simulated_replica_oom_reaches_the_webhook(tmp_path: Path) -> None:
    """A simulated replica's CUDA OOM reaches the webhook as a gpu-oom-runtime finding and /metrics counts it."""
    receiver = await RecordingServer().start()
    logs = tmp_path / "logs"
    port = free_port()  # the agent is built before the replica exists, so its tailer reads the whole new log
    # oom: replica 0 dies at 90 s of model time; 30 model seconds per wall second -> about 3 s.
    fleet = Fleet(FleetConfig(replicas=1, lmdeploy_replicas=0, scenario="oom", log_dir=logs, base_port=port,
                              control_port=0, step_s=0.2, speed=30))
    config = Config.model_validate({
        "targets": [{"url": f"http://127.0.0.1:{port}/metrics"}],
        "server": {"listen": "127.0.0.1:0"},
        "scrape": {"interval": "1s", "timeout": "1s"},
        "nvml": {"enabled": False},
        "state": {"path": str(tmp_path / "state.db")},
        "receivers": [{"name": "hook", "webhook": {"url": receiver.url("/hook")}}],
        "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "notify": {"dispatch_interval": "200ms", "retry_initial": "200ms", "retry_max": "1s"},
        "diagnostics": {"oom": {"log_files": [str(logs / "vllm-*.log")]}},
    })
    agent = Agent(config)
    try:
        await fleet.start()
        await agent.start()

        def finding() -> dict[str, Any] | None:
            bodies = [r.json() for r in receiver.posts("/hook")]
            return next((b["finding"] for b in bodies if b.get("kind") == "finding"
                         and b["finding"]["kind"] == "gpu-oom-runtime"), None)

        await _until(finding, "a gpu-oom-runtime finding on the webhook")
        f = finding()
        assert f is not None
        log_file = logs / "vllm-0.log"
        (oom_line,) = [ln for ln in log_file.read_text(encoding="utf-8").splitlines()
                       if "torch.OutOfMemoryError" in ln]
        assert oom_line in f["evidence"]
        assert f["labels"]["log_file"] == str(log_file)
        # the simulator asks for at most 1024 + 300 MiB of 39.4 GiB (3.3 %): the 0.05 step from the assumed 0.9
        assert (f["setting"], f["suggested_value"]) == ("--gpu-memory-utilization", "0.85")
        # no alert behind it: the finding goes to the root route's receiver and joins no incident
        recorded = [i for i in await agent.incidents_json() if i["alertname"] == "gpu-oom-runtime"]
        assert recorded and [e["kind"] for e in recorded[0]["events"]] == ["finding"]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{agent.port}/metrics") as r:
            text = await r.text()
        fams = {fam.name: fam for fam in text_string_to_metric_families(text)}
        counts = {s.labels["kind"]: s.value for s in fams["sre_agent_findings"].samples}
        assert counts == {"gpu-oom-runtime": 1.0}
    finally:
        await agent.stop()
        await fleet.stop()
        await receiver.stop()


# ---- capacity advice on the KV-saturation and scale-out alerts ----------------------------------------


def test_kv_saturation_alert_gets_the_replicas_capacity_advice() -> None:
    """VLLMKVCacheSaturated on a replica that ran the simulator's kv_pressure scenario: one kv-cache-capacity
    warning posted with the alert, about that instance, with its capacity from cache_config_info; its queue (far
    above 2x running) makes the change more replicas, with --max-num-seqs among the alternatives; the other
    replica in the store is not mentioned."""
    store = simulated_store("kv_pressure", 900, t0_s=T0 - 900)
    simulated_store("steady", 900, t0_s=T0 - 900, instance="gpu-node-2:8000", store=store)
    d, posted = _diagnostics(_config(), store)
    alert = _alert("VLLMKVCacheSaturated", instance="gpu-node-1:8000", job="vllm", model_name=SIM_MODEL)
    d.on_alert(alert)
    ((f, with_alert),) = posted
    assert with_alert is alert
    assert (f.kind, f.severity, f.setting) == ("kv-cache-capacity", "warning", "replicas")
    assert int(f.suggested_value.removeprefix("+")) >= 1
    assert any(a.startswith("--max-num-seqs ") for a in f.details["alternatives"])
    assert f.labels == {"instance": "gpu-node-1:8000", "job": "vllm", "model_name": SIM_MODEL}
    assert f.evidence[0].startswith("gpu-node-1:8000: KV cache 8,192 blocks × 16 tokens = 131,072 tokens")
    assert f.runbook_url.endswith("/diagnosis-kv-cache-capacity.md")
    assert d.findings_total == {"kv-cache-capacity": 1}


def test_scale_out_alert_advises_every_replica_of_its_job() -> None:
    """VLLMScaleOutNeeded names a job and model, not an instance: each replica of it gets its advice, and
    under the simulator's surge that is more replicas."""
    store = simulated_store("surge", 600, t0_s=T0 - 600)
    simulated_store("surge", 600, t0_s=T0 - 600, instance="gpu-node-2:8000", store=store, seed=8)
    d, posted = _diagnostics(_config(), store)
    d.on_alert(_alert("VLLMScaleOutNeeded", job="vllm", model_name=SIM_MODEL, action="scale_out"))
    assert [f.labels["instance"] for f, _ in posted] == ["gpu-node-1:8000", "gpu-node-2:8000"]
    assert {f.setting for f, _ in posted} == {"replicas"}


def test_capacity_alert_without_cache_config_posts_nothing() -> None:
    """A store without vllm:cache_config_info (LMDeploy, or an engine still starting) gives no advice."""
    d, posted = _diagnostics(_config())
    d.on_alert(_alert("VLLMPreemptionsSustained", instance="gpu-node-1:8000", job="vllm"))
    assert posted == []


class _FakeHistory:
    """RemoteHistory's fetch over a prepared store, recording the selectors it was asked for."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.asked: list[tuple[list[str], int, int]] = []

    def fetch(self, selectors: list[str], start_ms: int, end_ms: int) -> Store:
        self.asked.append((selectors, start_ms, end_ms))
        return self.store


async def test_prometheus_mode_reads_the_replicas_history_from_the_server() -> None:
    """In Prometheus mode the capacity advice asks the server for the instance's six vLLM series over the last
    15 minutes (off the event loop), then posts the same finding as from the embedded store."""
    history = _FakeHistory(simulated_store("kv_pressure", 900, t0_s=T0 - 900))
    posted: Posted = []
    d = Diagnostics(_config(), Store(3_600_000), lambda f, a: posted.append((f, a)), clock=Clock(),
                    history=history)  # type: ignore[arg-type]
    try:
        d.on_alert(_alert("VLLMPreemptionsSustained", instance="gpu-node-1:8000", job="vllm"))
        await _until(lambda: posted, "the capacity finding")
    finally:
        await d.stop()
    ((selectors, start, end),) = history.asked
    assert selectors == ['{__name__=~"vllm:(cache_config_info|kv_cache_usage_perc|gpu_cache_usage_perc|'
                         'num_requests_running|num_requests_waiting|num_preemptions_total)",'
                         'instance="gpu-node-1:8000",job="vllm"}']
    assert end - start == 15 * 60_000
    assert posted[0][0].kind == "kv-cache-capacity" and posted[0][0].labels["instance"] == "gpu-node-1:8000"
