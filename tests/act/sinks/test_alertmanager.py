"""Alertmanager sink: Prometheus' API v2 payload, checked against a real Alertmanager 0.25."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from agent.act.notification import AlertSnapshot, Notification
from agent.act.sinks.alertmanager import AlertmanagerSink, alerts_v2_payload, format_rfc3339_ms
from agent.config import AlertmanagerReceiverConfig
from agent.errors import DeliveryError
from tests import alertmanager as am_helper
from tests.alertmanager import Alertmanager
from tests.receivers import RecordingServer, reply

alertmanager = am_helper.alertmanager  # fixtures, bound here so pytest finds them
alertmanager_factory = am_helper.alertmanager_factory

T0_MS = 1_795_977_602_123  # 2026-11-29T18:40:02.123Z (date -u -d @1795977602)


def _snap(instance: str, status: str = "firing", *, starts_at_ms: int = T0_MS, ends_at_ms: int = 0,
          **labels: str) -> AlertSnapshot:
    return AlertSnapshot(
        labels={"alertname": "VLLMKVCacheSaturated", "severity": "warning", "instance": instance, **labels},
        annotations={"summary": "KV cache is nearly full.", "description": f"KV cache on {instance} at 97%"},
        status=status,  # type: ignore[arg-type]
        starts_at_ms=starts_at_ms, ends_at_ms=ends_at_ms, value=0.97,
        generator_url=f"http://agent:9400/graph?g0.expr=kv&instance={instance}",
    )


def _notification(alerts: list[AlertSnapshot], *, kind: str = "alerts", key: str = "k1") -> Notification:
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    return Notification(key=key, receiver="am", kind=kind, created_ms=T0_MS,  # type: ignore[arg-type]
                        group_key='{}:{alertname="VLLMKVCacheSaturated"}',
                        group_labels={"alertname": "VLLMKVCacheSaturated"}, status=status,  # type: ignore[arg-type]
                        alerts=tuple(alerts),
                        finding={"kind": "gpu-oom-runtime", "summary": "x"} if kind == "finding" else None,
                        scale={"service": "llama", "from_replicas": 2, "to_replicas": 3}
                        if kind == "scale" else None)


def _labels_of(alerts: list[dict[str, Any]]) -> list[dict[str, str]]:
    return sorted((a["labels"] for a in alerts), key=lambda d: sorted(d.items()))


# --- pure payload tests -------------------------------------------------------------------------

def test_format_rfc3339_ms_always_three_fraction_digits() -> None:
    """Times are RFC 3339 UTC with exactly three fraction digits and a Z, as Prometheus sends them."""
    assert format_rfc3339_ms(T0_MS) == "2026-11-29T18:40:02.123Z"
    assert format_rfc3339_ms(1_795_977_602_000) == "2026-11-29T18:40:02.000Z"
    assert format_rfc3339_ms(1_795_977_602_005) == "2026-11-29T18:40:02.005Z"
    assert format_rfc3339_ms(0) == "1970-01-01T00:00:00.000Z"


def test_payload_uses_snapshot_times_and_keys() -> None:
    """A snapshot's startsAt/endsAt are used as given, with labels, annotations and generatorURL."""
    a = _snap("gpu-a:8000", ends_at_ms=T0_MS + 240_000)
    assert alerts_v2_payload([a], now_ms=T0_MS + 5) == [{
        "labels": {"alertname": "VLLMKVCacheSaturated", "severity": "warning", "instance": "gpu-a:8000"},
        "annotations": {"summary": "KV cache is nearly full.", "description": "KV cache on gpu-a:8000 at 97%"},
        "startsAt": "2026-11-29T18:40:02.123Z",
        "endsAt": "2026-11-29T18:44:02.123Z",
        "generatorURL": "http://agent:9400/graph?g0.expr=kv&instance=gpu-a:8000",
    }]


def test_payload_fallback_ends_at() -> None:
    """Without an end: firing gets now + 4 × resend delay, resolved gets now, no clock leaves it out."""
    now = 1_795_977_660_000  # 18:41:00.000Z
    firing, resolved = _snap("a"), _snap("b", "resolved")
    out = alerts_v2_payload([firing, resolved], now_ms=now, resend_delay_s=60)
    assert out[0]["endsAt"] == "2026-11-29T18:45:00.000Z"  # 18:41:00 + 4 × 60 s
    assert out[1]["endsAt"] == "2026-11-29T18:41:00.000Z"
    assert "endsAt" not in alerts_v2_payload([firing])[0]


