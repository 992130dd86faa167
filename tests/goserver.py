"""Test helper: one real Go server process (Prometheus, Alertmanager) on 127.0.0.1, for differential tests.

What the two helpers share lives here once: finding the binary (a test skips with a reason when
none is installed), a free port (retried, since a port can be taken between probing and binding),
the process with its log in the test's directory, a deadline-bound wait for ``/-/ready`` (or the
subclass's ``READY_PATH``), and a clean stop (SIGTERM, then SIGKILL). A subclass says which binary,
which config file and which flags: :class:`tests.prometheus.Prometheus`,
:class:`tests.alertmanager.Alertmanager`, :mod:`tests.victoriametrics`' VictoriaMetrics programs.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
import pytest

from .receivers import free_port

__all__ = ["DEADLINE_S", "GoServer", "find_binary"]

DEADLINE_S = 30.0  # generous: a loaded 2-core CI machine can take seconds to start a Go binary


def find_binary(names: tuple[str, ...], install_hint: str) -> str:
    """The first of ``names`` on PATH; skips the test when none is installed."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(f"no {' or '.join(names)} binary on PATH ({install_hint})")


class GoServer:
    """A real server process; ``url`` is its base URL once entered (``async with``)."""

    NAME = "server"  # for messages and the log file's name
    READY_PATH = "/-/ready"  # answers 200 once the server serves (VictoriaMetrics' programs: /health)

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._log_path = workdir / f"{self.NAME.lower()}.log"

    # -- what a subclass says -----------------------------------------------------------------------------
    def binary(self) -> str:
        raise NotImplementedError

    def arguments(self) -> list[str]:
        """The command-line flags for a start on ``self.port`` (write the config file here too)."""
        raise NotImplementedError

    async def before_start(self) -> None:
        """Start what the server needs first (a receiver to post to)."""

    async def after_stop(self) -> None:
        """Stop what :meth:`before_start` started."""

    # -- the shared lifecycle -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, f"{self.NAME} is not running"
        return self._session

    async def __aenter__(self) -> Self:
        binary = self.binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self.before_start()
        self._session = aiohttp.ClientSession()
        try:
            for _ in range(3):  # a free port can be taken between probing and binding
                if await self._start(binary):
                    return self
            pytest.fail(f"{self.NAME} did not start; its log:\n{self._log_tail()}")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.after_stop()

    async def restart(self) -> None:
        """Stop the process and start it again on the same port (and data directory), like a server that blinks."""
        await self.stop()
        await self.start_again()

    async def start_again(self) -> None:
        """Start a :meth:`stop`-ped server again on the same port and data directory (a restart in two steps,
        for a test that acts while the server is down)."""
        if not await self._start(self.binary(), port=self.port):
            pytest.fail(f"{self.NAME} did not start again; its log:\n{self._log_tail()}")

    @property
    def pid(self) -> int:
        assert self._proc is not None, f"{self.NAME} is not running"
        return self._proc.pid

    async def _start(self, binary: str, *, port: int = 0) -> bool:
        self.port = port or free_port()
        with self._log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                binary, *self.arguments(), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                self._proc = None
                return False
            try:
                ready = f"{self.url}{self.READY_PATH}"
                async with self.session.get(ready, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
        await self.stop()
        pytest.fail(f"{self.NAME} not ready after {DEADLINE_S:g}s; its log:\n{self._log_tail()}")

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s)."""
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

    async def get_json(self, path: str) -> Any:
        """``GET path`` on the server: its JSON answer (an HTTP error fails the test)."""
        async with self.session.get(f"{self.url}{path}") as r:
            r.raise_for_status()
            return await r.json()
