"""Tests for `sre-agent plan` (agent.cli.plan) through agent.cli.main: table, --json, pasted
serving commands and exit codes (0 fits, 1 does not fit, 2 bad input)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.diagnose.plan.planner import PlanInput, find_model, gpu_memory_bytes, plan
from tests.conftest import FIXTURES

PLANNER = FIXTURES / "planner"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_table_shows_both_kv_formulas_and_recommendations(capsys: pytest.CaptureFixture[str]) -> None:
    """The table shows the GQA-correct and the guide's KV figures, capacity, verdict and setting → value lines."""
    code = main(["plan", "--model", "meta-llama/Meta-Llama-3-70B-Instruct", "--gpu", "A100-80GB", "-tp", "4",
                 "--max-model-len", "8192"])
    out = capsys.readouterr().out
    expected = plan(PlanInput(find_model("Llama-3-70B"), gpu_memory_bytes("A100-80GB"), tensor_parallel_size=4,
                              max_model_len=8192, gpu="A100-80GB"))
    assert code == 1
    assert "327,680 B = 2 × 80 layers × 8 KV heads × 128 head_dim × 2 B; 81,920 B per GPU" in out
    assert "2,621,440 B = 2 × 80 layers × 8192 hidden × 2 B: 8.0× ours" in out
    assert f"{expected.max_concurrent_seqs} concurrent sequences of 8,192 tokens" in out
    assert "fits           no: 256 requested" in out
    for f in expected.recommendations:
        assert f"  {f.setting} {f.suggested_value}: " in out
    assert "runbooks/diagnosis-kv-cache-capacity.md" in out


def test_json_output_and_exit_zero_when_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the documented keys; a plan that fits exits 0."""
    code, data = _json(capsys, "--model", "qwen2-7b-instruct", "--gpu", "H100", "--max-model-len", "8192",
                       "--max-num-seqs", "64")
    assert code == 0
    assert data["fits"] is True and data["model"] == "Qwen2-7B"
    assert data["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2
    assert data["kv_bytes_per_token_guide_formula"] == 2 * 28 * 3584 * 2
    for key in ("weights_gib_per_gpu", "kv_gib_available", "max_concurrent_seqs", "recommendations",
                "tensor_parallel_size", "max_num_seqs", "gpu_memory_utilization"):
        assert key in data
    assert data["recommendations"][0]["ok"] is True


def test_json_recommendations_when_weights_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """Weights that do not fit exit 1 with weights-do-not-fit findings carrying setting and value."""
    code, data = _json(capsys, "--model", "Llama-3-70B", "--gpu", "A100-80GB")
    assert code == 1 and data["weights_fit"] is False
    assert {(r["setting"], r["suggested_value"]) for r in data["recommendations"]} == {
        ("--quantization", "awq"), ("--tensor-parallel-size", "8")}
    assert all(r["runbook_url"].endswith("diagnosis-weights-do-not-fit.md") for r in data["recommendations"])


def test_pasted_vllm_serve_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --gpu H100 -- vllm serve MODEL ...` plans that command's flags; ignored flags become notes."""
    code, data = _json(capsys, "--gpu", "H100", "--", "vllm", "serve", "meta-llama/Meta-Llama-3-8B-Instruct",
                       "--tensor-parallel-size", "2", "--max-model-len=4096", "--port", "8000")
    assert code in (0, 1)
    assert (data["engine"], data["model"], data["tensor_parallel_size"], data["max_model_len"]) == (
        "vllm", "Llama-3-8B", 2, 4096)
    assert "ignored --port 8000 (does not change the memory plan)" in data["notes"]


def test_pasted_python_module_form(capsys: pytest.CaptureFixture[str]) -> None:
    """The `python -m vllm.entrypoints.openai.api_server --model M` form works after --."""
    _, data = _json(capsys, "--gpu", "L40S", "--", "python", "-m", "vllm.entrypoints.openai.api_server",
                    "--model", "Qwen/Qwen-7B-Chat", "--max-num-seqs", "32")
    assert (data["model"], data["max_num_seqs"], data["max_model_len"]) == ("Qwen-7B", 32, 8192)


def test_pasted_lmdeploy_command_as_one_string(capsys: pytest.CaptureFixture[str]) -> None:
    """One quoted LMDeploy command line is split; its flags map to LMDeploy's model of memory."""
    _, data = _json(capsys, "--gpu", "A100-80GB", "--", "lmdeploy serve api_server internlm/internlm2-chat-20b "
                    "--tp 2 --cache-max-entry-count 0.6 --quant-policy 8 --session-len 8192 --model-format awq")
    assert (data["engine"], data["tensor_parallel_size"], data["cache_max_entry_count"]) == ("lmdeploy", 2, 0.6)
    assert (data["kv_cache_dtype"], data["quantization"], data["block_size"]) == ("int8", "awq", 64)
    assert data["kv_bytes_per_token"] == 2 * 48 * 8 * (128 + 4)


