"""Tests for agent.app.writes: cross-site writes to the JSON API, and unauthenticated writes from other machines."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from agent.app.daemon import Agent
from agent.app.writes import local_peer, writes_middleware
from agent.config import ServerConfig
from agent.diagnose.findings import Finding

SILENCE = {"matchers": ['alertname="CsrfProbe"'], "duration": "1h"}
WEBHOOK = {"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing", "receiver": "agent",
           "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am:9093",
           "alerts": [{"status": "firing", "labels": {"alertname": "X", "instance": "a"}, "annotations": {},
                       "startsAt": "2025-06-15T15:00:00.123456789Z", "endsAt": "0001-01-01T00:00:00Z",
                       "generatorURL": "", "fingerprint": "0123456789abcdef"}]}
FINDING = {"version": "1", "key": "finding:forward:csrf:1", "labels": {"node": "gpu-node-7"},
           "finding": Finding(kind="gpu-oom-runtime", summary="CUDA OOM on GPU 3.", severity="critical",
                              evidence=["torch.OutOfMemoryError: CUDA out of memory."]).to_json()}
ENDPOINTS = {"/api/v1/silences": SILENCE, "/api/v1/alertmanager/webhook": WEBHOOK, "/api/v1/findings": FINDING}


def _attempts(base: str) -> dict[str, tuple[dict[str, str], int]]:
    """(headers, expected status) of what a page on another site can make a browser send without a preflight."""
    return {
        "no-cors fetch of a Blob: no Content-Type": ({}, 400),
        "no-cors fetch of a string: text/plain": ({"Content-Type": "text/plain;charset=UTF-8"}, 400),
        "form post": ({"Content-Type": "application/x-www-form-urlencoded"}, 400),
        "multipart form": ({"Content-Type": "multipart/form-data; boundary=x"}, 400),
        "JSON from another origin": ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        "JSON from another port": ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, 403),
        "JSON from a null origin": ({"Content-Type": "application/json", "Origin": "null"}, 403),
        "JSON with a foreign Referer": ({"Content-Type": "application/json",
                                         "Referer": "http://evil.example/page"}, 403),
        "Fetch Metadata cross-site": ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
        "Fetch Metadata same-site": ({"Content-Type": "application/json", "Origin": base,
                                      "Sec-Fetch-Site": "same-site"}, 403),
        "no-cors with Origin": ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site",
                                 "Sec-Fetch-Mode": "no-cors"}, 403),
    }


@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_cross_site_writes_to_the_json_api_are_refused(agent: Agent, path: str) -> None:
    """Every mutating JSON endpoint refuses what a cross-site page can send without a preflight (no or a
    non-JSON Content-Type: 400; a foreign Origin, Referer or Fetch-Metadata site: 403) and changes nothing;
    a program's JSON post without Origin, and the agent's own origin, are accepted."""
    base = f"http://127.0.0.1:{agent.port}"
    body = json.dumps(ENDPOINTS[path]).encode()
    codes, wanted = {}, {}
    async with aiohttp.ClientSession() as http:
        for what, (headers, status) in _attempts(base).items():
            wanted[what] = status
            # skip_auto_headers: aiohttp would otherwise add application/octet-stream to a bytes body
            async with http.post(base + path, data=body, headers=headers,
                                 skip_auto_headers=["Content-Type"]) as r:
                codes[what] = r.status
        async with http.get(f"{base}/api/v1/silences") as r:
            stored = (await r.json())["data"]["silences"]
        async with http.post(base + path, data=body, headers={"Content-Type": "application/json"}) as r:
            program = r.status
        async with http.post(base + path, data=body, headers={"Content-Type": "application/json", "Origin": base,
                                                               "Sec-Fetch-Site": "same-origin"}) as r:
            own_page = r.status
    assert codes == wanted
    assert stored == []
    assert (program, own_page) == (200, 200)


async def test_cross_site_delete_is_refused(agent: Agent) -> None:
    """DELETE /api/v1/silences/{id} from another origin is a 403 and the silence stays active."""
    base = f"http://127.0.0.1:{agent.port}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/v1/silences", json=SILENCE) as r:
            sid = (await r.json())["data"]["silenceID"]
        codes = []
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
            async with http.delete(f"{base}/api/v1/silences/{sid}", headers=headers) as r:
                codes.append(r.status)
        [silence] = (await agent.silences_json())
    assert codes == [403, 403, 403]
    assert silence["status"]["state"] == "active"


# -- writes from other machines -----------------------------------------------------------------------

def _request(method: str, path: str, peer: str | None) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" and peer is not None else default)
    return make_mocked_request(method, path, headers={"Host": "127.0.0.1:9400", "Content-Type": "application/json"},
                               transport=transport)


PEERS = [("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
         ("127.0.0.6", False),  # Istio's inbound sidecar connects from here on behalf of any pod in the mesh
         ("127.8.9.10", False), ("::ffff:127.0.0.6", False),
         ("192.0.2.7", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("fd00::2", False),
         ("0.0.0.0", False), ("", False), (None, False), ("not-an-address", False)]


@pytest.mark.parametrize(("peer", "local"), PEERS)
def test_local_peer(peer: str | None, local: bool) -> None:
    """Only 127.0.0.1 and ::1 (also IPv4-mapped) count as this machine, not the rest of 127/8 that a
    service mesh's sidecar connects from."""
    assert local_peer(peer) is local


