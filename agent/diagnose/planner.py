"""The GPU memory planner: will this model, on these GPUs, with these serving flags fit?

Given a model shape (:class:`~agent.diagnose.models.ModelSpec`), a GPU size and the
flags vLLM or LMDeploy is started with, :func:`plan` works out, per GPU:

* **weights** = parameters × bytes per parameter, divided by TP × PP. 16-bit: 2 B;
  ``int8``/``fp8``: 1 B; ``awq``/``gptq`` 4-bit: 0.5 B plus, per group of 128 weights, an
  fp16 scale (2 B) and a 4-bit zero point packed eight to an int32 (0.5 B), i.e.
  ``0.5 + 2.5/128 = 0.51953125`` B (GPTQ's per-input-row ``g_idx`` adds under 0.1 % and is
  left out). Embeddings and ``lm_head`` stay 16-bit in AWQ/GPTQ/FP8 checkpoints. The split
  over TP × PP is an approximation: vLLM shards the vocabulary over TP, and with PP the
  first stage holds the embedding and the last ``lm_head``.
* **KV bytes per token** = 2 (K and V) × layers × ``num_key_value_heads`` × ``head_dim`` ×
  KV dtype bytes. The guides' ``2 × layers × hidden_size × bytes`` assumes one KV head per
  query head; for grouped-query attention (Llama-3-70B: 8 KV heads, 64 query heads) it is
  8× too large. Both are reported. Per GPU, KV heads are split over TP (at least one per
  GPU: vLLM replicates a KV head when TP exceeds the KV head count) and layers over PP.
  LMDeploy's int8/int4 KV (``--quant-policy 8``/``4``) also stores an fp16 scale and zero
  point per token and head (4 B), so it is slightly more than half/quarter.
* **memory for KV**: vLLM gives the KV cache ``total × gpu_memory_utilization − weights −
  activation peak − non-torch memory``. We estimate the last two as ``overhead``: a flat
  1 GiB for the CUDA context, cuBLAS/NCCL workspaces (+1.5 GiB when TP × PP > 1 for NCCL and
  custom all-reduce buffers; vLLM logs 0.35–1.79 GiB non-torch memory on one GPU and
  3.58 GiB at TP=2) plus an activation peak of ``max_num_batched_tokens × hidden × 2 B × 12``
  and the sampler's fp32 logits ``max_num_seqs × vocab × 4 B × 2`` (calibrated on vLLM's
  profile of Llama-3-8B: 1.26 GiB at 8,192 tokens). LMDeploy instead gives
  ``--cache-max-entry-count`` of the memory *free after the weights load* to KV.
* **capacity** in blocks (vLLM 16 tokens, LMDeploy 64): the concurrent full-length
  sequences are ``blocks // ceil(max_model_len / block)``.

Findings carry the flag to change and the value to set; their ``kind`` names the runbook
(``runbooks/diagnosis-kv-cache-capacity.md``, ``runbooks/diagnosis-weights-do-not-fit.md``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.diagnose.models import ModelSpec, find_model, gpu_memory_bytes
from agent.errors import DiagnosisError

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
    "max_model_len_for",
    "plan",
    "utilization_for",
    "weight_bytes",
]

GiB = 2**30
ENGINES = ("vllm", "lmdeploy")
QUANTIZATIONS = ("none", "awq", "gptq", "fp8", "int8")
# KV element width in bits. "auto" follows the model dtype; int4 is LMDeploy's --quant-policy 4.
KV_CACHE_DTYPES = {"auto": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4}
_DTYPES = ("auto", "float16", "bfloat16", "float32", "half")
GROUP_SIZE = 128
BYTES_4BIT = 0.5 + 2.5 / GROUP_SIZE  # packed weight + fp16 scale + packed 4-bit zero point per group
MAX_UTILIZATION = 0.95  # never suggest more: CUDA graphs and fragmentation live in the rest
#: Finding kinds the planner emits (each has runbooks/diagnosis-<kind>.md).
KINDS = ("weights-do-not-fit", "kv-cache-capacity")
FRAMEWORK_BYTES = 1 * GiB
MULTI_GPU_EXTRA_BYTES = 3 * GiB // 2
ACTIVATION_FACTOR = 12  # × tokens × hidden × 2 B; see the module docstring
LMDEPLOY_SCALE_BYTES = 4  # fp16 scale + fp16 zero point per token, head and K/V in quantized KV


@dataclass(frozen=True)
class PlanInput:
    """What is being planned. ``max_model_len=None`` means the model's own maximum; for
    LMDeploy ``max_model_len`` is ``--session-len`` and ``max_num_seqs`` ``--max-batch-size``.
    ``max_num_batched_tokens=None`` means vLLM V1's default (8,192 on ≥ 70 GiB GPUs other
    than A100, else 2,048). ``overhead_bytes`` overrides the activation + framework estimate."""

    model: ModelSpec
    gpu_memory_bytes: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    engine: str = "vllm"
    cache_max_entry_count: float = 0.8
    dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    gpu: str = ""
    overhead_bytes: int | None = None

    @property
    def effective_max_model_len(self) -> int:
        return self.max_model_len or self.model.max_position_embeddings


@dataclass(frozen=True)
class Plan:
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


@dataclass(frozen=True)
class _Numbers:
    weights: int
    kv_tok: int
    kv_tok_gpu: int
    kv_guide: int
    kv_guide_gpu: int
    overhead: int
    kv_avail: int
    blocks: int
    seqs: int
    seqs_guide: int
    weights_fit: bool


def weight_bytes(model: ModelSpec, quantization: str = "none", dtype: str = "auto") -> int:
    """All of the model's weights in bytes (before splitting over GPUs)."""
    half = 4 if dtype == "float32" else 2  # auto: a float32 checkpoint is served in 16-bit, as vLLM does
    if quantization == "none":
        return int(model.num_params * half)
    linear = max(0.0, model.num_params - model.embedding_params)
    per_param = BYTES_4BIT if quantization in ("awq", "gptq") else 1.0
    return int(model.embedding_params * 2 + linear * per_param)


