"""Webhook sink: Alertmanager-compatible JSON, HMAC signatures, status policy, TLS, and a
differential check against what a real Alertmanager 0.25 posts to its own webhook."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.util
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

import agent
from agent.act.notification import AlertSnapshot, Notification
from agent.act.sinks.alertmanager import AlertmanagerSink
from agent.act.sinks.http import parse_retry_after
from agent.act.sinks.webhook import WebhookSink, format_go_time
from agent.config import AlertmanagerReceiverConfig, WebhookReceiverConfig
from agent.errors import DeliveryError
from tests import alertmanager as am_helper
from tests.alertmanager import Alertmanager
from tests.receivers import RecordingServer, reply

alertmanager = am_helper.alertmanager  # the fixture, bound here so pytest finds it

T0_MS = 1_795_977_602_123  # 2026-11-29T18:40:02.123Z (date -u -d @1795977602)
NOW_S = 1_795_977_660.0  # the sinks' clock in these tests: 18:41:00Z
SECRET = "correct horse battery staple"


def _snap(instance: str, status: str = "firing", *, ends_at_ms: int = 0, **extra: str) -> AlertSnapshot:
    return AlertSnapshot(
        labels={"alertname": "VLLMKVCacheSaturated", "severity": "warning", "instance": instance, **extra},
        annotations={"summary": "KV cache is nearly full.", "description": f"{instance} at 97%"},
        status=status, starts_at_ms=T0_MS, ends_at_ms=ends_at_ms,  # type: ignore[arg-type]
        generator_url="http://agent:9400/graph", value=0.97,
    )


def _note(alerts: list[AlertSnapshot], *, kind: str = "alerts", receiver: str = "hook", key: str = "idem-1",
          external_url: str = "http://agent:9400", finding: dict[str, Any] | None = None) -> Notification:
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    return Notification(key=key, receiver=receiver, kind=kind, created_ms=T0_MS,  # type: ignore[arg-type]
                        group_key="group-1", group_labels={"alertname": "VLLMKVCacheSaturated"},
                        status=status, alerts=tuple(alerts), external_url=external_url,  # type: ignore[arg-type]
                        finding=finding)


def _config(url: str, **extra: Any) -> WebhookReceiverConfig:
    return WebhookReceiverConfig.model_validate({"url": url, **extra})


async def _send(rec: RecordingServer, note: Notification, *, clock: float = NOW_S, **extra: Any
                ) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as session:
        sink = WebhookSink("hook", _config(rec.url(), **extra), session, clock=lambda: clock)
        return await sink.send(note)


def reference_verify(secret: bytes, headers: Mapping[str, str], body: bytes, *, now: float, max_age_s: float = 300
                     ) -> bool:
    """How a receiver checks our signature, written from the documented scheme, not from agent.act.sinks.signing."""
    timestamp = headers.get("X-SRE-Agent-Timestamp")
    signature = headers.get("X-SRE-Agent-Signature")
    if timestamp is None or signature is None or not timestamp.isdigit():
        return False
    if abs(now - int(timestamp)) > max_age_s:
        return False
    expected = "v1=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


# --- payload ---------------------------------------------------------------------------------------

def test_go_time_format() -> None:
    """Times look like Go's JSON time: UTC, fraction without trailing zeros; zero is Go's zero time."""
    assert format_go_time(T0_MS) == "2026-11-29T18:40:02.123Z"
    assert format_go_time(1_795_977_602_120) == "2026-11-29T18:40:02.12Z"
    assert format_go_time(1_795_977_602_000) == "2026-11-29T18:40:02Z"
    assert format_go_time(0) == "0001-01-01T00:00:00Z"


def test_retry_after_forms() -> None:
    """Retry-After is read as delay seconds or as an HTTP date; garbage is ignored."""
    assert parse_retry_after("7", now=0) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1_445_412_480 - 30) == 30.0
    assert parse_retry_after("soon", now=0) is None
    assert parse_retry_after(None, now=0) is None
    assert parse_retry_after("inf", now=0) is None and parse_retry_after("nan", now=0) is None  # not a delay


async def test_alert_payload_shape() -> None:
    """An alert group is posted as Alertmanager's version-4 message; firing endsAt is Go's zero time."""
    async with RecordingServer() as rec:
        await _send(rec, _note([_snap("a"), _snap("b", "resolved", ends_at_ms=T0_MS + 30_000)]))
    assert rec.requests[0].json() == {
        "version": "4",
        "groupKey": "group-1",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "hook",
        "groupLabels": {"alertname": "VLLMKVCacheSaturated"},
        "commonLabels": {"alertname": "VLLMKVCacheSaturated", "severity": "warning"},
        "commonAnnotations": {"summary": "KV cache is nearly full."},
        "externalURL": "http://agent:9400",
        "alerts": [
            {"status": "firing", "labels": {"alertname": "VLLMKVCacheSaturated", "severity": "warning",
                                            "instance": "a"},
             "annotations": {"summary": "KV cache is nearly full.", "description": "a at 97%"},
             "startsAt": "2026-11-29T18:40:02.123Z", "endsAt": "0001-01-01T00:00:00Z",
             "generatorURL": "http://agent:9400/graph", "fingerprint": _snap("a").fingerprint},
            {"status": "resolved", "labels": {"alertname": "VLLMKVCacheSaturated", "severity": "warning",
                                              "instance": "b"},
             "annotations": {"summary": "KV cache is nearly full.", "description": "b at 97%"},
             "startsAt": "2026-11-29T18:40:02.123Z", "endsAt": "2026-11-29T18:40:32.123Z",
             "generatorURL": "http://agent:9400/graph", "fingerprint": _snap("b").fingerprint},
        ],
    }


async def test_max_alerts_truncates() -> None:
    """max_alerts keeps the first n alerts, counts the rest in truncatedAlerts, and computes common labels
    and status over the alerts sent (as Alertmanager does)."""
    alerts = [_snap("a", "resolved", ends_at_ms=T0_MS + 1000, zone="x"), _snap("b", "resolved", zone="x"),
              _snap("c", zone="y")]
    async with RecordingServer() as rec:
        await _send(rec, _note(alerts), max_alerts=2)
    body = rec.requests[0].json()
    assert [a["labels"]["instance"] for a in body["alerts"]] == ["a", "b"]
    assert body["truncatedAlerts"] == 1
    assert body["status"] == "resolved"
    assert body["commonLabels"] == {"alertname": "VLLMKVCacheSaturated", "severity": "warning", "zone": "x"}


async def test_finding_payload_and_no_scale() -> None:
    """A finding is posted under "finding"; a scale request is not a webhook's business."""
    finding = {"kind": "gpu-oom-runtime", "summary": "CUDA OOM", "setting": "--max-model-len"}
    async with RecordingServer() as rec:
        await _send(rec, _note([], kind="finding", finding=finding))
        assert await _send(rec, _note([], kind="scale")) is None
    (req,) = rec.requests
    assert req.json() == {"version": "4", "kind": "finding", "groupKey": "group-1", "finding": finding}


