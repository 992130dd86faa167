"""Evidence patterns: every message generation the OOM diagnosis reads, parsed to the numbers
it prints. Expected numbers are read off the fixture lines by hand (PyTorch prints binary
units: 1 GiB = 2**30 bytes)."""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path

import pytest

from agent.diagnose.oom import evidence, k8s, lines
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


# ---- where evidence is printed: a user's text that quotes it is not evidence ---------------------------
#: (fixture, a substring that picks its evidence line, where the quoted message starts, the match type)
EVIDENCE = [
    ("torch_cuda_oom_v1_worker.txt", "CUDA out of memory", "torch.", "torch-oom"),
    ("torch_cuda_oom_legacy_runtimeerror.txt", "CUDA out of memory", "RuntimeError", "torch-oom"),
    ("torch_cuda_oom_serving_vllm.txt", "OutOfMemoryError(", "OutOfMemoryError(", "torch-oom"),
    ("vllm_v0_no_cache_blocks.txt", "ValueError: No available", "ValueError", "vllm-no-cache-blocks"),
    ("vllm_v0_engine_max_seq_len.txt", "max seq len", "ValueError", "vllm-kv-cache"),
    ("vllm_v1_kv_cache_estimate.txt", "ValueError: To serve", "ValueError", "vllm-kv-cache"),
    ("vllm_v1_free_memory_startup.txt", "ValueError: Free memory", "ValueError", "vllm-free-memory"),
    ("vllm_v1_sampler_warmup_oom.txt", "RuntimeError: CUDA out of memory occurred", "RuntimeError", "vllm-warmup-oom"),
    ("vllm_v0_preemption_warning.txt", "preempted", "Sequence group", "vllm-preemption"),
    ("kernel_oom_killer_journald.txt", "Out of memory: Killed process", "Out of memory", "kernel-oom"),
    ("kernel_memcg_oom_kubepods.txt", "oom-kill:constraint", "oom-kill", "kernel-oom"),
    ("kernel_memcg_oom_kubepods.txt", "memory: usage", "memory: usage", "kernel-memcg-limit"),
    ("kernel_memcg_oom_legacy.txt", "Memory cgroup out of memory: Kill process", "Memory cgroup", "kernel-oom"),
    ("kernel_memcg_oom_legacy.txt", "Killed process 28438", "Killed process", "kernel-oom"),
    ("nvidia_xid_79.txt", "NVRM: Xid", "NVRM", "xid"),
    ("nvidia_xid_mixed.txt", "): 62,", "NVRM", "xid"),
    ("vllm_v1_free_memory_device_named.txt", "ValueError: Free memory", "ValueError", "vllm-free-memory"),
]
EXTRA_EVIDENCE = [  # real messages without a fixture file of their own
    ("(EngineCore_0 pid=5839) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB",
     "Available", "vllm-no-cache-blocks"),  # tests/fixtures/planner/calibration/gpt-oss-120b_h100_v1_aug2025.txt
    ("INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch "
     "activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.", "model weights",
     "vllm-no-cache-blocks"),  # vLLM V0's worker.py message (test_verdict's negative-KV test)
    ("Jan 18 11:38:05 localhost kernel: [ 269.516977] NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "NVRM",
     "xid"),  # test_xid_lines' pastebin line
    ("RuntimeError: CUDA error: out of memory", "RuntimeError", "torch-oom"),
]


def _evidence_lines() -> list[tuple[str, str, str]]:
    """(line, the message it quotes from `start` on, type) for every evidence pattern."""
    out = [(line, start, type_) for line, start, type_ in EXTRA_EVIDENCE]
    for name, pick, start, type_ in EVIDENCE:
        lines = (LOGS / name).read_text(encoding="utf-8").splitlines()
        out.append((next(ln for ln in lines[1:] if pick in ln), start, type_))
    return out


LINES = _evidence_lines()
_IDS = [f"{t}:{line[:40]}" for line, _, t in LINES]


