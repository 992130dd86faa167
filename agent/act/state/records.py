"""What the state database holds: its tables (the SQL schema) and the records read back from them.

:class:`~agent.act.state.StateDB` owns the connection and the transactions, and its table
classes the queries; this module is the data model they share with their callers: one frozen
dataclass per kind of row (an outbox item, a silence, a notification-log entry, a service's
scaling state, an incident and its timeline), the ``CREATE`` statements behind them, and
:data:`SCHEMA_VERSION`, which the connection writes to ``PRAGMA user_version`` and checks on
open. The records also carry their API shapes (Alertmanager's ``GettableSilence``, the incidents
JSON), which callers need without the SQLite plumbing. Where a table class builds a record from a
``SELECT *`` row, the field order is the table's column order: change both together.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from agent.act.notification import Notification, Status
from agent.act.queues import QueueName
from agent.matchers import parse_matcher
from agent.series import iso_ms

__all__ = [
    "SCHEMA", "SCHEMA_VERSION", "Incident", "IncidentEvent", "IntakeAlert", "NflogEntry", "OutboxItem",
    "RemoteWriteBatch", "ScaleState", "Silence", "iso_ms",
]

SCHEMA_VERSION = 1

#: The tables, one statement per ``;`` (``StateDB`` runs them on every open: ``IF NOT EXISTS``).
SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT NOT NULL,
  key TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, payload TEXT NOT NULL, created_ms INTEGER NOT NULL,
  next_attempt_ms INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS outbox_receiver ON outbox (receiver, id);
CREATE TABLE IF NOT EXISTS outbox_failed (id INTEGER PRIMARY KEY, receiver TEXT NOT NULL, key TEXT NOT NULL,
  kind TEXT NOT NULL, payload TEXT NOT NULL, created_ms INTEGER NOT NULL, failed_ms INTEGER NOT NULL,
  attempts INTEGER NOT NULL, error TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS delivered (key TEXT PRIMARY KEY, receiver TEXT NOT NULL, delivered_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS remote_write (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
  samples INTEGER NOT NULL, payload BLOB NOT NULL, created_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS remote_write_queue ON remote_write (queue, id);
CREATE TABLE IF NOT EXISTS rule_alerts (rule_key TEXT NOT NULL, idx INTEGER NOT NULL, alert TEXT NOT NULL,
  PRIMARY KEY (rule_key, idx));
CREATE TABLE IF NOT EXISTS rule_eval (rule_key TEXT PRIMARY KEY, eval_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nflog (receiver TEXT NOT NULL, group_key TEXT NOT NULL, firing TEXT NOT NULL,
  resolved TEXT NOT NULL, sent_ms INTEGER NOT NULL, PRIMARY KEY (receiver, group_key));
CREATE TABLE IF NOT EXISTS refs (receiver TEXT NOT NULL, group_key TEXT NOT NULL, channel TEXT NOT NULL,
  ts TEXT NOT NULL, PRIMARY KEY (receiver, group_key));
CREATE TABLE IF NOT EXISTS scale (service TEXT PRIMARY KEY, replicas INTEGER NOT NULL, desired INTEGER NOT NULL,
  last_out_ms INTEGER NOT NULL, last_in_ms INTEGER NOT NULL, last_unhealthy_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS silences (id TEXT PRIMARY KEY, matchers TEXT NOT NULL, starts_ms INTEGER NOT NULL,
  ends_ms INTEGER NOT NULL, created_by TEXT NOT NULL, comment TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT NOT NULL,
  alertname TEXT NOT NULL, labels TEXT NOT NULL, severity TEXT NOT NULL, summary TEXT NOT NULL,
  started_ms INTEGER NOT NULL, resolved_ms INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS incidents_fp ON incidents (fingerprint, resolved_ms);
CREATE TABLE IF NOT EXISTS incident_events (id INTEGER PRIMARY KEY AUTOINCREMENT,
  incident_id INTEGER NOT NULL REFERENCES incidents (id) ON DELETE CASCADE,
  at_ms INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS incident_events_inc ON incident_events (incident_id, at_ms);
CREATE TABLE IF NOT EXISTS intake_alerts (fingerprint TEXT PRIMARY KEY, status TEXT NOT NULL,
  starts_ms INTEGER NOT NULL, alert TEXT NOT NULL, received_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS intake_inbox (id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT NOT NULL,
  was TEXT NOT NULL, alert TEXT NOT NULL, received_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS forwarded_findings (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,
  received_ms INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class OutboxItem:
    """One queued notification (a row of ``outbox``)."""

    id: int
    receiver: QueueName  # the outbox queue (agent.act.queues)
    key: str
    kind: str
    payload: str  # Notification.to_json()
    created_ms: int
    next_attempt_ms: int
    attempts: int
    last_error: str

    def notification(self) -> Notification:
        return Notification.from_json(self.payload)


@dataclass(frozen=True)
class RemoteWriteBatch:
    """One queued remote-write batch (a row of ``remote_write``): a serialised, uncompressed ``WriteRequest``."""

    id: int
    samples: int
    payload: bytes


@dataclass(frozen=True)
class Silence:
    """An Alertmanager-style silence: alerts matching every matcher are muted while it is active."""

    id: str
    matchers: list[str]  # canonical Alertmanager syntax: name="value", name=~"regex"
    starts_ms: int
    ends_ms: int
    created_by: str
    comment: str

    def active(self, now_ms: int) -> bool:
        return self.starts_ms <= now_ms < self.ends_ms

    def state(self, now_ms: int) -> str:
        """``pending`` (not started), ``active`` or ``expired`` — Alertmanager's silence states."""
        return "pending" if now_ms < self.starts_ms else "active" if now_ms < self.ends_ms else "expired"

    def to_json(self, now_ms: int | None = None) -> dict[str, Any]:
        """Alertmanager API v2 ``GettableSilence`` shape; ``now_ms`` (default: the wall clock) sets the state."""
        now = int(datetime.now(UTC).timestamp() * 1000) if now_ms is None else now_ms
        ms = [parse_matcher(t) for t in self.matchers]
        return {
            "id": self.id, "createdBy": self.created_by, "comment": self.comment,
            "startsAt": iso_ms(self.starts_ms), "endsAt": iso_ms(self.ends_ms), "status": {"state": self.state(now)},
            "matchers": [{"name": m.name, "value": m.value, "isRegex": "~" in m.op, "isEqual": "!" not in m.op}
                         for m in ms],
        }


