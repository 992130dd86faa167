"""Running nccl-tests: the command line, the subprocess, and a live progress bar.

The binary runs as an argument list (never through a shell) in its own process group,
so a timeout can kill it together with what it started (``mpirun`` and its ranks).
Output (stdout and stderr, merged in order) is streamed line by line to ``on_line``:
a full 8 B – 8 GiB sweep takes minutes, and an operator wants to see it move.

A timed-out run is a failed run with the output it had produced, plus a last line
``[sre-agent] timed out ...`` that :func:`agent.diagnose.nccl.judge.parse_nccl` reports as
the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import TextIO

import structlog

from agent.config import NcclDiagnosisConfig
from agent.diagnose.nccl.judge import NcclStreamParser
from agent.errors import DiagnosisError

__all__ = [
    "BUILD_HINT",
    "TIMEOUT_EXIT",
    "Progress",
    "build_command",
    "command_from_config",
    "expected_sizes",
    "parse_nccl_size",
    "run_nccl",
    "visible_gpus",
]

log = structlog.get_logger(__name__)

#: The exit status reported for a run killed at its timeout (the convention of timeout(1)).
TIMEOUT_EXIT = 124
BUILD_HINT = ("build nccl-tests: git clone https://github.com/NVIDIA/nccl-tests && cd nccl-tests && make "
              "(multi-node: make MPI=1 MPI_HOME=/path/to/mpi), then pass --binary nccl-tests/build/all_reduce_perf")
_LINE_LIMIT = 1 << 20  # NCCL_DEBUG=INFO lines are long, but not this long


def parse_nccl_size(text: str | int) -> int:
    """A size as nccl-tests reads ``-b``/``-e`` (binary units: ``8G`` = 8 GiB, ``128M``, ``64K``, ``8``)."""
    if isinstance(text, int):
        return text
    value = text.strip()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(value[-1:].lower(), 1)
    number = value[:-1] if value[-1:].lower() in units else value
    try:
        return int(float(number) * scale)
    except ValueError as exc:
        raise DiagnosisError(f"not an nccl-tests size: {text!r} (use e.g. 8, 64K, 128M, 8G)") from exc


def build_command(binary: str, *, gpus: int, min_bytes: str | int = 8, max_bytes: str | int = "8G",
                  step_factor: int = 2, launcher: Sequence[str] = (),
                  extra_args: Sequence[str] = ()) -> list[str]:
    """``launcher + [binary, -b, -e, -f, *extra_args, -g N]``; ``gpus`` 0 leaves ``-g`` out
    (nccl-tests then drives one GPU per process, right under ``mpirun -np <GPUs>``)."""
    cmd = [*launcher, binary, "-b", str(min_bytes), "-e", str(max_bytes), "-f", str(step_factor), *extra_args]
    return [*cmd, "-g", str(gpus)] if gpus > 0 else cmd


def command_from_config(config: NcclDiagnosisConfig) -> list[str]:
    """The command the daemon runs: ``launcher + binary + args (+ -g gpus)``."""
    cmd = [*config.launcher, config.binary, *config.args]
    return [*cmd, "-g", str(config.gpus)] if config.gpus > 0 else cmd


def expected_sizes(cmd: Sequence[str]) -> int:
    """How many result rows ``cmd`` prints per data type, from its ``-b``/``-e``/``-f``/``-i``
    (nccl-tests' defaults: 32 MiB to 32 MiB, step 1 MiB)."""
    opts = {"-b": "32M", "-e": "32M", "-f": "1", "-i": "1M"}
    for flag, value in itertools.pairwise(cmd):
        if flag in opts:
            opts[flag] = value
    try:
        factor = int(opts["-f"])
    except ValueError as exc:
        raise DiagnosisError(f"-f (step factor): not an integer: {opts['-f']!r:.40}") from exc
    lo, hi, step = parse_nccl_size(opts["-b"]), parse_nccl_size(opts["-e"]), parse_nccl_size(opts["-i"])
    if lo <= 0 or hi < lo:
        return 1
    if factor > 1:
        n, size = 0, lo
        while size <= hi:
            n, size = n + 1, size * factor
        return n
    return (hi - lo) // max(step, 1) + 1


def visible_gpus(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> int:
    """GPUs ``nvidia-smi -L`` lists (0 when it is missing or fails): the ``-g`` of a local run."""
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot count GPUs", command="nvidia-smi -L", error=str(exc))
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Progress:
    """``on_line`` for :func:`run_nccl`: a one-line bar on a TTY (sizes done of those expected,
    the last size and its busbw), the plain output lines otherwise."""

    def __init__(self, stream: TextIO, *, total: int, tty: bool | None = None, width: int = 30) -> None:
        self._stream = stream
        self._total = max(total, 1)
        self._tty = stream.isatty() if tty is None else tty
        self._width = width
        self._parser = NcclStreamParser()
        self._done = 0
        self._drawn = False

    def __call__(self, line: str) -> None:
        row = self._parser.feed(line)
        if not self._tty:
            self._stream.write(line + "\n")
            self._stream.flush()
            return
        if row is None:
            if "failure" in line or "NCCL WARN" in line or "[sre-agent]" in line:
                self._clear()
                self._stream.write(line + "\n")
                self._draw()
            return
        self._done += 1
        self._draw(f"{row.size:>12,} B  busbw {row.busbw_gbps:8.2f} GB/s")

    def close(self) -> None:
        """End the bar's line."""
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()

    def _clear(self) -> None:
        if self._drawn:
            self._stream.write("\r\x1b[K")

    def _draw(self, tail: str = "") -> None:
        filled = min(self._width, self._width * self._done // self._total)
        bar = "#" * filled + "-" * (self._width - filled)
        self._stream.write(f"\r\x1b[K[{bar}] {min(self._done, self._total)}/{self._total} sizes  {tail}")
        self._stream.flush()
        self._drawn = True


def _not_found(program: str) -> DiagnosisError:
    if program.endswith("_perf"):
        return DiagnosisError(f"{program}: not found or not executable; {BUILD_HINT}")
    return DiagnosisError(f"{program}: not found or not executable (the launcher, or the binary when there is "
                          f"none); to get nccl-tests, {BUILD_HINT}")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run_nccl(cmd: list[str], *, timeout_s: float, on_line: Callable[[str], None] | None = None,
                   kill_grace_s: float = 5.0) -> tuple[int, str]:
    """Run ``cmd`` (an argument list), streaming each output line to ``on_line``; returns
    ``(exit status, output)``. At ``timeout_s`` the process group gets SIGTERM, then SIGKILL
    after ``kill_grace_s``, and the status is :data:`TIMEOUT_EXIT`. A missing binary raises
    :class:`DiagnosisError` saying how to build nccl-tests."""
    if not cmd:
        raise DiagnosisError("empty nccl-tests command")
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, limit=_LINE_LIMIT)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise _not_found(cmd[0]) from exc
    log.info("nccl-tests started", command=cmd, pid=proc.pid, timeout_s=timeout_s)
    lines: list[str] = []

    async def pump() -> int:
        assert proc.stdout is not None
        while raw := await proc.stdout.readline():
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            lines.append(line)
            if on_line is not None:
                on_line(line)
        return await proc.wait()

    try:
        rc = await asyncio.wait_for(pump(), timeout_s)
    except TimeoutError:
        log.warning("nccl-tests timed out; killing its process group", pid=proc.pid, timeout_s=timeout_s)
        await _terminate(proc, kill_grace_s)
        marker = f"[sre-agent] timed out after {timeout_s:g} s; killed the process group"
        lines.append(marker)
        if on_line is not None:
            on_line(marker)
        rc = TIMEOUT_EXIT
    except asyncio.CancelledError:
        await _terminate(proc, 0.0)
        raise
    log.info("nccl-tests finished", pid=proc.pid, exit_code=rc, lines=len(lines))
    return rc, "\n".join(lines) + ("\n" if lines else "")


async def _terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the whole group (mpirun forwards it to its ranks), SIGKILL what is left."""
    if grace_s > 0:
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()
