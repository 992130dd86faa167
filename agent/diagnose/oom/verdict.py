"""The OOM verdict: from evidence lines (and what the daemon knows) to findings with a fix.

An inference server dies of "out of memory" in at least nine ways, each with its own knob:
weights that do not fit need more tensor parallelism or quantization, a KV cache too small
for ``--max-model-len`` needs a shorter context or more memory, a sampler warm-up with many
dummy requests after the KV cache fit needs fewer ``--max-num-seqs``, a PyTorch OOM while serving
needs activation headroom, a memory-cgroup kill needs a larger container limit, an XID needs
a drained node. :func:`diagnose_oom` tells them apart from the lines
:mod:`agent.diagnose.oom.evidence` recognises and puts a concrete value on the knob: vLLM's own
estimate where it printed one, the memory planner where model and GPU are known, otherwise a
rule of thumb named where it is applied.

:class:`OomContext` is what the daemon knows besides the logs (the engine's cache config from
``vllm:cache_config_info``, the GPU's memory history from NVML/DCGM, the container limit);
:func:`context_from_store` builds it from the series store. Both live in
:mod:`agent.diagnose.oom.context` and are re-exported here. Where the log and the context
both say something the log wins: it describes the run that failed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import structlog

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.diagnose.oom.context import OomContext, context_from_store, effective_context
from agent.diagnose.oom.evidence import EngineConfig, Match, parse_evidence
from agent.diagnose.oom.planned import DEFAULT_UTILIZATION, planner_suggestion
from agent.diagnose.oom.xid import xid_info
from agent.diagnose.plan import planner
from agent.errors import DiagnosisError

__all__ = ["DEFAULT_UTILIZATION", "KINDS", "OomContext", "context_from_store", "diagnose_oom", "headroom_utilization",
           "planner_suggestion"]

log = structlog.get_logger(__name__)

GIB = 2**30
#: Finding kinds in report order: hardware first, then start-up failures, then runtime.
KINDS = ("gpu-hardware", "gpu-memory-contention", "gpu-oom-startup-weights", "gpu-oom-startup-kv-cache",
         "gpu-oom-startup-warmup", "gpu-oom-runtime", "container-oom", "host-oom", "kv-cache-preemption")
MAX_UTILIZATION = planner.MAX_UTILIZATION  # never suggest more: CUDA context, NCCL, graphs live outside it
STEP = 0.05  # utilization given back (runtime OOM) or taken (KV pressure) when nothing says how much
CONTENTION_SHARE = 0.05  # another process holding this share of the GPU (and >= 1 GiB) is contention
DEFAULT_SWAP_GIB = 4.0  # vLLM's --swap-space default: pinned host memory per GPU (V0 engine)
BLOCK = 16  # vLLM's KV block size; --max-model-len suggestions are a multiple of it
OVERSIZED_SHARE = 0.2  # one allocation this big is a batch too large for the GPU, not missing headroom
LIMIT_GROWTH = 1.25  # a container limit suggestion grows by at least a quarter: the old one was too small


# -- helpers -----------------------------------------------------------------------------------
def _util(x: float) -> str:
    return f"{max(0.01, math.floor(x * 100 + 1e-9) / 100):.2f}"


def _gib(n: float | None) -> float | None:
    return None if n is None else round(n / GIB, 2)


def _finding(kind: str, matches: list[Match], summary: str, *, setting: str, value: str, details: dict[str, Any],
             base: str, severity: str = "critical", labels: dict[str, str] | None = None) -> Finding:
    counts: dict[str, int] = {}
    for m in matches:
        counts[m.line] = counts.get(m.line, 0) + 1
    details = {**details, "evidence_counts": list(counts.values()), "occurrences": len(matches)}
    return Finding(kind=kind, summary=summary, severity=severity, evidence=list(counts), setting=setting,
                   suggested_value=value, details=details, runbook_url=runbook_url(f"diagnosis-{kind}", base),
                   labels=labels or {})


def _torch_numbers(ms: list[Match]) -> dict[str, Any]:
    v = next((m.values for m in reversed(ms) if "requested_bytes" in m.values), ms[-1].values)
    keys = ("requested", "total", "free", "in_use", "allocated", "private_pools", "reserved", "reserved_unallocated")
    out: dict[str, Any] = {f"{k}_gib": _gib(v[f"{k}_bytes"]) for k in keys if f"{k}_bytes" in v}
    return {**out, "phase": v.get("phase", "unknown"), **({"gpu": v["gpu"]} if "gpu" in v else {})}


def _gpu_label(ms: list[Match]) -> dict[str, str]:
    gpus = sorted({str(m.values["gpu"]) for m in ms if "gpu" in m.values})
    return {"gpu": ",".join(gpus)} if gpus else {}


def _others(m: Match) -> tuple[int, int]:
    """``(bytes held by other processes, GPU total)`` from a PyTorch OOM's "Process N has ..."."""
    v, procs = m.values, dict(m.values.get("processes", {}))
    if procs and "in_use_bytes" not in v:  # no "this process" entry: drop the one nearest PyTorch's own
        own = v.get("allocated_bytes", 0) + v.get("reserved_unallocated_bytes", 0)
        procs.pop(min(procs, key=lambda pid: abs(procs[pid] - own)))
    return sum(procs.values()), int(v.get("total_bytes", 0))


