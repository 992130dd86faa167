"""A runner for Prometheus' promqltest files (the 2.42 format) against ``agent.promql``.

Prometheus specifies PromQL's behaviour in ``promql/testdata/*.test``: ``load <interval>``
blocks of series in the expanding notation, ``clear``, and ``eval instant at <time>
<expr>`` (``eval_ordered``, ``eval_fail``) followed by the expected series or scalar.
This module reads those files into one :class:`Case` per eval command, runs a case the
way Prometheus' own test does (the instant query, then the same query in range mode
from one minute before to one minute after, whose middle step must agree), and
summarises a directory per file: cases run, passed, and excluded because
``agent.promql.parse`` rejects a named construct outside the engine's subset.

Run ``python -m tests.promqltest [DIR]`` to print the summary table.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import PromQLError, UnsupportedError
from agent.promql import Engine, Scalar, parse
from agent.promql.notation import parse_series_line
from agent.series import Labels, labels_str
from agent.store import Store

__all__ = ["Case", "FileSummary", "Outcome", "collect", "format_table", "parse_file", "run_case", "summarize"]

_MIN_NORMAL = 2.2250738585072014e-308
_EPSILON = 1e-6  # Prometheus' promqltest: relative error allowed for sample values
_RETENTION_MS = 10 * 365 * 86_400_000


@dataclass(frozen=True, slots=True)
class Load:
    interval_ms: int
    series: tuple[tuple[Labels, tuple[float | None, ...]], ...]


@dataclass(frozen=True, slots=True)
class Case:
    """One ``eval`` command and the data loaded before it (since the last ``clear``)."""

    file: str
    line: int
    expr: str
    at_ms: int
    fail: bool
    ordered: bool
    scalar: float | None  # an expected scalar result, else ``expected`` lists series
    expected: tuple[tuple[Labels, float], ...]
    loads: tuple[Load, ...] = field(repr=False)
    state: tuple[str, int, int] = field(repr=False)  # (path, clear-segment, loads so far)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # "passed" | "failed" | "excluded"
    detail: str = ""  # the failure, or the construct that excluded the case


@dataclass(slots=True)
class FileSummary:
    cases: int = 0
    passed: int = 0
    failed: int = 0
    excluded: Counter[str] = field(default_factory=Counter)

    @property
    def run(self) -> int:
        return self.passed + self.failed

    @property
    def coverage(self) -> float:
        return self.run / self.cases if self.cases else 1.0


_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)


def _duration_ms(text: str) -> int:
    """Prometheus' ``model.ParseDuration`` (``1h30m``, ``10s``, ``0``), in ms."""
    m = _DURATION.fullmatch(text)
    if text == "0":
        return 0
    if not text or m is None:
        raise ValueError(f"bad duration {text!r}")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _UNIT_MS, strict=True) if g)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_file(path: Path) -> list[Case]:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").split("\n")]
    lines = ["" if ln.startswith("#") else ln for ln in lines]
    cases: list[Case] = []
    loads: list[Load] = []
    segment = 0
    i = 0
    while i < len(lines):
        text = lines[i]
        if not text:
            i += 1
            continue
        word = text.split(maxsplit=1)[0].lower()
        if word == "clear":
            loads, segment = [], segment + 1
            i += 1
        elif word == "load":
            series: dict[Labels, tuple[float | None, ...]] = {}
            i += 1
            while i < len(lines) and lines[i]:
                labels, values = parse_series_line(lines[i])
                series[labels] = tuple(values)  # a repeated series replaces the earlier one
                i += 1
            loads.append(Load(_duration_ms(text.split(maxsplit=1)[1]), tuple(series.items())))
        elif word.startswith("eval"):
            case, i = _parse_eval(path.name, lines, i, tuple(loads), (str(path), segment, len(loads)))
            cases.append(case)
        else:
            raise ValueError(f"{path.name}:{i + 1}: invalid command {text!r}")
    return cases


def _parse_eval(
    name: str, lines: list[str], i: int, loads: tuple[Load, ...], state: tuple[str, int, int]
) -> tuple[Case, int]:
    head = lines[i]
    command, kind, rest = head.split(maxsplit=2)
    if kind != "instant" or not rest.startswith("at "):
        raise ValueError(f"{name}:{i + 1}: only 'eval instant at <time> <expr>' is supported: {head!r}")
    _, at, expr = rest.split(maxsplit=2)
    scalar: float | None = None
    expected: list[tuple[Labels, float]] = []
    line = i + 1
    i += 1
    while i < len(lines) and lines[i]:
        number = _number(lines[i])
        if number is not None:
            scalar = number
            i += 1
            break
        labels, values = parse_series_line(lines[i])
        if len(values) != 1 or values[0] is None:
            raise ValueError(f"{name}:{i + 1}: an instant evaluation expects one value per series")
        expected.append((labels, values[0]))
        i += 1
    case = Case(
        name,
        line,
        expr,
        _duration_ms(at),
        command == "eval_fail",
        command == "eval_ordered",
        scalar,
        tuple(expected),
        loads,
        state,
    )
    return case, i


def collect(directory: Path) -> list[Case]:
    """Every case of every ``*.test`` file in ``directory``, in file order."""
    return [case for path in sorted(directory.glob("*.test")) for case in parse_file(path)]


_STORES: dict[tuple[str, int, int], Store] = {}


