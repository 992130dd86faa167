"""Tests for `sre-agent plan` (agent.cli.plan) through agent.cli.main: table, --json, pasted
serving commands and exit codes (0 fits, 1 does not fit, 2 bad input)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.diagnose.plan.planner import PlanInput, find_model, gpu_memory_bytes, plan
from agent.simulate.server import Fleet, FleetConfig
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


# ---- --from-target / --from-fleet: capacity from live replicas ------------------------------------------
AIBRIX = FIXTURES / "vllm" / "v0_0.7_aibrix_qwen15b_metrics.txt"


def _fake_fetch(bodies: dict[str, bytes]) -> Callable[[str], bytes]:
    def fetch(url: str) -> bytes:
        if url not in bodies:
            raise OSError(f"connection refused: {url}")
        return bodies[url]
    return fetch


def _live(argv: list[str], fetch: Callable[[str], bytes]) -> int:
    from agent.cli import _parser  # the real argument parser, with a fake network
    from agent.cli.plan_live import run_live

    return run_live(_parser().parse_args(["plan", *argv]), fetch=fetch, clock=lambda: 1_750_000_000.0)


def test_from_target_reads_a_real_vllm_capture(capsys: pytest.CaptureFixture[str]) -> None:
    """A real V0 /metrics capture: 81,767 blocks x 16 = 1,308,272 tokens; with --max-model-len 32768 that is
    81,767 // 2,048 = 39 full-length sequences; an idle replica needs nothing (exit 0)."""
    fetch = _fake_fetch({"http://10.0.0.7:8000/metrics": AIBRIX.read_bytes()})
    code = _live(["--from-target", "10.0.0.7:8000", "--max-model-len", "32768"], fetch)
    out = capsys.readouterr().out
    assert code == 0
    assert "10.0.0.7:8000: KV cache 81,767 blocks × 16 tokens = 1,308,272 tokens (vllm:cache_config_info, " \
           "cache_dtype auto, gpu_memory_utilization 0.9)" in out
    assert "= 39 full-length sequences of 32,768 tokens (max_model_len from --max-model-len)" in out
    assert "KV capacity: 10.0.0.7:8000 (Qwen/Qwen2.5-Coder-1.5B-Instruct)" in out
    assert "OK: " in out and "preemptions 0 since the server started" in out


def test_from_target_takes_max_model_len_from_v1_models(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --max-model-len the server's /v1/models answers it, and the output names that source."""
    models = b'{"object": "list", "data": [{"id": "q", "max_model_len": 4096}]}'
    fetch = _fake_fetch({"http://h:8000/metrics": AIBRIX.read_bytes(), "http://h:8000/v1/models": models})
    assert _live(["--from-target", "http://h:8000/metrics", "--json"], fetch) == 0
    (rep,) = json.loads(capsys.readouterr().out)["replicas"]
    # 4,096 tokens = 256 blocks each: 81,767 // 256 = 319
    assert (rep["max_model_len"], rep["max_model_len_source"], rep["full_length_seqs"]) == (
        4096, "http://h:8000/v1/models", 319)
    assert rep["kv_cache_tokens"] == 1_308_272 and rep["finding"]["ok"]


def test_from_target_that_does_not_answer_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """A target that refuses the connection, or serves no cache_config_info, is exit 2 with the reason."""
    fetch = _fake_fetch({"http://lm:23333/metrics": b"lmdeploy:num_requests_running 0\n"})
    assert _live(["--from-target", "h:1", "--from-target", "lm:23333"], fetch) == 2
    err = capsys.readouterr().err
    assert "error: http://h:1/metrics: no answer (connection refused: http://h:1/metrics)" in err
    assert "error: http://lm:23333/metrics: no vllm:cache_config_info" in err


async def test_from_fleet_scrapes_every_simulated_replica(tmp_path: Path) -> None:
    """Against the simulator over real HTTP: every target of the config is scraped once, its capacity printed
    with max_model_len from /v1/models, and a fleet line sums the replicas."""
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, speed=20.0, step_s=0.05, dcgm_port=None))
    await fleet.start()
    try:
        config = tmp_path / "agent.yaml"
        config.write_text("targets:\n" + "".join(f"  - url: {t}\n" for t in fleet.targets), encoding="utf-8")
        proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agent", "plan", "--from-fleet",
                                                        str(config)], capture_output=True, text=True, timeout=60)
    finally:
        await fleet.stop()
    assert proc.returncode in (0, 1), proc.stderr  # 1 when the simulated replicas already queue
    out = proc.stdout
    assert out.count("KV cache 8,192 blocks × 16 tokens = 131,072 tokens") == 2
    assert out.count("= 16 full-length sequences of 8,192 tokens (max_model_len from http://127.0.0.1:") == 2
    assert "Fleet: 2 replicas, 262,144 KV tokens" in out


def test_vllm_defaults_follow_the_gpu_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --max-num-seqs the plan uses vLLM V1's default for the GPU (1,024 on an H100, 256 on an
    A100), which sizes the sampler warm-up; --vllm-version 0.21 adds the CUDA-graph reserve and
    --sampler flashinfer the smaller sampler peak."""
    argv = ["--model", "Qwen2-7B", "--gpu", "H100", "--max-model-len", "16384"]
    _, h100 = _json(capsys, *argv)
    _, a100 = _json(capsys, "--model", "Qwen2-7B", "--gpu", "A100-80GB", "--max-model-len", "16384")
    _, v021 = _json(capsys, *argv, "--vllm-version", "0.21.0")
    _, fi = _json(capsys, *argv, "--sampler", "flashinfer")
    assert (h100["max_num_seqs"], a100["max_num_seqs"]) == (1024, 256)
    assert v021["overhead_gib"] == pytest.approx(h100["overhead_gib"] + 0.5, abs=0.002)
    assert fi["overhead_gib"] < h100["overhead_gib"] - 3


def test_mxfp4_backend_follows_the_gpu_or_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-120b: on an A100 the experts are padded as Marlin pads them, on an H100 as Triton does
    (64.50 GiB, what vLLM 0.11 logs as 64.38); --mxfp4-backend marlin on the H100 gives the A100's
    weights, the 65.97 GiB a Marlin build logs there (tests/fixtures/planner/calibration/)."""
    argv = ["--model-config", str(PLANNER / "gpt-oss-120b.config.json"), "--max-model-len", "8192"]
    _, a100 = _json(capsys, *argv, "--gpu", "A100-80GB")
    _, h100 = _json(capsys, *argv, "--gpu", "H100")
    _, marlin = _json(capsys, *argv, "--gpu", "H100", "--mxfp4-backend", "marlin")
    assert abs(h100["weights_gib_per_gpu"] - 64.38) < 0.2
    assert abs(marlin["weights_gib_per_gpu"] - 65.97) < 0.2
    assert marlin["weights_gib_per_gpu"] == pytest.approx(a100["weights_gib_per_gpu"], abs=0.01)
    with pytest.raises(SystemExit) as exc:  # argparse names the choices
        main(["plan", "--json", *argv, "--gpu", "H100", "--mxfp4-backend", "cutlass"])
    assert exc.value.code == 2 and "--mxfp4-backend" in capsys.readouterr().err
