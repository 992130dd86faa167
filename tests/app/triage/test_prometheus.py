"""The triage report from a real run in Prometheus mode: a real Prometheus 2.42 scrapes the simulator and evaluates
the recording rule, the agent evaluates the alert through its API, and the report's plots come from range queries
on Prometheus, both from the daemon (GET /incidents/{id}) and from the CLI with the agent stopped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.app.triage import realrun
from tests.prometheus import Prometheus

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("triage-prometheus")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("triage-prom")
    rule_file = tmp / "triage.rules.yaml"
    rule_file.write_text(realrun.RULES)
    fleet, target = await realrun.start_fleet()
    try:
        async with Prometheus(tmp / "prom", [rule_file], scrape_configs=realrun.scrape_configs(fleet, target)) as prom:
            out = await realrun.run(tmp, fleet, target, prom_url=prom.url, firing_s=5)
            raw = json.loads(out.config_path.read_text()) if out.config_path else {}
            del raw["server"]["external_url"]
            config = tmp / "offline.json"
            config.write_text(json.dumps(raw))
            iid = str(json.loads(out.reports["json"])["incident"]["id"])
            cli_out = tmp / "cli.json"
            code = await realrun.cli(["triage", iid, "--config", str(config), "--format", "json",
                                      "--out", str(cli_out)])
            cli = json.loads(cli_out.read_text()) if code == 0 else {}
            url = prom.url
    finally:
        await fleet.stop()
        await target.server.stop()
    yield {"out": out, "json": json.loads(out.reports["json"]), "cli": cli, "cli_code": code, "url": url}


def _plots(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["key"]: p for p in report["plots"]}


def test_daemon_report_plots_come_from_the_source(run: dict[str, Any]) -> None:
    """In Prometheus mode the agent's store holds no fleet series: every plot's data is Prometheus' answer."""
    report = run["json"]
    assert run["url"] in report["source"]
    plots = _plots(report)
    assert all(p["series"] for p in plots.values()), {k: p["errors"] for k, p in plots.items()}
    firing = [v for s in plots["firing"]["series"] for _, v in s["points"] if v is not None]
    assert max(firing) > realrun.THRESHOLD
    assert report["rule"]["threshold"] == realrun.THRESHOLD


def test_timeline_is_the_same_as_in_embedded_mode(run: dict[str, Any]) -> None:
    """Pending, firing, the notifications (the webhook after 3 attempts), the scale-out, the finding, resolved."""
    report = run["json"]
    kinds = {e["kind"] for e in report["timeline"]}
    assert kinds >= {"pending", "firing", "notification", "action", "finding", "resolved"}
    hook = next(n for n in report["notifications"] if n["receiver"] == "oncall-webhook" and n["kind"] == "alerts")
    assert hook["attempts"] == 3
    assert "html" in run["out"].reports and "<section id=\"plots\"" in run["out"].reports["html"]


def test_cli_queries_the_source_itself_with_the_agent_stopped(run: dict[str, Any]) -> None:
    """``sre-agent triage ID --config`` in Prometheus mode needs no agent: its plots are range queries on the source."""
    assert run["cli_code"] == 0
    report = run["cli"]
    assert run["url"] in report["source"]
    plots = _plots(report)
    assert all(p["series"] for p in plots.values()), {k: p["errors"] for k, p in plots.items()}
    assert report["timeline"] == run["json"]["timeline"]
