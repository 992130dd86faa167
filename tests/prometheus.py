"""Test helper: a real Prometheus process evaluating rule files, for differential tests of its HTTP API.

Where the agent must write what Prometheus writes (the ``value`` of an alert in ``/api/v1/alerts``
and ``/api/v1/rules``), tests compare against the real thing: :class:`Prometheus` starts the
``prometheus`` binary (Debian's 2.42 in CI) on 127.0.0.1 with a free port, its TSDB in the test's
directory, no scrape jobs and the given rule files evaluated every second, and waits with a
deadline for ``/-/ready``. Use it as ``async with Prometheus(tmp_path, [rules]) as prom:``; the
process is stopped on the way out, also when the test fails. Tests skip with a reason when no
binary is installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest

from .alertmanager import DEADLINE_S
from .receivers import free_port

__all__ = ["Prometheus", "prometheus_binary"]


def prometheus_binary() -> str:
    """Path of the Prometheus server binary; skips the test when none is installed."""
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("no prometheus binary on PATH (apt-get install prometheus, or put Prometheus 2.42's "
                    "'prometheus' release binary on PATH)")
    return path


class Prometheus:
    """One real Prometheus evaluating ``rule_files`` every ``evaluation_interval``; ``url`` is its base URL."""

    def __init__(self, workdir: Path, rule_files: list[Path], *, evaluation_interval: str = "1s") -> None:
        self.workdir = workdir
        self.rule_files = rule_files
        self.evaluation_interval = evaluation_interval
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Prometheus:
        binary = prometheus_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession()
        try:
            for _ in range(3):  # a free port can be taken between probing and binding
                if await self._start(binary):
                    return self
            pytest.fail(f"Prometheus did not start; its log:\n{self._log_tail()}")
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

    async def _start(self, binary: str) -> bool:
        self.port = free_port()
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"evaluation_interval": self.evaluation_interval},
            "rule_files": [str(p) for p in self.rule_files],
        }))
        with self._log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
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
        pytest.fail(f"Prometheus not ready after {DEADLINE_S:g}s; its log:\n{self._log_tail()}")

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

    async def api(self, path: str) -> Any:
        """``GET /api/v1/<path>``: the ``data`` of Prometheus' answer."""
        assert self._session is not None
        async with self._session.get(f"{self.url}/api/v1/{path}") as r:
            r.raise_for_status()
            body = await r.json()
            assert body["status"] == "success", body
            return body["data"]
