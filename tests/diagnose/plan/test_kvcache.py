"""Tests for the KV-cache layout (agent.diagnose.plan.kvcache) as vLLM V1 allocates it: groups, pages, MLA."""

from __future__ import annotations

import math

from agent.diagnose.plan.kvcache import KVLayout, hybrid_groups
from agent.diagnose.plan.memory import PlanInput, kv_layout, memory_numbers
from agent.diagnose.plan.models import PRESETS, gpu_memory_bytes, load_model_config
from agent.diagnose.plan.planner import plan
from tests.conftest import FIXTURES

PLANNER = FIXTURES / "planner"
H100 = gpu_memory_bytes("H100")


def test_group_size_rule() -> None:
    """Smaller layer count is the group size (Gemma 3: 10 full, 52 sliding → 1 + 6 groups of 10), unless the
    larger is under 1.5× it (12 + 12 → 2 groups of 12; 12 + 13 → groups of 13)."""
    assert hybrid_groups(10, 52, 1024, 1) == (10, (0,) + (1024,) * 6)
    assert hybrid_groups(12, 12, 128, 1) == (12, (0, 128))
    assert hybrid_groups(13, 12, 128, 1) == (13, (0, 128))
    assert hybrid_groups(12, 12, 128, 2) == (6, (0, 128))


def test_dense_model_is_one_group() -> None:
    """Llama-3-8B: one group of 32 layers, 16-token pages of 2 × 8 × 128 × 2 B per layer."""
    layout = kv_layout(PlanInput(PRESETS["Llama-3-8B"], H100))
    assert layout == KVLayout(block_size=16, layer_token_bytes=4096, group_size=32, windows=(0,))
    assert layout.token_bytes == 131072


def test_gpt_oss_hybrid_capacity_is_vllms() -> None:
    """gpt-oss-20b: 2 groups of 12 layers; vLLM's token count is one group's blocks, and a 131,072-token
    sequence holds 8,192 full-attention blocks plus ceil((128 − 1 + 8,192) / 16) + 1 = 521 sliding ones."""
    spec = load_model_config(PLANNER / "gpt-oss-20b.config.json")
    inp = PlanInput(spec, H100, quantization="mxfp4", gpu="H100")
    layout = kv_layout(inp)
    assert (layout.group_size, layout.windows, layout.layer_token_bytes) == (12, (0, 128), 2 * 8 * 64 * 2)
    n = memory_numbers(inp)
    blocks = n.kv_avail // (16 * 2048 * 12)
    assert n.blocks == blocks
    assert n.tokens == blocks // 2 * 16
    assert layout.blocks_per_seq(131072, 8192) == 8192 + math.ceil((127 + 8192) / 16) + 1
    assert n.seqs == blocks // (8192 + 521)


def test_gemma3_seven_groups() -> None:
    """Gemma 3 27B: 7 groups of 10 layers (8 padding slots); tokens = blocks // 7 × 16."""
    spec = load_model_config(PLANNER / "gemma-3-27b-it.config.json")
    inp = PlanInput(spec, H100, max_model_len=32768, gpu="H100")
    n = memory_numbers(inp)
    assert n.blocks == n.kv_avail // (16 * 2 * 16 * 128 * 2 * 10)
    assert n.tokens == n.blocks // 7 * 16
    assert any("7 groups of 10 layers" in note for note in plan(inp).notes)


def test_disable_hybrid_kv_cache_manager_keeps_full_length() -> None:
    """--disable-hybrid-kv-cache-manager: every layer at full length, one group of all layers."""
    spec = load_model_config(PLANNER / "gpt-oss-20b.config.json")
    layout = kv_layout(PlanInput(spec, H100, disable_hybrid_kv_cache_manager=True))
    assert (layout.group_size, layout.windows) == (24, (0,))


def test_mla_latent_not_split_by_tp() -> None:
    """DeepSeek-V3 at TP=8 on H200: 61 layers × (512 + 64) × 2 B = 70,272 B per token on every GPU, blocks of 64."""
    spec = load_model_config(PLANNER / "deepseek-v3.config.json")
    inp = PlanInput(spec, gpu_memory_bytes("H200"), tensor_parallel_size=8, quantization="fp8", gpu="H200")
    layout = kv_layout(inp)
    assert (layout.block_size, layout.token_bytes) == (64, 61 * 576 * 2)
    p = plan(inp)
    assert p.kv_bytes_per_token == p.kv_bytes_per_token_per_gpu == 70272
    assert p.max_tokens_in_cache == p.kv_bytes_available // (64 * 70272) * 64
    # pipeline parallelism does split the layers
    assert kv_layout(PlanInput(spec, H100, pipeline_parallel_size=2, gpu="H100")).token_bytes == 31 * 576 * 2


def test_mla_keeps_block_16_before_hopper() -> None:
    """On an A100 vLLM's Triton MLA backend keeps 16-token blocks."""
    spec = load_model_config(PLANNER / "deepseek-v3.config.json")
    assert kv_layout(PlanInput(spec, gpu_memory_bytes("A100-80GB"), gpu="A100-80GB")).block_size == 16


def test_llama4_chunked_layers_stay_full_unless_the_hybrid_manager_is_allowed() -> None:
    """Llama 4 Scout: 36 of its 48 layers attend within 8,192-token chunks, but vLLM keeps every layer at full
    length unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1; then it makes 4 groups of 12 layers
    and an 8M-token request holds 524,288 global blocks plus 3 x ceil((8,191 + 8,192) / 16) + 3 chunked ones."""
    spec = load_model_config(PLANNER / "calibration" / "llama-4-scout-17b-16e-instruct.config.json")
    assert (spec.attention_chunk_size, spec.num_chunked_layers, spec.num_sliding_layers) == (8192, 36, 0)
    default = kv_layout(PlanInput(spec, H100, tensor_parallel_size=8))
    assert (default.group_size, default.windows) == (48, (0,))
    hybrid = kv_layout(PlanInput(spec, H100, tensor_parallel_size=8, hybrid_chunked_attention=True))
    assert (hybrid.group_size, hybrid.windows, hybrid.layer_token_bytes) == (12, (0, 8192, 8192, 8192), 2 * 1 * 128 * 2)
    assert hybrid.blocks_per_seq(8388608, 8192) == 524288 + 3 * (math.ceil((8191 + 8192) / 16) + 1)
    assert hybrid.token_bytes == default.token_bytes  # the same bytes per token: only the per-request blocks change
