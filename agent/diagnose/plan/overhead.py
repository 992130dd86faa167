"""What vLLM subtracts besides the weights before it sizes the KV cache, per engine version.

vLLM sizes the KV cache from a *profile run* at start-up. What that run measures, and so what
its log line "Available KV cache memory: X GiB" means, changed twice; :data:`ACCOUNTINGS`
names the three generations this module models:

``"v0"`` (the V0 engine, vLLM ≤ 0.10 with ``VLLM_USE_V1=0``; ``worker.py``'s "the rest of the
    memory reserved for KV Cache is X"): ``total × utilization − (weights + non-torch memory +
    the torch activation peak of the profile run)``. The profile prefills ``max(max_model_len,
    2048)`` tokens (2,048 with chunked prefill, which V0 turns on past 32K), then samples
    ``max_num_seqs`` (256) dummy sequences through the sort-based sampler; the peak is the
    larger of the two, as in V1: the forward at ``tokens × hidden × 2 B ×`` :data:`V0_ACTIVATION_FACTOR` (Llama-3.1-8B
    logs 2.07 GiB at 20k tokens, 2.99 at 29k), or the sampler's rows × vocab ×
    :data:`SAMPLER_BYTES_PER_LOGIT` beside the prompt's hidden states (Qwen2.5-7B logs 1.42 GiB
    at 4,096 tokens, Phi-4 0.94 at 2,048, Llama-3-8B 1.26 at 8,192: all the sampler).
    Non-torch memory is what grew outside torch's allocator since a baseline taken just before
    the distributed set-up (vLLM 0.6.5–0.10; the CUDA context is not in it, NCCL's and custom
    all-reduce's buffers are). 35 public V0 lines of 0.6.5–0.8.x (T4 to H200) put it at
    0.01–0.35 GiB on one GPU, median 0.08: :data:`V0_NON_TORCH_BYTES` takes the top of that.
    With TP × PP > 1 it depends on the link: 0.20–0.36 GiB between PCIe GPUs (consumer cards,
    L4, L40S, A10, A40; NCCL alone, since vLLM turns custom all-reduce off beyond two PCIe
    GPUs), 0.93–2.15 GiB per rank over NVLink/NVSwitch (A100-SXM, H100, H200; NCCL's NVLink
    channels and the all-reduce IPC buffers): :data:`V0_PCIE_MULTI_GPU_BYTES` and
    :data:`V0_NVLINK_MULTI_GPU_BYTES` on top, NVLink for a GPU whose name does not say. (The
    1.79 GiB in vllm-project/vllm pull 10511's discussion came from that pull's unfinished
    code, which did not subtract the baseline.) LMDeploy keeps the older reserve,
    :data:`FRAMEWORK_BYTES` (+:data:`MULTI_GPU_EXTRA_BYTES`).
``"v1"`` (the V1 engine, vLLM 0.8–0.20; ``gpu_worker.determine_available_memory``): the same
    subtraction, ``requested_memory − non_kv_cache_memory`` with ``requested_memory = total ×
    gpu_memory_utilization`` and ``non_kv_cache_memory = weights + torch_peak_increase +
    non_torch_increase``, but V1's profile run (``GPUModelRunner.profile_run``) does two
    things whose peaks do not add up (the forward's activations are freed before the sampler
    runs), so the torch peak is the larger of

    * the forward pass over ``max_num_batched_tokens`` dummy tokens, ``tokens × hidden × 2 B ×``
      :data:`ACTIVATION_FACTOR` (torch.compile's graphs keep a little less alive than V0's eager
      forward), plus the fused-MoE kernel's intermediate caches, and
    * ``_dummy_sampler_run``: ``min(max_num_seqs, max_num_batched_tokens)`` rows of fp32
      logits over the whole vocabulary (gathered on every TP rank), pushed through top-k
      (vocab − 1) and top-p (0.9) by the sort-based sampler: the logits, their sorted copy and
      int64 indices, softmax, cumulative sum, mask and the exponential noise are alive at
      once, about :data:`SAMPLER_BYTES_PER_LOGIT` = 38.8 B (9.7 fp32 copies) per logit.
      When vLLM logs "Using FlashInfer for top-p & top-k sampling" (``PlanInput.sampler =
      "flashinfer"``) the kernel samples without sorting: about
      :data:`FLASHINFER_SAMPLER_BYTES_PER_LOGIT` = 12 B per logit (vLLM 0.10.1.1's Qwen2-7B
      profile on an A100: 0.43 GiB at 256 rows). Which one runs depends on the build: V1 used
      FlashInfer's kernel whenever FlashInfer was installed (0.9–0.11.0, not in every wheel);
      vllm-project/vllm pull 26859 made it opt-in (``VLLM_USE_FLASHINFER_SAMPLER=1``) from
      0.11.1, and pull 40376 turned it back on by default in 2026. The planner assumes the
      sort (the larger figure) unless told.

    The llm-d authors' vLLM 0.11.0 H100 table (``tests/fixtures/planner/calibration/``) gives
    the torch peak of four vocabularies at 1,024 rows: 9.59–9.89 fp32 copies, independent of
    hidden size (Qwen3-0.6B 5.56 GiB, Qwen3-32B 5.64 GiB) and of TP. That is why the default
    ``max_num_seqs`` matters: V1 defaults to 1,024 sequences (and 8,192 batched tokens for
    ``vllm serve``) on GPUs of ≥ 70 GiB other than A100, else 256 and 2,048
    (``EngineArgs._set_default_args``), :func:`default_max_num_seqs`. Non-torch memory in V1
    is far smaller than V0's: 0.13–0.14 GiB on one GPU, 0.54–0.55 GiB at TP=2 (the same
    table): :data:`V1_NON_TORCH_BYTES` + :data:`V1_MULTI_GPU_NON_TORCH_BYTES`. CUDA graphs are
    captured *after* the KV cache is allocated, out of the ``1 − utilization`` margin: they
    are not subtracted.
``"v1-cudagraphs"`` (vLLM ≥ 0.21, where ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults
    to on; vllm-project/vllm pull 30515 added it, off, in 0.13): as ``"v1"`` minus the
    profiled CUDA-graph estimate, which this module puts at :data:`CUDAGRAPH_ESTIMATE_BYTES`
    (vLLM logs 0.36–0.65 GiB for small dense models; it is not calibrated on a full log).

:func:`overhead_bytes` is the sum of the non-weight terms for one accounting; the planner's
``kv_gib_available`` is ``total × utilization − weights − overhead_bytes``, i.e. vLLM's
"Available KV cache memory" (per GPU, the smallest over the workers), before clamping at 0.
"""