async def test_awkward_label_values_round_trip() -> None:
    """Label values with quotes, newlines, unicode and <script> arrive byte-for-byte as sent."""
    values = {"q": 'say "hi" \\ bye', "nl": "line1\nline2\r\n\t", "uni": "GPU 温度 🔥 ü",
              "html": "<script>x&y</script>"}
    alert = AlertSnapshot(labels={"alertname": "X", **values}, annotations={"description": values["html"]},
                          status="firing", starts_at_ms=T0_MS)
    async with RecordingServer() as rec:
        await _send(rec, _note([alert]))
    got = rec.requests[0].json()["alerts"][0]
    assert got["labels"] == {"alertname": "X", **values}
    assert got["annotations"] == {"description": "<script>x&y</script>"}


# --- headers and signatures ---------------------------------------------------------------------------

async def test_signed_request_verifies(tmp_path: Path) -> None:
    """With secret_file, the request carries a signature a reference verifier accepts, plus the other headers."""
    secret_path = tmp_path / "webhook-secret"
    secret_path.write_text(SECRET + "\n")
    async with RecordingServer() as rec:
        await _send(rec, _note([_snap("a")]), secret_file=str(secret_path))
    req = rec.requests[0]
    secret = secret_path.read_text().strip().encode()
    assert reference_verify(secret, req.headers, req.body, now=NOW_S)
    assert req.headers["X-SRE-Agent-Timestamp"] == "1795977660"
    assert req.headers["Idempotency-Key"] == "idem-1"
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["User-Agent"] == f"sre-agent/{agent.__version__}"


