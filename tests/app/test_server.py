"""Tests for agent.app.server and agent.app.connections: limits, authentication, TLS and bad input."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from agent.app.connections import AcceptErrorLog
from agent.app.daemon import Agent
from agent.config import Config, ServerConfig
from tests.alertmanager import eventually
from tests.conftest import REPO
from tests.receivers import free_port

TOKEN = "s3cret-token-for-tests"

# Opens N sockets to the agent, sends half a request line on each and holds them; prints one JSON
# line when all are open and one when the agent has closed every one (or its deadline passes).
_ATTACKER = r"""
import json, selectors, socket, sys, time
port, n, deadline_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks, failed = [], 0
for _ in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /api/v1/targ")
        s.setblocking(False)
        socks.append(s)
    except OSError:
        failed += 1
t0 = time.monotonic()
print(json.dumps({"opened": len(socks), "failed": failed}), flush=True)
sel = selectors.DefaultSelector()
for s in socks:
    sel.register(s, selectors.EVENT_READ)
closed = {"408": 0, "eof": 0, "reset": 0}
while len(sel.get_map()) and time.monotonic() - t0 < deadline_s:
    for key, _ in sel.select(timeout=0.5):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = None
        if data and not data.startswith(b"HTTP/1.1 408"):
            continue
        closed["408" if data else ("eof" if data == b"" else "reset")] += 1
        sel.unregister(key.fileobj)
        key.fileobj.close()
print(json.dumps({"closed": closed, "open": len(sel.get_map()), "after_s": round(time.monotonic() - t0, 2)}),
      flush=True)
"""

# Runs the agent with a small open-file limit, so that without the connection cap the attack
# above would take every descriptor the scraper needs. The hard limit too: the agent raises its
# soft limit to the hard one at start.
_AGENT = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
from agent.cli import main
sys.exit(main(["run", "--config", sys.argv[1], "--log-format", "json"]))
"""


