"""Tests for agent.diagnose.plan.shapes: today's config.json shapes (nested, MoE, MLA, sliding window).

Published parameter counts are the model cards'; the arithmetic behind each expected
number is written out in the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.diagnose.plan.models import ModelSpec, load_model_config
from tests.conftest import FIXTURES

PLANNER = FIXTURES / "planner"

# fixture -> published parameters (model cards; DeepSeek-V3's 671 B leave out the 14 B MTP module vLLM does not load)
PUBLISHED = {
    "deepseek-v3.config.json": 671e9,
    "mixtral-8x7b-instruct-v0.1.config.json": 46.7e9,
    "qwen3-30b-a3b.config.json": 30.5e9,
    "gpt-oss-20b.config.json": 20.91e9,
    "gpt-oss-120b.config.json": 116.83e9,
    "gemma-3-27b-it.config.json": 27.43e9,
    "qwen2.5-vl-7b-instruct.config.json": 8.29e9,
}


def _config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PLANNER / name).read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("filename", sorted(PUBLISHED))
def test_parameters_of_todays_models_match_published(filename: str) -> None:
    """Every expert, the MLA projections and the vision tower are counted: within 1 % of the model card."""
    spec = load_model_config(PLANNER / filename)
    assert abs(spec.num_params - PUBLISHED[filename]) / PUBLISHED[filename] < 0.01


def test_mixtral_counts_all_eight_experts() -> None:
    """Mixtral-8x7B: 32 layers × 8 experts × 3 × 4096 × 14336 expert weights and a 4096 × 8 router per layer."""
    spec = load_model_config(PLANNER / "mixtral-8x7b-instruct-v0.1.config.json")
    assert (spec.num_experts, spec.experts_per_token, spec.num_moe_layers) == (8, 2, 32)
    assert spec.expert_params == 32 * 8 * 3 * 4096 * 14336
    assert spec.router_params == 32 * 4096 * 8


def test_deepseek_v3_dense_layers_shared_expert_and_mla() -> None:
    """DeepSeek-V3: the first 3 layers dense, 58 MoE layers of 256 routed + 1 shared expert; MLA latent 512 + 64."""
    spec = load_model_config(PLANNER / "deepseek-v3.config.json")
    assert spec.num_moe_layers == 61 - 3
    assert spec.expert_params == 58 * (256 + 1) * 3 * 7168 * 2048
    assert spec.router_params == 58 * (7168 * 256 + 256)  # gate and e_score_correction_bias
    assert spec.is_mla and (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    assert spec.quant is not None and spec.quant.block == 128 * 128


def test_qwen2_moe_shared_expert_and_sparse_step() -> None:
    """Qwen2-MoE: one shared expert of shared_expert_intermediate_size with its gate; decoder_sparse_step 2 and
    mlp_only_layers make layers dense."""
    data = {"model_type": "qwen2_moe", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 128, "intermediate_size": 256, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
            "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    spec = ModelSpec.from_hf_config(data)
    assert spec.num_moe_layers == 3  # layers 1, 5, 7 ((i + 1) % 2 == 0, not 3)
    assert spec.expert_params == 3 * (4 * 3 * 64 * 32 + 3 * 64 * 128)
    assert spec.router_params == 3 * (64 * 4 + 64)


def test_llama4_interleaved_moe_layers() -> None:
    """Llama 4: every interleave_moe_layer_step-th layer is MoE (one shared expert); dense: intermediate_size_mlp."""
    data = {"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "intermediate_size": 32,
        "intermediate_size_mlp": 96, "num_local_experts": 8, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2}}
    spec = ModelSpec.from_hf_config(data)
    assert spec.num_moe_layers == 2
    assert spec.expert_params == 2 * (8 + 1) * 3 * 64 * 32
    attention = 2 * 64 * 64 + 2 * 64 * 32
    assert spec.num_params == 2 * 128 * 64 + 4 * (attention + 2 * 64) + 64 + 2 * 3 * 64 * 96 + spec.expert_params + \
        spec.router_params


def test_gpt_oss_alternating_sliding_window() -> None:
    """gpt-oss-20b: layer_types alternate a 128-token window and full attention; 32 experts, 4 per token."""
    spec = load_model_config(PLANNER / "gpt-oss-20b.config.json")
    assert (spec.sliding_window, spec.num_sliding_layers, spec.num_layers) == (128, 12, 24)
    assert (spec.num_experts, spec.experts_per_token, spec.head_dim) == (32, 4, 64)
    assert spec.quant is not None and spec.quant.experts_only


def test_gemma3_nested_text_config_with_defaults_and_vision() -> None:
    """Gemma 3: the language model sits in text_config (vocabulary and tying from Gemma3TextConfig's defaults),
    explicit head_dim 128 (not 5376 / 32 = 168), 5 sliding layers per full one, a SigLIP tower counted."""
    spec = load_model_config(PLANNER / "gemma-3-27b-it.config.json")
    assert (spec.num_layers, spec.head_dim, spec.vocab_size, spec.tie_word_embeddings) == (62, 128, 262208, True)
    assert (spec.sliding_window, spec.num_sliding_layers) == (1024, 62 - 10)
    siglip = 27 * (4 * 1152**2 + 4 * 1152 + 2 * 1152 * 4304 + 4 * 1152) + 3 * 14 * 14 * 1152 + 1152 * 5376
    assert spec.vision_params == siglip


def test_qwen25_vl_flat_config_still_counts_the_vision_tower() -> None:
    """Qwen2.5-VL keeps text fields at the top level; its gated ViT and 2×2 merger are still counted."""
    spec = load_model_config(PLANNER / "qwen2.5-vl-7b-instruct.config.json")
    merged = 1280 * 4
    vit = 32 * (4 * 1280**2 + 4 * 1280 + 3 * 1280 * 3420 + 4 * 1280) + 3 * 14 * 14 * 2 * 1280
    assert spec.vision_params == vit + merged * merged + merged * 3584
    assert spec.sliding_window == 0  # use_sliding_window: false


def test_sliding_window_on_every_layer_and_gemma2_alternation() -> None:
    """Mistral v0.1 style: sliding_window without a pattern applies to every layer; Gemma 2 alternates."""
    base = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    mistral = ModelSpec.from_hf_config({**base, "model_type": "mistral", "sliding_window": 4096})
    gemma2 = ModelSpec.from_hf_config({**base, "model_type": "gemma2", "sliding_window": 4096})
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 4)
    assert (gemma2.num_sliding_layers, gemma2.tie_word_embeddings) == (2, True)


def test_llama4_chunked_layers_follow_no_rope_layers() -> None:
    """Llama 4: the layers ``no_rope_layers`` marks 1 use RoPE and attend within attention_chunk_size; the
    rest are global. Without the list, every fourth layer is global (transformers' Llama4TextConfig)."""
    base = {"model_type": "llama4_text", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 32, "attention_chunk_size": 8192}
    assert ModelSpec.from_hf_config(base).num_chunked_layers == 6
    listed = ModelSpec.from_hf_config({**base, "no_rope_layers": [1, 0, 1, 0, 1, 0, 1, 1]})
    assert (listed.attention_chunk_size, listed.num_chunked_layers, listed.sliding_window) == (8192, 5, 0)


def test_rope_cache_is_counted_on_every_gpu() -> None:
    """vLLM keeps a 16-bit cos/sin cache of max_position_embeddings x rotary width on every GPU: 2.5 GiB for
    Llama 4 Scout's 10,485,760 positions x 128, the MLA rope width (64) for Kimi K2."""
    scout = load_model_config(PLANNER / "calibration" / "llama-4-scout-17b-16e-instruct.config.json")
    assert scout.rope_cache_bytes == 10485760 * 128 * 2
    kimi = load_model_config(PLANNER / "calibration" / "kimi-k2-thinking.config.json")
    assert kimi.rope_cache_bytes == 262144 * 64 * 2


def test_a_config_file_names_its_model(tmp_path: Path) -> None:
    """A snapshot's config.json is named after its folder; any other file after itself."""
    assert load_model_config(PLANNER / "gemma-3-27b-it.config.json").name == "gemma-3-27b-it"
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((PLANNER / "calibration" / "qwen3-8b.config.json").read_text())
    assert load_model_config(folder / "config.json").name == "Qwen3-8B"
    assert load_model_config(folder / "config.json", name="mine").name == "mine"
