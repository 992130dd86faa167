"""The scale-request receiver: POSTs a scale decision as signed JSON to the service's webhook.

The body is the decision's payload (:func:`agent.act.scaling.Scaler.decide` builds it),
sent once per attempt with an ``Idempotency-Key`` header equal to the payload's
``idempotency_key``, so a receiver drops a retry of a request it already applied (the
simulator's ``POST /scale`` does, answering ``applied: false``). With a secret, the
exact body bytes are signed (``X-SRE-Agent-Timestamp`` / ``X-SRE-Agent-Signature``,
see :mod:`agent.act.sinks.signing`).

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
from typing import Any

import aiohttp
import structlog

from agent.act.notification import Notification
from agent.act.sinks.http import parse_retry_after, post_json
from agent.act.sinks.signing import signature_headers
from agent.config import ScaleWebhookConfig
from agent.errors import DeliveryError

__all__ = ["IDEMPOTENCY_HEADER", "ScaleSink", "parse_retry_after"]

log = structlog.get_logger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"


class ScaleSink:
    """Delivers ``kind="scale"`` notifications to one scale webhook.

    The HTTP session belongs to the caller (shared by every sink), so :meth:`close`
    leaves it open.
    """

    def __init__(self, name: str, config: ScaleWebhookConfig, session: aiohttp.ClientSession, *,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.name = name
        self._config = config
        self.deadline_s = config.timeout  # one POST, bounded as a whole by aiohttp's total timeout
        self._session = session
        self._clock = clock

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
        reply = await post_json(self._session, self._config.url, body, headers, timeout_s=self._config.timeout,
                                verify_tls=self._config.verify_tls, what=self.name, clock=self._clock)
        log.info("scale request delivered", receiver=self.name, key=key, attempt=attempt,
                 replicas=None if reply is None else reply.get("replicas"))  # fmt: skip
        return reply

    async def close(self) -> None:
        """Nothing to release: the session is the caller's."""
