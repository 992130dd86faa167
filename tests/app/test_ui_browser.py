"""The web UI in a real browser: Debian's chromium, driven by Playwright, against a running agent process
scraping the simulator fleet.

The stack (module scope, one per run): two simulated vLLM replicas; ``python -m agent run`` scraping
them with a test rule file and ``server.auth`` set (the silence forms need the UI login); one headless
chromium. The steps, in order:

1. the Alerts page shows a firing alert, and polls itself (a fetch of the page, allowed by the CSP);
2. the alert's incident opens ``/incidents/{id}``, the triage report, with its timeline and plots
   (that report is built on another branch: where it answers 404 that test skips, saying so);
3. a silence is created from the UI (login with the token, the alert's Silence link, the form) and
   the alert shows as silenced;
4. the silence is expired from the UI and the alert is no longer silenced;
5. a ``<script>`` and an ``<img onerror>`` in a rule's label value stay text: nothing runs, no element
   appears, also after a poll swapped the table in.

Screenshots go to ``$SRE_AGENT_TEST_ARTIFACTS`` when set (CI keeps them), else the test's tmp dir.
Playwright never downloads a browser here: ``executable_path`` is the system's chromium, and
without Playwright or ``/usr/bin/chromium`` the tests skip, saying which is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agent.simulate.server import Fleet, FleetConfig
from tests.e2e import AgentProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui-browser"), pytest.mark.asyncio(loop_scope="module")]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TOKEN = "browser-test-token-5f1d2c"
ALERT = "UIBrowserQueue"
INJECTED = "UIInjectedLabel"
EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
EXPECT_MS = 30_000  # a loaded 2-core CI machine: evaluation every second, pages polling every 5 s
RULES = {"groups": [{"name": "ui-browser", "interval": "1s", "rules": [
    {"alert": ALERT, "expr": "vllm:num_requests_running >= 0", "for": "2s",
     "labels": {"severity": "warning"},
     "annotations": {"summary": "Requests are queueing on a replica.",
                     "description": "{{ $labels.instance }} runs {{ $value }} requests",
                     "runbook_url": "https://example.org/runbooks/UIBrowserQueue.md"}},
    {"alert": INJECTED, "expr": "vector(1)", "labels": {"severity": "info", "note": EVIL},
     "annotations": {"summary": "A label value holding markup."}},
]}]}

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (the test extra)")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (Debian's chromium package; .ci/run installs it)", allow_module_level=True)
expect = playwright_api.expect


@dataclass
class Stack:
    base: str
    agent: AgentProcess
    context: Any  # playwright BrowserContext
    shots: Path
    console: list[str] = field(default_factory=list)

    async def page(self) -> Any:
        page = await self.context.new_page()
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        return page


def _artifacts(tmp: Path) -> Path:
    wanted = os.environ.get("SRE_AGENT_TEST_ARTIFACTS")
    out = Path(wanted) / "ui" if wanted else tmp
    out.mkdir(parents=True, exist_ok=True)
    return out


def _config(tmp: Path, fleet: Fleet) -> Path:
    rules = tmp / "ui-browser.rules.yaml"
    rules.write_text(json.dumps(RULES))
    token = tmp / "api-token"
    token.write_text(TOKEN + "\n")
    config = {
        "targets": [{"url": url, "job": "vllm"} for url in fleet.targets],
        "scrape": {"interval": "1s", "timeout": "1s"},
        "nvml": {"enabled": "false"},
        "server": {"listen": "127.0.0.1:0", "auth": {"bearer_token_file": str(token)}},
        "rules": {"files": [str(rules)], "evaluation_interval": "1s"},
        "state": {"path": str(tmp / "state.db")},
        "log": {"format": "json", "level": "info"},
    }
    path = tmp / "agent.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("ui-browser")
    fleet = Fleet(FleetConfig(replicas=2, base_port=0, control_port=0, dcgm_port=None))
    await fleet.start()
    agent = AgentProcess(_config(tmp, fleet), tmp / "agent.log")
    try:
        await agent.ready()
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            context = await browser.new_context(viewport={"width": 1360, "height": 820}, color_scheme="light")
            try:
                yield Stack(agent.base, agent, context, _artifacts(tmp))
            finally:
                await context.close()
                await browser.close()
    finally:
        await agent.close()
        print(f"--- agent log, last lines ---\n{agent.log_tail()}")
        await fleet.stop()


def _row(page: Any, alertname: str, **has: Any) -> Any:
    return page.locator(f'tr.alert-row[data-alertname="{alertname}"]', **has).first


async def _firing(stack: Stack) -> None:
    async def both() -> bool:
        alerts = (await stack.agent.api("alerts"))["alerts"]
        names = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
        return {ALERT, INJECTED} <= names

    await wait_for(both, what="both test alerts firing in /api/v1/alerts", timeout=60)


async def test_alerts_silence_expire_and_escaping(stack: Stack) -> None:
    """Steps 1, 3, 4 and 5: a firing alert on the polling Alerts page; a silence created from the UI after
    logging in, the alert silenced; the silence expired; a label's <script> stays text throughout."""
    await _firing(stack)
    page = await stack.page()
    # 1. a firing alert, and the page polls itself
    await page.goto(f"{stack.base}/alerts")
    row = _row(page, ALERT)
    await expect(row.locator(".badge")).to_have_text("firing", timeout=EXPECT_MS)
    await expect(row).to_contain_text("Requests are queueing on a replica.")
    await expect(row.get_by_role("link", name="runbook")).to_have_attribute(
        "href", "https://example.org/runbooks/UIBrowserQueue.md")
    async with page.expect_request(lambda r: r.url == f"{stack.base}/alerts" and r.resource_type == "fetch",
                                   timeout=EXPECT_MS):
        pass
    await page.screenshot(path=str(stack.shots / "ui-alerts.png"), full_page=True)

    # 5. the injected markup is text, and nothing ran (after a poll swapped the table in, too)
    injected = _row(page, INJECTED)
    await expect(injected.locator(".lv", has_text="window.__pwned")).to_have_text(EVIL)
    assert await page.evaluate("() => window.__pwned") is None
    assert await page.locator("main img, main script").count() == 0
    assert not [m for m in stack.console if "Content Security Policy" in m or "pageerror" in m], stack.console

    # keyboard: the first Tab reaches the skip link, which moves focus to the main region
    await page.keyboard.press("Tab")
    assert await page.evaluate("() => document.activeElement.className") == "skip"
    await page.keyboard.press("Enter")
    assert await page.evaluate("() => document.activeElement.id") == "main"

    # 3. log in with the API token, then silence the alert from its row
    await page.get_by_role("link", name="Log in").click()
    await page.get_by_label("API token").fill(TOKEN)
    await page.screenshot(path=str(stack.shots / "ui-login.png"))
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(f"{stack.base}/alerts")
    await expect(page.get_by_role("button", name="Log out")).to_be_visible()
    await _row(page, ALERT).get_by_role("link", name="Silence…").click()
    await expect(page.get_by_label("Matchers")).to_contain_text(f'alertname="{ALERT}"')
    await page.get_by_label("Comment").fill("browser test maintenance")
    await page.get_by_label("Created by").fill("playwright")
    await page.get_by_role("button", name="Create silence").click()
    await expect(page.locator(".notice-ok")).to_contain_text("created")
    [silence] = (await stack.agent.api("silences"))["silences"]
    silence_row = page.locator(f"#silence-{silence['id']}")
    await expect(silence_row.locator(".badge")).to_have_text("active")
    await expect(silence_row).to_contain_text("browser test maintenance")
    await page.screenshot(path=str(stack.shots / "ui-silences.png"), full_page=True)
    await page.get_by_role("link", name="Alerts", exact=True).click()
    await expect(_row(page, ALERT).locator(".badge-silenced")).to_have_text("silenced")
    await expect(_row(page, INJECTED).locator(".badge-silenced")).to_have_count(0)
    await page.screenshot(path=str(stack.shots / "ui-alerts-silenced.png"), full_page=True)

    # 4. expire it from the Silences page
    await page.get_by_role("link", name="Silences", exact=True).click()
    await page.get_by_role("button", name=f"Expire silence {silence['id']}").click()
    await expect(page.locator(".notice-ok")).to_contain_text("expired")
    await expect(page.locator(f"#silence-{silence['id']} .badge")).to_have_text("expired")
    [after] = (await stack.agent.api("silences"))["silences"]
    assert after["status"]["state"] == "expired"
    await page.get_by_role("link", name="Alerts", exact=True).click()
    await expect(_row(page, ALERT).locator(".badge")).to_have_text("firing")
    await expect(_row(page, ALERT).locator(".badge-silenced")).to_have_count(0)
    assert await page.evaluate("() => window.__pwned") is None

    # the other pages, for the artifacts (and that each renders its table or sections)
    for path, title, shown in (("/targets", "Targets", "table#targets-table"), ("/rules", "Rules", "section.group"),
                               ("/status", "Status", "#source-h")):
        await page.goto(stack.base + path)
        await expect(page.get_by_role("heading", level=1)).to_have_text(title)
        await expect(page.locator(shown).first).to_be_visible()
        await page.screenshot(path=str(stack.shots / f"ui-{path[1:]}.png"), full_page=True)
    assert not [m for m in stack.console if "Content Security Policy" in m or "pageerror" in m], stack.console
    await page.close()


