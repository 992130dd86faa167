"""The scale sink against the real simulator's control port and small local receivers (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.act.notification import AlertSnapshot, Notification
from agent.act.scaling import Scaler
from agent.act.sinks.scale import ScaleSink, parse_retry_after
from agent.act.state import StateDB
from agent.config import ScaleWebhookConfig, ScalingConfig, ScalingServiceConfig
from agent.errors import DeliveryError
from agent.simulate.server import Fleet, FleetConfig
from tests.receivers import RecordingServer, free_port, reply

NOW_S = 1_700_000_000  # the sink's injected clock


def scale_notification(replicas: int, key: str = "scale:vllm:out:2->3:1700000000000") -> Notification:
    payload = {"service": "vllm", "direction": "out", "from_replicas": replicas - 1, "to_replicas": replicas,
               "replicas": replicas, "step": 1, "reason": "VLLMScaleOutNeeded firing", "idempotency_key": key,
               "dry_run": False}
    return Notification(key=key, receiver="scale:vllm", kind="scale", created_ms=NOW_S * 1000, scale=payload)


def webhook(url: str, **kw: Any) -> ScaleWebhookConfig:
    return ScaleWebhookConfig.model_validate({"url": url, **kw})


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One shared client session, as the daemon passes to every sink."""
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def receiver() -> AsyncIterator[RecordingServer]:
    """A recording receiver on 127.0.0.1; each test sets its answer."""
    async with RecordingServer() as rec:
        yield rec


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    """The real simulator: 2 vLLM replicas, no LMDeploy, every port picked free on 127.0.0.1."""
    f = Fleet(FleetConfig(replicas=2, lmdeploy_replicas=0, base_port=0))
    await f.start()
    yield f
    await f.stop()


async def test_scale_out_moves_the_simulated_fleet_from_2_to_3(fleet: Fleet, session: aiohttp.ClientSession) -> None:
    """A scale request with replicas=3 grows the simulator to 3 replicas and returns its reply."""
    assert len(fleet.targets) == 2
    sink = ScaleSink("scale:vllm", webhook(fleet.control_url + "/scale"), session, clock=lambda: NOW_S)
    reply = await sink.send(scale_notification(3))
    assert reply is not None
    assert reply["replicas"] == 3 and reply["applied"] is True
    assert len(fleet.targets) == 3 and reply["targets"] == fleet.targets


async def test_same_idempotency_key_does_not_scale_again(fleet: Fleet, session: aiohttp.ClientSession) -> None:
    """Re-sending a request with the same key (a retry after a crash) is answered applied=false."""
    sink = ScaleSink("scale:vllm", webhook(fleet.control_url + "/scale"), session)
    first = await sink.send(scale_notification(3))
    await fleet.scale_to(2)  # someone else scales back in meanwhile
    retry = await sink.send(scale_notification(3), attempt=1)
    assert first is not None and retry is not None
    assert first["applied"] is True and retry["applied"] is False
    assert len(fleet.targets) == 2


