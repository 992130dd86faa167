"""Each simulator scenario with real parts: Prometheus 2.42 and the agent watch the same simulated fleet
with the same rules, the agent notifies a real Alertmanager 0.25 and the Slack stand-in and scales the
fleet through its ``POST /scale``.

Time is compressed by one factor everywhere, so every duration keeps its meaning: the simulator runs
``FACTOR`` model seconds per wall second, and the bundled ``vllm.rules.yaml`` is given to both
evaluators with every ``for``, ``keep_firing_for``, range and offset divided by ``FACTOR`` and the
group interval at 1 s (15 s of model time). The throughput rule's 45-minute baseline then spans 3 wall
minutes, longer than a run; slow_interconnect is checked on the inter-token latency it causes.

What each scenario must show (issue "End to end", section 2):

* both fire the same alerts: the scenario's own alert with the same labels, and every alert that
  fired in one was at least pending in the other (by name: which replica's value hugging a threshold
  crosses first differs between two independent scrapers); the agent's firing within one evaluation
  (plus one scrape) of Prometheus', unless either's own record shows its `for` started over;
* the agent's notifications are in Alertmanager's API and in Slack, updated in place on resolve;
* the scale-out reaches the simulator once per cooldown (the surge's; the oom scenario may queue the
  surviving replica into one too), never twice.

The detection latency (condition onset in the simulator to the Slack message) is measured for the
surge and the OOM and printed; the goal is ``for`` + 1 scrape interval + 1 s (plus group_wait).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.app.daemon import Agent
from agent.config import Config
from agent.rules.manager import AlertState
from agent.simulate.server import Fleet, FleetConfig
from tests.alertmanager import Alertmanager, eventually
from tests.e2e import compressed_rules, parse_time
from tests.fake_slack import DEFAULT_CHANNELS, FakeSlack, running_fake_slack
from tests.prometheus import Prometheus

FACTOR = 15  # 15 model seconds per wall second: a 1 s interval is the bundled rules' 15 s
CHANNEL = "#alerts"

Key = tuple[tuple[str, str], ...]


def _rules(path: Path) -> Path:
    return compressed_rules(path, FACTOR, ranges=True)


@dataclass(frozen=True)
class Case:
    scenario: str
    alert: str  # the alert the scenario exists for
    scales: bool  # whether the scale-out must happen
    onset: Callable[[list[dict[str, Any]]], bool]  # the condition, on the simulator's /state


def _queueing(replicas: list[dict[str, Any]]) -> bool:
    vllm = [r for r in replicas if r["kind"] == "vllm" and r["status"] == "up"]
    return sum(int(r["waiting"]) for r in vllm) > 2 * sum(int(r["running"]) for r in vllm)


CASES = [
    Case("surge", "VLLMScaleOutNeeded", True, _queueing),
    Case("kv_pressure", "VLLMKVCacheSaturated", False,
         lambda rs: any(r["kind"] == "vllm" and float(r["kv_cache_usage"]) > 0.95 for r in rs)),
    Case("oom", "VLLMTargetDown", False, lambda rs: any(r["status"] == "dead" for r in rs)),
    Case("slow_interconnect", "VLLMInterTokenLatencyHigh", False, lambda rs: False),
]


def _names(keys: set[Key]) -> set[str]:
    return {dict(k)["alertname"] for k in keys}


def _firing(agent: Agent) -> dict[Key, float]:
    return {a.labels: a.active_at_ms / 1000 for a in agent.rules.alerts() if a.state is AlertState.FIRING}


def _agent_config(tmp: Path, rules: Path, fleet: Fleet, am: Alertmanager, slack: FakeSlack) -> Config:
    token = tmp / "slack-token"
    token.write_text(slack.token)
    return Config.model_validate({
        "nvml": {"enabled": False}, "server": {"listen": "127.0.0.1:0"},
        "rules": {"files": [str(rules)]}, "scrape": {"interval": "1s", "timeout": "1s"},
        "state": {"path": str(tmp / "agent.db")},
        "targets": [{"url": u, "job": "vllm"} for u in fleet.targets],
        "receivers": [
            {"name": "am", "alertmanager": {"urls": [am.url]}},
            {"name": "slack", "slack": {"token_file": str(token), "channel": CHANNEL, "api_url": slack.api_url,
                                        "timeout": "2s"}},
        ],
        "route": {"receiver": "slack", "group_by": ["alertname", "instance"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h",
                  "routes": [{"receiver": "am", "continue": True}, {"receiver": "slack"}]},
        "scaling": {"services": [{
            "name": "vllm", "matchers": ['job="vllm"'], "webhook": {"url": f"{fleet.control_url}/scale"},
            "min_replicas": 2, "max_replicas": 8, "step": 4, "initial_replicas": 2,
            "scale_out_cooldown": "10m"}]},  # longer than a run: once per cooldown is once here
    })


async def _for_restarted(prom: Prometheus, agent: Agent, key: Key) -> str:
    """Which evaluator's ``for`` started over for this alert before it fired ('' if neither's): the agent's
    alert events show a second ``pending``; Prometheus' ``ALERTS_FOR_STATE`` (its activeAt) changed."""
    labels = dict(key)
    pending = [e for e in agent.events if e.alert.labels == key and e.kind == "pending"]
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    changed = await prom.query(f"changes(ALERTS_FOR_STATE{{{matchers}}}[10m]) > 0", time.time())
    return ",".join(who for who, yes in (("agent", len(pending) > 1), ("prometheus", bool(changed))) if yes)


