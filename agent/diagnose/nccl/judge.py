"""nccl-tests results judged: is the bandwidth what the interconnect should give, and what to do.

The deployment guide's rule: when throughput is far below expectation, measure
inter-GPU bandwidth with nccl-tests' all-reduce; tensor parallelism across nodes
with under 1/10 of the NVLink bandwidth is the usual cause. :mod:`agent.diagnose.nccl.parse`
turns the text nccl-tests prints into an :class:`NcclResult` (its names are re-exported
here); :func:`check` compares it with the expected bus bandwidth of the interconnect
(:mod:`agent.diagnose.nccl.interconnects`) and returns a verdict with findings, and
:func:`to_json` / :func:`nccl_samples` render the outcome for ``--json`` and /metrics.

The bandwidth that counts is the **largest size's** busbw (the better of out-of-place
and in-place): nccl-tests' own "Avg bus bandwidth" averages every size from 8 bytes
up and is dominated by latency-bound small sizes (66 GB/s for an A100 node whose
plateau is 232 GB/s).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.diagnose.nccl.interconnects import expected_busbw, guess_interconnect, nvlink_busbw
from agent.diagnose.nccl.parse import Measurement, NcclResult, NcclRow, NcclStreamParser, parse_nccl
from agent.errors import DiagnosisError

__all__ = [
    "KINDS",
    "OK_FRACTION",
    "Measurement",
    "NcclResult",
    "NcclRow",
    "NcclStreamParser",
    "check",
    "nccl_samples",
    "parse_nccl",
    "size_text",
    "to_json",
]

#: A run is healthy at >= 80 % of the expected busbw: NVIDIA's own figures are peaks ("~230GB/s",
#: "~480GB/s"), and runs on healthy nodes land within a few percent of them (232 GB/s in our A100 fixture).
#: Finding kinds this check emits (runbooks/diagnosis-<kind>.md; "ok"/"expected-unknown" link bandwidth-low).
KINDS = ("nccl-failed", "nccl-wrong-results", "nccl-bandwidth-low", "nccl-cross-node-tp")
OK_FRACTION = 0.8
#: The guide's cross-node rule: below 1/10 of the NVLink bandwidth, TP across nodes is the bottleneck.
CROSS_NODE_FRACTION = 0.1
#: Sizes below this rarely reach the plateau (sjeaugey, nccl-tests#149: "At 512M the bandwidth is still increasing").
PLATEAU_BYTES = 1 << 30

#: The failure line that names the cause, preferred over the first failure line when there is one.
_CAUSE_RE = re.compile(r"Test (?:NCCL|CUDA) failure|Test timeout|^\[sre-agent\]|NCCL WARN .*failure|^#\s*error:")


# ---- verdict ----------------------------------------------------------------------------------------------------


def _expected(result: NcclResult, expected_gbps: float | None, interconnect: str | None) -> tuple[float | None, str]:
    """(expected busbw, where it came from)."""
    if expected_gbps is not None:
        return expected_gbps, "configured"
    key = interconnect or guess_interconnect(result.gpu_models, result.ranks, result.nodes)
    if not key:
        return None, ""
    try:
        return expected_busbw(key), key
    except KeyError as exc:
        raise DiagnosisError(str(exc.args[0])) from exc


def size_text(n: int | None) -> str:
    """Bytes as nccl-tests' binary units: ``4 GiB``, ``128 MiB``, ``8 B``."""
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _where(result: NcclResult) -> str:
    models = ", ".join(result.gpu_models) or "unknown GPUs"
    return f"{result.ranks or '?'} ranks on {result.nodes or '?'} node(s), {models}"


