"""Triage reports against a source that trickles its answers (Prometheus mode): each report ends by its deadline
and says why its plots are empty, reports past the pool's slots get 503 with Retry-After, and while the reports
are open the agent goes on scraping its own target (the reports never hold the loop's default executor)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.act.notification import fingerprint
from agent.app.daemon import Agent
from agent.app.triage.service import QUERY_BUDGET
from agent.config import Config
from tests.alertmanager import eventually
from tests.e2e import MetricsTarget
from tests.receivers import RecordingServer, trickle

RULES = "groups:\n  - name: remote\n    rules:\n      - alert: Up\n        expr: up > 0\n"
TIMEOUT_S = 3.0
#: the loop's default executor in this test: a small machine's (min(32, cores + 4) is 6 on two cores)
DEFAULT_WORKERS = 4


async def _report(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], Any, float]:
    t0 = time.monotonic()
    async with http.get(url, params={"format": "json"}) as r:
        body = await r.text()
        return r.status, dict(r.headers), json.loads(body), time.monotonic() - t0


@pytest.mark.parametrize("reports", [DEFAULT_WORKERS + 2, 2 * DEFAULT_WORKERS])
async def test_reports_end_by_their_deadline_and_scraping_goes_on(reports: int, tmp_path: Path) -> None:
    """More open reports than default workers: the admitted ones end within their budget with the reason on each
    plot, the rest get 503 + Retry-After, and the agent's scrape count advances while they are open."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=DEFAULT_WORKERS))
    rules = tmp_path / "r.rules.yaml"
    rules.write_text(RULES)
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    target = MetricsTarget()
    async with RecordingServer(responder=trickle(json.dumps(matrix).encode())) as source:
        await target.server.start()
        config = Config.model_validate({
            "targets": [{"url": target.url, "job": "vllm"}], "scrape": {"interval": "1s", "timeout": "1s"},
            "source": {"type": "prometheus", "url": source.url(""), "timeout": f"{TIMEOUT_S:g}s",
                       "recording_rules": "server"},
            "rules": {"files": [str(rules)]}, "server": {"listen": "127.0.0.1:0"},
            "state": {"path": str(tmp_path / "state.db")}, "nvml": {"enabled": False}})
        agent = Agent(config, hostname="n")
        await agent.start()
        try:
            labels = {"alertname": "Up", "instance": "node-1:8000", "job": "vllm"}
            db = agent.act.db
            iid = await db.run(db.incidents.open, fingerprint=fingerprint(labels), alertname="Up", labels=labels,
                               severity="warning", summary="up", started_ms=int(time.time() * 1000) - 60_000)
            await eventually(lambda: _some(agent.stats.scrape_cycles >= 1), timeout=10, what="a first scrape")
            url = f"http://127.0.0.1:{agent.port}/incidents/{iid}"
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                tasks = [asyncio.create_task(_report(http, url)) for _ in range(reports)]
                start = agent.stats.scrape_cycles
                await eventually(lambda: _some(agent.stats.scrape_cycles >= start + 2), timeout=10,
                                 what="two scrape cycles while the reports are open")
                open_reports = sum(not t.done() for t in tasks)
                answers = await asyncio.gather(*tasks)
        finally:
            await agent.stop()
            await target.server.stop()
    assert open_reports >= agent.reports.pool.slots  # the scrapes happened while the admitted reports waited
    built = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    assert len(built) == agent.reports.pool.slots and len(refused) == reports - len(built)
    assert all(h["Retry-After"] == "5" and "retry in 5s" in body["error"] for _, h, body, _ in refused)
    for _, _, report, took in built:
        assert took < QUERY_BUDGET * TIMEOUT_S + 4, took
        errors = [e for p in report["plots"] for e in p["errors"]]
        assert len(errors) >= len(report["plots"]) and all(
            "not complete within" in e or "deadline passed" in e for e in errors), errors


async def _some(ok: bool) -> bool | None:
    return True if ok else None
