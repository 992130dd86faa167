"""Tests for the agent when its state database stops taking writes (disk full, I/O error) and recovers.

Two variants of the same story: an alert starts firing while no write succeeds; the agent keeps the
firing event, its incident and its actions in memory, says it is degraded (``/readyz``,
``/api/v1/status``, ``sre_agent_state_write_failures_total``), and once writes succeed again the
webhook gets the firing notification exactly once and the incident exists.

* injected: a real :class:`~agent.app.daemon.Agent` in the test's loop whose SQLite connection
  fails every ``COMMIT`` with SQLite's own ``database or disk is full`` while the test says so.
  Always runs; also checks that the ``diagnose`` action runs once, after the recovery.
* brim: a real ``python -m agent run`` process whose state database lives on a 4 MiB tmpfs that
  the test fills to the last byte, then frees. Needs root and a working ``mount -t tmpfs``;
  skipped otherwise, with the reason.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.act.notification import AlertSnapshot
from agent.app.daemon import Agent
from agent.config import load_config
from tests import e2e
from tests.alertmanager import eventually
from tests.e2e import ALERT, SETTLE_S, Agents, MetricsTarget, Receiver, wait_for, write_config
from tests.statefiles import FULL, FullDisk, full_disk

agents = e2e.agents  # fixtures, bound here so pytest finds them
target = e2e.target
hook = e2e.hook

def _config(tmp_path: Path, target: MetricsTarget, hook: Receiver, *, state: Path | None = None) -> Path:
    """The e2e config (alert after 4 s, a webhook), plus a ``diagnose`` action and the state path."""
    path = write_config(tmp_path, target=target.url,
                        receivers=[{"name": "hook", "webhook": {"url": hook.url("/hook"), "timeout": "2s"}}])
    data = json.loads(path.read_text())
    data["actions"] = [{"type": "diagnose", "matchers": [f'alertname="{ALERT}"']}]
    if state is not None:
        data["state"] = {"path": str(state)}
    path.write_text(json.dumps(data, indent=1))
    return path


async def _readyz(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with http.get(f"{base}/readyz") as r:
        return r.status, await r.text()


async def _metric(http: aiohttp.ClientSession, base: str, name: str) -> float | None:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name:
            return float(value)
    return None


@pytest.fixture
async def inproc(tmp_path: Path, target: MetricsTarget, hook: Receiver) -> AsyncIterator[tuple[Agent, FullDisk]]:
    """A started in-process Agent whose state connection is wrapped in :class:`FullDisk`."""
    agent = Agent(load_config(_config(tmp_path, target, hook), {}))
    disk = await agent.act.db.run(full_disk, agent.act.db)
    await agent.start()
    try:
        yield agent, disk
    finally:
        disk.full = False
        await agent.stop()


async def test_firing_while_commits_fail_is_notified_once_when_they_succeed(
        inproc: tuple[Agent, FullDisk], target: MetricsTarget, hook: Receiver) -> None:
    """With every commit failing the alert still fires in memory, nothing is sent, the agent says degraded
    and counts the failures; once commits succeed the webhook gets it once, the incident exists with one
    ``fired`` event, and the ``diagnose`` action runs once, after the recovery."""
    agent, disk = inproc
    diagnosed: list[AlertSnapshot] = []
    agent.act.set_diagnose_hook(diagnosed.append)
    base = f"http://127.0.0.1:{agent.port}"
    async with aiohttp.ClientSession() as http:
        await wait_for(lambda: _ready(http, base), what="the agent's /readyz")
        disk.full = True
        target.set(1)

        async def firing() -> bool:
            return any(a["state"] == "firing" for a in agent.alerts_json())
        await wait_for(firing, what="the alert firing in the rule manager")

        async def degraded() -> str | None:
            status, text = await _readyz(http, base)
            return text if status == 503 and text.startswith("degraded") else None
        text = await eventually(degraded, what="/readyz saying degraded")
        assert FULL in text
        async with http.get(f"{base}/api/v1/status") as r:
            state = (await r.json())["data"]["state"]
        assert state["degraded"] is True and FULL in state["reason"] and state["held"] >= 1
        failures = await _metric(http, base, "sre_agent_state_write_failures_total")
        assert failures is not None and failures >= 1
        await _evaluated_after(agent, time.time() + SETTLE_S)
        assert hook.accepted_with("firing") == [] and diagnosed == []
        assert await agent.incidents_json() == []

        disk.full = False
        await wait_for(lambda: _accepted(hook), what="the firing notification after the recovery")
        await wait_for(lambda: _ready(http, base), what="/readyz ready again")
        await _evaluated_after(agent, time.time() + SETTLE_S)
        assert len(hook.accepted_with("firing")) == 1
        assert [d.labels["alertname"] for d in diagnosed] == [ALERT]
        incidents = await agent.incidents_json()
        assert [i["alertname"] for i in incidents] == [ALERT]
        assert [e["kind"] for e in incidents[0]["events"]].count("fired") == 1
        assert agent.status_json()["state"] == {"path": agent.config.state.path, "degraded": False, "reason": "",
                                                "write_failures": disk.refused, "held": 0}


async def test_held_evaluations_are_applied_in_order(inproc: tuple[Agent, FullDisk], target: MetricsTarget) -> None:
    """An alert that fires and resolves while commits fail gets, once they succeed, one incident whose
    timeline is fired then resolved: held work is applied in the order it happened."""
    agent, disk = inproc
    disk.full = True
    target.set(1)

    async def state(want: str) -> bool:
        return any(r["state"] == want for g in agent.rules_json() for r in g["rules"])
    await wait_for(lambda: state("firing"), what="the alert firing in the rule manager")
    target.set(0)
    await wait_for(lambda: state("inactive"), what="the alert resolved in the rule manager")
    assert agent.act.health.held >= 2 and await agent.incidents_json() == []
    disk.full = False

    async def resolved() -> list[dict[str, Any]] | None:
        incidents = await agent.incidents_json()
        return incidents if incidents and incidents[0]["status"] == "resolved" else None
    incidents = await eventually(resolved, what="the incident, resolved")
    assert len(incidents) == 1
    kinds = [e["kind"] for e in incidents[0]["events"]]
    assert kinds.count("fired") == 1 and kinds.index("fired") < kinds.index("resolved")
    assert agent.degraded is None


async def _ready(http: aiohttp.ClientSession, base: str) -> bool:
    return (await _readyz(http, base))[0] == 200


async def _accepted(hook: Receiver) -> bool:
    return bool(hook.accepted_with("firing"))


async def _evaluated_after(agent: Agent, t: float) -> None:
    """Wait until the agent's rule group has been evaluated after wall-clock time ``t`` (a "nothing more
    happened" check waits for this, not for a fixed time)."""
    async def check() -> bool:
        return all(g.last_eval_ms > t * 1000 for g in agent.rules.groups)
    await wait_for(check, what=f"an evaluation after {t:.1f}")


