"""Evidence patterns: every message generation the OOM diagnosis reads, parsed to the numbers
it prints. Expected numbers are read off the fixture lines by hand (PyTorch prints binary
units: 1 GiB = 2**30 bytes)."""

from __future__ import annotations

from agent.diagnose.oom.evidence import XID_TABLE, Match, parse_evidence, parse_quantity, size_bytes, xid_info
from tests.conftest import FIXTURES

LOGS = FIXTURES / "logs"
GiB, MiB, KiB = 2**30, 2**20, 2**10


def _matches(name: str, type_: str | None = None) -> list[Match]:
    matches, _ = parse_evidence((LOGS / name).read_text(encoding="utf-8"))
    return [m for m in matches if type_ is None or m.type == type_]


def _one(name: str, type_: str) -> dict[str, object]:
    found = _matches(name, type_)
    assert len(found) == 1, found
    return found[0].values


def test_every_fixture_names_its_source() -> None:
    """Each text fixture starts with a '# source:' line naming a URL; the JSON one has a README."""
    for path in LOGS.glob("*.txt"):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# source: https://"), path.name
    assert "k8s_pod_oomkilled.json" in (LOGS / "README.md").read_text(encoding="utf-8")


def test_sizes_and_quantities() -> None:
    """PyTorch sizes are binary units; Kubernetes quantities accept binary, decimal and exponent forms."""
    assert size_bytes("270.00", "MiB") == 270 * MiB
    assert size_bytes("0", "bytes") == 0
    assert parse_quantity("24Gi") == 24 * GiB
    assert parse_quantity("90Mi") == 90 * MiB
    assert parse_quantity("512M") == 512_000_000
    assert parse_quantity("1e9") == 1_000_000_000
    assert parse_quantity("128974848") == 128974848
    assert parse_quantity("lots") is None


def test_torch_oom_current_wording() -> None:
    """The PyTorch 2.x message: GPU index and all six numbers, no phase without markers."""
    v = _one("torch_cuda_oom_v1_worker.txt", "torch-oom")
    assert v["gpu"] == 1 and v["format"] == "current" and v["phase"] == "unknown"
    assert v["requested_bytes"] == 270 * MiB
    assert v["total_bytes"] == round(21.98 * GiB)
    assert v["free_bytes"] == round(156.94 * MiB)
    assert v["in_use_bytes"] == round(21.80 * GiB)
    assert v["allocated_bytes"] == round(21.42 * GiB)
    assert v["reserved_unallocated_bytes"] == round(24.12 * MiB)


def test_torch_oom_legacy_wordings() -> None:
    """PyTorch 1.x '(GPU 0; ... reserved in total by PyTorch)', '0 bytes free' and the oldest '... cached)'."""
    v = _one("torch_cuda_oom_legacy_runtimeerror.txt", "torch-oom")
    assert (v["gpu"], v["format"]) == (0, "legacy")
    assert v["requested_bytes"] == 236 * MiB and v["total_bytes"] == round(15.78 * GiB)
    assert v["allocated_bytes"] == round(14.25 * GiB) and v["free_bytes"] == round(183.50 * MiB)
    assert v["reserved_bytes"] == round(14.34 * GiB)
    assert v["reserved_unallocated_bytes"] == round(14.34 * GiB) - round(14.25 * GiB)
    assert _one("torch_cuda_oom_zero_bytes_free.txt", "torch-oom")["free_bytes"] == 0
    oldest = _one("torch_cuda_oom_cached_oldest.txt", "torch-oom")
    assert oldest["reserved_bytes"] == round(32.43 * MiB)
    assert oldest["reserved_unallocated_bytes"] == 0  # 32.43 MiB cached < 643.57 MiB allocated


def test_torch_oom_process_list_and_capacty_typo() -> None:
    """PyTorch 2.1's 'total capacty' typo parses, and each 'Process N has X' entry is kept."""
    v = _one("torch_cuda_oom_other_process_vllm.txt", "torch-oom")
    assert v["total_bytes"] == round(79.11 * GiB)
    assert v["processes"] == {247516: round(50.52 * GiB), 477367: round(28.19 * GiB)}
    assert "in_use_bytes" not in v


def test_torch_oom_private_pools_and_serving_phase() -> None:
    """'with X allocated in private pools' is parsed; 'Added request' before the OOM means serving."""
    v = _one("torch_cuda_oom_serving_vllm.txt", "torch-oom")
    assert v["private_pools_bytes"] == 58 * MiB
    assert v["reserved_unallocated_bytes"] == round(75.30 * MiB)
    assert v["phase"] == "serving"


