"""What the alerting path remembers between evaluations: alert state, the notification log and
Slack message references, and scaling cooldowns.

* :class:`AlertStates`: each alerting rule's alerts after its last evaluation (Prometheus'
  ``ALERTS_FOR_STATE``), so a restart resumes pending alerts and keeps firing ones firing.
* :class:`NotificationLog`: per (receiver, aggregation group), what was last sent (Alertmanager's
  ``nflog``, which its de-duplication reads) and where a receiver posted it (a Slack channel and
  message ``ts``, so a later notification updates that message in place).
* :class:`Cooldowns`: per scaling service, the replicas and the last scale-out/in times.
"""

from __future__ import annotations

import json
from typing import Any

from agent.act.state.connection import Table, dumps
from agent.act.state.records import NflogEntry, ScaleState

__all__ = ["AlertStates", "Cooldowns", "NotificationLog"]


class AlertStates(Table):
    """The ``rule_alerts`` and ``rule_eval`` tables."""

    def save(self, rule_key: str, alerts: list[dict[str, Any]], eval_ms: int) -> None:
        """Replace one rule's alerts with those of its evaluation at ``eval_ms``."""
        with self._conn.write("save rule alerts") as c:
            c.execute("DELETE FROM rule_alerts WHERE rule_key = ?", (rule_key,))
            c.executemany("INSERT INTO rule_alerts (rule_key, idx, alert) VALUES (?, ?, ?)",
                          [(rule_key, i, dumps(a)) for i, a in enumerate(alerts)])
            c.execute("INSERT OR REPLACE INTO rule_eval (rule_key, eval_ms) VALUES (?, ?)", (rule_key, eval_ms))

    def load(self) -> dict[str, tuple[int, list[dict[str, Any]]]]:
        """Every rule's last evaluation time and alerts, by rule key."""
        with self._conn.guard("load rule alerts") as c:
            evals = c.execute("SELECT rule_key, eval_ms FROM rule_eval").fetchall()
            rows = c.execute("SELECT rule_key, alert FROM rule_alerts ORDER BY rule_key, idx").fetchall()
        out: dict[str, tuple[int, list[dict[str, Any]]]] = {k: (ms, []) for k, ms in evals}
        for key, alert in rows:
            out.setdefault(key, (0, []))[1].append(json.loads(alert))
        return out


class NotificationLog(Table):
    """The ``nflog`` and ``refs`` tables; also the :class:`~agent.act.sinks.MessageRefs` a Slack sink uses."""

    def get(self, receiver: str, group_key: str) -> NflogEntry | None:
        with self._conn.guard("get nflog") as c:
            row = c.execute("SELECT firing, resolved, sent_ms FROM nflog WHERE receiver = ? AND group_key = ?",
                            (receiver, group_key)).fetchone()
        return None if row is None else NflogEntry(frozenset(json.loads(row[0])), frozenset(json.loads(row[1])), row[2])

    def put(self, receiver: str, group_key: str, entry: NflogEntry) -> None:
        with self._conn.write("put nflog") as c:
            c.execute("INSERT OR REPLACE INTO nflog VALUES (?, ?, ?, ?, ?)", (
                receiver, group_key, dumps(sorted(entry.firing)), dumps(sorted(entry.resolved)), entry.sent_ms))

    def delete(self, receiver: str, group_key: str) -> None:
        with self._conn.write("delete nflog") as c:
            c.execute("DELETE FROM nflog WHERE receiver = ? AND group_key = ?", (receiver, group_key))

    def get_ref(self, receiver: str, group_key: str) -> tuple[str, str] | None:
        with self._conn.guard("get message ref") as c:
            row = c.execute("SELECT channel, ts FROM refs WHERE receiver = ? AND group_key = ?",
                            (receiver, group_key)).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def put_ref(self, receiver: str, group_key: str, channel: str, ts: str) -> None:
        with self._conn.write("put message ref") as c:
            c.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)", (receiver, group_key, channel, ts))

    def delete_ref(self, receiver: str, group_key: str) -> None:
        with self._conn.write("delete message ref") as c:
            c.execute("DELETE FROM refs WHERE receiver = ? AND group_key = ?", (receiver, group_key))


class Cooldowns(Table):
    """The ``scale`` table: one :class:`~agent.act.state.records.ScaleState` per service."""

    def get(self, service: str) -> ScaleState | None:
        with self._conn.guard("get scale state") as c:
            row = c.execute("SELECT * FROM scale WHERE service = ?", (service,)).fetchone()
        return None if row is None else ScaleState(*row)

    def put(self, state: ScaleState) -> None:
        with self._conn.write("put scale state") as c:
            c.execute("INSERT OR REPLACE INTO scale VALUES (?, ?, ?, ?, ?, ?)", (
                state.service, state.replicas, state.desired, state.last_out_ms, state.last_in_ms,
                state.last_unhealthy_ms))
