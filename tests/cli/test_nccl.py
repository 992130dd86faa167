"""Tests for ``sre-agent nccl`` (agent.cli.nccl) through agent.cli.main, and once as a
real process running the fake all_reduce_perf."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.cli import nccl as nccl_cmd
from tests.conftest import FIXTURES, REPO

NCCL = FIXTURES / "nccl"
FAKE = REPO / "tests" / "fake_all_reduce_perf.py"
PY = shlex.quote(sys.executable)



def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_parse_json_has_the_agreed_keys_and_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    """--parse --json on the healthy A100 run: exit 0, the keys, verdict ok, peak 232.44."""
    assert main(["nccl", "--parse", str(NCCL / "a100x8_nvswitch_allreduce.txt"), "--json"]) == 0
    doc = _json(capsys)
    for key in ("collective", "ranks", "peak_busbw_gbps", "avg_busbw_gbps", "wrong", "failed", "expected_gbps",
                "verdict", "runbook_url", "findings", "rows"):
        assert key in doc
    assert (doc["verdict"], doc["peak_busbw_gbps"], doc["expected_gbps"], doc["ranks"]) == ("ok", 232.44, 230.0, 8)


@pytest.mark.parametrize(("name", "verdict"), [
    ("rtx2080ti_x2_pcie_allreduce.txt", "low"),
    ("gh200x2_2node_wrong_results.txt", "wrong-results"),
    ("gh200x8_2node_cuda_busy_failed.txt", "failed"),
    ("rtx5090x2_nccl_warn_failed.txt", "failed"),
    ("allgather_old_format_partial.txt", "wrong-results"),
])
def test_problems_exit_1(name: str, verdict: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Low bandwidth, wrong results and failed runs exit 1."""
    assert main(["nccl", "--parse", str(NCCL / name), "--json"]) == 1
    assert _json(capsys)["verdict"] == verdict


def test_table_shows_numbers_verdict_and_runbook(capsys: pytest.CaptureFixture[str]) -> None:
    """The table names the collective, ranks/nodes, the largest size, peak vs expected, wrong, verdict, runbook."""
    assert main(["nccl", "--parse", str(NCCL / "rtx2080ti_x2_pcie_allreduce.txt")]) == 1
    out = capsys.readouterr().out
    for needle in ("all_reduce", "2 / 1", "NVIDIA GeForce RTX 2080 Ti", "1 GiB (1,073,741,824 B)", "4.00 GB/s",
                   "40% of 10 GB/s expected, pcie-gen3", "2.06 GB/s", "verdict        low",
                   "runbooks/diagnosis-nccl-bandwidth-low.md"):
        assert needle in out, needle


def test_interconnect_flag_judges_a_multi_node_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The 2-node H100 run is unknown (exit 0) alone and ok against --interconnect ib-400gx8."""
    path = str(NCCL / "h100x16_2node_allreduce.txt")
    assert main(["nccl", "--parse", path, "--json"]) == 0
    assert _json(capsys)["verdict"] == "unknown"
    assert main(["nccl", "--parse", path, "--json", "--interconnect", "ib-400gx8"]) == 0
    assert _json(capsys)["expected_gbps"] == 384.0


def test_expected_gbps_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--expected-gbps 300 makes the A100 run low (232.44 < 240)."""
    assert main(["nccl", "--parse", str(NCCL / "a100x8_nvswitch_allreduce.txt"), "--expected-gbps", "300",
                 "--json"]) == 1
    assert _json(capsys)["verdict"] == "low"


def test_parse_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--parse - reads the output from standard input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO((NCCL / "a100x8_nvswitch_allreduce.txt").read_text()))
    assert main(["nccl", "--parse", "-", "--json"]) == 0
    assert _json(capsys)["avg_busbw_gbps"] == 66.2058


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable file, a file without result rows, or an unknown interconnect exit 2."""
    assert main(["nccl", "--parse", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing to see\n")
    assert main(["nccl", "--parse", str(empty)]) == 2
    assert "no nccl-tests result rows" in capsys.readouterr().err
    assert main(["nccl", "--parse", str(NCCL / "a100x8_nvswitch_allreduce.txt"), "--interconnect", "warp"]) == 2
    assert "unknown interconnect" in capsys.readouterr().err


def test_expected_and_interconnect_are_exclusive() -> None:
    """--expected-gbps with --interconnect is a usage error (argparse exits 2)."""
    with pytest.raises(SystemExit) as info:
        main(["nccl", "--parse", "x", "--expected-gbps", "1", "--interconnect", "pcie-gen4"])
    assert info.value.code == 2


def test_run_through_main_with_a_launcher(capsys: pytest.CaptureFixture[str]) -> None:
    """A run: the launcher (python) runs the fake binary with -b/-e/-f/-g; the A100 fake is ok."""
    code = main(["nccl", "--binary", str(FAKE), "--launcher", PY, "--gpus", "8", "--max-bytes", "8G", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert (doc["verdict"], doc["ranks"], len(doc["rows"])) == ("ok", 8, 31)
    assert f"running: {PY} {FAKE} -b 8 -e 8G -f 2 -g 8" in captured.err


def test_run_failure_and_extra_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """Arguments after -- reach the binary; the fake's NCCL failure exits 1 with the cause."""
    code = main(["nccl", "--binary", str(FAKE), "--launcher", PY, "--gpus", "2", "--", "--fake-mode", "fail"])
    out = capsys.readouterr().out
    assert code == 1
    assert "verdict        failed" in out and "NCCL WARN Cuda failure" in out