async def test_tampered_or_stale_request_rejected(tmp_path: Path) -> None:
    """The reference verifier rejects a changed body, a wrong secret and a request older than 5 minutes."""
    secret_path = tmp_path / "webhook-secret"
    secret_path.write_text(SECRET)
    async with RecordingServer() as rec:
        await _send(rec, _note([_snap("a")]), secret_file=str(secret_path))
    req = rec.requests[0]
    secret = SECRET.encode()
    tampered = req.body.replace(b'"firing"', b'"resolved"', 1)
    assert tampered != req.body
    assert not reference_verify(secret, req.headers, tampered, now=NOW_S)
    assert not reference_verify(b"another secret", req.headers, req.body, now=NOW_S)
    assert not reference_verify(secret, req.headers, req.body, now=NOW_S + 301)


async def test_unsigned_without_secret() -> None:
    """Without a secret there are no signature headers, and the idempotency key is still sent."""
    async with RecordingServer() as rec:
        await _send(rec, _note([_snap("a")], key="other-key"))
    headers = rec.requests[0].headers
    assert "X-SRE-Agent-Signature" not in headers
    assert "X-SRE-Agent-Timestamp" not in headers
    assert headers["Idempotency-Key"] == "other-key"


async def test_secret_and_body_not_logged(tmp_path: Path) -> None:
    """Neither the secret nor the body appears in log events."""
    secret_path = tmp_path / "webhook-secret"
    secret_path.write_text(SECRET)
    with structlog.testing.capture_logs() as logs:
        async with RecordingServer() as rec:
            await _send(rec, _note([_snap("a", marker="body-marker-77")]), secret_file=str(secret_path))
    assert rec.requests
    assert SECRET not in repr(logs)
    assert "body-marker-77" not in repr(logs)


# --- status policy -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "headers", "permanent", "retry_after"), [
    (500, {}, False, None),
    (502, {"Retry-After": "3"}, False, 3.0),
    (429, {"Retry-After": "20"}, False, 20.0),
    (400, {}, True, None),
    (401, {}, True, None),
    (302, {"Location": "http://elsewhere/"}, True, None),
])
async def test_status_policy(status: int, headers: dict[str, str], permanent: bool, retry_after: float | None
                             ) -> None:
    """2xx is delivery; 429/5xx are retryable with Retry-After; other statuses are permanent with the reason."""
    answer = reply(status, text='{"message": "nope: bad thing"}', headers=headers, content_type="application/json")
    async with RecordingServer(responder=answer) as rec:
        with pytest.raises(DeliveryError) as err:
            await _send(rec, _note([_snap("a")]))
    assert err.value.permanent is permanent
    assert err.value.retry_after_s == retry_after
    assert "nope: bad thing" in str(err.value)
    assert len(rec.requests) == 1  # one attempt, no redirect followed


async def test_json_reply_returned() -> None:
    """A receiver's JSON object reply is returned to the dispatcher."""
    async with RecordingServer(responder=reply(202, json_body={"id": "INC-42"})) as rec:
        assert await _send(rec, _note([_snap("a")])) == {"id": "INC-42"}


async def test_timeout_is_retryable() -> None:
    """A receiver that does not answer within the configured timeout gives a retryable error."""
    release = asyncio.Event()

    async def hang(request: web.Request, body: bytes) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    async with RecordingServer(responder=hang) as rec:
        try:
            with pytest.raises(DeliveryError) as err:
                await _send(rec, _note([_snap("a")]), timeout="300ms")
        finally:
            release.set()
    assert err.value.permanent is False
    assert "0.3s" in str(err.value)


async def test_connection_refused_is_retryable() -> None:
    """Nobody listening is a retryable error."""
    async with RecordingServer() as rec:
        url = rec.url()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DeliveryError) as err:
            await WebhookSink("hook", _config(url), session).send(_note([_snap("a")]))
    assert err.value.permanent is False


# --- TLS -----------------------------------------------------------------------------------------------

def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cryptography if installed, else the openssl CLI)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    if importlib.util.find_spec("cryptography") is not None:
        _self_signed_cryptography(cert, key)
        return cert, key
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("neither the cryptography package nor the openssl CLI is available to make a test certificate")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def _self_signed_cryptography(cert_path: Path, key_path: Path) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


async def test_tls_self_signed(tmp_path: Path) -> None:
    """An https receiver with a self-signed certificate fails with verify_tls on and works with it off (warned)."""
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with RecordingServer(ssl_context=context) as rec:
        assert rec.url().startswith("https://127.0.0.1:")
        with pytest.raises(DeliveryError) as err:
            await _send(rec, _note([_snap("a")]))
        assert err.value.permanent is False
        assert rec.requests == []
        with structlog.testing.capture_logs() as logs:
            await _send(rec, _note([_snap("a")]), verify_tls=False)
    assert len(rec.requests) == 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["webhook TLS verification disabled"]