def _request_log_shapes(quoted: str) -> list[str]:
    """``quoted`` where vLLM's request logger (and shippers of its lines) put a user's text."""
    r = repr(quoted)
    return [
        # vLLM to 0.10: the prompt in the INFO line (vllm/entrypoints/logger.py)
        f"INFO 11-23 18:54:12 logger.py:37] Received request cmpl-8287d124-0: prompt: {r}, params: SamplingParams("
        "n=1, temperature=0.0), prompt_token_ids: [128000, 9906], lora_request: None, prompt_adapter_request: None.",
        # vLLM 0.11+: the prompt at DEBUG, the sampling parameters (stop strings are user text) at INFO
        f"(APIServer pid=1) DEBUG 06-14 05:10:02 [logger.py:35] Request chatcmpl-9 details: prompt: {r}, "
        "prompt_token_ids: [1, 2], prompt_embeds shape: None.",
        f"(APIServer pid=1) INFO 06-14 05:10:02 [logger.py:41] Received request chatcmpl-9: params: SamplingParams("
        f"n=1, stop=[{r}], max_tokens=16), lora_request: None.",
        # --enable-log-outputs: the model's own text
        f"(APIServer pid=1) INFO 06-14 05:10:03 [logger.py:70] Generated response chatcmpl-9: output: {r}, "
        "output_token_ids: [3], finish_reason: stop",
        # a prompt that starts a new "line" by an escaped newline (repr writes \n as two characters)
        f"INFO 11-23 18:54:12 logger.py:37] Received request cmpl-1: prompt: {'hi' + chr(10) + quoted!r}, params: "
        "SamplingParams(n=1)",
        # the same through kubectl logs --timestamps, a CRI log file and docker compose
        f"2025-05-08T14:46:12.123456789Z stderr F INFO 05-08 14:46:12 [logger.py:39] Received request x: prompt: {r}",
        f"vllm-1  | INFO 11-23 18:54:12 logger.py:37] Received request cmpl-1: prompt: {r}, params: None",
        # JSON log records: a structured logger's message, Docker's json-file line, a record's prompt field
        json.dumps({"level": "info", "logger": "vllm.entrypoints.logger",
                    "message": f"Received request cmpl-1: prompt: {r}, params: SamplingParams(n=1)"}),
        json.dumps({"log": f"INFO 11-23 18:54:12 logger.py:37] Received request cmpl-1: prompt: {r}\n",
                    "stream": "stdout", "time": "2025-05-08T14:46:12.123456789Z"}),
        json.dumps({"request_id": "cmpl-1", "prompt": quoted, "prompt_token_ids": [1, 2]}),
        # quoted inside another message, or after a label (not an exception's name)
        f"INFO 05-08 14:46:12 [serving_chat.py:120] Error in chat template: unexpected text '{quoted}'",
        f"INFO 05-08 14:46:12 [serving_chat.py:120] Prompt: {quoted}",
        f"INFO 05-08 14:46:12 [serving_chat.py:120] user.content: {quoted}",
    ]


@pytest.mark.parametrize(("line", "start", "type_"), LINES, ids=_IDS)
def test_evidence_lines_match_where_printed(line: str, start: str, type_: str) -> None:
    """Each evidence pattern's real line is found (so the negative test below quotes live evidence)."""
    matches, _ = parse_evidence([line])
    assert [m.type for m in matches] == [type_]


@pytest.mark.parametrize(("line", "start", "type_"), LINES, ids=_IDS)
def test_quoted_evidence_in_request_logs_is_not_evidence(line: str, start: str, type_: str) -> None:
    """A prompt, stop string or generated text that quotes an evidence line (the whole line, its message,
    the message without its exception's name) in any request-log shape yields no match."""
    message = line[line.index(start):]
    for quoted in (line, message, re.sub(r"^[\w.]+(?:: |\(')", "", message)):  # also without the exception
        for shape in _request_log_shapes(quoted):
            matches, _ = parse_evidence([shape])
            assert matches == [], shape