@dataclass(frozen=True)
class NflogEntry:
    """What was last sent to a receiver for an alert group (Alertmanager's nflog): fingerprints."""

    firing: frozenset[str]
    resolved: frozenset[str]
    sent_ms: int


@dataclass(frozen=True)
class ScaleState:
    """A service's replicas, desired replicas and the times its cooldowns count from."""

    service: str
    replicas: int
    desired: int
    last_out_ms: int
    last_in_ms: int
    last_unhealthy_ms: int


@dataclass(frozen=True)
class IncidentEvent:
    """One line of an incident's timeline. ``detail`` by ``kind`` (what ``sre-agent incidents`` renders):

    * ``fired``: ``{"value", "active_at_ms"}`` (when it went pending); ``resolved``: ``{}``
    * ``notified``: ``{"receiver", "status", "kind", "attempts", "last_error"}`` (attempts: 1 + the retries;
      last_error: the failed attempt before, if any); ``notify_failed``: ``{"receiver", "error", "attempts"}``
    * ``action``: ``{"action": "scale_out"|"scale_in"|..., "service", "from_replicas", "to_replicas",
      "dry_run", "refused", "reason"}`` (a refusal: ``refused: true`` and the reason, e.g. the cooldown)
    * ``finding``: ``{"kind", "summary", "setting", "suggested_value", "runbook_url"}``
    """

    at_ms: int
    kind: str  # fired | resolved | notified | notify_failed | action | finding
    detail: dict[str, Any]


@dataclass(frozen=True)
class Incident:
    """One alert's firing episode, from ``fired`` to ``resolved``, with its timeline."""

    id: int
    fingerprint: str
    alertname: str
    labels: dict[str, str]
    severity: str
    summary: str
    started_ms: int
    resolved_ms: int  # 0 while open
    events: list[IncidentEvent]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "fingerprint": self.fingerprint, "alertname": self.alertname, "labels": self.labels,
            "severity": self.severity, "summary": self.summary, "status": "resolved" if self.resolved_ms else "open",
            "startsAt": iso_ms(self.started_ms), "endsAt": iso_ms(self.resolved_ms) if self.resolved_ms else None,
            "started_ms": self.started_ms, "resolved_ms": self.resolved_ms,
            "events": [{"at": iso_ms(e.at_ms), "at_ms": e.at_ms, "kind": e.kind, "detail": e.detail}
                       for e in self.events],
        }


@dataclass(frozen=True)
class IntakeAlert:
    """One alert of an Alertmanager webhook as the intake keeps it (``intake_alerts``, ``intake_inbox``).

    ``fingerprint`` is Alertmanager's (the de-duplication identity, with ``status`` and ``starts_ms``);
    ``ends_ms`` is 0 while it fires (Alertmanager sends Go's zero time then). ``source`` is the
    sending Alertmanager's ``externalURL`` and ``receiver`` its receiver name, for logs and incidents.
    """

    fingerprint: str
    status: Status
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_ms: int
    ends_ms: int = 0
    generator_url: str = ""
    source: str = ""
    receiver: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IntakeAlert:
        return cls(**json.loads(text))
