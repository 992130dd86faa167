"""What operators see and set: silences and the incident log.

* :class:`Silences`: Alertmanager-style silences (matchers, a time range, who and why), written by
  the CLI or the HTTP API and read by the dispatcher every round.
* :class:`Incidents`: one incident per alert firing (or per finding without an alert), with its
  timeline: fired, notified, actions, findings, resolved.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

import structlog

from agent.act.state.connection import Table, dumps
from agent.act.state.records import Incident, IncidentEvent, Silence, iso_ms
from agent.matchers import parse_matcher

__all__ = ["MAX_SILENCE_MS", "Incidents", "Silences"]

log = structlog.get_logger(__name__)

#: The longest silence the API and the CLI create: ten years; longer is a mistake (``99999999999h``).
MAX_SILENCE_MS = 10 * 366 * 86_400_000
#: Times the table stores: from 1970 to the end of year 9999, the range RFC 3339 can write.
_LAST_MS = 253_402_300_799_999
MAX_MATCHERS = 64
MAX_MATCHER_CHARS = 1024


class Silences(Table):
    """The ``silences`` table."""

    def add(self, matchers: list[str], *, starts_ms: int, ends_ms: int, created_by: str, comment: str) -> Silence:
        """Store a silence; ``ValueError`` (with the reason) for a bad matcher or time range."""
        if len(matchers) > MAX_MATCHERS:
            raise ValueError(f"a silence takes at most {MAX_MATCHERS} matchers (got {len(matchers)})")
        for t in matchers:
            if len(t) > MAX_MATCHER_CHARS:
                raise ValueError(f"matcher too long ({len(t)} characters; at most {MAX_MATCHER_CHARS}): {t[:40]!r}...")
        try:
            parsed = [parse_matcher(t) for t in matchers]
        except RecursionError as exc:
            raise ValueError("a matcher's regular expression is nested too deeply") from exc
        if not parsed:
            raise ValueError("a silence needs at least one matcher")
        if all(m.matches({}) for m in parsed):
            raise ValueError("at least one matcher must not match the empty string (it would silence everything)")
        if not (0 <= starts_ms <= _LAST_MS and 0 <= ends_ms <= _LAST_MS):
            raise ValueError("a silence must start and end between 1970 and the end of year 9999")
        if ends_ms <= starts_ms:
            raise ValueError(f"the silence ends ({iso_ms(ends_ms)}) before it starts ({iso_ms(starts_ms)})")
        s = Silence(str(uuid.uuid4()), [str(m) for m in parsed], starts_ms, ends_ms, created_by, comment)
        with self._conn.write("add silence") as c:
            c.execute("INSERT INTO silences VALUES (?, ?, ?, ?, ?, ?)",
                      (s.id, dumps(s.matchers), s.starts_ms, s.ends_ms, s.created_by, s.comment))
        log.debug("silence added", silence_id=s.id, matchers=s.matchers, created_by=created_by)
        return s

    def expire(self, silence_id: str, *, now_ms: int) -> bool:
        """End a silence now (a pending one also starts now); False if unknown or already expired."""
        with self._conn.write("expire silence") as c:
            cur = c.execute("UPDATE silences SET starts_ms = MIN(starts_ms, ?), ends_ms = ?"
                            " WHERE id = ? AND ends_ms > ?", (now_ms, now_ms, silence_id, now_ms))
            return cur.rowcount == 1

    def list(self, *, now_ms: int, include_expired: bool = False) -> list[Silence]:
        """Active and pending silences (and expired ones on request), by start time."""
        with self._conn.guard("list silences") as c:
            rows = c.execute("SELECT * FROM silences WHERE ends_ms > ? OR ? ORDER BY starts_ms, id",
                             (now_ms, include_expired)).fetchall()
        return [Silence(r[0], json.loads(r[1]), r[2], r[3], r[4], r[5]) for r in rows]

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Drop silences that ended more than ``keep_ms`` ago; the number dropped."""
        with self._conn.write("prune silences") as c:
            return int(c.execute("DELETE FROM silences WHERE ends_ms < ?", (now_ms - keep_ms,)).rowcount)


