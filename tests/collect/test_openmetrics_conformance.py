"""OpenMetrics conformance: the 211 parser cases of the OpenMetrics project.

Each case is a folder with `metrics` (the input) and `test.json` (`shouldParse`). They live
in ../shared/conformance/openmetrics/parsers (beside the repository, as CI has it); a clone
without ../shared skips them. Run with `-rP` (or `-s`) to see the summary line.
"""

from __future__ import annotations

import json

import pytest

from agent.collect.exposition import parse
from agent.errors import ExpositionError
from tests.conftest import SHARED

SUITE = SHARED / "conformance" / "openmetrics" / "parsers"
NO_SHARED = f"{SUITE} not present: the conformance data lives beside the repository (CI has it)"

#: Bad cases we do not reject yet, each with the reason; strict, so the test fails as soon
#: as one of them starts being rejected (then delete its entry). Currently none: all 167
#: bad cases are rejected.
NOT_REJECTED: dict[str, str] = {}


def _load(case: str) -> tuple[str, bool]:
    folder = SUITE / case
    meta = json.loads((folder / "test.json").read_text(encoding="utf-8"))
    assert meta["type"] == "text"
    text = (folder / meta["file"]).read_bytes().decode("utf-8")
    return text, bool(meta["shouldParse"])


def _outcome(text: str) -> str:
    try:
        parse(text, openmetrics=True)
    except ExpositionError as exc:
        return f"rejected: {exc}"
    return "parsed"


def _params() -> list[object]:
    if not SUITE.is_dir():
        return [pytest.param("<absent>", marks=pytest.mark.skip(reason=NO_SHARED))]
    params: list[object] = []
    for case in sorted(p.name for p in SUITE.iterdir() if (p / "test.json").exists()):
        reason = NOT_REJECTED.get(case)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, marks=marks, id=case))
    return params


@pytest.mark.parametrize("case", _params())
def test_case(case: str) -> None:
    """A case that should parse parses; a case that should not raises ExpositionError."""
    text, should_parse = _load(case)
    outcome = _outcome(text)
    if should_parse:
        assert outcome == "parsed", outcome
    else:
        assert outcome.startswith("rejected"), "accepted a bad case"


def test_summary() -> None:
    """All 44 good cases parse and all bad cases but the listed ones are rejected (printed)."""
    if not SUITE.is_dir():
        pytest.skip(NO_SHARED)
    cases = sorted(p.name for p in SUITE.iterdir() if (p / "test.json").exists())
    good_ok = good = bad_ok = bad = 0
    for case in cases:
        text, should_parse = _load(case)
        parsed = _outcome(text) == "parsed"
        if should_parse:
            good, good_ok = good + 1, good_ok + parsed
        else:
            bad, bad_ok = bad + 1, bad_ok + (not parsed)
    print(
        f"\nOpenMetrics parser suite: {len(cases)} cases; good parsed {good_ok}/{good}; "
        f"bad rejected {bad_ok}/{bad}; not rejected (xfail) {len(NOT_REJECTED)}"
    )
    assert (len(cases), good) == (211, 44)
    assert good_ok == good
    assert bad_ok == bad - len(NOT_REJECTED)
