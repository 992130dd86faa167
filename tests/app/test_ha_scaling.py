"""Two central agents (an HA pair, same config, Prometheus mode on one real VictoriaMetrics fed by
vmagent) asking one simulator to scale out: the same idempotency key from both, one applied action
per cooldown window at the simulator, and the same ``desired_replicas`` on both.

The agents are started a fraction of an interval apart on purpose: only because both evaluate on
the group's grid (``agent.rules.timing``) do they reach the same ``activeAt``, hence the same key."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.app.daemon import Agent
from agent.config import Config
from agent.rules.manager import AlertState
from agent.simulate.server import Fleet, FleetConfig
from tests.alertmanager import eventually
from tests.e2e import MetricsTarget
from tests.victoriametrics import VictoriaMetrics, VMAgent

RULES = """
groups:
  - name: ha-scale
    interval: 1s
    rules:
      - alert: ConditionHigh
        expr: e2e_condition > 0
        for: 2s
        labels: {severity: warning, action: scale_out}
        annotations: {summary: The condition is high.}
"""
COOLDOWN_S = 6


def _config(tmp_path: Path, name: str, rules: Path, vm: VictoriaMetrics, fleet: Fleet) -> Config:
    return Config.model_validate({
        "source": {"type": "prometheus", "url": vm.url, "timeout": "2s", "query_offset": "3s"},
        "rules": {"files": [str(rules)]}, "nvml": {"enabled": False}, "scrape": {"interval": "1s", "timeout": "1s"},
        "server": {"listen": "127.0.0.1:0"}, "state": {"path": str(tmp_path / f"{name}.db")},
        "actions": [{"type": "scale_out", "matchers": ['action="scale_out"']}],
        "notify": {"dispatch_interval": "500ms", "retry_initial": "200ms", "retry_max": "1s"},
        "scaling": {"services": [{"name": "vllm", "matchers": ['alertname="ConditionHigh"'],
                                  "webhook": {"url": f"{fleet.control_url}/scale"}, "initial_replicas": 2,
                                  "min_replicas": 2, "max_replicas": 5, "scale_out_cooldown": f"{COOLDOWN_S}s"}]},
    })


@pytest.mark.slow
async def test_two_central_agents_scale_out_once_per_cooldown(tmp_path: Path) -> None:
    rules = tmp_path / "ha.rules.yaml"
    rules.write_text(RULES)
    target = MetricsTarget()
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, control_port=0, speed=1.0, step_s=0.5, dcgm_port=None))
    await target.server.start()
    await fleet.start()
    agents: list[Agent] = []
    try:
        async with VictoriaMetrics(tmp_path / "vm") as vm, VMAgent(tmp_path / "vmagent", target.scrape_configs(),
                                                                  vm.write_url):
            for name in ("central-a", "central-b"):
                agent = Agent(_config(tmp_path, name, rules, vm, fleet))
                await agent.start(serve_http=False)
                agents.append(agent)
                await asyncio.sleep(0.37)  # off the grid: the second starts mid-interval

            async def both_evaluating() -> bool | None:
                return True if all(g.last_eval_ms for ag in agents for g in ag.rules.groups) else None

            await eventually(both_evaluating, timeout=30, what="both agents evaluating")
            target.set(3)

            async def both_firing() -> list[int] | None:
                got = [a.active_at_ms for ag in agents for a in ag.rules.alerts() if a.state is AlertState.FIRING]
                return got if len(got) == 2 else None

            active = await eventually(both_firing, timeout=60, what="ConditionHigh firing in both agents")
            assert active[0] == active[1], active  # the same grid point, the same data

            async def state() -> dict[str, Any]:
                async with aiohttp.ClientSession() as s, s.get(f"{fleet.control_url}/state") as r:
                    body: dict[str, Any] = await r.json()
                    return body

            async def scaled_twice() -> list[dict[str, Any]] | None:
                log = (await state())["scale_requests"]
                return log if sum(e["applied"] for e in log) >= 2 and len(log) >= 4 else None

            # 2 -> 3 when it fires, 3 -> 4 one cooldown later; both agents ask each time
            log = await eventually(scaled_twice, timeout=3 * COOLDOWN_S + 30, what="two scale-outs, asked twice each")
            target.set(0)

            async def desired_settled() -> list[dict[str, int]] | None:
                got = [ag.act.scaler.desired_replicas() for ag in agents]
                replicas = [ag.act.db.cooldowns.get("vllm") for ag in agents]
                return got if all(r is not None and r.replicas == got[0]["vllm"] for r in replicas) \
                    and got[0] == got[1] else None

            desired = await eventually(desired_settled, timeout=30, what="the same desired replicas on both")
            log = (await state())["scale_requests"]
    finally:
        for ag in agents:
            await ag.stop()
        await fleet.stop()
        await target.server.stop()
    applied = [e["key"] for e in log if e["applied"]]
    repeated = [e["key"] for e in log if not e["applied"]]
    print(f"scale requests: {len(log)}, applied {len(applied)}, repeats answered from memory {len(repeated)}")
    assert all(k is not None and k.startswith("scale:vllm:out:") for k in applied)
    assert len(set(applied)) == len(applied)  # no key applied twice
    assert set(repeated) <= set(applied)  # a repeat is the other replica's ask for a step already applied
    steps = [k.split(":")[3] for k in applied]
    assert steps[:2] == ["2->3", "3->4"], applied
    # at most one applied step per cooldown window
    stamps = [e["at"] for e in log if e["applied"]]
    assert all(b - a >= COOLDOWN_S - 1.5 for a, b in itertools.pairwise(stamps)), stamps
    assert desired[0]["vllm"] == desired[1]["vllm"] == len(fleet.targets) == 2 + len(applied)
