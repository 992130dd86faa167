"""Reading a model's shape out of a Hugging Face ``config.json`` as it is written today.

:func:`parse_hf_config` returns the keyword arguments of
:class:`~agent.diagnose.plan.models.ModelSpec`. Beyond the dense Llama/Qwen fields it reads:

* **nested configs**: multimodal wrappers (Gemma 3, Llama 4, Mistral 3, Qwen2.5-VL, Kimi-VL)
  keep the language model under ``text_config``; the ``vision_config`` tower and its
  projector are counted (:func:`vision_params`) and kept 16-bit.
* **mixture of experts**: every expert (``num_local_experts``, ``num_experts``,
  ``n_routed_experts``), shared experts (``n_shared_experts``,
  ``shared_expert_intermediate_size``), the expert width (``moe_intermediate_size``, else
  ``intermediate_size``), which layers are dense (``first_k_dense_replace`` and
  ``moe_layer_freq``, ``interleave_moe_layer_step``, ``decoder_sparse_step`` and
  ``mlp_only_layers``, as vLLM's model files decide it) and the router.
* **MLA** (DeepSeek-V2/V3, Kimi K2): ``kv_lora_rank``, ``qk_rope_head_dim``, ``q_lora_rank``,
  ``qk_nope_head_dim``, ``v_head_dim``.
* **sliding-window and chunked attention**: ``layer_types``, ``sliding_window`` with
  ``sliding_window_pattern`` (Gemma 3) or on every layer (Mistral v0.1), Gemma 2's
  alternation, ``use_sliding_window`` false (Qwen2); an explicit ``head_dim`` wins over
  hidden / heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.diagnose.plan.fields import MAX_LAYERS, MAX_VALUE, opt_int, positive_int
from agent.diagnose.plan.quant import ignored_kinds, scheme_from_config
from agent.errors import DiagnosisError

__all__ = ["count_params", "parse_hf_config", "vision_params"]

# vLLM's _get_and_verify_max_len: the model's length is the smallest of these keys present.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_sequence_length", "max_seq_length", "seq_len")
_TOP_LEVEL = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings")
# What a published config.json may leave to its transformers config class's defaults.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
}


def count_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, *, vocab: int,
                 intermediate: int, tied: bool = False, qkv_bias: bool = False) -> int:
    """Parameters of a Llama-style decoder: embeddings (+ untied ``lm_head``), per layer
    Q/K/V/O projections, a gated MLP (gate, up, down) and two norms, plus the final norm."""
    q = heads * head_dim
    kv = kv_heads * head_dim
    attention = hidden * q + 2 * hidden * kv + q * hidden + ((q + 2 * kv) if qkv_bias else 0)
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def parse_hf_config(raw: Mapping[str, Any], name: str = "") -> dict[str, Any]:
    """``ModelSpec`` keyword arguments from a ``config.json`` mapping. Raises
    :class:`DiagnosisError` naming the missing field when the shape cannot be determined, and the
    field and its value when one is not a usable number (:mod:`agent.diagnose.plan.fields`)."""
    data: Mapping[str, Any] = raw
    prefix = ""
    vision = 0
    if isinstance(raw.get("text_config"), Mapping) and not _has_any(raw, ("num_hidden_layers", "n_layer",
                                                                          "num_layers")):
        data = {**raw["text_config"], **{k: raw[k] for k in _TOP_LEVEL if k in raw}}
        prefix = "text_config."
    model_type = str(data.get("model_type", ""))
    data = _Section({**_DEFAULTS.get(model_type, {}), **data}, prefix)
    layers = _int_field(data, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"), "num_hidden_layers",
                        maximum=MAX_LAYERS)
    hidden = _int_field(data, ("hidden_size", "n_embd", "d_model"), "hidden_size")
    heads = _int_field(data, ("num_attention_heads", "n_head", "num_heads"), "num_attention_heads")
    kv_heads = _opt_int(data, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))
    if kv_heads is None and data.get("multi_query_attention"):
        kv_heads = _opt_int(data, ("multi_query_group_num",))
    kv_heads = kv_heads or heads  # absent: multi-head attention, one KV head per query head
    if heads > hidden:
        raise DiagnosisError(f"{prefix}num_attention_heads: {heads} heads do not fit in a hidden size of {hidden}")
    head_dim = _opt_int(data, ("head_dim", "kv_channels")) or hidden // heads
    vocab = _int_field(data, ("vocab_size", "padded_vocab_size"), "vocab_size")
    inter = _opt_int(data, ("intermediate_size", "ffn_hidden_size", "n_inner")) or 4 * hidden
    if model_type == "qwen":
        inter //= 2  # Qwen1: w1 and w2 are each intermediate_size/2 wide (modeling_qwen.QWenMLP)
    lengths = [n for k in _MAX_LEN_KEYS if (n := _opt_int(data, (k,))) is not None]
    max_len = min(lengths) if lengths else 2048  # vLLM's fallback when a config names no length
    tied = bool(data.get("tie_word_embeddings", False))
    bias = model_type in ("qwen", "qwen2") or bool(data.get("attention_bias") or data.get("add_qkv_bias"))
    quant = data.get("quantization_config")
    quant_method = str(quant.get("quant_method", "")).lower() if isinstance(quant, Mapping) else ""
    out: dict[str, Any] = {
        "name": name or str(raw.get("_name_or_path") or model_type or "model"), "num_layers": layers,
        "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "intermediate_size": inter, "max_position_embeddings": max_len, "dtype": _dtype_of(data),
        "tie_word_embeddings": tied, "qkv_bias": bias, "quant_method": quant_method,
    }
    if isinstance(quant, Mapping) and quant_method:
        out["quant"] = scheme_from_config(quant)
    dense_inter = _opt_int(data, ("intermediate_size_mlp",)) or inter  # Llama 4: dense layers are wider
    experts, moe = _moe(data, layers, hidden, inter)
    mla = _mla(data, hidden, heads)
    if mla:
        out.update(kv_lora_rank=mla[0], qk_rope_head_dim=mla[1])
        attention = mla[2]
    else:
        q, kv = heads * head_dim, kv_heads * head_dim
        attention = 2 * hidden * q + 2 * hidden * kv + ((q + 2 * kv) if bias else 0)
        if model_type == "gpt_oss":
            attention += heads + hidden  # attention sinks (one per head) and the o_proj bias
    moe_layers = int(moe.get("num_moe_layers", 0))
    dense_mlp = (layers - moe_layers) * 3 * hidden * dense_inter
    params = (vocab * hidden * (1 if tied else 2) + layers * (attention + 2 * hidden) + hidden + dense_mlp
              + experts["expert"] + experts["router"])
    out.update(moe)
    out.update(_attention_windows(data, layers, model_type))
    if isinstance(raw.get("vision_config"), Mapping):
        vision = vision_params(_Section(raw["vision_config"], "vision_config."), hidden)
    kinds = {"attention": layers * attention, "dense_mlp": dense_mlp, "shared_experts": experts["shared"],
             "experts": experts["expert"] - experts["shared"]}
    counts = {"attention": layers, "dense_mlp": layers - moe_layers, "shared_experts": moe_layers,
              "experts": moe_layers}
    ignored = ignored_kinds(quant, counts) if isinstance(quant, Mapping) else {}
    out.update(num_params=float(params + vision), expert_params=float(experts["expert"]),
               router_params=float(experts["router"]), vision_params=float(vision),
               unquantized_params=float(sum(share * kinds[kind] for kind, share in ignored.items())))
    return out


def _moe(data: Mapping[str, Any], layers: int, hidden: int, inter: int) -> tuple[dict[str, int], dict[str, int]]:
    """(params of experts, the shared ones among them, and routers; ``ModelSpec`` MoE fields); zeros for
    a dense model."""
    experts = _opt_int(data, ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")) or 0
    if experts <= 1:
        return {"expert": 0, "shared": 0, "router": 0}, {}
    width = _opt_int(data, ("moe_intermediate_size", "expert_intermediate_size")) or inter
    top_k = _opt_int(data, ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk")) or 1
    moe_idx = [i for i in range(layers) if _is_moe_layer(data, i)]
    shared = (_opt_int(data, ("n_shared_experts", "num_shared_experts")) or 0) * width
    shared_gate = 0
    if shared_width := _opt_int(data, ("shared_expert_intermediate_size",)):
        shared = shared_width
        shared_gate = hidden  # Qwen2-MoE's shared_expert_gate
    elif str(data.get("model_type", "")).startswith("llama4"):
        shared = inter  # Llama 4: one shared expert as wide as a routed one
    biased = str(data.get("model_type", "")) == "gpt_oss"  # gpt-oss experts and router carry biases
    per_expert = 3 * hidden * width + ((2 * width + hidden) if biased else 0)
    shared_params = len(moe_idx) * 3 * hidden * shared
    expert = len(moe_idx) * experts * per_expert + shared_params
    router = len(moe_idx) * (hidden * experts + shared_gate + (experts if biased or "n_group" in data else 0))
    fields = {"num_experts": experts, "experts_per_token": top_k, "moe_intermediate_size": width,
              "num_moe_layers": len(moe_idx)}
    return {"expert": expert, "shared": shared_params, "router": router}, fields


def _is_moe_layer(data: Mapping[str, Any], i: int) -> bool:
    """Whether layer ``i`` is a mixture-of-experts layer, as vLLM's model files decide."""
    if "first_k_dense_replace" in data:  # DeepSeek-V2/V3, Kimi K2
        freq = _opt_int(data, ("moe_layer_freq",)) or 1
        return i >= (_opt_int(data, ("first_k_dense_replace",)) or 0) and i % freq == 0
    if "interleave_moe_layer_step" in data:  # Llama 4
        step = _opt_int(data, ("interleave_moe_layer_step",)) or 0
        return step > 0 and (i + 1) % step == 0
    if "decoder_sparse_step" in data:  # Qwen2-MoE, Qwen3-MoE
        only = data.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise DiagnosisError(f"{getattr(data, 'prefix', '')}mlp_only_layers: must be a list of layer numbers, "
                                 f"got {type(only).__name__}")
        step = _opt_int(data, ("decoder_sparse_step",)) or 1
        return i not in only and (i + 1) % step == 0
    return True  # Mixtral, gpt-oss: every layer


