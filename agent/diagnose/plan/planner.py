"""The GPU memory planner: will this model, on these GPUs, with these serving flags fit?

Given a model shape (:class:`~agent.diagnose.plan.models.ModelSpec`), a GPU size and the
flags vLLM or LMDeploy is started with (:class:`PlanInput`), :func:`plan` works out, per
GPU, the weights, the KV bytes per token (with grouped-query attention, and the guides'
``2 × layers × hidden_size`` form beside it), the memory left for the KV cache and the
number of full-length sequences it holds: the arithmetic, and where its constants come
from, is :mod:`agent.diagnose.plan.memory` (re-exported here). This module turns those
numbers into a :class:`Plan` and its recommendations: a shorter ``--max-model-len``, fewer
``--max-num-seqs``, a higher ``--gpu-memory-utilization``, a smaller KV dtype, quantized
weights, more tensor or pipeline parallelism — each checked by planning it again.

Which vLLM accounting it models (``PlanInput.vllm_accounting``, :mod:`agent.diagnose.plan.overhead`):
``"v0"`` for the V0 engine, ``"v1"`` (the default) for V1 in vLLM 0.8–0.20 and ``"v1-cudagraphs"``
for 0.21+, which also reserves its CUDA-graph estimate. ``Plan.kv_bytes_available`` (JSON
``kv_gib_available``) is vLLM's "Available KV cache memory" line, per GPU: ``total ×
gpu_memory_utilization − weights − overhead`` (clamped at 0; vLLM logs the negative figure and
refuses to start); ``max_tokens_in_cache`` is its "GPU KV cache size: N tokens". Calibrated on
V1 logs of vLLM 0.9–0.27 and V0 logs of 0.6.5–0.8 (``tests/fixtures/planner/calibration/``).

Findings carry the flag to change and the value to set; their ``kind`` names the runbook
(``runbooks/diagnosis-kv-cache-capacity.md``, ``runbooks/diagnosis-weights-do-not-fit.md``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.diagnose.plan.memory import (
    ENGINES,
    KV_CACHE_DTYPES,
    LMDEPLOY_SCALE_BYTES,
    MAX_UTILIZATION,
    QUANTIZATIONS,
    GiB,
    MemoryNumbers,
    PlanInput,
    activation_bytes,
    batched_tokens,
    is_valid,
    kv_bytes_per_token,
    kv_layout,
    max_model_len_for,
    memory_numbers,
    utilization_for,
    validate,
    weight_bytes,
)
from agent.diagnose.plan.models import ModelSpec, find_model, gpu_memory_bytes

__all__ = [
    "ENGINES",
    "KINDS",
    "KV_CACHE_DTYPES",
    "LMDEPLOY_SCALE_BYTES",
    "MAX_UTILIZATION",
    "QUANTIZATIONS",
    "GiB",
    "ModelSpec",
    "Plan",
    "PlanInput",
    "activation_bytes",
    "find_model",
    "gpu_memory_bytes",
    "kv_bytes_per_token",
    "max_model_len_for",
    "plan",
    "utilization_for",
    "validate",
    "weight_bytes",
]

#: Finding kinds the planner emits (each has runbooks/diagnosis-<kind>.md).
KINDS = ("weights-do-not-fit", "kv-cache-capacity")


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one :class:`PlanInput`: the per-GPU numbers and what to change."""

    input: PlanInput
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_token_guide: int
    overhead_bytes: int
    kv_bytes_available: int
    max_concurrent_seqs: int
    max_tokens_in_cache: int
    fits: bool
    weights_fit: bool
    recommendations: list[Finding]
    max_concurrent_seqs_guide: int = 0  # the same memory counted with the guides' KV formula
    notes: list[str] = field(default_factory=list)

    @property
    def engine_starts(self) -> bool:
        """vLLM refuses to start unless one full-length sequence fits in the KV cache."""
        return self.weights_fit and self.max_concurrent_seqs >= 1

    def to_json(self) -> dict[str, Any]:
        inp = self.input
        return {
            "model": inp.model.name,
            "engine": inp.engine,
            "gpu": inp.gpu,
            "gpu_memory_bytes": inp.gpu_memory_bytes,
            "tensor_parallel_size": inp.tensor_parallel_size,
            "pipeline_parallel_size": inp.pipeline_parallel_size,
            "max_model_len": inp.effective_max_model_len,
            "max_num_seqs": inp.max_num_seqs,
            "gpu_memory_utilization": inp.gpu_memory_utilization,
            "cache_max_entry_count": inp.cache_max_entry_count,
            "quantization": inp.quantization,
            "kv_cache_dtype": inp.kv_cache_dtype,
            "block_size": inp.block_size,
            "model_spec": asdict(inp.model),
            "weights_bytes_per_gpu": self.weights_bytes_per_gpu,
            "weights_gib_per_gpu": round(self.weights_bytes_per_gpu / GiB, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_bytes_per_token_guide_formula": self.kv_bytes_per_token_guide,
            "overhead_gib": round(self.overhead_bytes / GiB, 3),
            "kv_bytes_available": self.kv_bytes_available,
            "kv_gib_available": round(self.kv_bytes_available / GiB, 3),
            "max_tokens_in_cache": self.max_tokens_in_cache,
            "max_concurrent_seqs": self.max_concurrent_seqs,
            "max_concurrent_seqs_guide_formula": self.max_concurrent_seqs_guide,
            "fits": self.fits,
            "weights_fit": self.weights_fit,
            "engine_starts": self.engine_starts,
            "recommendations": [f.to_json() for f in self.recommendations],
            "notes": list(self.notes),
        }


def plan(inp: PlanInput, *, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> Plan:
    """Work out the memory plan and what to change. Raises :class:`DiagnosisError` on
    inputs the engine itself would reject (heads not divisible by TP, utilization > 1, …)."""
    validate(inp)
    n = memory_numbers(inp)
    fits = n.weights_fit and n.seqs >= inp.max_num_seqs
    notes: list[str] = []
    if inp.effective_max_model_len > inp.model.max_position_embeddings:
        notes.append(f"max_model_len {inp.effective_max_model_len} exceeds the model's "
                     f"{inp.model.max_position_embeddings}; vLLM refuses it unless rope scaling allows it")
    notes.extend(_shape_notes(inp))
    if inp.engine == "lmdeploy" and n.weights_fit:
        slack = int((inp.gpu_memory_bytes - n.weights - n.overhead) * (1 - inp.cache_max_entry_count))
        if slack < activation_bytes(inp):
            notes.append(f"only {slack / GiB:.2f} GiB stays free for activations after the KV cache; "
                         "lower --cache-max-entry-count if prefill runs out of memory")
    result = Plan(input=inp, weights_bytes_per_gpu=n.weights, kv_bytes_per_token=n.kv_tok,
                  kv_bytes_per_token_per_gpu=n.kv_tok_gpu, kv_bytes_per_token_guide=n.kv_guide,
                  overhead_bytes=n.overhead, kv_bytes_available=n.kv_avail, max_concurrent_seqs=n.seqs,
                  max_tokens_in_cache=n.tokens, fits=fits, weights_fit=n.weights_fit,
                  recommendations=[], max_concurrent_seqs_guide=n.seqs_guide, notes=notes)
    result.recommendations.extend(_recommend(result, n, runbook_base))
    return result


def _shape_notes(inp: PlanInput) -> list[str]:
    """What the model's shape does to the KV cache, in a line each."""
    m = inp.model
    out: list[str] = []
    layout = kv_layout(inp)
    if m.is_mla and inp.engine == "vllm":
        out.append(f"MLA: the KV cache keeps one latent of kv_lora_rank + qk_rope_head_dim = "
                   f"{m.kv_lora_rank + m.qk_rope_head_dim} elements per token and layer, whole on every TP rank, "
                   f"in blocks of {layout.block_size} tokens")
    window = max(layout.windows)
    if len(layout.windows) > 1:
        sliding = sum(1 for w in layout.windows if w)
        out.append(f"hybrid attention: vLLM's KV-cache manager makes {len(layout.windows)} groups of "
                   f"{layout.group_size} layers per GPU ({sliding} with a {window}-token window); "
                   "'GPU KV cache size' counts the blocks of one group, and a sequence holds blocks in every group")
    elif layout.windows[0]:
        out.append(f"every layer keeps only a {window}-token window: a sequence holds at most "
                   f"{layout.blocks_per_seq(inp.effective_max_model_len, batched_tokens(inp))} blocks")
    if m.attention_chunk_size and inp.engine == "vllm" and not inp.hybrid_chunked_attention:
        hybrid = memory_numbers(replace(inp, hybrid_chunked_attention=True))
        out.append(f"chunked attention: {m.num_chunked_layers} of {m.num_layers} layers attend within "
                   f"{m.attention_chunk_size:,}-token chunks, but vLLM keeps them at full length unless "
                   "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, with which the same cache holds "
                   f"{hybrid.seqs} sequences of {inp.effective_max_model_len:,} tokens")
    if m.is_moe:
        out.append(f"mixture of experts: all {m.num_experts} experts × {m.num_moe_layers} MoE layers are loaded "
                   f"({m.expert_params / 1e9:.1f} B of {m.num_params / 1e9:.1f} B parameters), "
                   f"{m.experts_per_token} used per token")
    return out


def _flag(inp: PlanInput, vllm: str, lmdeploy: str) -> str:
    return lmdeploy if inp.engine == "lmdeploy" else vllm


def _recommend(p: Plan, n: MemoryNumbers, base: str) -> list[Finding]:
    inp = p.input
    length = inp.effective_max_model_len
    evidence = [
        f"weights {n.weights / GiB:.2f} GiB per GPU (TP={inp.tensor_parallel_size}, "
        f"PP={inp.pipeline_parallel_size}, quantization={inp.quantization})",
        f"KV cache {n.kv_avail / GiB:.2f} GiB per GPU = {p.max_tokens_in_cache:,} tokens at "
        f"{n.kv_tok_gpu:,} B/token/GPU",
        f"{p.max_concurrent_seqs} concurrent sequences of {length:,} tokens; "
        f"{_flag(inp, '--max-num-seqs', '--max-batch-size')} is {inp.max_num_seqs}",
    ]
    details = {"max_concurrent_seqs": p.max_concurrent_seqs, "max_tokens_in_cache": p.max_tokens_in_cache,
               "kv_bytes_available": n.kv_avail, "weights_bytes_per_gpu": n.weights}
    if not n.weights_fit:
        usable = inp.gpu_memory_bytes if inp.engine == "lmdeploy" else int(inp.gpu_memory_bytes *
                                                                           inp.gpu_memory_utilization)
        head = (f"the weights ({n.weights / GiB:.2f} GiB per GPU) plus {n.overhead / GiB:.2f} GiB overhead do "
                f"not fit in {usable / GiB:.2f} GiB")
        template = Finding(kind="weights-do-not-fit", severity="critical", summary=head, evidence=evidence,
                           details=details, runbook_url=runbook_url("diagnosis-weights-do-not-fit", base))
        out = []
        if inp.quantization == "none":
            alt = memory_numbers(replace(inp, quantization="awq"))
            if alt.weights_fit:
                out.append(_suggest(template, _flag(inp, "--quantization", "--model-format"), "awq",
                                    f"a 4-bit AWQ checkpoint needs {alt.weights / GiB:.2f} GiB per GPU and leaves "
                                    f"room for {_seqs(alt.seqs)}"))
        out.extend(_more_gpus(inp, template))
        return out or [template]
    url = runbook_url("diagnosis-kv-cache-capacity", base)
    if p.fits:
        return [Finding(kind="kv-cache-capacity", ok=True, severity="info", evidence=evidence, details=details,
                        runbook_url=url, summary=f"{inp.max_num_seqs} sequences of {length:,} tokens fit "
                                                 f"(room for {p.max_concurrent_seqs})")]
    head = (f"not even one {length:,}-token sequence fits in the KV cache: the engine will not start"
            if p.max_concurrent_seqs == 0 else
            f"only {p.max_concurrent_seqs} of {inp.max_num_seqs} sequences of {length:,} tokens fit in the KV "
            "cache; the rest wait or are preempted")
    template = Finding(kind="kv-cache-capacity", severity="critical" if p.max_concurrent_seqs == 0 else "warning",
                       summary=head, evidence=evidence, details=details, runbook_url=url)
    out = []
    shorter = max_model_len_for(inp, inp.max_num_seqs)
    if 0 < shorter < length:
        out.append(_suggest(template, _flag(inp, "--max-model-len", "--session-len"), str(shorter),
                            f"{inp.max_num_seqs} sequences fit at {shorter:,} tokens each"))
    if p.max_concurrent_seqs >= 1:
        out.append(_suggest(template, _flag(inp, "--max-num-seqs", "--max-batch-size"), str(p.max_concurrent_seqs),
                            f"{_seqs(p.max_concurrent_seqs)} fit"))
    util = utilization_for(inp, inp.max_num_seqs)
    if util is not None:
        out.append(_suggest(template, _flag(inp, "--gpu-memory-utilization", "--cache-max-entry-count"),
                            f"{util:.2f}", f"at {util:.2f} all {inp.max_num_seqs} fit (never above {MAX_UTILIZATION})"))
    option = _kv_dtype_option(inp)
    if option is not None:
        setting, value, target = option
        alt = memory_numbers(replace(inp, kv_cache_dtype=target))
        if alt.seqs > n.seqs:
            out.append(_suggest(template, setting, value, f"an {target} KV cache holds {_seqs(alt.seqs)} (check "
                                                          "output quality on your own traffic)"))
    if p.max_concurrent_seqs == 0:
        out.extend(_more_gpus(inp, template))
    return out or [template]


def _suggest(template: Finding, setting: str, value: str, why: str) -> Finding:
    return replace(template, setting=setting, suggested_value=value, summary=f"{template.summary}; {why}")


def _kv_dtype_option(inp: PlanInput) -> tuple[str, str, str] | None:
    """(flag, value, kv dtype) for the next smaller KV cache element, if the engine has one."""
    bits = KV_CACHE_DTYPES[inp.kv_cache_dtype]
    if inp.engine == "vllm":
        return ("--kv-cache-dtype", "fp8", "fp8") if bits == 16 else None
    if bits == 16:
        return ("--quant-policy", "8", "int8")
    return ("--quant-policy", "4", "int4") if bits == 8 else None


def _more_gpus(inp: PlanInput, template: Finding) -> list[Finding]:
    """More GPUs: the smallest TP within one node (≤ 8) at which ``max_num_seqs`` fit, else the
    TP that fits the most; PP across nodes (at TP=8) only when no TP within a node starts."""
    best: tuple[PlanInput, MemoryNumbers] | None = None
    for tp in (2, 4, 8):
        cand = replace(inp, tensor_parallel_size=tp)
        alt = memory_numbers(cand) if tp > inp.tensor_parallel_size and is_valid(cand) else None
        if alt is not None and alt.weights_fit and alt.seqs >= 1:
            if best is None or alt.seqs > best[1].seqs:
                best = (cand, alt)
            if alt.seqs >= inp.max_num_seqs:
                break
    if best is not None:
        tp, seqs = best[0].tensor_parallel_size, best[1].seqs
        return [_suggest(template, _flag(inp, "--tensor-parallel-size", "--tp"), str(tp),
                         f"with TP={tp} (within one node) {_seqs(seqs)} fit")]
    for pp in (2, 3, 4, 6, 8) if inp.engine == "vllm" else ():
        cand = replace(inp, tensor_parallel_size=max(8, inp.tensor_parallel_size), pipeline_parallel_size=pp)
        alt = memory_numbers(cand) if pp > inp.pipeline_parallel_size and is_valid(cand) else None
        if alt is not None and alt.weights_fit and alt.seqs >= 1:
            return [_suggest(template, "--pipeline-parallel-size", str(pp),
                             f"TP={cand.tensor_parallel_size} within each node and PP={pp} across nodes fits "
                             f"{_seqs(alt.seqs)}")]
    return []


def _seqs(count: int) -> str:
    return f"{count} full-length sequence{'' if count == 1 else 's'}"