def test_payload_omits_empty_generator_url_and_zero_start() -> None:
    """An empty generatorURL and a zero startsAt are left for Alertmanager to fill in."""
    a = AlertSnapshot(labels={"alertname": "X"}, annotations={}, status="firing", starts_at_ms=0)
    assert alerts_v2_payload([a]) == [{"labels": {"alertname": "X"}, "annotations": {}}]


# --- HTTP behaviour against a local receiver ----------------------------------------------------

async def test_posts_v2_json_and_skips_other_kinds() -> None:
    """Alerts go to POST /api/v2/alerts as JSON; findings and scale requests are not sent."""
    async with RecordingServer() as rec, aiohttp.ClientSession() as session:
        cfg = AlertmanagerReceiverConfig(urls=[rec.url("/prefix/")])
        sink = AlertmanagerSink("am", rec.url("/prefix/"), cfg, session, clock=lambda: T0_MS / 1000)
        assert await sink.send(_notification([_snap("a")], kind="finding")) is None
        assert await sink.send(_notification([], kind="scale")) is None
        assert rec.requests == []
        assert await sink.send(_notification([_snap("a")])) is None
        (req,) = rec.requests
        assert (req.method, req.path) == ("POST", "/prefix/api/v2/alerts")
        assert req.headers["Content-Type"] == "application/json"
        assert req.json()[0]["endsAt"] == "2026-11-29T18:44:02.123Z"  # clock + 4 × 60 s default


@pytest.mark.parametrize(("status", "headers", "permanent", "retry_after"), [
    (503, {}, False, None),
    (429, {"Retry-After": "12"}, False, 12.0),
    (404, {}, True, None),
])
async def test_status_policy(status: int, headers: dict[str, str], permanent: bool, retry_after: float | None
                             ) -> None:
    """5xx and 429 are retryable (Retry-After honoured); other 4xx are permanent and carry the reply text."""
    answer = reply(status, text="the reason", headers=headers)
    async with RecordingServer(responder=answer) as rec, aiohttp.ClientSession() as session:
        sink = AlertmanagerSink("am", rec.url(""), AlertmanagerReceiverConfig(urls=[rec.url("")]), session)
        with pytest.raises(DeliveryError) as err:
            await sink.send(_notification([_snap("a")]))
    assert err.value.permanent is permanent
    assert err.value.retry_after_s == retry_after
    assert "the reason" in str(err.value)


# --- a real Alertmanager -------------------------------------------------------------------------

def _sink(am: Alertmanager, session: aiohttp.ClientSession, name: str = "am") -> AlertmanagerSink:
    return AlertmanagerSink(name, am.url, AlertmanagerReceiverConfig(urls=[am.url]), session)


def _live(instance: str, now_ms: int) -> AlertSnapshot:
    """A firing alert as the dispatcher hands it over: started a minute ago, valid for 4 minutes."""
    return _snap(instance, starts_at_ms=now_ms - 60_000, ends_at_ms=now_ms + 240_000)


def _firing(p: dict[str, Any]) -> bool:
    return bool(p["status"] == "firing")


async def test_real_alertmanager_accepts_firing_batch(alertmanager: Alertmanager) -> None:
    """A firing batch shows up in GET /api/v2/alerts unchanged and AM's webhook receives it as firing."""
    now = round(time.time() * 1000)
    alerts = [_live("gpu-a:8000", now), _live("gpu-b:8000", now)]
    async with aiohttp.ClientSession() as session:
        await _sink(alertmanager, session).send(_notification(alerts))
    want = _labels_of([{"labels": a.labels} for a in alerts])

    async def both_held() -> list[dict[str, Any]] | None:  # a loaded Alertmanager lists them a moment later
        listed = await alertmanager.alerts()
        return listed if _labels_of(listed) == want else None

    held = await am_helper.eventually(both_held, what="both alerts listed by Alertmanager")
    assert _labels_of(held) == want
    by_instance = {a["labels"]["instance"]: a for a in held}
    for sent in alerts:
        got = by_instance[sent.labels["instance"]]
        assert got["annotations"] == sent.annotations
        assert got["startsAt"] == format_rfc3339_ms(sent.starts_at_ms)
        assert got["generatorURL"] == sent.generator_url
        assert got["status"]["state"] == "active"
    # Both as firing: in one notification, or, when a loaded Alertmanager's dispatcher took the second
    # alert in after group_wait had run out, the first alone and then the group
    async def both_notified() -> list[dict[str, Any]] | None:
        hooks = [p for p in alertmanager.webhooks() if _firing(p)]
        notified = {tuple(sorted(a["labels"].items())) for p in hooks for a in p["alerts"]}
        return hooks if notified == {tuple(sorted(w.items())) for w in want} else None

    hooks = await am_helper.eventually(both_notified, what="both alerts notified as firing")
    assert {p["receiver"] for p in hooks} == {am_helper.RECEIVER}


