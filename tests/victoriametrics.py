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
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .goserver import DEADLINE_S, GoServer, find_binary

__all__ = ["VMAgent", "VMAlert", "VictoriaMetrics"]

_INSTALL = "apt-get install victoria-metrics (Debian ships victoria-metrics, vmagent, vmalert)"


class VictoriaMetrics(GoServer):
    """One real VictoriaMetrics; ``url`` is its base URL, ``write_url`` its remote-write endpoint."""

    NAME = "VictoriaMetrics"
    READY_PATH = "/health"

    def binary(self) -> str:
        return find_binary(("victoria-metrics", "victoria-metrics-prod"), _INSTALL)

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


class VMAgent(GoServer):
    """vmagent scraping ``scrape_configs`` every second and remote-writing to ``write_url``."""

    NAME = "vmagent"
    READY_PATH = "/health"

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], write_url: str) -> None:
        super().__init__(workdir)
        self.scrape_configs, self.write_url = scrape_configs, write_url

    def binary(self) -> str:
        return find_binary(("vmagent", "vmagent-prod"), _INSTALL)

    def arguments(self) -> list[str]:
        config = self.workdir / "vmagent.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": self.scrape_configs}))
        return [f"-httpListenAddr=127.0.0.1:{self.port}", f"-promscrape.config={config}",
                f"-remoteWrite.url={self.write_url}", f"-remoteWrite.tmpDataPath={self.workdir / 'vmagent-data'}",
                "-remoteWrite.flushInterval=1s", "-promscrape.httpSDCheckInterval=1s", "-loggerLevel=WARN"]


class VMAlert(GoServer):
    """vmalert evaluating ``rule_files`` every second on ``datasource`` and writing results back to it;
    alerting rules need ``notifier`` (an Alertmanager's URL: vmalert 1.79 refuses to start without one)."""

    NAME = "vmalert"
    READY_PATH = "/health"

    def __init__(self, workdir: Path, rule_files: list[Path], datasource: str, *, notifier: str | None = None) -> None:
        super().__init__(workdir)
        self.rule_files, self.datasource, self.notifier = rule_files, datasource, notifier

    def binary(self) -> str:
        return find_binary(("vmalert", "vmalert-prod"), _INSTALL)

    def arguments(self) -> list[str]:
        return [f"-httpListenAddr=127.0.0.1:{self.port}", f"-datasource.url={self.datasource}",
                f"-remoteWrite.url={self.datasource}", "-evaluationInterval=1s", "-remoteWrite.flushInterval=1s",
                "-loggerLevel=WARN", *(f"-rule={p}" for p in self.rule_files),
                *([f"-notifier.url={self.notifier}"] if self.notifier else [])]

    async def alerts(self) -> list[dict[str, Any]]:
        """vmalert's ``/api/v1/alerts`` (Prometheus' shape)."""
        body = await self.get_json("/api/v1/alerts")
        alerts: list[dict[str, Any]] = body["data"]["alerts"] or []  # null when there are none
        return alerts
