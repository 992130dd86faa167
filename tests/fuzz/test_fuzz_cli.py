"""Fuzz the planner's inputs from the command line: a model's config.json and a pasted serving command.

Property: any config.json mapping (hostile values in the fields the reader looks at: negative,
zero, huge, NaN, infinite, booleans, strings, lists, nested mappings) gives a plan or a
:class:`~agent.errors.DiagnosisError` (the planner's one error for bad input), from the reader
and from ``sre-agent plan``'s entry point alike (exit 0, 1 or 2, an ``error:`` line for 2, never
a traceback); any pasted command line gives a :class:`~agent.diagnose.plan.servecmd.ServeCommand`
or a ``DiagnosisError``.
"""

from __future__ import annotations

import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout, suppress
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.cli import main
from agent.diagnose.plan.models import ModelSpec, gpu_memory_bytes
from agent.diagnose.plan.planner import PlanInput, plan
from agent.diagnose.plan.servecmd import parse_serve_command
from agent.errors import DiagnosisError
from tests.fuzz import budget

BASE: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                        "intermediate_size": 11008, "max_position_embeddings": 4096}
# The fields the reader looks at (shapes.py, quant.py): a hostile value there reaches the arithmetic.
SHAPE_KEYS = [
    "num_hidden_layers", "n_layer", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "kv_channels", "vocab_size", "intermediate_size", "max_position_embeddings", "seq_length", "model_max_length",
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "interleave_moe_layer_step", "decoder_sparse_step", "mlp_only_layers", "kv_lora_rank", "qk_rope_head_dim",
    "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "sliding_window", "sliding_window_pattern", "layer_types",
    "attention_chunk_size", "no_rope_layers", "use_sliding_window", "tie_word_embeddings", "model_type",
    "torch_dtype", "multi_query_attention", "multi_query_group_num", "intermediate_size_mlp",
]
QUANT_KEYS = ["quant_method", "bits", "w_bit", "group_size", "q_group_size", "zero_point", "weight_block_size",
              "config_groups", "ignore", "load_in_8bit", "bnb_4bit_use_double_quant"]
