"""The notification outbox: per-receiver FIFO queues, delivered keys, given-up items.

A notification is written here before anything is sent and leaves only when its receiver
acknowledged it (:meth:`Outbox.ack`, which remembers the idempotency key in ``delivered``
so a retry after a crash is refused by :meth:`Outbox.enqueue`) or when the dispatcher gives
up on it (:meth:`Outbox.fail`, kept in ``outbox_failed`` for inspection). Delivery order,
backoff and retries are :mod:`agent.act.outbox`'s business; this is only the storage.
"""

from __future__ import annotations

import json
from typing import Any

import structlog

from agent.act.notification import Notification
from agent.act.state.connection import Table
from agent.act.state.records import OutboxItem

__all__ = ["DELIVERED_KEEP_MS", "Outbox"]

log = structlog.get_logger(__name__)

DELIVERED_KEEP_MS = 24 * 3600 * 1000  # delivered keys are refused by enqueue at least this long


class Outbox(Table):
    """The ``outbox``, ``delivered`` and ``outbox_failed`` tables."""

    def enqueue(self, n: Notification, *, now_ms: int) -> bool:
        """Queue ``n``; False if its key is queued already or was delivered (a duplicate)."""
        with self._conn.write("enqueue") as c:
            if c.execute("SELECT 1 FROM delivered WHERE key = ?", (n.key,)).fetchone():
                return False
            cur = c.execute("INSERT OR IGNORE INTO outbox (receiver, key, kind, payload, created_ms, next_attempt_ms)"
                            " VALUES (?, ?, ?, ?, ?, ?)", (n.receiver, n.key, n.kind, n.to_json(), now_ms, now_ms))
            return cur.rowcount == 1

    def due(self, now_ms: int) -> list[OutboxItem]:
        """The head of each receiver's queue, if it is due: a receiver that is down blocks only itself."""
        with self._conn.guard("due") as c:
            rows = c.execute("SELECT * FROM outbox WHERE id IN (SELECT MIN(id) FROM outbox GROUP BY receiver)"
                             " AND next_attempt_ms <= ? ORDER BY id", (now_ms,)).fetchall()
        return [OutboxItem(*r) for r in rows]

    def pending(self, receiver: str | None = None) -> list[OutboxItem]:
        with self._conn.guard("pending") as c:
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
        with self._conn.guard("head/tail") as c:  # order is one of two literals, never user data
            row = c.execute(f"SELECT * FROM outbox WHERE receiver = ? ORDER BY id {order} LIMIT 1",  # noqa: S608
                            (receiver,)).fetchone()
        return OutboxItem(*row) if row is not None else None

    def ack(self, item_id: int, *, now_ms: int) -> None:
        with self._conn.write("ack") as c:
            row = c.execute("SELECT key, receiver FROM outbox WHERE id = ?", (item_id,)).fetchone()
            if row is None:
                log.warning("ack of unknown outbox item", item_id=item_id, db=self.path)
                return
            c.execute("DELETE FROM outbox WHERE id = ?", (item_id,))
            c.execute("INSERT OR REPLACE INTO delivered (key, receiver, delivered_ms) VALUES (?, ?, ?)",
                      (row[0], row[1], now_ms))

    def oldest_created(self, receivers: frozenset[str]) -> dict[str, int]:
        """The creation time of the oldest queued item of each of ``receivers`` that has one."""
        if not receivers:
            return {}
        marks = ",".join("?" * len(receivers))
        with self._conn.guard("oldest_created") as c:  # marks are "?" only, the names are parameters
            rows = c.execute(f"SELECT receiver, MIN(created_ms) FROM outbox WHERE receiver IN ({marks})"  # noqa: S608
                             " GROUP BY receiver", sorted(receivers)).fetchall()
        return {str(r): int(ms) for r, ms in rows}

    def settle_through(self, receiver: str, *, created_ms: int, now_ms: int, keep: int | None) -> int:
        """HA follower: the receiver's items created at or before ``created_ms`` leave the queue as delivered
        (by the leader; their keys are remembered like any delivered key), except item ``keep`` (in flight).
        Returns how many."""
        with self._conn.write("settle_through") as c:
            rows = c.execute("SELECT id, key FROM outbox WHERE receiver = ? AND created_ms <= ? AND id != ?",
                             (receiver, created_ms, -1 if keep is None else keep)).fetchall()
            for item_id, key in rows:
                c.execute("DELETE FROM outbox WHERE id = ?", (item_id,))
                c.execute("INSERT OR REPLACE INTO delivered (key, receiver, delivered_ms) VALUES (?, ?, ?)",
                          (key, receiver, now_ms))
        return len(rows)

    def begin_attempt(self, item_id: int, *, next_attempt_ms: int) -> None:
        """Count the attempt and set when to retry it *before* sending (a crash mid-send retries then)."""
        with self._conn.write("begin_attempt") as c:
            c.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt_ms = ? WHERE id = ?",
                      (next_attempt_ms, item_id))

    def retry(self, item_id: int, *, next_attempt_ms: int, error: str) -> None:
        with self._conn.write("retry") as c:
            c.execute("UPDATE outbox SET next_attempt_ms = ?, last_error = ? WHERE id = ?",
                      (next_attempt_ms, error, item_id))

    def fail(self, item_id: int, *, error: str, now_ms: int) -> None:
        """Give up on an item: it leaves the queue for ``outbox_failed``, kept for inspection."""
        with self._conn.write("fail") as c:
            c.execute("INSERT INTO outbox_failed (id, receiver, key, kind, payload, created_ms, failed_ms, attempts,"
                      " error) SELECT id, receiver, key, kind, payload, created_ms, ?, attempts, ? FROM outbox"
                      " WHERE id = ?", (now_ms, error, item_id))
            c.execute("DELETE FROM outbox WHERE id = ?", (item_id,))

    def replace_payload(self, item_id: int, n: Notification) -> None:
        """Swap a queued item's notification (merging batches); its id, key and place in the queue stay."""
        with self._conn.write("replace_payload") as c:
            c.execute("UPDATE outbox SET payload = ?, kind = ? WHERE id = ?", (n.to_json(), n.kind, item_id))

    def depth(self) -> dict[str, int]:
        """Items waiting, per receiver queue."""
        with self._conn.guard("outbox depth") as c:
            return dict(c.execute("SELECT receiver, COUNT(*) FROM outbox GROUP BY receiver").fetchall())

    def failed(self, limit: int = 100) -> list[dict[str, Any]]:
        """Given-up items, newest first, with the notification parsed."""
        with self._conn.guard("failed") as c:
            rows = c.execute("SELECT id, receiver, key, kind, payload, created_ms, failed_ms, attempts, error"
                             " FROM outbox_failed ORDER BY failed_ms DESC, id DESC LIMIT ?", (limit,)).fetchall()
        names = ("id", "receiver", "key", "kind", "payload", "created_ms", "failed_ms", "attempts", "error")
        return [{**dict(zip(names, r, strict=True)), "payload": json.loads(r[4])} for r in rows]

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Drop given-up items older than ``keep_ms`` and delivered keys older than
        ``max(keep_ms, DELIVERED_KEEP_MS)``; the number of rows dropped."""
        with self._conn.write("prune outbox") as c:
            n = c.execute("DELETE FROM outbox_failed WHERE failed_ms < ?", (now_ms - keep_ms,)).rowcount
            n += c.execute("DELETE FROM delivered WHERE delivered_ms < ?",
                           (now_ms - max(keep_ms, DELIVERED_KEEP_MS),)).rowcount
        return int(n)
