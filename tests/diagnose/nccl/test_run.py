"""Tests for agent.diagnose.nccl.run: command lines, the subprocess runner against a fake
all_reduce_perf (success, streaming, timeout, failure, wrong results), and the progress bar."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import NcclDiagnosisConfig
from agent.diagnose.nccl.judge import parse_nccl
from agent.diagnose.nccl.run import (
    TIMEOUT_EXIT,
    Progress,
    build_command,
    command_from_config,
    expected_sizes,
    parse_nccl_size,
    run_nccl,
    visible_gpus,
)
from agent.errors import DiagnosisError
from tests.conftest import REPO

FAKE = REPO / "tests" / "fake_all_reduce_perf.py"


def _fake(*args: str) -> list[str]:
    return [sys.executable, str(FAKE), *args]


# ---- command lines ----------------------------------------------------------------------------------------------


def test_build_command_puts_launcher_first_and_gpus_last() -> None:
    """launcher + binary + -b/-e/-f + extra args + -g N, as a list (no shell)."""
    cmd = build_command("all_reduce_perf", gpus=8, min_bytes=8, max_bytes="8G", step_factor=2,
                        launcher=["mpirun", "-np", "2", "-H", "a,b"], extra_args=["-d", "half"])
    assert cmd == ["mpirun", "-np", "2", "-H", "a,b", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2",
                   "-d", "half", "-g", "8"]


def test_build_command_without_gpus_leaves_g_out() -> None:
    """gpus=0 leaves -g to nccl-tests (one GPU per process under mpirun)."""
    assert build_command("x_perf", gpus=0) == ["x_perf", "-b", "8", "-e", "8G", "-f", "2"]


def test_command_from_config() -> None:
    """The config's launcher, binary, args and gpus make the daemon's command."""
    assert command_from_config(NcclDiagnosisConfig()) == ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2"]
    cfg = NcclDiagnosisConfig(binary="/opt/nccl-tests/build/all_reduce_perf", launcher=["mpirun", "-np", "16"],
                              gpus=1)
    assert command_from_config(cfg) == ["mpirun", "-np", "16", "/opt/nccl-tests/build/all_reduce_perf", "-b", "8",
                                        "-e", "8G", "-f", "2", "-g", "1"]


@pytest.mark.parametrize(("text", "value"), [("8", 8), ("64K", 65536), ("128M", 134217728), ("8G", 8589934592),
                                             (4096, 4096)])
def test_parse_nccl_size_uses_binary_units(text: str | int, value: int) -> None:
    """nccl-tests reads K/M/G as KiB/MiB/GiB."""
    assert parse_nccl_size(text) == value


def test_parse_nccl_size_rejects_garbage() -> None:
    """A size that is not a number is a DiagnosisError."""
    with pytest.raises(DiagnosisError):
        parse_nccl_size("lots")


@pytest.mark.parametrize(("args", "count"), [
    (["-b", "8", "-e", "8G", "-f", "2"], 31),  # 2^3 .. 2^33
    (["-b", "8", "-e", "128M", "-f", "2"], 25),  # 2^3 .. 2^27
    (["-b", "1M", "-e", "4M", "-i", "1M"], 4),  # 1, 2, 3, 4 MiB
    ([], 1),  # nccl-tests' default: 32 MiB only
])
def test_expected_sizes(args: list[str], count: int) -> None:
    """The number of rows a sweep prints, from -b/-e/-f/-i."""
    assert expected_sizes(["all_reduce_perf", *args]) == count


def test_visible_gpus_counts_nvidia_smi_lines() -> None:
    """'GPU n:' lines of nvidia-smi -L are counted; a missing nvidia-smi gives 0."""
    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert cmd == ["nvidia-smi", "-L"]
        out = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-2)\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    def missing(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(cmd[0])

    assert visible_gpus(fake_run) == 2
    assert visible_gpus(missing) == 0


# ---- the runner -------------------------------------------------------------------------------------------------


async def test_successful_run_returns_the_full_output() -> None:
    """Exit 0 and 31 rows; the 8 GiB row's busbw is the fake's 230 x 8192 / (8192 + 64) = 228.22 GB/s."""
    rc, text = await run_nccl(_fake("-b", "8", "-e", "8G", "-f", "2", "-g", "8"), timeout_s=60)
    assert rc == 0
    r = parse_nccl(text, exit_code=rc)
    assert (len(r.rows), r.ranks, r.failed, r.truncated) == (31, 8, False, False)
    assert r.peak_busbw_gbps == 228.22


async def test_lines_stream_through_on_line_one_by_one(tmp_path: Path) -> None:
    """The fake waits after each row until the test acknowledges it from on_line: only streaming gets past that."""
    rows: list[str] = []

    def on_line(line: str) -> None:
        if line.strip()[:1].isdigit():
            (tmp_path / f"ack-{len(rows)}").touch()
            rows.append(line)

    cmd = _fake("-b", "8", "-e", "64", "-f", "2", "-g", "2", "--fake-mode", "slow", "--fake-ack-dir", str(tmp_path))
    rc, text = await run_nccl(cmd, timeout_s=120, on_line=on_line)
    assert rc == 0  # the fake exits 5 if an acknowledgement never comes
    assert [int(r.split()[0]) for r in rows] == [8, 16, 32, 64]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ack-0", "ack-1", "ack-2", "ack-3"]
    assert text.count("\n") > len(rows)


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def test_timeout_kills_the_process_group_and_keeps_partial_output() -> None:
    """A hung run is killed with its children; rc is 124, the rows so far and a timeout line remain."""
    cmd = _fake("-b", "8", "-e", "8G", "-f", "2", "-g", "2", "--fake-mode", "hang")
    rc, text = await run_nccl(cmd, timeout_s=3, kill_grace_s=0.5)
    assert rc == TIMEOUT_EXIT
    assert "[sre-agent] timed out after 3 s" in text
    r = parse_nccl(text, exit_code=rc)
    assert len(r.rows) == 2 and r.failed
    child = next(int(line.split()[-1]) for line in text.splitlines() if line.startswith("# fake child pid"))
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the grandchild survived the process-group kill"


async def test_nccl_failure_exits_non_zero_with_the_warn_line() -> None:
    """The fake's NCCL WARN + Test NCCL failure run exits 3 (testNcclError) and parses as failed."""
    rc, text = await run_nccl(_fake("-b", "8", "-e", "8G", "-f", "2", "-g", "2", "--fake-mode", "fail"), timeout_s=60)
    assert rc == 3
    r = parse_nccl(text, exit_code=rc)
    assert r.failed and not r.rows
    assert any("NCCL WARN Cuda failure" in line for line in r.failure_lines)


