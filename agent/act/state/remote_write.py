"""The remote-write queues: batches of samples waiting for their remote to acknowledge them.

One row per batch (``queue`` is the remote's name): the serialised, uncompressed ``WriteRequest``
and its sample count. A batch is written here before anything is sent and deleted only after the
remote answered 2xx (or refused it for good with a 4xx), so a restart sends what was pending and
nothing twice that was acknowledged. Several rows go out as one request by joining their bytes
(see :mod:`agent.act.remote_write.wire`). When a queue is over its capacity the oldest rows are
dropped, except the ones being sent. Sending, backoff and counting are
:mod:`agent.act.remote_write.queue`'s business; this is only the storage.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from agent.act.state.connection import Table
from agent.act.state.records import RemoteWriteBatch

__all__ = ["RemoteWriteBatches"]


class RemoteWriteBatches(Table):
    """The ``remote_write`` table."""

    def append(self, queue: str, batches: Iterable[tuple[int, bytes]], *, now_ms: int) -> int:
        """Queue ``(samples, payload)`` batches at the tail of ``queue``; the samples queued."""
        rows = [(queue, n, payload, now_ms) for n, payload in batches]
        with self._conn.write("remote write append") as c:
            c.executemany("INSERT INTO remote_write (queue, samples, payload, created_ms) VALUES (?, ?, ?, ?)", rows)
        return sum(r[1] for r in rows)

    def drop_oldest(self, queue: str, samples: int, *, keep: Collection[int] = ()) -> int:
        """Delete the oldest batches of ``queue`` until at least ``samples`` samples are gone (batches in
        ``keep``, the ones being sent, stay); the samples deleted."""
        dropped, ids = 0, []
        with self._conn.write("remote write drop") as c:
            for row_id, n in c.execute("SELECT id, samples FROM remote_write WHERE queue = ? ORDER BY id", (queue,)):
                if dropped >= samples:
                    break
                if row_id in keep:
                    continue
                ids.append((row_id,))
                dropped += n
            c.executemany("DELETE FROM remote_write WHERE id = ?", ids)
        return dropped

    def head(self, queue: str, max_samples: int) -> list[RemoteWriteBatch]:
        """The oldest batches of ``queue`` that fit in ``max_samples`` together (at least one, if any)."""
        out: list[RemoteWriteBatch] = []
        total = 0
        with self._conn.guard("remote write head") as c:
            for row in c.execute("SELECT id, samples, payload FROM remote_write WHERE queue = ? ORDER BY id",
                                 (queue,)):
                if out and total + row[1] > max_samples:
                    break
                out.append(RemoteWriteBatch(row[0], row[1], bytes(row[2])))
                total += row[1]
        return out

    def delete(self, ids: Collection[int]) -> int:
        """Remove acknowledged (or refused) batches; the samples they held (0 for ids already gone)."""
        rows = [(i,) for i in ids]
        with self._conn.write("remote write delete") as c:
            n = sum(c.execute("SELECT COALESCE(SUM(samples), 0) FROM remote_write WHERE id = ?", r).fetchone()[0]
                    for r in rows)
            c.executemany("DELETE FROM remote_write WHERE id = ?", rows)
        return int(n)

    def pending(self) -> dict[str, int]:
        """Samples waiting, per queue."""
        with self._conn.guard("remote write pending") as c:
            return {q: int(n) for q, n in c.execute("SELECT queue, SUM(samples) FROM remote_write GROUP BY queue")}

    def forget(self, keep: Collection[str]) -> dict[str, int]:
        """Delete the batches of queues no longer configured; the samples deleted, per queue."""
        gone = {q: n for q, n in self.pending().items() if q not in keep}
        with self._conn.write("remote write forget") as c:
            c.executemany("DELETE FROM remote_write WHERE queue = ?", [(q,) for q in gone])
        return gone
