"""Two real ``sre-agent run`` replicas with the same config (docs/ha.md), everything on 127.0.0.1.

* ``kubernetes`` mode against tests/fake_kube.py: one leader; Slack and the webhook get each
  notification once; kill -9 of the leader while a receiver is down: the other takes over within
  the lease, nothing is lost, and the duplicates are counted (printed for the report).
* ``alertmanager_only`` mode: both replicas' alerts reach a real Alertmanager 0.25 with identical
  labels (it holds one alert and notifies once), and their remote-written ALERTS series in a real
  VictoriaMetrics carry the replica label, one series per replica.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests import alertmanager as am_helper
from tests import e2e
from tests.alertmanager import Alertmanager
from tests.e2e import ALERT, AgentProcess, Agents, MetricsTarget, Receiver, wait_for, write_config
from tests.fake_kube import FakeKube, running_fake_kube
from tests.fake_slack import FakeSlack, running_fake_slack
from tests.victoriametrics import VictoriaMetrics

pytestmark = pytest.mark.slow

agents = e2e.agents  # fixtures, bound here so pytest finds them
alertmanager = am_helper.alertmanager
target = e2e.target
hook = e2e.hook

CHANNEL = "C0123ABCD"  # the fake Slack's #alerts
LEASE_S, RENEW_S, RETRY_S = 3, 2, 1  # the shortest timings the kubernetes client accepts


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with running_fake_kube() as fake:
        yield fake


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with running_fake_slack() as fake:
        yield fake


def _replica(tmp_path: Path, name: str, ha: dict[str, Any], **kwargs: Any) -> Path:
    """One replica's config: the shared one, plus its own state database and identity (what a pod's name
    and volume give each StatefulSet replica)."""
    d = tmp_path / name
    d.mkdir()
    path = write_config(d, **kwargs)
    config = json.loads(path.read_text())
    config["ha"] = {**ha, "identity": name}
    path.write_text(json.dumps(config, indent=1))
    return path


async def _leader(*replicas: AgentProcess) -> AgentProcess:
    async def one() -> AgentProcess | None:
        leading = [r for r in replicas if await r.metric("sre_agent_leader", identity=r.config.parent.name) == 1]
        assert len(leading) <= 1, [r.config.parent.name for r in leading]
        return leading[0] if leading else None
    return await wait_for(one, what="exactly one leader")


async def _sent(agent: AgentProcess, receiver: str) -> float:
    return await agent.metric("sre_agent_notifications_sent_total", receiver=receiver) or 0.0


@pytest.mark.parametrize("settled", [False, True], ids=["kill-at-once", "kill-after-settling"])
async def test_kill_leader_while_a_receiver_is_down_loses_nothing(
        tmp_path: Path, agents: Agents, target: MetricsTarget, hook: Receiver, *, slack: FakeSlack,
        kube: FakeKube, settled: bool) -> None:
    """Firing: one Slack message and one webhook firing, from the leader only. Then the webhook goes
    down, the alert resolves, the leader is killed: the follower takes over within lease_duration + 2 x
    retry_period and delivers the resolve once the webhook is back. Killed right after Slack got the
    resolve, the new leader may send it again (the at-least-once window); killed once the follower has
    settled it (the leader's Slack watermark passed it, while the webhook's is held back), never."""
    token = tmp_path / "slack-token"
    token.write_text(slack.token)
    receivers = [{"name": "hook", "webhook": {"url": hook.url("/hook"), "timeout": "2s"}},
                 {"name": "slack", "slack": {"token_file": str(token), "channel": CHANNEL, "api_url": slack.api_url,
                                             "timeout": "2s"}}]
    ha = {"mode": "kubernetes", "lease": {"kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig")),
                                          "lease_duration": f"{LEASE_S}s", "renew_deadline": f"{RENEW_S}s",
                                          "retry_period": f"{RETRY_S}s"}}
    a = await agents.start(_replica(tmp_path, "a", ha, target=target.url, receivers=receivers))
    b = await agents.start(_replica(tmp_path, "b", ha, target=target.url, receivers=receivers))
    leader = await _leader(a, b)
    follower = b if leader is a else a
    target.set(1)

    async def fired_and_settled() -> bool:  # the follower's held copies settled by the leader's watermark
        # (its copies are created a moment after the leader's, so an empty outbox alone can come too early:
        # wait for the settling itself, logged per receiver)
        settled = {str(e.get("receiver")) for e in follower.events()
                   if e.get("event") == "held notifications settled: the leader delivered them"}
        return (bool(hook.accepted_with("firing")) and bool(slack.in_channel(CHANNEL)) and settled >= {"hook", "slack"}
                and await follower.metric("sre_agent_outbox_depth", receiver="hook") == 0
                and await follower.metric("sre_agent_outbox_depth", receiver="slack") == 0)

    await wait_for(fired_and_settled, what="firing delivered by the leader, settled on the follower")
    assert len(hook.accepted_with("firing")) == 1 and len(slack.in_channel(CHANNEL)) == 1
    assert await _sent(follower, "hook") == 0 and await _sent(follower, "slack") == 0
    ha = (await follower.api("status"))["ha"]
    assert (ha["leader"], ha["holder"]) == (False, leader.config.parent.name)
    assert set(ha["watermarks_seen"]) == {"hook", "slack"}

    await hook.stop()  # the webhook goes down; the resolve queues behind it on both replicas
    target.set(0)

    async def resolve_stuck() -> bool:
        retried = await leader.metric("sre_agent_notifications_retried_total", receiver="hook") or 0
        return retried >= 1 and any("[RESOLVED]" in m.header() for m in slack.messages)

    await wait_for(resolve_stuck, what="the leader retrying the resolve to the webhook; Slack updated")
    if settled:
        async def slack_settled() -> bool:
            return (await follower.metric("sre_agent_outbox_depth", receiver="slack") == 0
                    and await follower.metric("sre_agent_outbox_depth", receiver="hook") == 1)

        await wait_for(slack_settled, what="the follower's Slack resolve settled, its webhook resolve held")
    killed_at = leader.kill()
    took_over = await wait_for(lambda: _became_leader(follower, after=killed_at),
                               what="the follower taking over", timeout=LEASE_S + 4 * RETRY_S + 10)
    takeover_s = took_over - killed_at
    await hook.start()

    async def resolved() -> bool:
        return bool(hook.accepted_with("resolved"))

    await wait_for(resolved, what="the resolve delivered by the new leader")
    await wait_for(lambda: _empty(follower), what="the new leader's outbox empty")
    firing, resolves = len(hook.accepted_with("firing")), len(hook.accepted_with("resolved"))
    posts = len(slack.calls_to("chat.postMessage"))
    updates = len(slack.calls_to("chat.update"))
    # one message and one update were due; the new leader has no message ref for the old leader's message,
    # so a resend of the resolve is a new message (a duplicate), never a lost one
    duplicates = {"webhook": firing + resolves - 2, "slack": posts + updates - 2}
    print(f"HA takeover after kill -9 ({'after settling' if settled else 'at once'}): {takeover_s:.1f}s; "
          f"duplicates {duplicates}; "
          f"lease conflicts {kube.conflicts}")
    assert firing >= 1 and resolves >= 1  # nothing lost
    assert firing == 1  # settled before the kill: exactly once
    if settled:
        assert duplicates == {"webhook": 0, "slack": 0}
    assert takeover_s <= LEASE_S + 2 * RETRY_S + 1.5, takeover_s
    assert kube.holder() == follower.config.parent.name


async def _became_leader(agent: AgentProcess, *, after: float) -> float | None:
    for e in agent.events():
        if e.get("event") == "became leader: sending to direct receivers":
            at = e2e.parse_time(str(e["timestamp"]))
            if at > after:
                return at
    return None


async def _empty(agent: AgentProcess) -> bool:
    return all([await agent.metric("sre_agent_outbox_depth", receiver=r) in (0, None) for r in ("hook", "slack")])


async def test_alertmanager_only_pair_sends_identical_alerts_and_labels_what_it_writes(
        tmp_path: Path, agents: Agents, target: MetricsTarget, alertmanager: Alertmanager) -> None:
    """Alertmanager holds one alert from the two replicas and notifies once; VictoriaMetrics holds each
    replica's ALERTS series, told apart by the replica label."""
    async with VictoriaMetrics(tmp_path / "vm") as vm:
        receivers = [{"name": "am", "alertmanager": {"urls": [alertmanager.url]}}]
        extra = {"remote_write": [{"url": vm.write_url, "write": ["alerts"]}]}
        # the target's series carry replica="a" already, and a series' own label wins over an external one
        # (Prometheus' rule): the pair's label is named agent_replica here
        ha = {"mode": "alertmanager_only", "replica_label": "agent_replica"}
        configs = [_replica(tmp_path, name, ha, target=target.url, receivers=receivers)
                   for name in ("a", "b")]
        for path in configs:
            config = json.loads(path.read_text())
            path.write_text(json.dumps({**config, **extra}))
        replicas = [await agents.start(path) for path in configs]
        target.set(1)

        async def both_posted() -> bool:
            return all([await _sent(r, "am[0]") >= 1 and await r.alert_state() == "firing" for r in replicas])

        await wait_for(both_posted, what="both replicas posting the firing alert")
        held = [a for a in await alertmanager.alerts() if a["labels"].get("alertname") == ALERT]
        assert len(held) == 1, held
        assert "agent_replica" not in held[0]["labels"]
        await alertmanager.wait_webhook(lambda p: p["status"] == "firing", what="Alertmanager's notification")

        async def written() -> list[dict[str, Any]]:
            return await vm.settled(f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}', time.time(),
                                    until=lambda r: len(r) == 2)

        series = await wait_for(written, what="both replicas' ALERTS in VictoriaMetrics")
        assert sorted(s["metric"]["agent_replica"] for s in series) == ["a", "b"]
        labels = [{k: v for k, v in s["metric"].items() if k != "agent_replica"} for s in series]
        assert labels[0] == labels[1]
        await e2e.quiet(replicas[0])
        firing_notifications = [p for p in alertmanager.webhooks() if p["status"] == "firing"]
        assert len(firing_notifications) == 1, firing_notifications
