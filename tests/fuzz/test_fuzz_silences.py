"""Fuzz the silence API of a running agent: POST /api/v1/silences with any body answers 200
or 400 within a few seconds, never 500, and the agent goes on answering.

One agent (in-memory state, no targets, HTTP on 127.0.0.1:0) serves every example: it runs
on an event loop in a thread of its own and each example posts to it and waits for the
answer with a deadline, so a hang fails the example instead of the suite.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import budget
from tests.fuzz.running import JSON_VALUES, RunningAgent

SILENCES = "/api/v1/silences"


@pytest.fixture(scope="module")
def running() -> Iterator[RunningAgent]:
    """One agent for all examples of this module."""
    agent = RunningAgent("fuzz-agent")
    yield agent
    agent.close()


_JSON = JSON_VALUES
_MATCHER = st.one_of(st.sampled_from(['alertname="X"', "severity=~\"crit.*\"", "a!=b", "nonsense", 'x=~"("', ""]),
                     st.text(max_size=15))
_DURATION = st.one_of(st.sampled_from(["1h", "2h30m", "0s", "-1h", "10000000000000000d", "1y", "5", ""]),
                      _JSON)
_ENDS_AT = st.one_of(st.floats(), st.integers(), st.sampled_from(["4102444800", "nan", "inf", "1e300", "soon"]),
                     _JSON)


@st.composite
def _silence_body(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies shaped like a silence, each field right, wrong or missing."""
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["matchers"] = draw(st.one_of(st.lists(_MATCHER, max_size=3), _JSON))
    if draw(st.booleans()):
        body["duration"] = draw(_DURATION)
    if draw(st.booleans()):
        body["endsAt"] = draw(_ENDS_AT)
    for key in ("comment", "createdBy"):
        if draw(st.booleans()):
            body[key] = draw(_JSON)
    return body


_BODY = st.one_of(
    _silence_body().map(lambda b: json.dumps(b).encode()),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)

@budget(60)
@given(data=_BODY)
def test_any_silence_body_answers_200_or_400(running: RunningAgent, data: bytes) -> None:
    """Any POST body gets 200 with a silence id or 400 with an error, in the API's envelope."""
    status, body = running.post(SILENCES, data)
    assert status in (200, 400), (status, body)
    assert body["status"] == ("success" if status == 200 else "error")


_SAFE_BODY = st.fixed_dictionaries(
    {"matchers": st.one_of(st.lists(_MATCHER, max_size=3), _JSON)},
    optional={"duration": st.one_of(st.sampled_from(["1h", "2h30m", "0s", "-1h", "1y", "5", ""]), st.text(max_size=6)),
              "comment": _JSON, "createdBy": _JSON},
)


@budget(40)
@given(body=_SAFE_BODY)
def test_silence_bodies_without_the_known_500s_answer_200_or_400(running: RunningAgent,
                                                                 body: dict[str, Any]) -> None:
    """Bodies that avoid the known 500s (no endsAt, sane durations) always get 200 or 400."""
    status, answer = running.post(SILENCES, json.dumps(body).encode())
    assert status in (200, 400), (status, answer)
