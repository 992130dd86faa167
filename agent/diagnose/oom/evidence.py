"""OOM evidence in text: the line patterns and what each one says.

Why a module of its own: the verdict (:mod:`agent.diagnose.oom.verdict`) reasons about *facts*
("PyTorch could not allocate 270 MiB on GPU 1 while serving"), and the facts come from many
message generations that drift between releases: PyTorch's three CUDA OOM wordings, vLLM's
V0 and V1 KV-cache start-up errors, the kernel OOM killer (global and memory-cgroup),
Kubernetes (``kubectl get pod -o json`` and ``kubectl describe pod``) and the NVIDIA driver's
XID lines. Each pattern is written from the emitting program's own source or from real logs
(``tests/fixtures/logs/`` names them); nothing here decides what to do about a match.
A pattern matches only where its program prints it, at the start of a line's message
(:mod:`agent.diagnose.oom.lines` strips the prefixes and names the request logger's lines):
a prompt that quotes "CUDA out of memory" or "Killed process" is not evidence. Every
pattern is RE2 and a line is read to :data:`~agent.diagnose.oom.lines.MAX_LINE_CHARS` at
most, so a scan is linear in its input whatever the lines hold.

:class:`EvidenceScanner` reads lines in order because some facts need context: the phase a
PyTorch OOM happened in (loading weights, profiling, serving), whether a bare ``Killed
process`` line belongs to a memory cgroup, which container a ``kubectl describe`` reason
belongs to. :func:`parse_evidence` is the one-call form and also accepts a pod's JSON.
Kubernetes' own forms (pod JSON, ``kubectl describe``) are read by
:mod:`agent.diagnose.oom.k8s`, and what an XID code means is in :mod:`agent.diagnose.oom.xid`;
both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.diagnose.oom.k8s import DescribeReader, JsonDocuments, is_pod, parse_quantity, pod_oom_kills
from agent.diagnose.oom.lines import MAX_LINE_CHARS, is_request_log, message, record_texts
from agent.diagnose.oom.xid import XID_TABLE, XidInfo, xid_info
from agent.gocompat.regex import Match as ReMatch
from agent.gocompat.regex import Regexp, compile_go

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
# All RE2 (linear time, whatever a line holds). Evidence patterns are anchored with "^" and
# searched in a line's *message* (:func:`agent.diagnose.oom.lines.message`: the line without its
# timestamp, process and logger prefixes), where the emitting program prints them; the same words
# quoted in the middle of a line (a prompt, a stop string) are not evidence.
def _rx(pattern: str) -> Regexp:
    return compile_go(pattern, what="OOM evidence pattern")


#: The exception that carries a message, as Python prints it: "ValueError: ", "torch.OutOfMemoryError: "
#: (an exception's name, not any "Label: " a logger might put before a user's text).
_EXCEPTION = r"[A-Za-z_][\w.]*(?:Error|Exception)"
_RAISED = r"^(?:" + _EXCEPTION + r": )?"
#: PyTorch's OOM, raised ("RuntimeError: CUDA out of memory. ..."), as vLLM V0's engine logs its repr
#: ("OutOfMemoryError('Error in model execution (input dumped to /tmp/x.pkl): CUDA out of memory. ...")
#: or as the V1 multiproc executor wraps it ("Worker failed with error 'CUDA out of memory. ...").
_TORCH_OOM = _rx(r"^(?:" + _EXCEPTION + r"(?:: |\(['\"]))?(?:Error in model execution \(input dumped to [^)]*\): "
                 r"|Worker failed with error ')?(?:CUDA|HIP) out of memory\. Tried to allocate " + _SZ)
_CUDA_ERROR_OOM = _rx(_RAISED + r"CUDA error: out of memory")
_T_CURRENT = _rx(r"GPU (\d+) has a total capac(?:i)?ty of " + _SZ + r" of which " + _SZ + r" is free")
_T_PROC = _rx(r"Process (\d+) has " + _SZ + r" memory in use")
#: The one-size fields of the current wording: (key, pattern with the size as groups 1-2).
_T_FIELDS = tuple((key, _rx(text.replace("SZ", _SZ))) for key, text in (
    ("in_use_bytes", r"this process has SZ memory in use"),
    ("allocated_bytes", r"Of the allocated memory SZ is allocated by PyTorch"),
    ("private_pools_bytes", r"with SZ allocated in private pools"),
    ("reserved_unallocated_bytes", r"SZ is reserved by PyTorch but unallocated")))
_T_OLD_GPU = _rx(r"\(GPU (\d+); " + _SZ + r" total capacity; " + _SZ + r" already allocated; " + _SZ + " free;")
_T_OLD_RESERVED = _rx(_SZ + r" (?:reserved in total by PyTorch|cached)\)")

_NO_BLOCKS = _rx(_RAISED + r"No available memory for the cache blocks")
#: V1 "Available KV cache memory: -2.14 GiB" / V0 "model weights take ...; the rest of the memory reserved for KV
#: Cache is -1.05GiB": weights and the profile's activations exceed total × utilization; vLLM then fails with
#: "No available memory for the cache blocks".
_KV_NEGATIVE = _rx(r"^(?:Available KV cache memory: ?|model weights take .*reserved for KV Cache is ?)"
                   r"-(\d+(?:\.\d+)?) ?GiB")
_V0_SEQ = _rx(_RAISED + r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can "
              r"be stored in KV cache \((\d+)\)")
_V1_KV = _rx(_RAISED + r"To serve at least one request with the models?'s max seq len \((\d+)\),\s*\(?(\d+(?:\.\d+)?) "
             r"GiB KV cache is needed, which is larger than the available KV cache memory \((\d+(?:\.\d+)?) GiB\)")
_V1_ESTIMATE = _rx(r"the estimated maximum model length is (\d+)")
_FREE = _rx(_RAISED + r"Free memory on device(?: (\S+))? \((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) GiB\) on startup is less "
            r"than desired GPU memory utilization \((\d+(?:\.\d+)?), (\d+(?:\.\d+)?) GiB\)")
#: vLLM V1's gpu_model_runner after the KV cache is allocated: "CUDA out of memory occurred when warming up
#: sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` ..."
#: (also "pooler (task=...)" for pooling models); the count is min(max_num_seqs, max_num_batched_tokens).
_WARMUP = _rx(_RAISED + r"CUDA out of memory occurred when warming up (\w+)(?: \([^)]*\))? with (\d+) dummy requests")
_PREEMPT = _rx(r"^Sequence group (\S+) is preempted by PreemptionMode\.(\w+) mode because there is not enough "
               r"KV cache space")
_PREEMPT_TOTAL = _rx(r"total_num_cumulative_preemption=(\d+)")

#: The process name may hold parentheses ("((resolved))"): it ends at the ")" before the fields.
_KILLED = _rx(r"^(?:(Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: )?"
              r"Kill(?:ed)? process (\d+) \((.+?)\)(?:\s+(?:total-vm|score)|,|\s*$)")
_ANON_RSS = _rx(r"anon-rss:(\d+)kB")
_CONSTRAINT = _rx(r"^oom-kill:constraint=(\w+)")
_OOM_MEMCG = _rx(r"oom_memcg=([^,\s]+)")
_TASK = _rx(r"task=([^,]+),pid=(\d+)")
_TASK_IN = _rx(r"^Task in (\S+) killed as a result of limit of (\S+)")
_MEMCG_LIMIT = _rx(r"^memory: usage (\d+)kB, limit (\d+)kB, failcnt (\d+)")  # not "memory+swap:", "kmem:"

_XID = _rx(r"^NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): (\d+),\s*(.*)$")
_XID_PID = _rx(r"\bpid=(\d+)")
_OFF_BUS = _rx(r"^NVRM: (?:GPU at (?:PCI:)?(\S+?):? has fallen off the bus|.*fallen off the bus and is not responding)")

_ENGINE = _rx(r"Initializing an? (?:(V[01]) )?LLM engine(?: \(v([^)]*)\))? with config: (.*)$")
_ARGS = _rx(r"non-default args: \{|\bargs: Namespace\(")
_PROFILE = _rx(r"Memory profiling results:|the current vLLM instance can use total_gpu_memory")
_WEIGHTS = _rx(r"(?:Loading model weights took|Model loading took|model weights take) (\d+(?:\.\d+)?) ?Gi?B")
_KV_AVAILABLE = _rx(r"(?:Available KV cache memory:|reserved for KV Cache is|kv_cache_size=) ?([\d.]+) ?GiB")
_BLOCKS = _rx(r"# (?:GPU|cuda) blocks: (\d+), # CPU blocks: (\d+)")
_TOTAL_MEMORY = _rx(r"total_gpu_memory[=\s(]+(\d+(?:\.\d+)?)\s?GiB")
_UTILIZATION = _rx(r"gpu_memory_utilization \((\d+(?:\.\d+)?)\)")

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
_MODEL_INIT = _rx(r"model_executor/models/\w+\.py\", line \d+, in __init__")  # building the layers
#: Substrings every evidence or engine-config line contains. A line with none of them (most of a
#: server log) skips the regexes: ``in`` is a C substring search, so a scan stays fast.
_EVIDENCE_HINTS = ("out of memory", "Out of memory", "cache blocks", "max seq len", "Free memory on device",
                   "is preempted by", "oom-kill", "killed as a result", "memory: usage", "Kill process",
                   "Killed process", "NVRM", "fallen off the bus", "LLM engine", "args: ", "Memory profiling",
                   "total_gpu_memory", "model weights", "Model loading took", "KV cache memory", "KV Cache is",
                   "kv_cache_size", "blocks: ")


def _s(m: ReMatch, group: int) -> str:
    """A group that takes part in every match of its pattern."""
    return m.group(group) or ""


#: PyTorch lists every process on the GPU in its OOM message: a handful. Each search from a position
#: reads the line from its start again, so the count is bounded.
_MAX_PROCESSES = 32


def _search_all(pattern: Regexp, text: str) -> Iterator[ReMatch]:
    pos = 0
    for _ in range(_MAX_PROCESSES):
        if (m := pattern.search(text, pos)) is None:
            return
        yield m
        pos = max(m.end(), pos + 1)


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _cfg_value(text: str, key: str) -> str | None:
    m = _rx(rf"(?:^|[^\w.])['\"]?{key}['\"]?\s*[:=]\s*('[^']*'|\"[^\"]*\"|[^,\s)}}]+)").search(text)
    return _s(m, 1).strip("'\"") if m else None


class EvidenceScanner:
    """Feed lines in order with :meth:`feed`; :meth:`finish` returns the matches and
    :attr:`engine` holds what the logs said about the engine's configuration.
    :attr:`lines_cut` counts the lines longer than :data:`~agent.diagnose.oom.lines.MAX_LINE_CHARS`
    (only their start was read) and :attr:`request_lines` the request logger's lines (not read)."""

    def __init__(self) -> None:
        self.engine = EngineConfig()
        self.lines_cut = 0
        self.request_lines = 0
        self._matches: list[Match] = []
        self._lineno = 0
        self._phase = "unknown"
        self._kernel_scope = ""  # "memcg" or "host", from the last OOM-killer context line
        self._kubectl = DescribeReader()

    # -- per line ------------------------------------------------------------------------------
    def feed(self, raw: str, *, text: str | None = None, advance: bool = True) -> None:
        """One line; ``text`` is what it says when that is not the line itself (a JSON log record's
        message, or a line of its traceback: then ``advance`` is False, as it is the same input line),
        and the line is what a match quotes."""
        line = raw.rstrip("\r\n")
        self._lineno += advance
        if len(line) > MAX_LINE_CHARS:
            self.lines_cut += 1
            line = line[:MAX_LINE_CHARS]
        if not line.strip():
            return
        said = line if text is None else text.rstrip("\r\n")[:MAX_LINE_CHARS]
        if is_request_log(said):  # a user's prompt, stop strings or output: the request is being served
            self.request_lines += 1
            self._phase = "serving"
            return
        at = -1
        for phase, words in _PHASE_WORDS:
            for word in words:
                if (i := said.rfind(word)) >= at and i >= 0:
                    self._phase, at = phase, i
        if "model_executor/models/" in said and _MODEL_INIT.search(said):
            self._phase = "loading"
        if line[0] in " \tN" and text is None:  # `kubectl describe` lines are indented, or Name:/Namespace:
            self._kubectl.feed(line, self._lineno)
        if any(hint in said for hint in _EVIDENCE_HINTS):
            msg = message(said)  # evidence starts where its program prints it
            if not (self._torch(line, msg) or self._vllm(line, msg) or self._kernel(line, msg)
                    or self._xid(line, msg)):
                self._engine_line(msg)

    def _add(self, type_: str, line: str, **values: Any) -> bool:
        self._matches.append(Match(type_, line, self._lineno, values))
        return True

    def _torch(self, line: str, msg: str) -> bool:
        m = _TORCH_OOM.search(msg)
        if m is None:
            return _CUDA_ERROR_OOM.search(msg) is not None and self._add("torch-oom", line, phase=self._phase)
        v: dict[str, Any] = {"phase": self._phase, "requested_bytes": size_bytes(_s(m, 1), _s(m, 2))}
        if c := _T_CURRENT.search(msg):
            v.update(gpu=int(_s(c, 1)), total_bytes=size_bytes(_s(c, 2), _s(c, 3)),
                     free_bytes=size_bytes(_s(c, 4), _s(c, 5)), format="current")
        elif o := _T_OLD_GPU.search(msg):
            v.update(gpu=int(_s(o, 1)), total_bytes=size_bytes(_s(o, 2), _s(o, 3)),
                     allocated_bytes=size_bytes(_s(o, 4), _s(o, 5)), free_bytes=size_bytes(_s(o, 6), _s(o, 7)),
                     format="legacy")
            if r := _T_OLD_RESERVED.search(msg):
                v["reserved_bytes"] = size_bytes(_s(r, 1), _s(r, 2))
                v["reserved_unallocated_bytes"] = max(0, v["reserved_bytes"] - v["allocated_bytes"])
        if procs := {int(_s(p, 1)): size_bytes(_s(p, 2), _s(p, 3)) for p in _search_all(_T_PROC, msg)}:
            v["processes"] = procs
        v.update({key: size_bytes(_s(f, 1), _s(f, 2)) for key, pattern in _T_FIELDS if (f := pattern.search(msg))})
        return self._add("torch-oom", line, **v)

    def _vllm(self, line: str, msg: str) -> bool:
        if m := _KV_NEGATIVE.search(msg):
            return self._add("vllm-no-cache-blocks", line, shortfall_bytes=size_bytes(_s(m, 1), "GiB"))
        if _NO_BLOCKS.search(msg):
            return self._add("vllm-no-cache-blocks", line)
        if m := _V0_SEQ.search(msg):
            return self._add("vllm-kv-cache", line, max_model_len=int(_s(m, 1)), max_tokens=int(_s(m, 2)))
        if m := _V1_KV.search(msg):
            e = _V1_ESTIMATE.search(msg)
            return self._add("vllm-kv-cache", line, max_model_len=int(_s(m, 1)),
                             needed_bytes=size_bytes(_s(m, 2), "GiB"), available_bytes=size_bytes(_s(m, 3), "GiB"),
                             estimated_max_len=int(_s(e, 1)) if e else None)
        if m := _FREE.search(msg):
            return self._add("vllm-free-memory", line, device=m.group(1) or "", free_bytes=size_bytes(_s(m, 2), "GiB"),
                             total_bytes=size_bytes(_s(m, 3), "GiB"), utilization=float(_s(m, 4)),
                             requested_bytes=size_bytes(_s(m, 5), "GiB"))
        if m := _WARMUP.search(msg):
            return self._add("vllm-warmup-oom", line, what=_s(m, 1), requests=int(_s(m, 2)))
        if m := _PREEMPT.search(msg):
            t = _PREEMPT_TOTAL.search(msg)
            return self._add("vllm-preemption", line, mode=_s(m, 2), cumulative=int(_s(t, 1)) if t else None)
        return False

    def _kernel(self, line: str, msg: str) -> bool:
        if m := _CONSTRAINT.search(msg):
            self._kernel_scope = "memcg" if _s(m, 1) == "CONSTRAINT_MEMCG" else "host"
            memcg, task = _OOM_MEMCG.search(msg), _TASK.search(msg)
            return self._add("kernel-oom", line, scope=self._kernel_scope, memcg=_s(memcg, 1) if memcg else "",
                             process=_s(task, 1) if task else "", pid=int(_s(task, 2)) if task else None)
        if m := _TASK_IN.search(msg):
            self._kernel_scope = "memcg"
            return self._add("kernel-oom", line, scope="memcg", memcg=_s(m, 2), process="", pid=None)
        if m := _MEMCG_LIMIT.search(msg):
            return self._add("kernel-memcg-limit", line, usage_bytes=int(_s(m, 1)) * 1024,
                             limit_bytes=int(_s(m, 2)) * 1024)
        if m := _KILLED.search(msg):
            if killer := m.group(1):
                self._kernel_scope = "memcg" if killer.startswith("Memory cgroup") else "host"
            rss = _ANON_RSS.search(msg)
            return self._add("kernel-oom", line, scope=self._kernel_scope or "host", memcg="", process=_s(m, 3),
                             pid=int(_s(m, 2)), anon_rss_bytes=int(_s(rss, 1)) * 1024 if rss else None)
        return False

    def _xid(self, line: str, msg: str) -> bool:
        if m := _XID.search(msg):
            pid = _XID_PID.search(_s(m, 3))
            return self._add("xid", line, pci_bus_id=_s(m, 1), xid=int(_s(m, 2)),
                             pid=int(_s(pid, 1)) if pid else None, message=_s(m, 3).strip())
        if m := _OFF_BUS.search(msg):
            return self._add("xid", line, pci_bus_id=m.group(1) or "", xid=79, pid=None,
                             message="GPU has fallen off the bus")
        return False

    def _engine_line(self, line: str) -> None:
        e = self.engine
        if m := _ENGINE.search(line):
            config = _s(m, 3)
            e.version, e.model = m.group(2) or e.version, _cfg_value(config, "model") or e.model
            self._numbers(config, max_model_len="max_seq_len", tensor_parallel_size="tensor_parallel_size")
            for attr in ("quantization", "kv_cache_dtype"):
                if (text := _cfg_value(config, attr)) is not None:
                    setattr(e, attr, "none" if text == "None" else text)
        if _ARGS.search(line) or _PROFILE.search(line):
            keys = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "tensor_parallel_size")
            self._numbers(line, swap_space_gib="swap_space", **{k: k for k in keys})
            if m := _TOTAL_MEMORY.search(line):
                e.total_gpu_memory_bytes = size_bytes(_s(m, 1), "GiB")
            if m := _UTILIZATION.search(line):
                e.gpu_memory_utilization = float(_s(m, 1))
        if m := _WEIGHTS.search(line):
            e.weights_bytes = size_bytes(_s(m, 1), "GiB")  # vLLM's "GB" here is GiB (it divides by 2**30)
        if m := _KV_AVAILABLE.search(line):
            e.kv_cache_bytes = size_bytes(_s(m, 1), "GiB")
        if m := _BLOCKS.search(line):
            e.cpu_blocks = int(_s(m, 2))

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
    config the logs describe. Lines end at ``\\n`` only, as a log file's do (a ``\\u2028`` in a
    quoted prompt does not start a line). A JSON log record is read by its message field."""
    text = lines.split("\n") if isinstance(lines, str) else [ln.rstrip("\r\n") for ln in lines]
    scanner, docs, i = EvidenceScanner(), JsonDocuments(text), 0
    pods: list[Match] = []
    while i < len(text):
        line = text[i].rstrip("\r")
        if line.startswith("{"):
            doc, used = docs.at(i)
            if is_pod(doc):
                pods.extend(Match("k8s-oom", summary, i + 1, values) for summary, values in pod_oom_kills(doc))
                scanner.skip(used)
                i += used
                continue
            if isinstance(doc, dict) and used == 1:
                said = record_texts(doc)
                if not said:  # a record with no message (its other fields are data, not log text)
                    scanner.skip(1)
                for n, text_line in enumerate(said):  # the message, then its traceback's lines
                    scanner.feed(line, text=text_line, advance=n == 0)
                i += 1
                continue
        scanner.feed(line)
        i += 1
    return sorted(scanner.finish() + pods, key=lambda m: m.lineno), scanner.engine
