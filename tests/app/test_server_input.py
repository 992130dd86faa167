"""Tests for agent.app.server's path and query parameters under hostile values: 400 or 404, never 500."""

from __future__ import annotations

import re

import aiohttp
import pytest

from agent.app.daemon import Agent
from agent.app.server import build_app

# Values a parameter must survive: digits int() or str.isdigit() accepts but ASCII does not
# (Arabic-Indic, fullwidth, superscript, Devanagari), int()'s extras (underscores, spaces, signs),
# percent-encoded NUL and control bytes, a lone surrogate, invalid UTF-8, and lengths past any column.
HOSTILE = ["\u0663", "\u0661\u0662", "\uff11\uff12", "\u00b2", "\u0967", "1_0", " 7", "+5", "-1", "0x1",
           "%00", "%0a", "%ed%a0%80", "%ff%fe", "9" * 400, "a" * 5000, "%e2%80%ae", "%2e%2e%2f"]


def _quoted(value: str) -> str:
    """The value as it goes into a URL: characters quoted, ``%xx`` escapes kept as written."""
    from urllib.parse import quote

    return quote(value, safe="%")


async def _status(http: aiohttp.ClientSession, method: str, url: str) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} if method == "POST" else {}
    async with http.request(method, url, headers=headers, data=b"{}" if method == "POST" else None,
                            allow_redirects=False) as r:
        return r.status, await r.text()


def _routes(agent: Agent) -> list[tuple[str, str]]:
    """(method, path template) of every route the running app serves that takes a path parameter."""
    app = build_app(agent, agent.config.server)  # the same table the running agent serves
    out = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        if "formatter" in info and route.method != "HEAD":
            out.append((route.method, info["formatter"]))
    return out


@pytest.mark.parametrize("value", HOSTILE)
async def test_path_parameters_never_answer_500(agent: Agent, value: str) -> None:
    """Every route with a path parameter ({id}, {name}) answers a hostile value with a 4xx, never 500."""
    routes = _routes(agent)
    assert {p for _, p in routes} >= {"/incidents/{id}", "/api/v1/silences/{id}", "/silences/{id}/expire",
                                      "/static/{name}"}
    wrong = []
    async with aiohttp.ClientSession() as http:
        for method, template in routes:
            url = f"http://127.0.0.1:{agent.port}" + re.sub(r"\{\w+\}", _quoted(value), template)
            status, text = await _status(http, method, url)
            if not 400 <= status < 500:
                wrong.append(f"{method} {template}: {status} {text[:120]}")
    assert wrong == []


@pytest.mark.parametrize("value", ["\u0663", "\uff11\uff12", "\u00b2", "\u0967", "1_0", " 7", "+5", "0", "00",
                                   "9" * 19])
async def test_incident_ids_are_ascii_digits(agent: Agent, value: str) -> None:
    """/incidents/{id} takes only ASCII digits: other digits are a 400 naming the id, in every format."""
    async with aiohttp.ClientSession() as http:
        for fmt in ("html", "md", "json"):
            url = f"http://127.0.0.1:{agent.port}/incidents/{_quoted(value)}?format={fmt}"
            status, text = await _status(http, "GET", url)
            if value.strip("0") == "" and value:  # "0", "00": well-formed, no such incident
                assert status == 404, (value, fmt, status, text)
            else:
                assert (status, "incident id" in text) == (400, True), (value, fmt, status, text)


@pytest.mark.parametrize(("query", "word"), [
    ("limit=\u0663", "limit"), ("limit=\uff11\uff12", "limit"), ("limit=\u00b2", "limit"), ("limit=1_0", "limit"),
    ("limit=%207", "limit"), ("limit=+5", "limit"), ("format=\u0663", "format"), ("format=%00", "format"),
])
async def test_query_parameters_are_ascii(agent: Agent, query: str, word: str) -> None:
    """A numeric query parameter takes ASCII digits only; a bad one is a 400 naming it, never 500."""
    path = "/incidents/1" if word == "format" else "/api/v1/incidents"
    async with aiohttp.ClientSession() as http:
        status, text = await _status(http, "GET", f"http://127.0.0.1:{agent.port}{path}?{query}")
    assert (status, word in text) == (400, True), (query, status, text)


@pytest.mark.parametrize("path", ["/silences?created=%ed%a0%80&expired=%00", "/silences?matcher=%ff%fe",
                                  "/login?next=%ed%a0%80", "/alerts?x=%00", "/incidents?limit=\u0663"])
async def test_ui_query_values_never_answer_500(agent: Agent, path: str) -> None:
    """The UI pages read their query values (created, expired, matcher, next) without a 500 on any bytes."""
    async with aiohttp.ClientSession() as http:
        status, text = await _status(http, "GET", f"http://127.0.0.1:{agent.port}{path}")
    assert status < 500, (path, status, text[:200])
