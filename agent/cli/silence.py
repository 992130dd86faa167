"""``sre-agent silence`` and ``sre-agent incidents``: the operator's side of the state database.

Both work directly on the state file (``state.path`` of ``--config``, or ``--db``), so
they work whether the daemon runs or not: SQLite's WAL mode and busy timeout let this
process write silences while the daemon reads them. Silences use Alertmanager's
matcher syntax and ``amtool``'s verbs (add, list/query, expire); the daemon's router
reads them on its next dispatch. Times are shown in UTC.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from agent.act.state import Incident, IncidentEvent, StateDB
from agent.act.state.history import MAX_SILENCE_MS
from agent.app.logs import configure_logging
from agent.cli.argtypes import integer
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.config import format_duration, load_config, parse_duration
from agent.textsafe import escape

__all__ = ["add_parsers", "format_event", "utc"]

Clock = Callable[[], float]

_SILENCE_HELP = """\
Silence alerts: while a silence is active, alerts whose labels match all of its
matchers are not notified (actions such as scale-out still run). Matchers use
Alertmanager's syntax; regular expressions are anchored at both ends.

examples:
  sre-agent silence add 'alertname="VLLMKVCacheSaturated"' 'instance=~"gpu-1.*"' \\
      --duration 2h --comment "resizing max-num-seqs"
  sre-agent silence list
  sre-agent silence expire 0b6ee4d0-1f8c-4bd2-9d0c-5b6f3c1d2e4f
"""

_ADD_HELP = """\
Add a silence and print its ID. Each MATCHER is name="value", name!="value",
name=~"regex" or name!~"regex" (quote it for the shell); all must match. At least
one matcher must not match an empty label, so a silence can never mute everything.

example:
  sre-agent silence add 'alertname="GPUMemoryNearFull"' 'Hostname="node-3"' \\
      --duration 90m --comment "node-3 being drained (JIRA-1234)"
"""

_INCIDENTS_HELP = """\
Show recent incidents (one per alert firing, from fired to resolved), newest first,
each with its timeline: notifications sent or failed, actions taken (scale-out,
dry-run, refused by cooldown) and diagnosis findings.

examples:
  sre-agent incidents --limit 10
  sre-agent incidents --open --json | jq '.[].alertname'
"""


def add_parsers(sub: Any) -> None:
    """Register ``silence`` (add, list, expire) and ``incidents`` on the CLI's sub-parsers."""
    raw = argparse.RawDescriptionHelpFormatter
    silence = sub.add_parser("silence", help="add, list and expire alert silences", description=_SILENCE_HELP,
                             formatter_class=raw)
    ssub = silence.add_subparsers(dest="silence_command", required=True, metavar="ACTION")

    add = ssub.add_parser("add", help="add a silence and print its ID", description=_ADD_HELP, formatter_class=raw)
    add.add_argument("matchers", nargs="+", metavar="MATCHER", help='e.g. alertname="VLLMKVCacheSaturated"')
    add.add_argument("--duration", "-d", default="1h", help="how long it lasts, Prometheus units (default %(default)s)")
    add.add_argument("--start", help="ISO 8601 start time, UTC unless it has an offset (default: now)")
    add.add_argument("--comment", default="", help="why (recommended: a ticket or the change being made)")
    add.add_argument("--author", help="who (default: the current user)")
    _db_flags(add)
    add.set_defaults(func=_silence_add)

    lst = ssub.add_parser("list", help="list active and pending silences", formatter_class=raw,
                          description="List active and pending silences (with --all, expired ones too).\n\n"
                                      "example:\n  sre-agent silence list --all")
    lst.add_argument("--all", action="store_true", help="include expired silences")
    lst.add_argument("--json", action="store_true", help="print Alertmanager-shaped JSON")
    _db_flags(lst)
    lst.set_defaults(func=_silence_list)

    exp = ssub.add_parser("expire", help="end silences now", formatter_class=raw,
                          description="End the given silences now. Exit 1 if an ID is unknown or already "
                                      "expired (the others are still expired).\n\n"
                                      "example:\n  sre-agent silence expire 0b6ee4d0-1f8c-4bd2-9d0c-5b6f3c1d2e4f")
    exp.add_argument("ids", nargs="+", metavar="ID")
    _db_flags(exp)
    exp.set_defaults(func=_silence_expire)

    inc = sub.add_parser("incidents", help="show recent incidents and what the agent did about them",
                         description=_INCIDENTS_HELP, formatter_class=raw)
    inc.add_argument("--limit", "-n", type=integer(1), default=20, help="how many (default %(default)s)")
    inc.add_argument("--open", action="store_true", help="only incidents still firing")
    inc.add_argument("--json", action="store_true", help="print the incidents as JSON")
    _db_flags(inc)
    inc.set_defaults(func=_incidents)


