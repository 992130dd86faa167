"""End-to-end fault tests: the real agent process against receivers that fail, kill -9, and restarts.

Each test runs ``python -m agent run`` on a config written into ``tmp_path`` (scrape and
evaluation every 1 s, ``E2ECondition: e2e_condition > 0`` for 4 s, group_wait and
group_interval 1 s), flips the condition on a local metrics target, and checks what
the receivers got: a recording webhook, the fake Slack Web API, a real Alertmanager
0.25, the simulator fleet's ``POST /scale``. Killing is SIGKILL, so nothing the agent
does on a clean shutdown (draining the outbox, closing the database) helps it; the
restart uses the same config and state database. See :mod:`tests.e2e` for the helpers.

Nothing here waits for a fixed time: each step polls for what it needs with a deadline,
timing bounds come from recorded timestamps and the configured intervals, and a check that
something did *not* happen first waits for a later event that proves the agent ran on (a
resolve behind it in the same FIFO queue, the restarted agent's own decision, or an
evaluation :data:`tests.e2e.SETTLE_S` on by the agent's clock). Marked ``slow``: each test
runs agent processes for several evaluation intervals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.simulate.server import Fleet, FleetConfig
from tests import alertmanager as am_helper
from tests import e2e
from tests.alertmanager import Alertmanager
from tests.e2e import (
    ALERT,
    FOR_S,
    INTERVAL_S,
    AgentProcess,
    Agents,
    MetricsTarget,
    Receiver,
    parse_time,
    quiet,
    wait_for,
    write_config,
)
from tests.fake_slack import FakeSlack, SlackMessage, running_fake_slack
from tests.receivers import Recorded

pytestmark = pytest.mark.slow

agents = e2e.agents  # fixtures, bound here so pytest finds them
alertmanager = am_helper.alertmanager
target = e2e.target
hook = e2e.hook

CHANNEL = "C0123ABCD"  # the fake Slack's #alerts
MS = 0.001  # the agent keeps times in whole milliseconds (and floats add a little on top)
OUTAGE_RETRIES = 2  # failed attempts the stopped webhook sees with both notifications queued: an outage, not a blip
OUTAGE_S = 2 * INTERVAL_S  # how long the killed agent stays dead: the fault injected, not a wait for anything


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    """The fake Slack Web API."""
    async with running_fake_slack() as fake:
        yield fake


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    """The simulator fleet, two vLLM replicas; its control port takes the scale webhook."""
    f = Fleet(FleetConfig(replicas=2, base_port=0, control_port=0))
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


def _webhook(receiver: Receiver) -> dict[str, Any]:
    return {"name": "hook", "webhook": {"url": receiver.url("/hook"), "timeout": "2s"}}


def _slack(tmp_path: Path, fake: FakeSlack) -> dict[str, Any]:
    token = tmp_path / "slack-token"
    token.write_text(fake.token)
    return {"name": "slack", "slack": {"token_file": str(token), "channel": CHANNEL, "api_url": fake.api_url,
                                       "timeout": "2s"}}


async def _retried(agent: AgentProcess, receiver: str) -> float:
    return await agent.metric("sre_agent_notifications_retried_total", receiver=receiver) or 0.0


async def _outbox_empty(agent: AgentProcess, *receivers: str) -> None:
    """Wait until these receivers' outbox queues are empty: all acknowledged, so no retry can follow."""
    async def empty() -> bool:
        return all([await agent.metric("sre_agent_outbox_depth", receiver=r) == 0 for r in receivers])

    await wait_for(empty, what=f"the outbox of {', '.join(receivers)} acknowledged and empty")


def _vllm_replicas(fleet: Fleet) -> int:
    return sum(1 for r in fleet.state() if r["kind"] == "vllm")


def _only_message(fake: FakeSlack) -> SlackMessage:
    messages = fake.in_channel(CHANNEL)
    assert len(messages) == 1, [m.header() for m in messages]
    return messages[0]


def _assert_updated_in_place(fake: FakeSlack, message: SlackMessage) -> None:
    """The Slack message turned [RESOLVED] through chat.update of its own channel ID and ts."""
    assert message.edits == 1
    assert message.header().endswith(f"[RESOLVED] {ALERT}")
    updates = fake.calls_to("chat.update")
    assert updates and all((c.body["channel"], c.body["ts"]) == (message.channel, message.ts) for c in updates)


