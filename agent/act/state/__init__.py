"""The agent's durable state: one SQLite file (WAL) that survives a crash or a restart.

It holds the notification outbox (an item is deleted only after its receiver
acknowledged it, and its idempotency key is remembered so a retry after a crash is
refused), alert state per rule (restored on start like Prometheus'
``ALERTS_FOR_STATE``), the notification log and message references per alert group,
scaling cooldowns, silences and incidents.

Durability: the connection runs ``journal_mode=WAL`` with ``synchronous=FULL``.
``NORMAL`` would be enough to survive a process crash, but in WAL mode it may lose the
last commits on power loss, and the outbox promises that nothing acknowledged to the
caller is lost. ``busy_timeout`` lets the ``sre-agent silence`` command write the same
file while the daemon runs. Every method joins an open :meth:`StateDB.transaction`,
otherwise commits on its own. One lock serialises threads; never ``await`` inside a
transaction (coroutines on one thread would join it). Every SQLite error becomes a
:class:`~agent.errors.StateError` naming the file and the operation.

The records the methods return and the table schema are in :mod:`agent.act.state.records`;
they are re-exported here, so ``from agent.act.state import Silence`` keeps working.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from agent.act.notification import Notification
from agent.act.state.records import (
    SCHEMA,
    SCHEMA_VERSION,
    Incident,
    IncidentEvent,
    NflogEntry,
    OutboxItem,
    ScaleState,
    Silence,
    iso_ms,
)
from agent.errors import StateError
from agent.matchers import parse_matcher

__all__ = [
    "DELIVERED_KEEP_MS", "SCHEMA_VERSION", "Incident", "IncidentEvent", "NflogEntry", "OutboxItem",
    "ScaleState", "Silence", "StateDB", "iso_ms",
]

log = structlog.get_logger(__name__)

DELIVERED_KEEP_MS = 24 * 3600 * 1000  # delivered keys are refused by enqueue at least this long


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class StateDB:
    """The state database; see the module docstring for its guarantees."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._depth = 0
        if self.path != ":memory:":
            parent = Path(self.path).resolve().parent
            if not parent.is_dir():
                raise StateError(f"state db {self.path}: directory {parent} does not exist")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise StateError(f"state db {self.path}: directory {parent} is not writable")
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StateError(f"state db {self.path}: open failed: {exc}") from exc
        try:
            with self._guard("open") as c:
                c.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA synchronous=FULL")
                c.execute("PRAGMA foreign_keys=ON")
            with self.transaction(), self._guard("create schema") as c:
                version = c.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StateError(f"state db {self.path}: schema version {version} is newer than this "
                                     f"sre-agent's ({SCHEMA_VERSION}); upgrade sre-agent")
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except StateError:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _guard(self, op: str) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with SQLite errors translated to StateError."""
        with self._lock:
            if self._conn is None:
                raise StateError(f"state db {self.path}: {op}: the database is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StateError(f"state db {self.path}: {op} failed: {exc}") from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All writes inside commit together or not at all; nests (inner levels are SAVEPOINTs)."""
        with self._lock:
            depth, sp = self._depth, f"sp{self._depth}"
            with self._guard("begin transaction") as c:
                c.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT {sp}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth = depth
                self._rollback(depth, sp)
                raise
            self._depth = depth
            try:
                with self._guard("commit") as c:
                    c.execute("COMMIT" if depth == 0 else f"RELEASE {sp}")
            except StateError:
                if depth == 0 and self._conn is not None and self._conn.in_transaction:
                    self._conn.rollback()
                raise

    def _rollback(self, depth: int, sp: str) -> None:
        """Undo this level; a failure here is logged so the caller's original exception propagates."""
        conn = self._conn
        if conn is None or not conn.in_transaction:  # SQLite already rolled back (e.g. disk full)
            return
        try:
            if depth == 0:
                conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO {sp}")
                conn.execute(f"RELEASE {sp}")
        except sqlite3.Error as exc:
            log.error("state db rollback failed", db=self.path, error=str(exc))

    @contextmanager
    def _write(self, op: str) -> Iterator[sqlite3.Connection]:
        with self.transaction(), self._guard(op) as c:
            yield c

    # -- outbox ------------------------------------------------------------------------------------

    def enqueue(self, n: Notification, *, now_ms: int) -> bool:
        """Queue ``n``; False if its key is queued already or was delivered (a duplicate)."""
        with self._write("enqueue") as c:
            if c.execute("SELECT 1 FROM delivered WHERE key = ?", (n.key,)).fetchone():
                return False
            cur = c.execute("INSERT OR IGNORE INTO outbox (receiver, key, kind, payload, created_ms, next_attempt_ms)"
                            " VALUES (?, ?, ?, ?, ?, ?)", (n.receiver, n.key, n.kind, n.to_json(), now_ms, now_ms))
            return cur.rowcount == 1

    def due(self, now_ms: int) -> list[OutboxItem]:
        """The head of each receiver's queue, if it is due: a receiver that is down blocks only itself."""
        with self._guard("due") as c:
            rows = c.execute("SELECT * FROM outbox WHERE id IN (SELECT MIN(id) FROM outbox GROUP BY receiver)"
                             " AND next_attempt_ms <= ? ORDER BY id", (now_ms,)).fetchall()
        return [OutboxItem(*r) for r in rows]

    def pending(self, receiver: str | None = None) -> list[OutboxItem]:
        with self._guard("pending") as c:
            if receiver is None:
                rows = c.execute("SELECT * FROM outbox ORDER BY id").fetchall()
            else:
                rows = c.execute("SELECT * FROM outbox WHERE receiver = ? ORDER BY id", (receiver,)).fetchall()
        return [OutboxItem(*r) for r in rows]

    def head(self, receiver: str) -> OutboxItem | None:
        """The oldest item of one receiver's queue (next to deliver), due or not."""
        return self._end(receiver, "ASC")

    def tail(self, receiver: str) -> OutboxItem | None:
        """The newest item of one receiver's queue."""
        return self._end(receiver, "DESC")

    def _end(self, receiver: str, order: str) -> OutboxItem | None:
        with self._guard("head/tail") as c:  # order is one of two literals, never user data
            row = c.execute(f"SELECT * FROM outbox WHERE receiver = ? ORDER BY id {order} LIMIT 1",  # noqa: S608
                            (receiver,)).fetchone()
        return OutboxItem(*row) if row is not None else None

    def ack(self, item_id: int, *, now_ms: int) -> None:
        with self._write("ack") as c:
            row = c.execute("SELECT key, receiver FROM outbox WHERE id = ?", (item_id,)).fetchone()
            if row is None:
                log.warning("ack of unknown outbox item", item_id=item_id, db=self.path)
                return
            c.execute("DELETE FROM outbox WHERE id = ?", (item_id,))
            c.execute("INSERT OR REPLACE INTO delivered (key, receiver, delivered_ms) VALUES (?, ?, ?)",
                      (row[0], row[1], now_ms))

    def begin_attempt(self, item_id: int, *, next_attempt_ms: int) -> None:
        """Count the attempt and set when to retry it *before* sending (a crash mid-send retries then)."""
        with self._write("begin_attempt") as c:
            c.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt_ms = ? WHERE id = ?",
                      (next_attempt_ms, item_id))

    def retry(self, item_id: int, *, next_attempt_ms: int, error: str) -> None:
        with self._write("retry") as c:
            c.execute("UPDATE outbox SET next_attempt_ms = ?, last_error = ? WHERE id = ?",
                      (next_attempt_ms, error, item_id))

    def fail(self, item_id: int, *, error: str, now_ms: int) -> None:
        """Give up on an item: it leaves the queue for ``outbox_failed``, kept for inspection."""
        with self._write("fail") as c:
            c.execute("INSERT INTO outbox_failed (id, receiver, key, kind, payload, created_ms, failed_ms, attempts,"
                      " error) SELECT id, receiver, key, kind, payload, created_ms, ?, attempts, ? FROM outbox"
                      " WHERE id = ?", (now_ms, error, item_id))
            c.execute("DELETE FROM outbox WHERE id = ?", (item_id,))

    def replace_payload(self, item_id: int, n: Notification) -> None:
        """Swap a queued item's notification (merging batches); its id, key and place in the queue stay."""
        with self._write("replace_payload") as c:
            c.execute("UPDATE outbox SET payload = ?, kind = ? WHERE id = ?", (n.to_json(), n.kind, item_id))

    def outbox_depth(self) -> dict[str, int]:
        with self._guard("outbox_depth") as c:
            return dict(c.execute("SELECT receiver, COUNT(*) FROM outbox GROUP BY receiver").fetchall())

    def failed(self, limit: int = 100) -> list[dict[str, Any]]:
        """Given-up items, newest first, with the notification parsed."""
        with self._guard("failed") as c:
            rows = c.execute("SELECT id, receiver, key, kind, payload, created_ms, failed_ms, attempts, error"
                             " FROM outbox_failed ORDER BY failed_ms DESC, id DESC LIMIT ?", (limit,)).fetchall()
        names = ("id", "receiver", "key", "kind", "payload", "created_ms", "failed_ms", "attempts", "error")
        return [{**dict(zip(names, r, strict=True)), "payload": json.loads(r[4])} for r in rows]

    # -- alert state, notification log, kv, message refs, scaling ---------------------------------

    def save_rule_alerts(self, rule_key: str, alerts: list[dict[str, Any]], eval_ms: int) -> None:
        with self._write("save_rule_alerts") as c:
            c.execute("DELETE FROM rule_alerts WHERE rule_key = ?", (rule_key,))
            c.executemany("INSERT INTO rule_alerts (rule_key, idx, alert) VALUES (?, ?, ?)",
                          [(rule_key, i, _dumps(a)) for i, a in enumerate(alerts)])
            c.execute("INSERT OR REPLACE INTO rule_eval (rule_key, eval_ms) VALUES (?, ?)", (rule_key, eval_ms))

    def load_rule_alerts(self) -> dict[str, tuple[int, list[dict[str, Any]]]]:
        with self._guard("load_rule_alerts") as c:
            evals = c.execute("SELECT rule_key, eval_ms FROM rule_eval").fetchall()
            rows = c.execute("SELECT rule_key, alert FROM rule_alerts ORDER BY rule_key, idx").fetchall()
        out: dict[str, tuple[int, list[dict[str, Any]]]] = {k: (ms, []) for k, ms in evals}
        for key, alert in rows:
            out.setdefault(key, (0, []))[1].append(json.loads(alert))
        return out

    def get_nflog(self, receiver: str, group_key: str) -> NflogEntry | None:
        with self._guard("get_nflog") as c:
            row = c.execute("SELECT firing, resolved, sent_ms FROM nflog WHERE receiver = ? AND group_key = ?",
                            (receiver, group_key)).fetchone()
        return None if row is None else NflogEntry(frozenset(json.loads(row[0])), frozenset(json.loads(row[1])), row[2])

    def put_nflog(self, receiver: str, group_key: str, entry: NflogEntry) -> None:
        with self._write("put_nflog") as c:
            c.execute("INSERT OR REPLACE INTO nflog VALUES (?, ?, ?, ?, ?)", (
                receiver, group_key, _dumps(sorted(entry.firing)), _dumps(sorted(entry.resolved)), entry.sent_ms))

    def delete_nflog(self, receiver: str, group_key: str) -> None:
        with self._write("delete_nflog") as c:
            c.execute("DELETE FROM nflog WHERE receiver = ? AND group_key = ?", (receiver, group_key))

    def get_kv(self, key: str) -> str | None:
        with self._guard("get_kv") as c:
            row = c.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_kv(self, key: str, value: str) -> None:
        with self._write("put_kv") as c:
            c.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

    def get_ref(self, receiver: str, group_key: str) -> tuple[str, str] | None:
        with self._guard("get_ref") as c:
            row = c.execute("SELECT channel, ts FROM refs WHERE receiver = ? AND group_key = ?",
                            (receiver, group_key)).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def put_ref(self, receiver: str, group_key: str, channel: str, ts: str) -> None:
        with self._write("put_ref") as c:
            c.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)", (receiver, group_key, channel, ts))

    def delete_ref(self, receiver: str, group_key: str) -> None:
        with self._write("delete_ref") as c:
            c.execute("DELETE FROM refs WHERE receiver = ? AND group_key = ?", (receiver, group_key))

    def get_scale(self, service: str) -> ScaleState | None:
        with self._guard("get_scale") as c:
            row = c.execute("SELECT * FROM scale WHERE service = ?", (service,)).fetchone()
        return None if row is None else ScaleState(*row)

    def put_scale(self, state: ScaleState) -> None:
        with self._write("put_scale") as c:
            c.execute("INSERT OR REPLACE INTO scale VALUES (?, ?, ?, ?, ?, ?)", (
                state.service, state.replicas, state.desired, state.last_out_ms, state.last_in_ms,
                state.last_unhealthy_ms))

    # -- silences --------------------------------------------------------------------------------

    def add_silence(self, matchers: list[str], *, starts_ms: int, ends_ms: int, created_by: str,
                    comment: str) -> Silence:
        """Store a silence; ``ValueError`` (with the reason) for a bad matcher or time range."""
        parsed = [parse_matcher(t) for t in matchers]
        if not parsed:
            raise ValueError("a silence needs at least one matcher")
        if all(m.matches({}) for m in parsed):
            raise ValueError("at least one matcher must not match the empty string (it would silence everything)")
        if ends_ms <= starts_ms:
            raise ValueError(f"the silence ends ({iso_ms(ends_ms)}) before it starts ({iso_ms(starts_ms)})")
        s = Silence(str(uuid.uuid4()), [str(m) for m in parsed], starts_ms, ends_ms, created_by, comment)
        with self._write("add_silence") as c:
            c.execute("INSERT INTO silences VALUES (?, ?, ?, ?, ?, ?)",
                      (s.id, _dumps(s.matchers), s.starts_ms, s.ends_ms, s.created_by, s.comment))
        log.debug("silence added", silence_id=s.id, matchers=s.matchers, created_by=created_by)
        return s

    def expire_silence(self, silence_id: str, *, now_ms: int) -> bool:
        """End a silence now (a pending one also starts now); False if unknown or already expired."""
        with self._write("expire_silence") as c:
            cur = c.execute("UPDATE silences SET starts_ms = MIN(starts_ms, ?), ends_ms = ?"
                            " WHERE id = ? AND ends_ms > ?", (now_ms, now_ms, silence_id, now_ms))
            return cur.rowcount == 1

    def silences(self, *, now_ms: int, include_expired: bool = False) -> list[Silence]:
        """Active and pending silences (and expired ones on request), by start time."""
        with self._guard("silences") as c:
            rows = c.execute("SELECT * FROM silences WHERE ends_ms > ? OR ? ORDER BY starts_ms, id",
                             (now_ms, include_expired)).fetchall()
        return [Silence(r[0], json.loads(r[1]), r[2], r[3], r[4], r[5]) for r in rows]

    # -- incidents -------------------------------------------------------------------------------

    def open_incident(self, *, fingerprint: str, alertname: str, labels: dict[str, str], severity: str,
                      summary: str, started_ms: int) -> int:
        """The open incident of this alert, else a new one."""
        with self._write("open_incident") as c:
            row = c.execute("SELECT id FROM incidents WHERE fingerprint = ? AND resolved_ms = 0 ORDER BY id DESC",
                            (fingerprint,)).fetchone()
            if row is not None:
                return int(row[0])
            cur = c.execute("INSERT INTO incidents (fingerprint, alertname, labels, severity, summary, started_ms)"
                            " VALUES (?, ?, ?, ?, ?, ?)",
                            (fingerprint, alertname, _dumps(labels), severity, summary, started_ms))
            return int(cur.lastrowid or 0)

    def resolve_incident(self, fingerprint: str, *, resolved_ms: int) -> None:
        """Close this alert's open incident; nothing open: no-op."""
        with self._write("resolve_incident") as c:
            c.execute("UPDATE incidents SET resolved_ms = ? WHERE fingerprint = ? AND resolved_ms = 0",
                      (max(resolved_ms, 1), fingerprint))  # 0 means open

    def add_incident_event(self, fingerprint: str, *, at_ms: int, kind: str, detail: dict[str, Any]) -> None:
        """Attach to the open incident of the alert, else its latest; no incident at all: ignored."""
        with self._write("add_incident_event") as c:
            row = c.execute("SELECT id FROM incidents WHERE fingerprint = ? ORDER BY resolved_ms = 0 DESC, id DESC",
                            (fingerprint,)).fetchone()
            if row is None:
                log.debug("incident event without incident", fingerprint=fingerprint, kind=kind)
                return
            c.execute("INSERT INTO incident_events (incident_id, at_ms, kind, detail) VALUES (?, ?, ?, ?)",
                      (row[0], at_ms, kind, _dumps(detail)))

    def incidents(self, *, limit: int = 50, open_only: bool = False) -> list[Incident]:
        """Newest first, each with its events in time order."""
        with self._guard("incidents") as c:
            rows = c.execute("SELECT * FROM incidents WHERE resolved_ms = 0 OR NOT ?"
                             " ORDER BY started_ms DESC, id DESC LIMIT ?", (open_only, limit)).fetchall()
            events: dict[int, list[IncidentEvent]] = {r[0]: [] for r in rows}
            marks = ",".join("?" * len(events))
            for inc, at, kind, detail in c.execute(
                    f"SELECT incident_id, at_ms, kind, detail FROM incident_events WHERE incident_id IN ({marks})"  # noqa: S608
                    " ORDER BY at_ms, id", list(events)).fetchall():
                events[inc].append(IncidentEvent(at, kind, json.loads(detail)))
        return [Incident(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], events[r[0]]) for r in rows]

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Drop resolved incidents, failed items and expired silences older than ``keep_ms``, and delivered
        keys older than ``max(keep_ms, DELIVERED_KEEP_MS)``. Returns the number of rows dropped."""
        cutoff = now_ms - keep_ms
        with self._write("prune") as c:
            c.execute("DELETE FROM incident_events WHERE incident_id IN"
                      " (SELECT id FROM incidents WHERE resolved_ms != 0 AND resolved_ms < ?)", (cutoff,))
            n = c.execute("DELETE FROM incidents WHERE resolved_ms != 0 AND resolved_ms < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM outbox_failed WHERE failed_ms < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM silences WHERE ends_ms < ?", (cutoff,)).rowcount
            n += c.execute("DELETE FROM delivered WHERE delivered_ms < ?",
                           (now_ms - max(keep_ms, DELIVERED_KEEP_MS),)).rowcount
        if n:
            log.info("state pruned", rows=n, keep_ms=keep_ms)
        return n
