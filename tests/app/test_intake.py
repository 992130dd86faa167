"""Tests for ``POST /api/v1/alertmanager/webhook`` with real parts: a real Alertmanager 0.25 whose webhook
receiver points at the agent (with the agent's bearer token), the fake Slack Web API, the state database
refusing writes, and the agent process killed with SIGKILL after it answered.

* in-process (:class:`~agent.app.daemon.Agent` in the test's loop): the HTTP answers (401, 400 naming the
  problem, 200), and the whole story through Alertmanager: an alert posted to ``/api/v2/alerts`` reaches the
  agent, is diagnosed (the OOM diagnosis on the GPU it names, from memory history in the agent's store), the
  Slack message and the finding in its thread appear once however often Alertmanager re-sends, the resolve
  updates the message in place and closes the incident; and a 503 while commits fail, Alertmanager's retry
  then accepted once.
* process (``python -m agent run``): a webhook answered 200 and then SIGKILL before the dispatch round is
  processed after the restart, once, and not again after a second restart.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.act.intake import parse_webhook
from agent.act.notification import fingerprint
from agent.act.state import StateDB, iso_ms
from agent.app.daemon import Agent
from agent.config import Config
from agent.series import labels_from
from tests import alertmanager as am_helper
from tests import e2e
from tests.alertmanager import Alertmanager, eventually
from tests.e2e import Agents, Receiver, quiet, wait_for, write_config
from tests.fake_slack import FakeSlack, running_fake_slack
from tests.statefiles import FULL, full_disk

agents = e2e.agents  # fixtures, bound here so pytest finds them
target = e2e.target
hook = e2e.hook
alertmanager_factory = am_helper.alertmanager_factory

TOKEN = "intake-token-for-tests"
CHANNEL = "C0123ABCD"  # the fake Slack's #alerts
PATH = "/api/v1/alertmanager/webhook"
ALERT = "DCGMFramebufferNearFull"  # not a bundled name: it gets the OOM diagnosis because it looks like one
HOST = "gpu-node-1"
TOTAL_MIB = 80_000


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent-token"
    path.write_text(TOKEN + "\n")
    return path


def _config(tmp_path: Path, slack: FakeSlack | None = None, **changes: Any) -> Config:
    receivers: list[dict[str, Any]] = [{"name": "console", "console": {}}]
    if slack is not None:
        (tmp_path / "slack-token").write_text(slack.token)
        receivers = [{"name": "slack", "slack": {"token_file": str(tmp_path / "slack-token"), "channel": CHANNEL,
                                                 "api_url": slack.api_url, "max_messages_per_second": 1000}}]
    data = {
        "targets": [], "nvml": {"enabled": False}, "rules": {"files": []},
        "server": {"listen": "127.0.0.1:0", "auth": {"bearer_token_file": str(_token_file(tmp_path))}},
        "state": {"path": str(tmp_path / "state.db")},
        "receivers": receivers,
        "route": {"receiver": receivers[0]["name"], "group_by": ["alertname"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "notify": {"dispatch_interval": "200ms", "retry_initial": "200ms", "retry_max": "1s"},
    }
    return Config.model_validate(data | changes, context={"environ": {}})


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with running_fake_slack() as fake:
        yield fake


@pytest.fixture
async def started(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Agent]:
    """A started in-process agent (no rules of its own, Slack as the receiver, the default actions)."""
    agent = Agent(_config(tmp_path, slack))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


def _url(agent: Agent) -> str:
    return f"http://127.0.0.1:{agent.port}{PATH}"


def _gpu_history(agent: Agent, peak: float) -> None:
    """dcgm-exporter's FB_USED/FB_FREE (MiB) for GPU 0 of HOST over the last 5 minutes, peaking at ``peak``."""
    labels = {"Hostname": HOST, "gpu": "0", "UUID": f"GPU-{HOST}-0", "modelName": "NVIDIA H100 80GB HBM3",
              "instance": f"{HOST}:9400", "job": "dcgm-exporter"}
    now = time.time()
    for i in range(20):
        t, used = int((now - 300 + 15 * i) * 1000), peak if i == 18 else 70_000.0
        agent.store.append(labels_from("DCGM_FI_DEV_FB_USED", labels), t, used)
        agent.store.append(labels_from("DCGM_FI_DEV_FB_FREE", labels), t, TOTAL_MIB - used)


def _am_alert(starts: float, ends: float | None = None) -> dict[str, Any]:
    """The alert as Prometheus would post it to Alertmanager's API v2."""
    item: dict[str, Any] = {
        "labels": {"alertname": ALERT, "severity": "warning", "Hostname": HOST, "gpu": "0",
                   "UUID": f"GPU-{HOST}-0", "instance": f"{HOST}:9400", "job": "dcgm-exporter"},
        "annotations": {"summary": "GPU framebuffer almost full.",
                        "runbook_url": "https://runbooks.example/DCGMFramebufferNearFull"},
        "startsAt": iso_ms(int(starts * 1000)), "generatorURL": "http://prometheus:9090/graph"}
    if ends is not None:
        item["endsAt"] = iso_ms(int(ends * 1000))
    return item