from __future__ import annotations

import re
from typing import Protocol

from agent.diagnose.plan.models import ModelSpec


class PlanInput(Protocol):
    """What these estimates read of :class:`agent.diagnose.plan.memory.PlanInput` (which imports
    this module, so it is described here rather than imported)."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def gpu_memory_bytes(self) -> int: ...
    @property
    def gpu(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def pipeline_parallel_size(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int | None: ...
    @property
    def effective_max_model_len(self) -> int: ...
    @property
    def overhead_bytes(self) -> int | None: ...
    @property
    def vllm_accounting(self) -> str: ...
    @property
    def sampler(self) -> str: ...

__all__ = [
    "ACCOUNTINGS",
    "ACTIVATION_FACTOR",
    "CUDAGRAPH_ESTIMATE_BYTES",
    "FLASHINFER_SAMPLER_BYTES_PER_LOGIT",
    "FRAMEWORK_BYTES",
    "MULTI_GPU_EXTRA_BYTES",
    "SAMPLERS",
    "SAMPLER_BYTES_PER_LOGIT",
    "V0_ACTIVATION_FACTOR",
    "V0_NON_TORCH_BYTES",
    "V0_NVLINK_MULTI_GPU_BYTES",
    "V0_PCIE_MULTI_GPU_BYTES",
    "V1_MULTI_GPU_NON_TORCH_BYTES",
    "V1_NON_TORCH_BYTES",
    "accounting_for_version",
    "activation_bytes",
    "batched_tokens",
    "default_max_num_seqs",
    "forward_peak_bytes",
    "non_torch_bytes",
    "overhead_bytes",
    "sampler_peak_bytes",
]

GiB = 2**30
ACCOUNTINGS = ("v0", "v1", "v1-cudagraphs")
FUSED_MOE_CHUNK = 32768  # vLLM's VLLM_FUSED_MOE_CHUNK_SIZE default
ACTIVATION_FACTOR = 12  # × tokens × hidden × 2 B: V1's forward pass (see above)
V0_ACTIVATION_FACTOR = 13.5  # the same in V0's eager forward: Llama-3.1-8B logs 2.07 GiB at 20k tokens, 2.99 at 29k
FRAMEWORK_BYTES = 1 * GiB  # LMDeploy: TurboMind's reserve outside the weights and KV cache, one GPU
MULTI_GPU_EXTRA_BYTES = 3 * GiB // 2  # LMDeploy: more with TP > 1 (NCCL)
V0_NON_TORCH_BYTES = 3 * GiB // 10  # vLLM V0, one GPU: 0.01-0.35 GiB logged
V0_PCIE_MULTI_GPU_BYTES = GiB // 10  # V0, TP x PP > 1 over PCIe: 0.20-0.36 GiB logged in all
V0_NVLINK_MULTI_GPU_BYTES = 19 * GiB // 10  # V0, TP x PP > 1 over NVLink: 0.93-2.15 GiB logged per rank
#: GPUs that talk over PCIe (no NVLink between them in the usual server): consumer and workstation
#: cards, the L4/L40 family, A10, A40, T4, and any "PCIe" SKU.
_PCIE_GPUS = re.compile(r"pcie|rtx|geforce|titan|\bl4\b|l40|a10g?\b|a40\b|a[2456]000|\bt4\b|\b[2345]0[6-9]0\b")
SAMPLER_BYTES_PER_LOGIT = 38.8  # V1's dummy sampler run: ~9.7 fp32 copies of rows × vocab logits alive at its peak
FLASHINFER_SAMPLER_BYTES_PER_LOGIT = 12.0  # the same run through FlashInfer's kernel: no sort, ~3 fp32 copies
SAMPLERS = ("native", "flashinfer")
V1_NON_TORCH_BYTES = 140 * 2**20  # CUDA context growth during the profile: 0.13-0.14 GiB on one H100
V1_MULTI_GPU_NON_TORCH_BYTES = 420 * 2**20  # NCCL and custom all-reduce buffers: 0.54-0.55 GiB at TP=2
CUDAGRAPH_ESTIMATE_BYTES = GiB // 2  # v1-cudagraphs only: the profiled estimate, roughly
#: vLLM V1's defaults on big GPUs (≥ 70 GiB, not an A100) and on the rest (``vllm serve``).
_BIG_GPU_SEQS, _SMALL_GPU_SEQS = 1024, 256
_BIG_GPU_TOKENS, _SMALL_GPU_TOKENS = 8192, 2048
_V0_CHUNKED_PREFILL_LEN = 32768  # V0 turns chunked prefill on for longer models


def accounting_for_version(version: str | None, *, v0_engine: bool = False) -> str:
    """The accounting a vLLM version string (``"0.11.0"``, ``"v0.10.1.1"``) logs by; an unknown
    or unparsable version gets ``"v1"``, the 0.8–0.20 behaviour most public logs show."""
    if v0_engine:
        return "v0"
    parts = (version or "").lstrip("v").split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return "v1"
    if (major, minor) < (0, 8):
        return "v0"
    return "v1-cudagraphs" if (major, minor) >= (0, 21) else "v1"


def _big_gpu(gpu_bytes: int, gpu: str) -> bool:
    return gpu_bytes >= 70 * GiB and "a100" not in gpu.lower()


def default_max_num_seqs(gpu_bytes: int, gpu: str = "", accounting: str = "v1") -> int:
    """vLLM's ``--max-num-seqs`` default: 1,024 on V1 for big GPUs (H100, H200, B200), else 256."""
    return _BIG_GPU_SEQS if accounting != "v0" and _big_gpu(gpu_bytes, gpu) else _SMALL_GPU_SEQS