@pytest.mark.parametrize("prefix", [
    "2025-05-08T14:46:12.123456789Z stderr F ", "2025-05-08T14:46:12.123456789Z ", "[rank0]: ", "[pod/vllm-0/vllm] ",
    "vllm-1  | ", "(RayWorkerWrapper pid=5543, ip=10.0.0.2) ERROR 05-08 14:46:12 [worker_base.py:620] ",
    "\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m ",  # vLLM colours its process prefix (through a TTY)
    "(VllmWorker TP0 pid=1430) ", "(Worker_PP1 TP0 pid=7) ",  # vLLM's tensor/pipeline-parallel workers
    "May 15 23:09:30 gpu-1 vllm[123]: ", "May 15 23:09:30.123456 gpu-1 kernel: ",  # journalctl short(-precise)
    "[  518.050606] gpu-1 kernel: ",  # journalctl -o short-monotonic
])
def test_evidence_behind_shippers_prefixes_is_found(prefix: str) -> None:
    """The same evidence lines behind a container runtime's, kubectl's, torchrun's, Ray's or vLLM's coloured
    prefix still match."""
    for line, _, type_ in LINES:
        matches, _ = parse_evidence([prefix + line])
        assert [m.type for m in matches] == [type_], prefix + line


def test_json_records_are_read_by_their_message() -> None:
    """Docker's json-file record of an OOM line is evidence; a record without a message field is not read."""
    line = _line_of("torch_cuda_oom_v1_worker.txt", "CUDA out of memory")
    docker = json.dumps({"log": line + "\n", "stream": "stderr", "time": "2025-05-08T14:46:12.1Z"})
    (m,), _ = parse_evidence([docker])
    assert m.type == "torch-oom" and m.values["gpu"] == 1 and m.line == docker
    assert parse_evidence([json.dumps({"error": line})])[0] == []


@pytest.mark.parametrize("field", ["exc_info", "exception", "stack_info", "traceback"])
def test_json_records_are_read_with_their_traceback(field: str) -> None:
    """A JSON logger's record (python-json-logger, structlog) carries the exception line in its traceback
    field: that is evidence, at the record's line; a prompt field quoting the same line is not."""
    oom = _line_of("torch_cuda_oom_v1_worker.txt", "CUDA out of memory")
    exception = oom[oom.index("torch.OutOfMemoryError"):]
    record = json.dumps({"message": "EngineCore failed", field: f"Traceback (most recent call last):\n  File "
                         f'"x.py", line 1, in <module>\n{exception}'})
    (m,), _ = parse_evidence(["{}", record])
    assert (m.type, m.lineno, m.line) == ("torch-oom", 2, record)
    assert parse_evidence([json.dumps({"message": "Received request x", "prompt": exception})])[0] == []


def test_request_lines_set_the_serving_phase_and_not_the_engine() -> None:
    """A prompt quoting traceback frames and engine start-up lines changes neither the phase of a later
    OOM (the request logger's line means serving) nor the engine config."""
    prompt = ("File \"x.py\", line 1, in load_model; Model loading took 99.00 GiB; non-default args: "
              "{'gpu_memory_utilization': 0.1}; Initializing a V1 LLM engine (v9.9) with config: model='evil'")
    oom = _line_of("torch_cuda_oom_v1_worker.txt", "CUDA out of memory")
    (m,), engine = parse_evidence([f"INFO 05-08 14:46:11 [logger.py:39] Received request x: prompt: {prompt!r}", oom])
    assert m.values["phase"] == "serving"
    assert (engine.weights_bytes, engine.gpu_memory_utilization, engine.model, engine.version) == (
        None, None, None, None)


def _line_of(name: str, pick: str) -> str:
    return next(ln for ln in (LOGS / name).read_text(encoding="utf-8").splitlines()[1:] if pick in ln)