def _contended(m: Match) -> bool:
    others, total = _others(m)
    return total > 0 and others >= max(CONTENTION_SHARE * total, GIB)


# -- one builder per kind ----------------------------------------------------------------------
def _hardware(ms: list[Match], base: str) -> list[Finding]:
    out = []
    for code in sorted({m.values["xid"] for m in ms}):
        info, group = xid_info(code), [m for m in ms if m.values["xid"] == code]
        if not info.hardware:
            log.debug("application-side xid left to the GPU alerts", xid=code)
            continue
        buses = sorted({m.values["pci_bus_id"] for m in group if m.values["pci_bus_id"]})
        out.append(_finding("gpu-hardware", group, f"XID {code} ({info.meaning}) on GPU {', '.join(buses) or '?'}: "
                            "a hardware fault, not a configuration problem.", setting="", value=info.action, base=base,
                            details={"xid": code, "meaning": info.meaning, "pci_bus_ids": buses},
                            labels={"xid": str(code), "pci_bus_id": ",".join(buses)}))
    return out


def _contention(free: list[Match], torch: list[Match], base: str) -> Finding:
    if free:
        v = free[-1].values
        total, others = v["total_bytes"], v["total_bytes"] - v["free_bytes"]
        details = {"free_gib": _gib(v["free_bytes"]), "requested_utilization": v["utilization"],
                   "requested_gib": _gib(v["requested_bytes"]), "device": v["device"]}
    else:
        (others, total), details = _others(torch[-1]), _torch_numbers(torch)
    details.update(total_gib=_gib(total), held_by_others_gib=_gib(others))
    value = _util((total - others) / total - 0.01)  # 1 % margin: printed numbers are rounded, others' use moves
    return _finding("gpu-memory-contention", free + torch, f"Other processes hold {_gib(others)} GiB of the GPU, "
                    f"leaving {(total - others) / total:.0%} for vLLM: free the GPU or lower "
                    f"--gpu-memory-utilization to {value}.", setting="--gpu-memory-utilization", value=value,
                    base=base, details=details, labels=_gpu_label(torch) or (
                        {"gpu": details["device"].rpartition(":")[2]} if details.get("device") else {}))


def _weights(ms: list[Match], ctx: OomContext, base: str) -> Finding:
    tp = ctx.tensor_parallel_size or 1
    details = {**(_torch_numbers(ms) if ms[-1].type == "torch-oom" else {}), "tensor_parallel_size": tp}
    setting, value = "--tensor-parallel-size", str(tp * 2)  # halves the weights per GPU
    if planned := planner_suggestion("gpu-oom-startup-weights", ctx):
        setting, value, details["planner"] = planned
    return _finding("gpu-oom-startup-weights", ms, f"The model's weights do not fit on the GPU at "
                    f"--tensor-parallel-size {tp}: shard them over more GPUs or load a quantized checkpoint.",
                    setting=setting, value=value, base=base, details=details, labels=_gpu_label(ms))