class Onset:
    """Samples the simulator's state for the latency: when the scenario's condition last began to hold
    (a queue hovering at 2 x running can cross and fall back before it stays; its ``for`` starts over)."""

    def __init__(self, fleet: Fleet, case: Case) -> None:
        self.fleet, self.case, self.at = fleet, case, 0.0

    def sample(self) -> None:
        holds = self.case.onset(self.fleet.state())
        if holds and not self.at:
            self.at = time.time()
        elif not holds:
            self.at = 0.0


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.scenario for c in CASES])
async def test_scenario_against_prometheus_alertmanager_and_slack(case: Case, tmp_path: Path) -> None:
    rules = _rules(tmp_path / "vllm.rules.yaml")
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, control_port=0, scenario=case.scenario, speed=FACTOR,
                              step_s=0.1, balance="least_request", dcgm_port=None))
    await fleet.start()
    hosts = [u.split("//")[1].split("/")[0] for u in fleet.targets]
    scrape = [{"job_name": "vllm", "scrape_interval": "1s", "static_configs": [{"targets": hosts}]}]
    onset = Onset(fleet, case)
    try:
        async with (running_fake_slack() as slack, Alertmanager(tmp_path / "am") as am,
                    Prometheus(tmp_path / "prom", [rules], scrape_configs=scrape) as prom):
            agent = Agent(_agent_config(tmp_path, rules, fleet, am, slack))
            await agent.start(serve_http=False)
            try:
                report = await _watch(case, prom, agent, am, slack, fleet=fleet, onset=onset)
            finally:
                await agent.stop()
    finally:
        await fleet.stop()
    print(f"\n{case.scenario}: {report}")


