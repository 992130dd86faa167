"""Tests for agent.app.ui over HTTP: every page against a running in-process agent, escaping, the CSP and
security headers, the silence forms, CSRF and Origin refusals, the login session and protect_reads."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.app.daemon import Agent
from agent.config import Config
from tests.alertmanager import eventually
from tests.fake_pynvml import FakeGpu, FakeNvml

TOKEN = "ui-test-token-0123456789"
EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
PAGES = ["/alerts", "/targets", "/rules", "/incidents", "/silences", "/status", "/login"]

# An alert that fires at once, with HTML in a label, in its summary, and a javascript: runbook; and one
# with an ordinary runbook link.
RULES = {"groups": [{"name": "ui-test", "interval": "1s", "rules": [
    {"alert": "InjectedLabel", "expr": "vector(1)",
     "labels": {"severity": "warning", "evil": EVIL},
     "annotations": {"summary": "<b>bold</b> summary", "runbook_url": "javascript:window.__pwned=3"}},
    {"alert": "PlainAlert", "expr": "vector(2)", "labels": {"severity": "info"},
     "annotations": {"summary": "A plain alert.", "runbook_url": "https://example.org/runbooks/PlainAlert.md"}},
]}]}


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text inside each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False if tag == "script" else self._in_script

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.script_text.append(data)


def _tags(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    return parser


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


async def _scraped() -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    await runner.cleanup()


StartAgent = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[StartAgent]:
    """Start in-process agents (rules above, one live target, one dead, a fake GPU); stopped at teardown."""
    started: list[Agent] = []
    gen = _scraped()
    live = await anext(gen)
    rule_file = tmp_path / "ui.rules.yaml"
    rule_file.write_text(json.dumps(RULES))

    async def start(server: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Agent:
        data = {"targets": [{"url": live, "job": "vllm", "labels": {"zone": EVIL}},
                            {"url": "http://127.0.0.1:9/metrics", "job": "dead"}],
                "scrape": {"interval": "1s", "timeout": "1s"},
                "server": {"listen": "127.0.0.1:0", **(server or {})},
                "rules": {"files": [str(rule_file)], "evaluation_interval": "1s"},
                "state": {"path": str(tmp_path / f"s{len(started)}.db")}}
        agent = Agent(Config.model_validate(data, context={"environ": environ or {}}),
                      nvml_module=FakeNvml([FakeGpu(name="NVIDIA H100 80GB HBM3")]).module, hostname="node-1")
        await agent.start()
        started.append(agent)

        async def firing() -> bool | None:
            return True if len([a for a in agent.alerts_json() if a["state"] == "firing"]) == 2 else None

        await eventually(firing, what="both test alerts firing")
        return agent

    yield start
    for agent in started:
        await agent.stop()
    await anext(gen, None)


def _session() -> aiohttp.ClientSession:
    # unsafe=True: keep cookies from an IP-address host (127.0.0.1), as a browser does
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_every_page_renders_with_the_security_headers(start_agent: StartAgent) -> None:
    """Each page is HTML with a CSP allowing only the agent's own script (no inline script, no event
    attributes), nosniff, no framing, a skip link to #main, and labelled navigation; / opens the alerts."""
    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.port}"
    async with _session() as http:
        async with http.get(f"{base}/", allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (302, "/alerts")
        for page in PAGES:
            async with http.get(base + page) as r:
                html = await r.text()
                assert r.status == 200, page
                assert r.content_type == "text/html"
                csp = r.headers["Content-Security-Policy"]
                assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
                assert "unsafe-inline" not in csp
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert r.headers["X-Frame-Options"] == "DENY"
            tags = _tags(html)
            scripts = [a for t, a in tags.tags if t == "script"]
            assert scripts == [{"src": "/static/ui.js", "defer": None}], page
            assert tags.script_text == [], page
            assert not [(t, k) for t, a in tags.tags for k in a if k.startswith("on")], page
            assert ("a", {"class": "skip", "href": "#main"}) in tags.tags
            assert ("main", {"id": "main", "tabindex": "-1"}) in tags.tags
            assert ("nav", {"aria-label": "Pages"}) in tags.tags
        for name, ctype in (("ui.css", "text/css"), ("ui.js", "text/javascript")):
            async with http.get(f"{base}/static/{name}") as r:
                assert r.status == 200 and r.content_type == ctype
                assert r.headers["X-Content-Type-Options"] == "nosniff"
        async with http.get(f"{base}/static/..%2Fpages.py") as r:
            assert r.status == 404


async def test_html_in_labels_and_annotations_stays_text(start_agent: StartAgent) -> None:
    """A label value or summary holding markup is printed escaped on every page that shows it, and a
    javascript: runbook becomes no link, while an https runbook is one."""
    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.port}"
    escaped = EVIL.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
    async with _session() as http:
        for page in ("/alerts", "/targets", "/rules"):
            async with http.get(base + page) as r:
                html = await r.text()
            assert escaped in html, page
            assert EVIL not in html and "<img" not in html, page
            tags = _tags(html)
            assert not [t for t, _ in tags.tags if t in ("img", "b")], page
            assert not [a for t, a in tags.tags if t == "a" and "javascript" in (a.get("href") or "")], page
        async with http.get(f"{base}/alerts") as r:
            html = await r.text()
    assert "&lt;b&gt;bold&lt;/b&gt; summary" in html
    hrefs = [a.get("href") for t, a in _tags(html).tags if t == "a"]
    assert "https://example.org/runbooks/PlainAlert.md" in hrefs


