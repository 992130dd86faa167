"""Test helpers for the fleet topology run for real (``tests/app/test_topology.py``).

* :class:`ClusterAlertmanager`: one node of a real Alertmanager cluster on loopback
  (``--cluster.listen-address``/``--cluster.advertise-address`` on 127.0.0.1, ``--cluster.peer`` the
  other nodes), every alert its own group (``group_by: ['...']``) so one notification is one alert's
  one state change, delivering to a shared recording webhook at ``/am<node>``.
* :class:`SimulatorProcess`: ``python -m agent simulate`` as a process (the fleet's CPU is not the
  test's), its targets read from stdout and its control URL from the JSON log.
* :func:`deliveries`: what the webhook got, counted per alert (labels) and status: distinct
  deliveries, duplicates (the same alert in the same status again, with no other status between:
  what a gossip miss between the nodes produces), and by node.
* :class:`ShardedVictoriaMetrics`: VictoriaMetrics with Prometheus' 5-minute lookback
  (``-search.maxStalenessInterval=5m``): a killed writer sends no staleness markers, so its series
  stay visible for the lookback, as they would in Prometheus.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .alertmanager import Alertmanager, eventually
from .conftest import REPO
from .receivers import RecordingServer
from .victoriametrics import VictoriaMetrics

__all__ = ["AlertKey", "ClusterAlertmanager", "Deliveries", "ShardedVictoriaMetrics", "SimulatorProcess", "alert_key",
           "deliveries"]

AlertKey = tuple[tuple[str, str], ...]


def alert_key(labels: dict[str, str]) -> AlertKey:
    """An alert's identity: its sorted label set (what Alertmanager's fingerprint hashes)."""
    return tuple(sorted(labels.items()))


class ClusterAlertmanager(Alertmanager):
    """One Alertmanager cluster node on loopback, posting to ``hook`` at ``/am<node>``."""

    def __init__(self, workdir: Path, *, node: int, hook: RecordingServer, cluster_port: int,
                 peers: list[int]) -> None:
        super().__init__(workdir, group_by=("...",), webhook_url=hook.url(f"/am{node}"))
        self.node, self.cluster_port, self.peers = node, cluster_port, peers

    async def before_start(self) -> None:  # the shared hook is the test's, not this node's recorder
        return

    async def after_stop(self) -> None:
        return

    def arguments(self) -> list[str]:
        args = [a for a in super().arguments() if not a.startswith("--cluster.")]
        address = f"127.0.0.1:{self.cluster_port}"
        return [*args, f"--cluster.listen-address={address}", f"--cluster.advertise-address={address}",
                *(f"--cluster.peer=127.0.0.1:{p}" for p in self.peers),
                # seconds, not Alertmanager's production defaults (15 s peer timeout, 1 m settle)
                "--cluster.peer-timeout=2s", "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=5s",
                "--cluster.settle-timeout=3s", "--cluster.probe-interval=500ms", "--cluster.probe-timeout=300ms"]

    def kill(self) -> None:
        """SIGKILL: no goodbye to the peer; the survivor has to notice."""
        os.kill(self.pid, signal.SIGKILL)

    async def members(self) -> int:
        """How many peers this node's ``/api/v2/status`` lists (itself included)."""
        status = await self.get_json("/api/v2/status")
        return len(status["cluster"].get("peers") or [])


class ShardedVictoriaMetrics(VictoriaMetrics):
    """VictoriaMetrics with Prometheus' 5 m lookback, so a dead writer's last samples stay visible."""

    def arguments(self) -> list[str]:
        return [*super().arguments(), "-search.maxStalenessInterval=5m"]


class SimulatorProcess:
    """``python -m agent simulate`` on free ports; ``targets`` and ``control_url`` once :meth:`ready`."""

    def __init__(self, workdir: Path, *, replicas: int, scenario: str, speed: float) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.out, self.log = workdir / "simulate.out", workdir / "simulate.log"
        self._files = [self.out.open("wb"), self.log.open("wb")]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "simulate", "--replicas", str(replicas), "--lmdeploy", "0",
             "--port", "0", "--dcgm-port", "-1", "--scenario", scenario, "--speed", f"{speed:g}",
             "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=self._files[0], stderr=self._files[1], cwd=REPO,
            env={**os.environ, "NO_COLOR": "1"})
        self.replicas = replicas
        self.targets: list[str] = []
        self.control_url = ""

    async def ready(self) -> SimulatorProcess:
        async def started() -> tuple[list[str], str] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited: {self.log.read_text(errors='replace')[-2000:]}")
            lines = self.out.read_text().split()
            event = next((e for e in _json_lines(self.log) if e.get("event") == "simulator serving"), None)
            return (lines, str(event["control"])) if event and len(lines) >= self.replicas else None

        self.targets, self.control_url = await eventually(started, timeout=60, what="the simulator serving")
        return self

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in self._files:
            f.close()


def _json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@dataclass
class Deliveries:
    """Webhook deliveries counted per (alert, status)."""

    distinct: int = 0
    duplicate: int = 0
    by_node: dict[str, int] = field(default_factory=dict)
    firing: set[AlertKey] = field(default_factory=set)  # alerts delivered as firing at least once
    resolved: set[AlertKey] = field(default_factory=set)
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (alertname, status) of each duplicate
    last_status: dict[AlertKey, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"distinct": self.distinct, "duplicate": self.duplicate, "by_node": self.by_node,
                "duplicates": [list(d) for d in self.duplicates]}


def deliveries(hook: RecordingServer, *, since: float = 0.0, until: float = float("inf")) -> Deliveries:
    """Count the accepted Alertmanager webhook posts received in [since, until).

    Each post (``group_by: ['...']``) carries one alert; a delivery is *distinct* when the alert's
    status differs from its previous delivery (or it is the first), a *duplicate* otherwise. The
    previous status is looked up over every delivery before ``since`` too, so a phase's first
    delivery of an alert already delivered in that status is a duplicate.
    """
    out = Deliveries()
    for rec in hook.accepted():
        if not rec.path.startswith("/am") or rec.at >= until:
            continue
        for alert in rec.json().get("alerts", []):
            key, status = alert_key(alert["labels"]), str(alert["status"])
            repeat = out.last_status.get(key) == status
            out.last_status[key] = status
            if rec.at < since:
                continue
            node = rec.path.removeprefix("/")
            out.by_node[node] = out.by_node.get(node, 0) + 1
            (out.firing if status == "firing" else out.resolved).add(key)
            if repeat:
                out.duplicate += 1
                out.duplicates.append((alert["labels"].get("alertname", ""), status))
            else:
                out.distinct += 1
    return out