class Incidents(Table):
    """The ``incidents`` and ``incident_events`` tables."""

    def open(self, *, fingerprint: str, alertname: str, labels: dict[str, str], severity: str,
             summary: str, started_ms: int) -> int:
        """The open incident of this alert, else a new one."""
        with self._conn.write("open incident") as c:
            row = c.execute("SELECT id FROM incidents WHERE fingerprint = ? AND resolved_ms = 0 ORDER BY id DESC",
                            (fingerprint,)).fetchone()
            if row is not None:
                return int(row[0])
            cur = c.execute("INSERT INTO incidents (fingerprint, alertname, labels, severity, summary, started_ms)"
                            " VALUES (?, ?, ?, ?, ?, ?)",
                            (fingerprint, alertname, dumps(labels), severity, summary, started_ms))
            return int(cur.lastrowid or 0)

    def resolve(self, fingerprint: str, *, resolved_ms: int) -> None:
        """Close this alert's open incident; nothing open: no-op."""
        with self._conn.write("resolve incident") as c:
            c.execute("UPDATE incidents SET resolved_ms = ? WHERE fingerprint = ? AND resolved_ms = 0",
                      (max(resolved_ms, 1), fingerprint))  # 0 means open

    def add_event(self, fingerprint: str, *, at_ms: int, kind: str, detail: dict[str, Any]) -> None:
        """Attach to the open incident of the alert, else its latest; no incident at all: ignored."""
        with self._conn.write("add incident event") as c:
            row = c.execute("SELECT id FROM incidents WHERE fingerprint = ? ORDER BY resolved_ms = 0 DESC, id DESC",
                            (fingerprint,)).fetchone()
            if row is None:
                log.debug("incident event without incident", fingerprint=fingerprint, kind=kind)
                return
            c.execute("INSERT INTO incident_events (incident_id, at_ms, kind, detail) VALUES (?, ?, ?, ?)",
                      (row[0], at_ms, kind, dumps(detail)))

    def list(self, *, limit: int = 50, open_only: bool = False) -> list[Incident]:
        """Newest first, each with its events in time order."""
        with self._conn.guard("list incidents") as c:
            rows = c.execute("SELECT * FROM incidents WHERE resolved_ms = 0 OR NOT ?"
                             " ORDER BY started_ms DESC, id DESC LIMIT ?", (open_only, limit)).fetchall()
            events: dict[int, list[IncidentEvent]] = {r[0]: [] for r in rows}
            marks = ",".join("?" * len(events))
            for inc, at, kind, detail in c.execute(
                    f"SELECT incident_id, at_ms, kind, detail FROM incident_events WHERE incident_id IN ({marks})"  # noqa: S608
                    " ORDER BY at_ms, id", list(events)).fetchall():
                events[inc].append(IncidentEvent(at, kind, json.loads(detail)))
        return [Incident(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], events[r[0]]) for r in rows]

    def get(self, incident_id: int) -> Incident | None:
        """One incident with its events in time order (the triage report's input), None if unknown."""
        with self._conn.guard("read incident") as c:
            r = c.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if r is None:
                return None
            rows = c.execute("SELECT at_ms, kind, detail FROM incident_events WHERE incident_id = ?"
                             " ORDER BY at_ms, id", (incident_id,)).fetchall()
        events = [IncidentEvent(at, kind, json.loads(detail)) for at, kind, detail in rows]
        return Incident(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], events)

    def latest_id(self) -> int | None:
        """The newest incident's id (by start time), None when there is none."""
        with self._conn.guard("read incident") as c:
            row = c.execute("SELECT id FROM incidents ORDER BY started_ms DESC, id DESC LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def current_ids(self, fingerprints: Iterable[str]) -> dict[str, int]:
        """Each fingerprint's open incident, else its latest (where a notification's alerts are recorded)."""
        out: dict[str, int] = {}
        with self._conn.guard("read incident") as c:
            for fp in fingerprints:
                row = c.execute("SELECT id FROM incidents WHERE fingerprint = ? ORDER BY resolved_ms = 0 DESC,"
                                " id DESC LIMIT 1", (fp,)).fetchone()
                if row is not None:
                    out[fp] = int(row[0])
        return out

    def prune(self, *, now_ms: int, keep_ms: int) -> int:
        """Drop incidents resolved more than ``keep_ms`` ago, with their events; the number dropped."""
        cutoff = now_ms - keep_ms
        with self._conn.write("prune incidents") as c:
            c.execute("DELETE FROM incident_events WHERE incident_id IN"
                      " (SELECT id FROM incidents WHERE resolved_ms != 0 AND resolved_ms < ?)", (cutoff,))
            return int(c.execute("DELETE FROM incidents WHERE resolved_ms != 0 AND resolved_ms < ?",
                                 (cutoff,)).rowcount)
