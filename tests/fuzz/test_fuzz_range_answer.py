"""Fuzz the range-answer validator (agent.promql.answer): any JSON, and any near-matrix, either parses into
series that a plot can draw (integer ms times within 1970-9999, float values, string labels) or raises
SourceError, the one documented error; nothing else escapes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.errors import SourceError
from agent.promql.answer import MAX_TIMESTAMP_S, decode, parse_range_response
from tests.fuzz import budget

_scalars = (st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=12)
            | st.sampled_from(["NaN", "+Inf", "-Inf", "1e300", "1", "0x10", "", "matrix", "vector", "success"]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8) | st.sampled_from(["metric", "values", "result"]), inner,
                                       max_size=4), max_leaves=20)
_point = st.lists(_scalars | st.floats(0, MAX_TIMESTAMP_S * 2), min_size=0, max_size=3) | _json
_series = st.fixed_dictionaries({"metric": st.dictionaries(st.text(max_size=6), _scalars, max_size=3) | _json,
                                 "values": st.lists(_point, max_size=4) | _json}) | _json
_near_matrix = st.builds(lambda kind, result, status: {"status": status,
                                                       "data": {"resultType": kind, "result": result}},
                         st.sampled_from(["matrix", "vector", "scalar"]) | _scalars, st.lists(_series, max_size=3)
                         | _json, st.sampled_from(["success", "error"]))


def _holds(body: Any) -> None:
    try:
        series, warnings, partial = parse_range_response(body)
    except SourceError:
        return
    assert isinstance(partial, bool) and all(isinstance(w, str) for w in warnings)
    for labels, ts, vs in series:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        assert len(ts) == len(vs)
        assert all(isinstance(t, int) and 0 <= t <= MAX_TIMESTAMP_S * 1000 for t in ts)
        assert all(isinstance(v, float) for v in vs)


@budget(80)
@given(_json)
def test_any_json_parses_or_raises_source_error(body: Any) -> None:
    """Any decoded JSON value is series or one SourceError."""
    _holds(body)


@budget(80)
@given(_near_matrix)
def test_any_near_matrix_parses_or_raises_source_error(body: Any) -> None:
    """A matrix-shaped answer with any points, labels and kinds is series or one SourceError."""
    _holds(body)


@budget(50)
@given(st.binary(max_size=64) | _near_matrix.map(lambda b: json.dumps(b).encode()))
def test_any_bytes_decode_or_raise_source_error(raw: bytes) -> None:
    """Any body (not JSON, truncated, valid) decodes and parses or raises SourceError."""
    try:
        body = decode(raw)
    except SourceError:
        return
    _holds(body)