def test_torch_oom_while_loading_weights() -> None:
    """A traceback through the model's constructor puts the OOM in the loading phase."""
    v = _one("torch_cuda_oom_legacy_weights_vllm.txt", "torch-oom")
    assert v["phase"] == "loading" and v["allocated_bytes"] == round(78.58 * GiB)


def test_vllm_kv_cache_messages() -> None:
    """V0 'max seq len ... KV cache (N)', V1 with and without vLLM's estimate, and 'No available memory'."""
    assert _one("vllm_v0_engine_max_seq_len.txt", "vllm-kv-cache") == {"max_model_len": 4096, "max_tokens": 3664}
    assert _one("vllm_v0_profile_max_seq_len.txt", "vllm-kv-cache") == {"max_model_len": 29000, "max_tokens": 23648}
    v1 = _one("vllm_v1_kv_cache_estimate.txt", "vllm-kv-cache")
    assert v1 == {"max_model_len": 131072, "needed_bytes": 16 * GiB, "available_bytes": round(0.71 * GiB),
                  "estimated_max_len": 5632}
    assert _one("vllm_v1_kv_cache_no_estimate.txt", "vllm-kv-cache")["estimated_max_len"] is None
    blocks = _matches("vllm_v0_no_cache_blocks.txt")
    assert [(m.type, m.lineno) for m in blocks] == [("vllm-no-cache-blocks", 4)]  # not the quoted source line 3


def test_vllm_free_memory_both_wordings() -> None:
    """'Free memory on device (X/Y GiB)' and the newer 'on device cuda:1 (X/Y GiB)'."""
    v = _one("vllm_v1_free_memory_startup.txt", "vllm-free-memory")
    assert v == {"device": "", "free_bytes": round(7.34 * GiB), "total_bytes": round(139.72 * GiB),
                 "utilization": 0.9, "requested_bytes": round(125.75 * GiB)}
    assert _one("vllm_v1_free_memory_device_named.txt", "vllm-free-memory")["device"] == "cuda:1"


def test_preemption_warning() -> None:
    """The V0 scheduler's preemption warning: mode and cumulative count."""
    assert _one("vllm_v0_preemption_warning.txt", "vllm-preemption") == {"mode": "RECOMPUTE", "cumulative": 1}


def test_kernel_oom_killer_host() -> None:
    """Global OOM kills: process, pid, anon-rss; the oom_reaper lines are not evidence."""
    kills = _matches("kernel_oom_killer_journald.txt")
    assert [(m.values["scope"], m.values["pid"], m.values["process"]) for m in kills] == [
        ("host", 15784, "python3"), ("host", 15925, "(resolved)")]
    assert kills[0].values["anon_rss_bytes"] == 4288 * KiB


def test_kernel_memcg_oom() -> None:
    """CONSTRAINT_MEMCG with its kubepods cgroup and the cgroup's limit; a bare 'Killed process'
    after 'Memory cgroup out of memory: Kill process' belongs to the cgroup too."""
    ms = _matches("kernel_memcg_oom_kubepods.txt")
    assert [m.type for m in ms] == ["kernel-memcg-limit", "kernel-oom", "kernel-oom"]
    assert ms[0].values["limit_bytes"] == 67579904 * KiB
    assert ms[1].values["memcg"].startswith("/kubepods.slice/kubepods-burstable.slice/")
    assert ms[2].values == {"scope": "memcg", "memcg": "", "process": "qemu-system-x86", "pid": 70870,
                            "anon_rss_bytes": 66852088 * KiB}
    legacy = _matches("kernel_memcg_oom_legacy.txt")
    assert [(m.values["scope"], m.values["pid"]) for m in legacy] == [("memcg", 24572), ("memcg", 28438)]


def test_xid_lines() -> None:
    """The driver's XID line: PCI bus, code and pid; 'GPU at ... has fallen off the bus' counts as 79."""
    assert _one("nvidia_xid_79.txt", "xid")["pci_bus_id"] == "0000:44:00"
    v63 = _one("nvidia_xid_63.txt", "xid")
    assert (v63["xid"], v63["pid"], v63["pci_bus_id"]) == (63, 1896, "0000:10:1c")
    assert [m.values["xid"] for m in _matches("nvidia_xid_mixed.txt")] == [32, 69, 69, 62]
    # source: https://pastebin.com/xJaypMZt (journald, an older driver's wording; verbatim line)
    line = "Jan 18 11:38:05 localhost kernel: [ 269.516977] NVRM: GPU at 0000:01:00.0 has fallen off the bus."
    (m,), _ = parse_evidence([line])
    assert (m.values["xid"], m.values["pci_bus_id"]) == (79, "0000:01:00.0")