def batched_tokens(inp: PlanInput) -> int:
    """``--max-num-batched-tokens``, or the engine's default for this GPU."""
    if inp.max_num_batched_tokens:
        return inp.max_num_batched_tokens
    if inp.engine == "lmdeploy":
        return 8192  # LMDeploy's --max-prefill-token-num default
    if inp.vllm_accounting == "v0":
        # V0 prefills a whole prompt at once, max(max_model_len, 2048) tokens, unless chunked prefill is on,
        # which it turns on by itself past 32K tokens (then 2,048).
        length = inp.effective_max_model_len
        return max(length, _SMALL_GPU_TOKENS) if length <= _V0_CHUNKED_PREFILL_LEN else _SMALL_GPU_TOKENS
    return _BIG_GPU_TOKENS if _big_gpu(inp.gpu_memory_bytes, inp.gpu) else _SMALL_GPU_TOKENS


def forward_peak_bytes(inp: PlanInput, factor: float = ACTIVATION_FACTOR) -> int:
    """The forward pass's activation peak over the batched tokens: the dense part plus, for
    MoE, the fused-MoE kernel's three intermediate caches (``tokens × top-k × (2N + N + hidden)``
    16-bit values, N the expert width per TP rank, tokens in chunks of at most 32,768)."""
    tokens = batched_tokens(inp)
    m = inp.model
    dense = int(tokens * m.hidden_size * 2 * factor)
    if not m.is_moe:
        return dense
    width = m.moe_intermediate_size // inp.tensor_parallel_size
    chunk = min(tokens, FUSED_MOE_CHUNK)
    return dense + chunk * max(1, m.experts_per_token) * (3 * width + m.hidden_size) * 2