async def test_incident_opens_its_report(stack: Stack) -> None:
    """Step 2: the alert's incident in the Incidents list opens /incidents/{id}, with the timeline and plots."""
    await _firing(stack)

    async def opened() -> list[dict[str, Any]]:
        return [i for i in await stack.agent.incidents() if i["alertname"] == ALERT]

    incidents = await wait_for(opened, what=f"an incident for {ALERT}")
    page = await stack.page()
    await page.goto(f"{stack.base}/incidents")
    link = page.locator(f'tr.incident-row[data-alertname="{ALERT}"] a').first
    await expect(link).to_have_attribute("href", f"/incidents/{incidents[0]['id']}", timeout=EXPECT_MS)
    await page.screenshot(path=str(stack.shots / "ui-incidents.png"), full_page=True)
    async with page.expect_navigation() as nav:
        await link.click()
    response = await nav.value
    if response is not None and response.status == 404:
        await page.close()
        pytest.skip("GET /incidents/{id} answered 404: the triage report (issue 15, part 1) is not in this branch "
                    "yet; the list links to it and this step runs fully once both are merged")
    assert response is not None and response.ok, response and response.status
    await expect(page.locator("#timeline")).to_be_visible()
    plots = page.locator("#plots figure.plot img")
    await expect(plots.first).to_be_visible()
    widths = await plots.evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
    assert widths and all(w > 0 for w in widths), widths  # every plot image loaded
    await page.screenshot(path=str(stack.shots / "ui-incident-report.png"), full_page=True)
    await page.close()