def _metric(agent: Agent, name: str, **labels: str) -> float:
    value = agent.registry.get_sample_value(name, labels)
    return value or 0.0


# -- the HTTP answers ---------------------------------------------------------------------------------------------

def _webhook_body(**extra: Any) -> dict[str, Any]:
    alert = {"status": "firing", "labels": {"alertname": "X", "instance": "a"}, "annotations": {},
             "startsAt": "2025-06-15T15:00:00.123456789Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
             "fingerprint": "0123456789abcdef"}
    return {"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing", "receiver": "agent",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am:9093",
            "alerts": [alert], **extra}


async def test_the_endpoint_needs_the_token_and_names_what_is_wrong(tmp_path: Path) -> None:
    """No token: 401. Not a webhook: 400 naming the field (nothing stored). A webhook: 200 with the counts,
    and the same again is all duplicates."""
    agent = Agent(_config(tmp_path))
    await agent.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(agent), json=_webhook_body()) as r:
                assert r.status == 401
            for body, word in ((_webhook_body(version="3"), "version"), (_webhook_body(alerts=[{}]), "alerts[0]"),
                               ([_webhook_body()], "object"), (b"[" * 100_000 + b"]" * 100_000, "nested")):
                kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
                async with http.post(_url(agent), headers={**auth, "Content-Type": "application/json"}, **kw) as r:
                    assert r.status == 400, await r.text()
                    assert word in (await r.json())["error"]
            async with http.post(_url(agent), json=_webhook_body(), headers=auth) as r:
                assert r.status == 200
                assert (await r.json())["data"] == {"alerts": 1, "accepted": 1, "duplicates": 0, "own": 0}
            async with http.post(_url(agent), json=_webhook_body(notification_reason="repeat"), headers=auth) as r:
                assert (await r.json())["data"]["duplicates"] == 1
        assert _metric(agent, "sre_agent_intake_webhooks_refused_total", reason="invalid") == 4
    finally:
        await agent.stop()