async def test_wrong_results_run() -> None:
    """The fake's corrupted run exits 7 (testNumResults) with #wrong 96 + 96 at 1 MiB."""
    rc, text = await run_nccl(_fake("-b", "8", "-e", "4M", "-f", "2", "-g", "2", "--fake-mode", "wrong"),
                              timeout_s=60)
    assert rc == 7
    assert parse_nccl(text, exit_code=rc).wrong == 192


async def test_missing_binary_says_how_to_build_nccl_tests(tmp_path: Path) -> None:
    """A binary that does not exist raises DiagnosisError with the build recipe."""
    recipe = "git clone https://github.com/NVIDIA/nccl-tests && cd nccl-tests && make"
    with pytest.raises(DiagnosisError, match=re.escape(recipe)):
        await run_nccl([str(tmp_path / "all_reduce_perf"), "-g", "1"], timeout_s=5)


# ---- progress ---------------------------------------------------------------------------------------------------

_HEADER = [
    "#       size         count      type   redop    root"
    "     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
]
_ROWS = [
    "           8             2     float     sum      -1"
    "    40.12    0.00    0.00      0    38.85    0.00    0.00      0",
    "          16             4     float     sum      -1"
    "    39.64    0.00    0.00      0    39.19    0.00    0.50      0",
]


def test_progress_bar_on_a_tty_counts_sizes() -> None:
    """On a TTY the bar shows sizes done of those expected and the last busbw, on one line."""
    out = io.StringIO()
    bar = Progress(out, total=4, tty=True, width=8)
    for line in [*_HEADER, *_ROWS]:
        bar(line)
    bar.close()
    text = out.getvalue()
    assert "[####----] 2/4 sizes" in text
    assert "busbw     0.50 GB/s" in text
    assert text.endswith("\n") and text.count("\n") == 1


def test_progress_without_a_tty_prints_plain_lines() -> None:
    """Without a TTY every line is echoed as it is, nothing else."""
    out = io.StringIO()
    bar = Progress(out, total=4, tty=False)
    for line in [*_HEADER, *_ROWS]:
        bar(line)
    bar.close()
    assert out.getvalue() == "\n".join([*_HEADER, *_ROWS]) + "\n"
