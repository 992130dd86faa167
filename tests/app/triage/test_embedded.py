"""The triage report from a real run in embedded mode (tests/app/triage/realrun.py): a daemon over the simulator
fires, notifies Slack and a webhook that refuses twice, scales out, diagnoses and resolves; the report in HTML,
Markdown and JSON from GET /incidents/{id}, the Slack messages, the CLI, and the page in a real browser."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agent.cli import main
from tests.app.triage import realrun

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("triage-embedded")]

BROWSER = shutil.which("/usr/bin/chromium") is not None
try:
    import playwright  # noqa: F401
except ImportError:
    BROWSER = False


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("triage")
    fleet, target = await realrun.start_fleet()
    try:
        out = await realrun.run(tmp, fleet, target, screenshot=BROWSER, firing_s=15)
        replicas = len(fleet.state())
    finally:
        await fleet.stop()
        await target.server.stop()
    yield {"out": out, "replicas": replicas, "tmp": tmp, "json": json.loads(out.reports["json"])}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.in_section: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section":
            self.stack.append(str(a.get("id")))
        elif self.stack:
            self.in_section.setdefault(self.stack[-1], []).append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "section" and self.stack:
            self.stack.pop()


def _rows(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in report["timeline"] if e["kind"] == kind]


def test_timeline_holds_every_step_of_the_incident(run: dict[str, Any]) -> None:
    """Pending before firing; Slack and the webhook notified, the webhook after its two refusals; the scale-out
    from 2 to 3 replicas (the simulator has 3 now); the finding; resolved; in time order."""
    report = run["json"]
    kinds = [e["kind"] for e in report["timeline"]]
    assert kinds[:2] == ["pending", "firing"] and "resolved" in kinds
    times = [e["at_ms"] for e in report["timeline"]]
    assert times == sorted(times)
    assert report["pending_ms"] < report["incident"]["started_ms"] and not report["pending_estimated"]
    by_receiver = {(n["receiver"], n["kind"], n["status"]): n for n in report["notifications"]}
    hook = by_receiver[("oncall-webhook", "alerts", "firing")]
    assert (hook["outcome"], hook["attempts"]) == ("delivered", 3) and "503" in hook["error"]
    assert by_receiver[("slack", "alerts", "firing")]["outcome"] == "delivered"
    assert ("slack", "alerts", "resolved") in by_receiver
    assert any("after 3 attempts (2 retries)" in e["text"] for e in _rows(report, "notification"))
    [action] = report["actions"]
    assert (action["service"], action["from_replicas"], action["to_replicas"]) == ("vllm", 2, 3)
    assert run["replicas"] == 3  # what the simulator's control port did with the request
    [finding] = report["findings"]
    assert finding["setting"] == "--max-num-seqs" and finding["value"].isdigit()
    assert finding["runbook_url"].startswith("https://") and finding["runbook_url"].endswith(".md")


def test_rule_and_plots_come_from_the_rules_and_the_store(run: dict[str, Any]) -> None:
    """The rule's threshold is 0.9; the firing series crossed it (the alert fired) and every plot has data."""
    report = run["json"]
    rule = report["rule"]
    assert (rule["value_expr"], rule["op"], rule["threshold"], rule["for_s"]) == (
        "instance_model:vllm_kv_cache_usage_ratio:max", ">", realrun.THRESHOLD, 3.0)
    plots = {p["key"]: p for p in report["plots"]}
    assert list(plots) == ["firing", "kv", "queue", "ttft", "throughput", "gpu"]
    assert all(p["series"] and all(s["points"] for s in p["series"]) for p in plots.values()), \
        {k: p["errors"] for k, p in plots.items()}
    firing = [v for s in plots["firing"]["series"] for _, v in s["points"] if v is not None]
    assert max(firing) > realrun.THRESHOLD and all(0 <= v <= 1 for v in firing)
    assert plots["firing"]["threshold"] == realrun.THRESHOLD
    assert {s["label"].split()[0] for s in plots["queue"]["series"]} == {"waiting", "running"}
    assert len(plots["gpu"]["series"]) >= 2  # one line per GPU of the simulated node
    assert "the agent's own store" in report["source"]


def test_summary_is_written_from_the_facts(run: dict[str, Any]) -> None:
    """The summary names the alert, the instance, the threshold, the retries, the scale-out and the change."""
    report = run["json"]
    text = report["summary"]
    instance = report["incident"]["labels"]["instance"]
    for part in (realrun.ALERT, instance, "> 0.9", "2 retries", "from 2 to 3 replicas", "--max-num-seqs"):
        assert part in text, part
    assert report["headline"].startswith(f"{realrun.ALERT} fired") and "resolved after" in report["headline"]


