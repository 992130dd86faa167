"""Prometheus' expanding series notation, as promqltest ``load`` blocks and promtool's
``input_series`` use it."""

from __future__ import annotations

import math

import pytest

from agent.errors import PromQLError
from agent.promql.notation import expand_values, parse_labels, parse_series_line
from agent.series import is_stale, labels_from


def test_increment_gives_n_plus_one_values() -> None:
    """``a+bxN`` expands to N+1 values, a, a+b, ..., a+N*b."""
    assert expand_values("0+10x3") == [0, 10, 20, 30]
    assert expand_values("5-2x2") == [5, 3, 1]
    assert expand_values("-2-1x2") == [-2, -3, -4]
    assert expand_values("1+0x0") == [1]


def test_repeat_shorthand() -> None:
    """``axN`` repeats a N+1 times."""
    assert expand_values("1x3") == [1, 1, 1, 1]
    assert expand_values("-1.5x1") == [-1.5, -1.5]


def test_increments_add_step_by_step_like_prometheus() -> None:
    """Values come from repeated addition, so float rounding matches Prometheus."""
    got = expand_values("0+1.33x10")
    total = 0.0
    for v in got:
        assert v == total
        total += 1.33


def test_blanks_and_stale() -> None:
    """``_`` is a missing sample (None), ``_xN`` N of them; ``stale`` is the marker NaN."""
    got = expand_values("1 _ _x3 stale 2")
    assert got[:5] == [1, None, None, None, None]
    assert got[5] is not None and is_stale(got[5])
    assert got[6] == 2


def test_special_numbers() -> None:
    """Inf, NaN (any case), signs, exponents, leading/trailing dots."""
    got = expand_values("Inf -Inf +inf NaN nan 1e3 2.5e-2 .5 2. +7")
    assert got[:3] == [math.inf, -math.inf, math.inf]
    assert got[3] is not None and math.isnan(got[3]) and not is_stale(got[3])
    assert got[4] is not None and math.isnan(got[4])
    assert got[5:] == [1000, 0.025, 0.5, 2.0, 7]
    assert expand_values("1e3x1") == [1000, 1000]


@pytest.mark.parametrize("bad", ["abc", "1x", "1+x3", "0x1F", "1+1", "_+1x2", "--1"])
def test_bad_values_are_rejected(bad: str) -> None:
    """Anything outside the notation raises PromQLError naming the item."""
    with pytest.raises(PromQLError, match="bad series value"):
        expand_values(bad)


def test_series_line_with_labels() -> None:
    """``metric{labels} values`` gives sorted labels incl. __name__, then the values."""
    labels, vals = parse_series_line('http_requests{job="api", instance="0"}\t0+10x2 _ 5')
    assert labels == labels_from("http_requests", {"job": "api", "instance": "0"})
    assert vals == [0, 10, 20, None, 5]


def test_series_line_forms() -> None:
    """Bare names (with colons), label-only sets, __name__ as a label, quoting styles,
    escapes and trailing commas are all accepted."""
    assert parse_series_line("vllm:num_requests_running 3") == (labels_from("vllm:num_requests_running"), [3])
    assert parse_series_line('{__name__="up", job="x"} 1')[0] == labels_from("up", {"job": "x"})
    assert parse_series_line("{} 1") == ((), [1])
    labels, _ = parse_series_line('m{a=\'single\', b=`raw\\n`, c="q\\"t\\n", d="\\u00e9",} 1')
    assert dict(labels) == {"__name__": "m", "a": "single", "b": "raw\\n", "c": 'q"t\n', "d": "é"}


def test_series_line_without_values() -> None:
    """A description may carry no values at all."""
    assert parse_series_line("m{a='1'}") == (labels_from("m", {"a": "1"}), [])


@pytest.mark.parametrize("bad", ['m{a="1" 1', "m{a=1} 1", '{a="1"}x 1', "1 2", 'm{a="unterminated} 1'])
def test_bad_labels_are_rejected(bad: str) -> None:
    """Malformed label sets raise PromQLError."""
    with pytest.raises(PromQLError):
        parse_series_line(bad)


def test_parse_labels_reports_where_labels_end() -> None:
    """parse_labels returns the index after the label set, for callers that split."""
    labels, end = parse_labels('  m{a="1"} 7')
    assert labels == labels_from("m", {"a": "1"})
    assert end == len('  m{a="1"}')