# -- cross-site and rebinding attacks from a real page (issue 23) ------------------------------------------------

REBIND = "rebind.attacker.test"  # Chromium resolves it to 127.0.0.1, as a rebinding DNS server would
SILENCE_JSON = json.dumps({"matchers": ['alertname="CsrfFromChromium"'], "duration": "1h"})
ATTACKER_PAGE = "<!doctype html><title>attacker</title><p>nothing to see</p>"

# What a page on another origin can send the agent without a CORS preflight, each as a fetch in no-cors
# mode (the browser drops the answer, but the request goes out) or a form posted into a hidden frame.
NO_CORS_ATTACKS = {
    "Blob body, no Content-Type": "fetch(u, {method: 'POST', mode: 'no-cors', body: new Blob([j])})",
    "ArrayBuffer body, no Content-Type": ("fetch(u, {method: 'POST', mode: 'no-cors', "
                                          "body: new TextEncoder().encode(j).buffer})"),
    "string body, text/plain": "fetch(u, {method: 'POST', mode: 'no-cors', body: j})",
    "URLSearchParams body": "fetch(u, {method: 'POST', mode: 'no-cors', body: new URLSearchParams({j})})",
    "credentials included": ("fetch(u, {method: 'POST', mode: 'no-cors', credentials: 'include', "
                             "body: new Blob([j])})"),
    "text/plain form with a JSON-shaped field": (
        "new Promise(done => { const f = document.createElement('form'); f.method = 'POST'; f.action = u; "
        "f.enctype = 'text/plain'; f.target = 'sink'; const i = document.createElement('input'); "
        "i.name = j.slice(0, -1) + ', \"comment\": \"'; i.value = '\"}'; f.appendChild(i); "
        "const frame = document.createElement('iframe'); frame.name = 'sink'; document.body.append(frame, f); "
        "frame.onload = done; f.submit(); })"),  # onload set after about:blank loaded: the post's answer
}


@dataclass
class OpenStack:
    base: str
    attacker: str  # base URLs of the attacker's page: 127.0.0.1 on another port, and localhost
    attacker_by_name: str
    context: Any
    agent: Any


