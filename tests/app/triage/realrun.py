"""One real incident for the triage report's tests: a daemon over the simulator, end to end.

The simulated fleet runs the ``kv_pressure`` scenario (KV cache above 90 % a few seconds in) and
serves its GPUs under dcgm-exporter's names; a :class:`~tests.e2e.MetricsTarget` gauge gates the
alert, so the test decides when it resolves. The agent (in this loop, so the test can reach its
store) routes the alert to a fake Slack (bot token: post, then ``chat.update`` on resolve) and to a
webhook that refuses the first two attempts (the retries the report must show), scales the fleet
out through the simulator's control port and runs the capacity diagnosis (a finding).

In Prometheus mode a real Prometheus scrapes the same targets and evaluates the recording rule;
the agent evaluates the alert through its API and draws the plots from range queries on it.

Everything the tests check is collected while the agent runs (its store holds the series in
embedded mode): the report in the three formats from ``GET /incidents/{id}``, the incident JSON,
the Slack messages, the CLI's output against the running agent, and, with a browser, a screenshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from agent.app.daemon import Agent
from agent.config import Config
from agent.simulate.server import Fleet, FleetConfig
from tests.alertmanager import eventually
from tests.e2e import MetricsTarget
from tests.fake_slack import FakeSlack, running_fake_slack
from tests.receivers import RecordingServer

ALERT = "VLLMKVCacheSaturated"
THRESHOLD = 0.9
EXTERNAL_URL = "http://sre-agent.example.test:9400"
RULES = f"""
groups:
  - name: triage
    interval: 1s
    rules:
      - record: instance_model:vllm_kv_cache_usage_ratio:max
        expr: max by (job, instance, model_name) (vllm:kv_cache_usage_perc{{model_name!=""}})
      - alert: {ALERT}
        expr: |
          instance_model:vllm_kv_cache_usage_ratio:max > {THRESHOLD}
          and on () (e2e_condition > 0)
        for: 3s
        labels: {{severity: warning}}
        annotations:
          summary: KV cache nearly full.
          runbook_url: https://github.com/example/sre-agent/blob/main/runbooks/{ALERT}.md
"""


@dataclass
class Run:
    """What one run produced (see the module docstring)."""

    mode: str
    incident: dict[str, Any]
    reports: dict[str, str] = field(default_factory=dict)  # format -> body
    headers: dict[str, str] = field(default_factory=dict)  # of the HTML answer
    missing: tuple[int, str] = (0, "")  # GET /incidents/<unknown>: status, body
    slack: list[dict[str, Any]] = field(default_factory=list)  # top-level messages, as last seen
    cli: dict[str, str] = field(default_factory=dict)
    screenshot: Path | None = None
    config_path: Path | None = None


def artifacts_dir(tmp: Path) -> Path:
    """Where screenshots go: ``$SRE_AGENT_TEST_ARTIFACTS`` if set, else the test's temporary directory."""
    root = os.environ.get("SRE_AGENT_TEST_ARTIFACTS")
    path = Path(root) if root else tmp / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _flaky_webhook() -> RecordingServer:
    """A webhook receiver answering 503 to the first two attempts of each firing alert notification (told apart
    by their ``Idempotency-Key``), 200 to the third and to everything else."""
    server = RecordingServer()

    async def respond(request: web.Request, body: bytes) -> web.StreamResponse:
        key = request.headers.get("Idempotency-Key", "")
        payload = json.loads(body or b"{}")
        if payload.get("kind") != "finding" and payload.get("status") == "firing":
            tries = [r for r in server.requests if r.key == key]
            if len(tries) <= 2:
                return web.Response(status=503, text="busy (test fault)\n")
        return web.Response(text="ok\n")
    server.responder = respond
    return server


