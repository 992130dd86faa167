"""The OOM verdict: each real fixture gives the right kind, its evidence lines and a concrete
value, worked out by hand in each test's comments; the daemon's context (and a store filled
with vLLM's cache config and DCGM memory) changes the value the way the brief says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding
from agent.diagnose.oom.verdict import KINDS, OomContext, context_from_store, diagnose_oom, planner_suggestion
from agent.diagnose.plan import planner
from agent.series import labels_from
from agent.store import Store
from tests.conftest import FIXTURES, REPO

LOGS = FIXTURES / "logs"
GiB = 2**30


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    """Capture the verdict's debug events (whatever another test left structlog pointing at)."""
    with capture_logs():
        yield


def _text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def _only(name: str, context: OomContext | None = None) -> Finding:
    findings = diagnose_oom(_text(name), context=context)
    assert len(findings) == 1, [f.kind for f in findings]
    return findings[0]


def _line(name: str, contains: str) -> str:
    return next(ln for ln in _text(name).splitlines()[1:] if contains in ln)


# -- GPU OOM at runtime ----------------------------------------------------------------------------
def test_runtime_oom_lowers_utilization_by_a_step() -> None:
    """270 MiB of 21.98 GiB is 1.2 %, under the 0.05 step: 0.9 (vLLM's default, assumed) - 0.05 = 0.85."""
    f = _only("torch_cuda_oom_v1_worker.txt")
    assert (f.kind, f.severity, f.setting, f.suggested_value) == (
        "gpu-oom-runtime", "critical", "--gpu-memory-utilization", "0.85")
    assert f.evidence == [_line("torch_cuda_oom_v1_worker.txt", "OutOfMemoryError")]
    assert f.details["gpu_memory_utilization_assumed"] is True
    assert (f.details["requested_gib"], f.details["total_gib"], f.details["gpu"]) == (0.26, 21.98, 1)
    assert f.labels == {"gpu": "1"}
    assert f.runbook_url == DEFAULT_RUNBOOK_BASE + "diagnosis-gpu-oom-runtime.md"


def test_runtime_oom_frees_the_requested_share() -> None:
    """1.16 GiB of 7.75 GiB is 14.97 %, rounded up 0.15 > 0.05: 0.9 - 0.15 = 0.75."""
    f = _only("torch_cuda_oom_v1_small_gpu.txt")
    assert (f.setting, f.suggested_value) == ("--gpu-memory-utilization", "0.75")


def test_runtime_oom_while_serving_with_known_utilization() -> None:
    """The serving phase is named; 3.82 of 79.14 GiB (4.8 %) -> the 0.05 step from the context's 0.8: 0.75.
    The single 'Process N has' entry is the server itself, not contention."""
    f = _only("torch_cuda_oom_serving_vllm.txt", OomContext(gpu_memory_utilization=0.8))
    assert (f.kind, f.suggested_value, f.details["phase"]) == ("gpu-oom-runtime", "0.75", "serving")
    assert "while serving" in f.summary
    assert f.details["gpu_memory_utilization_assumed"] is False


def test_legacy_runtime_oom() -> None:
    """The PyTorch 1.x wording gives the same verdict: 236 MiB of 15.78 GiB -> 0.85."""
    f = _only("torch_cuda_oom_legacy_runtimeerror.txt")
    assert (f.kind, f.suggested_value) == ("gpu-oom-runtime", "0.85")


def test_fragmentation_suggests_expandable_segments() -> None:
    """736.86 MiB reserved-but-unallocated would have covered the 546 MiB request: fragmentation."""
    f = _only("torch_cuda_oom_fragmented_vllm.txt")
    assert (f.setting, f.suggested_value) == ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert f.details["fragmentation"] is True
    assert "--gpu-memory-utilization 0.85" in f.details["alternatives"]


def test_oversized_allocation_lowers_batched_tokens() -> None:
    """16 GiB of 44.53 GiB (36 %) cannot be fixed by utilization: halve --max-num-batched-tokens
    (4096 assumed -> 2048; a logged 8192 -> 4096)."""
    f = _only("torch_cuda_oom_oversized_vllm.txt")
    assert (f.setting, f.suggested_value) == ("--max-num-batched-tokens", "2048")
    args = "INFO 01-01 00:00:00 [api_server.py:1] non-default args: {'max_num_batched_tokens': 8192}\n"
    (g,) = diagnose_oom(args + _text("torch_cuda_oom_oversized_vllm.txt"))
    assert g.suggested_value == "4096"


