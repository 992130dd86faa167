"""The Alertmanager intake's storage: what each Alertmanager alert was last seen as, and an inbox.

``POST /api/v1/alertmanager/webhook`` answers 2xx only once :meth:`Intake.accept` has committed;
the dispatch round then takes the inbox in order (:meth:`Intake.pending`) and deletes what it
processed (:meth:`Intake.done`) in the same transaction as what processing wrote (incidents,
scale decisions), so a crash at any point either leaves an alert in the inbox (processed after the
restart) or has processed it, never both and never half.

Two tables:

* ``intake_alerts``: per Alertmanager fingerprint, the latest ``(status, startsAt)`` and the alert.
  It decides what is a transition. Alertmanager re-sends every alert of a group on each
  ``group_interval`` change and every ``repeat_interval``, and an HA pair may both send: only a
  change of state is news. By ``(status, startsAt)`` against what is known:

  * nothing known: news;
  * a later ``startsAt``: a new episode, news (whatever its status);
  * the same ``startsAt``: news only from firing to resolved; the same status is a re-send, and
    firing after resolved is a late or reordered re-send of the episode that already ended (a
    lagging HA peer), not a new one;
  * an earlier ``startsAt``: an old episode re-sent late; ignored.

* ``intake_inbox``: the transitions accepted and not yet processed, oldest first, each with the
  status known before it (``was``: ``""`` when the alert was new), so processing knows a resolve
  of something it never saw fire.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.act.state.connection import Table
from agent.act.state.records import IntakeAlert

__all__ = ["Accepted", "InboxItem", "Intake", "is_news"]


@dataclass(frozen=True)
class Accepted:
    """What :meth:`Intake.accept` did with a webhook's alerts."""

    new: int  # transitions put in the inbox
    duplicates: int  # re-sends of what was known


@dataclass(frozen=True)
class InboxItem:
    """One accepted transition waiting to be processed."""

    id: int
    alert: IntakeAlert
    was: str  # the status known before ("" for an alert seen for the first time)


def is_news(known: tuple[str, int] | None, status: str, starts_ms: int) -> bool:
    """Whether ``(status, starts_ms)`` is a transition after ``known`` (see the module docstring)."""
    if known is None:
        return True
    known_status, known_starts = known
    if starts_ms != known_starts:
        return starts_ms > known_starts
    return known_status == "firing" and status == "resolved"


class Intake(Table):
    """The ``intake_alerts`` and ``intake_inbox`` tables."""

    def accept(self, alerts: Iterable[IntakeAlert], *, now_ms: int) -> Accepted:
        """Record the transitions among ``alerts`` in the inbox, all in one transaction."""
        new = dup = 0
        with self._conn.write("accept alertmanager webhook") as c:
            for a in alerts:
                row = c.execute("SELECT status, starts_ms FROM intake_alerts WHERE fingerprint = ?",
                                (a.fingerprint,)).fetchone()
                known = None if row is None else (str(row[0]), int(row[1]))
                if not is_news(known, a.status, a.starts_ms):
                    dup += 1
                    if known == (a.status, a.starts_ms):  # still what Alertmanager says: seen now
                        c.execute("UPDATE intake_alerts SET received_ms = ? WHERE fingerprint = ?",
                                  (now_ms, a.fingerprint))
                    continue
                text = a.to_json()
                c.execute("INSERT OR REPLACE INTO intake_alerts VALUES (?, ?, ?, ?, ?)",
                          (a.fingerprint, a.status, a.starts_ms, text, now_ms))
                c.execute("INSERT INTO intake_inbox (fingerprint, was, alert, received_ms) VALUES (?, ?, ?, ?)",
                          (a.fingerprint, "" if known is None else known[0], text, now_ms))
                new += 1
        return Accepted(new, dup)

    def pending(self, limit: int = 1000) -> list[InboxItem]:
        """The oldest ``limit`` transitions not yet processed, oldest first."""
        with self._conn.guard("read intake inbox") as c:
            rows = c.execute("SELECT id, alert, was FROM intake_inbox ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [InboxItem(int(r[0]), IntakeAlert.from_json(r[1]), str(r[2])) for r in rows]

    def done(self, ids: Sequence[int]) -> None:
        """Drop processed transitions (in the caller's transaction, with what processing wrote)."""
        with self._conn.write("drop processed intake") as c:
            c.executemany("DELETE FROM intake_inbox WHERE id = ?", [(i,) for i in ids])

    def depth(self) -> int:
        with self._conn.guard("count intake inbox") as c:
            return int(c.execute("SELECT count(*) FROM intake_inbox").fetchone()[0])

    def current(self, *, now_ms: int, resolved_keep_ms: int) -> list[IntakeAlert]:
        """Firing alerts, and those resolved within ``resolved_keep_ms`` (their resolve may not have
        been reported yet): what the dispatcher's aggregation groups hold after a restart."""
        with self._conn.guard("read intake alerts") as c:
            rows = c.execute("SELECT alert, status FROM intake_alerts ORDER BY fingerprint").fetchall()
        out = []
        for text, status in rows:
            a = IntakeAlert.from_json(text)
            if status == "firing" or now_ms - a.ends_ms <= resolved_keep_ms:
                out.append(a)
        return out

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Forget resolved alerts last received more than ``keep_ms`` ago; the number dropped. A re-send
        after that is taken as news again, so ``keep_ms`` must outlast Alertmanager's own retention of
        resolved alerts (``--data.retention``, 120 h by default)."""
        with self._conn.write("prune intake alerts") as c:
            return int(c.execute("DELETE FROM intake_alerts WHERE status = 'resolved' AND received_ms < ?",
                                 (now_ms - keep_ms,)).rowcount)