def _mla(data: Mapping[str, Any], hidden: int, heads: int) -> tuple[int, int, int] | None:
    """(kv_lora_rank, qk_rope_head_dim, attention params per layer) for multi-head latent attention."""
    rank = _opt_int(data, ("kv_lora_rank",))
    if rank is None:
        return None
    rope = _opt_int(data, ("qk_rope_head_dim",)) or 64
    nope = _opt_int(data, ("qk_nope_head_dim",)) or 128
    v_dim = _opt_int(data, ("v_head_dim",)) or 128
    q_rank = _opt_int(data, ("q_lora_rank",))
    q_head = heads * (nope + rope)
    q = hidden * q_rank + q_rank + q_rank * q_head if q_rank else hidden * q_head
    kv = hidden * (rank + rope) + rank + rank * heads * (nope + v_dim)
    return rank, rope, q + kv + heads * v_dim * hidden


def _attention_windows(data: Mapping[str, Any], layers: int, model_type: str) -> dict[str, int]:
    """``sliding_window`` (tokens) and ``num_sliding_layers``: the layers that keep only a window.
    Llama 4's chunked local attention is kept apart (``attention_chunk_size``, ``num_chunked_layers``:
    the layers ``no_rope_layers`` marks 1, by default three of every four): vLLM turns its hybrid
    KV-cache manager off for it by default (a latency regression), so every layer keeps the full
    length unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``."""
    chunk = _opt_int(data, ("attention_chunk_size",))
    if chunk:
        rope = data.get("no_rope_layers")
        if not (isinstance(rope, list) and len(rope) == layers):
            rope = [int((i + 1) % 4 != 0) for i in range(layers)]  # Llama4TextConfig's default
        chunked = sum(1 for flag in rope if flag)
        return {"attention_chunk_size": chunk, "num_chunked_layers": chunked} if chunked else {}
    window = _opt_int(data, ("sliding_window",))
    if not window or data.get("use_sliding_window") is False:
        return {}
    types = data.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        sliding = sum(1 for t in types if "sliding" in str(t))
    elif pattern := _opt_int(data, ("sliding_window_pattern",)):
        sliding = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif model_type in ("gemma2", "cohere2"):
        sliding = (layers + 1) // 2 if model_type == "gemma2" else layers - layers // 4
    else:
        sliding = layers  # Mistral v0.1 style: every layer attends within the window
    return {"sliding_window": window, "num_sliding_layers": sliding} if sliding else {}


