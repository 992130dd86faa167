"""Text-format conformance: prometheus/common's expfmt cases, and a differential test
against prometheus_client's parser.

The cases live in ../shared/conformance/expfmt (beside the repository, as CI has it); a
clone without ../shared skips them. The differential test also runs on the vLLM captures
in tests/fixtures/vllm/, which the repository carries itself.
"""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect.exposition import parse
from agent.errors import ExpositionError
from tests.conftest import FIXTURES, SHARED

EXPFMT = SHARED / "conformance" / "expfmt"
CASES = EXPFMT / "cases"
VLLM = FIXTURES / "vllm"
#: Counter families declared in a payload (for undoing prometheus_client's renaming).
_COUNTER_TYPE = re.compile(r"^[ \t]*#[ \t]*TYPE[ \t]+(\S+)[ \t]+counter[ \t]*$", re.MULTILINE | re.IGNORECASE)
NO_SHARED = f"{EXPFMT} not present: the conformance data lives beside the repository (CI has it)"


def _cases(good: bool) -> list[str]:
    if not CASES.is_dir():
        return ["<absent>"]
    names = sorted(p.name for p in CASES.iterdir())
    return [n for n in names if (n == "minimal" or n.startswith("from_test_parse_")) and ("_error_" in n) != good]


def _read(name: str) -> str:
    if not CASES.is_dir():
        pytest.skip(NO_SHARED)
    return (CASES / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("case", _cases(good=True))
def test_good_case_parses(case: str) -> None:
    """Every from_test_parse_N case and `minimal` parse without error."""
    parse(_read(case))


@pytest.mark.parametrize("case", _cases(good=False))
def test_error_case_is_rejected(case: str) -> None:
    """Every from_test_parse_error_N case raises ExpositionError."""
    with pytest.raises(ExpositionError):
        parse(_read(case))


#: Error cases whose only defect is the missing final newline: Go reports "unexpected end
#: of input stream" for them; with the newline added they are fine.
ONLY_MISSING_NEWLINE = {"from_test_parse_error_0"}


def _truncated_error_cases() -> list[str]:
    """Error cases that also lack a final newline, less those whose only defect that is."""
    cases = _cases(good=False)
    if not CASES.is_dir():
        return cases
    return [c for c in cases if c not in ONLY_MISSING_NEWLINE and not (CASES / c).read_text().endswith("\n")]


@pytest.mark.parametrize("case", _truncated_error_cases())
def test_error_case_is_rejected_for_its_own_defect_too(case: str) -> None:
    """Most error cases also lack a final newline; with one added, each is still rejected,
    for its own defect rather than as a truncated body."""
    with pytest.raises(ExpositionError) as info:
        parse(_read(case) + "\n")
    assert "truncated" not in info.value.message


def test_only_missing_newline_cases_are_fine_with_one() -> None:
    """The cases listed as newline-only defects parse once the newline is added."""
    for case in ONLY_MISSING_NEWLINE:
        parse(_read(case) + "\n")


def test_prometheus_self_scrape_parses() -> None:
    """A real 322-line Prometheus /metrics parses, with every sample and family type."""
    path = EXPFMT / "prometheus_self_scrape.txt"
    if not path.exists():
        pytest.skip(NO_SHARED)
    families = parse(path.read_text(encoding="utf-8"))
    assert sum(len(f.samples) for f in families) == 248
    assert {f.type for f in families} >= {"counter", "gauge", "summary"}


# -- differential test against prometheus_client ------------------------------------------
Row = tuple[str, tuple[tuple[str, str], ...], object, int | None]


def _ours(text: str) -> list[Row]:
    rows: list[Row] = []
    for family in parse(text):
        for s in family.samples:
            rows.append((s.name, tuple(sorted(s.labels.items())), _value(s.value), s.timestamp_ms))
    return sorted(rows, key=repr)


def _theirs(text: str) -> list[Row]:
    """prometheus_client's samples, normalised to our conventions.

    Known differences, normalised here rather than hidden:
    * timestamps: prometheus_client reports float seconds (ms / 1000); we report integer ms.
    * values: prometheus_client returns an int when the text parses as one ("08" -> 8).
    * counters: for a family typed `counter` whose name lacks `_total`, prometheus_client
      renames every sample to `<name>_total` (its OpenMetrics-style internal model); the
      text on the wire, and the Go parser, keep `<name>`. We strip the added suffix back.
    """
    renamed = {f"{name}_total" for name in _COUNTER_TYPE.findall(text) if not name.endswith("_total")}
    rows: list[Row] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name[: -len("_total")] if family.type == "counter" and s.name in renamed else s.name
            ts = None if s.timestamp is None else round(float(s.timestamp) * 1000)
            rows.append((name, tuple(sorted(s.labels.items())), _value(s.value), ts))
    return sorted(rows, key=repr)


def _value(v: float) -> object:
    return "NaN" if math.isnan(v) else float(v)


def _differential_inputs() -> list[str]:
    inputs = [f"fixture:{p.name}" for p in sorted(VLLM.glob("*_metrics.txt"))]
    inputs += [f"case:{c}" for c in _cases(good=True)]
    return [*inputs, "shared:prometheus_self_scrape.txt"]


def _load(source: str) -> str:
    kind, name = source.split(":", 1)
    if kind == "fixture":
        return (VLLM / name).read_text(encoding="utf-8")
    if not EXPFMT.is_dir():
        pytest.skip(NO_SHARED)
    return _read(name) if kind == "case" else (EXPFMT / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("source", _differential_inputs())
def test_samples_agree_with_prometheus_client(source: str) -> None:
    """On inputs both accept, every sample (name, labels, value with NaN == NaN, timestamp)
    is the same in our parse and in prometheus_client's."""
    text = _load(source)
    assert _ours(text) == _theirs(text)


#: Go rejects these error cases; prometheus_client (a self-declared "laxer parser than the
#: main Go parser") accepts them. We side with Go. Each entry says what it overlooks.
PROMETHEUS_CLIENT_LAXER = {
    "from_test_parse_error_0": "reads a body without its final newline (a truncated scrape)",
    "from_test_parse_error_1": "keeps the invalid escape \\t in a label value as-is",
    "from_test_parse_error_9": "takes a float timestamp (2.72)",
    "from_test_parse_error_10": "ignores a third token after value and timestamp",
    "from_test_parse_error_12": "accepts a second HELP line for one family",
    "from_test_parse_error_13": "accepts a second TYPE line for one family",
    "from_test_parse_error_14": "accepts a TYPE line after the family's samples",
    "from_test_parse_error_17": "accepts the metric name @invalidmetric",
    "from_test_parse_error_19": "does not check that a histogram's le label is a number",
    "from_test_parse_error_7": "does not check that a summary's quantile label is a number",
}


def test_prometheus_client_laxness_is_documented() -> None:
    """Every Go error case prometheus_client accepts is listed (with why) in
    PROMETHEUS_CLIENT_LAXER, and we reject each of them."""
    if not CASES.is_dir():
        pytest.skip(NO_SHARED)
    accepted = set()
    for case in _cases(good=False):
        text = _read(case)
        try:
            for family in text_string_to_metric_families(text):
                list(family.samples)
        except Exception:  # prometheus_client raises bare ValueError and friends
            continue
        accepted.add(case)
        with pytest.raises(ExpositionError):
            parse(text)
    assert accepted <= set(PROMETHEUS_CLIENT_LAXER), sorted(accepted - set(PROMETHEUS_CLIENT_LAXER))
