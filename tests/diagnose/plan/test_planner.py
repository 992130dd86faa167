"""Tests for agent.diagnose.plan.planner and agent.diagnose.plan.models: the GPU memory arithmetic.

Expected numbers are worked out by hand in each test (the arithmetic is written out),
from the models' published shapes, NVML's memory totals and vLLM's own logs.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from agent.diagnose.plan.models import GPU_MEMORY_MIB, PRESETS, ModelSpec, load_model_config, normalize_model_name
from agent.diagnose.plan.planner import (
    PlanInput,
    activation_bytes,
    find_model,
    gpu_memory_bytes,
    max_model_len_for,
    plan,
    utilization_for,
    weight_bytes,
)
from agent.errors import DiagnosisError
from tests.conftest import FIXTURES
from tests.diagnose.plan.calibration import load_cases

GiB = 2**30
PLANNER = FIXTURES / "planner"
A100_80 = 81920 * 2**20  # NVML's total for an A100-SXM4-80GB
A100_40 = 40960 * 2**20

# fixture file -> preset, published parameter count (model cards / Hugging Face)
CONFIGS = {
    "llama-2-7b-hf.config.json": ("Llama-2-7B", 6.74e9),
    "meta-llama-3-8b-instruct.config.json": ("Llama-3-8B", 8.03e9),
    "meta-llama-3-70b-instruct.config.json": ("Llama-3-70B", 70.6e9),
    "qwen-7b-chat.config.json": ("Qwen-7B", 7.72e9),
    "qwen-72b-chat.config.json": ("Qwen-72B", 72.3e9),
    "qwen2-7b-instruct.config.json": ("Qwen2-7B", 7.62e9),
    "qwen2-72b-instruct.config.json": ("Qwen2-72B", 72.7e9),
    "internlm2-chat-20b.config.json": ("InternLM2-20B", 19.86e9),
}


@pytest.mark.parametrize("filename", sorted(CONFIGS))
def test_preset_matches_published_config(filename: str) -> None:
    """Each preset has the shape read from the model's published config.json."""
    preset_name, _ = CONFIGS[filename]
    spec = load_model_config(PLANNER / filename)
    assert replace(spec, name=preset_name, quant_method="") == PRESETS[preset_name]


@pytest.mark.parametrize("filename", sorted(CONFIGS))
def test_parameter_count_matches_published(filename: str) -> None:
    """Parameters computed from the shape are within 0.5 % of the published count."""
    preset_name, published = CONFIGS[filename]
    assert abs(PRESETS[preset_name].num_params - published) / published < 0.005


def test_llama_2_7b_parameter_count_exact() -> None:
    """Llama-2-7B: 2 × 32000 × 4096 + 32 × (4 × 4096² + 3 × 4096 × 11008 + 2 × 4096) + 4096 = 6,738,415,616."""
    assert PRESETS["Llama-2-7B"].num_params == 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 8192) + 4096
    assert PRESETS["Llama-2-7B"].num_params == 6_738_415_616


def test_qwen1_config_quirks() -> None:
    """Qwen1: MHA without num_key_value_heads, kv_channels head size, half-width MLP, min length, bf16."""
    spec = load_model_config(PLANNER / "qwen-7b-chat.config.json")
    assert (spec.num_key_value_heads, spec.head_dim, spec.intermediate_size) == (32, 128, 11008)
    assert spec.max_position_embeddings == 8192  # min(max_position_embeddings 32768, seq_length 8192)
    assert spec.dtype == "bfloat16"


def test_chatglm_style_config() -> None:
    """ChatGLM names: num_layers, multi_query_group_num KV heads, kv_channels, padded_vocab_size, seq_length."""
    spec = ModelSpec.from_hf_config({
        "model_type": "chatglm", "num_layers": 40, "hidden_size": 4096, "num_attention_heads": 32,
        "multi_query_attention": True, "multi_query_group_num": 2, "kv_channels": 128, "padded_vocab_size": 151552,
        "ffn_hidden_size": 13696, "seq_length": 131072, "torch_dtype": "bfloat16",
    }, name="glm")
    assert (spec.num_layers, spec.num_key_value_heads, spec.head_dim) == (40, 2, 128)
    assert (spec.vocab_size, spec.intermediate_size, spec.max_position_embeddings) == (151552, 13696, 131072)


