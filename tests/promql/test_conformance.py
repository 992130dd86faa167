"""Prometheus 2.42's own PromQL test files, run against the agent's engine.

Each ``eval`` of ``../shared/conformance/promql/*.test`` is one test (id ``file:line``),
run as Prometheus' promqltest does (instant query, then range mode around it). A case
whose expression ``agent.promql.parse`` rejects as outside the subset is skipped,
naming the construct; any other failure fails. :func:`test_conformance_summary` pins
the per-file numbers, so coverage can only change on purpose. A clone without
``../shared`` skips all of this with a clear reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import promqltest
from tests.conftest import SHARED

CONFORMANCE = SHARED / "conformance" / "promql"
NO_SHARED = f"{CONFORMANCE} not present: the conformance data lives beside the repository (CI has it)"
CASES = promqltest.collect(CONFORMANCE) if CONFORMANCE.is_dir() else []

#: Files the subset must cover to >= 90 % (DESIGN.md decision 2).
CORE = ("functions", "operators", "aggregators", "histograms", "selectors", "staleness", "literals")

#: file -> (cases, run, {construct: excluded cases}); every run case must pass.
EXPECTED: dict[str, tuple[int, int, dict[str, int]]] = {
    "aggregators.test": (83, 83, {}),
    "at_modifier.test": (33, 33, {}),
    "collision.test": (2, 2, {}),
    "functions.test": (207, 205, {"function holt_winters": 2}),
    "histograms.test": (38, 38, {}),
    "literals.test": (20, 20, {}),
    "operators.test": (94, 94, {}),
    "selectors.test": (31, 31, {}),
    "staleness.test": (14, 14, {}),
    "subquery.test": (25, 25, {}),
    "trig_functions.test": (19, 19, {}),
}


def _params() -> list[object]:
    if not CASES:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_SHARED), id="absent")]
    return [pytest.param(case, id=case.id) for case in CASES]


@pytest.mark.parametrize("case", _params())
def test_case(case: promqltest.Case) -> None:
    """One promqltest eval: passes, or is outside the subset by a named construct."""
    outcome = promqltest.run_case(case)
    if outcome.status == "excluded":
        pytest.skip(f"outside the engine's subset: {outcome.detail}")
    assert outcome.status == "passed", f"{case.id}: {case.expr}\n{outcome.detail}"


def test_conformance_summary() -> None:
    """Per file: the pinned case/run/exclusion numbers, all run cases passing, and
    >= 90 % of the cases of the core files inside the subset."""
    if not CASES:
        pytest.skip(NO_SHARED)
    summary = promqltest.summarize(CASES)
    print(promqltest.format_table(summary))
    got = {name: (s.cases, s.run, dict(s.excluded)) for name, s in summary.items()}
    assert got == EXPECTED
    assert all(s.failed == 0 for s in summary.values())
    for stem in CORE:
        assert summary[f"{stem}.test"].coverage >= 0.9, stem


def test_runner_detects_wrong_expectations(tmp_path: Path) -> None:
    """The runner fails a case whose expected value, labels, order or error is wrong
    (so a passing suite means something)."""
    (tmp_path / "bad.test").write_text(
        'load 5m\n  m{a="1"} 0+10x10\n  m{a="2"} 0+20x10\n\n'
        'eval instant at 50m m\n  m{a="1"} 100\n  m{a="2"} 201\n\n'
        'eval instant at 50m m\n  {a="1"} 100\n  m{a="2"} 200\n\n'
        'eval_ordered instant at 50m sort(m)\n  m{a="2"} 200\n  m{a="1"} 100\n\n'
        "eval_fail instant at 50m m\n\n"
        "eval instant at 50m sum(m)\n  3\n\n"
        "eval instant at 50m holt_winters(m[10m], 0.5, 0.5)\n\n"
        "eval instant at 50m sum(m)\n  {} 300\n",
        encoding="utf-8",
    )
    cases = promqltest.collect(tmp_path)
    statuses = [promqltest.run_case(c).status for c in cases]
    assert statuses == ["failed", "failed", "failed", "failed", "failed", "excluded", "passed"]
