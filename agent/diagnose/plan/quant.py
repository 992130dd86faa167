"""Weight quantization: what a checkpoint's ``quantization_config`` (or ``--quantization``) costs.

vLLM loads a quantized checkpoint's tensors as stored, so the bytes per weight follow from
the format. :class:`QuantScheme` holds what matters (bits per weight, group size, zero
points, block scales, which layers are quantized) and :func:`bytes_per_weight` the bytes per
quantized weight including its scales. Read from vLLM's quantization layers
(``vllm/model_executor/layers/quantization/``):

* **fp8** per-tensor: 1 B + one fp32 scale per tensor; block-wise (``weight_block_size``
  ``[128, 128]``, DeepSeek-V3): 1 B + an fp32 ``weight_scale_inv`` per 128 × 128 block.
* **compressed-tensors**: ``config_groups[*].weights`` gives ``num_bits``, ``strategy``
  (tensor, channel, group, block), ``group_size`` and ``symmetric``. int8 W8A8 is 1 B + a
  per-channel scale; W4A16 ``pack-quantized`` is 0.5 B + a 16-bit scale per group
  (+ a packed zero point when asymmetric).
* **AWQ**: 4-bit packed + fp16 scale + 4-bit zero point per group (``q_group_size`` /
  ``group_size``). **GPTQ**: ``bits``-bit packed + fp16 scale + packed ``bits``-bit zero
  per group; ``group_size`` −1 is one group per output channel; ``desc_act`` adds a
  ``g_idx`` int32 per input row (under 0.1 %, left out) and does not change the bytes.
* **mxfp4** (gpt-oss): only the MoE experts, 4-bit values + one e8m0 (1 B) scale per 32.
* **bitsandbytes**: ``load_in_4bit`` 0.5 B + an fp32 absmax per 64 weights (or, with
  ``bnb_4bit_use_double_quant``, an 8-bit absmax plus an fp32 per 256 of those);
  ``load_in_8bit`` 1 B + a per-row scale.

Embeddings, ``lm_head``, MoE routers, norms and vision towers stay 16-bit in all of them
(compressed-tensors checkpoints list these in ``ignore``; mxfp4 also keeps attention in
16-bit). A compressed-tensors ``ignore`` list may keep more in 16-bit: Kimi K2's INT4 checkpoint
quantizes only the routed experts (``re:.*self_attn.*``, ``re:.*shared_experts.*`` and the dense
layers' MLP are ignored). :func:`ignored_kinds` says which of attention, dense MLP, shared experts
and routed experts a list names. :func:`default_scheme` is the scheme a bare ``--quantization NAME``
implies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.diagnose.plan.fields import MAX_VALUE, opt_int, positive_int
from agent.errors import DiagnosisError, RegexError
from agent.gocompat.regex import compile_go

__all__ = ["KINDS", "METHODS", "QuantScheme", "bytes_per_weight", "default_scheme", "ignored_kinds", "normalize_method",
           "scheme_from_config"]

#: The quantization methods the planner models (``--quantization`` values, normalized).
METHODS = ("none", "awq", "gptq", "fp8", "int8", "compressed-tensors", "mxfp4", "bitsandbytes")
_PREFIX = "quantization_config."  # where errors say a field sits in config.json
_MAX_BITS = 32  # bits per weight: 16 is unquantized; more is not a quantization
_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "marlin": "gptq", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8",
            "compressed_tensors": "compressed-tensors", "bnb": "bitsandbytes", "": "none"}


@dataclass(frozen=True)
class QuantScheme:
    """One checkpoint's weight format. ``group_size`` 0 means per tensor or per channel
    (scales too few to count); ``block`` is the weights per block scale (fp8 block-wise);
    ``experts_only`` quantizes the MoE experts and nothing else (mxfp4)."""

    method: str
    bits: int = 16
    group_size: int = 0
    scale_bytes: int = 2
    zero_point: bool = False
    block: int = 0
    experts_only: bool = False
    double_quant: bool = False


def normalize_method(name: str) -> str:
    """``awq_marlin`` → ``awq``, ``compressed_tensors`` → ``compressed-tensors``; unknown names as given."""
    key = name.strip().lower()
    return _ALIASES.get(key, key)


def default_scheme(method: str) -> QuantScheme:
    """The usual checkpoint for a method when only its name is known (4-bit, group 128 for AWQ/GPTQ)."""
    method = normalize_method(method)
    if method in ("awq", "gptq"):
        return QuantScheme(method, bits=4, group_size=128, zero_point=True)
    if method in ("fp8", "int8"):
        return QuantScheme(method, bits=8)
    if method == "compressed-tensors":
        return QuantScheme(method, bits=8)  # int8/fp8 W8A8, the most common compressed-tensors checkpoint
    if method == "mxfp4":
        return QuantScheme(method, bits=4, group_size=32, scale_bytes=1, experts_only=True)
    if method == "bitsandbytes":
        return QuantScheme(method, bits=4, group_size=64, scale_bytes=4)
    return QuantScheme("none")


def scheme_from_config(config: Mapping[str, Any]) -> QuantScheme:
    """The scheme a ``quantization_config`` mapping describes; unknown fields fall back to
    :func:`default_scheme` for its ``quant_method``."""
    method = normalize_method(str(config.get("quant_method", "")))
    base = default_scheme(method)
    if method in ("awq", "gptq"):
        bits = _int(config, ("bits", "w_bit"), base.bits, maximum=_MAX_BITS)
        group = _group_size(config, ("group_size", "q_group_size"), base.group_size)
        zero = bool(config.get("zero_point", True)) if method == "awq" else True  # GPTQ stores qzeros always
        return QuantScheme(method, bits=bits, group_size=group, zero_point=zero)
    if method == "fp8":
        block = _block(config.get("weight_block_size"), "weight_block_size")
        return QuantScheme(method, bits=8, block=block, scale_bytes=4) if block else base
    if method == "compressed-tensors":
        return _compressed_tensors(config) or base
    if method == "bitsandbytes":
        if config.get("load_in_8bit"):
            return QuantScheme(method, bits=8)
        return QuantScheme(method, bits=4, group_size=64, scale_bytes=4,
                           double_quant=bool(config.get("bnb_4bit_use_double_quant")))
    return base


def _compressed_tensors(config: Mapping[str, Any]) -> QuantScheme | None:
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        bits = _int(weights, ("num_bits",), 8, maximum=_MAX_BITS, prefix="config_groups.weights.")
        strategy = str(weights.get("strategy", "tensor"))
        group_size = _group_size(weights, ("group_size",), 0, prefix="config_groups.weights.") \
            if strategy == "group" else 0
        block_n = _block(weights.get("block_structure"), "config_groups.weights.block_structure") \
            if strategy == "block" else 0
        zero = weights.get("symmetric") is False
        return QuantScheme("compressed-tensors", bits=bits, group_size=group_size, zero_point=zero, block=block_n,
                           scale_bytes=4 if block_n else 2)
    return None


#: The kinds of layer :func:`ignored_kinds` tells apart, each with the module names (as Hugging Face
#: checkpoints and vLLM name them) an ``ignore`` entry is matched against.
_KIND_MODULES: Mapping[str, tuple[str, ...]] = {
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj",
                  "self_attn.o_proj", "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                  "self_attn.kv_b_proj"),
    "dense_mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.gate_up_proj", "mlp.down_proj"),
    "shared_experts": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.down_proj", "mlp.shared_expert.gate_proj",
                       "mlp.shared_expert.down_proj"),
    "experts": ("mlp.experts.0.gate_proj", "mlp.experts.0.down_proj", "mlp.experts.0.w1", "mlp.experts.0.w2"),
}
KINDS = tuple(_KIND_MODULES)
_LAYER = re.compile(r"^model\.layers\.(\d{1,9})\.")  # bounded: int() refuses over 4,300 digits


def ignored_kinds(config: Mapping[str, Any], layers: Mapping[str, int]) -> dict[str, float]:
    """Which layers a compressed-tensors ``ignore`` list keeps 16-bit: for each kind of
    :data:`KINDS`, the share of the layers that have that kind (``layers``: how many do) whose
    modules of it are ignored.

    A ``re:`` entry is a pattern vLLM matches from the start of the module name: it ignores a kind
    in every layer when it matches that kind's module names (through :mod:`agent.gocompat.regex`'s
    RE2, so a hostile pattern cannot stall the planner; one RE2 refuses is skipped). Any other
    entry is one module's name: ``model.layers.7.self_attn.o_proj`` ignores that layer's attention,
    so a list naming each layer counts the layers it names."""
    entries = config.get("ignore") if config.get("quant_method") == "compressed-tensors" else None
    if not isinstance(entries, list):
        return {}
    whole: set[str] = set()
    named: dict[str, set[int]] = {kind: set() for kind in KINDS}
    for entry in (e for e in entries if isinstance(e, str)):
        if entry.startswith("re:"):
            try:
                pattern = compile_go(f"^(?:{entry[3:]})", what="quantization_config ignore")
            except RegexError:
                continue
            whole |= {kind for kind, names in _KIND_MODULES.items()
                      if any(pattern.search(f"model.layers.1.{name}") for name in names)}
            continue
        layer = _LAYER.match(entry[:200])
        if layer:
            rest = entry[layer.end():]
            named.update({kind: named[kind] | {int(layer[1])} for kind, names in _KIND_MODULES.items()
                          if rest in names})
    share = {kind: min(1.0, len(found) / max(1, layers.get(kind, 0))) for kind, found in named.items() if found}
    return {**share, **dict.fromkeys(whole, 1.0)}


def bytes_per_weight(scheme: QuantScheme) -> float:
    """Bytes per quantized weight, scales and zero points included."""
    value = scheme.bits / 8
    if scheme.group_size > 0:
        per_group = scheme.scale_bytes + (scheme.bits / 8 if scheme.zero_point else 0)
        if scheme.double_quant:
            per_group = 1 + 4 / 256  # 8-bit absmax, itself scaled by an fp32 per 256 blocks
        value += per_group / scheme.group_size
    if scheme.block > 0:
        value += scheme.scale_bytes / scheme.block
    return value


def _int(data: Mapping[str, Any], keys: tuple[str, ...], default: int, *, maximum: int = MAX_VALUE,
         prefix: str = "") -> int:
    """A positive integer field of ``quantization_config`` (``default`` when unset); a value that is
    set but unusable raises :class:`DiagnosisError` naming it."""
    value = opt_int(data, keys, prefix=_PREFIX + prefix, maximum=maximum)
    return default if value is None else value


def _group_size(data: Mapping[str, Any], keys: tuple[str, ...], default: int, *, prefix: str = "") -> int:
    """A quantization group size: positive, or ``-1`` (GPTQ's and AutoAWQ's "one group per output
    channel", i.e. no grouping, read as 0)."""
    first = next((data[k] for k in keys if data.get(k) is not None), None)
    if type(first) in (int, float) and first == -1:
        return 0
    return _int(data, keys, default, prefix=prefix)


def _block(value: Any, path: str) -> int:
    """Weights per scale of a ``[rows, columns]`` block (0 when unset)."""
    if value is None:
        return 0
    if not isinstance(value, list) or len(value) != 2:
        raise DiagnosisError(f"{_PREFIX}{path}: must be two positive integers, got {value!r:.60}")
    return positive_int(value[0], f"{_PREFIX}{path}[0]") * positive_int(value[1], f"{_PREFIX}{path}[1]")
