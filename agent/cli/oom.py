"""The ``sre-agent diagnose oom`` command: why did the inference server run out of memory?

``sre-agent diagnose oom /var/log/vllm.log`` reads vLLM server logs, kernel logs
(``journalctl -k``, ``dmesg``), ``kubectl get pod P -o json`` or ``kubectl describe pod P``
(files, or ``-``/nothing for stdin) and prints one block per finding: what happened, the
evidence lines, the flag to change with its new value, and the runbook. Flags such as
``--model`` and ``--gpu`` say what the logs may not, so the memory planner can size the fix.
Exit 0 = no OOM evidence, 1 = findings, 2 = unreadable file or bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from agent.app.logs import configure_logging
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding
from agent.diagnose.oom.verdict import OomContext, diagnose_oom

__all__ = ["add_parser", "render", "run"]

_EPILOG = """\
examples:
  sre-agent diagnose oom /var/log/vllm.log
  journalctl -k --since -1h | sre-agent diagnose oom -
  kubectl get pod vllm-0 -o json | sre-agent diagnose oom --json
  sre-agent diagnose oom vllm.log --model meta-llama/Meta-Llama-3-70B --gpu H100 --tensor-parallel-size 4
"""
_MAX_EVIDENCE_SHOWN = 5


def _utilization(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1]: {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def add_parser(sub: Any) -> None:
    """Register ``diagnose`` with its ``oom`` action on the CLI's subparsers."""
    diag: argparse.ArgumentParser = sub.add_parser(
        "diagnose", help="diagnose a failure from its evidence (oom)",
        description="Diagnose a failure from logs and Kubernetes objects; each finding names the flag to change.")
    actions = diag.add_subparsers(dest="diagnose_command", required=True, metavar="ACTION")
    p: argparse.ArgumentParser = actions.add_parser(
        "oom", help="why a vLLM/LMDeploy server ran out of GPU, host or container memory",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", metavar="FILE", help="log files or pod JSON/describe output; '-' or none: stdin")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    p.add_argument("--model", help="served model (Hugging Face id or planner preset), if the log does not say")
    p.add_argument("--max-model-len", type=_positive)
    p.add_argument("--max-num-seqs", type=_positive)
    p.add_argument("--gpu-memory-utilization", type=_utilization)
    p.add_argument("--tensor-parallel-size", type=_positive)
    p.add_argument("--gpu", help="GPU model for the planner, e.g. H100, A100-80GB, L40S")
    p.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, help="runbooks' base URL")
    p.set_defaults(func=run)


def _read(files: list[str], stdin: TextIO) -> list[str]:
    """All input lines; ``-`` (or no file) is stdin. Raises OSError for an unreadable file."""
    lines: list[str] = []
    for name in files or ["-"]:
        if name == "-":
            lines.extend(stdin.read().split("\n"))  # lines end at newlines only, as in a log file
        else:
            with open(name, encoding="utf-8", errors="replace") as fh:
                lines.extend(fh.read().split("\n"))
        lines.append("")  # files do not run into each other (a JSON document stays whole per file)
    return lines


def render(findings: list[Finding]) -> str:
    """The human-readable report: one block per finding."""
    if not findings:
        return "no OOM evidence found\n"
    blocks = []
    for f in findings:
        out = [f"[{f.severity}] {f.kind}: {f.summary}"]
        counts = f.details.get("evidence_counts", [1] * len(f.evidence))
        for line, n in list(zip(f.evidence, counts, strict=False))[:_MAX_EVIDENCE_SHOWN]:
            out.append(f"  evidence{f' ({n}x)' if n > 1 else ''}: {line.strip()}")
        if len(f.evidence) > _MAX_EVIDENCE_SHOWN:
            out.append(f"  ... {len(f.evidence) - _MAX_EVIDENCE_SHOWN} more evidence lines (--json shows all)")
        if f.setting and f.suggested_value:
            out.append(f"  change: {f.setting} \u2192 {f.suggested_value}")
        elif f.suggested_value:
            out.append(f"  action: {f.suggested_value}")
        for alt in f.details.get("alternatives", []) + ([f.details["alternative"]] if "alternative" in f.details
                                                          else []):
            out.append(f"  or: {alt}")
        out.append(f"  runbook: {f.runbook_url}")
        blocks.append("\n".join(out))
    return "\n\n".join(blocks) + "\n"


def run(args: argparse.Namespace, *, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """The command; ``stdin``/``stdout`` default to the process's."""
    out = stdout or sys.stdout
    configure_logging("console", "warning")
    if sum(1 for name in args.files if name == "-") > 1:
        print("error: stdin ('-') can be read only once", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        lines = _read(args.files, stdin or sys.stdin)
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    context = OomContext(model=args.model, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                         gpu_memory_utilization=args.gpu_memory_utilization,
                         tensor_parallel_size=args.tensor_parallel_size, gpu_name=args.gpu)
    findings = diagnose_oom(lines, context=context, runbook_base=args.runbook_base)
    if args.json:
        out.write(json.dumps([f.to_json() for f in findings], indent=2) + "\n")
    else:
        out.write(render(findings))
    return EXIT_PROBLEM if findings else EXIT_OK
