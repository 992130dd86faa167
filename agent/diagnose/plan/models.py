"""Model shapes and GPU memory sizes the memory planner reasons about.

The planner needs a model's *shape* (layers, hidden size, attention and KV heads,
head size, vocabulary, MLP width), not its weights: KV bytes per token and weight
bytes both follow from it. This module holds

* :class:`ModelSpec` and :meth:`ModelSpec.from_hf_config`, which reads a Hugging Face
  ``config.json`` (Llama/Qwen2/InternLM2 field names, Qwen1's ``kv_channels``/
  ``seq_length``, ChatGLM's ``multi_query_group_num``, GPT-2 style ``n_layer``/``n_head``);
* built-in presets for the models the deployment guides name, transcribed from their
  published ``config.json`` (``tests/fixtures/planner/`` holds the transcriptions and
  their sources; a test checks presets and files agree and that the parameter count
  computed from the shape matches the published one);
* the memory totals NVML reports for common GPUs.

Parameters are counted from the shape (:func:`count_params`) rather than typed in, so
a preset and a ``--model-config`` file go through the same arithmetic.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agent.diagnose.plan.quant import QuantScheme
from agent.diagnose.plan.shapes import count_params, parse_hf_config
from agent.errors import DiagnosisError

__all__ = [
    "GPU_MEMORY_MIB",
    "MAX_CONFIG_BYTES",
    "PRESETS",
    "PRESET_SOURCES",
    "ModelSpec",
    "count_params",
    "find_model",
    "gpu_memory_bytes",
    "load_model_config",
    "normalize_model_name",
    "quantization_from_name",
]

# Name tokens that say which fine-tune or packaging a checkpoint is, not which shape it has:
# "meta-llama/Meta-Llama-3-70B-Instruct", "Qwen/Qwen-7B-Chat", "internlm/internlm2-chat-20b",
# "TheBloke/Llama-2-7B-AWQ" all name a preset's shape.
_NOISE_TOKENS = frozenset({
    "meta", "instruct", "chat", "hf", "base", "sft", "it", "awq", "gptq", "int4", "int8", "fp8", "fp16", "bf16",
})
#: A ``config.json`` is a few kilobytes (Llama 4's, with its vision tower, under 10 KB); reading more
#: than this is someone pointing ``--model-config`` at a weights or log file.
MAX_CONFIG_BYTES = 4 << 20
_QUANT_TOKENS = {"awq": "awq", "gptq": "gptq", "int4": "gptq", "fp8": "fp8", "int8": "int8"}



@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as memory planning needs it.

    ``intermediate_size`` is the width of *each* MLP projection (gate, up, down). Qwen1's
    ``config.json`` states twice that (22016 for Qwen-7B, whose ``w1``/``w2`` are 11008 wide);
    :meth:`from_hf_config` halves it. ``max_position_embeddings`` is the length vLLM uses
    when ``--max-model-len`` is not given (the smallest of the config's length keys).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_params: float
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    quant_method: str = ""  # the checkpoint's quantization_config.quant_method, "" if none
    quant: QuantScheme | None = None  # the checkpoint's weight format, from quantization_config
    # Mixture of experts: routed experts per MoE layer, how many a token uses, each one's MLP width.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_moe_layers: int = 0
    expert_params: float = 0.0  # routed + shared expert weights (in num_params)
    router_params: float = 0.0  # MoE gates: stay 16-bit (in num_params)
    vision_params: float = 0.0  # the vision tower and projector: stay 16-bit (in num_params)
    unquantized_params: float = 0.0  # what else the checkpoint's ignore list keeps 16-bit (in num_params)
    # Multi-head latent attention: the KV cache holds kv_lora_rank + qk_rope_head_dim per token and layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # Sliding-window attention on num_sliding_layers of the layers.
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # Llama 4's chunked local attention: num_chunked_layers attend within chunks of attention_chunk_size.
    attention_chunk_size: int = 0
    num_chunked_layers: int = 0

    @property
    def rope_cache_bytes(self) -> int:
        """vLLM's rotary-embedding cache, a 16-bit buffer of ``max_position_embeddings`` × rotary width, on
        every GPU and counted in "Model loading took": 32 MiB for Llama-3.1-8B's 131,072 positions (its
        logged 14.9888 GiB is 8.03 B parameters at 2 B plus exactly that), 2.5 GiB for Llama 4 Scout's 10M."""
        return self.max_position_embeddings * (self.qk_rope_head_dim if self.is_mla else self.head_dim) * 2

    @property
    def embedding_params(self) -> int:
        """Input embedding plus ``lm_head`` (one matrix when tied): kept 16-bit by AWQ/GPTQ/FP8."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def is_gqa(self) -> bool:
        return self.num_key_value_heads < self.num_attention_heads

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one latent per token and layer."""
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @classmethod
    def from_hf_config(cls, data: Mapping[str, Any], name: str = "") -> ModelSpec:
        """Read a Hugging Face ``config.json`` mapping (:func:`~agent.diagnose.plan.shapes.parse_hf_config`).
        Raises :class:`DiagnosisError` naming the missing field when the shape cannot be determined."""
        return cls(**parse_hf_config(data, name))


