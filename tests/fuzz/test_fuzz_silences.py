"""Fuzz the silence API of a running agent: POST /api/v1/silences with any body answers 200
or 400 within a few seconds, never 500, and the agent goes on answering.

One agent (in-memory state, no targets, HTTP on 127.0.0.1:0) serves every example: it runs
on an event loop in a thread of its own and each example posts to it and waits for the
answer with a deadline, so a hang fails the example instead of the suite.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.app.daemon import Agent
from agent.config import Config
from tests.fake_pynvml import FakeNvml
from tests.fuzz import budget

T = TypeVar("T")
ANSWER_S = 10.0


class _RunningAgent:
    """An Agent serving HTTP on a background event loop, with a client session on the same loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-agent", daemon=True)
        self._thread.start()
        config = Config.model_validate({"targets": [], "server": {"listen": "127.0.0.1:0"},
                                        "state": {"path": ":memory:"}, "nvml": {"enabled": False}})
        self.agent = Agent(config, nvml_module=FakeNvml().module, hostname="fuzz")
        self.run(self.agent.start())
        self.base = f"http://127.0.0.1:{self.agent.port}"
        self.http = self.run(self._session())

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ANSWER_S))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=ANSWER_S + 5)

    def post(self, data: bytes) -> tuple[int, dict[str, Any]]:
        async def go() -> tuple[int, dict[str, Any]]:
            async with self.http.post(f"{self.base}/api/v1/silences", data=data,
                                      headers={"Content-Type": "application/json"}) as r:
                text = await r.text()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = {"status": "not JSON", "text": text[:200]}
            return r.status, answer if isinstance(answer, dict) else {"status": "not an object"}
        return self.run(go())

    def close(self) -> None:
        self.run(self.http.close())
        self.run(self.agent.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=ANSWER_S)
        self.loop.close()


@pytest.fixture(scope="module")
def running() -> Iterator[_RunningAgent]:
    """One agent for all examples of this module."""
    agent = _RunningAgent()
    yield agent
    agent.close()


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=10)
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
def test_any_silence_body_answers_200_or_400(running: _RunningAgent, data: bytes) -> None:
    """Any POST body gets 200 with a silence id or 400 with an error, in the API's envelope."""
    status, body = running.post(data)
    assert status in (200, 400), (status, body)
    assert body["status"] == ("success" if status == 200 else "error")


_SAFE_BODY = st.fixed_dictionaries(
    {"matchers": st.one_of(st.lists(_MATCHER, max_size=3), _JSON)},
    optional={"duration": st.one_of(st.sampled_from(["1h", "2h30m", "0s", "-1h", "1y", "5", ""]), st.text(max_size=6)),
              "comment": _JSON, "createdBy": _JSON},
)


@budget(40)
@given(body=_SAFE_BODY)
def test_silence_bodies_without_the_known_500s_answer_200_or_400(running: _RunningAgent,
                                                                 body: dict[str, Any]) -> None:
    """Bodies that avoid the known 500s (no endsAt, sane durations) always get 200 or 400."""
    status, answer = running.post(json.dumps(body).encode())
    assert status in (200, 400), (status, answer)
