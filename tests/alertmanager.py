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
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import pytest

from .receivers import RecordingServer, free_port

__all__ = [
    "Alertmanager",
    "alertmanager",
    "alertmanager_binary",
    "alertmanager_factory",
    "eventually",
]

T = TypeVar("T")
DEADLINE_S = 30.0  # generous: a loaded 2-core CI machine can take seconds to start a Go binary
RECEIVER = "sre-webhook"  # the receiver name in the Alertmanager config
HOOK_PATH = "/alertmanager"  # where Alertmanager posts on the recorder


def alertmanager_binary() -> str:
    """Path of the Alertmanager binary; skips the test when none is installed."""
    path = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if path is None:
        pytest.skip("no Alertmanager binary on PATH (apt-get install prometheus-alertmanager, or put "
                    "an 'alertmanager' release binary on PATH)")
    return path


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


class Alertmanager:
    """One real Alertmanager process routing everything to a recorded webhook.

    ``url`` is its base URL (what the sink's ``urls`` hold); ``webhooks()`` lists the
    version-4 payloads it posted to its receiver ``sre-webhook``.
    """

    def __init__(self, workdir: Path, *, group_by: tuple[str, ...] = ("alertname",)) -> None:
        self.workdir = workdir
        self.group_by = group_by
        self.recorder = RecordingServer()
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._log_path = workdir / "alertmanager.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Alertmanager:
        binary = alertmanager_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self.recorder.start()
        self._session = aiohttp.ClientSession()
        try:
            for _ in range(3):  # a free port can be taken between probing and binding
                if await self._start(binary):
                    return self
            pytest.fail(f"Alertmanager did not start; its log:\n{self._log_tail()}")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self  # pragma: no cover (pytest.fail raised)

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.recorder.stop()

    async def _start(self, binary: str) -> bool:
        self.port = free_port()
        config = self.workdir / "alertmanager.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "route": {
                "receiver": RECEIVER,
                "group_by": list(self.group_by),
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{
                "name": RECEIVER,
                "webhook_configs": [{"url": self.recorder.url(HOOK_PATH), "send_resolved": True}],
            }],
        }))
        with self._log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--web.external-url={self.url}",
                "--cluster.listen-address=",
                "--log.level=debug",
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            )
        assert self._session is not None
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                self._proc = None
                return False
            try:
                async with self._session.get(f"{self.url}/-/ready", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
        await self.stop()
        pytest.fail(f"Alertmanager not ready after {DEADLINE_S:g}s; its log:\n{self._log_tail()}")

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s); the recorder keeps running."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    def _log_tail(self) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return "(no log)"

    async def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: the alerts Alertmanager holds as active."""
        assert self._session is not None
        async with self._session.get(f"{self.url}/api/v2/alerts") as r:
            r.raise_for_status()
            data: list[dict[str, Any]] = await r.json()
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
