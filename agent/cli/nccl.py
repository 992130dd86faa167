"""The ``sre-agent nccl`` command: run nccl-tests (or read a saved output) and judge the bandwidth.

``sre-agent nccl`` runs ``all_reduce_perf`` with a live progress bar and prints the
collective, ranks/nodes/GPUs, the largest size, its bus bandwidth against the
expected figure, the average, wrong results, the verdict and findings with runbook
links. ``sre-agent nccl --parse out.txt`` (or ``-``) does the same for an output
someone already has. Exit 0 healthy, 1 a problem (low, wrong results, failed), 2 bad
input (unreadable file, no result rows, a value that is no measurement such as an ``inf`` or
negative bandwidth, binary not found, unknown interconnect).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

from agent.app.logs import configure_logging
from agent.cli.argtypes import duration, integer, number
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.config import NcclDiagnosisConfig, load_config
from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding
from agent.diagnose.nccl.interconnects import INTERCONNECTS, check_configured
from agent.diagnose.nccl.judge import NcclResult, check, parse_nccl, size_text, to_json
from agent.diagnose.nccl.run import (
    Progress,
    build_command,
    command_from_config,
    expected_sizes,
    run_nccl,
    visible_gpus,
)
from agent.errors import DiagnosisError

__all__ = ["MAX_PARSE_BYTES", "add_parser", "exit_code_for"]

_PROBLEM_VERDICTS = ("low", "wrong-results", "failed")
#: A saved all_reduce_perf output is a few kilobytes; one with NCCL_DEBUG=INFO from hundreds of ranks a
#: few megabytes. Past this it is not an nccl-tests output.
MAX_PARSE_BYTES = 64 << 20

_EPILOG = """\
examples:
  sre-agent nccl --gpus 8                                  # one node, every size from 8 B to 8 GiB
  sre-agent nccl --launcher 'mpirun -np 16 -H a:8,b:8' --interconnect ib-400gx8
  sre-agent nccl --parse out.txt --json                    # judge a saved output