def test_config_quantization_method_is_read() -> None:
    """A checkpoint's quantization_config.quant_method is recorded."""
    data = json.loads((PLANNER / "meta-llama-3-8b-instruct.config.json").read_text())
    data["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    assert ModelSpec.from_hf_config(data).quant_method == "awq"


def test_config_missing_shape_is_an_error() -> None:
    """A config without a layer count names the missing field."""
    with pytest.raises(DiagnosisError, match="num_hidden_layers"):
        ModelSpec.from_hf_config({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000})


@pytest.mark.parametrize(("name", "preset"), [
    ("meta-llama/Meta-Llama-3-70B-Instruct", "Llama-3-70B"),
    ("LLAMA-3-8B", "Llama-3-8B"),
    ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"),
    ("Qwen/Qwen-7B-Chat", "Qwen-7B"),
    ("qwen2-7b-instruct", "Qwen2-7B"),
    ("Qwen/Qwen2-72B-Instruct-AWQ", "Qwen2-72B"),
    ("/models/internlm2-chat-20b/", "InternLM2-20B"),
])
def test_find_model_by_hugging_face_id(name: str, preset: str) -> None:
    """Hugging Face ids, paths and case variants resolve to the preset."""
    assert find_model(name).name == preset


def test_unknown_model_lists_presets() -> None:
    """An unknown model is an error that lists the presets and suggests --model-config."""
    with pytest.raises(DiagnosisError, match=r"Llama-2-7B.*--model-config"):
        find_model("mistralai/Mistral-7B-v0.1")
    assert normalize_model_name("Qwen-7B") != normalize_model_name("Qwen2-7B")


def test_gpu_presets_are_cuda_totals() -> None:
    """GPU sizes are CUDA's totals, what vLLM reads: the figure a calibration excerpt logs for the card where
    one does (H100 79.18 GiB, A100-40GB 39.38), and 0.3-0.85 GiB under nvidia-smi's MiB for every preset.
    Names are matched loosely; unknown ones list the presets."""
    logged = {c.gpu.split("x ")[-1]: c.gpu_memory_gib for c in load_cases() if c.gpu_memory_gib}
    assert gpu_memory_bytes("NVIDIA H100") / GiB == pytest.approx(logged["H100"], abs=0.005)
    assert gpu_memory_bytes("A100 40GB") / GiB == pytest.approx(logged["A100 40GB"], abs=0.005)
    nvidia_smi = {"A100-40GB": 40960, "A100-80GB": 81920, "H100": 81559, "H200": 143771, "L40S": 46068,
                  "RTX-4090": 24564}
    assert set(GPU_MEMORY_MIB) == set(nvidia_smi)
    assert all(0.3 <= (nvidia_smi[g] * 2**20 - gpu_memory_bytes(g)) / GiB <= 0.85 for g in nvidia_smi)
    assert gpu_memory_bytes("h200") == gpu_memory_bytes("H200") and gpu_memory_bytes("rtx 4090") > 23 * GiB
    with pytest.raises(DiagnosisError, match="A100-40GB"):
        gpu_memory_bytes("V100")


def test_guide_worked_example_llama3_70b_4bit_a100() -> None:
    """The guide: Llama-3-70B 4-bit on an A100-80GB, weights ≈ 70e9 × 0.5 B = 35 GB, KV by its formula
    2 × 80 layers × 8192 hidden × 2 B = 2,621,440 B/token, "batch ≈ 8". That 8 comes out only if all of the
    remaining 80 − 35 = 45 GB holds KV (no 10 % reserve, no CUDA/framework memory, though the same guide
    recommends both) at 2,048-token sequences: 45e9 / (2,621,440 × 2048) = 8.38. With its own 10 % reserve it
    is (72e9 − 35e9) / 5.37e9 = 6.9, and at the model's 8,192 tokens 2.1: the guide's arithmetic is not
    consistent with its advice. The GQA-correct 2 × 80 × 8 KV heads × 128 × 2 B = 327,680 B/token is 8× less,
    so the same 45 GB holds 45e9 / (327,680 × 2048) = 67 sequences."""
    guide_per_token = 2 * 80 * 8192 * 2
    gqa_per_token = 2 * 80 * 8 * 128 * 2
    assert (guide_per_token, gqa_per_token) == (2_621_440, 327_680)
    assert int((80e9 - 35e9) / (guide_per_token * 2048)) == 8
    assert int((0.9 * 80e9 - 35e9) / (guide_per_token * 2048)) == 6
    assert int((80e9 - 35e9) / (gqa_per_token * 2048)) == 67

    p = plan(PlanInput(find_model("Llama-3-70B"), A100_80, quantization="awq", max_model_len=2048,
                       gpu="A100-80GB"))
    assert (p.kv_bytes_per_token, p.kv_bytes_per_token_guide) == (327_680, 2_621_440)
    # Our weights: embeddings + lm_head stay 16-bit (2 × 128256 × 8192 params × 2 B); the other
    # 70,553,706,496 − 2,101,346,304 = 68,452,360,192 params at 0.5 + 2.5/128 = 133/256 B each.
    embed = 2 * 128256 * 8192
    rope = 8192 * 128 * 2  # vLLM's rotary cache: 8,192 positions x head_dim, 16-bit, on every GPU
    assert p.weights_bytes_per_gpu == embed * 2 + (70_553_706_496 - embed) * 133 // 256 + rope  # ≈ 37.0 GiB
    # Memory for KV (vLLM V1): 81920 MiB × 0.9 − weights − (140 MiB non-torch + the larger of the forward
    # pass, 2048 tokens × 8192 × 2 B × 12, and the sampler warm-up, 256 rows × 128256 vocab × 38.8 B).
    overhead = 140 * 2**20 + max(2048 * 8192 * 2 * 12, 1_273_941_196)
    kv = int(A100_80 * 0.9) - p.weights_bytes_per_gpu - overhead
    assert p.kv_bytes_available == kv
    blocks = kv // (16 * 327_680)
    assert p.max_concurrent_seqs == blocks // (2048 // 16)  # 53 on a real A100-80GB
    # The guide's formula on the same memory gives an eighth (up to block rounding).
    assert 8 * p.max_concurrent_seqs_guide <= p.max_concurrent_seqs < 8 * (p.max_concurrent_seqs_guide + 1)


def test_kv_int8_halves_kv_and_doubles_sequences() -> None:
    """The second guide: an int8/fp8 KV cache halves KV bytes per token (327,680 → 163,840 for Llama-3-70B)
    and, with the same memory, doubles the sequences that fit (up to one block's rounding)."""
    base = PlanInput(find_model("Llama-3-70B"), A100_80, quantization="awq", max_model_len=2048)
    p16, p8 = plan(base), plan(replace(base, kv_cache_dtype="fp8"))
    assert p8.kv_bytes_per_token == 163_840 == p16.kv_bytes_per_token // 2
    assert p8.kv_bytes_available == p16.kv_bytes_available
    assert 2 * p16.max_concurrent_seqs <= p8.max_concurrent_seqs <= 2 * p16.max_concurrent_seqs + 1


def test_lmdeploy_int8_kv_stores_scales() -> None:
    """LMDeploy --quant-policy 8: 1 B per element plus a 4 B fp16 scale and zero point per token and head:
    2 × 80 × 8 × (128 + 4) = 168,960 B/token, a little over half of 327,680."""
    p = plan(PlanInput(find_model("Llama-3-70B"), A100_80, quantization="awq", engine="lmdeploy", block_size=64,
                       kv_cache_dtype="int8", max_model_len=2048))
    assert p.kv_bytes_per_token == 2 * 80 * 8 * (128 + 4) == 168_960


def test_llama_2_7b_on_a100_40gb_by_hand() -> None:
    """Llama-2-7B (MHA) on an A100-40GB at vLLM defaults: KV 2 × 32 × 32 × 128 × 2 = 524,288 B/token (the
    guide's formula agrees: no GQA); weights 6,738,415,616 × 2 B + vLLM's rotary cache (4,096 positions ×
    128 × 2 B = 1 MiB); KV memory 40960 MiB × 0.9 − weights − (140 MiB non-torch + the sampler warm-up's
    256 × 32000 × 38.8 B, larger than the forward's 2048 × 4096 × 2 × 12) = 24,712,175,616 B = 2,945 blocks
    of 16 tokens = 47,120 tokens = 11 sequences of 4,096."""
    p = plan(PlanInput(find_model("Llama-2-7B"), A100_40, gpu="A100-40GB"))
    assert p.kv_bytes_per_token == p.kv_bytes_per_token_guide == 524_288
    assert p.weights_bytes_per_gpu == 13_476_831_232 + 1_048_576
    assert p.overhead_bytes == 146_800_640 + 317_849_600
    assert p.kv_bytes_available == 38_654_705_664 - 13_477_879_808 - 464_650_240 == 24_712_175_616
    assert (p.max_tokens_in_cache, p.max_concurrent_seqs) == (2945 * 16, 11)
    assert not p.fits and p.weights_fit


def _log_value(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m is not None, pattern
    return float(m.group(1))


def test_against_vllm_profile_llama3_8b_80gb() -> None:
    """vLLM's own profile of Llama-3-8B on an 80 GB GPU (fixture): 53.29 GiB for KV at utilization 0.90 of
    79.22 GiB. vLLM *measures* the activation peak (1.26 GiB), which the planner's estimate must match, and
    non-torch memory: 1.79 GiB here, from the pull request's unfinished code, which did not yet subtract its
    baseline (released V0 logs 0.01-0.35 GiB on one GPU, and the planner takes 0.3). So the KV figure is held
    to the issue's target, max(10 %, 1.5 GiB), and the tokens to 3 %. Profiled with max_num_batched_tokens =
    max_model_len = 8192 (V0)."""
    text = (PLANNER / "vllm_v0_llama3_8b_80gb_profile.txt").read_text()
    total = _log_value(text, r"total_gpu_memory\s+([\d.]+)GiB")
    util = _log_value(text, r"gpu_memory_utilization\s+([\d.]+)")
    vllm_kv = _log_value(text, r"available_kv_cache_memory\s+([\d.]+)GiB") * GiB
    p = plan(PlanInput(find_model("Llama-3-8B"), int(total * GiB), gpu_memory_utilization=util,
                       max_num_batched_tokens=8192, vllm_accounting="v0"))
    assert round(p.weights_bytes_per_gpu / GiB, 2) == _log_value(text, r"model weights take\s+([\d.]+)GiB")
    peak = _log_value(text, r"PyTorch activation peak memory\s+([\d.]+)GiB") * GiB
    assert abs(activation_bytes(p.input) - peak) <= 0.05 * GiB
    assert abs(p.kv_bytes_available - vllm_kv) <= max(0.1 * vllm_kv, 1.5 * GiB)
    vllm_tokens = vllm_kv / (2 * 32 * 8 * 128 * 2)  # 53.29 GiB / 131,072 B = 436,551 tokens
    assert abs(p.max_tokens_in_cache - vllm_tokens) / vllm_tokens < 0.03


def test_against_vllm_log_llama31_8b_rtx3090() -> None:
    """vLLM on an RTX 3090 (fixture, Llama-3.1-8B: Llama-3-8B's shape) at --max-model-len 20000: 1952 blocks
    = 31,232 tokens, "1.56x" concurrency. V0 profiles max_num_batched_tokens = max_model_len = 20,000 tokens.
    The planner must land within 1.5 GiB of KV memory and 10 % of the tokens (the issue's targets): the KV
    cache is only 18 % of the budget here, so each 0.1 GiB of overhead is 2.6 % of the tokens."""
    text = (PLANNER / "vllm_v0_llama31_8b_rtx3090_20k.txt").read_text()
    total = _log_value(text, r"total_gpu_memory=([\d.]+)GiB")
    vllm_kv = _log_value(text, r"kv_cache_size=([\d.]+)GiB") * GiB
    vllm_tokens = int(_log_value(text, r"GPU blocks: (\d+)")) * 16
    p = plan(PlanInput(find_model("Llama-3-8B"), int(total * GiB), max_model_len=20000,
                       max_num_batched_tokens=20000, vllm_accounting="v0"))
    assert abs(p.kv_bytes_available - vllm_kv) <= 1.5 * GiB
    assert abs(p.max_tokens_in_cache - vllm_tokens) <= 0.1 * vllm_tokens
    assert p.max_concurrent_seqs == int(_log_value(text, r"concurrency for 20000 tokens per request: ([\d.]+)x"))


def test_tensor_parallel_replicates_kv_heads() -> None:
    """InternLM2-20B has 8 KV heads: at TP=16 each GPU keeps one (2 × 48 × 1 × 128 × 2 = 24,576 B/token),
    not half of one; at TP=2 four (98,304 B/token)."""
    spec = find_model("InternLM2-20B")
    assert plan(PlanInput(spec, A100_80, tensor_parallel_size=16)).kv_bytes_per_token_per_gpu == 24_576
    assert plan(PlanInput(spec, A100_80, tensor_parallel_size=2)).kv_bytes_per_token_per_gpu == 98_304


def test_pipeline_parallel_splits_layers() -> None:
    """PP=3 over Llama-3-70B's 80 layers: the largest stage has 27 (2 × 27 × 8 × 128 × 2 = 110,592 B/token);
    weights are split six ways at TP=2 × PP=3 (and vLLM's rotary cache, 8,192 × 128 × 2 B, is on every GPU)."""
    spec = find_model("Llama-3-70B")
    p = plan(PlanInput(spec, A100_80, tensor_parallel_size=2, pipeline_parallel_size=3))
    assert p.kv_bytes_per_token_per_gpu == 2 * 27 * 4 * 128 * 2
    assert p.weights_bytes_per_gpu == -(-weight_bytes(spec) // 6) + 8192 * 128 * 2


def test_weights_do_not_fit_recommends_quantization_and_tp() -> None:
    """Llama-3-70B in bf16 (141 GB) on one A100-80GB: weights do not fit; suggest AWQ and TP=8 (the most
    sequences within a node: at TP=8 weights are 17.6 GB/GPU and 172 sequences of 8,192 tokens fit, fewer
    than 256, so no smaller TP satisfies max_num_seqs)."""
    p = plan(PlanInput(find_model("Llama-3-70B"), A100_80, gpu="A100-80GB"))
    assert not p.weights_fit and not p.fits and not p.engine_starts
    settings = {f.setting: f.suggested_value for f in p.recommendations}
    assert settings == {"--quantization": "awq", "--tensor-parallel-size": "8"}
    assert all(f.kind == "weights-do-not-fit" and f.runbook_url.endswith("/diagnosis-weights-do-not-fit.md")
               for f in p.recommendations)
    # TP=8 by hand: KV = 81920 MiB × 0.9 − 141,107,412,992 / 8 − (140 + 420 MiB non-torch at TP > 1 + the
    # sampler warm-up's 256 × 128256 × 38.8 B, larger than the forward's 2048 × 8192 × 24)
    kv = int(A100_80 * 0.9) - 141_107_412_992 // 8 - (560 * 2**20 + 1_273_941_196)
    assert kv // (16 * 2 * 80 * 1 * 128 * 2) // 512 == 172
    assert "172 full-length sequences" in next(f.summary for f in p.recommendations if f.setting.startswith("--t"))


def test_kv_shortfall_recommendations_are_consistent() -> None:
    """When max_num_seqs do not fit: lower --max-model-len to max_model_len_for, lower --max-num-seqs to what
    fits, raise --gpu-memory-utilization (≤ 0.95) or use an fp8 KV cache; each suggestion really fits."""
    inp = PlanInput(find_model("Llama-3-8B"), gpu_memory_bytes("L40S"), max_num_seqs=64, gpu="L40S")
    p = plan(inp)
    assert not p.fits and p.engine_starts
    s = {f.setting: f.suggested_value for f in p.recommendations}
    assert set(s) == {"--max-model-len", "--max-num-seqs", "--kv-cache-dtype"}  # 0.95 is not enough here
    assert int(s["--max-model-len"]) == max_model_len_for(inp, 64) and int(s["--max-model-len"]) % 16 == 0
    assert plan(replace(inp, max_model_len=int(s["--max-model-len"]))).fits
    assert not plan(replace(inp, max_model_len=int(s["--max-model-len"]) + 16)).fits
    assert plan(replace(inp, max_num_seqs=int(s["--max-num-seqs"]))).fits
    assert utilization_for(inp, 64) is None
    assert all(f.kind == "kv-cache-capacity" and f.severity == "warning" for f in p.recommendations)


def test_utilization_for_is_the_smallest_that_fits() -> None:
    """utilization_for returns the lowest 0.01 step at which the sequences fit, and None above 0.95."""
    inp = PlanInput(find_model("Llama-3-8B"), gpu_memory_bytes("H100"), max_num_seqs=57, gpu="H100")
    util = utilization_for(inp, 57)
    assert util is not None and util > 0.9
    assert plan(replace(inp, gpu_memory_utilization=util)).fits
    assert not plan(replace(inp, gpu_memory_utilization=round(util - 0.01, 2))).fits
    assert utilization_for(inp, 10_000) is None


def test_fitting_plan_returns_ok_finding() -> None:
    """A plan that fits carries one ok finding without a setting to change."""
    p = plan(PlanInput(find_model("Qwen2-7B"), gpu_memory_bytes("H100"), max_model_len=8192, max_num_seqs=64))
    assert p.fits
    assert [(f.ok, f.setting, f.kind) for f in p.recommendations] == [(True, "", "kv-cache-capacity")]


def test_lmdeploy_cache_max_entry_count_is_fraction_of_free_memory() -> None:
    """LMDeploy: KV = (total − weights − framework) × cache_max_entry_count, independent of
    gpu_memory_utilization. InternLM2-20B, TP=2, A100-80GB, 0.6: (85,899,345,920 − 19,861,149,696 × 2 / 2 −
    (1 GiB + 1.5 GiB)) × 0.6."""
    spec = find_model("InternLM2-20B")
    p = plan(PlanInput(spec, A100_80, engine="lmdeploy", block_size=64, tensor_parallel_size=2,
                       cache_max_entry_count=0.6, gpu_memory_utilization=0.5, max_model_len=8192))
    assert p.kv_bytes_available == int((A100_80 - 19_861_149_696 - 5 * GiB // 2) * 0.6)
    assert p.max_tokens_in_cache % 64 == 0


def test_lmdeploy_recommends_its_own_flags() -> None:
    """LMDeploy findings name --session-len, --max-batch-size, --cache-max-entry-count and --quant-policy."""
    p = plan(PlanInput(find_model("Qwen-7B"), gpu_memory_bytes("RTX-4090"), engine="lmdeploy", block_size=64,
                       quantization="awq", max_num_seqs=128))
    settings = {f.setting for f in p.recommendations}
    assert {"--session-len", "--max-batch-size", "--quant-policy"} <= settings
    assert not settings & {"--max-model-len", "--max-num-seqs", "--kv-cache-dtype"}


@pytest.mark.parametrize(("change", "message"), [
    ({"tensor_parallel_size": 3}, "not divisible"),
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
    ({"quantization": "bnb"}, "quantization"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"pipeline_parallel_size": 100}, "layers"),
])
def test_invalid_inputs_are_rejected(change: dict[str, object], message: str) -> None:
    """Inputs vLLM itself would reject raise DiagnosisError naming the problem."""
    with pytest.raises(DiagnosisError, match=message):
        plan(replace(PlanInput(find_model("Llama-3-8B"), A100_80), **change))  # type: ignore[arg-type]


def test_to_json_has_the_documented_keys() -> None:
    """to_json carries the inputs and the numbers the CLI's --json promises."""
    data = plan(PlanInput(find_model("Llama-3-8B"), A100_80)).to_json()
    assert {"weights_gib_per_gpu", "kv_bytes_per_token", "kv_bytes_per_token_guide_formula", "kv_gib_available",
            "max_concurrent_seqs", "fits", "recommendations", "model", "tensor_parallel_size",
            "max_model_len"} <= set(data)
    assert all({"setting", "suggested_value", "runbook_url"} <= set(r) for r in data["recommendations"])
    json.dumps(data)


@pytest.mark.parametrize("kind", ["kv-cache-capacity", "weights-do-not-fit"])
def test_finding_kinds_have_runbooks(kind: str) -> None:
    """Each finding kind the planner emits has runbooks/diagnosis-<kind>.md with the four sections."""
    path = FIXTURES.parents[1] / "runbooks" / f"diagnosis-{kind}.md"
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# diagnosis-{kind}"
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Meaning", "## Impact", "## Diagnosis", "## Mitigation"]
    assert "```" in text.split("## Diagnosis", 1)[1]
    assert "sre-agent plan" in text and not re.search(r"\b(TODO|TBD|FIXME)\b", text)


def test_lmdeploy_kv8_gives_under_twice_the_tokens_not_the_guides_2_3x() -> None:
    """The second guide claims KV8 (--quant-policy 8) gives 2.3x the concurrency. TurboMind stores, per token,
    head and K/V, head_dim x 8 bits plus a 16-bit scale and zero point (src/turbomind/kernels/attention/block.h:
    token_data_size + token_param_size): 128 + 4 = 132 B against 256 B in fp16, so the same
    --cache-max-entry-count holds 256 / 132 = 1.94x the tokens, not 2.3x (int4: 256 / 68 = 3.76x)."""
    spec = find_model("InternLM2-20B")
    base = PlanInput(spec, A100_80, engine="lmdeploy", block_size=64, tensor_parallel_size=2, max_model_len=4096)
    fp16, kv8, kv4 = (plan(replace(base, kv_cache_dtype=d)) for d in ("auto", "int8", "int4"))
    assert (fp16.kv_bytes_per_token, kv8.kv_bytes_per_token) == (2 * 48 * 8 * 256, 2 * 48 * 8 * 132)
    assert kv8.max_tokens_in_cache / fp16.max_tokens_in_cache == pytest.approx(256 / 132, rel=0.01)
    assert kv8.max_tokens_in_cache / fp16.max_tokens_in_cache < 2.0  # below 2x, so below the guide's 2.3x
    assert kv4.max_tokens_in_cache / fp16.max_tokens_in_cache == pytest.approx(256 / 68, rel=0.01)


def test_llama4_plan_says_what_the_hybrid_switch_would_give() -> None:
    """Llama 4 Scout at 1M tokens on 8 H200s: with the chunked layers at full length the cache holds fewer
    requests than with VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, and the plan's note names the
    switch and the count the switched plan gives."""
    spec = load_model_config(FIXTURES / "planner" / "calibration" / "llama-4-scout-17b-16e-instruct.config.json")
    inp = PlanInput(spec, gpu_memory_bytes("H200"), tensor_parallel_size=8, max_model_len=1_048_576, gpu="H200")
    default, switched = plan(inp), plan(replace(inp, hybrid_chunked_attention=True))
    assert switched.max_concurrent_seqs > default.max_concurrent_seqs
    note = next(n for n in default.notes if n.startswith("chunked attention"))
    assert "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1" in note
    assert f"holds {switched.max_concurrent_seqs} sequences of 1,048,576 tokens" in note
    assert not any(n.startswith("chunked attention") for n in switched.notes)