def _config(tmp: Path, fleet: Fleet, target: MetricsTarget, *, slack: FakeSlack, hook: RecordingServer,
            rule_file: Path, prom_url: str | None) -> dict[str, Any]:
    token = tmp / "slack-token"
    token.write_text(slack.token)
    cfg: dict[str, Any] = {
        "targets": [] if prom_url else [*({"url": u, "job": "vllm"} for u in fleet.targets),
                                        {"url": fleet.dcgm_url, "job": "dcgm"}, {"url": target.url, "job": "e2e"}],
        "scrape": {"interval": "1s", "timeout": "1s"},
        "nvml": {"enabled": False},
        "server": {"listen": "127.0.0.1:0", "external_url": EXTERNAL_URL},
        "rules": {"files": [str(rule_file)], "evaluation_interval": "1s"},
        "state": {"path": str(tmp / "state.db")},
        "receivers": [
            {"name": "slack", "slack": {"token_file": str(token), "channel": "#alerts",
                                        "api_url": slack.api_url, "max_messages_per_second": 50}},
            {"name": "oncall-webhook", "webhook": {"url": hook.url("/hook")}},
        ],
        "route": {"receiver": "slack", "group_by": ["alertname", "instance"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h",
                  "routes": [{"receiver": "slack", "continue": True}, {"receiver": "oncall-webhook"}]},
        "actions": [{"type": "scale_out", "matchers": [f'alertname="{ALERT}"']},
                    {"type": "diagnose", "matchers": [f'alertname="{ALERT}"']}],
        "scaling": {"services": [{"name": "vllm", "matchers": ['job="vllm"'], "min_replicas": 2, "max_replicas": 4,
                                  "webhook": {"url": f"{fleet.control_url}/scale"}, "scale_out_cooldown": "1h"}]},
        "notify": {"dispatch_interval": "200ms", "retry_initial": "200ms", "retry_max": "1s"},
    }
    if prom_url:
        cfg["source"] = {"type": "prometheus", "url": prom_url, "timeout": "5s"}
    return cfg


def scrape_configs(fleet: Fleet, target: MetricsTarget) -> list[dict[str, Any]]:
    """Prometheus' view of the same targets, scraped every second."""
    def hosts(urls: list[str]) -> list[str]:
        return [u.split("//")[1].split("/")[0] for u in urls]
    return [{"job_name": "vllm", "static_configs": [{"targets": hosts(fleet.targets)}]},
            {"job_name": "dcgm", "static_configs": [{"targets": hosts([fleet.dcgm_url or ""])}]},
            *target.scrape_configs()]


async def start_fleet() -> tuple[Fleet, MetricsTarget]:
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, control_port=0, scenario="kv_pressure", step_s=0.2, speed=10))
    await fleet.start()
    target = MetricsTarget(value=1.0)
    await target.server.start()
    return fleet, target


async def run(tmp: Path, fleet: Fleet, target: MetricsTarget, *, prom_url: str | None = None,
              screenshot: bool = False, firing_s: float = 0.0) -> Run:
    """Fire, notify, scale, diagnose and resolve one incident (firing at least ``firing_s``, for a picture
    with more than a few points); collect everything the tests check."""
    rule_file = tmp / "triage.rules.yaml"
    if not rule_file.exists():
        rule_file.write_text(RULES)
    hook = _flaky_webhook()
    await hook.start()
    async with running_fake_slack() as slack:
        raw = _config(tmp, fleet, target, slack=slack, hook=hook, rule_file=rule_file, prom_url=prom_url)
        config_path = tmp / "agent.json"
        config_path.write_text(json.dumps(raw))
        agent = Agent(Config.model_validate(raw))
        await agent.start()
        base = f"http://127.0.0.1:{agent.port}"
        try:
            async with aiohttp.ClientSession() as http:
                async def incident(kind: str) -> dict[str, Any] | None:
                    async with http.get(f"{base}/api/v1/incidents?limit=10") as r:
                        found = (await r.json())["data"]["incidents"]
                    for inc in reversed(found):  # the oldest: the first replica to fire
                        kinds = [e["kind"] for e in inc["events"]]
                        if kind in kinds and "action" in kinds:
                            return dict(inc)
                    return None

                notified = await eventually(lambda: incident("finding"), timeout=60, what="an incident with a finding")
                await eventually(lambda: _delivered_twice(http, base, notified["id"]), timeout=30,
                                 what="slack and the webhook notified")
                started_s = notified["started_ms"] / 1000

                async def long_enough() -> bool | None:
                    return True if time.time() - started_s >= firing_s else None
                await eventually(long_enough, timeout=firing_s + 5, what=f"the incident firing for {firing_s:g}s")
                target.set(0)  # the gate closes: the alert resolves
                done = await eventually(lambda: incident("resolved"), timeout=30, what="the incident resolved")
                await eventually(lambda: _resolve_update(slack), timeout=30, what="the slack resolve update")
                iid = int(done["id"])
                out = Run("prometheus" if prom_url else "embedded", done, config_path=config_path)
                for fmt in ("html", "md", "json"):
                    async with http.get(f"{base}/incidents/{iid}", params={"format": fmt}) as r:
                        assert r.status == 200, (fmt, r.status, await r.text())
                        out.reports[fmt] = await r.text()
                        if fmt == "html":
                            out.headers = dict(r.headers)
                async with http.get(f"{base}/incidents/999999") as r:
                    out.missing = (r.status, await r.text())
                out.slack = [{"text": m.text, "blocks": m.blocks, "edits": m.edits} for m in slack.messages]
                out.cli = await _cli(tmp, base, iid)
                if screenshot:
                    out.screenshot = await _screenshot(f"{base}/incidents/{iid}", artifacts_dir(tmp) /
                                                       f"triage-report-{out.mode}.png")
                return out
        finally:
            await agent.stop()
            await hook.stop()