interconnects (expected busbw, GB/s): """ + ", ".join(
    f"{k} {v.busbw_gbps:g}{'/NIC' if v.per_nic else ''}" for k, v in INTERCONNECTS.items())


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nccl", help="measure inter-GPU bandwidth with nccl-tests and judge it",
        description="Run nccl-tests' all_reduce_perf (or --parse a saved output) and compare the largest size's bus "
                    "bandwidth with what the interconnect should give. Arguments after -- go to the binary.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parse", metavar="FILE", help="judge an existing output (FILE, or - for stdin) instead of running")
    p.add_argument("--binary", help="nccl-tests binary (default: all_reduce_perf on PATH, or diagnostics.nccl.binary)")
    p.add_argument("--gpus", type=integer(0),
                   help="-g: GPUs per process (default: every visible GPU without a launcher)")
    p.add_argument("--min-bytes", help="-b (default 8)")
    p.add_argument("--max-bytes", help="-e (default 8G)")
    p.add_argument("--step-factor", type=integer(1), help="-f (default 2)")
    p.add_argument("--launcher", help="command prefix, e.g. 'mpirun -np 16 -H a:8,b:8' (split like a shell would)")
    p.add_argument("--timeout", type=duration, help="kill the run after this long (default 15m)")
    expect = p.add_mutually_exclusive_group()
    expect.add_argument("--expected-gbps", type=number(), help="the busbw this system should reach, in GB/s")
    expect.add_argument("--interconnect", help="a key of the expected-bandwidth table (see below)")
    p.add_argument("--config", "-c", type=Path, help="agent config: diagnostics.nccl supplies the defaults")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="agent log level, on stderr (default %(default)s)")
    p.add_argument("extra", nargs="*", metavar="-- ARGS", help="more nccl-tests arguments, after --")
    p.set_defaults(func=_run)


def exit_code_for(result: NcclResult, verdict: str, findings: list[Finding]) -> int:
    """0 healthy, 1 a problem, 2 input that holds no nccl-tests result at all."""
    if not result.rows and not result.failed:
        return EXIT_BAD_INPUT
    problem = verdict in _PROBLEM_VERDICTS or any(not f.ok and f.severity in ("warning", "critical") for f in findings)
    return EXIT_PROBLEM if problem else EXIT_OK


def _run(args: argparse.Namespace) -> int:
    configure_logging("console", args.log_level)
    config = NcclDiagnosisConfig()
    runbook_base = DEFAULT_RUNBOOK_BASE
    if args.config is not None:
        full = load_config(args.config, os.environ)
        check_configured(full.diagnostics.nccl.interconnect)
        config, runbook_base = full.diagnostics.nccl, full.diagnostics.runbook_base_url
    # A flag beats the config; --interconnect on the command line beats a configured expected_gbps.
    expected = args.expected_gbps if args.expected_gbps is not None or args.interconnect else config.expected_gbps
    interconnect = args.interconnect or config.interconnect or None
    try:
        if args.parse is not None:
            result = parse_nccl(_read(args.parse))
            if result.invalid:  # an infinite or negative bandwidth is no measurement to judge
                print(f"error: {args.parse}: {result.invalid[0]}"
                      + (f" (and {len(result.invalid) - 1} more)" if len(result.invalid) > 1 else ""),
                      file=sys.stderr)
                return EXIT_BAD_INPUT
            if not result.rows and not result.failed:
                print(f"error: no nccl-tests result rows in {args.parse}", file=sys.stderr)
                return EXIT_BAD_INPUT
        else:
            result = _execute(args, config)
            for line in result.invalid:  # the binary's own output: judge the rows that are measurements
                print(f"warning: ignored {line}", file=sys.stderr)
        verdict, findings = check(result, expected_gbps=expected, interconnect=interconnect,
                                  runbook_base=runbook_base)
    except DiagnosisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(to_json(result, verdict, findings), indent=2))
    else:
        _print_table(result, verdict, findings, sys.stdout)
    return exit_code_for(result, verdict, findings)


def _read(name: str) -> str:
    """The saved output, at most :data:`MAX_PARSE_BYTES` of it (``/dev/zero`` or a core dump given by
    mistake would otherwise be read into memory whole)."""
    try:
        if name == "-":
            data: str | bytes = sys.stdin.read(MAX_PARSE_BYTES + 1)  # characters, never more than their bytes
        else:
            with Path(name).open("rb") as fh:
                data = fh.read(MAX_PARSE_BYTES + 1)
    except OSError as exc:
        raise DiagnosisError(f"{name}: cannot read: {exc.strerror}") from exc
    if len(data) > MAX_PARSE_BYTES:
        raise DiagnosisError(f"{name}: over the {MAX_PARSE_BYTES:,}-byte limit for an nccl-tests output")
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")


def _execute(args: argparse.Namespace, config: NcclDiagnosisConfig) -> NcclResult:
    try:
        launcher = shlex.split(args.launcher) if args.launcher is not None else list(config.launcher)
    except ValueError as exc:  # "No closing quotation"
        raise DiagnosisError(f"--launcher: cannot split it as a shell would: {exc}") from exc
    binary = args.binary or config.binary
    gpus = args.gpus if args.gpus is not None else config.gpus
    if gpus == 0 and not launcher:
        gpus = visible_gpus()
    if any(v is not None for v in (args.min_bytes, args.max_bytes, args.step_factor)) or args.extra:
        cmd = build_command(binary, gpus=gpus, min_bytes=args.min_bytes or 8, max_bytes=args.max_bytes or "8G",
                            step_factor=args.step_factor or 2, launcher=launcher, extra_args=args.extra)
    else:
        cmd = command_from_config(config.model_copy(update={"binary": binary, "launcher": launcher, "gpus": gpus}))
    timeout = args.timeout if args.timeout is not None else config.timeout
    print(f"running: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    progress = Progress(sys.stderr, total=expected_sizes(cmd[len(launcher):]))  # the launcher's flags are not ours
    try:
        rc, text = asyncio.run(run_nccl(cmd, timeout_s=timeout, on_line=progress))
    finally:
        progress.close()
    return parse_nccl(text, exit_code=rc, command=cmd)


def _fmt(value: float | None, unit: str = " GB/s") -> str:
    return "?" if value is None else f"{value:.2f}{unit}"


def _print_table(result: NcclResult, verdict: str, findings: list[Finding], out: TextIO) -> None:
    details = findings[0].details if findings else {}
    expected, source, ratio = details.get("expected_gbps"), details.get("expected_source"), details.get(
        "fraction_of_expected")
    vs = f"  ({ratio:.0%} of {expected:g} GB/s expected, {source})" if ratio is not None and expected else (
        "  (no expected figure)")
    largest = result.largest_size
    rows = [
        ("collective", result.collective),
        ("ranks / nodes", f"{result.ranks or '?'} / {result.nodes or '?'}"),
        ("GPUs", ", ".join(result.gpu_models) or "?"),
        ("largest size", "?" if largest is None else f"{size_text(largest)} ({largest:,} B)"),
        ("peak busbw", _fmt(result.peak_busbw_gbps) + (vs if result.rows else "")),
        ("avg busbw", _fmt(result.avg_busbw_gbps) + "  (every size; small sizes pull it down)"),
        ("wrong", "unknown" if result.wrong is None else str(result.wrong)),
        ("verdict", verdict + ("  (output truncated)" if result.truncated else "")),
    ]
    for name, value in rows:
        out.write(f"{name:<14} {value}\n")
    out.write("findings:\n")
    for f in findings:
        out.write(f"  [{f.severity}] {f.kind}: {f.summary}\n")
        if f.setting:
            out.write(f"      change: {f.setting} -> {f.suggested_value}\n")
        for line in f.evidence[:8]:
            out.write(f"      {line}\n")
        if f.runbook_url:
            out.write(f"      runbook: {f.runbook_url}\n")
