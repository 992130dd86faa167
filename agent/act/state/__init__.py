"""The agent's durable state: one SQLite file (WAL) that survives a crash or a restart.

:class:`StateDB` opens the file (:mod:`~agent.act.state.connection`: pragmas, schema, nested
transactions, errors as :class:`~agent.errors.StateError`) and gives each concern its own class
over that one connection, so a dispatcher round that touches several of them still commits once:

* ``db.outbox`` (:class:`~agent.act.state.outbox.Outbox`): queued notifications, delivered keys
  (a retry after a crash is refused), given-up items;
* ``db.alert_states`` (:class:`~agent.act.state.alerts.AlertStates`): each rule's alerts, restored
  on start like Prometheus' ``ALERTS_FOR_STATE``;
* ``db.nflog`` (:class:`~agent.act.state.alerts.NotificationLog`): what was sent per alert group,
  and where (Slack message references);
* ``db.cooldowns`` (:class:`~agent.act.state.alerts.Cooldowns`): scaling state per service;
* ``db.silences`` and ``db.incidents`` (:mod:`~agent.act.state.history`);
* ``db.intake`` (:class:`~agent.act.state.intake.Intake`): alerts an Alertmanager posted to the
  agent's webhook, and the inbox of those not processed yet.
* ``db.forwarded`` (:class:`~agent.act.state.forwarded.ForwardedKeys`): the keys of findings node
  agents forwarded, each recorded once;
* ``db.remote_write`` (:class:`~agent.act.state.remote_write.RemoteWriteBatches`): samples waiting
  for a remote-write endpoint to acknowledge them.

The records these return and the table schema are in :mod:`agent.act.state.records`; they are
re-exported here, so ``from agent.act.state import Silence`` works.

From an event loop, state work goes through :meth:`StateDB.run` (one writer thread: no query,
commit or ``fsync`` on the loop); without one (the CLI, tests) the methods are called directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

import structlog

from agent.act.state.alerts import AlertStates, Cooldowns, NotificationLog
from agent.act.state.connection import Connection
from agent.act.state.forwarded import ForwardedKeys
from agent.act.state.history import Incidents, Silences
from agent.act.state.intake import Intake
from agent.act.state.outbox import DELIVERED_KEEP_MS, Outbox
from agent.act.state.records import (
    SCHEMA_VERSION,
    Incident,
    IncidentEvent,
    IntakeAlert,
    NflogEntry,
    OutboxItem,
    RemoteWriteBatch,
    ScaleState,
    Silence,
    iso_ms,
)
from agent.act.state.remote_write import RemoteWriteBatches

__all__ = [
    "DELIVERED_KEEP_MS", "SCHEMA_VERSION", "Incident", "IncidentEvent", "IntakeAlert", "NflogEntry", "OutboxItem",
    "RemoteWriteBatch", "ScaleState", "Silence", "StateDB", "iso_ms",
]

log = structlog.get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class StateDB:
    """The state database: one connection, one object per concern (see the module docstring)."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000) -> None:
        self._conn = Connection(path, busy_timeout_ms=busy_timeout_ms)
        self.path = self._conn.path
        self.outbox = Outbox(self._conn)
        self.alert_states = AlertStates(self._conn)
        self.nflog = NotificationLog(self._conn)
        self.cooldowns = Cooldowns(self._conn)
        self.silences = Silences(self._conn)
        self.incidents = Incidents(self._conn)
        self.intake = Intake(self._conn)
        self.forwarded = ForwardedKeys(self._conn)
        self.remote_write = RemoteWriteBatches(self._conn)

    def close(self) -> None:
        self._conn.close()

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run state work on the state-writer thread, never on the event loop
        (see :mod:`agent.act.state.connection`)."""
        return await self._conn.run(fn, *args, **kwargs)

    async def aclose(self) -> None:
        """Close from the event loop: on the writer thread, which then stops."""
        await self._conn.aclose()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes to any of the concerns inside commit together or not at all; nests."""
        with self._conn.transaction():
            yield

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Drop resolved incidents, failed items, expired silences and resolved intake alerts older than
        ``keep_ms``, and delivered and forwarded keys older than ``max(keep_ms, DELIVERED_KEEP_MS)``, in
        one transaction.
        Returns the rows dropped."""
        with self.transaction():
            n = self.incidents.prune(now_ms=now_ms, keep_ms=keep_ms)
            n += self.outbox.prune(now_ms=now_ms, keep_ms=keep_ms)
            n += self.silences.prune(now_ms=now_ms, keep_ms=keep_ms)
            n += self.intake.prune(now_ms=now_ms, keep_ms=keep_ms)
            n += self.forwarded.prune(now_ms=now_ms, keep_ms=max(keep_ms, DELIVERED_KEEP_MS))
        if n:
            log.info("state pruned", rows=n, keep_ms=keep_ms)
        return n
