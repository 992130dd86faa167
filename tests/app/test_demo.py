"""Tests for agent.app.demo: the simulator and the agent together, as `sre-agent demo` runs them."""

from __future__ import annotations

import asyncio
import io
import re

import aiohttp

from agent.app.demo import run_demo
from agent.simulate.server import FleetConfig


async def test_demo_shows_fleet_and_follows_a_scale_out() -> None:
    """The live view lists every replica as up with live numbers and the bundled rules' alerts, and picks up
    replicas added by /scale."""
    out = io.StringIO()
    cfg = FleetConfig(replicas=2, lmdeploy_replicas=1, base_port=0, control_port=0, step_s=0.2, speed=4)
    task = asyncio.create_task(run_demo(cfg, listen="127.0.0.1:0", interval="1s", duration=7, out=out))
    control = None
    for _ in range(100):
        m = re.search(r"simulator control: (\S+)", out.getvalue())
        if m:
            control = m.group(1)
            break
        await asyncio.sleep(0.05)
    assert control, out.getvalue()
    await asyncio.sleep(2)
    async with aiohttp.ClientSession() as http, http.post(f"{control}/scale", json={"replicas": 3}) as r:
        assert r.status == 200
    assert await task == 0
    last = out.getvalue().rsplit("sre-agent demo |", 1)[1]
    assert "4/4 targets up" in last, last
    rows = [line.split() for line in last.splitlines() if line.startswith(("vllm ", "lmdeploy "))]
    assert [r[0] for r in rows].count("vllm") == 3 and [r[0] for r in rows].count("lmdeploy") == 1
    running = [float(r[3]) for r in rows if r[3] != "-"]
    assert len(running) == 4 and sum(running) > 0  # numbers come from the agent's store
    assert re.search(r"FIRING\s+Watchdog", last), last  # the bundled rules are evaluated
