"""Test helper: state database files that sre-agent must refuse at start-up.

Made the way they happen, not by hand: a real :class:`~agent.act.state.StateDB` file with rows in
its tables (an outbox with undelivered notifications, scaling state), then damaged the way a failing
disk or a bad copy damages it, so the start-up check (``PRAGMA quick_check``) meets real broken pages.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.act.notification import AlertSnapshot, Notification
from agent.act.state import ScaleState, StateDB

__all__ = ["damaged_state_db", "empty_state_db", "state_db_with_rows"]


def state_db_with_rows(path: Path, rows: int = 300) -> Path:
    """A closed state database holding ``rows`` scaling states and ``rows`` queued notifications."""
    db = StateDB(path)
    alert = AlertSnapshot(labels={"alertname": "VLLMKVCacheSaturated"}, annotations={}, status="firing",
                          starts_at_ms=1)
    with db.transaction():
        for i in range(rows):
            db.cooldowns.put(ScaleState(f"service-{i:04d}-{'x' * 80}", i, i, 0, 0, 0))
            db.outbox.enqueue(Notification(key=f"k{i}", receiver="hook", kind="alerts", created_ms=1,
                                           alerts=(alert,)), now_ms=1)
    db.close()  # checkpoints the WAL: every page is in the main file
    return path


def damaged_state_db(path: Path) -> Path:
    """A real state database whose middle pages are overwritten with garbage."""
    state_db_with_rows(path)
    size = path.stat().st_size
    assert size > 64 * 1024, "the database is too small to damage in the middle"
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(b"\xde\xad\xbe\xef" * 2048)  # two pages of 4 KiB
        f.flush()
        os.fsync(f.fileno())
    return path


def empty_state_db(path: Path) -> Path:
    """A zero-byte file where the state database should be (a disk that filled up, a truncated copy)."""
    path.write_bytes(b"")
    return path
