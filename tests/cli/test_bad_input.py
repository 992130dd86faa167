"""Bad input to any command ends in exit 2 and a line that names the field or flag, never a traceback.

Each class of hostile input (a model config's numbers, the file itself, a pasted serving command,
numeric flags, durations, ports, ids) runs through the real entry point, ``agent.cli.main``;
a few run as a real process too, where a traceback would show on stderr as such.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import cli
from agent.cli import main
from agent.diagnose.plan.models import MAX_CONFIG_BYTES
from tests.conftest import FIXTURES

# A Llama-2-7B-shaped config.json: every case changes one thing in it.
BASE: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                        "intermediate_size": 11008, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """``main(argv)``'s exit status (argparse's own exit included) and its stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a flag value with exit 2
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def assert_bad_input(code: int, err: str, names: str) -> None:
    """Exit 2, no traceback, and the last stderr line (argparse prints its usage first) names the cause."""
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    assert names in err.strip().splitlines()[-1], err[-2000:]


def _config(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


MOE = {"num_local_experts": 8, "num_experts_per_tok": 2}
QWEN_MOE = {"num_experts": 8, "decoder_sparse_step": 1}


@pytest.mark.parametrize(("change", "names"), [
    ({"num_hidden_layers": -3}, "num_hidden_layers: must be a positive integer, got -3"),
    ({"num_hidden_layers": 0}, "num_hidden_layers: must be a positive integer, got 0"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: must be a positive integer, got '32'"),
    ({"num_hidden_layers": [32]}, "num_hidden_layers: must be a positive integer, got [32]"),
    ({"num_hidden_layers": 10**15}, "num_hidden_layers: must be at most 100,000"),
    ({"hidden_size": 0}, "hidden_size: must be a positive integer, got 0"),
    ({"hidden_size": 4096.5}, "hidden_size: must be a positive integer, got 4096.5"),
    ({"num_attention_heads": True}, "num_attention_heads: must be a positive integer, got true"),
    ({"num_attention_heads": 8192, "hidden_size": 64}, "num_attention_heads: 8192 heads do not fit"),
    ({"num_key_value_heads": -8}, "num_key_value_heads: must be a positive integer, got -8"),
    ({"num_key_value_heads": False}, "num_key_value_heads: must be a positive integer, got false"),
    ({"head_dim": math.nan}, "head_dim: must be a positive integer, got NaN"),
    ({"vocab_size": math.inf}, "vocab_size: must be a positive integer, got Infinity"),
    ({"intermediate_size": -math.inf}, "intermediate_size: must be a positive integer, got -Infinity"),
    ({"max_position_embeddings": -4096}, "max_position_embeddings: must be a positive integer, got -4096"),
    ({"max_position_embeddings": {"a": 1}}, "max_position_embeddings: must be a positive integer"),
    ({"num_local_experts": -8}, "num_local_experts: must be a positive integer, got -8"),
    ({**MOE, "num_experts_per_tok": "2"}, "num_experts_per_tok: must be a positive integer, got '2'"),
    ({**MOE, "moe_intermediate_size": -1}, "moe_intermediate_size: must be a positive integer, got -1"),
    ({**QWEN_MOE, "mlp_only_layers": 3}, "mlp_only_layers: must be a list of layer numbers, got int"),
    ({**QWEN_MOE, "decoder_sparse_step": "x"}, "decoder_sparse_step: must be a positive integer, got 'x'"),
    ({"kv_lora_rank": "512"}, "kv_lora_rank: must be a positive integer, got '512'"),
    ({"sliding_window": -1}, "sliding_window: must be a positive integer, got -1"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": -7}},
     "quantization_config.group_size: must be a positive integer, got -7"),
    ({"quantization_config": {"quant_method": "gptq", "bits": "4", "group_size": 128}},
     "quantization_config.bits: must be a positive integer, got '4'"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 64, "group_size": 128}},
     "quantization_config.bits: must be at most 32, got 64"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, -1]}},
     "quantization_config.weight_block_size[1]: must be a positive integer, got -1"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": "128x128"}},
     "quantization_config.weight_block_size: must be two positive integers"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "strategy": "block", "block_structure": ["a", 1]}}}}},
     "quantization_config.config_groups.weights.block_structure[0]: must be a positive integer, got 'a'"),
    ({"vision_config": {"depth": -2, "hidden_size": 1024}}, "vision_config.depth: must be a positive integer"),
], ids=lambda v: json.dumps(v, allow_nan=True)[:50] if isinstance(v, dict) else None)
def test_model_config_numbers_are_refused_naming_the_field(change: dict[str, Any], names: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A negative, zero, fractional, non-finite, boolean, string, list or absurd number in a shape or
    quantization field of config.json is exit 2 naming the field and the value."""
    path = _config(tmp_path, {**BASE, **change})
    assert_bad_input(*_run(capsys, ["plan", "--model-config", str(path), "--gpu", "H100"]), names)


def test_a_multimodal_wrappers_language_model_fields_are_named_with_their_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A field under text_config is named text_config.<field>, as the user finds it in the file."""
    path = _config(tmp_path, {"model_type": "gemma3", "text_config": {**BASE, "num_hidden_layers": -3}})
    assert_bad_input(*_run(capsys, ["plan", "--model-config", str(path), "--gpu", "H100"]),
                     "text_config.num_hidden_layers: must be a positive integer, got -3")


@pytest.mark.parametrize("legal", [
    {"head_dim": None, "sliding_window": None, "q_lora_rank": None, "num_key_value_heads": None},
    {"n_shared_experts": 0, "first_k_dense_replace": 0, "num_local_experts": 8, "num_experts_per_tok": 2},
    {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1}},
    {"max_position_embeddings": 4096.0},
], ids=["null", "zero", "gptq-per-channel", "integral-float"])
def test_values_published_configs_use_are_still_read(legal: dict[str, Any], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """null and 0 in optional fields mean unset, GPTQ's group_size -1 means per channel, 4096.0 is 4096:
    such configs plan (exit 0 or 1)."""
    code, err = _run(capsys, ["plan", "--model-config", str(_config(tmp_path, {**BASE, **legal})), "--gpu", "H100"])
    assert code in (0, 1), err[-2000:]


@pytest.mark.parametrize(("text", "names"), [
    ("[1, 2]", "is not a JSON object"),
    ('"a string"', "is not a JSON object"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "JSON nested too deeply"),
    ('{"num_hidden_layers": ', "cannot read model config"),
    (" " * (MAX_CONFIG_BYTES + 1) + "{}", f"over the {MAX_CONFIG_BYTES:,}-byte limit"),
], ids=["list", "string", "deep-list", "deep-object", "truncated", "huge"])
def test_model_config_files_that_are_no_config_are_refused(text: str, names: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A config.json that is a list, nested past the recursion limit, cut short or huge is exit 2."""
    assert_bad_input(*_run(capsys, ["plan", "--model-config", str(_config(tmp_path, text)), "--gpu", "H100"]),
                     names)


def test_a_config_that_is_not_utf8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that are not UTF-8 (a binary file given by mistake) are exit 2 naming the file."""
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00{")
    assert_bad_input(*_run(capsys, ["plan", "--model-config", str(path), "--gpu", "H100"]), "config.json")


@pytest.mark.parametrize(("command", "names"), [
    ("vllm serve m --max-model-len '8192", "cannot split the serving command as a shell would: No closing quotation"),
    ('vllm serve "m --tp 2', "No closing quotation"),
    ("vllm serve m \\", "No escaped character"),
    ("vllm serve m -tp 0", "--tensor-parallel-size: must be a positive integer, got '0'"),
    ("vllm serve m --pipeline-parallel-size -2", "--pipeline-parallel-size: must be a positive integer, got '-2'"),
    ("vllm serve m --max-num-seqs 2.5", "--max-num-seqs: must be a positive integer, got '2.5'"),
    ("vllm serve m --gpu-memory-utilization nan", "--gpu-memory-utilization: must be a number in (0, 1], got 'nan'"),
    ("vllm serve m --gpu-memory-utilization 1e999", "--gpu-memory-utilization: must be a number in (0, 1]"),
    ("vllm serve m --gpu-memory-utilization -0.5", "--gpu-memory-utilization: must be a number in (0, 1]"),
    ("vllm serve m --max-model-len inf", "--max-model-len: must be a positive whole number, got 'inf'"),
    ("vllm serve m --max-model-len 0", "--max-model-len: must be a positive integer, got '0'"),
    ("vllm serve m --block-size 0", "--block-size: must be a positive integer, got '0'"),
    ("lmdeploy serve api_server m --tp 0", "--tp: must be a positive integer, got '0'"),
    ("lmdeploy serve api_server m --cache-max-entry-count nan", "--cache-max-entry-count: must be a number in (0, 1]"),
    ("lmdeploy serve api_server m --session-len 99999999999999999", "--session-len: must be at most"),
], ids=lambda v: v[:40])
def test_pasted_serving_commands_with_bad_quoting_or_numbers(command: str, names: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An unbalanced quote or a zero, negative, fractional, NaN or infinite number in a pasted
    vLLM/LMDeploy command line is exit 2 naming the flag."""
    argv = ["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--", command]
    assert_bad_input(*_run(capsys, argv), names)


@pytest.mark.parametrize(("argv", "names"), [
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--gpu-memory-utilization", "nan"],
     "argument --gpu-memory-utilization: must be a number in (0, 1], got 'nan'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--gpu-memory-utilization", "inf"],
     "argument --gpu-memory-utilization: must be a number in (0, 1], got 'inf'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--gpu-memory-utilization", "0"],
     "argument --gpu-memory-utilization: must be a number in (0, 1], got '0'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--max-model-len", "inf"],
     "argument --max-model-len: must be a positive whole number, got 'inf'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--max-model-len", "-8192"],
     "argument --max-model-len: must be a positive whole number, got '-8192'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "-tp", "0"],
     "argument --tensor-parallel-size/-tp: must be a positive integer, got '0'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "-pp", "-1"],
     "argument --pipeline-parallel-size/-pp: must be a positive integer, got '-1'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--max-num-seqs", "1e999"],
     "argument --max-num-seqs: must be a positive integer, got '1e999'"),
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--max-num-batched-tokens", "nan"],
     "argument --max-num-batched-tokens: must be a positive whole number, got 'nan'"),
    (["plan", "--model", "Llama-3-8B", "--gpu-memory", "0"], "--gpu-memory: must be more than 0 bytes, got '0'"),
    (["plan", "--model", "Llama-3-8B", "--gpu-memory", "9" * 400 + "GiB"], "--gpu-memory: "),
    (["plan", "--from-target", "127.0.0.1:1", "--timeout", "0s"], "argument --timeout: must be a positive duration"),
    (["plan", "--from-target", "http://[::1", "--timeout", "2s"], "error: http://[::1: not a URL (Invalid IPv6 URL)"),
    (["plan", "--from-target", "ftp://h/metrics", "--timeout", "2s"], "no answer (not an http(s) URL: ftp://h/metrics)"),
    (["plan", "--from-target", "h:abc", "--timeout", "2s"], "error: http://h:abc/metrics: no answer"),
    (["plan", "--from-target", "127.0.0.1:1", "--timeout", "nan"], "argument --timeout: not a duration: 'nan'"),
    (["nccl", "--parse", "-", "--expected-gbps", "nan"], "argument --expected-gbps: must be a finite number > 0"),
    (["nccl", "--parse", "-", "--expected-gbps", "-5"], "argument --expected-gbps: must be a finite number > 0"),
    (["nccl", "--parse", "-", "--gpus", "-3"], "argument --gpus: must be an integer from 0 to"),
    (["nccl", "--parse", "-", "--step-factor", "0"], "argument --step-factor: must be an integer from 1 to"),
    (["nccl", "--parse", "-", "--timeout", "0s"], "argument --timeout: must be a positive duration"),
    (["nccl", "--binary", sys.executable, "--launcher", "mpirun -H 'a"],
     "--launcher: cannot split it as a shell would: No closing quotation"),
    (["nccl", "--binary", sys.executable, "--", "-f", "x"], "-f (step factor): not an integer: 'x'"),
    (["diagnose", "oom", "--gpu-memory-utilization", "nan"], "argument --gpu-memory-utilization"),
    (["diagnose", "oom", "--tensor-parallel-size", "0"], "argument --tensor-parallel-size"),
    (["simulate", "--speed", "nan"], "argument --speed: must be a finite number > 0"),
    (["simulate", "--speed", "1e300"], "argument --speed: must be a finite number > 0 and ≤ 1000"),
    (["simulate", "--port", "70000"], "argument --port: must be an integer from 0 to 65,535, got '70000'"),
    (["simulate", "--dcgm-port", "-2"], "argument --dcgm-port: must be an integer from -1 to 65,535, got '-2'"),
    (["demo", "--time-scale", "nan"], "argument --time-scale: must be a finite number > 0"),
    (["demo", "--time-scale", "1e999"], "argument --time-scale: must be a finite number > 0"),
    (["demo", "--duration", "-1"], "argument --duration: must be a finite number ≥ 0, got '-1'"),
    (["demo", "--interval", "0s"], "argument --interval: must be a positive duration such as 15s, got '0s'"),
    (["demo", "--listen", "nonsense"], "argument --listen: must be HOST:PORT with a port from 0 to 65535"),
    (["triage", "--db", "x.db", "9" * 30], "argument INCIDENT_ID: must be an integer from 1 to"),
    (["incidents", "--db", "x.db", "--limit", "9" * 30], "argument --limit/-n: must be an integer from 1 to"),
], ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_numeric_flags_of_every_command_refuse_unusable_values(argv: list[str], names: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """NaN, infinite, zero, negative, fractional and out-of-range values of numeric flags, durations,
    ports and ids are exit 2 naming the flag (argparse's line, after its usage)."""
    monkeypatch.chdir(tmp_path)  # a state database a command might create stays in the test's folder

    async def serve_nothing(*args: object, **kwargs: object) -> int:
        return 0

    # simulate and demo serve until stopped: a value that got through would hang the test, not fail it
    monkeypatch.setattr(cli, "_simulate", lambda args: 0)
    monkeypatch.setattr(cli, "run_demo", serve_nothing)
    assert_bad_input(*_run(capsys, argv), names)


def test_diagnose_oom_reads_deeply_nested_json_as_no_evidence(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A log line of JSON nested past the recursion limit is not a pod document: no evidence, exit 0."""
    log = tmp_path / "vllm.log"
    log.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n[" + "[" * 50_000 + "\n", encoding="utf-8")
    code, err = _run(capsys, ["diagnose", "oom", str(log)])
    assert code == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "names"), [
    (["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--", "vllm serve m --max-model-len '8192"],
     "No closing quotation"),
    (["plan", "--model-config", "{config}", "--gpu", "H100"], "num_hidden_layers: must be a positive integer, got -3"),
    (["nccl", "--parse", "{nccl}"], "busbw is 'inf', not a measurement"),
], ids=["serve-quote", "config-field", "nccl-inf"])
def test_a_real_process_exits_2_without_a_traceback(argv: list[str], names: str, tmp_path: Path) -> None:
    """As a process (python -m agent): exit 2, the cause on stderr's last line, no Traceback anywhere."""
    config = _config(tmp_path, {**BASE, "num_hidden_layers": -3})
    nccl = tmp_path / "nccl.txt"
    nccl.write_text("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
                    "algbw   busbw #wrong\n   8388608       2097152     float     sum      -1    162.6   51.58     inf"
                    "      0    161.5   51.93   90.88      0\n# Avg bus bandwidth    : 66.2\n", encoding="utf-8")
    args = [a.format(config=config, nccl=nccl) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=120,
                          check=False)
    assert_bad_input(proc.returncode, proc.stderr, names)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "-5", "0"])
def test_a_configured_expected_bandwidth_must_be_a_finite_positive_number(
        value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """diagnostics.nccl.expected_gbps of NaN (every ratio NaN: any run "low"), ±inf, 0 or negative is a
    config error naming the key, exit 2, before any output is judged."""
    config = tmp_path / "agent.yaml"
    config.write_text(f"diagnostics:\n  nccl:\n    expected_gbps: {value}\n", encoding="utf-8")
    output = FIXTURES / "nccl" / "a100x8_nvswitch_allreduce.txt"
    assert_bad_input(*_run(capsys, ["nccl", "--config", str(config), "--parse", str(output)]),
                     "config error: diagnostics.nccl.expected_gbps: Input should be")
