"""Fuzz agent.collect.exposition: any payload parses or raises ExpositionError, and valid
payloads round-trip their names, labels, values and timestamps."""

from __future__ import annotations

import contextlib
import math

from hypothesis import given
from hypothesis import strategies as st

from agent.collect.exposition import Scanner, parse
from agent.errors import ExpositionError
from tests.fuzz import budget

# Characters the formats give meaning to, so random text hits the parser's branches often.
_ALPHABET = st.sampled_from([*list('abc_:{}="\\,# \t\n+-.0123456789eEinfINFNaHELPTYPEUNITcountergauge'), "\x00", "é"])
_PAYLOAD = st.one_of(
    st.text(_ALPHABET, max_size=300),
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")),  # what a scrape of random bytes could be
)


@budget(1000)
@given(text=_PAYLOAD, openmetrics=st.booleans())
def test_any_payload_parses_or_raises_exposition_error(text: str, openmetrics: bool) -> None:
    """parse() on arbitrary text returns families or raises ExpositionError, nothing else."""
    with contextlib.suppress(ExpositionError):
        parse(text, openmetrics=openmetrics)


@budget(600)
@given(text=_PAYLOAD, openmetrics=st.booleans(), keep_all=st.booleans())
def test_scanner_on_any_payload_raises_only_exposition_error(text: str, openmetrics: bool, keep_all: bool) -> None:
    """Scanner.scan and labels_of, as the scraper drives them, raise only ExpositionError."""
    scanner = Scanner(None if keep_all else {"a", "abc", "a_b"}, openmetrics=openmetrics)
    try:
        for series, _value, _ts in scanner.scan(text):
            scanner.labels_of(series)
    except ExpositionError:
        pass
    assert scanner.samples_total >= 0


_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
_LABEL = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("__"))
_VALUE = st.floats(allow_nan=True, allow_infinity=True)
_SAMPLE = st.tuples(st.dictionaries(_LABEL, st.text(max_size=12), max_size=4), _VALUE,
                    st.one_of(st.none(), st.integers(-(2**53), 2**53)))


def _go_float(v: float) -> str:
    return "NaN" if math.isnan(v) else "+Inf" if v == math.inf else "-Inf" if v == -math.inf else repr(v)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@budget(200)
@given(families=st.dictionaries(_NAME, st.lists(_SAMPLE, min_size=1, max_size=4, unique_by=lambda s: tuple(s[0])),
                                min_size=1, max_size=4))
def test_valid_text_payload_round_trips(
        families: dict[str, list[tuple[dict[str, str], float, int | None]]]) -> None:
    """A generated text-format payload parses back to the same series, values and timestamps."""
    lines = []
    for name, samples in families.items():
        lines.append(f"# TYPE {name} untyped")
        for labels, value, ts in samples:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{body}}} {_go_float(value)}" + (f" {ts}" if ts is not None else ""))
    parsed = parse("\n".join(lines) + "\n")
    got = {(s.name, tuple(sorted(s.labels.items()))): (s.value, s.timestamp_ms) for f in parsed for s in f.samples}
    want = {(n, tuple(sorted(lb.items()))): (v, ts) for n, ss in families.items() for lb, v, ts in ss}
    assert got.keys() == want.keys()
    for key, (value, ts) in want.items():
        got_value, got_ts = got[key]
        assert (math.isnan(got_value) and math.isnan(value)) or got_value == value
        assert got_ts == ts