def _db_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--config", "-c", help="agent config file; its state.path is the database")
    g.add_argument("--db", help="state database file (default: sre-agent.db, the config default)")


def _open_db(args: argparse.Namespace) -> StateDB:
    # stdout is the command's output (an ID, a table, JSON): logs go to the process's stderr,
    # warnings only (sys.__stderr__, not sys.stderr, which a test harness may swap and close).
    configure_logging("console", "warning", stream=sys.__stderr__ or sys.stderr)
    if args.config is not None:
        return StateDB(load_config(args.config, os.environ).state.path)
    return StateDB(args.db or "sre-agent.db")


def _now_ms(clock: Clock) -> int:
    return int(clock() * 1000)


def utc(ms: int) -> str:
    """Unix ms -> ``YYYY-MM-DD HH:MM:SS`` in UTC."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns; every cell escaped (:func:`agent.textsafe.escape`): an alertname or a comment from
    outside cannot add a row or drive the terminal."""
    rows = [[escape(str(c)) for c in r] for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def _silence_add(args: argparse.Namespace, *, clock: Clock = time.time) -> int:
    try:
        seconds = parse_duration(args.duration)
        if seconds * 1000 > MAX_SILENCE_MS:
            raise ValueError(f"--duration {args.duration!r} is longer than the 10 years a silence may last")
        start_ms = _parse_start(args.start) if args.start else _now_ms(clock)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    db = _open_db(args)
    try:
        s = db.silences.add(args.matchers, starts_ms=start_ms, ends_ms=start_ms + int(seconds * 1000),
                           created_by=args.author or _user(), comment=args.comment)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        db.close()
    print(s.id)
    return EXIT_OK


def _parse_start(text: str) -> int:
    try:
        t = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"--start: not an ISO 8601 time: {text!r} (e.g. 2025-01-31T14:00:00Z)") from exc
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "unknown"


def _silence_list(args: argparse.Namespace, *, clock: Clock = time.time) -> int:
    now = _now_ms(clock)
    db = _open_db(args)
    try:
        silences = db.silences.list(now_ms=now, include_expired=args.all)
    finally:
        db.close()
    if args.json:
        print(json.dumps([s.to_json(now) for s in silences], indent=2))
        return EXIT_OK
    rows = [[s.id, " ".join(s.matchers), utc(s.starts_ms), utc(s.ends_ms), s.state(now), s.created_by, s.comment]
            for s in silences]
    print("\n".join(_table(["ID", "MATCHERS", "STARTS (UTC)", "ENDS (UTC)", "STATE", "CREATED BY", "COMMENT"],
                           rows)))
    return EXIT_OK


def _silence_expire(args: argparse.Namespace, *, clock: Clock = time.time) -> int:
    now = _now_ms(clock)
    db = _open_db(args)
    failed = False
    try:
        for sid in args.ids:
            if db.silences.expire(sid, now_ms=now):
                print(f"expired {sid}")
                continue
            failed = True
            known = any(s.id == sid for s in db.silences.list(now_ms=now, include_expired=True))
            print(f"error: silence {sid} is {'already expired' if known else 'unknown'}", file=sys.stderr)
    finally:
        db.close()
    return EXIT_PROBLEM if failed else EXIT_OK