def vision_params(vision: Mapping[str, Any], text_hidden: int) -> int:
    """An estimate of a vision tower's parameters: a ViT of ``depth`` blocks (attention 4h²,
    an MLP 2·h·inter, or 3·h·inter when gated by SiLU), the patch embedding and a projector
    into the language model's width (through a ``spatial_merge_size``² merger if there is one)."""
    depth = _opt_int(vision, ("depth", "num_hidden_layers", "num_layers", "n_layers")) or 0
    h = _opt_int(vision, ("hidden_size", "embed_dim", "width")) or 0
    if not depth or not h:
        return 0
    inter = _opt_int(vision, ("intermediate_size",)) or 4 * h
    gated = str(vision.get("hidden_act", "")) == "silu"
    patch = _opt_int(vision, ("patch_size",)) or 14
    channels = _opt_int(vision, ("in_channels", "num_channels", "in_chans")) or 3
    temporal = _opt_int(vision, ("temporal_patch_size",)) or 1
    block = 4 * h * h + 4 * h + (3 if gated else 2) * h * inter + 4 * h
    merge = _opt_int(vision, ("spatial_merge_size",)) or 1
    out = _opt_int(vision, ("out_hidden_size", "projection_dim")) or text_hidden
    merged = h * merge * merge
    projector = merged * merged + merged * out if merge > 1 else h * out
    return depth * block + channels * patch * patch * temporal * h + projector


