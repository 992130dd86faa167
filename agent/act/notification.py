"""What the act layer hands to receivers: alerts as sent, and one notification.

A :class:`Notification` is the unit the outbox stores and a sink delivers: one alert
group for one receiver (or one finding, or one scale request). It is plain data that
round-trips through JSON (:meth:`Notification.to_json` / :meth:`Notification.from_json`),
so an item written to SQLite before a crash is delivered unchanged after the restart.
``key`` is the idempotency key: the same logical message always gets the same key, so a
receiver (or the outbox's UNIQUE constraint) can drop a retry after a crash.

Fingerprints follow Alertmanager's idea (a stable hash of the sorted label set) but
are SHA-256 hex prefixes, not Alertmanager's FNV-64a: they only need to be stable
inside the agent.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from agent.act.queues import QueueName

__all__ = ["VALIDITY_FACTOR", "AlertSnapshot", "Notification", "Status", "fingerprint", "group_key_hash", "json_number"]

Status = Literal["firing", "resolved"]

#: Prometheus' sending rule: a firing alert's ``endsAt`` is now + 4 × max(evaluation interval,
#: resend delay), so Alertmanager resolves it by itself if the sender stops. The dispatcher
#: applies it; the Alertmanager sink falls back to it for a snapshot without an end.
VALIDITY_FACTOR = 4
Kind = Literal["alerts", "finding", "scale"]


def json_number(v: float) -> float | None:
    """A sample value for a JSON body: NaN and infinities are not JSON, so they go out as null."""
    return float(v) if math.isfinite(v) else None


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable 16-hex-digit identity of a label set (order-independent)."""
    text = "\xff".join(f"{k}\xfe{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def group_key_hash(receiver: str, group_key: str) -> str:
    """Short stable id of one (receiver, aggregation group), for idempotency keys."""
    return hashlib.sha256(f"{receiver}\xff{group_key}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AlertSnapshot:
    """One alert as receivers see it, shaped after Alertmanager's API v2 alert.

    Times are Unix milliseconds; ``ends_at_ms`` is 0 while firing with no end known.
    For Alertmanager batches the dispatcher sets Prometheus' ``endsAt`` (now + 4 ×
    max(eval interval, resend delay)); the sink falls back to now + 4 × resend delay.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    status: Status
    starts_at_ms: int
    ends_at_ms: int = 0
    value: float = 0.0
    generator_url: str = ""
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint(self.labels))


@dataclass(frozen=True)
class Notification:
    """One message for one receiver; ``kind`` says which payload fields are set.

    * ``alerts``: an aggregation group (``group_key``, ``group_labels``, ``alerts``);
      ``status`` is ``firing`` if any alert in it fires, else ``resolved``.
    * ``finding``: a diagnosis result (``finding`` holds :meth:`Finding.to_json`), posted
      in the Slack thread of the group in ``group_key`` when there is one.
    * ``scale``: a scale request (``scale`` holds the signed body's fields).

    An item queued before a field existed loads with that field's default.
    """

    key: str
    receiver: QueueName  # the outbox queue it waits in (agent.act.queues)
    kind: Kind
    created_ms: int
    group_key: str = ""
    group_labels: dict[str, str] = field(default_factory=dict)
    status: Status = "firing"
    alerts: tuple[AlertSnapshot, ...] = ()
    external_url: str = ""
    finding: dict[str, Any] | None = None
    scale: dict[str, Any] | None = None
    #: ``alerts``: the incidents its alerts are recorded in, by fingerprint: ``{"id": 12}``, plus
    #: ``"summary"`` (:func:`agent.act.incident_summary.one_line`) once resolved; the Slack message
    #: links each one's triage report (``server.external_url``) and its resolve update says the summary.
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def firing(self) -> list[AlertSnapshot]:
        return [a for a in self.alerts if a.status == "firing"]

    @property
    def resolved(self) -> list[AlertSnapshot]:
        return [a for a in self.alerts if a.status == "resolved"]

    def common_labels(self) -> dict[str, str]:
        """Labels every alert shares with the same value (Alertmanager's ``commonLabels``)."""
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> Notification:
        data = json.loads(text)
        data["alerts"] = tuple(AlertSnapshot(**a) for a in data.get("alerts", ()))
        return cls(**data)


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}