async def test_pages_show_what_the_api_shows(start_agent: StartAgent) -> None:
    """Targets show health, error and samples; rules their group, health and evaluation time; the status
    page NVML's GPU and the source; incidents link to /incidents/{id}."""
    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.port}"

    async def opened() -> list[dict[str, Any]] | None:
        found = await agent.incidents_json()
        return found if len(found) == 2 else None

    incidents = await eventually(opened, what="an incident for each firing alert")
    async with _session() as http:
        async with http.get(f"{base}/targets") as r:
            targets = await r.text()
        async with http.get(f"{base}/rules") as r:
            rules = await r.text()
        async with http.get(f"{base}/status") as r:
            status = await r.text()
        async with http.get(f"{base}/incidents") as r:
            listing = await r.text()
    dead = next(t for t in agent.targets_json() if t["job"] == "dead")
    assert dead["health"] == "down" and dead["last_error"]
    assert "badge-down" in targets and "badge-up" in targets
    assert dead["last_error"].replace("'", "&#39;") in targets
    assert "2 targets, <strong>1</strong> not up" in targets.replace("<strong>2</strong>", "2")
    assert "ui-test" in rules and "badge-ok" in rules and "vector(1)" in rules
    assert "NVIDIA H100 80GB HBM3" in status and "embedded" in status
    hrefs = [a["href"] for t, a in _tags(listing).tags if t == "a" and (a.get("href") or "").startswith("/incidents/")]
    assert sorted(hrefs) == sorted(f"/incidents/{i['id']}" for i in incidents)


