#!/usr/bin/env python3
"""A stand-in for nccl-tests' all_reduce_perf: prints output in the real format, no GPU needed.

The lines use nccl-tests' own printf formats (src/util.cu: writeBenchmarkLinePreamble
"%12li  %12li  %8s  %6s  %6s", writeBenchmarkLineBody "  %7s  %6s  %6s  %6g", the
"# Using devices" rank line and the footer). It reads -b/-e/-f/-g like the real one,
plus its own --fake-* options (unknown arguments are ignored, as a launcher prefix
would put them before the binary):

  --fake-mode succeed   full sweep, exit 0
  --fake-mode slow      a row every --fake-delay seconds; with --fake-ack-dir DIR it
                        waits after row i until DIR/ack-i exists (a test proves streaming)
  --fake-mode wrong     #wrong > 0 at 1 MiB, "Out of bounds values : N FAILED", exit 7
  --fake-mode fail      NCCL WARN + "Test NCCL failure" at the first size, exit 3
  --fake-mode hang      prints two rows, starts a child process (its pid on a line
                        "# fake child pid N"), then sleeps until killed
  --fake-busbw X        the plateau bus bandwidth in GB/s (default 230)
"""

# ruff: noqa: UP031  -- printf-style on purpose: the formats are nccl-tests' own, so the output matches it

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if text[-1:].lower() in units else text) * scale)


def _opt(argv: list[str], name: str, default: str) -> str:
    for flag, value in itertools.pairwise(argv):
        if flag == name:
            return value
    return default


def _num(value: float, width: int) -> str:
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        text = fmt % (width, value)
        if len(text) <= width:
            return text
    return "%*.1e" % (width, value)


def _row(size: int, ranks: int, busbw_peak: float, wrong: int) -> str:
    count = size // 4
    busbw = busbw_peak * size / (size + 64 * 1024 * 1024)  # rises with size towards the plateau
    algbw = busbw * ranks / (2 * (ranks - 1)) if ranks > 1 else busbw
    time_us = size / (algbw * 1e3) if algbw > 0 else 40.0
    body = "  %7s  %6s  %6s  %6g" % (_num(time_us, 7), _num(algbw, 6), _num(busbw, 6), wrong)
    return "%12li  %12li  %8s  %6s  %6s" % (size, count, "float", "sum", "-1") + body + body


def main(argv: list[str]) -> int:
    mode = _opt(argv, "--fake-mode", "succeed")
    delay = float(_opt(argv, "--fake-delay", "0.05"))
    ack_dir = _opt(argv, "--fake-ack-dir", "")
    peak = float(_opt(argv, "--fake-busbw", "230"))
    lo, hi, factor = _size(_opt(argv, "-b", "32M")), _size(_opt(argv, "-e", "32M")), int(_opt(argv, "-f", "1"))
    ranks = int(_opt(argv, "-g", "1"))
    host, pid = "fakehost", os.getpid()
    out = sys.stdout
    out.write("# nccl-tests version 2.17.8 nccl-headers=22907 nccl-library=22907\n")
    out.write("# Collective test starting: all_reduce_perf\n")
    out.write(f"# nThread 1 nGpus {ranks} minBytes {lo} maxBytes {hi} step: {factor}(factor) warmup iters: 1 "
              "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n")
    for r in range(ranks):
        out.write("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n"
                  % (r, 0, pid, host, r, 0, 0x10 + r, 0, "NVIDIA A100-SXM4-80GB"))
    out.write("#\n")
    out.write("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n"
              % ("", "", "", "", ""))
    out.write("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n"
              % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                 "busbw", "#wrong"))
    out.write("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n"
              % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
    out.flush()
    if mode == "fail":
        out.write(f"\n{host}:{pid}:{pid} [1] enqueue.cc:1500 NCCL WARN Cuda failure 1 'invalid argument'\n")
        out.write(f"{host}: Test NCCL failure common.cu:392 'unhandled cuda error (run with NCCL_DEBUG=INFO for "
                  "details) / '\n")
        out.write(f" .. {host} pid {pid}: Test failure common.cu:590\n")
        out.flush()
        return 3
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size = size * factor if factor > 1 else size + (1 << 20)
    wrong_total = 0
    for i, size in enumerate(sizes):
        wrong = 96 if mode == "wrong" and size == 1 << 20 else 0
        wrong_total += wrong
        out.write(_row(size, ranks, peak, wrong) + "\n")
        out.flush()
        if mode == "slow":
            if ack_dir:
                _wait_for(Path(ack_dir) / f"ack-{i}")
            else:
                time.sleep(delay)
        if mode == "hang" and i == 1:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            out.write(f"# fake child pid {child.pid}\n")
            out.flush()
            while True:
                time.sleep(3600)
    verdict = "FAILED" if wrong_total else "OK"
    out.write("# %-20s : %d %s\n" % ("Out of bounds values", 1 if wrong_total else 0, verdict))
    out.write("# %-20s : %g %s\n" % ("Avg bus bandwidth", peak / 2, ""))
    out.write("#\n# Collective test concluded: all_reduce_perf\n#\n")
    if wrong_total:
        out.write(f"\n .. {host} pid {pid}: Test failure common.cu:1189\n")
        out.flush()
        return 7
    out.flush()
    return 0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(5)
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
