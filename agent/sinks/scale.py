"""The scale-request receiver: POSTs a scale decision as signed JSON to the service's webhook.

The body is the decision's payload (:func:`agent.scaling.Scaler.decide` builds it),
sent once per attempt with an ``Idempotency-Key`` header equal to the payload's
``idempotency_key``, so a receiver drops a retry of a request it already applied (the
simulator's ``POST /scale`` does, answering ``applied: false``). With a secret, the
exact body bytes are signed (``X-SRE-Agent-Timestamp`` / ``X-SRE-Agent-Signature``,
see :mod:`agent.signing`).

Outcomes, as the dispatcher needs them: 2xx acknowledges and returns the receiver's
JSON object reply (``{"replicas": N, ...}`` feeds :meth:`Scaler.on_ack`); any other
4xx but 429 is permanent (the receiver rejected this request, resending it cannot
help); 429, 5xx, timeouts and connection errors are retried, after ``Retry-After``
when the receiver gives one. Redirects are not followed: the signature and the
request belong to the configured URL, and a POST silently turned into a GET would
look acknowledged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import structlog

from agent.config import ScaleWebhookConfig
from agent.errors import DeliveryError
from agent.notification import Notification
from agent.signing import signature_headers

__all__ = ["IDEMPOTENCY_HEADER", "ScaleSink", "parse_retry_after"]

log = structlog.get_logger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"
_ERROR_BODY_CHARS = 200  # how much of a rejecting receiver's body goes into the error


class ScaleSink:
    """Delivers ``kind="scale"`` notifications to one scale webhook.

    The HTTP session belongs to the caller (shared by every sink), so :meth:`close`
    leaves it open.
    """

    def __init__(self, name: str, config: ScaleWebhookConfig, session: aiohttp.ClientSession, *,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.name = name
        self._config = config
        self._session = session
        self._clock = clock
        self._ssl: bool = config.verify_tls  # False: accept any certificate (self-signed lab receivers)

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """POST the scale request once; return the receiver's JSON reply (or None)."""
        if notification.kind != "scale":
            log.debug("not a scale request; skipped", receiver=self.name, kind=notification.kind)
            return None
        if notification.scale is None:
            raise DeliveryError(f"{self.name}: scale notification {notification.key!r} has no payload",
                                permanent=True)  # fmt: skip
        try:
            body = json.dumps(notification.scale, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise DeliveryError(f"{self.name}: payload is not JSON: {exc}", permanent=True) from exc
        key = str(notification.scale.get("idempotency_key") or notification.key)
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: key}
        if self._config.secret is not None:
            secret = self._config.secret.get_secret_value().encode()
            headers.update(signature_headers(secret, int(self._clock()), body))
        timeout = aiohttp.ClientTimeout(total=self._config.timeout)
        try:
            async with self._session.post(self._config.url, data=body, headers=headers, timeout=timeout,
                                          ssl=self._ssl, allow_redirects=False) as resp:  # fmt: skip
                status = resp.status
                text = await resp.text(errors="replace")
                retry_after = parse_retry_after(resp.headers.get("Retry-After"), now=self._clock())
        except TimeoutError as exc:
            raise DeliveryError(f"{self.name}: no answer within {self._config.timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        if 200 <= status < 300:
            reply = _json_object(text)
            log.info("scale request delivered", receiver=self.name, key=key, status=status, attempt=attempt,
                     replicas=None if reply is None else reply.get("replicas"))  # fmt: skip
            return reply
        snippet = text[:_ERROR_BODY_CHARS].strip()
        message = f"{self.name}: HTTP {status}" + (f": {snippet}" if snippet else "")
        if status == 429 or status >= 500:
            raise DeliveryError(message, retry_after_s=retry_after)
        raise DeliveryError(message, permanent=True)

    async def close(self) -> None:
        """Nothing to release: the session is the caller's."""


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """``Retry-After`` (delay seconds or an HTTP date) -> seconds from ``now``; None if absent or bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT anyway
        when = when.replace(tzinfo=UTC)
    return max(when.timestamp() - now, 0.0)


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None