def test_missing_binary_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A binary that is not there exits 2 and says how to build nccl-tests."""
    assert main(["nccl", "--binary", str(tmp_path / "all_reduce_perf"), "--gpus", "2"]) == 2
    assert "git clone https://github.com/NVIDIA/nccl-tests" in capsys.readouterr().err


def test_config_supplies_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """diagnostics.nccl gives binary, launcher, args, gpus and expected_gbps (300: the fake is low)."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(json.dumps({"diagnostics": {"runbook_base_url": "https://runbooks.example/", "nccl": {
        "binary": str(FAKE), "launcher": [sys.executable], "args": ["-b", "1M", "-e", "8G", "-f", "2"], "gpus": 4,
        "expected_gbps": 300}}}))
    assert main(["nccl", "--config", str(cfg), "--json"]) == 1
    doc = _json(capsys)
    assert (doc["verdict"], doc["expected_gbps"], doc["ranks"], len(doc["rows"])) == ("low", 300, 4, 14)
    assert doc["runbook_url"] == "https://runbooks.example/diagnosis-nccl-bandwidth-low.md"


def test_real_process_runs_the_fake_binary() -> None:
    """`python -m agent nccl --binary <fake>` as a process: JSON on stdout, the run's lines on stderr, exit 0."""
    proc = subprocess.run([sys.executable, "-m", "agent", "nccl", "--binary", str(FAKE), "--launcher", PY,
                           "--gpus", "2", "--min-bytes", "1M", "--max-bytes", "1G", "--json"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "ok"  # the fake's 1 GiB busbw: 230 x 1024 / (1024 + 64) = 216.47 GB/s, 94 % of 230
    assert doc["ranks"] == 2 and len(doc["rows"]) == 11
    assert "# Collective test starting: all_reduce_perf" in proc.stderr  # not a TTY: plain lines


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "NaN", "1e999", "-12.5"])
@pytest.mark.parametrize("column", [0, 1, 5, 6, 7, 8, 11, "footer"])
def test_parse_refuses_values_that_are_no_measurement(column: int | str, value: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An inf/nan/1e999/negative size, count, time, bandwidth, #wrong or footer figure is exit 2 with the
    line and column on stderr, never a verdict (an infinite busbw used to be judged healthy, exit 0)."""
    lines = (NCCL / "a100x8_nvswitch_allreduce.txt").read_text(encoding="utf-8").splitlines()
    if column == "footer":
        lines[48], where = f"# Avg bus bandwidth    : {value}", "line 49: Avg bus bandwidth"
    else:
        assert isinstance(column, int)
        tokens = lines[46].split()  # the 4 GiB row, line 47
        tokens[column] = value
        lines[46] = "  ".join(tokens)
        name = {0: "size", 1: "count", 5: "time", 6: "algbw", 7: "busbw", 8: "#wrong", 11: "busbw"}[column]
        where = f"line 47: {name}"
    path = tmp_path / "out.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["nccl", "--parse", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"error: {path}: {where} is {value!r}, not a measurement (a finite number ≥ 0)"


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_parse_refuses_an_input_over_the_size_cap(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A file or stdin over the cap (a real output, then padding) is exit 2 naming the limit, not read whole."""
    monkeypatch.setattr(nccl_cmd, "MAX_PARSE_BYTES", 4096)
    text = (NCCL / "a100x8_nvswitch_allreduce.txt").read_text(encoding="utf-8") + "#" * 4096 + "\n"
    path = tmp_path / "big.txt"
    path.write_text(text, encoding="utf-8")
    if source == "stdin":
        monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["nccl", "--parse", str(path) if source == "file" else "-"]) == 2
    assert "over the 4,096-byte limit for an nccl-tests output" in capsys.readouterr().err
