"""The memory planner's fix for an OOM finding, where the model and the GPU are known.

:func:`planner_suggestion` plans the failed configuration again
(:mod:`agent.diagnose.plan.planner`) and returns the one flag that makes it start or stop
preempting: more tensor parallelism when the weights do not fit, a higher
``--gpu-memory-utilization`` (or a shorter ``--max-model-len``) when the KV cache is too small,
fewer ``--max-num-seqs`` when sequences are preempted. A ``--max-num-seqs`` the logs did not give
is vLLM V1's default for the GPU (it sizes the sampler warm-up the planner subtracts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog

from agent.diagnose.oom.context import OomContext
from agent.diagnose.plan import planner
from agent.diagnose.plan.overhead import default_max_num_seqs
from agent.errors import DiagnosisError

__all__ = ["DEFAULT_UTILIZATION", "planner_suggestion"]

log = structlog.get_logger(__name__)

DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default, assumed (and said so) when unknown


def _gib(n: int) -> float:
    return round(n / 2**30, 2)


def planner_suggestion(kind: str, ctx: OomContext) -> tuple[str, str, dict[str, Any]] | None:
    """The memory planner's ``(flag, value, its numbers)`` for a finding, or None when the model is
    no planner preset, the GPU size is unknown or the planner finds nothing that works."""
    quant = {"awq_marlin": "awq", "gptq_marlin": "gptq", None: "none"}.get(ctx.quantization, ctx.quantization)
    if not ctx.model or quant not in planner.QUANTIZATIONS:
        return None
    tp = ctx.tensor_parallel_size or 1
    try:
        gpu = ctx.gpu_total_bytes or planner.gpu_memory_bytes(ctx.gpu_name or "")
        inp = planner.PlanInput(
            model=planner.find_model(ctx.model), tensor_parallel_size=tp, max_model_len=ctx.max_model_len,
            gpu_memory_bytes=gpu,
            max_num_seqs=ctx.max_num_seqs or default_max_num_seqs(gpu, ctx.gpu_name or ""),
            gpu_memory_utilization=ctx.gpu_memory_utilization or DEFAULT_UTILIZATION,
            quantization=quant, kv_cache_dtype=ctx.kv_cache_dtype if ctx.kv_cache_dtype in planner.KV_CACHE_DTYPES
            else "auto")
        if kind == "gpu-oom-startup-weights":
            for more in (tp * 2, tp * 4, tp * 8):
                try:
                    p = planner.plan(replace(inp, tensor_parallel_size=more))
                except DiagnosisError:  # e.g. attention heads not divisible by this TP
                    continue
                if p.engine_starts:
                    return "--tensor-parallel-size", str(more), {"weights_gib_per_gpu": _gib(p.weights_bytes_per_gpu)}
            return None
        if kind == "gpu-oom-startup-kv-cache":
            if (util := planner.utilization_for(inp, 1)) is not None:
                return "--gpu-memory-utilization", f"{util:.2f}", {"max_model_len": inp.effective_max_model_len}
            n = planner.max_model_len_for(inp, 1)
            return ("--max-model-len", str(n), {"gpu_memory_utilization": inp.gpu_memory_utilization}) if n else None
        p = planner.plan(inp)  # kv-cache-preemption: admit what fits at full length
        if 1 <= p.max_concurrent_seqs < inp.max_num_seqs:
            return "--max-num-seqs", str(p.max_concurrent_seqs), {"max_tokens_in_cache": p.max_tokens_in_cache}
    except DiagnosisError as exc:
        log.debug("planner not applicable", model=ctx.model, error=str(exc))
    return None
