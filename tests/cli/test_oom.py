"""``sre-agent diagnose oom``: files and stdin, the human report, --json, flags and exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.cli.oom import render
from agent.diagnose.oom.verdict import diagnose_oom
from tests.conftest import FIXTURES, REPO

LOGS = FIXTURES / "logs"



def _cli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", "diagnose", "oom", *argv], input=stdin, text=True,
                          capture_output=True, cwd=REPO, timeout=120, check=False)


def test_stdin_dash() -> None:
    """Lines piped to `sre-agent diagnose oom -` are diagnosed; findings exit 1."""
    result = _cli("-", stdin=(LOGS / "torch_cuda_oom_v1_worker.txt").read_text(encoding="utf-8"))
    assert result.returncode == EXIT_PROBLEM, result.stderr
    assert "[critical] gpu-oom-runtime:" in result.stdout
    assert "change: --gpu-memory-utilization \u2192 0.85" in result.stdout
    assert "runbook: https://github.com/sre-agent/sre-agent/blob/main/runbooks/diagnosis-gpu-oom-runtime.md" in (
        result.stdout)


def test_json_output_shape() -> None:
    """--json prints a list of Finding.to_json() objects (stdin when no FILE is given)."""
    result = _cli("--json", stdin=(LOGS / "k8s_pod_oomkilled.json").read_text(encoding="utf-8"))
    assert result.returncode == EXIT_PROBLEM, result.stderr
    (finding,) = json.loads(result.stdout)
    assert set(finding) == {"kind", "summary", "severity", "ok", "evidence", "setting", "suggested_value",
                            "details", "runbook_url", "labels"}
    assert (finding["kind"], finding["suggested_value"]) == ("container-oom", "30Gi")


def test_no_evidence_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """A log without OOM evidence: 'no OOM evidence found', exit 0."""
    assert main(["diagnose", "oom", str(LOGS / "vllm_v1_engine_start.txt")]) == EXIT_OK
    assert "no OOM evidence found" in capsys.readouterr().out


def test_several_files_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """Several files are read together; --gpu-memory-utilization fills what the logs do not say."""
    rc = main(["diagnose", "oom", str(LOGS / "nvidia_xid_79.txt"), str(LOGS / "torch_cuda_oom_v1_worker.txt"),
               "--gpu-memory-utilization", "0.8", "--runbook-base", "https://example.test/runbooks"])
    out = capsys.readouterr().out
    assert rc == EXIT_PROBLEM
    assert out.index("gpu-hardware") < out.index("gpu-oom-runtime")
    assert "change: --gpu-memory-utilization \u2192 0.75" in out
    assert "action: drain and reboot the node" in out
    assert "https://example.test/runbooks/diagnosis-gpu-hardware.md" in out


def test_stdin_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """'-' reads stdin; kubectl describe output is understood."""
    text = (LOGS / "kubectl_describe_oomkilled.txt").read_text(encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["diagnose", "oom", "-"]) == EXIT_PROBLEM
    out = capsys.readouterr().out
    assert "container-oom" in out and "resources.limits.memory \u2192 113Mi" in out


def test_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file is bad input: exit 2 with the file named."""
    missing = tmp_path / "nope.log"
    assert main(["diagnose", "oom", str(missing)]) == EXIT_BAD_INPUT
    assert "nope.log" in capsys.readouterr().err


def test_stdin_twice_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """'-' given twice is bad input."""
    assert main(["diagnose", "oom", "-", "-"]) == EXIT_BAD_INPUT
    assert "stdin" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--gpu-memory-utilization", "1.5"], ["--tensor-parallel-size", "0"],
                                   ["--max-model-len", "many"], ["--no-such-flag"]])
def test_bad_flags_exit_2(flags: list[str]) -> None:
    """Out-of-range or unknown flags are rejected by argparse with exit 2."""
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "oom", *flags])
    assert exc.value.code == EXIT_BAD_INPUT


def test_render_caps_evidence() -> None:
    """The report shows at most five evidence lines with repeat counts and says how many more there are."""
    lines = [f"NVRM: Xid (PCI:0000:0{i}:00): 79, GPU has fallen off the bus" for i in range(7)]
    text = render(diagnose_oom(lines + lines[:1]))
    assert text.count("  evidence") == 5
    assert "evidence (2x): NVRM: Xid (PCI:0000:00:00)" in text
    assert "2 more evidence lines" in text


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x1c", "\x1e", "\x0b", "\x0c"])
def test_lines_end_at_newlines_only(tmp_path: Path, capsys: pytest.CaptureFixture[str], separator: str) -> None:
    """A character Python's splitlines() breaks at (but a log file does not) inside a user's text does not
    start a line of its own: the OOM message quoted after it is not evidence."""
    oom = "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 15.78 GiB total capacity; ...)"
    log = tmp_path / "vllm.log"
    log.write_text(f"INFO 05-08 14:46:11 [serving_chat.py:200] user text: hello{separator}{oom}\n", encoding="utf-8")
    assert main(["diagnose", "oom", str(log)]) == EXIT_OK
    assert "no OOM evidence found" in capsys.readouterr().out


@pytest.mark.parametrize("hostile", [
    "Killed process 1 (" * 60_000,  # backtracking bait for the kernel pattern, 1 MB without a newline
    "INFO 05-08 14:46:11 [logger.py:39] Received request x: prompt: '" + "CUDA out of memory. " * 50_000 + "'",
    " " * (1 << 20),
])
def test_a_megabyte_line_is_cut_not_matched_in_full(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    hostile: str) -> None:
    """A 1 MB line before a real OOM: the CLI reads it to the line bound, finds only the real OOM, and
    finishes well within a second's order (not the minutes a backtracking scan of it takes)."""
    log = tmp_path / "vllm.log"
    real = (LOGS / "torch_cuda_oom_v1_worker.txt").read_text(encoding="utf-8").splitlines()[1]
    log.write_text(hostile + "\n" + real + "\n", encoding="utf-8")
    t0 = time.perf_counter()
    assert main(["diagnose", "oom", "--json", str(log)]) == EXIT_PROBLEM
    assert time.perf_counter() - t0 < 10
    (finding,) = json.loads(capsys.readouterr().out)
    assert finding["kind"] == "gpu-oom-runtime" and finding["evidence"] == [real]
