"""Keys of the findings node agents forwarded (``POST /api/v1/findings``): each is recorded once.

A node agent's outbox retries a finding until the central agent acknowledged it, with the same key
every time (:mod:`agent.act.sinks.forward`). A retry whose first attempt did arrive (the answer was
lost, the node agent restarted mid-send) must not add the finding to the incident again: the key is
inserted in the same transaction as the incident event and the notifications it causes, so a key
here means the finding was recorded, and no key means nothing of it was.
"""

from __future__ import annotations

from agent.act.state.connection import Table

__all__ = ["ForwardedKeys"]


class ForwardedKeys(Table):
    """The ``forwarded_findings`` table: key -> the incident fingerprint it went to, and when."""

    def add(self, key: str, *, fingerprint: str, now_ms: int) -> bool:
        """Record ``key``; False when it was recorded before (a retry: do nothing more)."""
        with self._conn.write("record forwarded finding") as c:
            cur = c.execute("INSERT OR IGNORE INTO forwarded_findings (key, fingerprint, received_ms)"
                            " VALUES (?, ?, ?)", (key, fingerprint, now_ms))
            return cur.rowcount == 1

    def get(self, key: str) -> str | None:
        """The fingerprint a recorded key went to, else None."""
        with self._conn.guard("read forwarded finding") as c:
            row = c.execute("SELECT fingerprint FROM forwarded_findings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Forget keys older than ``keep_ms`` (a node agent gives a finding up after
        ``notify.give_up_after``, a day by default: keep longer than that)."""
        with self._conn.write("prune forwarded findings") as c:
            return int(c.execute("DELETE FROM forwarded_findings WHERE received_ms < ?",
                                 (now_ms - keep_ms,)).rowcount)
