"""``sre-agent triage``: one incident's triage report (timeline, rule, plots, findings, summary).

Where the report's parts come from, decided so it works when it is needed most (the agent just
paged, or is itself in trouble):

* **the facts** (the incident, its timeline, notifications, actions, findings, silences) are in the
  agent's state database, which this command opens itself (SQLite WAL: it reads while the daemon
  writes), and **the rule** is in the rule files of the config;
* **the series** for the plots: in Prometheus mode (``source.type: prometheus``) the command asks
  the source itself with range queries (:mod:`agent.promql.history`), so the report needs no running
  agent; in embedded mode the series live only in the running agent's memory, so the command asks
  the running agent for the whole report (``GET /incidents/{id}``, at ``--agent`` or the config's
  ``server.external_url`` or ``server.listen``). If the agent does not answer, the report is built
  from the state database without plots, and says why.

``--agent URL`` always asks that agent. Exit 0 with the report written, 2 for bad input or an
incident that does not exist (the message says which), 1 when the agent answered an error. In
Prometheus mode a plot whose range queries failed (no answer in time, a malformed or oversized
answer) still leaves the report written, with the reason on the plot; stderr then lists the reasons
and the exit is 2, so a script knows the report is incomplete.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests

from agent.act.state import StateDB
from agent.app.logs import configure_logging
from agent.app.rulefiles import rule_paths, rule_selector
from agent.app.triage import FORMATS, build, render
from agent.app.triage.facts import read_state
from agent.app.triage.series import remote_query
from agent.cli.argtypes import integer
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.config import Config, load_config
from agent.errors import AgentError, NotFoundError
from agent.promql.history import RemoteHistory
from agent.rules.files import GroupSpec, load_rule_files, parametrize
from agent.textsafe import escape_lines

__all__ = ["add_parser", "run"]

_HELP = """\
Write one incident's triage report: its timeline (pending, firing, each notification
per receiver with its outcome and retries, scale actions, findings, silences, resolved),
the alert's rule and threshold, plots of the firing series and its context (KV cache,
waiting vs running, TTFT p99, generation throughput, GPU memory), the findings with
their runbooks, and a summary. HTML is one self-contained file (plots embedded).

Where it reads: the incident from the state database (state.path of --config, or --db);
the rule from the config's rule files; the plotted series from the source with range
queries in Prometheus mode, and from the running agent in embedded mode, where the
series live in its memory (the whole report is then the agent's GET /incidents/ID).
Without a running agent in embedded mode the report has no plots and says so.
Exit 2 when a plot's range queries failed in Prometheus mode (the report is still
written; stderr lists the reasons).

examples:
  sre-agent triage --latest --config agent.yaml --out report.html
  sre-agent triage 42 --config agent.yaml --format md
  sre-agent triage 42 --agent http://sre-agent:9400 --format json | jq .summary