async def test_real_alertmanager_resolves(alertmanager: Alertmanager) -> None:
    """The same alerts re-sent with endsAt = now make AM's webhook send a resolved notification."""
    now = round(time.time() * 1000)
    firing = [_live("gpu-a:8000", now), _live("gpu-b:8000", now)]
    async with aiohttp.ClientSession() as session:
        sink = _sink(alertmanager, session)
        await sink.send(_notification(firing))
        await alertmanager.wait_webhook(_firing, what="a firing notification")
        end = round(time.time() * 1000)
        resolved = [_snap(a.labels["instance"], "resolved", starts_at_ms=a.starts_at_ms, ends_at_ms=end)
                    for a in firing]
        await sink.send(_notification(resolved))
    hook = await alertmanager.wait_webhook(lambda p: p["status"] == "resolved", what="a resolved notification")
    assert {a["status"] for a in hook["alerts"]} == {"resolved"}
    assert _labels_of(hook["alerts"]) == _labels_of([{"labels": a.labels} for a in resolved])
    assert [datetime.fromisoformat(a["endsAt"]) for a in hook["alerts"]] == [
        datetime.fromtimestamp(end / 1000, tz=UTC)] * 2
    assert await alertmanager.alerts() == []  # resolved alerts are no longer active


async def test_ha_pair_both_receive(alertmanager_factory: Callable[..., Awaitable[Alertmanager]]) -> None:
    """With two Alertmanagers (one sink each), both hold the alert and both notify."""
    am1, am2 = await alertmanager_factory(), await alertmanager_factory()
    now = round(time.time() * 1000)
    note = _notification([_live("gpu-a:8000", now)])
    async with aiohttp.ClientSession() as session:
        for i, am in enumerate((am1, am2)):
            await _sink(am, session, f"am{i}").send(note)
    for am in (am1, am2):
        assert [a["labels"]["instance"] for a in await am.alerts()] == ["gpu-a:8000"]
        await am.wait_webhook(_firing, what=f"a firing notification from {am.url}")


async def test_stopped_alertmanager_is_retryable(alertmanager_factory: Callable[..., Awaitable[Alertmanager]]
                                                 ) -> None:
    """A stopped Alertmanager gives a retryable DeliveryError while its HA peer still accepts."""
    up, down = await alertmanager_factory(), await alertmanager_factory()
    await down.stop()
    note = _notification([_live("gpu-a:8000", round(time.time() * 1000))])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DeliveryError) as err:
            await _sink(down, session, "down").send(note)
        assert err.value.permanent is False
        assert down.url in str(err.value)
        await _sink(up, session, "up").send(note)
    assert len(await up.alerts()) == 1


@pytest.mark.parametrize(("labels", "am_says"), [
    ({}, "at least one label pair required"),
    ({"bad-name": "x"}, 'invalid label set: invalid name "bad-name"'),
])
async def test_rejected_payload_is_permanent(alertmanager: Alertmanager, labels: dict[str, str], am_says: str
                                             ) -> None:
    """A payload Alertmanager 0.25 rejects (no labels, invalid label name) is a permanent error with AM's text."""
    now = round(time.time() * 1000)
    bad = AlertSnapshot(labels=labels, annotations={}, status="firing", starts_at_ms=now, ends_at_ms=now + 60_000)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DeliveryError) as err:
            await _sink(alertmanager, session).send(_notification([bad]))
    assert err.value.permanent is True
    assert "HTTP 400" in str(err.value)
    assert am_says in str(err.value)
