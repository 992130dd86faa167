"""The memory planner's arithmetic: how many bytes weights, KV cache and overhead take per GPU.

Given a model shape (:class:`~agent.diagnose.plan.models.ModelSpec`), a GPU size and the
flags vLLM or LMDeploy is started with (:class:`PlanInput`), :func:`memory_numbers` works
out, per GPU:

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
  ``--cache-max-entry-count`` of the memory *free after the weights load* to KV: TurboMind's
  ``CreateEngine`` (``src/turbomind/turbomind.cc``) takes ``cudaMemGetInfo``'s free bytes, the
  minimum over the TP ranks, times the ratio, before the model's own buffers are allocated;
  those, the activations, come out of the rest. Its quantized KV layout
  (``src/turbomind/kernels/attention/block.h``) stores per token, head and K/V
  ``head_dim × bits / 8`` bytes plus a 16-bit scale and zero point (4 B).
* **capacity** in blocks (vLLM 16 tokens, LMDeploy 64): the concurrent full-length
  sequences are ``blocks // ceil(max_model_len / block)``.

:func:`max_model_len_for` and :func:`utilization_for` search these numbers for the setting
that fits a given number of sequences. What to recommend from them is
:mod:`agent.diagnose.plan.planner`'s business; nothing here makes a finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from agent.diagnose.plan.models import ModelSpec
from agent.errors import DiagnosisError

__all__ = [
    "ACTIVATION_FACTOR",
    "BYTES_4BIT",
    "ENGINES",
    "FRAMEWORK_BYTES",
    "GROUP_SIZE",
    "KV_CACHE_DTYPES",
    "LMDEPLOY_SCALE_BYTES",
    "MAX_UTILIZATION",
    "MULTI_GPU_EXTRA_BYTES",
    "QUANTIZATIONS",
    "GiB",
    "MemoryNumbers",
    "PlanInput",
    "activation_bytes",
    "is_valid",
    "kv_bytes_per_token",
    "max_model_len_for",
    "memory_numbers",
    "utilization_for",
    "validate",
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
class MemoryNumbers:
    """One configuration's per-GPU numbers (bytes; ``seqs`` = full-length sequences that fit)."""

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


def validate(inp: PlanInput) -> None:
    """Raise :class:`DiagnosisError` naming every input the engine itself would reject."""
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


def _kv_bits(inp: PlanInput) -> int:
    bits = KV_CACHE_DTYPES[inp.kv_cache_dtype]
    return 32 if bits == 16 and inp.dtype == "float32" else bits


def kv_bytes_per_token(inp: PlanInput) -> tuple[int, int]:
    """``(whole model, one GPU)`` KV-cache bytes per token of ``inp``'s model at its KV dtype,
    TP and PP (see the module docstring). The one place the per-token size is worked out: the
    planner's capacity and the OOM diagnosis' KV suggestions both read it."""
    m = inp.model
    head_bytes = m.head_dim * _kv_bits(inp) // 8
    if inp.engine == "lmdeploy" and _kv_bits(inp) < 16:
        head_bytes += LMDEPLOY_SCALE_BYTES
    layers_gpu = math.ceil(m.num_layers / inp.pipeline_parallel_size)
    kv_heads_gpu = max(1, m.num_key_value_heads // inp.tensor_parallel_size)
    return 2 * m.num_layers * m.num_key_value_heads * head_bytes, 2 * layers_gpu * kv_heads_gpu * head_bytes


def memory_numbers(inp: PlanInput) -> MemoryNumbers:
    """The per-GPU numbers of ``inp`` (see the module docstring); ``inp`` must be valid."""
    m = inp.model
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    bits = _kv_bits(inp)
    layers_gpu = math.ceil(m.num_layers / pp)
    kv_tok, kv_tok_gpu = kv_bytes_per_token(inp)
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
    return MemoryNumbers(weights=weights, kv_tok=kv_tok, kv_tok_gpu=kv_tok_gpu, kv_guide=kv_guide,
                         kv_guide_gpu=kv_guide_gpu, overhead=overhead, kv_avail=kv_avail, blocks=blocks,
                         seqs=blocks // per_seq, seqs_guide=blocks_guide // per_seq, weights_fit=weights_fit)


def max_model_len_for(inp: PlanInput, seqs: int) -> int:
    """The largest ``max_model_len`` (a multiple of the block size: 16 for vLLM, 64 for
    LMDeploy) at which ``seqs`` full-length sequences fit, capped at the model's maximum;
    0 if not even one block each fits."""
    validate(inp)
    n = memory_numbers(inp)
    if seqs < 1 or not n.weights_fit:
        return 0
    cap = inp.model.max_position_embeddings // inp.block_size * inp.block_size
    return min((n.blocks // seqs) * inp.block_size, cap)


def utilization_for(inp: PlanInput, seqs: int) -> float | None:
    """The memory fraction at which ``seqs`` full-length sequences fit, rounded up to 0.01:
    ``--gpu-memory-utilization`` for vLLM, ``--cache-max-entry-count`` for LMDeploy.
    ``None`` when it would exceed :data:`MAX_UTILIZATION`."""
    validate(inp)
    current: float = inp.cache_max_entry_count if inp.engine == "lmdeploy" else inp.gpu_memory_utilization
    value = max(0.01, math.floor(current * 100) / 100)
    while value <= MAX_UTILIZATION + 1e-9:
        cand = (replace(inp, cache_max_entry_count=value) if inp.engine == "lmdeploy"
                else replace(inp, gpu_memory_utilization=value))
        if memory_numbers(cand).seqs >= seqs:
            return value
        value = round(value + 0.01, 2)
    return None


def is_valid(inp: PlanInput) -> bool:
    """Whether :func:`validate` accepts ``inp``."""
    try:
        validate(inp)
    except DiagnosisError:
        return False
    return True