@pytest_asyncio.fixture(loop_scope="module")
async def open_stack(tmp_path: Path) -> AsyncIterator[OpenStack]:
    """An agent without server.auth on loopback (the JSON API's only defence is then its own checks), an
    attacker's page server on another port, and a Chromium that resolves REBIND to 127.0.0.1."""
    from aiohttp import web

    from agent.app.daemon import Agent
    from agent.config import Config

    agent = Agent(Config.model_validate({"targets": [], "server": {"listen": "127.0.0.1:0"},
                                         "nvml": {"enabled": False}, "state": {"path": str(tmp_path / "s.db")}}))
    await agent.start()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=ATTACKER_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True,
                args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBIND} 127.0.0.1"])
            context = await browser.new_context()
            try:
                yield OpenStack(f"http://127.0.0.1:{agent.port}", f"http://127.0.0.1:{port}/",
                                f"http://localhost:{port}/", context, agent)
            finally:
                await context.close()
                await browser.close()
    finally:
        await runner.cleanup()
        await agent.stop()


@pytest.mark.parametrize("attack", list(NO_CORS_ATTACKS))
async def test_no_cors_posts_from_another_origin_create_no_silence(open_stack: OpenStack, attack: str) -> None:
    """A page on another origin (127.0.0.1 on another port, and localhost) posts a silence to the JSON API
    in each way that needs no preflight; the agent refuses every one and no silence exists. The same fetch
    with a JSON Content-Type from the agent's own page does create one, so the probe can see success."""
    page = await open_stack.context.new_page()
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/api/v1/silences" in r.url else None)
    for origin in (open_stack.attacker, open_stack.attacker_by_name):
        await page.goto(origin)
        await page.evaluate(f"async ([u, j]) => {{ await {NO_CORS_ATTACKS[attack]}; }}",
                            [f"{open_stack.base}/api/v1/silences", SILENCE_JSON])
    assert len(sent) == 2, sent  # both requests really left the browser
    assert await open_stack.agent.silences_json() == []
    await page.goto(f"{open_stack.base}/silences")
    status = await page.evaluate("async j => (await fetch('/api/v1/silences', {method: 'POST', body: j, "
                                 "headers: {'Content-Type': 'application/json'}})).status", SILENCE_JSON)
    await page.close()
    silences = await open_stack.agent.silences_json()
    for s in silences:
        await open_stack.agent.expire_silence(s["id"])
    assert status == 200 and len(silences) == 1


async def test_a_rebound_name_reads_nothing_and_silences_nothing(open_stack: OpenStack) -> None:
    """DNS rebinding: under a name that resolves to 127.0.0.1 the agent's pages and API answer 400, and the
    page's same-origin fetches (which a rebound page may read) get neither /status nor a silence."""
    page = await open_stack.context.new_page()
    rebound = open_stack.base.replace("127.0.0.1", REBIND)
    response = await page.goto(f"{rebound}/status")
    assert response is not None and response.status == 400
    answers = await page.evaluate(
        "async j => [(await fetch('/api/v1/status')).status, (await fetch('/silences')).status, "
        "(await fetch('/api/v1/silences', {method: 'POST', body: j, "
        "headers: {'Content-Type': 'application/json'}})).status]", SILENCE_JSON)
    await page.close()
    assert answers == [400, 400, 400]
    assert await open_stack.agent.silences_json() == []


@pytest.mark.parametrize("target", ["/\t/evil.example", "/\\evil.example", "\\\\evil.example", " //evil.example",
                                    "/\n/evil.example", "https:evil.example", "/%2F%2Fevil.example",
                                    "\u3000//evil.example", "///evil.example"])
async def test_login_redirect_resolves_to_the_agent_in_chromium(open_stack: OpenStack, target: str) -> None:
    """The Location the login answers for a hostile next= resolves, by Chromium's own URL parser, to the
    agent's host."""
    page = await open_stack.context.new_page()
    await page.goto(f"{open_stack.base}/silences")  # without server.auth the login form is the silence form's
    csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
    answer = await page.request.post(f"{open_stack.base}/login", form={"csrf": csrf or "", "next": target},
                                     max_redirects=0)
    location = answer.headers.get("location", "")
    host = await page.evaluate("loc => new URL(loc, location.href).host", location)
    await page.close()
    assert answer.status == 303 and host == open_stack.base.removeprefix("http://"), (location, host)
