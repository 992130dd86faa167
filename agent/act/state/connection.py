"""The one SQLite connection the state tables share: opening, transactions, error translation.

Why apart from the tables: every table class (:mod:`agent.act.state.outbox`,
:mod:`agent.act.state.alerts`, :mod:`agent.act.state.history`) writes through the same
connection, so that a dispatcher round that enqueues a notification and updates the
notification log commits both or neither. This module owns what they share and nothing
else: the pragmas, the schema, nested transactions (SAVEPOINTs) and the translation of
every SQLite error into a :class:`~agent.errors.StateError` naming the file and operation.

Durability: ``journal_mode=WAL`` with ``synchronous=FULL``. ``NORMAL`` would be enough to
survive a process crash, but in WAL mode it may lose the last commits on power loss, and
the outbox promises that nothing acknowledged to the caller is lost. ``busy_timeout`` lets
the ``sre-agent silence`` command write the same file while the daemon runs. One lock
serialises threads; never ``await`` inside a transaction (coroutines on one thread would
join it).

The event loop never runs a query: a commit waits for ``fsync``, which on a slow or busy disk
takes tens of milliseconds, and the loop must keep scraping and answering ``/healthz``. The
daemon hands every piece of state work to :meth:`Connection.run`, which runs it on one
thread of its own (``state-writer``); one thread also means that the work is done in the
order it was handed over, like an actor. The CLI, which has no event loop, calls the table
methods directly.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import structlog

from agent.act.state.records import SCHEMA, SCHEMA_VERSION
from agent.errors import StateError

__all__ = ["Connection", "Table", "dumps"]

log = structlog.get_logger(__name__)

#: What a start-up error about a file that cannot be trusted tells the operator to do.
_ASIDE = ("Stop sre-agent and move the file aside with its -wal and -shm files (mv {path} {path}.damaged); "
          "sre-agent then starts with a fresh one. The outbox in the old file may hold notifications that "
          "were never delivered: keep the copy and read them with sqlite3 {path}.damaged "
          "'SELECT receiver, payload FROM outbox' (or .recover) before deleting it.")

P = ParamSpec("P")
T = TypeVar("T")


def dumps(value: Any) -> str:
    """JSON for a column: sorted keys, so equal values are equal text."""
    return json.dumps(value, sort_keys=True)


class Connection:
    """The state file's connection; every method of every table joins an open :meth:`transaction`."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._depth = 0
        self._writer: ThreadPoolExecutor | None = None
        if self.path != ":memory:":
            parent = Path(self.path).resolve().parent
            if not parent.is_dir():
                raise StateError(f"state db {self.path}: directory {parent} does not exist")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise StateError(f"state db {self.path}: directory {parent} is not writable")
            if os.path.isfile(self.path) and os.path.getsize(self.path) == 0:
                raise StateError(
                    f"state db {self.path}: the file is empty (0 bytes), which sre-agent never writes (a disk that "
                    f"filled up while it was created, or a truncated copy); refusing to start from nothing in its "
                    f"place. {_ASIDE.format(path=self.path)}")
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StateError(f"state db {self.path}: open failed: {exc}") from exc
        try:
            with self.guard("open") as c:
                c.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA synchronous=FULL")
                c.execute("PRAGMA foreign_keys=ON")
            self._check_integrity()
            with self.transaction(), self.guard("create schema") as c:
                version = c.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StateError(f"state db {self.path}: schema version {version} is newer than this "
                                     f"sre-agent's ({SCHEMA_VERSION}); upgrade sre-agent")
                if version == 0 and c.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise StateError(f"state db {self.path}: the file holds tables but no sre-agent schema version "
                                     f"(PRAGMA user_version is 0): it is not a state database sre-agent wrote; "
                                     f"point state.path at another file")
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except StateError:
            self.close()
            raise

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` (the b-tree pages, not the index contents: milliseconds for a state
        file): a damaged file is a start-up error, never an agent whose every dispatch round fails."""
        with self._lock:
            if self._conn is None:
                raise StateError(f"state db {self.path}: integrity check: the database is closed")
            try:
                problems = [str(r[0]) for r in self._conn.execute("PRAGMA quick_check(5)").fetchall()]
            except sqlite3.DatabaseError as exc:
                raise StateError(f"state db {self.path}: the database is damaged ({exc}). "
                                 f"{_ASIDE.format(path=self.path)}") from exc
        if problems != ["ok"]:
            raise StateError(f"state db {self.path}: the database is damaged (quick_check: {'; '.join(problems)}). "
                             f"{_ASIDE.format(path=self.path)}")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the state-writer thread and return its result.

        Everything ``fn`` does with the database (reads too: they would wait for a commit's
        ``fsync`` under the lock) happens there, in the order calls were made.
        """
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-writer")
        return await asyncio.get_running_loop().run_in_executor(self._writer, functools.partial(fn, *args, **kwargs))

    async def aclose(self) -> None:
        """Close the connection on the writer thread (the last WAL checkpoint writes), then stop it."""
        if self._writer is None:
            self.close()
            return
        await self.run(self.close)
        self._writer.shutdown(wait=True)
        self._writer = None

    @contextmanager
    def guard(self, op: str) -> Iterator[sqlite3.Connection]:
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
            with self.guard("begin transaction") as c:
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
                with self.guard("commit") as c:
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
    def write(self, op: str) -> Iterator[sqlite3.Connection]:
        """The connection inside a transaction of its own (or the caller's open one)."""
        with self.transaction(), self.guard(op) as c:
            yield c


class Table:
    """A concern's queries over the shared :class:`Connection`."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    @property
    def path(self) -> str:
        return self._conn.path