def activation_bytes(inp: PlanInput) -> int:
    """Estimated peak activation memory per GPU during vLLM's profile run."""
    tokens = inp.max_num_batched_tokens or _default_batched_tokens(inp)
    m = inp.model
    return tokens * m.hidden_size * 2 * ACTIVATION_FACTOR + inp.max_num_seqs * m.vocab_size * 4 * 2


def _default_batched_tokens(inp: PlanInput) -> int:
    if inp.engine == "lmdeploy":
        return 8192  # LMDeploy's --max-prefill-token-num default
    big = inp.gpu_memory_bytes >= 70 * GiB and "a100" not in inp.gpu.lower()
    return 8192 if big else 2048


def _validate(inp: PlanInput) -> None:
    m = inp.model
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    problems: list[str] = []
    if inp.engine not in ENGINES:
        problems.append(f"engine must be one of {', '.join(ENGINES)}")
    if inp.quantization not in QUANTIZATIONS:
        problems.append(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    if inp.kv_cache_dtype not in KV_CACHE_DTYPES:
        problems.append(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}")
    if inp.dtype not in _DTYPES:
        problems.append(f"dtype must be one of {', '.join(_DTYPES)}")
    if inp.gpu_memory_bytes <= 0:
        problems.append("GPU memory must be positive")
    if not 0 < inp.gpu_memory_utilization <= 1:
        problems.append("gpu_memory_utilization must be in (0, 1]")
    if not 0 < inp.cache_max_entry_count <= 1:
        problems.append("cache_max_entry_count must be in (0, 1] (a fraction of free memory)")
    if min(tp, pp, inp.max_num_seqs, inp.block_size, inp.effective_max_model_len) < 1:
        problems.append("tensor/pipeline parallel size, max_num_seqs, max_model_len and block size must be ≥ 1")
    elif m.num_attention_heads % tp:
        problems.append(f"{m.num_attention_heads} attention heads are not divisible by tensor parallel size {tp}")
    elif m.num_key_value_heads % tp and tp % m.num_key_value_heads:
        problems.append(f"{m.num_key_value_heads} KV heads and tensor parallel size {tp}: one must divide the other")
    elif pp > m.num_layers:
        problems.append(f"pipeline parallel size {pp} exceeds the model's {m.num_layers} layers")
    if problems:
        raise DiagnosisError("; ".join(problems))


def _numbers(inp: PlanInput) -> _Numbers:
    m = inp.model
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    bits = KV_CACHE_DTYPES[inp.kv_cache_dtype]
    if bits == 16 and inp.dtype == "float32":
        bits = 32
    head_bytes = m.head_dim * bits // 8
    if inp.engine == "lmdeploy" and bits < 16:
        head_bytes += LMDEPLOY_SCALE_BYTES
    layers_gpu = math.ceil(m.num_layers / pp)
    kv_heads_gpu = max(1, m.num_key_value_heads // tp)
    kv_tok = 2 * m.num_layers * m.num_key_value_heads * head_bytes
    kv_tok_gpu = 2 * layers_gpu * kv_heads_gpu * head_bytes
    kv_guide = 2 * m.num_layers * m.hidden_size * bits // 8
    kv_guide_gpu = 2 * layers_gpu * (m.hidden_size // tp) * bits // 8
    weights = math.ceil(weight_bytes(m, inp.quantization, inp.dtype) / (tp * pp))
    framework = FRAMEWORK_BYTES + (MULTI_GPU_EXTRA_BYTES if tp * pp > 1 else 0)
    if inp.engine == "lmdeploy":
        overhead = inp.overhead_bytes if inp.overhead_bytes is not None else framework
        free = inp.gpu_memory_bytes - weights - overhead
        kv_avail = int(free * inp.cache_max_entry_count)
        weights_fit = free > 0
    else:
        overhead = inp.overhead_bytes if inp.overhead_bytes is not None else framework + activation_bytes(inp)
        kv_avail = int(inp.gpu_memory_bytes * inp.gpu_memory_utilization) - weights - overhead
        weights_fit = kv_avail > 0
    kv_avail = max(0, kv_avail)
    per_seq = math.ceil(inp.effective_max_model_len / inp.block_size)
    blocks = kv_avail // (kv_tok_gpu * inp.block_size)
    blocks_guide = kv_avail // (kv_guide_gpu * inp.block_size)
    return _Numbers(weights=weights, kv_tok=kv_tok, kv_tok_gpu=kv_tok_gpu, kv_guide=kv_guide,
                    kv_guide_gpu=kv_guide_gpu, overhead=overhead, kv_avail=kv_avail, blocks=blocks,
                    seqs=blocks // per_seq, seqs_guide=blocks_guide // per_seq, weights_fit=weights_fit)


def max_model_len_for(inp: PlanInput, seqs: int) -> int:
    """The largest ``max_model_len`` (a multiple of the block size: 16 for vLLM, 64 for
    LMDeploy) at which ``seqs`` full-length sequences fit, capped at the model's maximum;
    0 if not even one block each fits."""
    _validate(inp)
    n = _numbers(inp)
    if seqs < 1 or not n.weights_fit:
        return 0
    cap = inp.model.max_position_embeddings // inp.block_size * inp.block_size
    return min((n.blocks // seqs) * inp.block_size, cap)


def utilization_for(inp: PlanInput, seqs: int) -> float | None:
    """The memory fraction at which ``seqs`` full-length sequences fit, rounded up to 0.01:
    ``--gpu-memory-utilization`` for vLLM, ``--cache-max-entry-count`` for LMDeploy.
    ``None`` when it would exceed :data:`MAX_UTILIZATION`."""
    _validate(inp)
    current: float = inp.cache_max_entry_count if inp.engine == "lmdeploy" else inp.gpu_memory_utilization
    value = max(0.01, math.floor(current * 100) / 100)
    while value <= MAX_UTILIZATION + 1e-9:
        cand = (replace(inp, cache_max_entry_count=value) if inp.engine == "lmdeploy"
                else replace(inp, gpu_memory_utilization=value))
        if _numbers(cand).seqs >= seqs:
            return value
        value = round(value + 0.01, 2)
    return None


def plan(inp: PlanInput, *, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> Plan:
    """Work out the memory plan and what to change. Raises :class:`DiagnosisError` on
    inputs the engine itself would reject (heads not divisible by TP, utilization > 1, …)."""
    _validate(inp)
    n = _numbers(inp)
    fits = n.weights_fit and n.seqs >= inp.max_num_seqs
    notes: list[str] = []
    if inp.effective_max_model_len > inp.model.max_position_embeddings:
        notes.append(f"max_model_len {inp.effective_max_model_len} exceeds the model's "
                     f"{inp.model.max_position_embeddings}; vLLM refuses it unless rope scaling allows it")
    if inp.engine == "lmdeploy" and n.weights_fit:
        slack = int((inp.gpu_memory_bytes - n.weights - n.overhead) * (1 - inp.cache_max_entry_count))
        if slack < activation_bytes(inp):
            notes.append(f"only {slack / GiB:.2f} GiB stays free for activations after the KV cache; "
                         "lower --cache-max-entry-count if prefill runs out of memory")
    result = Plan(input=inp, weights_bytes_per_gpu=n.weights, kv_bytes_per_token=n.kv_tok,
                  kv_bytes_per_token_per_gpu=n.kv_tok_gpu, kv_bytes_per_token_guide=n.kv_guide,
                  overhead_bytes=n.overhead, kv_bytes_available=n.kv_avail, max_concurrent_seqs=n.seqs,
                  max_tokens_in_cache=n.blocks * inp.block_size, fits=fits, weights_fit=n.weights_fit,
                  recommendations=[], max_concurrent_seqs_guide=n.seqs_guide, notes=notes)
    result.recommendations.extend(_recommend(result, n, runbook_base))
    return result


def _flag(inp: PlanInput, vllm: str, lmdeploy: str) -> str:
    return lmdeploy if inp.engine == "lmdeploy" else vllm


def _recommend(p: Plan, n: _Numbers, base: str) -> list[Finding]:
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
            alt = _numbers(replace(inp, quantization="awq"))
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
        alt = _numbers(replace(inp, kv_cache_dtype=target))
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
    best: tuple[PlanInput, _Numbers] | None = None
    for tp in (2, 4, 8):
        cand = replace(inp, tensor_parallel_size=tp)
        alt = _numbers(cand) if tp > inp.tensor_parallel_size and _valid(cand) else None
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
        alt = _numbers(cand) if pp > inp.pipeline_parallel_size and _valid(cand) else None
        if alt is not None and alt.weights_fit and alt.seqs >= 1:
            return [_suggest(template, "--pipeline-parallel-size", str(pp),
                             f"TP={cand.tensor_parallel_size} within each node and PP={pp} across nodes fits "
                             f"{_seqs(alt.seqs)}")]
    return []


def _valid(inp: PlanInput) -> bool:
    try:
        _validate(inp)
    except DiagnosisError:
        return False
    return True


def _seqs(count: int) -> str:
    return f"{count} full-length sequence{'' if count == 1 else 's'}"
