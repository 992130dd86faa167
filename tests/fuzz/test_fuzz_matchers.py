"""Fuzz the two matcher grammars: Alertmanager matchers (agent.matchers) raise only ValueError,
PromQL selectors (agent.promql.parse) raise only PromQLError, whatever the text."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from agent.errors import PromQLError
from agent.matchers import matches_all, parse_matcher, parse_matchers
from agent.promql import parse
from tests.fuzz import budget

_OP = st.sampled_from(["=", "!=", "=~", "!~", "==", "~", ""])
_REGEXISH = st.lists(st.sampled_from([*"ab.*+?()[]{}|^$\\-:,dwsz0123456789", "(?i)", "(?=", "[[:alpha:]]", "\\p",
                                     "\\d", "{,3}", "\\z"]), max_size=8).map("".join)
_VALUE = st.one_of(st.text(max_size=10), _REGEXISH)
_NAME = st.one_of(st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,8}", fullmatch=True), st.text(max_size=5))
_QUOTE = st.sampled_from(['"', "", "'", "`"])


@st.composite
def _matcher_text(draw: st.DrawFn) -> str:
    q = draw(_QUOTE)
    return f"{draw(_NAME)}{draw(st.sampled_from(['', ' ']))}{draw(_OP)}{q}{draw(_VALUE)}{q}"


_MATCHERS = st.one_of(
    st.text(max_size=40),
    st.lists(_matcher_text(), max_size=4).map(lambda ms: "{" + ", ".join(ms) + "}"),
    st.lists(_matcher_text(), max_size=4).map(",".join),
)


@budget(800)
@given(text=st.one_of(_matcher_text(), st.text(max_size=30)))
def test_parse_matcher_raises_only_value_error(text: str) -> None:
    """parse_matcher either returns a matcher that can match, or raises ValueError."""
    try:
        m = parse_matcher(text)
    except ValueError:
        return
    matches_all([m], {m.name: "x"})


@budget(600)
@given(text=_MATCHERS)
def test_parse_matchers_raises_only_value_error(text: str) -> None:
    """parse_matchers (the list form) raises only ValueError."""
    with contextlib.suppress(ValueError):
        parse_matchers(text)


@st.composite
def _selector(draw: st.DrawFn) -> str:
    body = ", ".join(draw(st.lists(_matcher_text(), max_size=3)))
    rng = draw(st.sampled_from(["", "[5m]", "[1h:1m]", "[5]", " offset 5m", " @ 100", "[", "}"]))
    return f"{draw(st.one_of(st.just(''), _NAME))}{{{body}}}{rng}"


@budget(500)
@given(text=st.one_of(_selector(), st.text(max_size=30)))
def test_promql_selector_parse_raises_only_promql_error(text: str) -> None:
    """agent.promql.parse on selector-like or arbitrary text raises only PromQLError (or UnsupportedError)."""
    with contextlib.suppress(PromQLError):
        parse(text)