async def test_receivers_down_then_back_get_firing_and_resolved_once(
        tmp_path: Path, agents: Agents, target: MetricsTarget, hook: Receiver, slack: FakeSlack) -> None:
    """A webhook answering 503, then refusing connections while the alert fires and resolves, gets each once later."""
    hook.status = 503
    slack.fail(None, status=500, times=3)  # Slack's API answers 500 to the first three calls
    config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook), _slack(tmp_path, slack)])
    target.set(1)
    agent = await agents.start(config)

    async def refused() -> list[Recorded]:
        return hook.refused()

    await wait_for(refused, what="the webhook refusing the firing notification")
    await hook.stop()  # from now on: connection refused
    target.set(0)

    async def both_queued() -> bool:
        return await agent.metric("sre_agent_outbox_depth", receiver="hook") == 2

    await wait_for(both_queued, what="firing and resolved waiting in the webhook's outbox queue")
    retried = await _retried(agent, "hook")

    async def outage_outlasts_retries() -> bool:  # the receiver stays down across further attempts
        return await _retried(agent, "hook") >= retried + OUTAGE_RETRIES

    await wait_for(outage_outlasts_retries, what=f"{OUTAGE_RETRIES} more attempts refused by the stopped webhook")
    assert await agent.metric("sre_agent_outbox_depth", receiver="hook") == 2
    hook.status = 200
    await hook.start()

    async def resolved_delivered() -> list[Recorded]:
        return hook.accepted_with("resolved")

    async def slack_resolved() -> bool:
        return any("[RESOLVED]" in m.header() for m in slack.messages)

    await wait_for(resolved_delivered, what="the resolved notification")
    await wait_for(slack_resolved, what="the Slack message updated to resolved")
    await _outbox_empty(agent, "hook", "slack")
    await quiet(agent, what="the agent running on after both receivers acknowledged")
    accepted = hook.accepted()
    assert [r.json()["status"] for r in accepted] == ["firing", "resolved"]
    assert len({r.key for r in accepted}) == 2 and all(r.key for r in accepted)  # distinct Idempotency-Keys
    assert await agent.metric("sre_agent_outbox_depth", receiver="hook") == 0
    assert not slack.faults  # the 500s were really answered
    _assert_updated_in_place(slack, _only_message(slack))


async def test_kill_while_pending_does_not_fire_early(tmp_path: Path, agents: Agents, target: MetricsTarget,
                                                      hook: Receiver) -> None:
    """Killed while pending, the alert's activeAt moves forward by the downtime and it fires once, not early."""
    config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook)])
    agent = await agents.start(config)
    on_at = target.set(1)

    async def pending() -> float | None:
        return await agent.active_at() if await agent.alert_state() == "pending" else None

    active_before = await wait_for(pending, what="the alert pending")

    async def still_pending() -> float | None:  # pending through one more evaluation: FOR_S is still ahead
        last = await agent.last_evaluation()
        return last if last > active_before and await agent.alert_state() == "pending" else None

    last_eval = await wait_for(still_pending, what="an evaluation with the alert still pending")
    agent.kill()  # the evaluation saved last is last_eval's or a later one
    dead_at = time.time()  # reaped: nothing it saved is later than this
    await asyncio.sleep(OUTAGE_S)
    restart_at = time.time()
    agent = await agents.start(config)
    restored_at = agent.event_time("alert state restored")  # logged just after the restore read the clock
    assert restored_at is not None, "the restarted agent did not restore the pending alert"
    active_after = await agent.active_at()
    assert active_after is not None
    # The downtime as the agent counts it: from its last saved evaluation (in [last_eval, dead_at]) to the
    # restore (in [restart_at, restored_at]).
    shift = active_after - active_before
    assert restart_at - dead_at - MS <= shift <= restored_at - last_eval + MS, (
        shift, restart_at - dead_at, restored_at - last_eval)

    async def fired() -> list[Recorded]:
        return hook.accepted_with("firing")

    first = (await wait_for(fired, what="the firing notification"))[0]
    starts_at = parse_time(first.json()["alerts"][0]["startsAt"])
    assert starts_at >= active_after + FOR_S - MS  # `for` counted from the moved activeAt
    assert starts_at - on_at >= FOR_S + shift - INTERVAL_S
    target.set(0)  # the resolve queues behind any second firing (one FIFO queue per receiver)

    async def resolved() -> list[Recorded]:
        return hook.accepted_with("resolved")

    await wait_for(resolved, what="the resolved notification")
    assert [r.json()["status"] for r in hook.accepted()] == ["firing", "resolved"]  # fired once