def _kv_too_small(ms: list[Match], no_blocks: list[Match], ctx: OomContext, eng: EngineConfig,
                  base: str) -> Finding:
    v = ms[-1].values
    max_len, details = v["max_model_len"], {"max_model_len": v["max_model_len"]}
    if "max_tokens" in v:  # V0: the whole cache holds max_tokens tokens (blocks x block size)
        estimate, details["source"] = v["max_tokens"], "vLLM: tokens the KV cache holds"
        grow = eng.kv_cache_bytes * (max_len / estimate - 1) if eng.kv_cache_bytes else None
    else:
        details.update(needed_gib=_gib(v["needed_bytes"]), available_gib=_gib(v["available_bytes"]))
        estimate, details["source"] = v["estimated_max_len"], "vLLM's estimate"
        if estimate is None:  # older V1 printed none: full attention's KV bytes are linear in tokens
            estimate, details["source"] = int(max_len * v["available_bytes"] / v["needed_bytes"]), "linear estimate"
        grow = v["needed_bytes"] - v["available_bytes"]
    value = str(max(BLOCK, estimate // BLOCK * BLOCK))
    available = v.get("available_bytes") or eng.kv_cache_bytes
    if available and (fp8 := _fp8_tokens(ctx, available)) is not None:
        details.update(fp8)
        if fp8["fp8_max_tokens"] >= max_len and ctx.kv_cache_dtype in (None, "auto"):
            details["alternative_fp8"] = "--kv-cache-dtype fp8"
    total = eng.total_gpu_memory_bytes or ctx.gpu_total_bytes
    if grow is not None and total:
        util = math.ceil(((ctx.gpu_memory_utilization or DEFAULT_UTILIZATION) + grow / total) * 100) / 100
        if util <= MAX_UTILIZATION:
            details["alternative"] = f"--gpu-memory-utilization {util:.2f}"
    return _finding("gpu-oom-startup-kv-cache", sorted(ms + no_blocks, key=lambda m: m.lineno), f"The KV cache "
                    f"cannot hold one {max_len}-token sequence: lower "
                    f"--max-model-len to {value} or give vLLM more memory.", setting="--max-model-len", value=value,
                    base=base, details=details)


def _warmup(ms: list[Match], torch: list[Match], ctx: OomContext, eng: EngineConfig, base: str) -> Finding:
    """The KV cache was sized, then warming up the sampler (or pooler) with ``requests`` dummy requests
    (``min(max_num_seqs, max_num_batched_tokens)``) ran out of the memory left outside
    ``--gpu-memory-utilization``. Fewer sequences shrink that batch; a lower utilization leaves it room."""
    v = ms[-1].values
    requests, what = int(v["requests"]), str(v["what"])
    details: dict[str, Any] = {"warmup": what, "dummy_requests": requests}
    step = STEP
    if torch:
        details.update(_torch_numbers(torch))
        t = next((m.values for m in reversed(torch) if "requested_bytes" in m.values), {})
        requested, free, total = t.get("requested_bytes"), t.get("free_bytes"), t.get("total_bytes")
        if requested and total:  # give the failed allocation (and 1 % more) back to the warm-up
            step = max(STEP, math.ceil((requested - (free or 0)) / total * 100 + 1) / 100)
    # The warm-up's logits and sampling buffers grow with the batch: halve it, in multiples of 8 (the
    # CUDA-graph batch sizes vLLM captures), unless the engine's own --max-num-seqs is already lower.
    half = min(requests, ctx.max_num_seqs or requests) // 2
    seqs = half // 8 * 8 if half >= 8 else max(1, half)
    util = ctx.gpu_memory_utilization or DEFAULT_UTILIZATION
    lowered = headroom_utilization(util, step)
    details.update(gpu_memory_utilization=util, gpu_memory_utilization_assumed=ctx.gpu_memory_utilization is None,
                   alternatives=[f"--gpu-memory-utilization {lowered}"])
    if eng.kv_cache_bytes:
        details["kv_cache_gib"] = _gib(eng.kv_cache_bytes)
    return _finding("gpu-oom-startup-warmup", sorted(ms + torch, key=lambda m: m.lineno),
                    f"The KV cache fit, but warming up the {what} with {requests} dummy requests ran out of GPU "
                    f"memory at start-up: lower --max-num-seqs to {seqs} (a smaller warm-up batch), or lower "
                    f"--gpu-memory-utilization from {util} to {lowered} to leave the warm-up room.",
                    setting="--max-num-seqs", value=str(seqs), base=base, details=details, labels=_gpu_label(torch))


def _fp8_tokens(ctx: OomContext, available: int) -> dict[str, int] | None:
    """The planner's KV bytes per token and GPU of the context's model (MoE/MLA aware as the
    planner is), at its KV dtype and in fp8, and the tokens ``available`` bytes hold in fp8;
    None when the model is no planner model."""
    try:
        inp = planner.PlanInput(model=planner.find_model(ctx.model or ""), gpu_memory_bytes=1,
                                tensor_parallel_size=ctx.tensor_parallel_size or 1,
                                kv_cache_dtype=ctx.kv_cache_dtype if ctx.kv_cache_dtype in planner.KV_CACHE_DTYPES
                                else "auto")
        planner.validate(inp)
    except DiagnosisError:
        return None
    per_tok = planner.kv_bytes_per_token(inp)[1]
    fp8 = planner.kv_bytes_per_token(replace(inp, kv_cache_dtype="fp8"))[1]
    return {"kv_bytes_per_token_per_gpu": per_tok, "fp8_kv_bytes_per_token_per_gpu": fp8,
            "fp8_max_tokens": available // fp8}


def _no_blocks(ms: list[Match], ctx: OomContext, base: str) -> Finding:
    util = ctx.gpu_memory_utilization or DEFAULT_UTILIZATION
    setting, value = "--gpu-memory-utilization", raised_utilization(util)
    details: dict[str, Any] = {"gpu_memory_utilization": util,
                               "gpu_memory_utilization_assumed": ctx.gpu_memory_utilization is None}
    if planned := planner_suggestion("gpu-oom-startup-kv-cache", ctx):
        setting, value, details["planner"] = planned
    short = max((m.values.get("shortfall_bytes", 0) for m in ms), default=0)  # a logged negative KV figure
    details |= {"kv_shortfall_gib": _gib(short)} if short else {}
    over = f" (vLLM logged {-short / 2**30:.2f} GiB of KV memory: {short / 2**30:.2f} GiB short)" if short else ""
    return _finding("gpu-oom-startup-kv-cache", ms, f"Weights and activations left no memory for the KV cache{over} at "
                    f"--gpu-memory-utilization {util}: raise it (or quantize the model).", setting=setting,
                    value=value, base=base, details=details)


def raised_utilization(util: float) -> str:
    """``--gpu-memory-utilization`` raised by STEP for a bigger KV cache, never past MAX_UTILIZATION."""
    return f"{min(MAX_UTILIZATION, util + STEP):.2f}"


def headroom_utilization(util: float | None, step: float = STEP) -> str:
    """``--gpu-memory-utilization`` lowered by ``step`` (from vLLM's default when unknown), leaving
    that share of the GPU to activations: the runtime-OOM advice, whoever detected the OOM."""
    return f"{max(0.05, round((util or DEFAULT_UTILIZATION) - step, 2)):.2f}"


def _runtime(ms: list[Match], ctx: OomContext, eng: EngineConfig, base: str) -> Finding:
    v = next((m.values for m in reversed(ms) if "requested_bytes" in m.values), ms[-1].values)
    details, labels = _torch_numbers(ms), _gpu_label(ms)
    requested, total = v.get("requested_bytes") or 0, v.get("total_bytes") or ctx.gpu_total_bytes or 0
    unallocated = v.get("reserved_unallocated_bytes", 0)
    util = ctx.gpu_memory_utilization or DEFAULT_UTILIZATION
    step = max(STEP, math.ceil(requested / total * 100) / 100) if requested and total else STEP  # frees the request
    lowered = headroom_utilization(util, step)
    batched = str(max(256, (eng.max_num_batched_tokens or 4096) // 2))  # half; 2048 is vLLM's small-GPU default
    details.update(gpu_memory_utilization=util, gpu_memory_utilization_assumed=ctx.gpu_memory_utilization is None,
                   alternatives=[f"--max-num-seqs {max(1, (ctx.max_num_seqs or 256) // 2)}",
                                 f"--max-num-batched-tokens {batched}", "--enable-chunked-prefill"])
    if ctx.gpu_memory_history:
        details["gpu_peak_used_fraction"] = round(max(u / t for _, u, t in ctx.gpu_memory_history), 3)
    oversized = bool(total) and requested >= OVERSIZED_SHARE * total
    # Fragmentation: cached-but-free memory would have covered the request, or (for a normal-sized
    # request) it is a tenth of the GPU.
    details["fragmentation"] = fragmented = bool(requested and unallocated) and (
        unallocated >= requested or (not oversized and unallocated >= 0.1 * total))
    if fragmented:
        details["alternatives"].insert(0, f"--gpu-memory-utilization {lowered}")
        return _finding("gpu-oom-runtime", ms, f"PyTorch ran out of GPU memory with {_gib(unallocated)} GiB reserved "
                        "but unallocated: the caching allocator is fragmented.", setting="PYTORCH_CUDA_ALLOC_CONF",
                        value="expandable_segments:True", base=base, details=details, labels=labels)
    if oversized:
        return _finding("gpu-oom-runtime", ms, f"One {_gib(requested)} GiB allocation ({requested / total:.0%} of the "
                        "GPU) failed: the batch is too large for the GPU, lowering --gpu-memory-utilization will not "
                        "help.", setting="--max-num-batched-tokens", value=batched, base=base, details=details,
                        labels=labels)
    where = {"serving": "while serving", "profiling": "while profiling memory at start-up",
             "cuda-graphs": "while capturing CUDA graphs", "loaded": "after loading the weights"}
    return _finding("gpu-oom-runtime", ms, f"PyTorch ran out of GPU memory {where.get(details['phase'], 'at runtime')}"
                    f": lower --gpu-memory-utilization from {util} to {lowered} to leave activation headroom.",
                    setting="--gpu-memory-utilization", value=lowered, base=base, details=details, labels=labels)


def _container(ms: list[Match], ctx: OomContext, eng: EngineConfig, base: str) -> Finding:
    limit = next((m.values["limit_bytes"] for m in reversed(ms) if m.values.get("limit_bytes")), None)
    limit = limit or ctx.container_memory_limit_bytes
    rss = max((m.values.get("anon_rss_bytes") or 0 for m in ms), default=0)
    pinned = bool(eng.cpu_blocks) or bool(ctx.swap_space_bytes)  # V0 pins --swap-space per GPU in the container
    swap = (ctx.swap_space_bytes if ctx.swap_space_bytes is not None else DEFAULT_SWAP_GIB * GIB) * (
        ctx.tensor_parallel_size or 1) if pinned else 0
    now = limit or rss
    need = max(now * LIMIT_GROWTH, now + swap)
    value = "" if not now else f"{math.ceil(need / GIB)}Gi" if need >= GIB else f"{math.ceil(need / 2**20)}Mi"
    confirmed = any(m.type != "k8s-oom" or m.values.get("reason") == "OOMKilled" for m in ms)
    k8s = [m.values for m in ms if m.type == "k8s-oom"]
    details = {"limit_gib": _gib(limit), "killed_anon_rss_gib": _gib(rss or None), "confirmed_oom": confirmed,
               "pinned_swap_gib": _gib(swap), "restart_count": k8s[-1].get("restart_count") if k8s else None}
    why = "OOM-killed by its memory cgroup" if confirmed else "killed with exit code 137 (SIGKILL: OOM or a probe)"
    return _finding("container-oom", ms, f"The container was {why}: host RAM inside its limit ran out, not GPU memory;"
                    " raise the container memory limit.", setting="resources.limits.memory", value=value, base=base,
                    details=details, severity="critical" if confirmed else "warning",
                    labels={k: str(k8s[-1][k]) for k in ("namespace", "pod", "container") if k8s and k8s[-1].get(k)})


def _host_oom(ms: list[Match], ctx: OomContext, base: str) -> Finding:
    swap = ctx.swap_space_bytes / GIB if ctx.swap_space_bytes is not None else DEFAULT_SWAP_GIB
    killed = sorted({f"{m.values['process']} ({m.values['pid']})" for m in ms if m.values.get("pid") is not None})
    return _finding("host-oom", ms, "The kernel OOM killer ran out of host RAM and killed processes: lower vLLM's "
                    "pinned --swap-space or add host memory.", setting="--swap-space", value=f"{int(swap // 2)}",
                    base=base, details={"killed": killed, "swap_space_gib": swap, "pinned_swap_gib_total": swap * (
                        ctx.tensor_parallel_size or 1), "swap_space_assumed": ctx.swap_space_bytes is None})


def _preemption(ms: list[Match], ctx: OomContext, base: str) -> Finding:
    total = max((m.values.get("cumulative") or 0 for m in ms), default=0)
    util = ctx.gpu_memory_utilization or DEFAULT_UTILIZATION
    details: dict[str, Any] = {"cumulative_preemptions": total, "gpu_memory_utilization": util,
                               "modes": sorted({m.values["mode"] for m in ms})}
    if util < MAX_UTILIZATION:
        setting, value = "--gpu-memory-utilization", raised_utilization(util)
    elif planned := planner_suggestion("kv-cache-preemption", ctx):  # no memory left to give: admit fewer
        setting, value, details["planner"] = planned
    else:  # a quarter fewer sequences when the planner cannot say how many fit
        setting, value = "--max-num-seqs", str(max(1, (ctx.max_num_seqs or 256) * 3 // 4))
    return _finding("kv-cache-preemption", ms, f"vLLM preempted running sequences for lack of KV cache space "
                    f"({total} so far): give the KV cache more memory or admit fewer sequences.", severity="warning",
                    setting=setting, value=value, base=base, details=details)


# -- the verdict -------------------------------------------------------------------------------
def diagnose_oom(lines: Iterable[str] | str, *, context: OomContext | None = None,
                 runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[Finding]:
    """One finding per kind of OOM evidence in ``lines`` (one per XID code), hardware and
    start-up failures first. No evidence, no findings."""
    matches, eng = parse_evidence(lines)
    ctx = effective_context(eng, context or OomContext())
    by: dict[str, list[Match]] = {}
    for m in matches:
        by.setdefault(m.type, []).append(m)
    torch, no_blocks, kernel = by.get("torch-oom", []), by.get("vllm-no-cache-blocks", []), by.get("kernel-oom", [])
    contended = [m for m in torch if _contended(m)]
    loading = [m for m in torch if m not in contended and m.values.get("phase") == "loading"]
    running = [m for m in torch if m not in contended and m not in loading]
    blocks_hopeless = bool(no_blocks) and (ctx.gpu_memory_utilization or 0) >= MAX_UTILIZATION
    memcg = [m for m in kernel if m.values["scope"] == "memcg"] + by.get("k8s-oom", [])
    findings = _hardware(by.get("xid", []), runbook_base)
    if by.get("vllm-free-memory") or contended:
        findings.append(_contention(by.get("vllm-free-memory", []), contended, runbook_base))
    if loading or blocks_hopeless:
        findings.append(_weights(loading or no_blocks, ctx, runbook_base))
    if by.get("vllm-kv-cache"):
        findings.append(_kv_too_small(by["vllm-kv-cache"], no_blocks, ctx, eng, runbook_base))
    elif no_blocks and not blocks_hopeless:
        findings.append(_no_blocks(no_blocks, ctx, runbook_base))
    if warm := by.get("vllm-warmup-oom", []):  # PyTorch's OOM inside the warm-up is the same failure
        last = warm[-1].lineno
        absorbed = [m for m in running if m.values.get("phase") == "warmup" or (
            m.lineno <= last and m.values.get("phase") != "serving")]  # a serving OOM is an earlier run's
        running = [m for m in running if m not in absorbed]
        findings.append(_warmup(warm, absorbed, ctx, eng, runbook_base))
    if running:
        findings.append(_runtime(running, ctx, eng, runbook_base))
    if memcg:
        findings.append(_container(memcg + by.get("kernel-memcg-limit", []), ctx, eng, runbook_base))
    if host := [m for m in kernel if m.values["scope"] == "host"]:
        findings.append(_host_oom(host, ctx, runbook_base))
    if by.get("vllm-preemption"):
        findings.append(_preemption(by["vllm-preemption"], ctx, runbook_base))
    log.debug("oom diagnosis done", lines_matched=len(matches), findings=len(findings))
    return sorted(findings, key=lambda f: KINDS.index(f.kind))