async def test_intake_alerts_never_go_to_alertmanager_receivers_and_the_agents_own_are_skipped(
        tmp_path: Path) -> None:
    """Loop avoidance: an alert from an Alertmanager reaches the console but not the Alertmanager receiver both
    routes select; an alert with the label set of one the agent's own rules holds is counted ``own`` and dropped."""
    rules = tmp_path / "own.rules.yaml"
    rules.write_text(json.dumps({"groups": [{"name": "own", "rules": [{"alert": "Own", "expr": "vector(1)"}]}]}))
    async with Receiver() as am_api:
        receivers = [{"name": "console", "console": {}}, {"name": "am", "alertmanager": {"urls": [am_api.url("")]}}]
        route = {"receiver": "console", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                 "routes": [{"receiver": "am", "continue": True}, {"receiver": "console"}]}
        stream = io.StringIO()
        agent = Agent(_config(tmp_path, rules={"files": [str(rules)]}, receivers=receivers, route=route),
                      notify_stream=stream)
        await agent.start()
        try:
            await agent.evaluate_all()  # Own fires (for: 0) and goes to Alertmanager: the agent's own path
            body = _webhook_body()
            body["alerts"].append({**body["alerts"][0], "labels": {"alertname": "Own"}, "fingerprint": "ffff"})
            async with aiohttp.ClientSession() as http, http.post(
                    _url(agent), json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert (await r.json())["data"] == {"alerts": 2, "accepted": 1, "duplicates": 0, "own": 1}

            async def printed() -> bool:
                return "X" in stream.getvalue()
            await wait_for(printed, what="the intake alert on the console")

            async def own_sent() -> list[Any]:
                return am_api.accepted()
            await wait_for(own_sent, what="the agent's own alert at the Alertmanager receiver")
            await agent.act.tick()
            assert [a["labels"]["alertname"] for p in am_api.accepted() for a in p.json()] == ["Own"]
            assert [i["alertname"] for i in await agent.incidents_json()].count("X") == 1
        finally:
            await agent.stop()


# -- through a real Alertmanager ----------------------------------------------------------------------------------

async def test_an_alert_posted_to_alertmanager_is_diagnosed_in_slack_once_and_resolved_in_place(
        tmp_path: Path, started: Agent, slack: FakeSlack, alertmanager_factory: Any) -> None:
    """Alertmanager's webhook reaches the agent with its token; the OOM diagnosis of the GPU the alert names goes
    into the Slack message's thread; Alertmanager's re-sends (repeat_interval 2 s) change nothing; the resolve
    edits the message in place; the incident has one fired, one finding and one resolved event."""
    agent = started
    _gpu_history(agent, peak=77_600)  # 97 % of 80,000 MiB
    am: Alertmanager = await alertmanager_factory(webhook_url=_url(agent), bearer_token_file=_token_file(tmp_path),
                                                  repeat_interval="2s")
    starts = time.time() - 60
    await am.post_alerts([_am_alert(starts)])

    async def threaded() -> tuple[Any, Any] | None:
        top = slack.in_channel(CHANNEL)
        replies = slack.replies(top[0].ts) if top else []
        return (top[0], replies[0]) if top and replies else None
    message, finding = await eventually(threaded, what="the Slack message and a finding in its thread")
    assert ALERT in message.header()
    assert "GPU memory on gpu-node-1 reached 97%" in finding.text

    async def resent() -> bool:
        return _metric(agent, "sre_agent_intake_alerts_total", outcome="duplicate") >= 2
    await wait_for(resent, what="Alertmanager re-sending the firing alert (repeat_interval)")
    assert len(slack.in_channel(CHANNEL)) == 1 and len(slack.replies(message.ts)) == 1
    assert _metric(agent, "sre_agent_intake_alerts_total", outcome="accepted") == 1

    await am.post_alerts([_am_alert(starts, ends=time.time())])

    async def resolved() -> bool:
        m = slack.find(message.ts)
        return m is not None and m.edits == 1
    await wait_for(resolved, what="the Slack message updated in place to resolved")
    assert slack.find(message.ts).header().endswith(f"[RESOLVED] {ALERT}")  # type: ignore[union-attr]
    assert len(slack.in_channel(CHANNEL)) == 1
    [incident] = await agent.incidents_json()
    kinds = [e["kind"] for e in incident["events"]]
    assert incident["status"] == "resolved" and incident["alertname"] == ALERT
    assert incident["fingerprint"] == fingerprint(_am_alert(starts)["labels"])
    assert (kinds.count("fired"), kinds.count("finding"), kinds.count("resolved")) == (1, 1, 1)
    assert incident["startsAt"] == _am_alert(starts)["startsAt"]  # activeAt = startsAt


async def test_a_webhook_the_state_database_cannot_store_is_a_503_and_alertmanagers_retry_is_taken_once(
        tmp_path: Path, started: Agent, slack: FakeSlack, alertmanager_factory: Any) -> None:
    """While every commit fails the webhook is answered 503 (nothing half-stored); Alertmanager retries, and
    once commits succeed the alert is accepted and reaches Slack once."""
    agent = started
    disk = await agent.act.db.run(full_disk, agent.act.db)
    disk.full = True
    am: Alertmanager = await alertmanager_factory(webhook_url=_url(agent), bearer_token_file=_token_file(tmp_path))
    await am.post_alerts([_am_alert(time.time() - 60)])

    async def refused() -> bool:
        return _metric(agent, "sre_agent_intake_webhooks_refused_total", reason="unstored") >= 2
    await wait_for(refused, what="the agent answering 503 to Alertmanager and Alertmanager retrying")
    assert slack.in_channel(CHANNEL) == [] and FULL in (agent.act.state_problem or FULL)
    disk.full = False

    async def posted() -> bool:
        return bool(slack.in_channel(CHANNEL))
    await wait_for(posted, what="the Slack message after commits succeed again")
    assert _metric(agent, "sre_agent_intake_alerts_total", outcome="accepted") == 1
    assert len(slack.in_channel(CHANNEL)) == 1
    [incident] = await agent.incidents_json()
    assert [e["kind"] for e in incident["events"]].count("fired") == 1


async def test_processing_that_cannot_commit_leaves_the_inbox_whole_and_runs_once_later(
        started: Agent, slack: FakeSlack) -> None:
    """Accepted, then every commit fails: the dispatch rounds process nothing (the inbox keeps the alert, nothing
    reaches Slack); once commits succeed it is processed once."""
    agent = started
    disk = await agent.act.db.run(full_disk, agent.act.db)
    db, alerts = agent.act.db, parse_webhook(_webhook_body()).alerts

    def accept_then_fill() -> None:  # one writer-thread job: no dispatch round between the two
        db.intake.accept(alerts, now_ms=agent.act.now_ms())
        disk.full = True
    await db.run(accept_then_fill)
    failures = _metric(agent, "sre_agent_state_write_failures_total")

    async def failing() -> bool:
        return _metric(agent, "sre_agent_state_write_failures_total") >= failures + 2
    await wait_for(failing, what="two dispatch rounds failing to commit")
    assert await agent.act.db.run(agent.act.db.intake.depth) == 1 and slack.in_channel(CHANNEL) == []
    disk.full = False

    async def posted() -> bool:
        return bool(slack.in_channel(CHANNEL))
    await wait_for(posted, what="the Slack message once commits succeed")
    assert await agent.act.db.run(agent.act.db.intake.depth) == 0
    assert _metric(agent, "sre_agent_intake_processed_total") == 1
    [incident] = await agent.incidents_json()
    assert [e["kind"] for e in incident["events"]].count("fired") == 1


# -- kill -9 after the 2xx ----------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_a_webhook_accepted_before_a_kill_is_processed_once_after_the_restart(
        tmp_path: Path, agents: Agents, target: e2e.MetricsTarget, hook: Receiver) -> None:
    """The agent answers 200, is SIGKILLed before a dispatch round took the inbox (dispatch_interval 1 h),
    and after the restart the alert is notified once; a second kill and restart notify nothing more."""
    config = write_config(tmp_path, target=target.url,
                          receivers=[{"name": "hook", "webhook": {"url": hook.url("/hook"), "timeout": "2s"}}])
    data = json.loads(config.read_text())
    data["server"]["auth"] = {"bearer_token_file": str(_token_file(tmp_path))}
    slow = {**data, "notify": {**data["notify"], "dispatch_interval": "1h"}}  # only the round at start
    config.write_text(json.dumps(slow))
    agent = await agents.start(config)
    async with aiohttp.ClientSession() as http, http.post(
            f"{agent.base}{PATH}", json=_webhook_body(), headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200 and (await r.json())["data"]["accepted"] == 1
    agent.kill()
    db = StateDB(tmp_path / "state.db")  # what the kill left: the alert committed, not processed
    assert db.intake.depth() == 1 and db.incidents.list() == []
    db.close()
    assert hook.posts() == []

    config.write_text(json.dumps(data))  # dispatch every second again
    agent = await agents.start(config)

    async def notified() -> list[Any]:
        return [p for p in hook.accepted_with("firing") if p.json()["commonLabels"].get("alertname") == "X"]
    await wait_for(notified, what="the accepted alert notified after the restart")
    incidents = await agent.incidents()
    assert [i["alertname"] for i in incidents] == ["X"]
    agent.kill()

    agent = await agents.start(config)
    await quiet(agent)
    assert len(await notified()) == 1
    [incident] = await agent.incidents()
    assert [e["kind"] for e in incident["events"]].count("fired") == 1


HOSTILE_TIMES = [("startsAt", "9999-12-31T23:59:59-01:00"), ("startsAt", "0000-01-01T00:00:00Z"),
                 ("startsAt", "-infinity"), ("endsAt", "9999-12-31T23:30:00.5-00:59"), ("startsAt", "NaN"),
                 ("startsAt", "2025-06-15T15:00:00." + "9" * 60 + "Z"), ("endsAt", "+292278994-08-17T07:12:55Z")]


async def test_hostile_times_and_nesting_are_400s_naming_the_field_and_the_agent_keeps_answering(
        tmp_path: Path) -> None:
    """Out-of-range times (year 10000 via an offset, year 0, infinities, NaN, runaway fractions, past 2**63 ms)
    and deep nesting in either intake are 400s naming the field; nothing is stored, and /incidents still answers."""
    agent = Agent(_config(tmp_path))
    await agent.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    base = f"http://127.0.0.1:{agent.port}"
    deep: Any = 1
    for _ in range(600):
        deep = {"a": deep}
    finding = {"kind": "x", "summary": "s"}
    posts: list[tuple[str, dict[str, Any], str]] = [
        (PATH, _webhook_body(alerts=[{**_webhook_body()["alerts"][0], field: text,
                                      "status": "resolved" if field == "endsAt" else "firing"}]),
         f"alerts[0].{field}") for field, text in HOSTILE_TIMES]
    posts += [(PATH, _webhook_body(extra=deep), "nested"),
              ("/api/v1/findings", {"version": "1", "key": "k1", "finding": {**finding, "details": deep}},
               "finding.details"),
              ("/api/v1/findings", {"version": "1", "key": "k2", "finding": finding,
                                    "alert": {"labels": {"alertname": "X"}, "startsAt": 2**63 + 1}}, "alert.startsAt")]
    try:
        async with aiohttp.ClientSession() as http:
            for path, body, word in posts:
                async with http.post(base + path, json=body, headers=auth) as r:
                    assert r.status == 400, (word, await r.text())
                    assert (await r.json())["error"].startswith(word) or word in (await r.json())["error"]
            async with http.get(base + "/api/v1/incidents", headers=auth) as r:
                assert r.status == 200
                assert (await r.json())["data"]["incidents"] == []
    finally:
        await agent.stop()