# ---- hostile lines: linear time, bounded length --------------------------------------------------------
def test_every_pattern_is_re2() -> None:
    """Every compiled pattern of the evidence modules is RE2 (linear time), none is Python's backtracking re."""
    compiled = [v for mod in (evidence, k8s, lines) for v in vars(mod).values()]
    compiled += [p for _, p in evidence._T_FIELDS]
    patterns = [v for v in compiled if hasattr(v, "search") and hasattr(v, "groups") and not isinstance(v, type)]
    assert len(patterns) > 40 and all(type(p).__module__.startswith("re2") for p in patterns)
    for mod in (evidence, k8s, lines):  # nor compiled on the fly
        assert not re.search(r"\bre\.(compile|search|match|fullmatch|finditer|findall|sub)\(",
                             Path(mod.__file__ or "").read_text(encoding="utf-8")), mod.__name__


#: Lines that make a backtracking engine work in their length squared (or worse) for one pattern or another.
HOSTILE = {
    "spaces": lambda n: "Killed process 1 (x)" + " " * n + "y",
    "digits": lambda n: "GPU " + "1" * n + " has a total capacity of",
    "oom fragments": lambda n: "CUDA out of memory. Tried to allocate " * (n // 38),
    "killed fragments": lambda n: "Killed process 1 (" * (n // 18),
    "cfg keys": lambda n: "non-default args: {" + "'max_num_seqs'  " * (n // 16),
    "xid fragments": lambda n: "NVRM: Xid (PCI:0000:01:00): 1," + " " * n,
}


@pytest.mark.parametrize("shape", HOSTILE)
def test_a_long_line_is_read_to_the_bound(shape: str) -> None:
    """A 1 MB line without a newline is read to MAX_LINE_CHARS only, counted, and any match quotes the cut line."""
    text = HOSTILE[shape](1 << 20)
    scanner = evidence.EvidenceScanner()
    scanner.feed(text)
    assert scanner.lines_cut == 1
    assert all(len(m.line) <= lines.MAX_LINE_CHARS for m in scanner.finish())
    matches, _ = parse_evidence(text)
    assert all(len(m.line) <= lines.MAX_LINE_CHARS for m in matches)


def _best_time(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        parse_evidence(text)
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def _baseline() -> float:
    """The time 1 MB of real evidence lines takes (every pattern runs on them)."""
    real = "\n".join(ln for ln, _, _ in LINES)
    return _best_time("\n".join([real] * ((1 << 20) // len(real) + 1)))


@pytest.mark.parametrize("shape", HOSTILE)
def test_hostile_lines_scan_in_linear_time(shape: str) -> None:
    """1 MB of hostile text (one line, or many medium lines of it) scans within a generous multiple of the
    time 1 MB of real OOM lines takes: no backtracking blow-up."""
    baseline = _baseline()
    one_line = HOSTILE[shape](1 << 20)
    medium = "\n".join([HOSTILE[shape](16 << 10)] * 64)
    for text in (one_line, medium):
        assert _best_time(text) < 20 * baseline + 0.05, (shape, len(text))


@pytest.mark.parametrize("text", [
    '{"a": ' * 100_000 + "1" + "}" * 100_000,  # nested past the JSON parser's recursion limit
    '{"log": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "{\n" * 100_000,  # unbalanced: each line would start a multi-line document running to the end
    '{"msg": "unterminated\n' * 50_000,
    "{\n" + '  "kind": "Pod",\n' * 50_000,
])
def test_hostile_json_scans_in_linear_time(text: str) -> None:
    """JSON-looking input that cannot be decoded (too deep, unbalanced, unterminated) is read as text
    without an error, in time linear in its size."""
    t0 = time.perf_counter()
    matches, _ = parse_evidence(text)
    took = time.perf_counter() - t0
    assert matches == []
    assert took < 20 * _baseline() + 0.05
