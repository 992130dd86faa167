"""Test helper: a real VictoriaMetrics single node on 127.0.0.1, for remote-write and Prometheus-mode tests.

Debian's ``victoria-metrics`` package (1.79 in CI) on a free port, its data in the test's directory,
with query caching and the 30 s ``-search.latencyOffset`` off, so what a test wrote is what it
queries once it is searchable: :meth:`VictoriaMetrics.settled` flushes and polls, since a new series
becomes searchable a second or two after the flush. Use it
as ``async with VictoriaMetrics(tmp_path) as vm:``; tests skip with a reason when no binary is installed.
VictoriaMetrics keeps every sample it is sent (no ``-dedup.minScrapeInterval`` here), so counting
samples finds a duplicate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from .goserver import DEADLINE_S, GoServer, find_binary

__all__ = ["VictoriaMetrics"]


class VictoriaMetrics(GoServer):
    """One real VictoriaMetrics; ``url`` is its base URL, ``write_url`` its remote-write endpoint."""

    NAME = "VictoriaMetrics"

    def binary(self) -> str:
        return find_binary(("victoria-metrics", "victoria-metrics-prod"),
                           "apt-get install victoria-metrics, or put a victoria-metrics release binary on PATH")

    def arguments(self) -> list[str]:
        return [f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.workdir / 'data'}",
                "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache",
                "-loggerLevel=WARN"]

    @property
    def write_url(self) -> str:
        return f"{self.url}/api/v1/write"

    async def flush(self) -> None:
        """Make what was written searchable now (VictoriaMetrics buffers it for about a second)."""
        async with self.session.get(f"{self.url}/internal/force_flush") as r:
            r.raise_for_status()

    async def settled(self, expr: str, at: float, *, until: Callable[[list[dict[str, Any]]], bool] = bool,
                      timeout: float = DEADLINE_S) -> list[dict[str, Any]]:
        """:meth:`query` after a flush, polled until ``until(result)`` holds (default: not empty) or ``timeout``
        passes, then the last answer: what was just written becomes searchable within a second or two."""
        await self.flush()
        deadline = time.monotonic() + timeout
        while not until(result := await self.query(expr, at)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return result

    async def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query's ``result`` at ``at`` (seconds)."""
        body = await self.get_json(f"/api/v1/query?query={quote(expr)}&time={at:.3f}")
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