def _has_any(data: Mapping[str, Any], keys: tuple[str, ...]) -> bool:
    return any(k in data for k in keys)


class _Section(dict[str, Any]):
    """The part of a config the shape is read from, with the key path errors name it by
    (``text_config.`` for a multimodal wrapper's language model)."""

    def __init__(self, data: Mapping[str, Any], prefix: str) -> None:
        super().__init__(data)
        self.prefix = prefix


def _opt_int(data: Mapping[str, Any], keys: tuple[str, ...], *, maximum: int = MAX_VALUE) -> int | None:
    """:func:`~agent.diagnose.plan.fields.opt_int` with the section's key path."""
    return opt_int(data, keys, prefix=getattr(data, "prefix", ""), maximum=maximum)


def _int_field(data: Mapping[str, Any], keys: tuple[str, ...], label: str, *, maximum: int = MAX_VALUE) -> int:
    """A required field: absent is an error, and so is ``0`` (which :func:`_opt_int` reads as unset)."""
    value = _opt_int(data, keys, maximum=maximum)
    if value is None:
        present = next((k for k in keys if data.get(k) is not None), None)
        if present is not None:
            positive_int(data[present], getattr(data, "prefix", "") + present)  # raises, naming it
        raise DiagnosisError(f"model config has no {label} (looked for {', '.join(keys)})")
    return value


def _dtype_of(data: Mapping[str, Any]) -> str:
    """``torch_dtype`` (or newer ``dtype``); Qwen1 uses ``bf16``/``fp16`` flags; default bfloat16."""
    raw = str(data.get("torch_dtype") or data.get("dtype") or "").lower()
    if raw in ("float16", "bfloat16", "float32"):
        return raw
    if data.get("fp16"):
        return "float16"
    return "bfloat16"