# -- start-up failures -------------------------------------------------------------------------
def test_weights_do_not_fit() -> None:
    """An OOM inside the model's constructor: double TP (1 -> 2; with TP 2 known -> 4)."""
    f = _only("torch_cuda_oom_legacy_weights_vllm.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("gpu-oom-startup-weights", "--tensor-parallel-size", "2")
    assert f.evidence == [_line("torch_cuda_oom_legacy_weights_vllm.txt", "torch.cuda.OutOfMemoryError")]
    assert _only("torch_cuda_oom_legacy_weights_vllm.txt", OomContext(tensor_parallel_size=2)).suggested_value == "4"


def test_v0_kv_cache_too_small() -> None:
    """V0: the cache holds 3664 tokens (229 blocks x 16), already a multiple of 16."""
    f = _only("vllm_v0_engine_max_seq_len.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("gpu-oom-startup-kv-cache", "--max-model-len", "3664")
    assert f.evidence == [_line("vllm_v0_engine_max_seq_len.txt", "ValueError")]


def test_v0_kv_cache_with_memory_profile_names_the_utilization_alternative() -> None:
    """23648 tokens; full 29000 needs 2.89 GiB x (29000/23648 - 1) = 0.654 GiB more of 23.58 GiB:
    0.9 + 0.0277 = 0.9277 -> 0.93."""
    f = _only("vllm_v0_profile_max_seq_len.txt")
    assert f.suggested_value == "23648"
    assert f.details["alternative"] == "--gpu-memory-utilization 0.93"


def test_v1_kv_cache_uses_vllms_estimate() -> None:
    """V1 printed 'estimated maximum model length is 5632' (= 352 x 16)."""
    f = _only("vllm_v1_kv_cache_estimate.txt")
    assert (f.setting, f.suggested_value, f.details["source"]) == ("--max-model-len", "5632", "vLLM's estimate")


def test_v1_kv_cache_without_estimate_scales_linearly() -> None:
    """1048576 x 9.97 / 24.00 = 435598.5 -> 435598 -> down to a multiple of 16: 435584."""
    f = _only("vllm_v1_kv_cache_no_estimate.txt")
    assert (f.suggested_value, f.details["source"]) == ("435584", "linear estimate")


def test_no_cache_blocks_raises_utilization() -> None:
    """No KV memory at all at 0.9 (assumed): 0.95; with 0.95 already, the weights do not fit: TP 2."""
    f = _only("vllm_v0_no_cache_blocks.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("gpu-oom-startup-kv-cache", "--gpu-memory-utilization", "0.95")
    assert f.evidence == [_line("vllm_v0_no_cache_blocks.txt", "ValueError: No available memory")]
    g = _only("vllm_v0_no_cache_blocks.txt", OomContext(gpu_memory_utilization=0.95))
    assert (g.kind, g.suggested_value) == ("gpu-oom-startup-weights", "2")


def test_free_memory_at_startup_is_contention() -> None:
    """7.34 of 139.72 GiB free: 5.25 % - 1 % = 0.0425 -> 0.04; 19.77/22.05 = 89.66 % - 1 % -> 0.88."""
    f = _only("vllm_v1_free_memory_startup.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("gpu-memory-contention", "--gpu-memory-utilization", "0.04")
    assert f.details["held_by_others_gib"] == round(139.72 - 7.34, 2)
    named = _only("vllm_v1_free_memory_device_named.txt")
    assert (named.suggested_value, named.labels) == ("0.88", {"gpu": "1"})


def test_other_process_in_torch_oom_is_contention() -> None:
    """Process 477367 (28.19 GiB) matches PyTorch's 27.48 GiB: the other, 50.52 GiB, is someone else's.
    (79.11 - 50.52) / 79.11 = 36.1 % - 1 % -> 0.35."""
    f = _only("torch_cuda_oom_other_process_vllm.txt")
    assert (f.kind, f.suggested_value, f.details["held_by_others_gib"]) == ("gpu-memory-contention", "0.35", 50.52)


# -- KV pressure, host and container memory --------------------------------------------------------
def test_preemption() -> None:
    """Preemption at 0.9 (assumed) -> 0.95; at 0.95 without a planner preset -> 256 x 3/4 = 192 seqs."""
    f = _only("vllm_v0_preemption_warning.txt")
    assert (f.kind, f.severity, f.setting, f.suggested_value) == (
        "kv-cache-preemption", "warning", "--gpu-memory-utilization", "0.95")
    assert f.details["cumulative_preemptions"] == 1
    g = _only("vllm_v0_preemption_warning.txt", OomContext(gpu_memory_utilization=0.95))
    assert (g.setting, g.suggested_value) == ("--max-num-seqs", "192")


def test_host_oom_halves_swap_space() -> None:
    """A global OOM kill: --swap-space 4 GiB (default) -> 2; the killed processes are listed."""
    f = _only("kernel_oom_killer_journald.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("host-oom", "--swap-space", "2")
    assert f.details["killed"] == ["(resolved) (15925)", "python3 (15784)"]
    assert len(f.evidence) == 2 and all("Out of memory: Killed process" in e for e in f.evidence)


def test_memcg_oom_is_container_oom() -> None:
    """A kubepods memcg kill: limit 67579904 kB = 64.45 GiB x 1.25 = 80.6 -> 81Gi."""
    f = _only("kernel_memcg_oom_kubepods.txt")
    assert (f.kind, f.setting, f.suggested_value) == ("container-oom", "resources.limits.memory", "81Gi")
    assert len(f.evidence) == 3 and f.details["confirmed_oom"] is True


def test_legacy_memcg_oom_sizes_from_the_killed_process() -> None:
    """No limit line: the killed java's anon-rss 466160 kB = 455.2 MiB x 1.25 = 569.0 -> 570Mi."""
    assert _only("kernel_memcg_oom_legacy.txt").suggested_value == "570Mi"


def test_kubectl_describe_oomkilled() -> None:
    """describe: 90Mi limit x 1.25 = 112.5 -> 113Mi."""
    f = _only("kubectl_describe_oomkilled.txt")
    assert (f.kind, f.suggested_value, f.details["restart_count"]) == ("container-oom", "113Mi", 1)


def test_pod_json_oomkilled() -> None:
    """The pod JSON: 24Gi x 1.25 = 30Gi; with V0's pinned swap (4 GiB x TP 2) 24 + 8 = 32Gi wins."""
    f = _only("k8s_pod_oomkilled.json")
    assert (f.kind, f.severity, f.suggested_value) == ("container-oom", "critical", "30Gi")
    assert f.labels == {"namespace": "inference", "pod": "vllm-llama3-8b-7d9f8c6b5-x2kqp", "container": "vllm"}
    assert f.details["restart_count"] == 3
    swap = _only("k8s_pod_oomkilled.json", OomContext(swap_space_bytes=4 * GiB, tensor_parallel_size=2))
    assert swap.suggested_value == "32Gi"


def test_exit_137_without_oomkilled_is_a_warning() -> None:
    """Exit code 137 with reason Error may be a probe's SIGKILL: reported, as a warning."""
    text = _text("k8s_pod_oomkilled.json").replace('"reason": "OOMKilled"', '"reason": "Error"')
    (f,) = diagnose_oom(text)
    assert (f.kind, f.severity, f.details["confirmed_oom"]) == ("container-oom", "warning", False)


# -- hardware, ordering, shape ----------------------------------------------------------------------
def test_hardware_xid() -> None:
    """XID 79 is a hardware finding whose action is NVIDIA's: drain and reboot."""
    f = _only("nvidia_xid_79.txt")
    assert (f.kind, f.severity, f.setting) == ("gpu-hardware", "critical", "")
    assert "reboot" in f.suggested_value
    assert f.labels == {"xid": "79", "pci_bus_id": "0000:44:00"}


def test_application_xids_give_no_finding() -> None:
    """Of XIDs 32, 69, 69, 62 only the hardware ones (62, 69) are findings, one per code."""
    findings = diagnose_oom(_text("nvidia_xid_mixed.txt"))
    assert [(f.details["xid"], f.details["occurrences"]) for f in findings] == [(62, 1), (69, 2)]


def test_hardware_and_startup_first() -> None:
    """Mixed evidence comes back hardware, then start-up, then runtime and pressure."""
    text = "\n".join(_text(n) for n in ("vllm_v0_preemption_warning.txt", "torch_cuda_oom_v1_worker.txt",
                                         "vllm_v1_kv_cache_estimate.txt", "nvidia_xid_79.txt"))
    kinds = [f.kind for f in diagnose_oom(text)]
    assert kinds == ["gpu-hardware", "gpu-oom-startup-kv-cache", "gpu-oom-runtime", "kv-cache-preemption"]
    assert kinds == sorted(kinds, key=KINDS.index)


def test_evidence_is_deduplicated_with_counts() -> None:
    """The same line three times is one evidence line with a count of 3."""
    line = _line("vllm_v0_preemption_warning.txt", "preempted")
    (f,) = diagnose_oom([line, line, "INFO unrelated", line])
    assert f.evidence == [line]
    assert (f.details["evidence_counts"], f.details["occurrences"]) == ([3], 3)


def test_no_evidence_no_findings() -> None:
    """A healthy log (engine start only) gives no findings."""
    assert diagnose_oom(_text("vllm_v1_engine_start.txt")) == []
    assert diagnose_oom("") == []


def test_runbook_base_and_json_round_trip() -> None:
    """runbook_url follows runbook_base; a finding survives to_json/from_json."""
    (f,) = diagnose_oom(_text("nvidia_xid_79.txt"), runbook_base="https://example.test/rb")
    assert f.runbook_url == "https://example.test/rb/diagnosis-gpu-hardware.md"
    assert Finding.from_json(f.to_json()) == f


# -- context from the store --------------------------------------------------------------------------
def _store(now: int) -> Store:
    store = Store(retention_ms=3_600_000)
    cfg = {"block_size": "16", "cache_dtype": "auto", "engine": "0", "gpu_memory_utilization": "0.8",
           "swap_space": "4", "instance": "10.0.0.7:8000", "job": "vllm"}
    store.append(labels_from("vllm:cache_config_info", cfg), now - 30_000, 1.0)
    store.append(labels_from("vllm:num_requests_running", {"instance": "10.0.0.7:8000", "job": "vllm",
                                                         "model_name": "meta-llama/Meta-Llama-3-8B-Instruct"}),
                 now - 30_000, 3.0)
    for gpu, used in (("0", (60000.0, 78000.0)), ("1", (10000.0, 12000.0))):
        ids = {"gpu": gpu, "UUID": f"GPU-{gpu}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "10.0.0.7"}
        for i, u in enumerate(used):
            t = now - 60_000 + i * 30_000
            store.append(labels_from("DCGM_FI_DEV_FB_USED", ids), t, u)
            store.append(labels_from("DCGM_FI_DEV_FB_FREE", ids), t, 81559.0 - u)
    other = {"gpu": "0", "UUID": "GPU-x", "modelName": "NVIDIA A100", "Hostname": "10.0.0.9"}
    store.append(labels_from("DCGM_FI_DEV_FB_USED", other), now - 1000, 81000.0)
    store.append(labels_from("DCGM_FI_DEV_FB_FREE", other), now - 1000, 920.0)
    return store


def test_context_from_store() -> None:
    """cache_config_info's utilization, the model_name, and the fuller GPU on the instance's host
    (MiB x 2**20; total = used + free); another host's GPU is not picked even though it is fuller."""
    now = 10_000_000
    ctx = context_from_store(_store(now), "10.0.0.7:8000", now)
    assert (ctx.gpu_memory_utilization, ctx.model, ctx.kv_cache_dtype) == (
        0.8, "meta-llama/Meta-Llama-3-8B-Instruct", "auto")
    assert ctx.swap_space_bytes is None  # V1 labels: nothing pinned
    assert ctx.gpu_name == "NVIDIA H100 80GB HBM3"
    assert ctx.gpu_memory_history == [(now - 60_000, 60000 * 2**20, 81559 * 2**20),
                                      (now - 30_000, 78000 * 2**20, 81559 * 2**20)]
    assert context_from_store(_store(now), "10.0.0.7:8000", now, gpu="1").gpu_memory_history[-1][1] == 12000 * 2**20
    assert context_from_store(_store(now), "10.0.0.8:8000", now).gpu_memory_history == []
    late = context_from_store(_store(now), "10.0.0.7:8000", now + 20 * 60_000)  # outside the 15 minutes
    assert late.gpu_memory_history == [] and late.gpu_memory_utilization is None


def test_store_context_changes_the_suggestion() -> None:
    """With the store's 0.8 the runtime OOM's value is 0.75, not 0.85; the GPU's peak use is reported."""
    now = 10_000_000
    ctx = context_from_store(_store(now), "10.0.0.7:8000", now)
    f = _only("torch_cuda_oom_v1_worker.txt", ctx)
    assert f.suggested_value == "0.75"
    assert f.details["gpu_peak_used_fraction"] == round(78000 / 81559, 3)


# -- the planner ------------------------------------------------------------------------------------
def test_planner_sizes_tensor_parallelism() -> None:
    """For a planner preset on a known GPU the weights finding names the smallest TP the planner starts
    (checked against the planner itself, TP 2, 4, 8 in turn, at vLLM V1's 1,024 sequences for an H100: their
    sampler warm-up takes 4.7 GiB per GPU, which leaves TP=2 no room for one 8,192-token sequence)."""
    ctx = OomContext(model="meta-llama/Meta-Llama-3-70B-Instruct", gpu_name="H100", max_model_len=8192)
    f = _only("torch_cuda_oom_legacy_weights_vllm.txt", ctx)
    base = planner.PlanInput(model=planner.find_model(ctx.model or ""), gpu_memory_bytes=planner.gpu_memory_bytes(
        "H100"), max_model_len=8192, max_num_seqs=1024)
    expected = next(tp for tp in (2, 4, 8) if planner.plan(replace(base, tensor_parallel_size=tp)).engine_starts)
    assert (f.setting, f.suggested_value) == ("--tensor-parallel-size", str(expected))
    assert "planner" in f.details


def test_planner_for_preemption_at_the_utilization_ceiling() -> None:
    """At 0.95 the preemption finding admits what the planner says fits at full length."""
    ctx = OomContext(model="meta-llama/Meta-Llama-3-8B-Instruct", gpu_name="L40S", max_model_len=32768,
                     gpu_memory_utilization=0.95)
    p = planner.plan(planner.PlanInput(model=planner.find_model(ctx.model or ""), gpu_memory_bytes=(
        planner.gpu_memory_bytes("L40S")), max_model_len=32768, gpu_memory_utilization=0.95))
    f = _only("vllm_v0_preemption_warning.txt", ctx)
    assert 1 <= p.max_concurrent_seqs < 256
    assert (f.setting, f.suggested_value) == ("--max-num-seqs", str(p.max_concurrent_seqs))


def test_planner_not_applicable() -> None:
    """No model, an unknown model or an unknown GPU: no planner suggestion (and no error)."""
    assert planner_suggestion("gpu-oom-startup-weights", OomContext()) is None
    assert planner_suggestion("gpu-oom-startup-weights", OomContext(model="no-such-model", gpu_name="H100")) is None
    assert planner_suggestion("kv-cache-preemption", OomContext(model="meta-llama/Meta-Llama-3-8B-Instruct",
                                                                gpu_name="no-such-gpu")) is None


# -- runbooks ---------------------------------------------------------------------------------------
SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")
DIAGNOSIS_COMMANDS = ("sre-agent diagnose oom /var/log/vllm.log", "journalctl -k | grep -i 'out of memory'",
                      "kubectl get pod P -o json | sre-agent diagnose oom -", "nvidia-smi", "```promql")


@pytest.mark.parametrize("kind", KINDS)
def test_runbook_per_kind(kind: str) -> None:
    """runbooks/diagnosis-<kind>.md: H1 is its name, the four sections in order, copy-pasteable
    commands and PromQL in Diagnosis, nothing unfinished, no machine paths."""
    text = (REPO / "runbooks" / f"diagnosis-{kind}.md").read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# diagnosis-{kind}"
    positions = [text.index(f"\n{s}\n") for s in SECTIONS]
    assert positions == sorted(positions)
    diagnosis = text.split("## Diagnosis\n", 1)[1].split("## Mitigation\n", 1)[0]
    assert all(cmd in diagnosis for cmd in DIAGNOSIS_COMMANDS)
    assert not re.search(r"\b(TODO|TBD|FIXME)\b", text)
    assert not re.search(r"(?<![\w.])/(home|Users|work|tmp)/", text)


# -- start-up: the KV cache fit, the sampler warm-up did not ----------------------------------------
WARMUP = "vllm_v1_sampler_warmup_oom.txt"


def test_sampler_warmup_oom_halves_the_warmup_batch() -> None:
    """'warming up sampler with 1024 dummy requests' (two ranks): --max-num-seqs 1024 // 2 = 512, and
    --gpu-memory-utilization 0.9 (assumed) - 0.05 = 0.85 as the alternative; the quoted source line
    (``raise RuntimeError(``) is no evidence."""
    f = _only(WARMUP)
    assert (f.kind, f.severity, f.setting, f.suggested_value) == (
        "gpu-oom-startup-warmup", "critical", "--max-num-seqs", "512")
    assert f.evidence == [ln for ln in _text(WARMUP).splitlines()[1:] if "RuntimeError: CUDA out of memory" in ln]
    assert len(f.evidence) == 2
    assert (f.details["warmup"], f.details["dummy_requests"]) == ("sampler", 1024)
    assert f.details["alternatives"] == ["--gpu-memory-utilization 0.85"]
    assert f.summary == ("The KV cache fit, but warming up the sampler with 1024 dummy requests ran out of GPU memory "
                         "at start-up: lower --max-num-seqs to 512 (a smaller warm-up batch), or lower "
                         "--gpu-memory-utilization from 0.9 to 0.85 to leave the warm-up room.")
    assert f.runbook_url == DEFAULT_RUNBOOK_BASE + "diagnosis-gpu-oom-startup-warmup.md"


def test_sampler_warmup_uses_the_engines_own_settings() -> None:
    """With --max-num-seqs 200 and --gpu-memory-utilization 0.95 known: 200 // 2 = 100 -> 96 (a multiple of 8)
    and 0.95 - 0.05 = 0.90."""
    f = _only(WARMUP, OomContext(max_num_seqs=200, gpu_memory_utilization=0.95))
    assert (f.setting, f.suggested_value, f.details["alternatives"]) == (
        "--max-num-seqs", "96", ["--gpu-memory-utilization 0.90"])


def test_pytorch_oom_inside_the_warmup_is_the_same_finding() -> None:
    """PyTorch's own OOM line raised inside _dummy_sampler_run (the chained cause) joins the warm-up finding
    instead of making a runtime one: 270 MiB of 21.98 GiB (1.2 %) with 156.94 MiB free keeps the 0.05 step."""
    frame = ('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1292, '
             "in _dummy_sampler_run")
    torch_line = _line("torch_cuda_oom_v1_worker.txt", "OutOfMemoryError")
    (f,) = diagnose_oom([frame, torch_line, *_text(WARMUP).splitlines()[1:]])
    assert f.kind == "gpu-oom-startup-warmup"
    assert f.evidence[0] == torch_line and f.details["requested_gib"] == 0.26


def test_kv_cache_too_small_reads_the_planners_bytes_per_token() -> None:
    """A known model gets the planner's KV bytes per token (Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 x 2 B
    = 131,072; fp8 65,536) and what the 0.71 GiB left would hold in fp8: 762,361,283 // 65,536 = 11,632 tokens,
    still short of 131,072, so fp8 is not offered."""
    f = _only("vllm_v1_kv_cache_estimate.txt", OomContext(model="meta-llama/Meta-Llama-3-8B-Instruct"))
    assert (f.details["kv_bytes_per_token_per_gpu"], f.details["fp8_kv_bytes_per_token_per_gpu"]) == (131072, 65536)
    assert f.details["fp8_max_tokens"] == round(0.71 * GiB) // 65536
    assert "alternative_fp8" not in f.details
    assert f.suggested_value == "5632"  # vLLM's own estimate still sets the value


def test_negative_available_kv_memory_is_a_kv_startup_failure() -> None:
    """vLLM V1 logs "Available KV cache memory: -2.14 GiB" (gpt-oss-120b on one H100, vLLM issue 23278)
    when weights and the profile's activations exceed the budget, then fails to start; the finding
    says so with the shortfall."""
    text = (FIXTURES / "planner" / "calibration" / "gpt-oss-120b_h100_v1_aug2025.txt").read_text(encoding="utf-8")
    [f] = diagnose_oom(text)
    assert f.kind == "gpu-oom-startup-kv-cache" and f.setting == "--gpu-memory-utilization"
    assert "vLLM logged -2.14 GiB of KV memory: 2.14 GiB short" in f.summary
    assert f.details["kv_shortfall_gib"] == 2.14
    v0 = diagnose_oom("INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; "
                      "PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is "
                      "-1.05GiB.")
    assert [g.details["kv_shortfall_gib"] for g in v0] == [1.05]
