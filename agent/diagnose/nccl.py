"""nccl-tests output: parse it, judge the bandwidth, and say what to do about it.

The deployment guide's rule: when throughput is far below expectation, measure
inter-GPU bandwidth with nccl-tests' all-reduce; tensor parallelism across nodes
with under 1/10 of the NVLink bandwidth is the usual cause. This module reads the
text ``all_reduce_perf`` (or any ``*_perf``) prints, in the current format and the
pre-2.x one (no ``#`` on the header, ``error`` instead of ``#wrong``, no
``redop``/``root`` for all-gather), and turns it into an :class:`NcclResult`;
:func:`check` compares it with the expected bus bandwidth of the interconnect
(:mod:`agent.diagnose.interconnects`) and returns a verdict with findings.

The bandwidth that counts is the **largest size's** busbw (the better of out-of-place
and in-place): nccl-tests' own "Avg bus bandwidth" averages every size from 8 bytes
up and is dominated by latency-bound small sizes (66 GB/s for an A100 node whose
plateau is 232 GB/s).

A run has *failed* when it printed ``Test NCCL failure`` / ``Test CUDA failure`` /
``Test failure`` / ``Test timeout``, when the caller saw a non-zero exit, or when it
printed ``NCCL WARN`` and never reached its footer. An ``NCCL WARN`` in a run that
finished (``Could not find a path for pattern 4, falling back``) is kept as evidence
but does not fail it.
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.diagnose.interconnects import expected_busbw, guess_interconnect, nvlink_busbw
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
_MAX_FAILURE_LINES = 40

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "alltoallv",
               "sendrecv", "gather", "scatter", "hypercube")

_PREFIX_RE = re.compile(r"^(?:\[\d+(?:,\d+)?\]<std(?:out|err)>:|\[\d+\] ?)")
_HARD_FAILURE_RE = re.compile(r"Test (?:NCCL |CUDA )?failure|Test timeout|^#\s*error:|^\[sre-agent\]|mpirun noticed")
_ERROR_RE = re.compile(r"^#\s*error:")  # the one '#' line of nccl-tests that reports a failure
_CAUSE_RE = re.compile(r"Test (?:NCCL|CUDA) failure|Test timeout|^\[sre-agent\]|NCCL WARN .*failure|^#\s*error:")
_WARN_RE = re.compile(r"NCCL WARN")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?:(\S+)\s+)?device\s+\d+\s+"
                      r"\[[^\]]*\]\s+(.+?)\s*$")
_PARAMS_RE = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes")
_COLLECTIVE_RE = re.compile(r"\b(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")_perf\b")
_GPUS_FLAG_RE = re.compile(r"_perf\b.*?\s-g\s*(\d+)")
_OOB_RE = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_AVG_RE = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_TIME_COLUMNS = ("time", "cputime")


@dataclass(frozen=True)
class Measurement:
    """One half of a row: out-of-place or in-place."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # "#wrong"; None for "N/A" (validation off) or the old format
    max_error: float | None = None  # the old format's "error" column (max abs error, not a count)


@dataclass(frozen=True)
class NcclRow:
    size: int  # bytes
    count: int  # elements
    type: str
    redop: str  # "" where the format has no redop column
    root: int | None
    out_of_place: Measurement
    in_place: Measurement | None

    @property
    def busbw_gbps(self) -> float:
        """The better of out-of-place and in-place busbw."""
        return max(self.out_of_place.busbw_gbps, self.in_place.busbw_gbps if self.in_place else 0.0)


@dataclass(frozen=True)
class NcclResult:
    collective: str  # "all_reduce", ... or "unknown"
    ranks: int  # 0 = unknown
    nodes: int  # distinct hosts in "# Using devices"; 0 = unknown
    gpu_models: list[str]
    rows: list[NcclRow]
    peak_busbw_gbps: float | None  # the largest size's busbw
    avg_busbw_gbps: float | None  # nccl-tests' footer, else the mean of every busbw printed
    wrong: int | None  # sum of #wrong (old format: the out-of-bounds count); None = unknown
    failed: bool
    failure_lines: list[str] = field(default_factory=list)
    truncated: bool = False
    out_of_bounds: int | None = None  # "Out of bounds values : N"
    exit_code: int | None = None
    hosts: list[str] = field(default_factory=list)

    @property
    def largest_size(self) -> int | None:
        return max((r.size for r in self.rows), default=None)


