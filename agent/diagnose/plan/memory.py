"""The memory planner's arithmetic: how many bytes weights, KV cache and overhead take per GPU.

Given a model shape (:class:`~agent.diagnose.plan.models.ModelSpec`), a GPU size and the
flags vLLM or LMDeploy is started with (:class:`PlanInput`), :func:`memory_numbers` works
out, per GPU:

* **weights** = what vLLM logs as "Model loading took": every parameter (all MoE experts,
  the vision tower) at 2 B, except the quantized ones at the checkpoint's bytes per weight
  (:mod:`agent.diagnose.plan.quant`: AWQ/GPTQ 4-bit with group scales
  ``0.5 + 2.5/128 = 0.51953125`` B, fp8/int8 1 B, mxfp4 experts 0.53125 B, …). Embeddings,
  ``lm_head``, MoE routers and vision towers stay 16-bit; the vocabulary is padded to a
  multiple of 64. The split over TP × PP is an approximation: vLLM shards the vocabulary
  over TP, and with PP the first stage holds the embedding and the last ``lm_head``. Every GPU
  also holds vLLM's rotary cache (``ModelSpec.rope_cache_bytes``), 2.5 GiB for Llama 4's 10M
  positions. A compressed-tensors ``ignore`` list keeps more layers 16-bit
  (``ModelSpec.unquantized_params``).
* **KV bytes per token** = 2 (K and V) × layers × ``num_key_value_heads`` × ``head_dim`` ×
  KV dtype bytes. The guides' ``2 × layers × hidden_size × bytes`` assumes one KV head per
  query head; for grouped-query attention (Llama-3-70B: 8 KV heads, 64 query heads) it is
  8× too large. Both are reported. Per GPU, KV heads are split over TP (at least one per
  GPU: vLLM replicates a KV head when TP exceeds the KV head count) and layers over PP.
  MLA models store ``kv_lora_rank + qk_rope_head_dim`` per token and layer, unsplit by TP;
  sliding-window layers get what vLLM V1's hybrid KV-cache manager gives them
  (:mod:`agent.diagnose.plan.kvcache`). LMDeploy's int8/int4 KV (``--quant-policy 8``/``4``)
  also stores an fp16 scale and zero point per token and head (4 B).
* **memory for KV** (vLLM): "Available KV cache memory" is ``total × gpu_memory_utilization −
  (weights + overhead)``, our ``kv_bytes_available`` (``total`` is CUDA's, which the GPU presets
  hold; nvidia-smi's is 0.3-0.85 GiB more). The overhead (the profile run's torch
  peak, non-torch memory and, from vLLM 0.21, the CUDA-graph estimate) depends on the engine
  version's accounting, ``PlanInput.vllm_accounting``: :mod:`agent.diagnose.plan.overhead`.
  LMDeploy instead gives ``--cache-max-entry-count`` of the memory *free after the weights
  load* to KV: TurboMind's ``CreateEngine`` (``src/turbomind/turbomind.cc``) takes
  ``cudaMemGetInfo``'s free bytes, the minimum over the TP ranks, times the ratio, before the
  model's own buffers are allocated; those, the activations, come out of the rest. Its
  quantized KV layout (``src/turbomind/kernels/attention/block.h``) stores per token, head and
  K/V ``head_dim × bits / 8`` bytes plus a 16-bit scale and zero point (4 B).
* **capacity** in blocks (vLLM 16 tokens, 64 for MLA on Hopper; LMDeploy 64): the tokens
  are vLLM's "GPU KV cache size", the concurrent full-length sequences ``blocks //`` the
  blocks one sequence holds (its "Maximum concurrency", rounded down).

:func:`max_model_len_for` and :func:`utilization_for` search these numbers for the setting
that fits a given number of sequences. What to recommend from them is
:mod:`agent.diagnose.plan.planner`'s business; nothing here makes a finding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from agent.diagnose.plan.kvcache import KVLayout, hybrid_groups, mla_block_size
from agent.diagnose.plan.models import ModelSpec
from agent.diagnose.plan.overhead import (
    ACCOUNTINGS,
    ACTIVATION_FACTOR,
    FRAMEWORK_BYTES,
    MULTI_GPU_EXTRA_BYTES,
    SAMPLERS,
    activation_bytes,
    batched_tokens,
    overhead_bytes,
)
from agent.diagnose.plan.quant import METHODS, QuantScheme, bytes_per_weight, default_scheme
from agent.errors import DiagnosisError

__all__ = [
    "ACCOUNTINGS",
    "ACTIVATION_FACTOR",
    "BYTES_4BIT",
    "ENGINES",
    "FRAMEWORK_BYTES",
    "GROUP_SIZE",
    "KV_CACHE_DTYPES",
    "LMDEPLOY_SCALE_BYTES",
    "MAX_UTILIZATION",
    "MULTI_GPU_EXTRA_BYTES",
    "MXFP4_BACKENDS",
    "MXFP4_LAYOUTS",
    "QUANTIZATIONS",
    "GiB",
    "MemoryNumbers",
    "PlanInput",
    "activation_bytes",
    "batched_tokens",
    "expert_padding_bytes",
    "is_valid",
    "kv_bytes_per_token",
    "kv_layout",
    "max_model_len_for",
    "memory_numbers",
    "mxfp4_backend",
    "utilization_for",
    "validate",
    "weight_bytes",
]

GiB = 2**30
ENGINES = ("vllm", "lmdeploy")
QUANTIZATIONS = METHODS
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
#: How vLLM's ``Mxfp4MoEMethod.create_weights`` pads the mxfp4 experts for each MoE backend: (the
#: intermediate width per TP rank, the hidden width) rounded up to these multiples. Marlin (Ampere, Ada,
#: consumer Blackwell, and Hopper builds without triton_kernels) pads both: gpt-oss's 2880 x 2880
#: becomes 2944 x 3072. The Triton layout is what vLLM 0.11's logs on an H100 add up to.
MXFP4_LAYOUTS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {"triton": (256, 1), "marlin": (128, 256), "flashinfer": (256, 256)})
MXFP4_BACKENDS = ("auto", *MXFP4_LAYOUTS)
#: GPUs whose mxfp4 MoE runs through Marlin: no triton_kernels (SM90-SM10x only) and no FlashInfer
#: mxfp4 path (SM100 family only): Ampere, Ada, and SM120 (RTX 50xx, RTX PRO 6000 Blackwell).
_MARLIN_GPUS = re.compile(r"a100|a800|a10g?\b|a30\b|a40\b|a[456]000|l4\b|l40|rtx|geforce|\b[345]0[6-9]0\b")
_SM100_GPUS = re.compile(r"\bg?b[123]00\b")
# KV element width in bits. "auto" follows the model dtype; int4 is LMDeploy's --quant-policy 4.
KV_CACHE_DTYPES = {"auto": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4}
_DTYPES = ("auto", "float16", "bfloat16", "float32", "half")
GROUP_SIZE = 128
BYTES_4BIT = 0.5 + 2.5 / GROUP_SIZE  # packed weight + fp16 scale + packed 4-bit zero point per group
MAX_UTILIZATION = 0.95  # never suggest more: CUDA graphs and fragmentation live in the rest
LMDEPLOY_SCALE_BYTES = 4  # fp16 scale + fp16 zero point per token, head and K/V in quantized KV


@dataclass(frozen=True)
class PlanInput:
    """What is being planned. ``max_model_len=None`` means the model's own maximum; for
    LMDeploy ``max_model_len`` is ``--session-len`` and ``max_num_seqs`` ``--max-batch-size``.
    ``max_num_batched_tokens=None`` means vLLM V1's default (8,192 on ≥ 70 GiB GPUs other
    than A100, else 2,048). ``overhead_bytes`` overrides the activation + framework estimate;
    ``vllm_accounting`` names the engine version's profile accounting
    (:data:`~agent.diagnose.plan.overhead.ACCOUNTINGS`) and ``sampler`` the sampler its
    warm-up runs through (``"flashinfer"`` when vLLM logs "Using FlashInfer for top-p & top-k
    sampling")."""

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
    disable_hybrid_kv_cache_manager: bool = False
    hybrid_chunked_attention: bool = False  # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (Llama 4)
    vllm_accounting: str = "v1"
    sampler: str = "native"
    mxfp4_backend: str = "auto"

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
    tokens: int
    seqs: int
    seqs_guide: int
    weights_fit: bool


def weight_bytes(model: ModelSpec, quantization: str = "none", dtype: str = "auto") -> int:
    """All of the model's weights in bytes (before splitting over GPUs): 16-bit for
    embeddings, ``lm_head``, routers and the vision tower, the quantized format
    (:mod:`agent.diagnose.plan.quant`) for the rest, with the vocabulary padded to 64 as
    vLLM's ``VocabParallelEmbedding`` does."""
    half = 4 if dtype == "float32" else 2  # auto: a float32 checkpoint is served in 16-bit, as vLLM does
    pad = (-model.vocab_size % VOCAB_PADDING) * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    if quantization == "none":
        return int((model.num_params + pad) * half)
    scheme = _scheme(model, quantization)
    if scheme.experts_only:
        quantized = model.expert_params
    else:
        kept = model.unquantized_params if scheme is model.quant else 0.0
        quantized = max(0.0, model.num_params - model.embedding_params - model.router_params - model.vision_params
                        - kept)
    return int((model.num_params - quantized + pad) * 2 + quantized * bytes_per_weight(scheme))


def mxfp4_backend(inp: PlanInput) -> str:
    """The MoE backend vLLM picks for mxfp4 experts on ``inp.gpu`` (``inp.mxfp4_backend`` unless
    ``auto``): Marlin on :data:`_MARLIN_GPUS`, FlashInfer on B100/B200/B300, else Triton (Hopper;
    also an unnamed GPU)."""
    if inp.mxfp4_backend != "auto":
        return inp.mxfp4_backend
    name = inp.gpu.lower()
    if _SM100_GPUS.search(name):
        return "flashinfer"
    return "marlin" if _MARLIN_GPUS.search(name) else "triton"


def expert_padding_bytes(inp: PlanInput) -> int:
    """Per GPU, what mxfp4's MoE kernels add by padding each expert's matrices (:data:`MXFP4_LAYOUTS`):
    on Triton gpt-oss's 2880-wide experts become 3072 wide (6.7 % more expert weight), on Marlin
    2944 x 3072 (9.0 % more)."""
    m = inp.model
    scheme = _scheme(m, inp.quantization)
    if not (scheme.experts_only and m.is_moe and m.moe_intermediate_size):
        return 0
    inner, outer = MXFP4_LAYOUTS[mxfp4_backend(inp)]
    width = m.moe_intermediate_size / inp.tensor_parallel_size
    grown = (math.ceil(width / inner) * inner / width) * (math.ceil(m.hidden_size / outer) * outer / m.hidden_size)
    share = m.expert_params / (inp.tensor_parallel_size * inp.pipeline_parallel_size)
    return int(share * (grown - 1) * bytes_per_weight(scheme))


def _scheme(model: ModelSpec, quantization: str) -> QuantScheme:
    if model.quant is not None and model.quant.method == quantization:
        return model.quant
    return default_scheme(quantization)


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
    if inp.vllm_accounting not in ACCOUNTINGS:
        problems.append(f"vllm_accounting must be one of {', '.join(ACCOUNTINGS)}")
    if inp.sampler not in SAMPLERS:
        problems.append(f"sampler must be one of {', '.join(SAMPLERS)}")
    if inp.mxfp4_backend not in MXFP4_BACKENDS:
        problems.append(f"mxfp4_backend must be one of {', '.join(MXFP4_BACKENDS)}")
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
    TP and PP (see the module docstring): an MLA latent per layer, unsplit by TP, or K and V per
    KV head; one GPU's figure is its KV-cache layout's (hybrid groups included). The one place
    the per-token size is worked out: the planner's capacity and the OOM diagnosis' KV
    suggestions both read it."""
    m, bits = inp.model, _kv_bits(inp)
    if m.is_mla:
        whole = m.num_layers * (m.kv_lora_rank + m.qk_rope_head_dim) * bits // 8
    else:
        whole = 2 * m.num_layers * m.num_key_value_heads * _head_bytes(inp, bits)
    return whole, kv_layout(inp).token_bytes


def memory_numbers(inp: PlanInput) -> MemoryNumbers:
    """The per-GPU numbers of ``inp`` (see the module docstring); ``inp`` must be valid."""
    m = inp.model
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    bits = _kv_bits(inp)
    layers_gpu = math.ceil(m.num_layers / pp)
    layout = kv_layout(inp)
    kv_tok, kv_tok_gpu = kv_bytes_per_token(inp)
    kv_guide = 2 * m.num_layers * m.hidden_size * bits // 8
    kv_guide_gpu = 2 * layers_gpu * (m.hidden_size // tp) * bits // 8
    weights = (math.ceil(weight_bytes(m, inp.quantization, inp.dtype) / (tp * pp)) + expert_padding_bytes(inp)
               + (m.rope_cache_bytes if inp.engine == "vllm" else 0))
    overhead = overhead_bytes(inp)
    if inp.engine == "lmdeploy":
        free = inp.gpu_memory_bytes - weights - overhead
        kv_avail = int(free * inp.cache_max_entry_count)
        weights_fit = free > 0
    else:
        kv_avail = int(inp.gpu_memory_bytes * inp.gpu_memory_utilization) - weights - overhead
        weights_fit = kv_avail > 0
    kv_avail = max(0, kv_avail)
    length = inp.effective_max_model_len
    blocks = layout.num_blocks(kv_avail)
    per_seq = layout.blocks_per_seq(length, batched_tokens(inp))
    per_seq_guide = math.ceil(length / inp.block_size)
    blocks_guide = kv_avail // (kv_guide_gpu * inp.block_size)
    return MemoryNumbers(weights=weights, kv_tok=kv_tok, kv_tok_gpu=kv_tok_gpu, kv_guide=kv_guide,
                         kv_guide_gpu=kv_guide_gpu, overhead=overhead, kv_avail=kv_avail, blocks=blocks,
                         tokens=layout.tokens(blocks), seqs=blocks // per_seq, seqs_guide=blocks_guide // per_seq_guide,
                         weights_fit=weights_fit)


def _head_bytes(inp: PlanInput, bits: int) -> int:
    head_bytes = inp.model.head_dim * bits // 8
    if inp.engine == "lmdeploy" and bits < 16:
        head_bytes += LMDEPLOY_SCALE_BYTES
    return head_bytes


def kv_layout(inp: PlanInput) -> KVLayout:
    """The KV-cache groups and page size of one GPU (:mod:`agent.diagnose.plan.kvcache`)."""
    m = inp.model
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    bits = _kv_bits(inp)
    layers_gpu = math.ceil(m.num_layers / pp)
    if m.is_mla and inp.engine == "vllm":
        return KVLayout(block_size=mla_block_size(inp.block_size, inp.gpu),
                        layer_token_bytes=(m.kv_lora_rank + m.qk_rope_head_dim) * bits // 8,
                        group_size=layers_gpu, windows=(0,))
    layer_bytes = 2 * max(1, m.num_key_value_heads // tp) * _head_bytes(inp, bits)
    sliding, window = (m.num_sliding_layers, m.sliding_window) if m.sliding_window else (0, 0)
    if m.attention_chunk_size and inp.hybrid_chunked_attention:
        # vLLM's chunked spec holds C + max_num_batched_tokens tokens of a request, its sliding-window
        # spec C - 1 + that and one block more: the same within a block a group, so a chunk is a window
        sliding, window = m.num_chunked_layers, m.attention_chunk_size
    if not sliding or inp.engine != "vllm" or inp.disable_hybrid_kv_cache_manager:
        return KVLayout(inp.block_size, layer_bytes, layers_gpu, (0,))
    if sliding >= m.num_layers:
        return KVLayout(inp.block_size, layer_bytes, layers_gpu, (window,))
    size, windows = hybrid_groups(m.num_layers - sliding, sliding, window, pp)
    return KVLayout(inp.block_size, layer_bytes, size, windows)


def max_model_len_for(inp: PlanInput, seqs: int) -> int:
    """The largest ``max_model_len`` (a multiple of the block size: 16 for vLLM, 64 for
    LMDeploy) at which ``seqs`` full-length sequences fit, capped at the model's maximum;
    0 if not even one block each fits."""
    validate(inp)
    n = memory_numbers(inp)
    if seqs < 1 or not n.weights_fit:
        return 0
    layout = kv_layout(inp)
    step = layout.block_size
    batched = batched_tokens(inp)
    low, high = 0, inp.model.max_position_embeddings // step  # in blocks of ``step`` tokens
    while low < high:  # the largest length whose sequences all fit
        mid = (low + high + 1) // 2
        if n.blocks // layout.blocks_per_seq(mid * step, batched) >= seqs:
            low = mid
        else:
            high = mid - 1
    return low * step


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
