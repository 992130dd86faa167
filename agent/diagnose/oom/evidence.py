"""OOM evidence in text: the line patterns and what each one says.

Why a module of its own: the verdict (:mod:`agent.diagnose.oom.verdict`) reasons about *facts*
("PyTorch could not allocate 270 MiB on GPU 1 while serving"), and the facts come from many
message generations that drift between releases: PyTorch's three CUDA OOM wordings, vLLM's
V0 and V1 KV-cache start-up errors, the kernel OOM killer (global and memory-cgroup),
Kubernetes (``kubectl get pod -o json`` and ``kubectl describe pod``) and the NVIDIA driver's
XID lines. Each pattern is written from the emitting program's own source or from real logs
(``tests/fixtures/logs/`` names them); nothing here decides what to do about a match.

:class:`EvidenceScanner` reads lines in order because some facts need context: the phase a
PyTorch OOM happened in (loading weights, profiling, serving), whether a bare ``Killed
process`` line belongs to a memory cgroup, which container a ``kubectl describe`` reason
belongs to. :func:`parse_evidence` is the one-call form and also accepts a pod's JSON.
Kubernetes' own forms (pod JSON, ``kubectl describe``) are read by
:mod:`agent.diagnose.oom.k8s`, and what an XID code means is in :mod:`agent.diagnose.oom.xid`;
both are re-exported here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.diagnose.oom.k8s import DescribeReader, is_pod, parse_quantity, pod_oom_kills
from agent.diagnose.oom.xid import XID_TABLE, XidInfo, xid_info

__all__ = ["XID_TABLE", "EngineConfig", "EvidenceScanner", "Match", "XidInfo", "parse_evidence", "parse_quantity",
           "size_bytes", "xid_info"]

_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SZ = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"  # PyTorch's format_size()


def size_bytes(number: str, unit: str) -> int:
    """``("21.98", "GiB")`` -> bytes (PyTorch prints binary units)."""
    return round(float(number) * _UNITS[unit])


@dataclass(frozen=True)
class Match:
    """One recognised line: ``type`` says what it is, ``values`` holds the parsed numbers
    (bytes as ints, fractions as floats), ``lineno`` is 1-based in the input."""

    type: str
    line: str
    lineno: int
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineConfig:
    """What the logs say about the vLLM engine that wrote them (later lines win)."""

    version: str | None = None
    model: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    swap_space_gib: float | None = None
    total_gpu_memory_bytes: int | None = None
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    cpu_blocks: int | None = None


# -- patterns ----------------------------------------------------------------------------------
_TORCH_OOM = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _SZ)
_CUDA_ERROR_OOM = re.compile(r"CUDA error: out of memory")
_T_CURRENT = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of " + _SZ + r" of which " + _SZ + r" is free")
_T_PROC = re.compile(r"Process (\d+) has " + _SZ + r" memory in use")
#: The one-size fields of the current wording: (key, pattern with the size as groups 1-2).
_T_FIELDS = tuple((key, re.compile(text.replace("SZ", _SZ))) for key, text in (
    ("in_use_bytes", r"this process has SZ memory in use"),
    ("allocated_bytes", r"Of the allocated memory SZ is allocated by PyTorch"),
    ("private_pools_bytes", r"with SZ allocated in private pools"),
    ("reserved_unallocated_bytes", r"SZ is reserved by PyTorch but unallocated")))
_T_OLD_GPU = re.compile(r"\(GPU (\d+); " + _SZ + r" total capacity; " + _SZ + r" already allocated; " + _SZ + " free;")
_T_OLD_RESERVED = re.compile(_SZ + r" (?:reserved in total by PyTorch|cached)\)")

_NO_BLOCKS = re.compile(r"No available memory for the cache blocks")
#: V1 "Available KV cache memory: -2.14 GiB" / V0 "reserved for KV Cache is -1.05GiB": weights and the profile's
#: activations exceed total × utilization; vLLM then fails with "No available memory for the cache blocks".
_KV_NEGATIVE = re.compile(r"(?:Available KV cache memory:|reserved for KV Cache is) ?-(\d+(?:\.\d+)?) ?GiB")
_V0_SEQ = re.compile(r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be "
                     r"stored in KV cache \((\d+)\)")
_V1_KV = re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\),\s*\(?(\d+(?:\.\d+)?) GiB "
                    r"KV cache is needed, which is larger than the available KV cache memory \((\d+(?:\.\d+)?) GiB\)")
_V1_ESTIMATE = re.compile(r"the estimated maximum model length is (\d+)")
_FREE = re.compile(r"Free memory on device(?: (\S+))? \((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) GiB\) on startup is less than "
                   r"desired GPU memory utilization \((\d+(?:\.\d+)?), (\d+(?:\.\d+)?) GiB\)")
#: vLLM V1's gpu_model_runner after the KV cache is allocated: "CUDA out of memory occurred when warming up
#: sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` ..."
#: (also "pooler (task=...)" for pooling models); the count is min(max_num_seqs, max_num_batched_tokens).
_WARMUP = re.compile(r"CUDA out of memory occurred when warming up (\w+)(?: \([^)]*\))? with (\d+) dummy requests")
_PREEMPT = re.compile(r"Sequence group (\S+) is preempted by PreemptionMode\.(\w+) mode because there is not enough "
                      r"KV cache space")
_PREEMPT_TOTAL = re.compile(r"total_num_cumulative_preemption=(\d+)")
_SOURCE_LINE = re.compile(r"\braise \w+\(|^\s*f?[\"']")  # a traceback's quoted source, not the message

_KILLED = re.compile(r"(?:(Memory cgroup out of memory|Out of memory): )?Kill(?:ed)? process (\d+) \((.+?)\)"
                     r"(?=\s+(?:total-vm|score)|,|\s*$)")
_ANON_RSS = re.compile(r"anon-rss:(\d+)kB")
_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+)")
_OOM_MEMCG = re.compile(r"oom_memcg=([^,\s]+)")
_TASK = re.compile(r"task=([^,]+),pid=(\d+)")
_TASK_IN = re.compile(r"Task in (\S+) killed as a result of limit of (\S+)")
_MEMCG_LIMIT = re.compile(r"(?<![+\w])memory: usage (\d+)kB, limit (\d+)kB, failcnt (\d+)")

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): (\d+),\s*(.*)$")
_XID_PID = re.compile(r"\bpid=(\d+)")
_OFF_BUS = re.compile(r"NVRM: GPU at (?:PCI:)?(\S+?):? has fallen off the bus|fallen off the bus and is not responding")

_ENGINE = re.compile(r"Initializing an? (?:(V[01]) )?LLM engine(?: \(v([^)]*)\))? with config: (.*)$")
_ARGS = re.compile(r"non-default args: \{|\bargs: Namespace\(")
_PROFILE = re.compile(r"Memory profiling results:|the current vLLM instance can use total_gpu_memory")
_WEIGHTS = re.compile(r"(?:Loading model weights took|Model loading took|model weights take) (\d+(?:\.\d+)?) ?Gi?B")
_KV_AVAILABLE = re.compile(r"(?:Available KV cache memory:|reserved for KV Cache is|kv_cache_size=) ?([\d.]+) ?GiB")
_BLOCKS = re.compile(r"# (?:GPU|cuda) blocks: (\d+), # CPU blocks: (\d+)")

#: Where a PyTorch OOM happened: the marker seen last before it wins (tracebacks list frames
#: outermost first, so the innermost recognised frame does). On a tie the later phase here wins
#: ("Loading model weights took" is "loaded", not "loading").
_PHASE_WORDS = (
    ("loading", ("in load_model", "in load_weights", "in _initialize_model", "in get_model", "in init_model",
                 "in _init_worker", "model_loader", "weight_loader", "Starting to load model", "Loading model weights",
                 "Loading weights")),
    ("profiling", ("in profile_run", "in determine_num_available_blocks", "in determine_available_memory",
                   "Memory profiling takes")),
    ("cuda-graphs", ("in capture_model", "Capturing CUDA graph", "Capturing cudagraph")),
    ("warmup", ("in _dummy_sampler_run", "in _dummy_pooler_run")),
    ("loaded", ("Loading model weights took", "Loading weights took", "Model loading took", "model weights take")),
    ("serving", ("Application startup complete", "Uvicorn running on", "Avg prompt throughput", "Received request",
                 "Added request", '"POST /v1/')),
)
_MODEL_INIT = re.compile(r"model_executor/models/\w+\.py\", line \d+, in __init__")  # building the layers
#: Substrings every evidence or engine-config line contains. A line with none of them (most of a
#: server log) skips the regexes: ``in`` is a C substring search, so a scan stays fast.
_EVIDENCE_HINTS = ("out of memory", "Out of memory", "cache blocks", "max seq len", "Free memory on device",
                   "is preempted by", "oom-kill", "killed as a result", "memory: usage", "Kill process",
                   "Killed process", "NVRM", "fallen off the bus", "LLM engine", "args: ", "Memory profiling",
                   "total_gpu_memory", "model weights", "Model loading took", "KV cache memory", "KV Cache is",
                   "kv_cache_size", "blocks: ")


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _cfg_value(text: str, key: str) -> str | None:
    m = re.search(rf"(?<![\w.])['\"]?{key}['\"]?\s*[:=]\s*('[^']*'|\"[^\"]*\"|[^,\s)}}]+)", text)
    return m.group(1).strip("'\"") if m else None


class EvidenceScanner:
    """Feed lines in order with :meth:`feed`; :meth:`finish` returns the matches and
    :attr:`engine` holds what the logs said about the engine's configuration."""

    def __init__(self) -> None:
        self.engine = EngineConfig()
        self._matches: list[Match] = []
        self._lineno = 0
        self._phase = "unknown"
        self._kernel_scope = ""  # "memcg" or "host", from the last OOM-killer context line
        self._kubectl = DescribeReader()

    # -- per line ------------------------------------------------------------------------------
    def feed(self, raw: str) -> None:
        line = raw.rstrip("\r\n")
        self._lineno += 1
        if not line.strip():
            return
        at = -1
        for phase, words in _PHASE_WORDS:
            for word in words:
                if (i := line.rfind(word)) >= at and i >= 0:
                    self._phase, at = phase, i
        if "model_executor/models/" in line and _MODEL_INIT.search(line):
            self._phase = "loading"
        if line[0] in " \tN":  # `kubectl describe` lines are indented, or Name:/Namespace:
            self._kubectl.feed(line, self._lineno)
        if any(hint in line for hint in _EVIDENCE_HINTS) and not (
                self._torch(line) or self._vllm(line) or self._kernel(line) or self._xid(line)):
            self._engine_line(line)

    def _add(self, type_: str, line: str, **values: Any) -> bool:
        self._matches.append(Match(type_, line, self._lineno, values))
        return True

    def _torch(self, line: str) -> bool:
        m = _TORCH_OOM.search(line)
        if m is None:
            return _CUDA_ERROR_OOM.search(line) is not None and self._add("torch-oom", line, phase=self._phase)
        v: dict[str, Any] = {"phase": self._phase, "requested_bytes": size_bytes(m[1], m[2])}
        if c := _T_CURRENT.search(line):
            v.update(gpu=int(c[1]), total_bytes=size_bytes(c[2], c[3]), free_bytes=size_bytes(c[4], c[5]),
                     format="current")
        elif o := _T_OLD_GPU.search(line):
            v.update(gpu=int(o[1]), total_bytes=size_bytes(o[2], o[3]), allocated_bytes=size_bytes(o[4], o[5]),
                     free_bytes=size_bytes(o[6], o[7]), format="legacy")
            if r := _T_OLD_RESERVED.search(line):
                v["reserved_bytes"] = size_bytes(r[1], r[2])
                v["reserved_unallocated_bytes"] = max(0, v["reserved_bytes"] - v["allocated_bytes"])
        if procs := {int(p[1]): size_bytes(p[2], p[3]) for p in _T_PROC.finditer(line)}:
            v["processes"] = procs
        v.update({key: size_bytes(f[1], f[2]) for key, pattern in _T_FIELDS if (f := pattern.search(line))})
        return self._add("torch-oom", line, **v)

    def _vllm(self, line: str) -> bool:
        if _SOURCE_LINE.search(line.split("] ", 1)[-1]):
            return False
        if m := _KV_NEGATIVE.search(line):
            return self._add("vllm-no-cache-blocks", line, shortfall_bytes=size_bytes(m[1], "GiB"))
        if _NO_BLOCKS.search(line):
            return self._add("vllm-no-cache-blocks", line)
        if m := _V0_SEQ.search(line):
            return self._add("vllm-kv-cache", line, max_model_len=int(m[1]), max_tokens=int(m[2]))
        if m := _V1_KV.search(line):
            e = _V1_ESTIMATE.search(line)
            return self._add("vllm-kv-cache", line, max_model_len=int(m[1]), needed_bytes=size_bytes(m[2], "GiB"),
                             available_bytes=size_bytes(m[3], "GiB"), estimated_max_len=int(e[1]) if e else None)
        if m := _FREE.search(line):
            return self._add("vllm-free-memory", line, device=m[1] or "", free_bytes=size_bytes(m[2], "GiB"),
                             total_bytes=size_bytes(m[3], "GiB"), utilization=float(m[4]),
                             requested_bytes=size_bytes(m[5], "GiB"))
        if m := _WARMUP.search(line):
            return self._add("vllm-warmup-oom", line, what=m[1], requests=int(m[2]))
        if m := _PREEMPT.search(line):
            t = _PREEMPT_TOTAL.search(line)
            return self._add("vllm-preemption", line, mode=m[2], cumulative=int(t[1]) if t else None)
        return False

    def _kernel(self, line: str) -> bool:
        if m := _CONSTRAINT.search(line):
            self._kernel_scope = "memcg" if m[1] == "CONSTRAINT_MEMCG" else "host"
            memcg, task = _OOM_MEMCG.search(line), _TASK.search(line)
            return self._add("kernel-oom", line, scope=self._kernel_scope, memcg=memcg[1] if memcg else "",
                             process=task[1] if task else "", pid=int(task[2]) if task else None)
        if m := _TASK_IN.search(line):
            self._kernel_scope = "memcg"
            return self._add("kernel-oom", line, scope="memcg", memcg=m[2], process="", pid=None)
        if m := _MEMCG_LIMIT.search(line):
            return self._add("kernel-memcg-limit", line, usage_bytes=int(m[1]) * 1024, limit_bytes=int(m[2]) * 1024)
        if m := _KILLED.search(line):
            if m[1]:
                self._kernel_scope = "memcg" if m[1].startswith("Memory cgroup") else "host"
            rss = _ANON_RSS.search(line)
            return self._add("kernel-oom", line, scope=self._kernel_scope or "host", memcg="", process=m[3],
                             pid=int(m[2]), anon_rss_bytes=int(rss[1]) * 1024 if rss else None)
        return False

    def _xid(self, line: str) -> bool:
        if m := _XID.search(line):
            pid = _XID_PID.search(m[3])
            return self._add("xid", line, pci_bus_id=m[1], xid=int(m[2]), pid=int(pid[1]) if pid else None,
                             message=m[3].strip())
        if m := _OFF_BUS.search(line):
            return self._add("xid", line, pci_bus_id=m[1] or "", xid=79, pid=None, message="GPU has fallen off the bus")
        return False

    def _engine_line(self, line: str) -> None:
        e = self.engine
        if m := _ENGINE.search(line):
            e.version, e.model = m[2] or e.version, _cfg_value(m[3], "model") or e.model
            self._numbers(m[3], max_model_len="max_seq_len", tensor_parallel_size="tensor_parallel_size")
            for attr in ("quantization", "kv_cache_dtype"):
                if (text := _cfg_value(m[3], attr)) is not None:
                    setattr(e, attr, "none" if text == "None" else text)
        if _ARGS.search(line) or _PROFILE.search(line):
            keys = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "tensor_parallel_size")
            self._numbers(line, swap_space_gib="swap_space", **{k: k for k in keys})
            if m := re.search(r"total_gpu_memory[=\s(]+(\d+(?:\.\d+)?)\s?GiB", line):
                e.total_gpu_memory_bytes = size_bytes(m[1], "GiB")
            if m := re.search(r"gpu_memory_utilization \((\d+(?:\.\d+)?)\)", line):
                e.gpu_memory_utilization = float(m[1])
        if m := _WEIGHTS.search(line):
            e.weights_bytes = size_bytes(m[1], "GiB")  # vLLM's "GB" here is GiB (it divides by 2**30)
        if m := _KV_AVAILABLE.search(line):
            e.kv_cache_bytes = size_bytes(m[1], "GiB")
        if m := _BLOCKS.search(line):
            e.cpu_blocks = int(m[2])

    def _numbers(self, text: str, **attr_key: str) -> None:
        """Set engine attributes from ``key=value``/``'key': value`` pairs in ``text``."""
        for attr, key in attr_key.items():
            if (v := _num(_cfg_value(text, key))) is not None:
                setattr(self.engine, attr, v if attr in ("gpu_memory_utilization", "swap_space_gib") else int(v))

    def skip(self, n: int) -> None:
        """Count ``n`` lines consumed elsewhere (a JSON document), keeping line numbers right."""
        self._lineno += n

    # -- results -------------------------------------------------------------------------------
    def finish(self) -> list[Match]:
        out = list(self._matches)
        out.extend(Match("k8s-oom", line, lineno, values) for line, lineno, values in self._kubectl.oom_kills())
        return sorted(out, key=lambda m: m.lineno)


def parse_evidence(lines: Iterable[str] | str) -> tuple[list[Match], EngineConfig]:
    """Every recognised line, every OOM termination in a pod's JSON (``kubectl get pod -o json``
    output may sit anywhere in the input, starting at a line's first column), and the engine
    config the logs describe."""
    text = lines.splitlines() if isinstance(lines, str) else [ln.rstrip("\r\n") for ln in lines]
    scanner, i = EvidenceScanner(), 0
    pods: list[Match] = []
    while i < len(text):
        line = text[i]
        if line.startswith("{"):
            try:
                doc, used = json.loads(line), 1
            except ValueError:  # a multi-line document: decode from here on
                try:
                    doc, end = json.JSONDecoder().raw_decode("\n".join(text[i:]))
                    used = "\n".join(text[i:]).count("\n", 0, end) + 1
                except ValueError:
                    doc, used = None, 1
            if is_pod(doc):
                pods.extend(Match("k8s-oom", summary, i + 1, values) for summary, values in pod_oom_kills(doc))
                scanner.skip(used)
                i += used
                continue
        scanner.feed(line)
        i += 1
    return sorted(scanner.finish() + pods, key=lambda m: m.lineno), scanner.engine
