"""Tests for agent.app.ui.throttle: failed logins per client, back-off, and the login form under it."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agent.app.daemon import Agent
from agent.app.ui.throttle import LoginThrottle
from agent.config import Config
from tests.alertmanager import eventually

TOKEN = "throttle-test-token-0123"


class _Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("failures", "wait"), [(1, 0.0), (4, 0.0), (5, 0.0), (6, 1.0), (7, 2.0), (8, 4.0),
                                                (13, 128.0), (14, 256.0), (15, 300.0), (60, 300.0)])
def test_waits_double_after_the_free_failures_up_to_the_cap(failures: int, wait: float) -> None:
    """Five wrong tokens are free; then each failure doubles the wait from 1 s, capped at 5 minutes."""
    clock = _Clock()
    throttle = LoginThrottle(clock=clock)
    waits = []
    for _ in range(failures):
        clock.t += throttle.wait_s("10.0.0.1")  # a patient guesser: tries as soon as allowed
        waits.append(throttle.failed("10.0.0.1"))
    assert waits[-1] == wait
    assert throttle.wait_s("10.0.0.1") == wait and throttle.wait_s("10.0.0.2") == 0.0


def test_success_clears_quiet_clients_are_forgotten_and_records_are_capped() -> None:
    """A right token clears a client's record; one quiet for long starts afresh; past the cap the least
    recently failing client is forgotten first."""
    clock = _Clock()
    throttle = LoginThrottle(clock=clock, free=1, max_clients=2)
    throttle.failed("a")
    assert throttle.failed("a") == 1.0
    throttle.succeeded("a")
    assert throttle.wait_s("a") == 0.0 and throttle.failed("a") == 0.0
    assert throttle.failed("b") == 0.0 and throttle.failed("b") == 1.0
    clock.t += 601 + 1
    assert throttle.wait_s("b") == 0.0 and throttle.failed("b") == 0.0  # forgotten: free again
    throttle.failed("c")
    throttle.failed("d")  # the cap of 2: a (the least recent) goes
    assert len(throttle) == 2 and throttle.failed("a") == 0.0


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    a = Agent(Config.model_validate({"targets": [], "server": {"listen": "127.0.0.1:0", "auth": {
        "bearer_token_env": "TOK"}}, "nvml": {"enabled": False}, "state": {"path": str(tmp_path / "s.db")}},
        context={"environ": {"TOK": TOKEN}}))
    await a.start()
    yield a
    await a.stop()


@pytest.mark.parametrize("guess", ["", "wrong", TOKEN[:-1], TOKEN + "x", "x" * 5000])
async def test_login_backs_off_after_wrong_tokens(agent: Agent, guess: str) -> None:
    """After five wrong tokens the login answers with Retry-After; inside the wait even the right token
    is not checked (429); once the wait is over the right token logs in."""
    base = f"http://127.0.0.1:{agent.port}"
    origin = {"Origin": base}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/login") as r:
            found = re.search(r'name="csrf" value="([0-9a-f]{64})"', await r.text())
        assert found
        csrf = found.group(1)

        async def login(token: str) -> tuple[int, str | None]:
            async with http.post(f"{base}/login", data={"csrf": csrf, "token": token, "next": "/silences"},
                                 headers=origin, allow_redirects=False) as r:
                return r.status, r.headers.get("Retry-After")

        free = [await login(guess) for _ in range(5)]
        sixth = await login(guess)
        t_sixth = time.monotonic()
        inside = await login(TOKEN)

        async def logged_in() -> tuple[int, str | None] | None:
            answer = await login(TOKEN)
            return answer if answer[0] == 303 else None

        after = await eventually(logged_in, timeout=15, what="the login to accept the token after the wait")
        waited = time.monotonic() - t_sixth
    assert free == [(401, None)] * 5
    assert sixth == (401, "1")
    assert inside == (429, "1")
    assert after == (303, None) and waited >= 0.9