def _preset(name: str, hf_id: str, shape: tuple[int, int, int, int, int, int], max_len: int, dtype: str, *,
            qkv_bias: bool = False) -> tuple[ModelSpec, str]:
    """``shape`` = (layers, hidden, attention heads, KV heads, vocabulary, MLP width)."""
    layers, hidden, heads, kv_heads, vocab, inter = shape
    head_dim = hidden // heads
    params = count_params(layers, hidden, heads, kv_heads, head_dim, vocab=vocab, intermediate=inter,
                          qkv_bias=qkv_bias)
    spec = ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, intermediate_size=inter,
                     max_position_embeddings=max_len, num_params=float(params), dtype=dtype, qkv_bias=qkv_bias)
    return spec, hf_id


# Transcribed from each model's published config.json (the Hugging Face id is the source;
# tests/fixtures/planner/ holds the files and README). Qwen1's MLP width is half its config's
# intermediate_size; its length is min(max_position_embeddings, seq_length) as in vLLM.
_PRESET_LIST = (
    _preset("Llama-2-7B", "meta-llama/Llama-2-7b-hf", (32, 4096, 32, 32, 32000, 11008), 4096, "float16"),
    _preset("Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct", (32, 4096, 32, 8, 128256, 14336), 8192,
            "bfloat16"),
    _preset("Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct", (80, 8192, 64, 8, 128256, 28672), 8192,
            "bfloat16"),
    _preset("Qwen-7B", "Qwen/Qwen-7B-Chat", (32, 4096, 32, 32, 151936, 11008), 8192, "bfloat16", qkv_bias=True),
    _preset("Qwen2-7B", "Qwen/Qwen2-7B-Instruct", (28, 3584, 28, 4, 152064, 18944), 32768, "bfloat16",
            qkv_bias=True),
    _preset("Qwen-72B", "Qwen/Qwen-72B-Chat", (80, 8192, 64, 64, 152064, 24576), 32768, "bfloat16", qkv_bias=True),
    _preset("Qwen2-72B", "Qwen/Qwen2-72B-Instruct", (80, 8192, 64, 8, 152064, 29568), 32768, "bfloat16",
            qkv_bias=True),
    _preset("InternLM2-20B", "internlm/internlm2-chat-20b", (48, 6144, 48, 8, 92544, 16384), 32768, "bfloat16"),
)

PRESETS: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec, _ in _PRESET_LIST})
PRESET_SOURCES: Mapping[str, str] = MappingProxyType({spec.name: hf for spec, hf in _PRESET_LIST})

# Memory totals as CUDA reports them (cudaMemGetInfo's total: what vLLM multiplies by
# --gpu-memory-utilization and LMDeploy's TurboMind reads), in MiB. NVML (nvidia-smi, dcgm-exporter's
# DCGM_FI_DEV_FB_*) reports 0.3-0.85 GiB more, which the driver keeps; planning from NVML's figure
# overstates the KV cache by 0.9 x that. Each is the figure vLLM logged for the card (the calibration
# excerpts in tests/fixtures/planner/calibration/ and its README), nvidia-smi's in the comment.
GPU_MEMORY_MIB: Mapping[str, int] = MappingProxyType({
    "A100-40GB": 40325,  # 39.38 GiB ("total_gpu_memory (39.38GiB)", 4x A100 40GB); nvidia-smi 40960
    "A100-80GB": 81183,  # 79.28 GiB (the KV difference of two 0.10.1.1 runs at util 0.25 and 0.5); 81920
    "H100": 81080,  # 79.18 GiB (vLLM 0.11's "Free memory on device", the llm-d H100 table); 81559
    "H200": 143165,  # 139.81 GiB ("Free memory on device (139.21/139.81 GiB)"); 143771
    "L40S": 45599,  # 44.53 GiB ("Free memory on device (28.56/44.53 GiB)"); 46068
    "RTX-4090": 24218,  # 23.65 GiB (PyTorch's "total capacity of 23.65 GiB"); 24564
})
_GPU_ALIASES = {
    "a100": "A100-80GB", "a10040g": "A100-40GB", "a10040gb": "A100-40GB", "a10080g": "A100-80GB",
    "a10080gb": "A100-80GB", "h100": "H100", "h10080gb": "H100", "h100sxm": "H100", "h200": "H200",
    "h200141gb": "H200", "l40s": "L40S", "rtx4090": "RTX-4090", "4090": "RTX-4090", "geforcertx4090": "RTX-4090",
}