async def test_silence_created_and_expired_through_the_forms(start_agent: StartAgent) -> None:
    """The form creates a silence (303 back to the list), the alert shows as silenced, Expire ends it."""
    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.port}"
    origin = {"Origin": base}
    async with _session() as http:
        async with http.get(f"{base}/silences?matcher=alertname%3D%22PlainAlert%22") as r:
            page = await r.text()
        assert "alertname=&#34;PlainAlert&#34;" in page  # the prefilled matcher from an alert's Silence link
        form = {"csrf": _csrf(page), "matchers": 'alertname="PlainAlert"\n', "duration": "30m",
                "comment": "maintenance <i>", "createdBy": "tester"}
        async with http.post(f"{base}/silences", data=form, headers=origin, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
            location = r.headers["Location"]
        [silence] = await agent.silences_json()
        assert location == f"/silences?created={silence['id']}"
        assert (silence["comment"], silence["createdBy"]) == ("maintenance <i>", "tester")
        async with http.get(f"{base}/alerts") as r:
            alerts = await r.text()
        row = re.search(r'<tr class="alert-row[^"]*" data-alertname="PlainAlert">.*?</tr>', alerts, re.S)
        assert row and "is-silenced" in row.group(0) and silence["id"][:8] in row.group(0)
        other = re.search(r'<tr class="alert-row[^"]*" data-alertname="InjectedLabel">.*?</tr>', alerts, re.S)
        assert other and "is-silenced" not in other.group(0)
        async with http.post(f"{base}/silences", data={**form, "duration": "-5m"}, headers=origin) as r:
            assert r.status == 400 and "duration" in await r.text()
        async with http.post(f"{base}/silences/{silence['id']}/expire", data={"csrf": form["csrf"]},
                             headers=origin, allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (303, f"/silences?expired={silence['id']}")
        async with http.post(f"{base}/silences/nosuchsilence/expire", data={"csrf": form["csrf"]},
                             headers=origin) as r:
            assert r.status == 404
    assert [s["status"]["state"] for s in await agent.silences_json()] == ["expired"]


async def test_cross_site_posts_are_refused(start_agent: StartAgent) -> None:
    """A post from another origin, a null origin, a cross-site fetch, without the CSRF token or with another
    session's token is a 403 and creates nothing."""
    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.port}"
    form = {"matchers": 'alertname="PlainAlert"', "duration": "1h"}
    async with _session() as http, _session() as other:
        async with http.get(f"{base}/silences") as r:
            csrf = _csrf(await r.text())
        async with other.get(f"{base}/silences") as r:
            other_csrf = _csrf(await r.text())
        assert csrf != other_csrf
        attempts = {
            "evil origin": ({"Origin": "http://evil.example"}, {**form, "csrf": csrf}),
            "evil referer": ({"Referer": "http://evil.example/page"}, {**form, "csrf": csrf}),
            "null origin": ({"Origin": "null"}, {**form, "csrf": csrf}),
            "cross-site fetch": ({"Origin": base, "Sec-Fetch-Site": "cross-site"}, {**form, "csrf": csrf}),
            "other port": ({"Origin": "http://127.0.0.1:1"}, {**form, "csrf": csrf}),
            "no token": ({"Origin": base}, form),
            "another session's token": ({"Origin": base}, {**form, "csrf": other_csrf}),
            "forged token": ({"Origin": base}, {**form, "csrf": "0" * 64}),
        }
        codes = {}
        for what, (headers, data) in attempts.items():
            async with http.post(f"{base}/silences", data=data, headers=headers, allow_redirects=False) as r:
                codes[what] = r.status
        async with http.post(f"{base}/silences", data={**form, "csrf": csrf}, headers={"Origin": base},
                             allow_redirects=False) as r:
            good = r.status
    assert codes == dict.fromkeys(attempts, 403)
    assert good == 303
    assert len(await agent.silences_json()) == 1


async def test_login_session_acts_without_leaking_the_token(start_agent: StartAgent) -> None:
    """With server.auth the forms need a login: a wrong token is a 401, the right one starts a new
    HttpOnly SameSite=Strict session; the token is in no page or cookie; the session does not authorize
    JSON API writes; logout ends it."""
    agent = await start_agent({"auth": {"bearer_token_env": "TOK"}}, {"TOK": TOKEN})
    base = f"http://127.0.0.1:{agent.port}"
    origin = {"Origin": base}
    bodies: list[str] = []
    async with _session() as http:
        async with http.get(f"{base}/silences") as r:
            page = await r.text()
            anonymous = r.cookies["sre_agent_session"].value
        bodies.append(page)
        assert "log in" in page and 'id="silence-form"' not in page and "Expire" not in page
        async with http.get(f"{base}/login?next=/silences") as r:
            login = await r.text()
        assert 'type="password"' in login and '<label for="token">' in login
        form = {"csrf": _csrf(login), "matchers": 'alertname="PlainAlert"', "duration": "1h"}
        async with http.post(f"{base}/silences", data=form, headers=origin) as r:
            assert r.status == 401
        async with http.post(f"{base}/login", data={"csrf": form["csrf"], "token": "wrong", "next": "/silences"},
                             headers=origin) as r:
            assert r.status == 401
            bodies.append(await r.text())
        async with http.post(f"{base}/login", data={"csrf": form["csrf"], "token": TOKEN, "next": "//evil.example"},
                             headers=origin, allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (303, "/alerts")  # never a redirect off the agent
            cookie = r.cookies["sre_agent_session"]
            set_cookie = r.headers["Set-Cookie"]
        assert cookie.value != anonymous  # a fresh id: no session fixation
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and TOKEN not in set_cookie
        async with http.get(f"{base}/silences") as r:
            page = await r.text()
        bodies.append(page)
        form["csrf"] = _csrf(page)
        async with http.post(f"{base}/silences", data=form, headers=origin, allow_redirects=False) as r:
            assert r.status == 303
        async with http.post(f"{base}/api/v1/silences", json={"matchers": ['a="1"']}) as r:
            assert r.status == 401  # the cookie is not the API's bearer token
        for page_path in PAGES:
            async with http.get(base + page_path) as r:
                bodies.append(await r.text())
        async with http.post(f"{base}/logout", data={"csrf": form["csrf"]}, headers=origin,
                             allow_redirects=False) as r:
            assert r.status == 303
        http.cookie_jar.update_cookies({"sre_agent_session": cookie.value})  # replaying the old cookie
        async with http.post(f"{base}/silences", data=form, headers=origin) as r:
            assert r.status == 401
    assert len(await agent.silences_json()) == 1
    assert not [b for b in bodies if TOKEN in b]


async def test_protect_reads_sends_browsers_to_the_login(start_agent: StartAgent) -> None:
    """With protect_reads a page without a session redirects to /login (which, with the CSS, stays open);
    after the login the pages and the JSON reads answer to the session cookie."""
    agent = await start_agent({"auth": {"bearer_token_env": "TOK", "protect_reads": True}}, {"TOK": TOKEN})
    base = f"http://127.0.0.1:{agent.port}"
    async with _session() as http:
        async with http.get(f"{base}/alerts", allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (303, "/login?next=/alerts")
        async with http.get(f"{base}/api/v1/alerts") as r:
            assert r.status == 401
        async with http.get(f"{base}/static/ui.css") as r:
            assert r.status == 200
        async with http.get(f"{base}/login") as r:
            csrf = _csrf(await r.text())
        async with http.post(f"{base}/login", data={"csrf": csrf, "token": TOKEN, "next": "/rules"},
                             headers={"Origin": base}, allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (303, "/rules")
        async with http.get(f"{base}/alerts") as r:
            assert r.status == 200 and "InjectedLabel" in await r.text()
        async with http.get(f"{base}/api/v1/alerts") as r:
            assert r.status == 200


# Redirect targets a browser would take off the agent: tab, newline and backslash variants, leading
# whitespace and control characters, three slashes, schemes, and percent-encodings (which stay paths).
HOSTILE_NEXT = ["//evil.example", "/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "\t//evil.example",
                " //evil.example", "\x00//evil.example", "\u3000//evil.example", "/\\evil.example", "\\\\evil.example",
                "/\\/evil.example", "\\/evil.example", "///evil.example", "http://evil.example", "https:evil.example",
                "HTTP://evil.example/alerts", "javascript:alert(1)", "/\t\\evil.example", "%2F%2Fevil.example",
                "/%2F%2Fevil.example", "/%09/evil.example", "/%5C%5Cevil.example"]


def _browser_leaves(location: str) -> bool:
    """Whether a browser resolving ``location`` against the agent's URL lands on another host (the WHATWG
    URL rules that matter: C0 controls and spaces stripped at the ends, tab and newlines dropped anywhere,
    ``\\`` read as ``/``, a scheme or a leading ``//`` makes it absolute)."""
    text = location.strip("".join(map(chr, range(0x21)))).replace("\t", "").replace("\n", "").replace("\r", "")
    text = text.replace("\\", "/")
    return bool(re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", text)) or text.startswith("//")


@pytest.mark.parametrize("target", HOSTILE_NEXT)
async def test_login_never_redirects_off_the_agent(start_agent: StartAgent, target: str) -> None:
    """A next= a browser would resolve to another host (tab, backslash, encoded, whitespace variants) is
    replaced by /alerts, both in the login page's form and in the redirect after the login."""
    agent = await start_agent({"auth": {"bearer_token_env": "TOK"}}, {"TOK": TOKEN})
    base = f"http://127.0.0.1:{agent.port}"
    async with _session() as http:
        async with http.get(f"{base}/login", params={"next": target}) as r:
            page = await r.text()
        shown = re.search(r'name="next" value="([^"]*)"', page)
        async with http.post(f"{base}/login", data={"csrf": _csrf(page), "token": TOKEN, "next": target},
                             headers={"Origin": base}, allow_redirects=False) as r:
            status, location = r.status, r.headers.get("Location", "")
    assert shown is not None and not _browser_leaves(shown.group(1)), shown
    assert status == 303 and location.startswith("/") and not _browser_leaves(location), location