def test_plan_flags_override_the_pasted_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Flags given to plan (before --) win over the same setting in the pasted command."""
    _, data = _json(capsys, "--gpu", "H100", "--max-model-len", "2048", "--", "vllm", "serve", "llama-3-8b",
                    "--max-model-len", "8192")
    assert data["max_model_len"] == 2048


def test_model_config_file_and_gpu_memory_size(capsys: pytest.CaptureFixture[str]) -> None:
    """--model-config reads a config.json; --gpu-memory takes a size such as 48GiB."""
    _, data = _json(capsys, "--model-config", str(PLANNER / "qwen-72b-chat.config.json"), "--gpu-memory", "48GiB",
                    "-tp", "4", "--max-model-len", "4096")
    assert data["gpu_memory_bytes"] == 48 * 2**30
    assert data["kv_bytes_per_token"] == 2 * 80 * 64 * 128 * 2  # Qwen1 72B: multi-head attention


def test_served_local_checkpoint_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A pasted command serving a local directory reads that directory's config.json."""
    ckpt = tmp_path / "my-finetune"
    ckpt.mkdir()
    shutil.copy(PLANNER / "meta-llama-3-8b-instruct.config.json", ckpt / "config.json")
    _, data = _json(capsys, "--gpu", "H100", "--", "vllm", "serve", str(ckpt))
    assert data["model_spec"]["num_key_value_heads"] == 8 and data["model"] == str(ckpt)


def test_quantization_taken_from_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    """An -AWQ checkpoint name implies AWQ weights unless --quantization says otherwise."""
    _, data = _json(capsys, "--gpu", "RTX-4090", "--model", "TheBloke/Llama-2-7B-AWQ", "--max-num-seqs", "8")
    assert data["quantization"] == "awq"
    assert "quantization awq taken from the checkpoint's name" in data["notes"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "mistral-7b", "--gpu", "H100"], "presets: Llama-2-7B"),
    (["--model", "llama-3-8b", "--gpu", "V100"], "unknown GPU"),
    (["--model", "llama-3-8b", "--gpu-memory", "lots"], "--gpu-memory"),
    (["--model", "llama-3-8b"], "--gpu"),
    (["--gpu", "H100", "--", "docker", "run", "vllm/vllm-openai"], "not a vLLM or LMDeploy"),
    (["--model", "qwen2-7b", "--gpu", "H100", "-tp", "8"], "not divisible"),
    (["--gpu", "H100"], "--model"),
    (["--model-config", "no/such/config.json", "--gpu", "H100"], "cannot read model config"),
])
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """Unknown model or GPU, bad sizes, a foreign command line or impossible TP exit 2 with a message."""
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


def test_non_numeric_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse rejects a non-numeric --max-num-seqs with exit status 2."""
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--model", "llama-3-8b", "--gpu", "H100", "--max-num-seqs", "many"])
    assert exc.value.code == 2
    capsys.readouterr()


def test_moe_hybrid_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b's config: mxfp4 taken from quantization_config, the hybrid groups and MoE explained in notes."""
    code, data = _json(capsys, "--model-config", str(PLANNER / "gpt-oss-20b.config.json"), "--gpu", "H100",
                       "--max-model-len", "32768", "--max-num-seqs", "16")
    assert code == 0
    assert data["quantization"] == "mxfp4"
    assert 13.3 < data["weights_gib_per_gpu"] < 13.6  # vLLM 0.11 logs 13.47 GiB on an H100 (calibration/)
    notes = " ".join(data["notes"])
    assert "2 groups of 12 layers" in notes and "all 32 experts" in notes


def test_mla_table_shows_the_latent(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3 at TP=8: the KV line shows kv_lora_rank + qk_rope_head_dim, the same bytes on every GPU."""
    main(["plan", "--model-config", str(PLANNER / "deepseek-v3.config.json"), "--gpu", "H200", "-tp", "8",
          "--max-model-len", "32768"])
    out = capsys.readouterr().out
    assert "70,272 B = 61 layers × (512 kv_lora_rank + 64 qk_rope_head_dim) × 2 B (MLA latent, not split by TP); " \
           "70,272 B per GPU" in out
