"""Test helpers: a real Alertmanager process whose webhook notifications are recorded.

The Alertmanager sink and the webhook sink are tested against the real thing, not a
mock of it: :class:`Alertmanager` starts the ``prometheus-alertmanager`` (Debian) or
``alertmanager`` binary on 127.0.0.1 with a free port, no clustering, its own storage
directory and a config that routes every alert to a recording server this helper runs
(:class:`tests.receivers.RecordingServer`), with ``group_wait``/``group_interval`` of
1 s so notifications arrive quickly. Tests wait for asynchronous effects with
:func:`eventually` (polling with a 30 s deadline), never with fixed sleeps.

Use it as ``async with Alertmanager(tmp_path) as am:`` or through the fixtures
:func:`alertmanager` (one instance) and :func:`alertmanager_factory` (several, e.g. an
HA pair). A test module makes a fixture visible by binding it at module level
(``alertmanager = am_helper.alertmanager``). Tests skip with a reason when no binary
is installed; CI installs Debian's ``prometheus-alertmanager`` (0.25).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .goserver import DEADLINE_S, GoServer, find_binary
from .receivers import RecordingServer

__all__ = [
    "Alertmanager",
    "alertmanager",
    "alertmanager_binary",
    "alertmanager_factory",
    "eventually",
]

T = TypeVar("T")
RECEIVER = "sre-webhook"  # the receiver name in the Alertmanager config
HOOK_PATH = "/alertmanager"  # where Alertmanager posts on the recorder


def alertmanager_binary() -> str:
    """Path of the Alertmanager binary; skips the test when none is installed."""
    return find_binary(("prometheus-alertmanager", "alertmanager"),
                       "apt-get install prometheus-alertmanager, or put an 'alertmanager' release binary on PATH")


async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout: float = DEADLINE_S,
                     what: str = "condition") -> T:
    """Poll ``check`` until it returns something other than None; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


class Alertmanager(GoServer):
    """One real Alertmanager process routing everything to a recorded webhook.

    ``url`` is its base URL (what the sink's ``urls`` hold); ``webhooks()`` lists the
    version-4 payloads it posted to its receiver ``sre-webhook``.
    """

    NAME = "Alertmanager"

    def __init__(self, workdir: Path, *, group_by: tuple[str, ...] = ("alertname",), webhook_url: str | None = None,
                 bearer_token_file: Path | None = None, repeat_interval: str = "1h") -> None:
        """``webhook_url`` points the receiver somewhere else than the recorder (the agent's intake), with
        ``Authorization: Bearer`` from ``bearer_token_file`` (``http_config.authorization.credentials_file``)."""
        super().__init__(workdir)
        self.group_by = group_by
        self.recorder = RecordingServer()
        self.webhook_url = webhook_url
        self.bearer_token_file = bearer_token_file
        self.repeat_interval = repeat_interval

    def binary(self) -> str:
        return alertmanager_binary()

    async def before_start(self) -> None:
        await self.recorder.start()

    async def after_stop(self) -> None:
        await self.recorder.stop()

    def arguments(self) -> list[str]:
        config = self.workdir / "alertmanager.yml"
        hook: dict[str, Any] = {"url": self.webhook_url or self.recorder.url(HOOK_PATH), "send_resolved": True}
        if self.bearer_token_file is not None:
            hook["http_config"] = {"authorization": {"type": "Bearer",
                                                     "credentials_file": str(self.bearer_token_file)}}
        config.write_text(json.dumps({  # JSON is YAML
            "route": {
                "receiver": RECEIVER,
                "group_by": list(self.group_by),
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": self.repeat_interval,
            },
            "receivers": [{"name": RECEIVER, "webhook_configs": [hook]}],
        }))
        return [f"--config.file={config}", f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", f"--web.external-url={self.url}",
                "--cluster.listen-address=", "--log.level=debug"]

    async def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """``POST /api/v2/alerts``, as Prometheus sends them."""
        async with self.session.post(f"{self.url}/api/v2/alerts", json=alerts) as r:
            r.raise_for_status()

    async def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: the alerts Alertmanager holds as active."""
        data: list[dict[str, Any]] = await self.get_json("/api/v2/alerts")
        return data

    def webhooks(self) -> list[dict[str, Any]]:
        """Every payload Alertmanager posted to its webhook receiver, oldest first."""
        return [r.json() for r in self.recorder.posts(HOOK_PATH)]

    async def wait_webhook(self, predicate: Callable[[dict[str, Any]], bool], *,
                           what: str = "an Alertmanager webhook") -> dict[str, Any]:
        """The first webhook payload satisfying ``predicate``, waiting up to 30 s for it."""
        async def check() -> dict[str, Any] | None:
            return next((p for p in self.webhooks() if predicate(p)), None)
        return await eventually(check, what=what)


@pytest.fixture
async def alertmanager_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Alertmanager]]]:
    """Start any number of Alertmanagers (``await start()``); all are stopped at teardown."""
    started: list[Alertmanager] = []

    async def start(**kwargs: Any) -> Alertmanager:
        am = Alertmanager(tmp_path / f"am{len(started)}", **kwargs)
        await am.__aenter__()
        started.append(am)
        return am

    yield start
    for am in reversed(started):
        await am.__aexit__(None, None, None)


@pytest.fixture
async def alertmanager(tmp_path: Path) -> AsyncIterator[Alertmanager]:
    """One running Alertmanager, stopped at teardown."""
    async with Alertmanager(tmp_path / "am") as am:
        yield am
