"""Node agent -> central agent: findings forwarded through the outbox into the central incident, two real processes.

Both agents are ``python -m agent run`` processes on 127.0.0.1 (:mod:`tests.e2e`). The central agent scrapes
the test's metrics target and raises ``E2ECondition`` on it; its API needs a bearer token (``server.auth``).
The node agent tails a log file for OOM evidence (``diagnostics.oom.log_files``) and forwards its findings
(``forward:``) with the central agent's token and ``labels: {instance: <the target>}``, so the finding is
about the alert's instance. The test writes a real CUDA OOM excerpt (tests/fixtures/logs) into that log,
then reads the central agent's incidents and its webhook receiver.

* the finding lands in the alert's incident once and is routed to the alert's receiver; a repeated key is a
  duplicate; a bad token is 401, a malformed or huge body 400/413, and none of them is stored;
* central down (SIGKILL) when the finding is made, then up again on the same port and state: delivered once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.diagnose.findings import Finding
from tests import e2e
from tests.conftest import REPO
from tests.e2e import ALERT, AgentProcess, Agents, MetricsTarget, Receiver, quiet, wait_for, write_config
from tests.receivers import free_port

pytestmark = pytest.mark.slow

agents = e2e.agents  # fixtures, bound here so pytest finds them
target = e2e.target
hook = e2e.hook

TOKEN = "central-token-for-tests"
OOM_LOG = REPO / "tests" / "fixtures" / "logs" / "torch_cuda_oom_serving_vllm.txt"


def _central(tmp_path: Path, target: MetricsTarget, hook: Receiver, port: int = 0) -> Path:
    """The central agent: the e2e rule on the target, a webhook receiver, a bearer token, a fixed port if given."""
    work = tmp_path / "central"
    work.mkdir(exist_ok=True)
    path = write_config(work, target=target.url, receivers=[{"name": "hook", "webhook": {"url": hook.url()}}])
    token = work / "token"
    token.write_text(TOKEN + "\n")
    cfg = json.loads(path.read_text())
    cfg["server"] = {"listen": f"127.0.0.1:{port}", "auth": {"bearer_token_file": str(token)}}
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _node(tmp_path: Path, central_url: str, instance: str) -> tuple[Path, Path]:
    """The node agent: no targets, the OOM log tailed, findings forwarded; returns (config, its log file)."""
    work = tmp_path / "node"
    work.mkdir(exist_ok=True)
    log = work / "vllm.log"
    log.write_text("INFO 11-23 18:50:00 api_server.py:1] vLLM API server starting\n")
    token = work / "central-token"
    token.write_text(TOKEN + "\n")
    cfg: dict[str, Any] = {
        "targets": [], "nvml": {"enabled": "false"}, "server": {"listen": "127.0.0.1:0"},
        "scrape": {"interval": "1s", "timeout": "1s"},
        "rules": {"files": [], "evaluation_interval": "1s"},
        "state": {"path": str(work / "state.db")},
        "receivers": [{"name": "console", "console": {}}], "route": {"receiver": "console"},
        "notify": {"dispatch_interval": "1s", "retry_initial": "200ms", "retry_max": "1s"},
        "diagnostics": {"oom": {"log_files": [str(log)]}},
        "forward": {"url": central_url, "token_file": str(token), "timeout": "2s", "labels": {"instance": instance}},
        "log": {"format": "json", "level": "info"},
    }
    path = work / "agent.yaml"
    path.write_text(json.dumps(cfg, indent=1))
    return path, log


def _write_oom(log: Path) -> None:
    lines = [ln for ln in OOM_LOG.read_text().splitlines() if not ln.startswith("# source:")]
    with log.open("a") as fh:
        fh.write("\n".join(lines) + "\n")


def _instance(target: MetricsTarget) -> str:
    return target.url.split("//")[1].split("/")[0]


async def _incident(central: AgentProcess) -> dict[str, Any] | None:
    """The open incident of the e2e alert, if any."""
    return next((i for i in await central.incidents() if i["alertname"] == ALERT and i["status"] == "open"), None)


def _findings(incident: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in incident["events"] if e["kind"] == "finding"]


async def _post(url: str, body: bytes, token: str = TOKEN) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def _firing(central: AgentProcess, target: MetricsTarget) -> dict[str, Any]:
    target.set(1)
    return await wait_for(lambda: _incident(central), what="the central alert's incident", timeout=60)


def _node_kinds(node: AgentProcess) -> list[str]:
    return [str(e["kind"]) for e in node.events() if e.get("event") == "diagnosis finding"]


async def test_a_forwarded_finding_lands_in_the_alert_incident_once(agents: Agents, target: MetricsTarget,
                                                                   hook: Receiver, tmp_path: Path) -> None:
    """The node's OOM finding joins the central E2ECondition incident once and reaches its receiver; bad
    requests (401, 400, 413) store nothing; the same key twice is recorded once."""
    central = await agents.start(_central(tmp_path, target, hook))
    await _firing(central, target)
    intake = f"{central.base}/api/v1/findings"
    valid = {"version": "1", "key": "test:manual:1", "labels": {"instance": _instance(target)},
             "finding": Finding(kind="manual-check", summary="posted by the test").to_json()}

    status, _ = await _post(intake, json.dumps(valid).encode(), token="wrong-token")
    assert status == 401
    status, reply = await _post(intake, json.dumps({**valid, "finding": {"kind": "x"}}).encode())
    assert status == 400 and "finding.summary: missing" in reply["error"]
    huge = {**valid, "finding": {**valid["finding"], "evidence": ["x" * 8000] * 40}}
    status, _ = await _post(intake, json.dumps(huge).encode())
    assert status == 413
    status, _ = await _post(intake, b"{not json")
    assert status == 400
    assert _findings(await _incident(central) or {"events": []}) == []  # nothing stored
    assert await central.metric("sre_agent_intake_findings_total", outcome="invalid") == 3

    node = await agents.start(_node(tmp_path, central.base, _instance(target))[0])
    _write_oom(Path(json.loads(node.config.read_text())["diagnostics"]["oom"]["log_files"][0]))

    async def arrived() -> list[dict[str, Any]]:
        inc = await _incident(central)
        return _findings(inc) if inc else []

    [event] = await wait_for(arrived, what="the forwarded finding in the central incident", timeout=60)
    assert [event["detail"]["kind"]] == _node_kinds(node)
    async def routed_to_hook() -> list[dict[str, Any]]:
        return [r.json() for r in hook.accepted() if r.json().get("kind") == "finding"]

    routed = await wait_for(routed_to_hook, what="the finding at the alert's webhook receiver")
    assert [r["finding"]["kind"] for r in routed] == _node_kinds(node)
    assert routed[0]["finding"]["labels"]["instance"] == _instance(target)  # the node's forward.labels

    first = await _post(intake, json.dumps(valid).encode())
    again = await _post(intake, json.dumps(valid).encode())
    assert first[0] == again[0] == 200
    assert (first[1]["data"]["duplicate"], again[1]["data"]["duplicate"]) == (False, True)
    await quiet(central)
    inc = await _incident(central)
    assert inc is not None
    assert sorted(e["detail"]["kind"] for e in _findings(inc)) == sorted([*_node_kinds(node), "manual-check"])
    assert await node.metric("sre_agent_outbox_depth", receiver="forward:central") in (0.0, None)
    assert await node.metric("sre_agent_notifications_sent_total", receiver="forward:central") == 1


async def test_a_finding_made_while_central_is_down_is_delivered_once_when_it_is_back(
        agents: Agents, target: MetricsTarget, hook: Receiver, tmp_path: Path) -> None:
    """Central SIGKILLed, the node's finding waits in its outbox (retried), central restarted on the same port
    and state: the finding arrives in the still open incident, once."""
    port = free_port()
    config = _central(tmp_path, target, hook, port)
    central = await agents.start(config)
    await _firing(central, target)
    node_config, log = _node(tmp_path, f"http://127.0.0.1:{port}", _instance(target))
    node = await agents.start(node_config)
    central.kill()
    _write_oom(log)

    async def retried() -> bool:
        return bool(await node.metric("sre_agent_notifications_retried_total", receiver="forward:central"))

    await wait_for(retried, what="the node agent retrying while central is down", timeout=60)
    assert await node.metric("sre_agent_outbox_depth", receiver="forward:central") == 1
    central = await agents.start(config)

    async def arrived() -> list[dict[str, Any]]:
        inc = await _incident(central)
        return _findings(inc) if inc else []

    [event] = await wait_for(arrived, what="the finding after central came back", timeout=60)
    assert [event["detail"]["kind"]] == _node_kinds(node)
    await quiet(central)
    inc = await _incident(central)
    assert inc is not None and len(_findings(inc)) == 1
    assert await node.metric("sre_agent_notifications_sent_total", receiver="forward:central") == 1