def normalize_model_name(name: str) -> str:
    """``meta-llama/Meta-Llama-3-70B-Instruct`` → ``llama370b``: last path part, lower case,
    fine-tune/packaging tokens dropped, punctuation removed."""
    base = re.split(r"[/\\]", name.strip().rstrip("/\\"))[-1].lower()
    tokens = [t for t in re.split(r"[-_.\s]+", base) if t and t not in _NOISE_TOKENS]
    return "".join(re.sub(r"[^a-z0-9]", "", t) for t in tokens)


def quantization_from_name(name: str) -> str:
    """``TheBloke/Llama-2-7B-AWQ`` → ``awq``; ``""`` when the name says nothing."""
    base = re.split(r"[/\\]", name.strip().rstrip("/\\"))[-1].lower()
    for token in re.split(r"[-_.\s]+", base):
        if token in _QUANT_TOKENS:
            return _QUANT_TOKENS[token]
    return ""


_BY_KEY = {normalize_model_name(n): spec for n, spec in PRESETS.items()} | {
    normalize_model_name(hf): PRESETS[n] for n, hf in PRESET_SOURCES.items()
}


def find_model(name: str) -> ModelSpec:
    """A preset by name or Hugging Face id, case-insensitively. Raises :class:`DiagnosisError`
    listing the presets (and suggesting ``--model-config``) when there is none."""
    spec = _BY_KEY.get(normalize_model_name(name))
    if spec is None:
        raise DiagnosisError(
            f"unknown model {name!r}; presets: {', '.join(PRESETS)}. For another model pass its Hugging Face "
            "config.json with --model-config PATH")
    return spec


def gpu_memory_bytes(name: str) -> int:
    """Total memory of a GPU preset in bytes, as CUDA reports it (:data:`GPU_MEMORY_MIB`). Raises
    :class:`DiagnosisError` listing the presets (and suggesting ``--gpu-memory``) when the name is unknown."""
    key = re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))
    canonical = next((g for g in GPU_MEMORY_MIB if re.sub(r"[^a-z0-9]", "", g.lower()) == key), None)
    canonical = canonical or _GPU_ALIASES.get(key)
    if canonical is None:
        raise DiagnosisError(f"unknown GPU {name!r}; presets: {', '.join(GPU_MEMORY_MIB)}. "
                             "Or give the size with --gpu-memory, e.g. 80GiB")
    return GPU_MEMORY_MIB[canonical] * 2**20


def load_model_config(path: Path, name: str = "") -> ModelSpec:
    """:meth:`ModelSpec.from_hf_config` on a file, named (unless ``name`` is given) after the folder of
    a ``config.json``, as a Hugging Face snapshot lays it out, else after the file (``llama-4.config.json``:
    ``llama-4``); unreadable or non-JSON files, files over :data:`MAX_CONFIG_BYTES` and JSON nested
    past Python's recursion limit raise :class:`DiagnosisError` from their cause."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise DiagnosisError(f"model config {path} is over the {MAX_CONFIG_BYTES:,}-byte limit (a config.json "
                                 "is a few kilobytes; is this the weights file?)")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiagnosisError(f"cannot read model config {path}: {exc}") from exc
    except RecursionError as exc:
        raise DiagnosisError(f"cannot read model config {path}: JSON nested too deeply") from exc
    if not isinstance(data, dict):
        raise DiagnosisError(f"model config {path} is not a JSON object")
    stem = path.name.removesuffix(".json").removesuffix(".config")
    default = path.parent.name if path.name == "config.json" else stem
    return ModelSpec.from_hf_config(data, name=name or default or path.stem)