async def _answer(config: ServerConfig, method: str, path: str, peer: str | None) -> int:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text="handled")

    response: web.StreamResponse = await writes_middleware(config)(_request(method, path, peer), handler)
    return response.status


@pytest.mark.parametrize("path", ["/api/v1/silences", "/api/v1/alertmanager/webhook", "/api/v1/findings",
                                  "/silences", "/silences/abc/expire", "/login"])
@pytest.mark.parametrize(("peer", "local"), [p for p in PEERS if p[0] not in ("0.0.0.0", "not-an-address")])
async def test_unauthenticated_writes_only_from_this_machine(path: str, peer: str | None, local: bool) -> None:
    """Without server.auth, writes from other machines are a 403 (reads are not); a token or
    allow_unauthenticated_writes lifts that."""
    open_ = ServerConfig(listen="0.0.0.0:9400")
    allowed = ServerConfig(listen="0.0.0.0:9400", allow_unauthenticated_writes=True)
    token = ServerConfig.model_validate({"listen": "0.0.0.0:9400", "auth": {"bearer_token_env": "T"}},
                                        context={"environ": {"T": "x"}})
    assert await _answer(open_, "POST", path, peer) == (200 if local else 403)
    assert await _answer(open_, "DELETE", path, peer) == (200 if local else 403)
    assert await _answer(open_, "GET", path, peer) == 200
    assert await _answer(allowed, "POST", path, peer) == 200
    assert await _answer(token, "POST", path, peer) == 200


@pytest.mark.parametrize(("fields", "words"), [
    ({"listen": "0.0.0.0:9400"}, ["without authentication", "refused"]),
    ({"listen": "[::]:9400"}, ["without authentication", "refused"]),
    ({"listen": "0.0.0.0:9400", "allow_unauthenticated_writes": True}, ["allow_unauthenticated_writes",
                                                                         "anyone who can reach it"]),
    ({"listen": "127.0.0.1:9400"}, []),
    ({"listen": "127.0.0.1:9400", "allow_unauthenticated_writes": True}, []),
])
def test_exposure_warnings_say_how_writes_are_guarded(fields: dict[str, Any], words: list[str]) -> None:
    """Beyond loopback without a token the warning says other machines' writes are refused, or, with
    allow_unauthenticated_writes, that anyone may write; loopback is quiet."""
    warnings = ServerConfig.model_validate(fields).warnings()
    assert len(warnings) == (1 if words else 0), warnings
    assert all(w in warnings[0] for w in words), warnings
