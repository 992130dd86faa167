"""Tests for agent.diagnose.plan.servecmd: pasted vLLM / LMDeploy command lines → planner options."""

from __future__ import annotations

import pytest

from agent.diagnose.plan.servecmd import parse_human_int, parse_serve_command
from agent.errors import DiagnosisError


def test_vllm_serve_with_positional_model_and_both_flag_forms() -> None:
    """`vllm serve MODEL` reads --flag value and --flag=value, and vLLM's short -tp."""
    cmd = parse_serve_command(["vllm", "serve", "meta-llama/Meta-Llama-3-70B-Instruct", "--tensor-parallel-size", "4",
                               "--max-model-len=16384", "-pp", "2", "--gpu-memory-utilization", "0.92",
                               "--max-num-seqs", "128", "--kv-cache-dtype", "fp8", "--block-size", "32"])
    assert cmd.engine == "vllm"
    assert cmd.model == "meta-llama/Meta-Llama-3-70B-Instruct"
    assert cmd.options == {"tensor_parallel_size": 4, "max_model_len": 16384, "pipeline_parallel_size": 2,
                           "gpu_memory_utilization": 0.92, "max_num_seqs": 128, "kv_cache_dtype": "fp8",
                           "block_size": 32}
    assert cmd.notes == []


def test_python_module_form_with_model_flag_and_underscores() -> None:
    """`python -m vllm.entrypoints.openai.api_server --model M` with --max_model_len spelling."""
    cmd = parse_serve_command(["python3", "-m", "vllm.entrypoints.openai.api_server",
                               "--model", "Qwen/Qwen2-7B-Instruct", "--max_model_len", "8192",
                               "--quantization", "awq_marlin", "--dtype", "half"])
    assert (cmd.engine, cmd.model) == ("vllm", "Qwen/Qwen2-7B-Instruct")
    assert cmd.options == {"max_model_len": 8192, "quantization": "awq", "dtype": "float16"}


def test_one_quoted_string_with_environment_and_unknown_flags() -> None:
    """A single pasted string is split with shlex; VAR=value prefixes are skipped; unknown flags are noted."""
    cmd = parse_serve_command(["CUDA_VISIBLE_DEVICES=0,1 vllm serve 'Qwen/Qwen-7B-Chat' --trust-remote-code "
                               "--port 8000 --served-model-name qwen -tp 2 --enable-prefix-caching"])
    assert (cmd.model, cmd.options) == ("Qwen/Qwen-7B-Chat", {"tensor_parallel_size": 2})
    assert cmd.notes == [
        "ignored --trust-remote-code (does not change the memory plan)",
        "ignored --port 8000 (does not change the memory plan)",
        "ignored --served-model-name qwen (does not change the memory plan)",
        "ignored --enable-prefix-caching (does not change the memory plan)",
    ]


def test_lmdeploy_api_server_flags() -> None:
    """LMDeploy's --tp, --cache-max-entry-count, --quant-policy, --session-len, --model-format, --max-batch-size."""
    cmd = parse_serve_command(["lmdeploy", "serve", "api_server", "internlm/internlm2-chat-20b", "--tp", "2",
                               "--cache-max-entry-count", "0.6", "--quant-policy", "8", "--session-len", "8192",
                               "--model-format", "awq", "--max-batch-size", "64", "--server-port", "23333"])
    assert (cmd.engine, cmd.model) == ("lmdeploy", "internlm/internlm2-chat-20b")
    assert cmd.options == {"tensor_parallel_size": 2, "cache_max_entry_count": 0.6, "kv_cache_dtype": "int8",
                           "max_model_len": 8192, "quantization": "awq", "max_num_seqs": 64}
    assert cmd.notes == ["ignored --server-port 23333 (does not change the memory plan)"]


def test_lmdeploy_quant_policy_values() -> None:
    """--quant-policy 0 is a 16-bit cache, 4 is int4; other values are rejected."""
    assert parse_serve_command(["lmdeploy", "serve", "api_server", "m", "--quant-policy", "0"]).options == {
        "kv_cache_dtype": "auto"}
    assert parse_serve_command(["lmdeploy", "serve", "api_server", "m", "--quant-policy=4"]).options == {
        "kv_cache_dtype": "int4"}
    with pytest.raises(DiagnosisError, match="quant-policy"):
        parse_serve_command(["lmdeploy", "serve", "api_server", "m", "--quant-policy", "2"])


@pytest.mark.parametrize(("text", "value"), [("8192", 8192), ("32k", 32000), ("32K", 32768), ("1.5k", 1500),
                                             ("1M", 1_048_576)])
def test_human_readable_lengths(text: str, value: int) -> None:
    """Lengths read the way vLLM reads them: k = 1000, K = 1024."""
    assert parse_human_int(text) == value


@pytest.mark.parametrize("argv", [
    ["docker", "run", "vllm/vllm-openai"],
    ["vllm", "bench"],
    [],
    ["vllm", "serve", "--tensor-parallel-size", "4"],
])
def test_unrecognised_or_modelless_commands_are_errors(argv: list[str]) -> None:
    """Other programs, empty input and a command without a model raise DiagnosisError."""
    with pytest.raises(DiagnosisError):
        parse_serve_command(argv)


def test_bad_number_names_the_flag() -> None:
    """A flag value that is not a number is an error naming the flag."""
    with pytest.raises(DiagnosisError, match="--max-model-len"):
        parse_serve_command(["vllm", "serve", "m", "--max-model-len", "long"])
    with pytest.raises(DiagnosisError, match="--quantization"):
        parse_serve_command(["vllm", "serve", "m", "--quantization", "gguf"])


@pytest.mark.parametrize(("value", "method"), [("bitsandbytes", "bitsandbytes"), ("mxfp4", "mxfp4"),
                                               ("compressed-tensors", "compressed-tensors"), ("fbgemm_fp8", "fp8")])
def test_quantization_methods_of_todays_checkpoints(value: str, method: str) -> None:
    """bitsandbytes, mxfp4, compressed-tensors and fp8 variants are modelled."""
    assert parse_serve_command(["vllm", "serve", "m", "-q", value]).options == {"quantization": method}


def test_disable_hybrid_kv_cache_manager_switch() -> None:
    """--disable-hybrid-kv-cache-manager takes no value and reaches the plan."""
    cmd = parse_serve_command(["vllm", "serve", "m", "--disable-hybrid-kv-cache-manager", "--max-num-seqs", "8"])
    assert cmd.options == {"disable_hybrid_kv_cache_manager": True, "max_num_seqs": 8}


def test_environment_switch_for_llama4_chunked_attention() -> None:
    """VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 before the command reaches the plan; other values
    and other variables do not."""
    on = parse_serve_command(["VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 CUDA_VISIBLE_DEVICES=0,1 "
                              "vllm serve meta-llama/Llama-4-Scout-17B-16E-Instruct -tp 8"])
    assert on.options == {"hybrid_chunked_attention": True, "tensor_parallel_size": 8}
    off = parse_serve_command(["VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0", "vllm", "serve", "m"])
    assert off.options == {}