async def test_kill_while_firing_sends_no_second_firing(tmp_path: Path, agents: Agents, target: MetricsTarget,
                                                        hook: Receiver, slack: FakeSlack) -> None:
    """Killed while firing, the restarted agent sends no second firing; the resolve updates the same Slack message."""
    config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook), _slack(tmp_path, slack)])
    target.set(1)
    agent = await agents.start(config)

    async def both_acknowledged() -> bool:
        # Received *and* acknowledged in the agent's outbox. A kill between a receiver's 200 and that
        # commit is the at-least-once window: the retry then carries the same Idempotency-Key.
        delivered = bool(hook.accepted_with("firing")) and bool(slack.in_channel(CHANNEL))
        return delivered and all([await agent.metric("sre_agent_outbox_depth", receiver=r) == 0
                                  for r in ("hook", "slack")])

    await wait_for(both_acknowledged, what="the firing notification acknowledged by the webhook and Slack")
    agent.kill()
    restarted_at = time.time()
    agent = await agents.start(config)
    assert await agent.alert_state() == "firing"
    await agent.evaluated_after(restarted_at + 2 * INTERVAL_S, what="evaluations after the restart")
    await quiet(agent, what="the restarted agent running on")
    assert len(hook.accepted()) == 1
    message = _only_message(slack)
    assert message.edits == 0 and message.header().endswith(f"[FIRING:1] {ALERT}")

    target.set(0)

    async def resolved() -> bool:
        return bool(hook.accepted_with("resolved")) and any("[RESOLVED]" in m.header() for m in slack.messages)

    await wait_for(resolved, what="the resolved notification on the webhook and in Slack")
    await _outbox_empty(agent, "hook", "slack")
    await quiet(agent, what="the agent running on after both receivers acknowledged")
    assert [r.json()["status"] for r in hook.accepted()] == ["firing", "resolved"]
    _assert_updated_in_place(slack, _only_message(slack))

    incidents = [i for i in await agent.incidents() if i["alertname"] == ALERT]
    assert len(incidents) == 1 and incidents[0]["status"] == "resolved"
    kinds = [e["kind"] for e in incidents[0]["events"]]
    assert kinds.count("fired") == 1 and kinds.count("resolved") == 1
    notified = sorted((e["detail"]["receiver"], e["detail"]["status"]) for e in incidents[0]["events"]
                      if e["kind"] == "notified")
    assert notified == [("hook", "firing"), ("hook", "resolved"), ("slack", "firing"), ("slack", "resolved")]


async def test_kill_during_scale_out_cooldown_does_not_scale_again(
        tmp_path: Path, agents: Agents, target: MetricsTarget, hook: Receiver, fleet: Fleet) -> None:
    """Killed within scale_out_cooldown, the restarted agent keeps the cooldown: one scale-out, 2 -> 3."""
    scaling = {"services": [{
        "name": "vllm", "matchers": [f'job="{e2e.JOB}"'], "webhook": {"url": f"{fleet.control_url}/scale"},
        "min_replicas": 2, "max_replicas": 8, "scale_out_cooldown": "60s",
    }]}
    config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook)], scale_out=True, scaling=scaling)
    assert _vllm_replicas(fleet) == 2
    target.set(1)
    agent = await agents.start(config)

    async def scaled_out() -> bool:
        return _vllm_replicas(fleet) == 3

    await wait_for(scaled_out, what="the simulator scaled out to 3 replicas")
    agent.kill()
    restarted_at = time.time()
    agent = await agents.start(config)
    assert await agent.alert_state() == "firing"
    await agent.evaluated_after(restarted_at + 2 * INTERVAL_S, what="evaluations after the restart")

    async def decided() -> dict[str, Any] | None:  # asked on every evaluation while firing; logged the first time
        return next((e for e in agent.events() if e.get("event") in ("scale refused", "scale decided")
                     and e.get("direction") == "out"), None)

    decision = await wait_for(decided, what="the restarted agent's scale-out decision")
    assert decision["event"] == "scale refused" and "scale_out_cooldown" in decision["reason"], decision
    await _outbox_empty(agent, "scale:vllm")  # nothing queued for the fleet, no retry of the first request
    assert _vllm_replicas(fleet) == 3
    assert await agent.alert_state() == "firing"
    assert await agent.metric("sre_agent_desired_replicas", service="vllm") == 3
    [incident] = [i for i in await agent.incidents() if i["alertname"] == ALERT]
    actions = [e["detail"] for e in incident["events"] if e["kind"] == "action"]
    assert [(a["action"], a["from_replicas"], a["to_replicas"]) for a in actions] == [("scale_out", 2, 3)]