# -- a filesystem filled to the brim ----------------------------------------------------------------


@pytest.fixture
def brim(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (root only); yields its mount point, unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the injected-failure variant covers the same path")
    mnt = tmp_path / "brim"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4M", "tmpfs", str(mnt)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed here ({res.stderr.strip()}); the injected-failure variant covers it")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _fill(mount: Path) -> Path:
    """Fill the file system to its last block with one file; returns it."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # unbuffered: a refused write is not retried at close
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    assert os.statvfs(mount).f_bavail == 0
    return filler


async def test_firing_on_a_full_disk_is_notified_once_when_space_is_freed(
        tmp_path: Path, brim: Path, agents: Agents, target: MetricsTarget, hook: Receiver) -> None:
    """A real agent process whose state database sits on a full tmpfs: the alert fires, nothing is sent,
    /readyz says degraded and the failures are counted; once the space is freed the webhook gets the
    firing notification exactly once and the incident exists."""
    agent = await agents.start(_config(tmp_path, target, hook, state=brim / "state.db"))
    _fill(brim)
    target.set(1)

    async def failing() -> float | None:
        n = await agent.metric("sre_agent_state_write_failures_total")
        return n if n and await agent.alert_state() == "firing" else None
    await eventually(failing, what="the alert firing with state writes failing")
    async with aiohttp.ClientSession() as http:
        status, text = await _readyz(http, agent.base)
    assert status == 503 and text.startswith("degraded") and "full" in text
    assert (await agent.api("status"))["state"]["degraded"] is True
    await e2e.quiet(agent)
    assert hook.accepted_with("firing") == []

    (brim / "filler").unlink()
    await wait_for(lambda: _accepted(hook), what="the firing notification after the space was freed")

    async def recovered() -> list[dict[str, Any]] | None:
        incidents = await agent.incidents()
        return incidents if incidents and not (await agent.api("status"))["state"]["degraded"] else None
    incidents = await eventually(recovered, what="the incident and the agent no longer degraded")
    await e2e.quiet(agent)
    assert len(hook.accepted_with("firing")) == 1
    assert [i["alertname"] for i in incidents] == [ALERT]
    assert [e["kind"] for e in incidents[0]["events"]].count("fired") == 1
