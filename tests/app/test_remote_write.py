"""Setup (b) of Prometheus mode end to end: the agent evaluates a recording rule and an alert through a real
Prometheus 2.42 and remote-writes the recorded series, ALERTS and ALERTS_FOR_STATE back into that Prometheus
and into a real VictoriaMetrics, where they are queried back; the alert reads the recorded series it wrote."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prometheus_client.exposition import generate_latest

from agent.app.daemon import Agent
from agent.config import Config
from agent.rules.manager import AlertState
from tests.alertmanager import eventually
from tests.e2e import MetricsTarget
from tests.prometheus import Prometheus
from tests.victoriametrics import VictoriaMetrics

RULES = """
groups:
  - name: remote
    interval: 1s
    rules:
      - record: job:e2e_condition:max
        expr: max by (job) (e2e_condition)
      - alert: ConditionHigh
        expr: job:e2e_condition:max > 0
        labels: {severity: warning}
        annotations: {summary: The condition is high.}
"""


async def test_recorded_series_and_alerts_reach_prometheus_and_victoriametrics(tmp_path: Path) -> None:
    """The recording result and ALERTS/ALERTS_FOR_STATE arrive in both servers (with the remote's external
    label where configured), ALERTS_FOR_STATE holding the alert's activeAt, and the alert fires from the
    recorded series the agent wrote back."""
    rule_file = tmp_path / "remote.rules.yaml"
    rule_file.write_text(RULES)
    target = MetricsTarget()
    await target.server.start()
    scrape = target.scrape_configs()
    async with Prometheus(tmp_path / "prom", [], scrape_configs=scrape, remote_write_receiver=True) as prom, \
            VictoriaMetrics(tmp_path / "vm") as vm:
        config = Config.model_validate({
            "source": {"type": "prometheus", "url": prom.url, "timeout": "2s"},
            "rules": {"files": [str(rule_file)]},
            "remote_write": [
                {"url": f"{prom.url}/api/v1/write", "external_labels": {"agent_replica": "one"}},
                {"url": vm.write_url, "write": ["alerts"]},
            ],
            "state": {"path": str(tmp_path / "state.db")}, "nvml": {"enabled": False},
        })
        agent = Agent(config)
        assert agent.remote_write is not None
        agent.remote_write.start()
        try:
            target.set(7)

            async def firing() -> Any:
                await agent.scrape_cycle()
                await agent.evaluate_all()
                alerts = [a for a in agent.rules.alerts() if a.state is AlertState.FIRING]
                if alerts:
                    return alerts[0]
                await asyncio.sleep(0.25)
                return None

            alert = await eventually(firing, timeout=60, what="ConditionHigh firing from the written-back series")
            assert dict(alert.labels) == {"alertname": "ConditionHigh", "job": "e2e", "agent_replica": "one",
                                          "severity": "warning"}
            prom_q, vm_q = agent.remote_write.queues
            await eventually(lambda: _done(prom_q.stats.pending == 0 and vm_q.stats.sent > 0), what="sent")
            now = time.time() + 1
            recorded = await prom.query("job:e2e_condition:max", now)
            assert [(r["metric"], r["value"][1]) for r in recorded] == [
                ({"__name__": "job:e2e_condition:max", "job": "e2e", "agent_replica": "one"}, "7")]
            for server, extra in ((prom, {"agent_replica": "one"}), (vm, {})):
                firing_series = await server.settled('ALERTS{alertname="ConditionHigh",alertstate="firing"}', now)
                assert [r["metric"] for r in firing_series] == [{
                    "__name__": "ALERTS", "alertname": "ConditionHigh", "alertstate": "firing", "job": "e2e",
                    "agent_replica": "one", "severity": "warning", **extra}]
                for_state = await server.query('ALERTS_FOR_STATE{alertname="ConditionHigh"}', now)
                assert [float(r["value"][1]) for r in for_state] == [alert.active_at_ms / 1000]
            assert await vm.query("job:e2e_condition:max", now) == []  # write: [alerts] only
            text = generate_latest(agent.registry).decode()
            assert f'sre_agent_remote_write_sent_samples_total{{remote_name="{vm.write_url}",url="{vm.write_url}"}}' \
                in text
        finally:
            await agent.stop()
            await target.server.stop()


def four(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


async def _done(ok: bool) -> bool | None:
    return True if ok else None


async def test_embedded_mode_forwards_scraped_samples(tmp_path: Path) -> None:
    """write: [scraped]: every stored sample of each scrape, up and scrape_* included, reaches
    VictoriaMetrics, one per scrape; nothing the rules wrote is sent."""
    rule_file = tmp_path / "local.rules.yaml"
    rule_file.write_text(RULES)
    target = MetricsTarget()
    await target.server.start()
    async with VictoriaMetrics(tmp_path / "vm") as vm:
        config = Config.model_validate({
            "targets": [{"url": target.url, "job": "e2e"}], "rules": {"files": [str(rule_file)]},
            "store": {"keep": ["e2e_condition"]},
            "remote_write": [{"url": vm.write_url, "write": ["scraped"], "external_labels": {"node": "n1"}}],
            "state": {"path": str(tmp_path / "state.db")}, "nvml": {"enabled": False},
        })
        agent = Agent(config)
        assert agent.remote_write is not None
        agent.remote_write.start()
        try:
            target.set(3)
            for _ in range(4):
                await agent.scrape_cycle()
                await agent.evaluate_all()
                await asyncio.sleep(0.01)  # distinct millisecond timestamps
            [q] = agent.remote_write.queues
            await eventually(lambda: _done(q.stats.pending == 0 and q.stats.sent >= 20), what="sent")
            now = time.time() + 1
            for name in ("e2e_condition", "up", "scrape_duration_seconds", "scrape_samples_scraped",
                         "scrape_body_size_bytes"):
                got = await vm.settled(f'count_over_time({name}{{node="n1"}}[1h])', now,
                                       until=lambda r: four(r) == [4.0])
                assert four(got) == [4.0], name
            assert await vm.query("ALERTS", now) == []
            assert q.stats.sent == 20
            [up] = await vm.query('up{node="n1"}', now)
            assert up["metric"] == {"__name__": "up", "job": "e2e", "instance": target.url.split("//")[1].split("/")[0],
                                    "node": "n1"}
        finally:
            await agent.stop()
            await target.server.stop()


async def test_the_queues_health_is_in_the_agents_own_store_for_its_alerts(tmp_path: Path) -> None:
    """SREAgentRemoteWriteBehind and SREAgentRemoteWriteLosingSamples are evaluated over the agent's store:
    each scrape cycle writes every remote's pending, last-send, failed and dropped series there."""
    from agent.store import SeriesMatcher
    from tests.receivers import free_port

    url = f"http://127.0.0.1:{free_port()}/api/v1/write"
    agent = Agent(Config.model_validate({
        "targets": [], "remote_write": [{"url": url, "name": "vm"}], "nvml": {"enabled": False},
        "server": {"listen": "127.0.0.1:0"}, "state": {"path": str(tmp_path / "state.db")},
    }))
    try:
        await agent.scrape_cycle()
        found = {}
        for name in ("pending_samples", "last_send_timestamp_seconds", "failed_samples_total",
                     "dropped_samples_total"):
            series = list(agent.store.iter_series([SeriesMatcher("__name__", "=", f"sre_agent_remote_write_{name}")]))
            found[name] = sorted(dict(s.labels).get("reason", "") for s in series)
            assert all(dict(s.labels)["remote_name"] == "vm" and dict(s.labels)["url"] == url for s in series)
        assert found == {"pending_samples": [""], "last_send_timestamp_seconds": [""], "failed_samples_total": [""],
                         "dropped_samples_total": ["invalid", "queue_full", "state_error"]}
    finally:
        await agent.stop()
