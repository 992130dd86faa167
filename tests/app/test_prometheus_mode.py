"""Prometheus mode against a real Prometheus 2.42: the agent evaluates the same rule file through
the server's API and fires what Prometheus fires, with the same labels and annotations, at the same
evaluation (± one interval); while the server is down or hangs no alert changes and the agent's own
SREAgentRuleEvaluationsFailing fires; afterwards everything resumes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.daemon import Agent
from agent.config import Config, bundled_rules_dir
from agent.rules.manager import AlertState, Group
from tests.alertmanager import eventually
from tests.e2e import CONDITION_RULES, MetricsTarget, parse_time
from tests.prometheus import Prometheus
from tests.receivers import RecordingServer, reply

RULES = CONDITION_RULES


class Clock:
    """Wall time plus ``skew``: the outage phase moves the agent's time on without waiting for it."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew


def _group(agent: Agent, name: str) -> Group:
    return next(g for g in agent.rules.groups if g.spec.name == name)


async def _round(agent: Agent) -> None:
    """What the scheduler does each interval: a (target-less) scrape cycle, every group, a dispatch round."""
    await agent.scrape_cycle()
    await agent.evaluate_all()
    await agent.act.tick()


def _sent(am: RecordingServer, name: str) -> list[tuple[float, float]]:
    """(when posted, endsAt) of each alert ``name`` the Alertmanager got, in order."""
    return [(r.at, parse_time(a["endsAt"])) for r in am.posts("/api/v2/alerts") for a in r.json()
            if a["labels"]["alertname"] == name]


@pytest.mark.slow
async def test_same_alerts_as_prometheus_and_nothing_changes_while_it_is_down(tmp_path: Path) -> None:
    rule_file = tmp_path / "remote.rules.yaml"
    rule_file.write_text(RULES)
    target = MetricsTarget()
    await target.server.start()
    scrape = target.scrape_configs()
    clock = Clock()
    am = RecordingServer(responder=reply(200, json_body={}), clock=clock)  # records what an Alertmanager gets
    await am.start()
    async with Prometheus(tmp_path / "prom", [rule_file], scrape_configs=scrape) as prom:
        config = Config.model_validate({
            "source": {"type": "prometheus", "url": prom.url, "timeout": "1s"},
            "rules": {"files": [str(rule_file), str(bundled_rules_dir() / "agent.rules.yaml")]},
            "server": {"listen": "127.0.0.1:0"}, "state": {"path": str(tmp_path / "state.db")},
            "nvml": {"enabled": False},
            "receivers": [{"name": "am", "alertmanager": {"urls": [am.url("")], "resend_delay": "15s"}}],
            "route": {"receiver": "am"},
        })
        agent = Agent(config, clock=clock)
        await agent.act.start()  # the dispatcher (start() would also start the scheduler; the test drives rounds)
        try:
            # 1. Prometheus and the agent fire the same alert
            target.set(7)

            async def both_firing() -> tuple[dict[str, Any], Any] | None:
                await _round(agent)
                listed = (await prom.api("alerts"))["alerts"]
                prom_alerts = [a for a in listed if a["labels"]["alertname"] == "ConditionHigh"]
                ours = [a for a in agent.rules.alerts() if dict(a.labels)["alertname"] == "ConditionHigh"]
                if prom_alerts and prom_alerts[0]["state"] == "firing" and ours and ours[0].state is AlertState.FIRING:
                    return prom_alerts[0], ours[0]
                await asyncio.sleep(0.25)
                return None

            theirs, ours = await eventually(both_firing, timeout=60, what="ConditionHigh firing in both")
            assert dict(ours.labels) == theirs["labels"]
            assert ours.annotations == theirs["annotations"]
            assert ours.as_json()["value"] == theirs["value"]
            prom_active = parse_time(theirs["activeAt"])
            assert abs(ours.active_at_ms / 1000 - prom_active) <= 2.0  # one 1s evaluation and one 1s scrape apart
            remote = _group(agent, "remote")
            assert remote.rules[0].health == "ok"

            # 2. Prometheus is down for two minutes (of the agent's time): nothing resolves, our own alert fires,
            # and the Alertmanager keeps getting the firing alert with endsAt ahead, so it does not resolve it there
            await prom.stop()
            before = len(_sent(am, "ConditionHigh"))
            for _ in range(9):
                clock.skew += 15
                await _round(agent)
                assert [a.state for a in agent.rules.alerts() if dict(a.labels)["alertname"] == "ConditionHigh"] \
                    == [AlertState.FIRING]
            assert remote.rules[0].health == "err"
            assert "ClientConnectorError" in remote.rules[0].last_error
            assert remote.failures >= 9
            own = [a for a in agent.rules.alerts() if dict(a.labels)["alertname"] == "SREAgentRuleEvaluationsFailing"]
            assert [a.state for a in own] == [AlertState.FIRING]
            assert dict(own[0].labels)["rule_group"] == f"{rule_file};remote"
            exported = {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in text_string_to_metric_families(generate_latest(agent.registry).decode())
                        for s in f.samples}
            assert exported[("sre_agent_rule_evaluation_failures_total",
                             (("rule_group", f"{rule_file};remote"),))] == remote.failures
            assert exported[("sre_agent_source_up", (("url", prom.url),))] == 0.0
            assert exported[("sre_agent_source_query_failures_total", (("reason", "unreachable"),))] >= 9
            during = _sent(am, "ConditionHigh")[before:]
            assert len(during) >= 8  # every 15 s resend_delay of the two minutes
            assert all(ends > at for at, ends in during)  # endsAt = now + 4 x max(interval, resend_delay)
            assert _sent(am, "SREAgentRuleEvaluationsFailing")

            # 3. it hangs (SIGSTOP): the query times out, still nothing changes
            await prom.restart()
            os.kill(prom.pid, signal.SIGSTOP)
            try:
                await _round(agent)
                assert "no answer within 1s" in remote.rules[0].last_error
                assert [a.state for a in agent.rules.alerts() if dict(a.labels)["alertname"] == "ConditionHigh"] \
                    == [AlertState.FIRING]
            finally:
                os.kill(prom.pid, signal.SIGCONT)

            # 4. back: evaluations succeed, our own alert resolves, and a real clear resolves ConditionHigh
            async def healthy() -> bool | None:
                await _round(agent)
                return True if remote.rules[0].health == "ok" else None

            await eventually(healthy, timeout=60, what="the remote group healthy again")
            target.set(0)

            async def resolved() -> bool | None:
                await _round(agent)
                names = {dict(a.labels)["alertname"] for a in agent.rules.alerts()}
                if not names & {"ConditionHigh", "SREAgentRuleEvaluationsFailing"}:
                    return True
                await asyncio.sleep(0.25)
                return None

            await eventually(resolved, timeout=60, what="ConditionHigh and SREAgentRuleEvaluationsFailing resolved")
        finally:
            await agent.stop()
            await target.server.stop()
            await am.stop()