VISION_KEYS = ["depth", "hidden_size", "intermediate_size", "patch_size", "spatial_merge_size", "out_hidden_size"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e999, -1e999, 4096.0, 2.5]),
    st.text(max_size=8), st.sampled_from(["awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4",
                                          "qwen", "gpt_oss", "llama4", "gemma2", "deepseek_v3", "sliding"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=8)
hostile = st.dictionaries(st.sampled_from(SHAPE_KEYS), values, max_size=6)
# Each family of fields is reached only when the config takes its branch (experts > 1, a sliding window, a
# quantization method, an MLA rank): a valid trigger plus hostile values in the branch's own fields.
experts_on = st.fixed_dictionaries({"num_local_experts": st.integers(2, 16)})
moe = st.builds(lambda on, rest: {**on, **rest}, experts_on, st.dictionaries(st.sampled_from([
    "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size",
    "first_k_dense_replace", "moe_layer_freq", "interleave_moe_layer_step", "decoder_sparse_step",
    "mlp_only_layers", "model_type"]), values, min_size=1, max_size=4))
windows = st.builds(lambda w, rest: {"sliding_window": w, **rest}, st.integers(1, 8192), st.dictionaries(
    st.sampled_from(["sliding_window_pattern", "layer_types", "use_sliding_window", "attention_chunk_size",
                     "no_rope_layers", "model_type"]), values, min_size=1, max_size=3))
mla = st.builds(lambda r, rest: {"kv_lora_rank": r, **rest}, st.integers(1, 1024), st.dictionaries(
    st.sampled_from(["qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank"]), values, max_size=3))
weights = st.dictionaries(st.sampled_from(["num_bits", "strategy", "group_size", "block_structure", "symmetric"]),
                          st.one_of(values, st.sampled_from(["group", "block", "tensor", "channel"])), max_size=5)
quant = st.builds(
    lambda method, rest, groups: {"quant_method": method, **rest} | (
        {"config_groups": {"group_0": {"weights": groups}}} if method == "compressed-tensors" else {}),
    st.sampled_from(["awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4", "awq_marlin", "?"]),
    st.dictionaries(st.sampled_from(QUANT_KEYS[1:]), values, max_size=4), weights)
vision = st.dictionaries(st.sampled_from(VISION_KEYS), values, min_size=1, max_size=4)
branch = st.one_of(hostile, moe, windows, mla, st.builds(lambda q: {"quantization_config": q}, quant),
                   st.builds(lambda v: {"vision_config": v}, vision))


def _assemble(base: dict[str, Any], changes: dict[str, Any], more: dict[str, Any], wrap: bool) -> dict[str, Any]:
    """One config.json: flat, or a multimodal wrapper with the language model under text_config (the
    quantization and vision configs stay at the top, where such checkpoints keep them)."""
    data = {**base, **changes, **more}
    if not wrap:
        return data
    top: dict[str, Any] = {k: data.pop(k) for k in ("quantization_config", "vision_config") if k in data}
    return {"text_config": data, **top}


configs = st.builds(_assemble, st.sampled_from([BASE, BASE, {}]), branch, st.one_of(st.just({}), hostile),
                    st.booleans())

GPU = gpu_memory_bytes("H100")


@budget(100)
@given(configs)
def test_any_config_mapping_plans_or_is_a_diagnosis_error(data: dict[str, Any]) -> None:
    """The reader and the planner give a plan or a DiagnosisError for any config.json mapping."""
    with suppress(DiagnosisError):
        spec = ModelSpec.from_hf_config(data, name="fuzz")
        plan(PlanInput(model=spec, gpu_memory_bytes=GPU, gpu="H100"))


@budget(50)
@given(configs)
def test_plan_entry_point_exits_0_1_or_2_on_any_config_file(data: dict[str, Any]) -> None:
    """``sre-agent plan --model-config FILE``: exit 0 or 1 with a plan, or 2 with an ``error:`` line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(data), encoding="utf-8")  # NaN and Infinity as Python's json writes them
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["plan", "--model-config", str(path), "--gpu", "H100"])
    assert code in (0, 1, 2)
    if code == 2:
        assert err.getvalue().startswith("error: "), err.getvalue()
    else:
        assert out.getvalue().startswith("Memory plan: ")


serve_words = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["vllm", "serve", "lmdeploy", "api_server", "python", "-m", "vllm.entrypoints.openai.api_server",
                     "--model", "-tp", "--tp", "--max-model-len", "--gpu-memory-utilization", "--max-num-seqs",
                     "--quantization", "--kv-cache-dtype", "--block-size", "--cache-max-entry-count", "--quant-policy",
                     "--session-len", "--model-format", "'", '"', "\\", "=", "nan", "inf", "-1", "0", "1e999",
                     "32k", "32K", "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1"]),
)
command_lines = st.one_of(
    st.text(max_size=80),
    st.lists(serve_words, max_size=12).map(" ".join),
    st.lists(serve_words, max_size=10).map(lambda ws: "vllm serve m " + " ".join(ws)),
    st.lists(serve_words, max_size=10).map(lambda ws: "lmdeploy serve api_server m " + " ".join(ws)),
)


@budget(100)
@given(command_lines)
def test_any_pasted_command_line_parses_or_is_a_diagnosis_error(line: str) -> None:
    """A pasted serving command (one string, split as a shell would) parses or is a DiagnosisError."""
    with suppress(DiagnosisError):
        parse_serve_command([line])


@budget(50)
@given(command_lines)
def test_plan_entry_point_exits_0_1_or_2_on_any_pasted_command(line: str) -> None:
    """``sre-agent plan --model Llama-3-8B --gpu H100 -- LINE``: exit 0, 1 or 2, never an exception."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--", line])
        except SystemExit as exc:  # argparse: a word after -- that it still reads as its own (-h)
            code = int(exc.code or 0)
    assert code in (0, 1, 2), err.getvalue()