# --- differential: our webhook vs Alertmanager's own ----------------------------------------------------

def _by_labels(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(alerts, key=lambda a: sorted(a["labels"].items()))


def assert_same_as_alertmanager(am: dict[str, Any], ours: dict[str, Any]) -> None:
    """The payloads agree on every key and value except the two documented identities."""
    assert set(ours) == set(am)
    for key in ("version", "status", "receiver", "groupLabels", "commonLabels", "commonAnnotations",
                "externalURL", "truncatedAlerts"):
        assert ours[key] == am[key], key
    assert isinstance(ours["groupKey"], str)
    assert ours["groupKey"]
    assert len(ours["alerts"]) == len(am["alerts"])
    for a, o in zip(_by_labels(am["alerts"]), _by_labels(ours["alerts"]), strict=True):
        assert set(o) == set(a)
        for key in ("status", "labels", "annotations", "startsAt", "endsAt", "generatorURL"):
            assert o[key] == a[key], key
        assert isinstance(o["fingerprint"], str)
        assert len(o["fingerprint"]) == 16


async def test_differential_against_real_alertmanager(alertmanager: Alertmanager) -> None:
    """For one alert group going firing → partly resolved → resolved, our webhook JSON matches the JSON
    Alertmanager 0.25 itself posts to a webhook receiver: same top-level and per-alert keys, same status,
    labels, annotations, commonLabels, commonAnnotations, groupLabels, externalURL, truncatedAlerts, and
    the same times (startsAt; endsAt = 0001-01-01T00:00:00Z while firing, the resolve time once resolved).

    Intended differences, not compared: ``groupKey`` (Alertmanager writes its route path and group labels,
    ``{}:{alertname="..."}``; we write the agent's group key) and ``fingerprint`` (Alertmanager: FNV-64a of the
    label set; ours: a SHA-256 prefix, also 16 hex digits). Alertmanager also sorts alerts by job/instance
    and escapes ``<>&`` as ``\\u003c``; JSON-equal either way, so alerts are compared by label set.
    """
    now = round(time.time() * 1000)
    current = {
        inst: AlertSnapshot(
            labels={"alertname": "VLLMQueueGrowing", "severity": "warning", "job": "vllm", "instance": inst},
            annotations={"summary": "Requests are queueing.", "description": f"queue on {inst} grows"},
            status="firing", starts_at_ms=now - 61_230, ends_at_ms=now + 240_000,
            generator_url=f"http://agent:9400/graph?instance={inst}")
        for inst in ("gpu-a:8000", "gpu-b:8000")
    }

    async with aiohttp.ClientSession() as session, RecordingServer() as ours_rec:
        am_sink = AlertmanagerSink("am", alertmanager.url, AlertmanagerReceiverConfig(urls=[alertmanager.url]),
                                   session)
        ours = WebhookSink(am_helper.RECEIVER, _config(ours_rec.url()), session)

        async def step(resolve: tuple[str, ...], wanted: Callable[[dict[str, Any]], bool]) -> None:
            end = round(time.time() * 1000)
            for inst in resolve:
                old = current[inst]
                current[inst] = AlertSnapshot(labels=old.labels, annotations=old.annotations, status="resolved",
                                              starts_at_ms=old.starts_at_ms, ends_at_ms=end,
                                              generator_url=old.generator_url)
            await am_sink.send(_note(list(current.values())))
            am_payload = await alertmanager.wait_webhook(wanted)
            in_payload = [current[a["labels"]["instance"]] for a in am_payload["alerts"]]
            note = Notification(key=f"k{len(ours_rec.requests)}", receiver=am_helper.RECEIVER, kind="alerts",
                                created_ms=end, group_key="g1", group_labels={"alertname": "VLLMQueueGrowing"},
                                status="firing" if any(a.status == "firing" for a in in_payload) else "resolved",
                                alerts=tuple(in_payload), external_url=alertmanager.url)
            await ours.send(note)
            assert_same_as_alertmanager(am_payload, ours_rec.requests[-1].json())

        def statuses(p: dict[str, Any]) -> list[str]:
            return sorted(a["status"] for a in p["alerts"])

        await step((), lambda p: statuses(p) == ["firing", "firing"])
        await step(("gpu-b:8000",), lambda p: "resolved" in statuses(p) and p["status"] == "firing")
        await step(("gpu-a:8000",), lambda p: p["status"] == "resolved")
    assert len(alertmanager.webhooks()) >= 3