@pytest.fixture
async def target() -> AsyncIterator[str]:
    """One scrape target serving a tiny exposition."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    await runner.cleanup()


async def test_half_sent_requests_neither_starve_healthz_nor_the_scraper(tmp_path: Path, target: str) -> None:
    """400 half-sent requests from another process against an agent limited to 400 descriptors:
    /healthz keeps answering, the target stays up, the agent holds at most max_connections and
    closes every half-open socket after the head deadline, and logs no accept errors."""
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(json.dumps({
        "targets": [{"url": target}], "scrape": {"interval": "1s", "timeout": "1s", "concurrency": 64},
        "server": {"listen": f"127.0.0.1:{port}", "max_connections": 100, "header_timeout": "3s"},
        "nvml": {"enabled": False}, "state": {"path": str(tmp_path / "s.db")},
    }), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stderr = (tmp_path / "agent.log").open("w", encoding="utf-8")
    agent = subprocess.Popen([sys.executable, "-c", _AGENT, str(cfg), "400"], stdout=subprocess.DEVNULL,
                             stderr=stderr, env=env)
    attacker: subprocess.Popen[str] | None = None
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=5)) as http:
            base = f"http://127.0.0.1:{port}"

            async def status() -> dict[str, Any] | None:
                try:
                    async with http.get(f"{base}/api/v1/status") as r:
                        return dict((await r.json())["data"])
                except (aiohttp.ClientError, TimeoutError):
                    return None

            async def scraped() -> dict[str, Any] | None:
                s = await status()
                return s if s and s["scrape_cycles"] > 0 else None

            before = await eventually(scraped, timeout=30, what="the agent's first scrape cycle")
            assert before["server"]["warnings"] == []
            attacker = subprocess.Popen([sys.executable, "-c", _ATTACKER, str(port), "400", "30"],
                                        stdout=subprocess.PIPE, text=True, env=env)
            assert attacker.stdout is not None
            opened = json.loads(await asyncio.to_thread(attacker.stdout.readline))
            assert opened == {"opened": 400, "failed": 0}

            latencies: list[float] = []
            peak = 0
            done = asyncio.ensure_future(asyncio.to_thread(attacker.stdout.readline))
            while not done.done():
                t0 = time.perf_counter()
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200
                latencies.append(time.perf_counter() - t0)
                s = await status()
                assert s is not None
                peak = max(peak, s["server"]["connections"])
                await asyncio.wait([done], timeout=0.1)
            result = json.loads(done.result())

            async def cycles_after() -> dict[str, Any] | None:
                s = await status()
                return s if s and s["scrape_cycles"] > before["scrape_cycles"] + 2 else None

            after = await eventually(cycles_after, what="scrape cycles after the attack")
            async with http.get(f"{base}/api/v1/targets") as r:
                [t] = (await r.json())["data"]["targets"]
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait()
        agent.terminate()
        agent.wait(timeout=30)
        stderr.close()
    latencies.sort()
    print(f"/healthz under attack: n={len(latencies)} p50={latencies[len(latencies) // 2] * 1000:.1f}ms "
          f"max={latencies[-1] * 1000:.1f}ms; peak connections {peak}; attacker {result}")
    assert result["open"] == 0 and sum(result["closed"].values()) == 400
    assert result["closed"]["408"] > 0 and result["closed"]["eof"] > 0  # timed out; evicted for newer ones
    assert peak <= 100
    assert t["health"] == "up", t["last_error"]
    assert after["server"]["connections"] <= 2
    assert 'sre_agent_http_connections_closed_total{reason="header_timeout"}' in metrics
    assert "cannot accept" not in (tmp_path / "agent.log").read_text(encoding="utf-8")


def test_accept_errors_are_logged_once_a_minute() -> None:
    """EMFILE from accept() is logged once per interval with a count; other loop errors pass through."""
    now = [0.0]
    handler = AcceptErrorLog(interval_s=60, clock=lambda: now[0])
    passed: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    try:
        handler.install(loop)
        loop.set_exception_handler(handler)
        handler._previous = lambda _loop, ctx: passed.append(ctx)
        ctx = {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")}
        with structlog.testing.capture_logs() as logs:
            for _ in range(30):
                handler(loop, ctx)
                now[0] += 1
            now[0] += 60
            handler(loop, ctx)
            handler(loop, {"message": "something else"})
    finally:
        handler.uninstall()
        loop.close()
    assert [e.get("similar_since_last") for e in logs] == [0, 29]
    assert handler.errors == 31
    assert passed == [{"message": "something else"}]


# -- an agent in this process ------------------------------------------------------------------------

def _agent(tmp_path: Path, server: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Agent:
    data = {"targets": [], "server": {"listen": "127.0.0.1:0", **(server or {})}, "nvml": {"enabled": False},
            "state": {"path": str(tmp_path / "s.db")}}
    return Agent(Config.model_validate(data, context={"environ": environ or {}}))


@pytest.fixture
async def plain_agent(tmp_path: Path) -> AsyncIterator[Agent]:
    agent = _agent(tmp_path, {"body_timeout": "1s"})
    await agent.start()
    yield agent
    await agent.stop()


SILENCE = {"matchers": ['alertname="X"'], "duration": "1h"}
BAD_SILENCES: list[tuple[str, bytes, dict[str, str], str]] = [
    # (what, body, headers, a word the error must contain)
    ("endsAt inf", b'{"matchers": ["a=\\"1\\""], "endsAt": Infinity}', {}, "JSON"),
    ("endsAt 1e400", b'{"matchers": ["a=\\"1\\""], "endsAt": 1e400}', {}, "endsAt"),
    ("endsAt 1e300", b'{"matchers": ["a=\\"1\\""], "endsAt": 1e300}', {}, "endsAt"),
    ("endsAt list", b'{"matchers": ["a=\\"1\\""], "endsAt": [1]}', {}, "endsAt"),
    ("endsAt string", b'{"matchers": ["a=\\"1\\""], "endsAt": "tomorrow"}', {}, "endsAt"),
    ("endsAt in the past", b'{"matchers": ["a=\\"1\\""], "endsAt": 1000}', {}, "endsAt"),
    ("huge duration", b'{"matchers": ["a=\\"1\\""], "duration": "99999999999h"}', {}, "10 years"),
    ("negative duration", b'{"matchers": ["a=\\"1\\""], "duration": "-5m"}', {}, "duration"),
    ("empty duration", b'{"matchers": ["a=\\"1\\""], "duration": ""}', {}, "duration"),
    ("numeric duration", b'{"matchers": ["a=\\"1\\""], "duration": 3600}', {}, "duration"),
    ("both end and duration", b'{"matchers": ["a=\\"1\\""], "duration": "1h", "endsAt": 1}', {}, "not both"),
    ("bad matcher", b'{"matchers": ["alertname"]}', {}, "matcher"),
    ("bad regex", b'{"matchers": ["a=~\\"(\\""]}', {}, "regular expression"),
    ("deep unbalanced regex", json.dumps({"matchers": ["a=~\"" + "(" * 500 + "x" + "\""]}).encode(), {},
     "regular expression"),
    ("long matcher", json.dumps({"matchers": ['a="' + "x" * 5000 + '"']}).encode(), {}, "too long"),
    ("many matchers", json.dumps({"matchers": [f'a{i}="1"' for i in range(100)]}).encode(), {}, "at most"),
    ("matchers not a list", b'{"matchers": "a=\\"1\\""}', {}, "matchers"),
    ("matchers of numbers", b'{"matchers": [1]}', {}, "matchers"),
    ("matches everything", b'{"matchers": ["a=~\\".*\\""]}', {}, "empty string"),
    ("comment not a string", b'{"matchers": ["a=\\"1\\""], "comment": {"x": 1}}', {}, "comment"),
    ("unknown key", b'{"matchers": ["a=\\"1\\""], "startsAt": 1}', {}, "unknown key"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, {}, "nested"),
    ("deep object nesting", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, "nested"),
    ("a list", b'[{"matchers": ["a=\\"1\\""]}]', {}, "object"),
    ("a string", b'"hello"', {}, "object"),
    ("null", b"null", {}, "object"),
    ("empty body", b"", {}, "empty"),
    ("not JSON", b"matchers=a", {}, "JSON"),
    ("NaN", b'{"matchers": ["a=\\"1\\""], "endsAt": NaN}', {}, "JSON"),
    ("huge integer", b'{"endsAt": ' + b"9" * 5000 + b"}", {}, "JSON"),
    ("not UTF-8", b'{"matchers": ["a=\\"\xff\xfe\\""]}', {}, "UTF-8"),
    ("form content type", b'{"matchers": ["a=\\"1\\""]}', {"Content-Type": "application/x-www-form-urlencoded"},
     "Content-Type"),
    ("text content type", b'{"matchers": ["a=\\"1\\""]}', {"Content-Type": "text/plain"}, "Content-Type"),
]


async def test_every_bad_silence_is_a_400_that_names_the_problem(plain_agent: Agent) -> None:
    """Each class of bad POST /api/v1/silences body is answered 400 with a message naming it, never 500."""
    base = f"http://127.0.0.1:{plain_agent.port}"
    wrong: list[str] = []
    async with aiohttp.ClientSession() as http:
        for what, body, headers, word in BAD_SILENCES:
            hdrs = {"Content-Type": "application/json", **headers}
            async with http.post(f"{base}/api/v1/silences", data=body, headers=hdrs) as r:
                answer = await r.json()
                if r.status != 400 or word not in answer.get("error", ""):
                    wrong.append(f"{what}: {r.status} {answer}")
        async with http.get(f"{base}/api/v1/silences") as r:
            stored = (await r.json())["data"]["silences"]
        async with http.post(f"{base}/api/v1/silences", json=SILENCE) as r:
            assert r.status == 200  # and a good one still works
    assert wrong == []
    assert stored == []


async def test_too_big_or_too_slow_bodies_are_refused(plain_agent: Agent) -> None:
    """A body over server.body_limit is a 413; one that stalls past body_timeout is a 408."""
    port = plain_agent.port
    async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{port}/api/v1/silences", data=b" " * (2**20 + 10),
            headers={"Content-Type": "application/json"}) as r:
        assert r.status == 413
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /api/v1/silences HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"matchers\"")
    await writer.drain()
    head = await asyncio.wait_for(reader.readline(), timeout=10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("query", ["limit=abc", "limit=1e309", "limit=-5", "limit=0", "limit=100000",
                                   "limit=" + "9" * 5000, "limit=%ff", "limit="])
async def test_bad_incident_limits_are_400(plain_agent: Agent, query: str) -> None:
    """A limit that is not an integer from 1 to 1000 is a 400 naming limit."""
    async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{plain_agent.port}/api/v1/incidents?{query}") as r:
        assert r.status == 400
        assert "limit" in (await r.json())["error"]


async def test_malformed_requests_are_400_not_500(plain_agent: Agent) -> None:
    """Raw garbage, non-UTF-8 paths and over-long header lines are refused by the parser with a 400."""
    for raw in (b"\xff\xfe garbage\r\n\r\n", b"GET /api/v1/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", plain_agent.port)
        writer.write(raw)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=10)
        writer.close()
        assert line.split(b" ")[1] in (b"400", b"404"), (raw[:30], line)


async def test_unexpected_errors_are_logged_once_and_answered_500(plain_agent: Agent) -> None:
    """A bug in a handler is logged with its traceback and answered a generic 500 without details."""

    def broken() -> list[dict[str, Any]]:
        raise KeyError("secret detail")

    plain_agent.targets_json = broken  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{plain_agent.port}/api/v1/targets") as r:
            status, body = r.status, await r.text()
    assert status == 500 and "secret detail" not in body and "internal error" in body
    [entry] = [e for e in logs if e["event"] == "unexpected error answering a request"]
    assert entry["exc_info"] is True and entry["path"] == "/api/v1/targets"


# -- authentication and TLS -------------------------------------------------------------------------

async def test_bearer_token_guards_mutations_and_optionally_reads(tmp_path: Path) -> None:
    """With a token, POST/DELETE need it (wrong or missing: 401); reads need it only with protect_reads,
    and /healthz and /readyz never do; the token never appears in /api/v1/status."""
    for protect_reads in (False, True):
        agent = _agent(tmp_path, {"auth": {"bearer_token_env": "TOK", "protect_reads": protect_reads}},
                       environ={"TOK": TOKEN})
        await agent.start()
        base = f"http://127.0.0.1:{agent.port}"
        good = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with aiohttp.ClientSession() as http:
                codes = {}
                for name, headers in (("none", {}), ("wrong", {"Authorization": "Bearer nope"}),
                                      ("basic", {"Authorization": f"Basic {TOKEN}"}), ("good", good)):
                    async with http.post(f"{base}/api/v1/silences", json=SILENCE, headers=headers) as r:
                        codes[name] = r.status
                        if r.status == 401:
                            assert r.headers["WWW-Authenticate"].startswith("Bearer")
                            silence_id = None
                        else:
                            silence_id = (await r.json())["data"]["silenceID"]
                async with http.delete(f"{base}/api/v1/silences/{silence_id}") as r:
                    delete_without = r.status
                async with http.delete(f"{base}/api/v1/silences/{silence_id}", headers=good) as r:
                    delete_with = r.status
                async with http.get(f"{base}/api/v1/status") as r:
                    read_without = r.status
                async with http.get(f"{base}/api/v1/status", headers=good) as r:
                    status_text = await r.text()
                async with http.get(f"{base}/healthz") as r:
                    healthz = r.status
                async with http.get(f"{base}/readyz") as r:
                    readyz = r.status
        finally:
            await agent.stop()
        assert codes == {"none": 401, "wrong": 401, "basic": 401, "good": 200}
        assert (delete_without, delete_with) == (401, 200)
        assert read_without == (401 if protect_reads else 200)
        assert healthz == 200 and readyz in (200, 503)
        assert TOKEN not in status_text
        server = json.loads(status_text)["data"]["server"]
        assert (server["auth"], server["tls"], server["protect_reads"]) == ("bearer", False, protect_reads)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a self-signed certificate (cryptography is not installed)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


async def test_tls_serves_https_with_the_configured_certificate(tmp_path: Path) -> None:
    """server.tls serves HTTPS a client that trusts the certificate can verify; plain HTTP gets no answer."""
    cert, key = _self_signed(tmp_path)
    agent = _agent(tmp_path, {"tls": {"cert_file": str(cert), "key_file": str(key)}})
    await agent.start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{agent.port}/healthz", ssl=ctx) as r:
                assert (r.status, await r.text()) == (200, "ok\n")
            async with http.get(f"https://127.0.0.1:{agent.port}/api/v1/status", ssl=ctx) as r:
                assert (await r.json())["data"]["server"]["tls"] is True
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{agent.port}/healthz",
                                    timeout=aiohttp.ClientTimeout(total=10)) as r:
                    await r.read()
    finally:
        await agent.stop()


def test_exposure_warnings() -> None:
    """Beyond loopback without a token warns; with a token but no TLS warns about clear text; loopback is quiet."""
    assert ServerConfig(listen="127.0.0.1:9400").warnings() == []
    assert ServerConfig(listen="[::1]:9400").warnings() == []
    assert ServerConfig(listen="localhost:9400").warnings() == []
    [open_warning] = ServerConfig(listen="0.0.0.0:9400").warnings()
    assert "without authentication" in open_warning
    tok = ServerConfig.model_validate({"listen": ":9400", "auth": {"bearer_token_env": "T"}},
                                      context={"environ": {"T": "x"}})
    [clear] = tok.warnings()
    assert "clear text" in clear


_RAISE = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))
from agent.app.connections import raise_open_file_limit
print(json.dumps([raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def test_open_file_limit_raised_to_the_hard_limit() -> None:
    """As a Go program does at start: a soft limit of 256 under a hard one of 512 becomes 512."""
    out = subprocess.run([sys.executable, "-c", _RAISE], capture_output=True, text=True, check=True,
                         cwd=REPO, timeout=60)
    assert json.loads(out.stdout) == [[256, 512], [512, 512]]


def test_descriptor_warning_counts_a_connection_per_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With scrape.concurrency 0 every target holds a connection: 700 targets under a limit of 1,024 are
    too many beside the endpoint's 256 + 128 + 64; a cap of 64 fits, and the warning names the way out."""
    from agent.app import daemon

    monkeypatch.setattr(daemon.resource, "getrlimit", lambda _: (1024, 1024))
    targets = [{"url": f"http://127.0.0.1:{9000 + i}/metrics"} for i in range(700)]

    def warnings(concurrency: int) -> list[str]:
        agent = Agent(Config.model_validate({
            "targets": targets, "scrape": {"concurrency": concurrency}, "nvml": {"enabled": False},
            "state": {"path": str(tmp_path / f"s{concurrency}.db")}}))
        return [w for w in agent.server_warnings() if "file descriptors" in w]

    [short] = warnings(0)
    assert "one per target with scrape.concurrency 0 (700)" in short and "= 1148 file descriptors" in short
    [pools] = warnings(300)  # two pools of 300 (failing targets have their own): 256 + 128 + 600 + 64
    assert "600 scraping (scrape.concurrency 300" in pools and "= 1048 file descriptors" in pools
    assert "set scrape.concurrency" in short
    assert warnings(64) == []


async def test_stalled_bodies_make_room_for_new_connections(tmp_path: Path) -> None:
    """At max_connections, connections whose POST body never comes are closed (oldest first) for newer ones."""
    agent = _agent(tmp_path, {"max_connections": 8})
    await agent.start()
    streams = []
    try:
        for _ in range(8):
            reader, writer = await asyncio.open_connection("127.0.0.1", agent.port)
            writer.write(b"POST /api/v1/silences HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n")
            await writer.drain()
            streams.append((reader, writer))

        async def all_waiting_for_bodies() -> bool | None:
            return True if agent.http_guard.states().get("body") == 8 else None

        await eventually(all_waiting_for_bodies, what="8 handlers waiting for their bodies")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{agent.port}/healthz",
                                                             timeout=aiohttp.ClientTimeout(total=5)) as r:
            assert r.status == 200
        oldest = await asyncio.wait_for(streams[0][0].read(), timeout=10)  # closed: EOF
        assert b"500" not in oldest
        assert agent.http_guard.closed["evicted"] >= 1
        assert agent.http_guard.open <= 8
    finally:
        for _, writer in streams:
            writer.close()
        await agent.stop()