def sampler_peak_bytes(inp: PlanInput) -> int:
    """V1's dummy sampler run: ``min(max_num_seqs, batched tokens)`` rows × vocabulary logits."""
    rows = min(inp.max_num_seqs, batched_tokens(inp))
    per_logit = FLASHINFER_SAMPLER_BYTES_PER_LOGIT if inp.sampler == "flashinfer" else SAMPLER_BYTES_PER_LOGIT
    return int(rows * inp.model.vocab_size * per_logit)


def activation_bytes(inp: PlanInput) -> int:
    """The torch peak of the profile run under ``inp.vllm_accounting`` (see the module docstring);
    for LMDeploy, the forward pass over ``--max-prefill-token-num`` tokens."""
    if inp.engine == "lmdeploy":
        return forward_peak_bytes(inp) + inp.max_num_seqs * inp.model.vocab_size * 4 * 2
    if inp.vllm_accounting == "v0":
        hidden_states = batched_tokens(inp) * inp.model.hidden_size * 2
        return max(forward_peak_bytes(inp, V0_ACTIVATION_FACTOR), hidden_states + sampler_peak_bytes(inp))
    return max(forward_peak_bytes(inp), sampler_peak_bytes(inp))


def non_torch_bytes(inp: PlanInput) -> int:
    """Memory outside torch's allocator that the profile sees grow (CUDA context, NCCL buffers)."""
    multi = inp.tensor_parallel_size * inp.pipeline_parallel_size > 1
    if inp.engine == "lmdeploy":
        return FRAMEWORK_BYTES + (MULTI_GPU_EXTRA_BYTES if multi else 0)
    if inp.vllm_accounting == "v0":
        link = V0_PCIE_MULTI_GPU_BYTES if _PCIE_GPUS.search(inp.gpu.lower()) else V0_NVLINK_MULTI_GPU_BYTES
        return V0_NON_TORCH_BYTES + (link if multi else 0)
    return V1_NON_TORCH_BYTES + (V1_MULTI_GPU_NON_TORCH_BYTES if multi else 0)


def overhead_bytes(inp: PlanInput) -> int:
    """Everything vLLM subtracts besides the weights (LMDeploy: the framework reserve only; its
    activations come out of the memory the KV cache leaves)."""
    if inp.overhead_bytes is not None:
        return inp.overhead_bytes
    if inp.engine == "lmdeploy":
        return non_torch_bytes(inp)
    graphs = CUDAGRAPH_ESTIMATE_BYTES if inp.vllm_accounting == "v1-cudagraphs" else 0
    return non_torch_bytes(inp) + activation_bytes(inp) + graphs
