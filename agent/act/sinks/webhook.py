"""Generic webhooks: Alertmanager's version-4 webhook JSON, optionally HMAC-signed.

Anything that accepts Alertmanager's ``webhook_config`` posts (incident tools, chat
bridges, in-house receivers) accepts this sink's alert payloads unchanged: the same
top-level and per-alert keys, ``status``/``commonLabels``/``groupLabels`` computed the
way Alertmanager computes them, ``endsAt`` = ``0001-01-01T00:00:00Z`` while an alert
fires, and ``max_alerts`` truncation reported in ``truncatedAlerts``. Two things
differ on purpose: ``groupKey`` is the agent's group key (Alertmanager writes its
route path there) and ``fingerprint`` is the agent's stable hash (Alertmanager's is
FNV-64a over the label set); both are only identities, never parsed by receivers.

Findings go out as ``{"version": "4", "kind": "finding", "groupKey", "finding"}``;
scale requests have their own signed webhook and are not sent here.

The HTTP delivery policy (one POST, no redirects, errors classified) is
:mod:`agent.act.sinks.http`, shared with the Alertmanager, Slack and scale sinks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

from agent.act.notification import AlertSnapshot, Notification
from agent.act.sinks.http import encode_json, post_json, user_agent
from agent.act.sinks.signing import signature_headers
from agent.config import WebhookReceiverConfig

__all__ = ["GO_ZERO_TIME", "WebhookSink", "format_go_time", "webhook_payload"]

log = structlog.get_logger(__name__)

GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's time.Time{} in JSON: Alertmanager's endsAt while firing
WEBHOOK_VERSION = "4"  # Alertmanager's webhook payload version since 0.11


def format_go_time(ms: int) -> str:
    """Unix ms -> Go's ``time.Time`` JSON form in UTC (RFC 3339, fraction without trailing zeros).

    ``0`` is Go's zero time, which Alertmanager writes for an ``endsAt`` not reached yet. A time past
    year 9999 is a ValueError (the outbox fails such a notification at once: it can never be sent).
    """
    if ms <= 0:
        return GO_ZERO_TIME
    secs, frac = divmod(ms, 1000)
    try:
        text = datetime.fromtimestamp(secs, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError) as exc:  # past year 9999: Go's encoder refuses it too
        raise ValueError(f"{ms} ms is past the years RFC 3339 can write") from exc
    if frac:
        text += "." + f"{frac:03d}".rstrip("0")
    return text + "Z"


def webhook_payload(notification: Notification, *, max_alerts: int = 0) -> dict[str, Any]:
    """Alertmanager's version-4 webhook message for one alert group.

    Like Alertmanager, the alerts are truncated first (``max_alerts`` > 0) and
    ``status``, ``commonLabels`` and ``commonAnnotations`` describe the alerts sent.
    """
    alerts = notification.alerts
    truncated = 0
    if max_alerts and len(alerts) > max_alerts:
        truncated = len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    kept = replace(notification, alerts=alerts)
    status = ("firing" if kept.firing else "resolved") if alerts else notification.status
    return {
        "receiver": notification.receiver,
        "status": status,
        "alerts": [_webhook_alert(a, notification.created_ms) for a in alerts],
        "groupLabels": dict(notification.group_labels),
        "commonLabels": kept.common_labels(),
        "commonAnnotations": kept.common_annotations(),
        "externalURL": notification.external_url,
        "version": WEBHOOK_VERSION,
        "groupKey": notification.group_key,
        "truncatedAlerts": truncated,
    }


def _webhook_alert(alert: AlertSnapshot, now_ms: int) -> dict[str, Any]:
    ends_at = GO_ZERO_TIME if alert.status == "firing" else format_go_time(alert.ends_at_ms or now_ms)
    return {
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": format_go_time(alert.starts_at_ms),
        "endsAt": ends_at,
        "generatorURL": alert.generator_url,
        "fingerprint": alert.fingerprint,
    }


class WebhookSink:
    """POSTs alert groups and findings to one URL as Alertmanager-compatible JSON."""

    def __init__(self, name: str, config: WebhookReceiverConfig, session: aiohttp.ClientSession, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._config = config
        self.deadline_s = config.timeout  # one POST, bounded as a whole by aiohttp's total timeout
        self._session = session
        self._clock = clock
        self._secret = config.secret.get_secret_value().encode() if config.secret is not None else None
        if not config.verify_tls:
            log.warning("webhook TLS verification disabled", receiver=name)

    def payload(self, notification: Notification) -> dict[str, Any] | None:
        """The JSON this sink posts for ``notification``; None for kinds it does not send."""
        if notification.kind == "alerts":
            return webhook_payload(notification, max_alerts=self._config.max_alerts)
        if notification.kind == "finding":
            return {"version": WEBHOOK_VERSION, "kind": "finding", "groupKey": notification.group_key,
                    "finding": notification.finding or {}}
        return None

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """POST once (the ``Idempotency-Key`` header lets a receiver drop a repeat of a retry)."""
        payload = self.payload(notification)
        if payload is None:
            return None
        body = encode_json(payload)
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": notification.key,
            "User-Agent": user_agent(),
        }
        if self._secret is not None:
            headers.update(signature_headers(self._secret, int(self._clock()), body))
        return await post_json(
            self._session, self._config.url, body, headers, timeout_s=self._config.timeout,
            verify_tls=self._config.verify_tls, what=f"webhook {self.name}", clock=self._clock,
        )

    async def close(self) -> None:
        """Nothing to release: the session belongs to the caller."""

