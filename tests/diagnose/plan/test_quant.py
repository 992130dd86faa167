"""Tests for agent.diagnose.plan.quant and the weight bytes it gives: formats, scales, 16-bit layers."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from agent.diagnose.plan.memory import (
    GiB,
    PlanInput,
    expert_padding_bytes,
    memory_numbers,
    mxfp4_backend,
    weight_bytes,
)
from agent.diagnose.plan.models import PRESETS, ModelSpec, gpu_memory_bytes, load_model_config
from agent.diagnose.plan.quant import QuantScheme, bytes_per_weight, default_scheme, ignored_kinds, scheme_from_config
from tests.conftest import FIXTURES

PLANNER = FIXTURES / "planner"


@pytest.mark.parametrize(("config", "expected"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 0.5 + (2 + 0.5) / 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, 0.5 + (2 + 0.5) / 128),
    ({"quant_method": "gptq", "bits": 8, "group_size": 32}, 1 + (2 + 1) / 32),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, 0.5),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, 1.0),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1 + 4 / (128 * 128)),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True, "type": "int"}}}},
     0.5 + 2 / 128),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "int"}}}}, 1.0),
    ({"quant_method": "mxfp4"}, 0.5 + 1 / 32),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True},
     0.5 + (1 + 4 / 256) / 64),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
])
def test_bytes_per_weight(config: dict[str, Any], expected: float) -> None:
    """Each format's bytes per weight: packed values plus its scales and zero points per group or block."""
    assert bytes_per_weight(scheme_from_config(config)) == pytest.approx(expected)


def test_marlin_names_and_defaults() -> None:
    """--quantization awq_marlin/gptq_marlin mean the AWQ/GPTQ checkpoint formats (4-bit, group 128)."""
    assert default_scheme("awq_marlin") == QuantScheme("awq", bits=4, group_size=128, zero_point=True)
    assert default_scheme("gptq_marlin").method == "gptq"


def test_dense_awq_weights_unchanged() -> None:
    """Llama-3-8B AWQ: embeddings and lm_head at 2 B, the rest at 0.51953125 B, as before."""
    spec = PRESETS["Llama-3-8B"]
    linear = spec.num_params - spec.embedding_params
    assert weight_bytes(spec, "awq") == int(spec.embedding_params * 2 + linear * (0.5 + 2.5 / 128))


