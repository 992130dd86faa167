"""Prometheus mode on a real VictoriaMetrics 1.79 (fed by vmagent), against vmalert evaluating the
same rule file on the same VictoriaMetrics: the same alerts, ``activeAt`` within one interval; while
VictoriaMetrics is down nothing resolves, and afterwards evaluations resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.app.daemon import Agent
from agent.config import Config
from agent.rules.manager import AlertState
from tests.alertmanager import eventually
from tests.e2e import CONDITION_RULES, MetricsTarget, parse_time
from tests.receivers import RecordingServer, reply
from tests.victoriametrics import VictoriaMetrics, VMAgent, VMAlert

RULES = CONDITION_RULES


def _ours(agent: Agent) -> list[Any]:
    return [a for a in agent.rules.alerts() if dict(a.labels)["alertname"] == "ConditionHigh"]


@pytest.mark.slow
async def test_same_alerts_as_vmalert_and_nothing_resolves_while_victoriametrics_is_down(tmp_path: Path) -> None:
    rule_file = tmp_path / "remote.rules.yaml"
    rule_file.write_text(RULES)
    target = MetricsTarget()
    await target.server.start()
    scrape = target.scrape_configs()
    async with RecordingServer(responder=reply(200, json_body={})) as notifier, \
            VictoriaMetrics(tmp_path / "vm") as vm, \
            VMAgent(tmp_path / "vmagent", scrape, vm.write_url), \
            VMAlert(tmp_path / "vmalert", [rule_file], vm.url, notifier=notifier.url("")) as vmalert:
        config = Config.model_validate({
            "source": {"type": "prometheus", "url": vm.url, "timeout": "1s"}, "rules": {"files": [str(rule_file)]},
            "server": {"listen": "127.0.0.1:0"}, "state": {"path": str(tmp_path / "state.db")},
            "nvml": {"enabled": False},
        })
        agent = Agent(config)
        try:
            target.set(3)

            async def both_firing() -> tuple[dict[str, Any], Any] | None:
                await agent.evaluate_all()
                theirs = [a for a in await vmalert.alerts() if a["labels"].get("alertname") == "ConditionHigh"]
                ours = _ours(agent)
                if theirs and theirs[0]["state"] == "firing" and ours and ours[0].state is AlertState.FIRING:
                    return theirs[0], ours[0]
                await asyncio.sleep(0.25)
                return None

            theirs, ours = await eventually(both_firing, timeout=90,
                                            what="ConditionHigh firing in vmalert and the agent")
            # vmalert adds the group's name as alertgroup; the rest are the same labels
            assert {k: v for k, v in theirs["labels"].items() if k != "alertgroup"} == dict(ours.labels)
            assert abs(ours.active_at_ms / 1000 - parse_time(theirs["activeAt"])) <= 1.5
            assert ours.annotations["summary"] == theirs["annotations"]["summary"]

            await vm.stop()
            for _ in range(5):
                await agent.evaluate_all()
            assert [a.state for a in _ours(agent)] == [AlertState.FIRING]
            assert agent.rules.groups[0].rules[0].health == "err"
            await vm.start_again()

            async def healthy() -> bool | None:
                await agent.evaluate_all()
                return True if agent.rules.groups[0].rules[0].health == "ok" else None

            await eventually(healthy, timeout=60, what="evaluations succeeding again")
            assert [a.state for a in _ours(agent)] == [AlertState.FIRING]
        finally:
            await agent.stop()
            await target.server.stop()