class NcclStreamParser:
    """Reads nccl-tests output one line at a time: :meth:`feed` returns each result row as it
    arrives (the runner's progress bar uses that), :meth:`result` builds the :class:`NcclResult`."""

    def __init__(self, *, command: list[str] | None = None) -> None:
        self._key_cols: list[str] = []
        self._groups: list[list[str]] = []
        self._rows: list[NcclRow] = []
        self._ranks: dict[int, tuple[str, str]] = {}
        self._hard = False  # a Test ... failure / timeout line
        self._warn = False  # an NCCL WARN line
        self._failure_lines: list[str] = []  # hard failures and NCCL WARN lines, in output order
        self._collective = ""
        self._params: tuple[int, int] | None = None
        self._gpus_flag: int | None = None
        self._avg: float | None = None
        self._oob: int | None = None
        self._last_partial = False
        if command:
            self._scan_command(" ".join(command))

    @property
    def rows(self) -> list[NcclRow]:
        return self._rows

    def feed(self, raw: str) -> NcclRow | None:
        line = _PREFIX_RE.sub("", raw.rstrip("\r\n"))
        if not line.strip():
            return None
        self._last_partial = False
        comment = line.lstrip().startswith("#")
        if (not comment or _ERROR_RE.match(line.strip())) and _HARD_FAILURE_RE.search(line.strip()):
            self._hard = True
            self._failure_lines.append(line.strip())
            return None
        if not comment and _WARN_RE.search(line):
            self._warn = True
            self._failure_lines.append(line.strip())
            return None
        if (m := _RANK_RE.match(line.strip())) is not None:
            self._ranks[int(m.group(1))] = (m.group(2) or "", m.group(3))
            return None
        if (m := _PARAMS_RE.search(line)) is not None:
            self._params = (int(m.group(1)), int(m.group(2)))
            return None
        if (m := _OOB_RE.match(line.strip())) is not None:
            self._oob = int(m.group(1))
            return None
        if (m := _AVG_RE.match(line.strip())) is not None:
            self._avg = float(m.group(1))
            return None
        self._scan_command(line)
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            self._set_header(tokens)
            return None
        if line.lstrip().startswith("#") or not self._groups or not tokens[0].isdigit():
            return None
        row = self._parse_row(tokens)
        if row is None:
            self._last_partial = True
        else:
            self._rows.append(row)
        return row

    def result(self, *, exit_code: int | None = None) -> NcclResult:
        rows = self._rows
        hosts = list(dict.fromkeys(h for h, _ in self._ranks.values()))
        models = list(dict.fromkeys(m for _, m in self._ranks.values()))
        if self._ranks:
            ranks = len(self._ranks)
        elif self._params is not None:
            ranks = self._params[0] * self._params[1]
        else:
            ranks = self._gpus_flag or 0
        finished = self._avg is not None
        failed = self._hard or exit_code not in (None, 0) or (self._warn and not finished)
        largest = max((r.size for r in rows), default=None)
        peak = max((r.busbw_gbps for r in rows if r.size == largest), default=None)
        every = [m.busbw_gbps for r in rows for m in (r.out_of_place, r.in_place) if m is not None]
        avg = self._avg if self._avg is not None else (statistics.fmean(every) if every else None)
        counts = [m.wrong for r in rows for m in (r.out_of_place, r.in_place) if m is not None and m.wrong is not None]
        old_format = any(m.max_error is not None for r in rows for m in (r.out_of_place, r.in_place) if m)
        wrong = sum(counts) if counts else (self._oob if old_format else None)
        lines = self._failure_lines[:_MAX_FAILURE_LINES]
        return NcclResult(
            collective=self._collective or "unknown", ranks=ranks, nodes=len(hosts), gpu_models=models,
            rows=list(rows), peak_busbw_gbps=peak, avg_busbw_gbps=avg, wrong=wrong, failed=failed,
            failure_lines=lines, truncated=bool(rows) and (self._last_partial or not finished),
            out_of_bounds=self._oob, exit_code=exit_code, hosts=hosts,
        )

    def _scan_command(self, line: str) -> None:
        if not self._collective and (m := _COLLECTIVE_RE.search(line)) is not None:
            self._collective = m.group(1)
        if self._gpus_flag is None and (m := _GPUS_FLAG_RE.search(line)) is not None:
            self._gpus_flag = int(m.group(1))

    def _set_header(self, tokens: list[str]) -> None:
        starts = [i for i, t in enumerate(tokens) if t in _TIME_COLUMNS]
        if not starts:
            return
        self._key_cols = tokens[: starts[0]]
        bounds = [*starts, len(tokens)]
        self._groups = [tokens[a:b] for a, b in itertools.pairwise(bounds)][:2]

    def _parse_row(self, tokens: list[str]) -> NcclRow | None:
        keys = dict(zip(self._key_cols, tokens, strict=False))
        pos = len(self._key_cols)
        halves: list[Measurement] = []
        try:
            for group in self._groups:
                values = dict(zip(group, tokens[pos: pos + len(group)], strict=False))
                if not all(c in values for c in group if c in (*_TIME_COLUMNS, "algbw", "busbw", "#wrong", "error")):
                    break
                halves.append(_measurement(values))
                pos += len(group)
            if len(halves) < len(self._groups) or len(keys) < len(self._key_cols):
                return None  # a partial line: the output was cut off here
            root = keys.get("root")
            return NcclRow(size=int(keys["size"]), count=int(keys["count"]), type=keys.get("type", ""),
                           redop=keys.get("redop", ""), root=int(root) if root is not None else None,
                           out_of_place=halves[0], in_place=halves[1] if len(halves) > 1 else None)
        except (KeyError, ValueError):
            return None


def _measurement(values: dict[str, str]) -> Measurement:
    time = values.get("time", values.get("cputime", "nan"))
    wrong_text = values.get("#wrong")
    wrong = None if wrong_text in (None, "N/A") else int(float(wrong_text))
    error_text = values.get("error")
    error = None if error_text in (None, "N/A") else float(error_text)
    return Measurement(time_us=float(time), algbw_gbps=float(values["algbw"]), busbw_gbps=float(values["busbw"]),
                       wrong=wrong, max_error=error)


def parse_nccl(text: str, *, exit_code: int | None = None, command: list[str] | None = None) -> NcclResult:
    """Parse a whole nccl-tests output. ``exit_code`` (non-zero: failed) and ``command`` (names the
    collective when the text does not) come from the caller when it ran the binary."""
    parser = NcclStreamParser(command=command)
    for line in text.splitlines():
        parser.feed(line)
    return parser.result(exit_code=exit_code)


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