SLOW_RULES = RULES.replace("for: 3s", "for: 1h")


async def test_a_fresh_agent_takes_active_at_from_prometheus_alerts_for_state(tmp_path: Path) -> None:
    """Prometheus has had the alert pending a while; an agent with a new state database starts
    with Prometheus' activeAt (from ALERTS_FOR_STATE), not with its own first evaluation."""
    rule_file = tmp_path / "remote.rules.yaml"
    rule_file.write_text(SLOW_RULES)
    target = MetricsTarget(value=7)
    await target.server.start()
    scrape = target.scrape_configs()
    try:
        async with Prometheus(tmp_path / "prom", [rule_file], scrape_configs=scrape) as prom:
            async def pending_a_while() -> dict[str, Any] | None:
                listed = (await prom.api("alerts"))["alerts"]
                if listed and time.time() - parse_time(listed[0]["activeAt"]) > 3:
                    return dict(listed[0])
                await asyncio.sleep(0.2)
                return None

            theirs = await eventually(pending_a_while, timeout=60, what="ConditionHigh pending for 3s in Prometheus")
            config = Config.model_validate({
                "source": {"type": "prometheus", "url": prom.url}, "rules": {"files": [str(rule_file)]},
                "server": {"listen": "127.0.0.1:0"}, "state": {"path": str(tmp_path / "new.db")},
                "nvml": {"enabled": False},
            })
            agent = Agent(config)
            try:
                await agent.evaluate(_group(agent, "remote"))
                (ours,) = agent.rules.alerts()
                assert ours.state is AlertState.PENDING
                # ALERTS_FOR_STATE holds whole seconds (Prometheus writes ActiveAt.Unix())
                assert ours.active_at_ms == int(parse_time(theirs["activeAt"])) * 1000
            finally:
                await agent.stop()
    finally:
        await target.server.stop()
