"""nccl-tests output, parsed: the text ``all_reduce_perf`` (or any ``*_perf``) prints, as data.

This module reads that text, in the current format and the pre-2.x one (no ``#`` on the
header, ``error`` instead of ``#wrong``, no ``redop``/``root`` for all-gather), line by line
(:class:`NcclStreamParser`, which the runner feeds as the binary prints) or whole
(:func:`parse_nccl`), into an :class:`NcclResult`: the rows, the ranks and their hosts and
GPU models, the largest size's bus bandwidth, wrong-value counts and failure lines. It
judges nothing; :func:`agent.diagnose.nccl.judge.check` does.

A run has *failed* when it printed ``Test NCCL failure`` / ``Test CUDA failure`` /
``Test failure`` / ``Test timeout``, when the caller saw a non-zero exit, or when it
printed ``NCCL WARN`` and never reached its footer. An ``NCCL WARN`` in a run that
finished (``Could not find a path for pattern 4, falling back``) is kept as evidence
but does not fail it.

A number that is not a measurement (``inf``, ``nan``, ``1e999``, a negative size, time or
bandwidth, in a row or in the ``Avg bus bandwidth`` footer) makes no row: it is recorded in
:attr:`NcclResult.invalid` with its line, so a caller can refuse the input (``nccl --parse``
exits 2) instead of judging an infinite bandwidth healthy.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass, field

__all__ = ["COLLECTIVES", "Measurement", "NcclResult", "NcclRow", "NcclStreamParser", "parse_nccl"]

_MAX_FAILURE_LINES = 40  # failure lines an NcclResult keeps; later ones are dropped

#: The collectives nccl-tests has a ``<name>_perf`` binary for; a command line or banner names one.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "alltoallv",
               "sendrecv", "gather", "scatter", "hypercube")

_PREFIX_RE = re.compile(r"^(?:\[\d+(?:,\d+)?\]<std(?:out|err)>:|\[\d+\] ?)")
_HARD_FAILURE_RE = re.compile(r"Test (?:NCCL |CUDA )?failure|Test timeout|^#\s*error:|^\[sre-agent\]|mpirun noticed")
_ERROR_RE = re.compile(r"^#\s*error:")  # the one '#' line of nccl-tests that reports a failure
_WARN_RE = re.compile(r"NCCL WARN")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?:(\S+)\s+)?device\s+\d+\s+"
                      r"\[[^\]]*\]\s+(.+?)\s*$")
_PARAMS_RE = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes")
_COLLECTIVE_RE = re.compile(r"\b(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")_perf\b")
_GPUS_FLAG_RE = re.compile(r"_perf\b.*?\s-g\s*(\d+)")
_OOB_RE = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_AVG_RE = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)", re.IGNORECASE)
# A row starts with its size: digits, or what a broken run prints there instead (nan, inf, -8, 1e999).
_ROW_START_RE = re.compile(r"^[-+]?(?:\d|\.\d|inf|nan)", re.IGNORECASE)
_MAX_INVALID_LINES = 40  # invalid-value lines an NcclResult keeps
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
    """One result row: a message size and its out-of-place (and in-place) measurement."""

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
    """A whole run: what ran where, every row, the numbers that matter and how it ended."""

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
    invalid: list[str] = field(default_factory=list)  # "line N: busbw is inf, not a measurement"

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
        self._footer = False  # the "Avg bus bandwidth" line was seen (the run finished)
        self._lineno = 0
        self._invalid: list[str] = []
        if command:
            self._scan_command(" ".join(command))

    @property
    def rows(self) -> list[NcclRow]:
        return self._rows

    def feed(self, raw: str) -> NcclRow | None:
        self._lineno += 1
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
            self._footer = True
            try:
                self._avg = _measured("Avg bus bandwidth", m.group(1))
            except _NotMeasured as exc:
                self._note_invalid(str(exc))
            return None
        self._scan_command(line)
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            self._set_header(tokens)
            return None
        if line.lstrip().startswith("#") or not self._groups or not _ROW_START_RE.match(tokens[0]):
            return None
        try:
            row = self._parse_row(tokens)
        except _NotMeasured as exc:
            self._note_invalid(str(exc))
            return None
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
        finished = self._footer
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
            out_of_bounds=self._oob, exit_code=exit_code, hosts=hosts, invalid=list(self._invalid),
        )

    def _note_invalid(self, what: str) -> None:
        if len(self._invalid) < _MAX_INVALID_LINES:
            self._invalid.append(f"line {self._lineno}: {what}")

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
            return NcclRow(size=_whole("size", keys["size"]), count=_whole("count", keys["count"]),
                           type=keys.get("type", ""), redop=keys.get("redop", ""),
                           root=int(root) if root is not None else None,  # -1: no root (all-reduce)
                           out_of_place=halves[0], in_place=halves[1] if len(halves) > 1 else None)
        except (KeyError, ValueError):
            return None


class _NotMeasured(Exception):  # internal control flow: the row is dropped and noted, never raised out
    """A column holds a number that no measurement can be: non-finite or negative."""


def _measured(column: str, text: str) -> float:
    """``text`` as a finite number ≥ 0; :class:`ValueError` when it is not a number at all (a cut-off
    line), :class:`_NotMeasured` when it is one no run can measure (``inf``, ``nan``, ``1e999``, ``-3``)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise _NotMeasured(f"{column} is {text!r:.40}, not a measurement (a finite number ≥ 0)")
    return value


def _whole(column: str, text: str) -> int:
    """A size, element or wrong-value count: a whole number ≥ 0 (digits read exactly, past 2**53 too)."""
    if text.isdigit():
        return int(text)
    value = _measured(column, text)
    if not value.is_integer():
        raise ValueError(f"{column}: not a whole number")
    return int(value)


def _measurement(values: dict[str, str]) -> Measurement:
    time_col = "time" if "time" in values else "cputime"
    time = values.get(time_col, "nan")
    wrong_text = values.get("#wrong")
    wrong = None if wrong_text in (None, "N/A") else _whole("#wrong", wrong_text)
    error_text = values.get("error")
    error = None if error_text in (None, "N/A") else _measured("error", error_text)
    return Measurement(time_us=_measured(time_col, time), algbw_gbps=_measured("algbw", values["algbw"]),
                       busbw_gbps=_measured("busbw", values["busbw"]), wrong=wrong, max_error=error)


def parse_nccl(text: str, *, exit_code: int | None = None, command: list[str] | None = None) -> NcclResult:
    """Parse a whole nccl-tests output. ``exit_code`` (non-zero: failed) and ``command`` (names the
    collective when the text does not) come from the caller when it ran the binary."""
    parser = NcclStreamParser(command=command)
    for line in text.splitlines():
        parser.feed(line)
    return parser.result(exit_code=exit_code)