async def test_scaler_request_round_trip_through_the_simulator(
    fleet: Fleet, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A Scaler's queued request, delivered to the simulator, scales it; the ack sets the replicas."""
    svc = ScalingServiceConfig.model_validate({"name": "vllm", "webhook": {"url": fleet.control_url + "/scale"}})
    db = StateDB(tmp_path / "state.db")
    scaler = Scaler(ScalingConfig(services=[svc]), db, started_ms=0)
    a = AlertSnapshot(labels={"alertname": "VLLMScaleOutNeeded"}, annotations={}, status="firing",
                      starts_at_ms=NOW_S * 1000)
    decision = scaler.decide("out", a, service=None, now_ms=NOW_S * 1000)
    [item] = db.outbox.pending()
    sink = ScaleSink("scale:vllm", svc.webhook, session)  # type: ignore[arg-type]
    reply = await sink.send(item.notification())
    scaler.on_ack(item.notification(), reply)
    assert (decision.from_replicas, decision.to_replicas) == (2, 3)
    assert len(fleet.targets) == 3
    assert db.cooldowns.get("vllm").replicas == 3  # type: ignore[union-attr]
    db.close()


def reference_verify(secret: bytes, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver in any language does: HMAC-SHA256 over "<timestamp>.<raw body>", hex, "v1=" prefix."""
    expected = "v1=" + hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


async def test_signed_request_verifies_with_a_reference_hmac(
    receiver: RecordingServer, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """With a secret, the exact body bytes are signed with the timestamp; the Idempotency-Key header is set."""
    receiver.responder = reply(json_body={"replicas": 3})
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cr3t\n")
    sink = ScaleSink("scale:vllm", webhook(receiver.url("/scale"), secret_file=str(secret_file)), session,
                     clock=lambda: NOW_S + 0.7)
    n = scale_notification(3)
    assert await sink.send(n) == {"replicas": 3}
    [request] = receiver.requests
    headers, body = request.headers, request.body
    assert headers["X-SRE-Agent-Timestamp"] == str(NOW_S)
    assert reference_verify(b"s3cr3t", headers["X-SRE-Agent-Timestamp"], body, headers["X-SRE-Agent-Signature"])
    assert not reference_verify(b"other", headers["X-SRE-Agent-Timestamp"], body, headers["X-SRE-Agent-Signature"])
    assert headers["Idempotency-Key"] == n.key
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == n.scale


async def test_unsigned_without_a_secret(receiver: RecordingServer, session: aiohttp.ClientSession) -> None:
    """Without a secret no signature headers are sent; an empty 2xx reply returns None."""
    receiver.responder = reply(204)
    sink = ScaleSink("scale:vllm", webhook(receiver.url("/scale")), session)
    assert await sink.send(scale_notification(3)) is None
    headers = receiver.requests[0].headers
    assert "X-SRE-Agent-Signature" not in headers and "X-SRE-Agent-Timestamp" not in headers


async def test_simulator_400_is_permanent(fleet: Fleet, session: aiohttp.ClientSession) -> None:
    """replicas=-1 is rejected by the simulator with 400: a permanent failure naming the status."""
    sink = ScaleSink("scale:vllm", webhook(fleet.control_url + "/scale"), session)
    with pytest.raises(DeliveryError) as info:
        await sink.send(scale_notification(-1, key="bad"))
    assert info.value.permanent
    assert "HTTP 400" in str(info.value) and "replicas must be within" in str(info.value)
    assert len(fleet.targets) == 2


async def test_connection_refused_is_retryable(session: aiohttp.ClientSession) -> None:
    """A receiver that is not listening gives a retryable error with the cause chained."""
    sink = ScaleSink("scale:vllm", webhook(f"http://127.0.0.1:{free_port()}/scale"), session)
    with pytest.raises(DeliveryError) as info:
        await sink.send(scale_notification(3))
    assert not info.value.permanent
    assert isinstance(info.value.__cause__, aiohttp.ClientConnectionError)


@pytest.mark.parametrize(("status", "retry_after", "expected_after"), [
    (429, "7", 7.0),
    (503, "Tue, 14 Nov 2023 22:14:00 GMT", 40.0),  # NOW_S is 22:13:20 GMT
    (500, None, None),
])
async def test_429_and_5xx_are_retryable_with_retry_after(
    receiver: RecordingServer, session: aiohttp.ClientSession,
    status: int, retry_after: str | None, expected_after: float | None,
) -> None:
    """429 and 5xx are retried, after the receiver's Retry-After (seconds or an HTTP date) when given."""
    receiver.responder = reply(status, text="busy", headers={"Retry-After": retry_after} if retry_after else {})
    sink = ScaleSink("scale:vllm", webhook(receiver.url("/scale")), session, clock=lambda: NOW_S)
    with pytest.raises(DeliveryError) as info:
        await sink.send(scale_notification(3))
    assert not info.value.permanent
    assert info.value.retry_after_s == expected_after
    assert f"HTTP {status}: busy" in str(info.value)


@pytest.mark.parametrize("status", [401, 404, 422, 301])
async def test_other_4xx_and_redirects_are_permanent(
    receiver: RecordingServer, session: aiohttp.ClientSession, status: int
) -> None:
    """A 4xx other than 429 (and a redirect, which is not followed) cannot be fixed by retrying."""
    receiver.responder = reply(status, headers={"Location": "/elsewhere"} if status == 301 else {})
    sink = ScaleSink("scale:vllm", webhook(receiver.url("/scale")), session)
    with pytest.raises(DeliveryError) as info:
        await sink.send(scale_notification(3))
    assert info.value.permanent
    assert [r.method for r in receiver.requests] == ["POST"]


async def test_timeout_is_retryable(receiver: RecordingServer, session: aiohttp.ClientSession) -> None:
    """A receiver that does not answer within the timeout gives a retryable error."""
    release = asyncio.Event()

    async def hang(request: web.Request, body: bytes) -> web.Response:
        await release.wait()
        return web.Response(status=200)

    receiver.responder = hang
    sink = ScaleSink("scale:vllm", webhook(receiver.url("/scale"), timeout="100ms"), session)
    try:
        with pytest.raises(DeliveryError) as info:
            await sink.send(scale_notification(3))
    finally:
        release.set()
    assert not info.value.permanent and "no answer within 0.1s" in str(info.value)


async def test_other_kinds_are_not_sent(session: aiohttp.ClientSession) -> None:
    """Only scale notifications are delivered; anything else returns None without a request."""
    sink = ScaleSink("scale:vllm", webhook("http://127.0.0.1:9/unused"), session)
    n = Notification(key="k", receiver="scale:vllm", kind="alerts", created_ms=0)
    assert await sink.send(n) is None
    await sink.close()
    assert not session.closed  # the session is the caller's


def test_parse_retry_after() -> None:
    """Retry-After is delay seconds or an HTTP date; a past date is 0 and garbage is ignored."""
    assert parse_retry_after("120", now=NOW_S) == 120.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now=NOW_S) == 30.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now=NOW_S) == 0.0
    assert parse_retry_after("soon", now=NOW_S) is None
    assert parse_retry_after(None, now=NOW_S) is None


@pytest.fixture
def self_signed(tmp_path: Path) -> ssl.SSLContext:
    """A server TLS context with a self-signed certificate for 127.0.0.1 (made by the openssl tool)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


async def test_tls_verification_follows_config(self_signed: ssl.SSLContext, session: aiohttp.ClientSession) -> None:
    """A self-signed receiver is refused with verify_tls on (retryable) and accepted with it off."""
    async with RecordingServer(responder=reply(json_body={"replicas": 3}), ssl_context=self_signed) as rec:
        url = rec.url("/scale")
        with pytest.raises(DeliveryError) as info:
            await ScaleSink("s", webhook(url), session).send(scale_notification(3))
        assert not info.value.permanent
        assert isinstance(info.value.__cause__, aiohttp.ClientConnectorCertificateError)
        assert await ScaleSink("s", webhook(url, verify_tls=False), session).send(scale_notification(3)) == {
            "replicas": 3}