async def _watch(case: Case, prom: Prometheus, agent: Agent, am: Alertmanager, slack: FakeSlack, *,
                 fleet: Fleet, onset: Onset) -> dict[str, Any]:
    async def prometheus_alerts() -> tuple[dict[Key, float], set[Key]]:  # firing (with activeAt), and all
        listed = (await prom.api("alerts"))["alerts"]
        firing = {tuple(sorted(a["labels"].items())): parse_time(a["activeAt"]) for a in listed
                  if a["state"] == "firing"}
        return firing, {tuple(sorted(a["labels"].items())) for a in listed}

    evals: set[int] = set()
    last: dict[str, set[str]] = {}  # what fired in one and was never even pending in the other, by name
    their_fired: set[Key] = set()
    their_active: set[Key] = set()

    async def both_fire() -> tuple[dict[Key, float], dict[Key, float]] | None:
        """The scenario's alert firing in both with the same labels, and every alert that has fired in
        one so far at least pending at some point in the other. Compared by alert name: which replica's
        value hugging a threshold (KV usage at 95 %) crosses it first differs between two independent
        scrapers, and its `for` starts over in one of them."""
        onset.sample()
        evals.update(g.last_eval_ms for g in agent.rules.groups if g.last_eval_ms)
        theirs, active = await prometheus_alerts()
        their_fired.update(theirs)
        their_active.update(active)
        ours = _firing(agent)
        our_fired = {e.alert.labels for e in agent.events if e.kind == "firing"}
        our_active = {e.alert.labels for e in agent.events if e.kind in ("pending", "firing")}
        both = any(dict(k)["alertname"] == case.alert for k in set(theirs) & set(ours))
        last.update(prometheus=_names(their_fired) - _names(our_active), agent=_names(our_fired) - _names(their_active))
        if both and not last["prometheus"] and not last["agent"]:
            return theirs, ours
        await asyncio.sleep(0.2)
        return None

    # kv_pressure's requests are sized so that one waiting at the queue's head seldom empties the KV cache
    # under 95 % (in the model alone: 0.2 % of evaluations from 2 minutes in, tests/simulate/test_model.py),
    # so the alert fires about one `for` (10 model minutes, 40 s here) after the onset: measured 53 s. Before,
    # the cache dipped under 95 % at 3-5 % of evaluations and each dip restarted the `for` (226 s, over
    # 300 s, once over 600 s in CI). The deadline stays generous for a loaded machine; the wait ends when
    # both fire.
    try:
        theirs, ours = await eventually(both_fire, timeout=600, what=f"{case.alert} firing in both")
    except pytest.fail.Exception as exc:  # eventually's timeout: say what differed
        pytest.fail(f"{exc}; fired in one and never pending in the other: {last}")
    times = sorted(evals)
    interval = max((b - a) / 1000 for a, b in itertools.pairwise(times)) if len(times) > 1 else 1.0
    keyed = [k for k in theirs if dict(k)["alertname"] == case.alert and k in ours]
    assert keyed, (case.alert, sorted(theirs), sorted(ours))
    apart = {dict(k).get("instance", ""): round(ours[k] - theirs[k], 2) for k in keyed}
    restarted = {dict(k).get("instance", ""): await _for_restarted(prom, agent, k) for k in keyed}
    for k in keyed:  # one evaluation, plus one scrape: the agent and Prometheus scrape independently
        # A value hugging its threshold (KV usage at 95 %) can dip under it in one scraper's samples and
        # not the other's; that evaluator's `for` then starts over, which either side's own record shows.
        assert abs(ours[k] - theirs[k]) <= interval + 1.0 + 0.5 or restarted[dict(k).get("instance", "")], (
            case.alert, apart, interval, restarted)

    async def in_alertmanager() -> list[dict[str, Any]] | None:
        held = [a for a in await am.alerts() if a["labels"].get("alertname") == case.alert]
        return held or None

    held = await eventually(in_alertmanager, what=f"{case.alert} in Alertmanager's API")
    assert {tuple(sorted(a["labels"].items())) for a in held} <= set(theirs) | set(ours)

    async def posted() -> Any:
        return next((m for m in slack.in_channel(DEFAULT_CHANNELS["alerts"]) if case.alert in m.text), None)

    message = await eventually(posted, what=f"the Slack message for {case.alert}")
    report: dict[str, Any] = {"alerts": sorted({dict(k)["alertname"] for k in theirs}), "apart_s": apart,
                              "for_restarted": restarted, "interval_s": interval, "alertmanager": len(held)}
    if onset.at:  # from the condition in the simulator's own state to the message at the receiver
        report["detection_latency_s"] = round(message.received - onset.at, 1)
    scaled = [r for r in fleet.state() if r["kind"] == "vllm"]
    if case.scales:
        assert len(scaled) == 6, scaled  # one scale-out: 2 + step 4

        async def resolved_in_place() -> Any:
            m = slack.find(message.ts)
            return m if m is not None and m.edits and "RESOLVED" in (m.text + m.header()).upper() else None

        updated = await eventually(resolved_in_place, timeout=120, what="the Slack message updated on resolve")
        report["slack_edits"] = updated.edits
        assert len([r for r in fleet.state() if r["kind"] == "vllm"]) == 6  # still once: the cooldown holds
    else:  # the oom scenario's lost replica can queue the other into one scale-out; never two
        assert len(scaled) in (2, 6), scaled
    report["replicas"] = len([r for r in fleet.state() if r["kind"] == "vllm"])
    return report
