"""Findings forwarded to the central agent: ``POST <forward.url>/api/v1/findings``.

A node agent's findings (NVML, nccl-tests, OOM lines in its pod logs) belong in the central agent's
incidents, beside the alert about the same node. This sink is the node agent's half: it takes the
``finding`` notifications the dispatcher queued for :func:`~agent.act.queues.forward_queue` and
posts each once, with the central agent's bearer token. Everything else (durability across a central
outage, backoff, ``Retry-After``, giving up after ``notify.give_up_after``) is the outbox's, as for
every receiver; a 4xx (a bad token, a payload the central agent refuses) is permanent and lands in
the outbox's failed items, a 5xx or a refused connection is retried.

The body (:func:`forward_payload`) carries the notification's key, which the outbox keeps the same
across retries and restarts: the central agent stores each key once, so a retry whose first attempt
did arrive (a timeout after the commit) is answered 200 and not recorded again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
import structlog

from agent.act.notification import Notification
from agent.act.sinks.http import encode_json, post_json, user_agent
from agent.config import ForwardConfig

__all__ = ["FORWARD_VERSION", "ForwardSink", "forward_payload"]

log = structlog.get_logger(__name__)

#: The intake format's version (``agent.act.finding_intake`` reads it).
FORWARD_VERSION = "1"


def forward_payload(notification: Notification, labels: dict[str, str]) -> dict[str, Any]:
    """The intake body for one finding: its key, the finding, the node's labels and, when the finding
    is about an alert the node agent raised, that alert's labels."""
    alert = notification.alerts[0] if notification.alerts else None
    body: dict[str, Any] = {"version": FORWARD_VERSION, "key": notification.key,
                            "finding": notification.finding or {}, "labels": dict(labels)}
    if alert is not None:
        body["alert"] = {"labels": dict(alert.labels), "startsAt": alert.starts_at_ms}
    return body


class ForwardSink:
    """POSTs findings to the central agent's intake (see the module docstring)."""

    def __init__(self, name: str, config: ForwardConfig, session: aiohttp.ClientSession, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._config = config
        self.deadline_s = config.timeout
        self._session = session
        self._clock = clock
        self._token = config.token.get_secret_value() if config.token is not None else None
        if not config.verify_tls:
            log.warning("forward TLS verification disabled", url=config.url)

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """POST once; only findings are forwarded (nothing else is queued here)."""
        if notification.kind != "finding":
            return None
        body = encode_json(forward_payload(notification, self._config.labels))
        headers = {"Content-Type": "application/json", "Idempotency-Key": notification.key,
                   "User-Agent": user_agent()}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        return await post_json(self._session, self._config.endpoint, body, headers, timeout_s=self._config.timeout,
                               verify_tls=self._config.verify_tls, what="forward to the central agent",
                               clock=self._clock)

    async def close(self) -> None:
        """Nothing to release: the session belongs to the caller."""