"""
_TIMEOUT_S = 60.0  # a report with six plots takes about a second; a loaded agent may take longer


def add_parser(sub: Any) -> None:
    p = sub.add_parser("triage", help="write an incident's triage report (HTML, Markdown or JSON)",
                       description=_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("incident", nargs="?", type=integer(1), metavar="INCIDENT_ID",
                       help="the incident's id (sre-agent incidents lists them)")
    which.add_argument("--latest", action="store_true", help="the newest incident")
    p.add_argument("--format", "-f", choices=FORMATS, default="html", help="output format (default %(default)s)")
    p.add_argument("--out", "-o", type=Path, help="write to this file (default: standard output)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", "-c", type=Path, help="the agent's config: state.path, rules, source, server")
    src.add_argument("--db", help="state database file, without a config (bundled rules, no plots)")
    p.add_argument("--agent", metavar="URL", help="ask this running agent for the report (e.g. http://127.0.0.1:9400)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configure_logging("console", "warning", stream=sys.__stderr__ or sys.stderr)
    config = load_config(args.config, os.environ) if args.config is not None else None
    problems: list[str] = []  # plots whose range queries failed (Prometheus mode): the report says why, so do we
    try:
        if args.agent is not None:
            text = _from_agent(args.agent.rstrip("/"), args.incident, args.format, config)
        else:
            text = _local(args, config, problems)
    except NotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except _AgentFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    elif args.format == "json":  # json.dumps escapes every control and non-ASCII character as \uXXXX itself,
        sys.stdout.write(text)    # and the output must stay JSON: written as it is
    else:  # a terminal: control characters from alert names and labels escaped (agent.textsafe)
        sys.stdout.write(escape_lines(text))
    if problems:  # the report is written, but incomplete: say why and exit non-zero for scripts
        print(f"error: {len(problems)} plot(s) without data, the source did not answer usably:", file=sys.stderr)
        for line in problems:
            print(escape_lines(f"  {line[:300]}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


class _AgentFailed(AgentError):
    """The running agent answered, but not with a report (never escapes this module)."""


def _local(args: argparse.Namespace, config: Config | None, problems: list[str]) -> str:
    """The report built here; each failed range query of a plot is added to ``problems``."""
    now_ms = int(time.time() * 1000)
    path = config.state.path if config is not None else (args.db or "sre-agent.db")
    if not Path(path).exists():  # opening would create an empty one
        raise NotFoundError(f"no state database at {path} (the agent's state.path; --config or --db)")
    db = StateDB(path)
    try:
        state = read_state(db, args.incident, now_ms=now_ms)
    finally:
        db.close()
    if config is not None and not config.source.remote:  # embedded: the series are in the agent's memory
        url = _agent_url(config)
        if url is not None:
            try:
                return _from_agent(url, state.incident.id, args.format, config)
            except _Unreachable as exc:
                print(f"note: {exc}; writing the report without plots", file=sys.stderr)
    groups = _groups(config)
    if config is not None and config.source.remote:
        history = RemoteHistory(config.source)
        report = build(state, groups, now_ms=now_ms, query=remote_query(history),
                       source=f"the source {history.url} (range queries)", images=args.format == "html")
        problems += [f"{p.spec.title}: {e}" for p in report.plots for e in p.errors]
    else:
        why = ("no plots: in embedded mode the series live in the running agent's memory and it did not answer"
               if config is not None else "no plots: without --config there is no agent or source to ask")
        report = build(state, groups, now_ms=now_ms, query=None, source=why, images=args.format == "html")
    return render(report, args.format)


def _groups(config: Config | None) -> list[GroupSpec]:
    """The rule files the agent loads (the bundled ones without a config), parametrized the same way."""
    cfg = config or Config()
    groups = load_rule_files(rule_paths(cfg.rules.files))
    return parametrize(groups, selector=rule_selector(cfg.rules.selector), by=cfg.rules.by)


def _agent_url(config: Config) -> str | None:
    """Where the agent answers: ``server.external_url``, else ``server.listen`` (None for port 0)."""
    if config.server.external_url:
        return config.server.external_url
    if config.server.port == 0:
        return None
    host = config.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    scheme = "https" if config.server.tls is not None else "http"
    return f"{scheme}://{host}:{config.server.port}"


class _Unreachable(AgentError):
    """No agent answered at the URL (never escapes this module)."""


def _from_agent(base: str, incident: int | None, fmt: str, config: Config | None) -> str:
    headers = {"User-Agent": "sre-agent-triage"}
    token = config.server.auth.bearer_token if config is not None else None
    if token is not None:
        headers["Authorization"] = f"Bearer {token.get_secret_value()}"
    try:
        if incident is None:
            listed = requests.get(f"{base}/api/v1/incidents", params={"limit": "1"}, headers=headers,
                                  timeout=_TIMEOUT_S)
            found = listed.json().get("data", {}).get("incidents", []) if listed.ok else []
            if not found:
                raise NotFoundError(f"the agent at {base} has no incidents yet")
            incident = int(found[0]["id"])
        r = requests.get(f"{base}/incidents/{incident}", params={"format": fmt}, headers=headers, timeout=_TIMEOUT_S)
    except requests.ConnectionError as exc:
        raise _Unreachable(f"no agent answers at {base}") from exc
    except (requests.RequestException, ValueError) as exc:
        raise _AgentFailed(f"the agent at {base} did not answer usably: {exc}") from exc
    if r.status_code == 404:
        raise NotFoundError(f"no incident {incident} at {base} (sre-agent incidents lists them)")
    if not r.ok:
        raise _AgentFailed(f"the agent at {base} answered HTTP {r.status_code}: {r.text[:200]}")
    r.encoding = "utf-8"
    return r.text