def _incidents(args: argparse.Namespace, *, clock: Clock = time.time) -> int:
    now = _now_ms(clock)
    db = _open_db(args)
    try:
        incidents = db.incidents.list(limit=args.limit, open_only=args.open)
    finally:
        db.close()
    if args.json:
        print(json.dumps([i.to_json() for i in incidents], indent=2))
        return EXIT_OK
    if not incidents:
        print("no incidents" if not args.open else "no open incidents")
        return EXIT_OK
    header = ["ID", "ALERTNAME", "SEVERITY", "STARTED (UTC)", "RESOLVED (UTC)", "DURATION", "SUMMARY"]
    lines = _table(header, [_incident_row(i, now) for i in incidents])
    print(lines[0])
    for line, inc in zip(lines[1:], incidents, strict=True):
        print(line)
        for e in inc.events:
            print(f"    {utc(e.at_ms)}  {escape(format_event(e))}")
    return EXIT_OK


def _incident_row(i: Incident, now_ms: int) -> list[str]:
    end = i.resolved_ms or now_ms
    duration = format_duration(max(0, end - i.started_ms) // 1000)
    return [str(i.id), i.alertname, i.severity, utc(i.started_ms), utc(i.resolved_ms) if i.resolved_ms else "open",
            duration if i.resolved_ms else f"{duration}+", i.summary]


def format_event(e: IncidentEvent) -> str:
    """One timeline line. The detail keys documented on :class:`~agent.act.state.IncidentEvent` are
    rendered in words; anything else is shown as ``key=value``."""
    d = dict(e.detail)
    if e.kind in ("notified", "notify_failed"):
        receiver, error, status = d.pop("receiver", "?"), d.pop("error", ""), d.pop("status", "")
        d.pop("kind", None)
        verdict = "ok" if e.kind == "notified" else f"failed: {error}" if error else "failed"
        return _with_rest(f"notification  {receiver}  {verdict}" + (f" ({status})" if status else ""), d)
    if e.kind == "action":
        return _with_rest("action  " + _action_text(d), d)
    if e.kind == "finding":
        text = f"finding  {d.pop('kind', '?')}: {d.pop('summary', '')}"
        setting, value = d.pop("setting", ""), d.pop("suggested_value", "")
        if setting:
            text += f" (set {setting}={value})" if value else f" (check {setting})"
        runbook = d.pop("runbook_url", "")
        for k in ("evidence", "details", "severity", "ok", "labels"):
            d.pop(k, None)
        return _with_rest(text + (f"  runbook: {runbook}" if runbook else ""), d)
    return _with_rest(e.kind, d)


def _action_text(d: dict[str, Any]) -> str:
    """``scale_out api 2→3``, then ``(dry-run)`` or ``refused: <why>``, then the reason."""
    parts = [str(d.pop("action", "?"))]
    if "service" in d:
        parts.append(str(d.pop("service")))
    before, after = d.pop("from_replicas", None), d.pop("to_replicas", None)
    if before is not None and after is not None:
        parts.append(f"{before}→{after}")
    reason = str(d.pop("reason", ""))
    d.pop("idempotency_key", None)
    d.pop("queued", None)
    if d.pop("refused", False):
        parts.append(f"refused: {reason}" if reason else "refused")
        return " ".join(parts)
    if d.pop("dry_run", False):
        parts.append("(dry-run)")
    return " ".join(parts) + (f"  — {reason}" if reason else "")


def _with_rest(text: str, rest: dict[str, Any]) -> str:
    extra = " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(rest.items()))
    return f"{text}  {extra}" if extra else text
