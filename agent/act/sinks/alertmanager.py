"""Alertmanager receiver: the agent posts alerts the way Prometheus does (API v2).

One sink talks to one Alertmanager. For an HA pair the dispatcher builds one sink per
URL in ``alertmanager.urls``, so every Alertmanager gets every alert (their gossip
de-duplicates the notifications) and one that is down only delays its own outbox
items, never the other's. Never put a load balancer in front: Prometheus' docs say
the same, because alerts that reach only one peer are re-sent as new ones.

The payload is Prometheus' ``POST /api/v2/alerts`` body: a list of ``labels``,
``annotations``, ``startsAt``, ``endsAt`` and ``generatorURL``, times as RFC 3339
with milliseconds in UTC. While an alert fires, ``endsAt`` lies in the future
(Prometheus: evaluation time + 4 × max(evaluation interval, resend delay)) so that
Alertmanager resolves it by itself if the agent dies; once resolved, ``endsAt`` is the
resolve time. The dispatcher puts those times into the snapshots; where a firing
snapshot has none (``ends_at_ms == 0``) this sink uses now + 4 × ``resend_delay``.
API v1 was removed in Alertmanager 0.27 and is never used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import structlog

from agent.act.notification import VALIDITY_FACTOR, AlertSnapshot, Notification
from agent.act.sinks.http import encode_json, post_json, user_agent
from agent.config import AlertmanagerReceiverConfig
from agent.series import iso_ms

__all__ = ["AlertmanagerSink", "alerts_v2_payload", "format_rfc3339_ms"]

log = structlog.get_logger(__name__)

API_PATH = "/api/v2/alerts"


format_rfc3339_ms = iso_ms  # the form Prometheus sends: always 3 fraction digits


def alerts_v2_payload(alerts: Iterable[AlertSnapshot], *, now_ms: int | None = None,
                      resend_delay_s: float = 60.0) -> list[dict[str, Any]]:
    """The JSON list Prometheus would POST to ``/api/v2/alerts`` for these alerts.

    A snapshot's own ``ends_at_ms`` wins. Without one, ``now_ms`` gives the fallback
    (firing: now + 4 × ``resend_delay_s``; resolved: now); without ``now_ms`` too,
    ``endsAt`` is left out and Alertmanager applies its ``resolve_timeout``. An empty
    ``generator_url`` is left out, as is a zero ``starts_at_ms`` (Alertmanager then
    uses its receive time).
    """
    out: list[dict[str, Any]] = []
    for alert in alerts:
        item: dict[str, Any] = {"labels": dict(alert.labels), "annotations": dict(alert.annotations)}
        if alert.starts_at_ms > 0:
            item["startsAt"] = format_rfc3339_ms(alert.starts_at_ms)
        ends_at_ms = alert.ends_at_ms
        if ends_at_ms <= 0 and now_ms is not None:
            ends_at_ms = now_ms if alert.status == "resolved" else now_ms + round(
                VALIDITY_FACTOR * resend_delay_s * 1000)
        if ends_at_ms > 0:
            item["endsAt"] = format_rfc3339_ms(ends_at_ms)
        if alert.generator_url:
            item["generatorURL"] = alert.generator_url
        out.append(item)
    return out


class AlertmanagerSink:
    """Sends alert notifications to one Alertmanager's API v2; ignores findings and scale requests."""

    def __init__(self, name: str, url: str, config: AlertmanagerReceiverConfig, session: aiohttp.ClientSession,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self._config = config
        self.deadline_s = config.timeout  # one POST, bounded as a whole by aiohttp's total timeout
        self._session = session
        self._clock = clock

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """POST the group's alerts once. Re-posting is harmless: Alertmanager merges by label set."""
        if notification.kind != "alerts" or not notification.alerts:
            return None
        payload = alerts_v2_payload(notification.alerts, now_ms=round(self._clock() * 1000),
                                    resend_delay_s=self._config.resend_delay)
        headers = {"Content-Type": "application/json", "User-Agent": user_agent()}
        reply = await post_json(
            self._session, self.url + API_PATH, encode_json(payload), headers, timeout_s=self._config.timeout,
            what=f"alertmanager {self.name} at {self.url}", clock=self._clock,
        )
        log.debug("alerts sent to alertmanager", receiver=self.name, url=self.url, alerts=len(payload))
        return reply

    async def close(self) -> None:
        """Nothing to release: the session belongs to the caller."""
