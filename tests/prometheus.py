"""Test helper: a real Prometheus process evaluating rule files, for differential tests of its HTTP API.

Where the agent must write what Prometheus writes (the ``value`` of an alert in ``/api/v1/alerts``
and ``/api/v1/rules``, a target's ``lastError``), tests compare against the real thing:
:class:`Prometheus` starts the ``prometheus`` binary (Debian's 2.42 in CI) on 127.0.0.1 with a free
port, its TSDB in the test's directory, the given ``scrape_configs`` (none by default; every
second) and the given rule files evaluated every second (and, with ``remote_write_receiver``, its
remote-write receiver on ``/api/v1/write``), and waits with a deadline for
``/-/ready``. Use it as ``async with Prometheus(tmp_path, [rules]) as prom:``; the process is
stopped on the way out, also when the test fails. Tests skip with a reason when no binary is
installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .goserver import GoServer, find_binary

__all__ = ["Prometheus", "prometheus_binary"]


def prometheus_binary() -> str:
    """Path of the Prometheus server binary; skips the test when none is installed."""
    return find_binary(("prometheus",), "apt-get install prometheus, or put Prometheus 2.42's release binary on PATH")


class Prometheus(GoServer):
    """One real Prometheus evaluating ``rule_files`` every ``evaluation_interval``; ``url`` is its base URL."""

    NAME = "Prometheus"

    def __init__(self, workdir: Path, rule_files: list[Path], *, evaluation_interval: str = "1s",
                 scrape_configs: list[dict[str, Any]] | None = None, remote_write_receiver: bool = False) -> None:
        super().__init__(workdir)
        self.rule_files = rule_files
        self.evaluation_interval = evaluation_interval
        self.scrape_configs = scrape_configs or []  # Prometheus' scrape_configs, for differential scrape tests
        self.remote_write_receiver = remote_write_receiver  # accept remote write on /api/v1/write

    def binary(self) -> str:
        return prometheus_binary()

    def arguments(self) -> list[str]:
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"evaluation_interval": self.evaluation_interval, "scrape_interval": "1s"},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }))
        return [f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *(["--web.enable-remote-write-receiver"] if self.remote_write_receiver else [])]

    async def settled(self, expr: str, at: float, *, until: Callable[[list[dict[str, Any]]], bool] = bool
                      ) -> list[dict[str, Any]]:
        """:meth:`query`: what Prometheus accepted by remote write is searchable at once (the same call as
        :meth:`tests.victoriametrics.VictoriaMetrics.settled`; ``until`` is not needed here)."""
        return await self.query(expr, at)

    async def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query's ``result`` at ``at`` (seconds)."""
        data = await self.api(f"query?query={quote(expr)}&time={at:.3f}")
        result: list[dict[str, Any]] = data["result"]
        return result

    async def api(self, path: str) -> Any:
        """``GET /api/v1/<path>``: the ``data`` of Prometheus' answer."""
        body = await self.get_json(f"/api/v1/{path}")
        assert body["status"] == "success", body
        return body["data"]