def test_html_page_is_self_contained_with_its_sections(run: dict[str, Any]) -> None:
    """Sections timeline/plots/findings/summary/rule; six figures with a PNG data: URI, alt text and a caption;
    no script and nothing loaded from elsewhere; a strict CSP header."""
    out = run["out"]
    page = _Page()
    page.feed(out.reports["html"])
    sections = {str(a.get("id")) for t, a in page.tags if t == "section"}
    assert sections == {"timeline", "plots", "findings", "summary", "rule"}
    assert "table" in page.in_section["timeline"] and "table" in page.in_section["findings"]
    figures = [a for t, a in page.tags if t == "figure"]
    imgs = [a for t, a in page.tags if t == "img"]
    assert len(figures) == 6 and all("plot" in str(a.get("class")).split() for a in figures)
    assert page.in_section["plots"].count("figcaption") == 6 and len(imgs) == 6
    for img in imgs:
        src = str(img["src"])
        assert src.startswith("data:image/png;base64,") and base64.b64decode(src[22:])[:4] == b"\x89PNG"
        assert img.get("alt")
    tags = [t for t, _ in page.tags]
    assert "script" not in tags and "link" not in tags and "style" in tags
    assert "default-src 'none'" in out.headers["Content-Security-Policy"]
    assert out.headers["Content-Type"].startswith("text/html")


def test_markdown_report_has_the_same_timeline(run: dict[str, Any]) -> None:
    """The Markdown report is a document with the timeline as a table, the findings and the rule."""
    md = run["out"].reports["md"]
    for heading in ("## Summary", "## Timeline", "## Plots", "## Findings", "## Rule"):
        assert heading in md
    assert "| Time (UTC) | Event | What happened | Outcome |" in md
    assert "firing notification delivered to oncall-webhook after 3 attempts (2 retries)" in md


def test_unknown_incident_is_a_404(run: dict[str, Any]) -> None:
    """GET /incidents/<unknown> answers 404 saying there is no such incident."""
    status, body = run["out"].missing
    assert status == 404 and "no incident 999999" in body


def test_slack_message_links_the_report_and_the_resolve_update_summarises(run: dict[str, Any]) -> None:
    """The alert's Slack message, updated in place on resolve, has a Triage report button to
    server.external_url/incidents/<id> and the one-line summary."""
    iid = run["json"]["incident"]["id"]
    url = f"{realrun.EXTERNAL_URL}/incidents/{iid}"
    messages = [m for m in run["out"].slack if any(e.get("url") == url for b in m["blocks"]
                                                   if b["type"] == "actions" for e in b["elements"])]
    assert len(messages) == 1 and messages[0]["edits"] >= 1  # posted firing, then chat.update
    assert messages[0]["text"].startswith(f"[RESOLVED] {realrun.ALERT}: {realrun.ALERT} fired")
    assert "resolved after" in messages[0]["text"] and "scale-out vllm 2→3" in messages[0]["text"]


def test_cli_asks_the_running_agent(run: dict[str, Any]) -> None:
    """``sre-agent triage ID --agent URL --format json`` is the agent's report; ``--latest`` the newest one."""
    code, _, text = run["out"].cli["agent-json"].partition("\n")
    assert code == "0" and json.loads(text)["incident"]["id"] == run["json"]["incident"]["id"]
    code, _, md = run["out"].cli["latest-md"].partition("\n")
    assert code == "0" and md.startswith("# Incident ")


def test_cli_without_a_running_agent_writes_the_report_without_plots(run: dict[str, Any],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """With the agent stopped (embedded mode: the series were in its memory) the CLI builds the report from the
    state database and the config's rules, says why there are no plots, and refuses an unknown incident."""
    tmp: Path = run["tmp"]
    raw = json.loads(run["out"].config_path.read_text())
    del raw["server"]["external_url"]  # listen port 0: no agent address to try
    config = tmp / "offline.json"
    config.write_text(json.dumps(raw))
    iid = str(run["json"]["incident"]["id"])
    assert main(["triage", iid, "--config", str(config), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rule"]["threshold"] == realrun.THRESHOLD
    assert [e["kind"] for e in report["timeline"]] == [e["kind"] for e in run["json"]["timeline"]]
    assert all(not p["series"] and p["errors"] for p in report["plots"])
    assert "running agent's memory" in report["source"]
    assert main(["triage", "424242", "--config", str(config)]) == 2
    assert "no incident 424242" in capsys.readouterr().err


@pytest.mark.skipif(not BROWSER, reason="needs /usr/bin/chromium and the playwright package")
def test_report_renders_in_a_real_browser(run: dict[str, Any]) -> None:
    """Chromium loads the page from the agent under its CSP without a console error and draws every plot;
    the full-page screenshot is kept as an artifact ($SRE_AGENT_TEST_ARTIFACTS)."""
    shot: Path = run["out"].screenshot
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 100_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width == 1280 and height > 1500  # the whole page: header, summary, timeline, six plots, rule