def test_xid_table_matches_the_alert_rules() -> None:
    """The hardware XIDs of rules/gpu.rules.yaml are hardware here, its application XIDs are not;
    an unknown code is not called hardware."""
    for code in (48, 63, 64, 74, 79, 92, 94, 95):
        assert XID_TABLE[code].hardware, code
    for code in (13, 31, 43):
        assert not XID_TABLE[code].hardware, code
    assert XID_TABLE[79].meaning == "GPU has fallen off the bus"
    assert not xid_info(999).hardware


def test_engine_config_from_start_lines() -> None:
    """V1 and old V0 start lines give model, max_model_len, TP, quantization and KV dtype."""
    _, v1 = parse_evidence((LOGS / "vllm_v1_engine_start.txt").read_text(encoding="utf-8"))
    assert (v1.version, v1.model, v1.max_model_len, v1.tensor_parallel_size) == (
        "0.12.0", "/home/nbw/model/Qwen2-0.5B/", 32768, 1)
    assert (v1.quantization, v1.kv_cache_dtype) == ("none", "auto")
    _, v0 = parse_evidence((LOGS / "vllm_v0_engine_start_awq.txt").read_text(encoding="utf-8"))
    assert (v0.model, v0.quantization, v0.max_model_len, v0.cpu_blocks) == (
        "TheBloke/Xwin-LM-13B-V0.2-AWQ", "awq", 4096, 327)


def test_engine_config_from_profile_and_args() -> None:
    """V0's memory profile gives total memory, utilization, weights and KV size; an args line the flags."""
    _, e = parse_evidence((LOGS / "vllm_v0_profile_max_seq_len.txt").read_text(encoding="utf-8"))
    assert e.gpu_memory_utilization == 0.9 and e.total_gpu_memory_bytes == round(23.58 * GiB)
    assert e.weights_bytes == round(14.9888 * GiB) and e.kv_cache_bytes == round(2.89 * GiB)
    # The shape of vLLM's api_server start-up line (vllm/entrypoints: log_non_default_args).
    line = ("(APIServer pid=1) INFO 06-14 04:56:37 [api_utils.py:273] non-default args: {'max_model_len': 262144, "
            "'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.82, 'max_num_batched_tokens': 2048, "
            "'max_num_seqs': 1}")
    _, a = parse_evidence([line])
    assert (a.max_model_len, a.tensor_parallel_size, a.gpu_memory_utilization, a.max_num_batched_tokens,
            a.max_num_seqs) == (262144, 2, 0.82, 2048, 1)


def test_kubectl_describe() -> None:
    """'Last State: Terminated / Reason: OOMKilled / Exit Code: 137' with the container's memory limit."""
    ms = _matches("kubectl_describe_oomkilled.txt", "k8s-oom")
    assert [m.line.strip() for m in ms] == ["Reason:       OOMKilled", "Exit Code:    137"]
    assert ms[0].values["limit_bytes"] == 90 * MiB
    assert (ms[0].values["restart_count"], ms[0].values["exit_code"]) == (1, 137)


def test_pod_json_and_list() -> None:
    """A Pod's lastState.terminated OOMKilled with its limit; a List of pods; JSON after log lines."""
    text = (LOGS / "k8s_pod_oomkilled.json").read_text(encoding="utf-8")
    (m,), _ = parse_evidence(text)
    assert (m.values["pod"], m.values["namespace"], m.values["container"]) == (
        "vllm-llama3-8b-7d9f8c6b5-x2kqp", "inference", "vllm")
    assert (m.values["exit_code"], m.values["restart_count"], m.values["limit_bytes"]) == (137, 3, 24 * GiB)
    listed, _ = parse_evidence('{"kind": "List", "items": [' + text + "]}")
    assert len(listed) == 1
    mixed, _ = parse_evidence("INFO started\n" + text + "\nNVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus")
    assert [(x.type, x.lineno) for x in mixed] == [("k8s-oom", 2), ("xid", text.count("\n") + 3)]


def test_json_log_lines_are_read_as_text() -> None:
    """A JSON-lines log record that is not a pod is scanned like any other line."""
    line = '{"level": "error", "msg": "RuntimeError: CUDA error: out of memory"}'
    (m,), _ = parse_evidence([line])
    assert m.type == "torch-oom" and m.line == line
