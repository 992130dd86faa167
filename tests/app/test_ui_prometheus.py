"""The web UI and the triage report in Prometheus mode: the agent evaluates its rules through a real
Prometheus 2.42 (which scrapes the target), and the pages show what that evaluation gave, the status
page names the source, and the incident's report draws its plots from the server's range queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest

from agent.app.daemon import Agent
from agent.config import Config
from tests.alertmanager import eventually
from tests.app.test_ui import EVIL, _scraped, _tags
from tests.prometheus import Prometheus

RULES = {"groups": [{"name": "ui-remote", "interval": "1s", "rules": [
    {"alert": "RemoteQueue", "expr": "vllm:num_requests_running > 0",
     "labels": {"severity": "warning", "evil": EVIL},
     "annotations": {"summary": "Requests are running.",
                     "runbook_url": "https://example.org/runbooks/RemoteQueue.md"}},
]}]}


@pytest.mark.slow
async def test_pages_and_report_in_prometheus_mode(tmp_path: Path) -> None:
    rules = tmp_path / "remote.rules.yaml"
    rules.write_text(json.dumps(RULES))
    gen = _scraped()
    target = await anext(gen)
    host = target.split("//")[1].split("/")[0]
    scrape = [{"job_name": "vllm", "scrape_interval": "1s", "static_configs": [{"targets": [host]}]}]
    try:
        async with Prometheus(tmp_path / "prom", [], scrape_configs=scrape) as prom:
            agent = Agent(Config.model_validate({
                "nvml": {"enabled": False}, "server": {"listen": "127.0.0.1:0"},
                "source": {"type": "prometheus", "url": prom.url},
                "rules": {"files": [str(rules)], "evaluation_interval": "1s"},
                "state": {"path": str(tmp_path / "agent.db")}}))
            await agent.start()
            try:
                async def incident() -> list[dict[str, object]] | None:
                    found = [i for i in await agent.incidents_json() if i["alertname"] == "RemoteQueue"]
                    return found or None

                (opened,) = await eventually(incident, timeout=60, what="RemoteQueue firing through Prometheus")
                base = f"http://127.0.0.1:{agent.port}"
                async with aiohttp.ClientSession() as http:
                    pages = {}
                    for page in ("/alerts", "/rules", "/status", "/incidents"):
                        async with http.get(base + page) as r:
                            assert r.status == 200, page
                            pages[page] = await r.text()
                    async with http.get(f"{base}/incidents/{opened['id']}") as r:
                        assert r.status == 200
                        report = await r.text()
                    async with http.get(f"{base}/incidents/{opened['id']}?format=json") as r:
                        plots = (await r.json())["plots"]
            finally:
                await agent.stop()
    finally:
        await anext(gen, None)
    alerts = pages["/alerts"]
    assert "RemoteQueue" in alerts and "firing" in alerts
    assert "https://example.org/runbooks/RemoteQueue.md" in alerts
    assert EVIL not in alerts and "&lt;script&gt;" in alerts  # escaped in Prometheus mode too
    assert "ui-remote" in pages["/rules"] and "vllm:num_requests_running &gt; 0" in pages["/rules"]
    assert prom.url in pages["/status"]  # the source the rules run on
    assert f"/incidents/{opened['id']}" in pages["/incidents"]
    # the report: its timeline, and plots drawn from the server's range queries (PNG data URIs)
    assert 'id="timeline"' in report and "firing" in report
    images = [a.get("src") or "" for t, a in _tags(report).tags if t == "img"]
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
    assert re.search(r"RemoteQueue", report) and EVIL not in report
    firing = next(p for p in plots if p["key"] == "firing")
    assert any(v == 1.0 for line in firing["series"] for _, v in line["points"])  # the value Prometheus had
