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

This module also holds the HTTP delivery policy the Alertmanager sink shares: one
POST, no redirects followed, and the answer mapped onto
:class:`~agent.errors.DeliveryError` (2xx ok; 429, 5xx, timeouts and connection
errors retryable with ``Retry-After`` honoured; any other status permanent).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

import agent
from agent.config import WebhookReceiverConfig
from agent.errors import DeliveryError
from agent.notification import AlertSnapshot, Notification
from agent.signing import signature_headers

__all__ = [
    "GO_ZERO_TIME",
    "WebhookSink",
    "check_status",
    "encode_json",
    "format_go_time",
    "parse_retry_after",
    "post_json",
    "user_agent",
    "webhook_payload",
]

log = structlog.get_logger(__name__)

GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's time.Time{} in JSON: Alertmanager's endsAt while firing
WEBHOOK_VERSION = "4"  # Alertmanager's webhook payload version since 0.11
_ERROR_TEXT_LIMIT = 64 * 1024  # bytes of an error reply read for the message
_ERROR_TEXT_SHOWN = 500  # characters of it put into the DeliveryError


def user_agent() -> str:
    """``sre-agent/<version>``, the User-Agent of every HTTP sink."""
    return f"sre-agent/{agent.__version__}"


def format_go_time(ms: int) -> str:
    """Unix ms -> Go's ``time.Time`` JSON form in UTC (RFC 3339, fraction without trailing zeros).

    ``0`` is Go's zero time, which Alertmanager writes for an ``endsAt`` not reached yet.
    """
    if ms <= 0:
        return GO_ZERO_TIME
    secs, frac = divmod(ms, 1000)
    text = datetime.fromtimestamp(secs, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:03d}".rstrip("0")
    return text + "Z"


def encode_json(payload: Any) -> bytes:
    """The exact bytes sent: compact UTF-8 JSON; NaN/Infinity are refused (not JSON)."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise DeliveryError(f"payload is not valid JSON: {exc}", permanent=True) from exc


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


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` (delay seconds or an HTTP date) -> seconds from ``now``; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None  # "inf" would overflow the backoff
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def check_status(status: int, text: str, headers: Mapping[str, str], *, what: str, now: float) -> None:
    """Raise the DeliveryError a non-2xx reply deserves (see the module docstring)."""
    if 200 <= status < 300:
        return
    detail = _error_text(text)[:_ERROR_TEXT_SHOWN]
    message = f"{what}: HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429 or status >= 500:
        raise DeliveryError(message, retry_after_s=parse_retry_after(headers.get("Retry-After"), now))
    if 300 <= status < 400:
        message += f" (redirect to {headers.get('Location', '?')!r} not followed; configure that URL)"
    raise DeliveryError(message, permanent=True)


def _error_text(text: str) -> str:
    """The reason in an error reply: Alertmanager sends a JSON string, others ``{"message": ...}``."""
    text = text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        for key in ("message", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    verify_tls: bool = True,
    what: str,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any] | None:
    """POST ``body`` once; return the JSON object replied, if any, or raise DeliveryError.

    ``what`` names the receiver in error messages (never the body or headers,
    which may carry signatures).
    """
    try:
        async with session.post(
            url, data=body, headers=dict(headers), timeout=aiohttp.ClientTimeout(total=timeout_s),
            ssl=verify_tls, allow_redirects=False,
        ) as resp:
            raw = await resp.content.read(_ERROR_TEXT_LIMIT)
            status, reply_headers = resp.status, resp.headers
            content_type = resp.content_type
    except TimeoutError as exc:
        raise DeliveryError(f"{what}: no answer within {timeout_s:g}s") from exc
    except aiohttp.ClientError as exc:
        raise DeliveryError(f"{what}: {type(exc).__name__}: {exc}") from exc
    text = raw.decode("utf-8", errors="replace")
    check_status(status, text, reply_headers, what=what, now=clock())
    log.debug("receiver accepted", receiver=what, status=status)
    if content_type == "application/json" and text:
        try:
            reply = json.loads(text)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None
    return None


class WebhookSink:
    """POSTs alert groups and findings to one URL as Alertmanager-compatible JSON."""

    def __init__(self, name: str, config: WebhookReceiverConfig, session: aiohttp.ClientSession, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._config = config
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