def check(result: NcclResult, *, expected_gbps: float | None = None, interconnect: str | None = None,
          runbook_base: str = DEFAULT_RUNBOOK_BASE) -> tuple[str, list[Finding]]:
    """The verdict (``ok``, ``low``, ``wrong-results``, ``failed``, ``unknown``) and its findings.

    ``expected_gbps`` overrides everything; else ``interconnect`` (a table key such as
    ``h100-nvls`` or ``ib-400gx8``); else a guess from the GPU models of a single-node run.
    """
    expected, source = _expected(result, expected_gbps, interconnect)
    peak = result.peak_busbw_gbps
    ratio = peak / expected if peak is not None and expected else None
    details: dict[str, Any] = {
        "collective": result.collective, "ranks": result.ranks, "nodes": result.nodes,
        "largest_size_bytes": result.largest_size, "peak_busbw_gbps": peak, "avg_busbw_gbps": result.avg_busbw_gbps,
        "expected_gbps": expected, "expected_source": source, "fraction_of_expected": ratio, "wrong": result.wrong,
    }
    evidence: list[str] = []
    if peak is not None:
        evidence.append(f"largest size {size_text(result.largest_size)}: busbw {peak:.2f} GB/s ({_where(result)})")
    if result.largest_size is not None and result.largest_size < PLATEAU_BYTES:
        evidence.append(f"largest size {size_text(result.largest_size)} is below 1 GiB: busbw may not have reached its "
                        "plateau; run with -e 8G")
    if result.truncated:
        evidence.append("output is truncated: the largest sizes may be missing")
    # A live run's rows that held inf/nan/negative numbers were dropped by the parser; say so beside the verdict.
    evidence.extend(f"ignored {line}" for line in result.invalid[:5])

    def finding(kind: str, summary: str, severity: str, extra: list[str] | None = None, **kw: Any) -> Finding:
        return Finding(kind=kind, summary=summary, severity=severity, evidence=[*evidence, *(extra or [])],
                       details=dict(details), runbook_url=runbook_url(f"diagnosis-{kind}", runbook_base), **kw)

    findings: list[Finding] = []
    if (result.wrong or 0) > 0 or (result.out_of_bounds or 0) > 0:
        verdict = "wrong-results"
        bad = [f"size {r.size}: #wrong out-of-place {r.out_of_place.wrong}, in-place "
               f"{r.in_place.wrong if r.in_place else '-'}" for r in result.rows
               if (r.out_of_place.wrong or 0) > 0 or (r.in_place is not None and (r.in_place.wrong or 0) > 0)]
        count = result.wrong if result.wrong is not None else result.out_of_bounds
        findings.append(finding("nccl-wrong-results", f"nccl-tests {result.collective} returned {count} wrong values: "
                                "the collective corrupts data on this path", "critical",
                                [*bad, *result.failure_lines]))
    elif result.failed or not result.rows:
        verdict = "failed"
        if result.failure_lines:
            why = next((x for x in result.failure_lines if _CAUSE_RE.search(x)), result.failure_lines[0])
        elif result.exit_code not in (None, 0):
            why = f"exit status {result.exit_code}"
        else:
            why = "no result rows in the output"
        findings.append(finding("nccl-failed", f"nccl-tests {result.collective} did not complete: {why}", "critical",
                                result.failure_lines))
    elif expected is None or ratio is None or peak is None:
        verdict = "unknown"
        findings.append(Finding(
            kind="nccl-expected-unknown", severity="info", evidence=evidence, details=details,
            runbook_url=runbook_url("diagnosis-nccl-bandwidth-low", runbook_base),
            summary=f"peak busbw {peak or 0:.2f} GB/s; no expected figure for {_where(result)}: pass --interconnect "
                    "(e.g. ib-400gx8) or --expected-gbps"))
    elif ratio >= OK_FRACTION:
        verdict = "ok"
        findings.append(Finding(
            kind="nccl-ok", ok=True, severity="info", evidence=evidence, details=details,
            runbook_url=runbook_url("diagnosis-nccl-bandwidth-low", runbook_base),
            summary=f"peak busbw {peak:.2f} GB/s is {ratio:.0%} of the {expected:g} GB/s expected ({source}); "
                    f"healthy at >= {OK_FRACTION:.0%}"))
    else:
        verdict = "low"
        findings.append(finding(
            "nccl-bandwidth-low", f"peak busbw {peak:.2f} GB/s is {ratio:.0%} of the {expected:g} GB/s expected "
            f"({source}); healthy is >= {OK_FRACTION:.0%}", "warning"))

    nvlink = nvlink_busbw(result.gpu_models)
    if verdict != "failed" and result.nodes > 1 and peak is not None and nvlink and peak < CROSS_NODE_FRACTION * nvlink:
        per_node = result.ranks // result.nodes if result.ranks else 0
        findings.append(finding(
            "nccl-cross-node-tp",
            f"the run spans {result.nodes} nodes and reaches {peak:.2f} GB/s, under 1/10 of the {nvlink:g} GB/s "
            "NVLink figure: keep tensor parallelism within a node and use pipeline parallelism across nodes",
            "warning", [f"NVLink busbw for {', '.join(result.gpu_models)}: {nvlink:g} GB/s; 1/10 = {nvlink / 10:g}"],
            setting="--tensor-parallel-size / --pipeline-parallel-size",
            suggested_value=f"{per_node or 'GPUs per node'} / {result.nodes}"))
    return verdict, findings


def to_json(result: NcclResult, verdict: str, findings: list[Finding]) -> dict[str, Any]:
    """The ``--json`` document: the numbers, the verdict, the findings and every row."""
    primary = next((f for f in findings if not f.ok and f.runbook_url), None)
    expected = findings[0].details.get("expected_gbps") if findings else None
    return {
        "collective": result.collective, "ranks": result.ranks, "nodes": result.nodes, "hosts": result.hosts,
        "gpu_models": result.gpu_models, "largest_size_bytes": result.largest_size,
        "peak_busbw_gbps": result.peak_busbw_gbps, "avg_busbw_gbps": result.avg_busbw_gbps, "wrong": result.wrong,
        "out_of_bounds": result.out_of_bounds, "failed": result.failed, "truncated": result.truncated,
        "failure_lines": result.failure_lines, "exit_code": result.exit_code, "expected_gbps": expected,
        "verdict": verdict, "runbook_url": primary.runbook_url if primary else "",
        "findings": [f.to_json() for f in findings], "rows": [asdict(r) for r in result.rows],
    }


def nccl_samples(result: NcclResult, verdict: str, now_ms: int,
                 labels: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    """Samples for the agent's /metrics after a run (every series carries ``collective``)."""
    base = {**labels, "collective": result.collective}
    out: list[tuple[str, dict[str, str], float]] = []
    if result.peak_busbw_gbps is not None:
        out.append(("sre_agent_nccl_busbw_gbps", {**base, "stat": "peak"}, result.peak_busbw_gbps))
    if result.avg_busbw_gbps is not None:
        out.append(("sre_agent_nccl_busbw_gbps", {**base, "stat": "avg"}, result.avg_busbw_gbps))
    if result.wrong is not None:
        out.append(("sre_agent_nccl_wrong_total", dict(base), float(result.wrong)))
    out.append(("sre_agent_nccl_last_run_timestamp_seconds", dict(base), now_ms / 1000.0))
    out.append(("sre_agent_nccl_ok", dict(base), 1.0 if verdict == "ok" else 0.0))
    return out
