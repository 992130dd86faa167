"""Tests for agent.app.hosts: which Host names the agent answers (DNS rebinding), by policy and over HTTP."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from agent.app.daemon import Agent
from agent.app.hosts import HostPolicy, split_host
from agent.config import ServerConfig

TOKEN = "hosts-test-token"


def _server(environ: dict[str, str] | None = None, **fields: Any) -> ServerConfig:
    return ServerConfig.model_validate(fields, context={"environ": environ or {}})


LOOPBACK = _server(listen="127.0.0.1:9400")
WILDCARD = _server(listen="0.0.0.0:9400")
WILDCARD_AUTH = _server({"T": TOKEN}, listen=":9400", auth={"bearer_token_env": "T"})
WILDCARD_AUTH_LIST = _server({"T": TOKEN}, listen=":9400", auth={"bearer_token_env": "T"},
                             allowed_hosts=["agent.example.org"])
LISTED = _server(listen="127.0.0.1:9400", external_url="https://sre.example.com/agent",
                 allowed_hosts=["Agent.Internal", "proxy.local:8443", ".svc.cluster.local", "[fd00::1]"])
STAR = _server(listen="127.0.0.1:9400", allowed_hosts=["*"])
NAMED = _server(listen="agent.lan:9400")

CASES: list[tuple[str, ServerConfig, str | None, bool]] = [
    # (what, config, Host header, allowed)
    ("loopback by address", LOOPBACK, "127.0.0.1:9400", True),
    ("loopback by localhost", LOOPBACK, "localhost:9400", True),
    ("localhost, trailing dot, upper case", LOOPBACK, "LOCALHOST.:9400", True),
    ("IPv6 loopback", LOOPBACK, "[::1]:9400", True),
    ("any address literal", LOOPBACK, "10.1.2.3", True),
    ("no Host header", LOOPBACK, None, True),
    ("rebound name", LOOPBACK, "rebind.evil.example:9400", False),
    ("rebound name without port", LOOPBACK, "rebind.evil.example", False),
    ("localhost as a subdomain", LOOPBACK, "localhost.evil.example:9400", False),
    ("name ending in an address", LOOPBACK, "127.0.0.1.nip.io:9400", False),
    ("userinfo trick", LOOPBACK, "127.0.0.1@evil.example", False),
    ("empty", LOOPBACK, "", False),
    ("bare IPv6", LOOPBACK, "::1", False),
    ("non-ASCII lookalike", LOOPBACK, "l\u043ecalhost:9400", False),
    ("fullwidth port", LOOPBACK, "localhost:\uff19\uff14", False),
    ("wildcard: localhost", WILDCARD, "localhost:9400", True),
    ("wildcard: machine name", WILDCARD, "node-7:9400", True),
    ("wildcard: machine's short name", WILDCARD, "node-7", True),
    ("wildcard without auth: unknown name", WILDCARD, "rebind.evil.example:9400", False),
    ("wildcard with auth, no list: any name", WILDCARD_AUTH, "sre-agent.monitoring.svc:9400", True),
    ("wildcard with auth and a list: strict", WILDCARD_AUTH_LIST, "rebind.evil.example:9400", False),
    ("wildcard with auth and a list: listed", WILDCARD_AUTH_LIST, "agent.example.org:9400", True),
    ("external_url's host, any port", LISTED, "sre.example.com", True),
    ("listed, case-insensitive", LISTED, "agent.internal:9400", True),
    ("listed with port: that port", LISTED, "proxy.local:8443", True),
    ("listed with port: another port", LISTED, "proxy.local:9400", False),
    ("domain suffix: the domain", LISTED, "svc.cluster.local", True),
    ("domain suffix: a subdomain", LISTED, "sre-agent.monitoring.svc.cluster.local:9400", True),
    ("domain suffix is not a substring", LISTED, "evilsvc.cluster.local", False),
    ("listed IPv6 in brackets", LISTED, "[fd00::1]:9400", True),
    ("star", STAR, "anything.example", True),
    ("listen host by name", NAMED, "agent.lan:9400", True),
    ("listen by name: localhost is not it", NAMED, "localhost:9400", False),
]


@pytest.mark.parametrize(("what", "config", "host", "allowed"), CASES, ids=[c[0] for c in CASES])
def test_host_policy(what: str, config: ServerConfig, host: str | None, allowed: bool) -> None:
    """A Host is answered when it is an address, a loopback or listen name, external_url's host or listed."""
    policy = HostPolicy.from_config(config, machine_name="node-7.dc1.example")
    assert policy.allows(host) is allowed, (what, policy.shown())


@pytest.mark.parametrize("entry", ["evil example", "http://x", "x/y", "a:b", "::1", "", "x:99999999", "x:70000",
                                   "[evil]", "lo\u0441alhost"])
def test_allowed_hosts_entries_are_checked(entry: str) -> None:
    """An allowed_hosts entry that is not a name, name:port, .domain, [IPv6] or * fails at load, naming it."""
    with pytest.raises(ValidationError, match=r"allowed_hosts\n.*\[0\]: not a host name"):
        _server(allowed_hosts=[entry])


@pytest.mark.parametrize(("value", "parsed"), [
    ("Example.ORG.:80", ("example.org", "80")), ("[::1]", ("::1", "")), ("[::1]:9", ("::1", "9")),
    ("[::1]x", None), ("[evil]:9", None), ("a:", ("a", "")), ("a:b", None), ("a b", None),
])
def test_split_host(value: str, parsed: tuple[str, str] | None) -> None:
    """Host headers split into a lower-case host and a port; anything else is None."""
    assert split_host(value) == parsed


# -- over HTTP ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rebind.evil.example", "attacker.test", "localhost.evil.example"])
async def test_rebound_names_cannot_read_or_silence(agent: Agent, name: str) -> None:
    """A loopback agent reached under a rebound name refuses its reads, the UI form and the JSON API (400),
    and creates no silence; the same requests under 127.0.0.1 and localhost are answered."""
    base = f"http://127.0.0.1:{agent.port}"
    evil = {"Host": f"{name}:{agent.port}", "Origin": f"http://{name}:{agent.port}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/api/v1/status", headers={"Host": evil["Host"]}) as r:
            status_code, body = r.status, await r.text()
        async with http.get(f"{base}/silences", headers={"Host": evil["Host"]}) as r:
            page_code, page = r.status, await r.text()
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        form = {"matchers": 'alertname="X"', "duration": "1h", "csrf": csrf.group(1) if csrf else ""}
        async with http.post(f"{base}/silences", data=form, headers=evil, allow_redirects=False) as r:
            form_code = r.status
        async with http.post(f"{base}/api/v1/silences", json={"matchers": ['alertname="X"']}, headers=evil) as r:
            api_code = r.status
        async with http.get(f"{base}/healthz", headers={"Host": evil["Host"]}) as r:
            probe_code = r.status
        answered = []
        for host in (f"127.0.0.1:{agent.port}", f"localhost:{agent.port}"):
            async with http.get(f"{base}/api/v1/status", headers={"Host": host}) as r:
                answered.append(r.status)
        async with http.get(f"{base}/api/v1/silences") as r:
            silences = (await r.json())["data"]["silences"]
    assert (status_code, page_code, form_code, api_code) == (400, 400, 400, 400), body[:200]
    assert "server.allowed_hosts" in body and name in body
    assert probe_code == 200 and answered == [200, 200]
    assert silences == []