async def test_kill_with_notification_in_outbox_delivers_once(tmp_path: Path, agents: Agents, target: MetricsTarget,
                                                              hook: Receiver) -> None:
    """A notification queued while the receiver is down survives kill -9 and is delivered exactly once."""
    await hook.stop()
    config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook)])
    target.set(1)
    agent = await agents.start(config)

    async def queued_and_retried() -> bool:
        depth = await agent.metric("sre_agent_outbox_depth", receiver="hook")
        retried = await agent.metric("sre_agent_notifications_retried_total", receiver="hook")
        return depth == 1 and (retried or 0) >= 1

    await wait_for(queued_and_retried, what="the firing notification queued and its delivery failing")
    agent.kill()
    await hook.start()
    agent = await agents.start(config)

    async def delivered() -> list[Recorded]:
        return hook.accepted()

    await wait_for(delivered, what="the queued notification delivered after the restart")
    target.set(0)  # the resolve queues behind any second firing (one FIFO queue per receiver)

    async def resolved() -> list[Recorded]:
        return hook.accepted_with("resolved")

    await wait_for(resolved, what="the resolved notification")
    await _outbox_empty(agent, "hook")
    assert [r.json()["status"] for r in hook.accepted()] == ["firing", "resolved"]  # the firing once


async def test_alertmanager_keeps_starts_at_across_kill(tmp_path: Path, agents: Agents, target: MetricsTarget,
                                                        hook: Receiver, alertmanager: Alertmanager) -> None:
    """A real Alertmanager holds the alert with the agent's firing time, unchanged and active after kill -9."""
    async with Receiver() as copy:  # a second "Alertmanager" that records exactly what the agent posts
        am = {"name": "am", "alertmanager": {"urls": [alertmanager.url, copy.url("")], "timeout": "2s"}}
        config = write_config(tmp_path, target=target.url, receivers=[_webhook(hook), am])
        target.set(1)
        agent = await agents.start(config)

        async def fired() -> list[Recorded]:
            return hook.accepted_with("firing")

        first = (await wait_for(fired, what="the firing notification on the webhook"))[0]
        fired_at = parse_time(first.json()["alerts"][0]["startsAt"])
        logged = agent.event_time("alert state changed", state="firing")  # logged right after that evaluation
        assert logged is not None and logged >= fired_at
        [incident] = [i for i in await agent.incidents() if i["alertname"] == ALERT]
        assert parse_time(incident["startsAt"]) == fired_at  # the time of the evaluation that fired it

        async def held() -> dict[str, Any] | None:
            return next((a for a in await alertmanager.alerts() if a["labels"].get("alertname") == ALERT), None)

        before = await wait_for(held, what="the alert in Alertmanager")
        assert parse_time(before["startsAt"]) == fired_at and before["status"]["state"] == "active"

        agent.kill()
        restarted_at = time.time()
        agent = await agents.start(config)

        async def posted_again() -> list[Recorded]:
            return [r for r in copy.accepted("/api/v2/alerts") if r.at > restarted_at]

        resent = (await wait_for(posted_again, what="the restarted agent posting to Alertmanager"))[0]
        [sent] = [a for a in resent.json() if a["labels"]["alertname"] == ALERT]
        assert parse_time(sent["startsAt"]) == fired_at  # what the restarted agent sent, not Alertmanager's merge

        async def updated() -> dict[str, Any] | None:
            alert = await held()
            return alert if alert is not None and parse_time(alert["updatedAt"]) > restarted_at else None

        after = await wait_for(updated, what="Alertmanager updated by the restarted agent")
        assert parse_time(after["startsAt"]) == fired_at
        assert after["status"]["state"] == "active" and parse_time(after["endsAt"]) > time.time()
