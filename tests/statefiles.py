"""Test helper: state database files that sre-agent must refuse at start-up, and one that stops taking writes.

Made the way they happen, not by hand: a real :class:`~agent.act.state.StateDB` file with rows in
its tables (an outbox with undelivered notifications, scaling state), then damaged the way a failing
disk or a bad copy damages it, so the start-up check (``PRAGMA quick_check``) meets real broken pages.
:func:`full_disk` makes an open database's commits fail with SQLite's own ``SQLITE_FULL`` error, for
the tests that cannot fill a real file system (no root, no tmpfs).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from agent.act.notification import AlertSnapshot, Notification
from agent.act.state import ScaleState, StateDB

__all__ = ["FULL", "FullDisk", "damaged_state_db", "empty_state_db", "full_disk", "state_db_with_rows"]

FULL = "database or disk is full"  # SQLite's message for SQLITE_FULL


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


class FullDisk:
    """A sqlite3 connection whose commits fail as on a full disk while :attr:`full` is set.

    Everything else goes to the real connection, so what a failed commit leaves behind (the rollback,
    the state of the file) is SQLite's own.
    """

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.full = False
        self.refused = 0

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if self.full and sql.strip().upper() == "COMMIT":
            self.refused += 1
            raise sqlite3.OperationalError(FULL)
        return self.real.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self.real.executemany(sql, rows)

    def rollback(self) -> None:
        self.real.rollback()

    def close(self) -> None:
        self.real.close()

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction


def full_disk(db: StateDB) -> FullDisk:
    """Put :class:`FullDisk` under ``db``'s connection (call it on the writer thread if one runs)."""
    disk = FullDisk(db._conn._conn)  # type: ignore[arg-type]
    db._conn._conn = disk  # type: ignore[assignment]
    return disk