def _store(case: Case) -> Store:
    store = _STORES.get(case.state)
    if store is None:
        store = Store(_RETENTION_MS)
        for load in case.loads:
            for labels, values in load.series:
                for n, v in enumerate(values):
                    if v is not None:
                        store.append(labels, n * load.interval_ms, v)
        _STORES[case.state] = store
    return store


def almost_equal(a: float, b: float) -> bool:
    """Prometheus' promqltest comparison: NaN equals NaN, else relative error < 1e-6."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or diff < _MIN_NORMAL:
        return diff < _EPSILON * _MIN_NORMAL
    return diff / (abs(a) + abs(b)) < _EPSILON


def _compare(case: Case, result: object) -> str | None:
    if case.scalar is not None:
        if not isinstance(result, Scalar):
            return f"expected scalar {case.scalar}, got {result!r}"
        return None if almost_equal(case.scalar, result.value) else f"expected scalar {case.scalar}, got {result.value}"
    if not isinstance(result, list):
        return f"expected a vector, got {result!r}"
    want = {labels: (pos, value) for pos, (labels, value) in enumerate(case.expected)}
    seen: set[Labels] = set()
    for pos, sample in enumerate(result):
        labels = getattr(sample, "labels", None)
        if labels not in want:
            return f"unexpected series {labels_str(labels or ())} {getattr(sample, 'value', sample)} in the result"
        exp_pos, exp_value = want[labels]
        if case.ordered and exp_pos != pos:
            return f"expected {labels_str(labels)} at position {exp_pos + 1}, found at {pos + 1}"
        if not almost_equal(exp_value, sample.value):
            return f"expected {exp_value} for {labels_str(labels)}, got {sample.value}"
        seen.add(labels)
    missing = [labels_str(labels) for labels in want if labels not in seen]
    return f"expected series not in the result: {', '.join(missing)}" if missing else None


def _run(case: Case) -> Outcome:
    try:
        expr = parse(case.expr)
    except UnsupportedError as exc:
        return Outcome("excluded", exc.construct)
    except PromQLError as exc:
        return Outcome("failed", f"parse error: {exc}")
    engine = Engine(_store(case))
    try:
        result = engine.instant(expr, case.at_ms)
    except PromQLError as exc:
        return Outcome("passed") if case.fail else Outcome("failed", f"evaluation error: {exc}")
    if case.fail:
        return Outcome("failed", "expected an evaluation error, got none")
    problem = _compare(case, result)
    if problem:
        return Outcome("failed", problem)
    try:  # Prometheus also runs the query in range mode and checks the middle step.
        matrix = engine.range(expr, case.at_ms - 60_000, case.at_ms + 60_000, 60_000)
    except PromQLError as exc:
        return Outcome("failed", f"range mode: evaluation error: {exc}")
    if case.ordered:
        return Outcome("passed")  # ordering is not defined for range queries
    middle = [_Point(s.labels, s.values[s.ts.index(case.at_ms)]) for s in matrix if case.at_ms in s.ts]
    ranged: object = Scalar(middle[0].value) if isinstance(result, Scalar) and middle else middle
    problem = _compare(case, ranged)
    return Outcome("failed", f"range mode: {problem}") if problem else Outcome("passed")


@dataclass(frozen=True, slots=True)
class _Point:
    labels: Labels
    value: float


_OUTCOMES: dict[tuple[str, int], Outcome] = {}


def run_case(case: Case) -> Outcome:
    """Run one case (memoised, so the per-case tests and the summary share the work)."""
    key = (case.state[0], case.line)
    outcome = _OUTCOMES.get(key)
    if outcome is None:
        outcome = _OUTCOMES[key] = _run(case)
    return outcome


def summarize(cases: list[Case]) -> dict[str, FileSummary]:
    summary: dict[str, FileSummary] = {}
    for case in cases:
        s = summary.setdefault(case.file, FileSummary())
        s.cases += 1
        outcome = run_case(case)
        if outcome.status == "excluded":
            s.excluded[outcome.detail] += 1
        elif outcome.status == "passed":
            s.passed += 1
        else:
            s.failed += 1
    return summary


def format_table(summary: dict[str, FileSummary]) -> str:
    rows = [f"{'file':<20} {'cases':>5} {'run':>5} {'passed':>6} {'failed':>6} {'cover':>6}  excluded (by construct)"]
    total = FileSummary()
    for name, s in summary.items():
        excluded = ", ".join(f"{c}: {n}" for c, n in sorted(s.excluded.items())) or "-"
        rows.append(f"{name:<20} {s.cases:>5} {s.run:>5} {s.passed:>6} {s.failed:>6} {s.coverage:>6.1%}  {excluded}")
        total.cases += s.cases
        total.passed += s.passed
        total.failed += s.failed
        total.excluded.update(s.excluded)
    excluded = ", ".join(f"{c}: {n}" for c, n in sorted(total.excluded.items())) or "-"
    rows.append(
        f"{'total':<20} {total.cases:>5} {total.run:>5} {total.passed:>6} {total.failed:>6} "
        f"{total.coverage:>6.1%}  {excluded}"
    )
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    default = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "promql"
    directory = Path(argv[0]) if argv else default
    cases = collect(directory)
    summary = summarize(cases)
    print(format_table(summary))
    for case in cases:
        outcome = run_case(case)
        if outcome.status == "failed":
            print(f"FAIL {case.id} {case.expr}\n     {outcome.detail}")
    return 1 if any(s.failed for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