async def _delivered_twice(http: aiohttp.ClientSession, base: str, iid: int) -> bool | None:
    async with http.get(f"{base}/api/v1/incidents?limit=10") as r:
        found = (await r.json())["data"]["incidents"]
    inc = next(i for i in found if i["id"] == iid)
    receivers = {e["detail"]["receiver"] for e in inc["events"] if e["kind"] == "notified"}
    return True if receivers >= {"slack", "oncall-webhook"} else None


async def _resolve_update(slack: FakeSlack) -> bool | None:
    return True if any(m.header().startswith(":white_check_mark: [RESOLVED]") for m in slack.messages) else None


@contextlib.contextmanager
def keep_logging() -> Iterator[None]:
    """The CLI configures logging (warnings only, to stderr); a module fixture that runs it puts it back, as
    tests/conftest.py does around each test (which saved it after the module fixture had run)."""
    saved, root, ours = structlog.get_config(), logging.getLogger(), logging.getLogger("agent")
    handlers, level, our_level = root.handlers[:], root.level, ours.level
    try:
        yield
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
        ours.setLevel(our_level)


async def cli(argv: list[str]) -> int:
    """``sre-agent ARGV`` in a thread (a running agent answers on this loop), logging put back afterwards."""
    from agent.cli import main

    with keep_logging():
        return await asyncio.to_thread(main, argv)


async def _cli(tmp: Path, base: str, iid: int) -> dict[str, str]:
    """``sre-agent triage`` against the running agent."""
    outputs: dict[str, str] = {}
    for name, argv in (("agent-json", ["triage", str(iid), "--agent", base, "--format", "json"]),
                       ("latest-md", ["triage", "--latest", "--agent", base, "--format", "md"])):
        out = tmp / f"cli-{name}.txt"
        code = await cli([*argv, "--out", str(out)])
        outputs[name] = f"{code}\n{out.read_text(encoding='utf-8') if out.exists() else ''}"
    return outputs


async def _screenshot(url: str, path: Path) -> Path:
    """The report in Debian's chromium, driven by Playwright; the full page as PNG."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            # every console error but the browser's own favicon.ico request (the agent serves none)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                    and not str(m.location.get("url", "")).endswith("/favicon.ico") else None)
            response = await page.goto(url)
            assert response is not None and response.ok
            await page.wait_for_selector("section#plots figure.plot img")
            drawn = await page.eval_on_selector_all(
                "figure.plot img", "els => els.filter(e => e.complete && e.naturalWidth > 0).length")
            assert drawn == 6, f"{drawn} of 6 plots drawn by the browser"
            await page.screenshot(path=str(path), full_page=True)
            assert not errors, f"browser console errors (a CSP violation?): {errors}"
        finally:
            await browser.close()
    return path