def test_checkpoint_group_size_is_used() -> None:
    """A GPTQ checkpoint with group size 32 costs more than the default group 128."""
    data: dict[str, Any] = json.loads((PLANNER / "meta-llama-3-8b-instruct.config.json").read_text(encoding="utf-8"))
    data["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}
    spec = ModelSpec.from_hf_config(data)
    linear = spec.num_params - spec.embedding_params
    assert weight_bytes(spec, "gptq") == int(spec.embedding_params * 2 + linear * (0.5 + 2.5 / 32))


def test_mxfp4_quantizes_only_the_experts() -> None:
    """gpt-oss-20b: experts at 0.53125 B, attention, embeddings and routers at 2 B (about 12.8 GiB)."""
    spec = load_model_config(PLANNER / "gpt-oss-20b.config.json")
    expected = int((spec.num_params - spec.expert_params) * 2 + spec.expert_params * (0.5 + 1 / 32))
    assert weight_bytes(spec, "mxfp4") == expected
    assert 12.5 < expected / 2**30 < 13.2


def test_moe_router_and_vision_stay_16_bit() -> None:
    """fp8 on an MoE model: the router stays 2 B per weight; the vision tower too."""
    spec = load_model_config(PLANNER / "mixtral-8x7b-instruct-v0.1.config.json")
    quantized = spec.num_params - spec.embedding_params - spec.router_params
    assert weight_bytes(spec, "fp8") == int((spec.embedding_params + spec.router_params) * 2 + quantized)
    vl = replace(load_model_config(PLANNER / "qwen2.5-vl-7b-instruct.config.json"))
    assert weight_bytes(vl, "fp8") == int((vl.embedding_params + vl.vision_params) * 2 +
                                          (vl.num_params - vl.embedding_params - vl.vision_params))


def test_vocabulary_padded_to_64() -> None:
    """A vocabulary that is not a multiple of 64 is padded, as VocabParallelEmbedding does."""
    spec = replace(PRESETS["Llama-2-7B"], vocab_size=32001)
    assert weight_bytes(spec) == int((spec.num_params + 63 * 4096 * 2) * 2)


def test_mxfp4_experts_padded_to_256_per_tp_rank() -> None:
    """gpt-oss-120b: vLLM pads each expert's 2880 width (720 per rank at TP=4) to 3072 (768): +6.7 % expert bytes;
    on one H100 that is the 64.38 GiB vLLM 0.11 logs as "Model loading took" (tests/fixtures/planner/calibration/)."""
    spec = load_model_config(PLANNER / "gpt-oss-120b.config.json")
    per_weight = 0.5 + 1 / 32
    one = PlanInput(spec, gpu_memory_bytes("H100"), quantization="mxfp4")
    assert expert_padding_bytes(one) == int(spec.expert_params * (3072 / 2880 - 1) * per_weight)
    four = PlanInput(spec, gpu_memory_bytes("H100"), quantization="mxfp4", tensor_parallel_size=4)
    assert expert_padding_bytes(four) == int(spec.expert_params / 4 * (768 / 720 - 1) * per_weight)
    weights = memory_numbers(one).weights / 2**30
    assert abs(weights - 64.38) / 64.38 < 0.01
    assert expert_padding_bytes(PlanInput(PRESETS["Llama-3-8B"], gpu_memory_bytes("H100"), quantization="awq")) == 0


def _vllm_expert_bytes(experts: int, inner: int, hidden: int) -> int:
    """One layer's mxfp4 expert tensors as ``Mxfp4MoEMethod.create_weights`` allocates them for a padded
    intermediate width per rank (``inner``) and hidden width: w13 and w2 at two values per byte, one e8m0
    scale byte per 32 values (the bf16 biases left out, as the planner leaves them)."""
    w13 = experts * 2 * inner * (hidden // 2 + hidden // 32)
    w2 = experts * hidden * (inner // 2 + inner // 32)
    return w13 + w2


@pytest.mark.parametrize(("gpu", "tp", "backend", "inner", "hidden"), [
    ("H100", 1, "triton", 3072, 2880),       # the layout vLLM 0.11's H100 logs add up to
    ("A100-80GB", 1, "marlin", 2944, 3072),  # Marlin: intermediate to 128, hidden to 256
    ("4x A100-80GB", 4, "marlin", 768, 3072),
    ("RTX PRO 6000 Blackwell", 1, "marlin", 2944, 3072),  # SM120: no triton_kernels, no FlashInfer mxfp4
    ("B200", 1, "flashinfer", 3072, 3072),
    ("H100", 1, "marlin", 2944, 3072),       # an H100 build without triton_kernels, told so
])
def test_mxfp4_padding_follows_the_moe_backend(gpu: str, tp: int, backend: str, inner: int, hidden: int) -> None:
    """gpt-oss-120b's experts per GPU grow by what vLLM's padded tensors hold beyond the unpadded ones
    (36 layers of 128 experts, 2880 x 2880), to within 0.1 %; auto picks the backend from the GPU's name."""
    spec = load_model_config(PLANNER / "gpt-oss-120b.config.json")
    told = "marlin" if gpu == "H100" and backend == "marlin" else "auto"
    inp = PlanInput(spec, gpu_memory_bytes("H100"), quantization="mxfp4", tensor_parallel_size=tp, gpu=gpu,
                    mxfp4_backend=told)
    assert mxfp4_backend(inp) == backend
    layers, experts = 36, 128
    unpadded = experts * 3 * 2880 / tp * 2880 * (0.5 + 1 / 32)  # the checkpoint's share: gate, up and down
    grown = layers * (_vllm_expert_bytes(experts, inner, hidden) - unpadded)
    assert abs(expert_padding_bytes(inp) - grown) / grown < 0.001, (expert_padding_bytes(inp), grown)


def test_compressed_tensors_ignore_list_keeps_layers_16_bit() -> None:
    """Kimi K2's INT4 checkpoint ignores attention, the shared experts and the dense layer's MLP: only the 60
    MoE layers' 384 routed experts (3 x 7168 x 2048 each) are 4-bit with a 16-bit scale per 32."""
    spec = load_model_config(PLANNER / "calibration" / "kimi-k2-thinking.config.json")
    routed = 60 * 384 * 3 * 7168 * 2048
    expected = (spec.num_params - routed) * 2 + routed * (0.5 + 2 / 32)
    assert weight_bytes(spec, "compressed-tensors") == pytest.approx(expected, rel=1e-5)  # norms: 0.9 M params
    bare = replace(spec, unquantized_params=0.0)  # the same checkpoint read without its ignore list
    assert weight_bytes(bare, "compressed-tensors") < weight_bytes(spec, "compressed-tensors") - 12 * GiB


def test_ignore_entries_by_name_and_hostile_patterns() -> None:
    """A module named per layer counts that layer; a pattern RE2 cannot compile is skipped, and one that would
    backtrack for ever in Python's re is matched in linear time."""
    entries = ["lm_head", *(f"model.layers.{i}.self_attn.o_proj" for i in range(10)), "re:(?<=x)a",
               "re:(" + "a*" * 30 + ")*$"]
    layers = {"attention": 40, "dense_mlp": 1, "shared_experts": 39, "experts": 39}
    assert ignored_kinds({"quant_method": "compressed-tensors", "ignore": entries}, layers) == {"attention": 0.25}
    dense = ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"]
    assert ignored_kinds({"quant_method": "compressed-tensors", "ignore": dense}, layers) == {"dense_mlp": 1.0}
    assert ignored_kinds({"quant_method": "gptq", "ignore": ["re:.*"]}, layers) == {}
    assert ignored_kinds({"quant_method": "compressed-tensors", "ignore": ["re:.*mlp\\.experts.*"]}, layers) == {
        "experts": 1.0}
