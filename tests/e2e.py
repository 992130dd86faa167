"""End-to-end helpers: the real agent as a subprocess, a metrics target the test controls, a recording receiver.

The fault tests (``tests/app/test_e2e_faults.py``) kill the agent with SIGKILL and restart
it on the same config and state database, so the agent must be a real process, not an
:class:`~agent.app.daemon.Agent` in the test's event loop. Everything it talks to runs in
the test's loop on 127.0.0.1:

* :class:`MetricsTarget` serves ``/metrics`` with one gauge, ``e2e_condition``, whose
  value the test sets; the rule file :func:`write_config` writes alerts on it.
* :class:`Receiver` (a :class:`tests.receivers.RecordingServer`) records every request
  and answers 200 or 503 as told, and can be stopped (connection refused) and started
  again on the same port.
* :class:`AgentProcess` is one ``python -m agent run --log-format json`` process: its
  JSON log goes to a file (read for its listen port and for events), its HTTP API is
  read with aiohttp (never a blocking call: the servers the agent scrapes and posts to
  share the test's loop).

The :func:`agents` fixture starts agent processes and SIGKILLs every one still alive at
teardown, failed test or not, printing each log's tail (pytest shows it on failure).
Waiting is always polling with a deadline (:func:`tests.alertmanager.eventually`); a
"nothing more happened" check first waits for the agent itself to have run on (:func:`quiet`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from agent.config import bundled_rules_dir, format_duration, parse_duration

from .alertmanager import eventually
from .conftest import REPO
from .receivers import Recorded, RecordingServer

__all__ = [
    "ALERT",
    "CONDITION_RULES",
    "FOR_S",
    "INTERVAL_S",
    "SETTLE_S",
    "AgentProcess",
    "Agents",
    "MetricsTarget",
    "Receiver",
    "agents",
    "hook",
    "parse_time",
    "quiet",
    "target",
    "wait_for",
    "write_config",
]

ALERT = "E2ECondition"
FOR_S = 4.0  # the rule's `for`
INTERVAL_S = 1.0  # scrape and evaluation interval
GROUP_S = 1.0  # the route's group_wait and group_interval
DISPATCH_S = 1.0  # notify.dispatch_interval: how often the outbox is looked at
RETRY_INITIAL_S = 0.2  # notify.retry_initial
# From an evaluation to a notification on the wire: the group's wait, a dispatch round, a first retry.
# A wrong extra notification caused by something the agent did would have been sent within this.
SETTLE_S = GROUP_S + DISPATCH_S + RETRY_INITIAL_S
JOB = "e2e"
START_DEADLINE_S = 60.0  # a cold start of the interpreter on a loaded 2-core machine
LOG_TAIL_LINES = 40


def parse_time(text: str) -> float:
    """An RFC 3339 time as Alertmanager, the webhook JSON and the agent's logs write it -> Unix seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


#: A rule group on :class:`MetricsTarget`'s gauge, for tests that run it on a real server and on the agent.
CONDITION_RULES = """
groups:
  - name: remote
    interval: 1s
    rules:
      - alert: ConditionHigh
        expr: e2e_condition > 0
        for: 3s
        labels: {severity: warning}
        annotations:
          summary: The condition is high.
          description: "replica {{ $labels.replica }} is at {{ $value }}"
"""


# -- the metrics target and the recording receiver ------------------------------------------------


@dataclass
class MetricsTarget:
    """``/metrics`` with ``e2e_condition{replica="a"} <value>``; :meth:`set` changes the value."""

    value: float = 0.0
    server: RecordingServer = field(init=False)

    def __post_init__(self) -> None:
        self.server = RecordingServer(responder=self._metrics)

    @property
    def url(self) -> str:
        return self.server.url("/metrics")

    def scrape_configs(self, job: str = "e2e") -> list[dict[str, Any]]:
        """Prometheus' ``scrape_configs`` for this target, scraped every second."""
        host = self.url.split("//")[1].split("/")[0]
        return [{"job_name": job, "scrape_interval": "1s", "static_configs": [{"targets": [host]}]}]

    def set(self, value: float) -> float:
        """Set the gauge; returns the wall-clock time it changed (the first moment a scrape can see it)."""
        self.value = value
        return time.time()

    async def _metrics(self, request: web.Request, _: bytes) -> web.Response:
        if request.path != "/metrics":
            return web.Response(status=404)
        body = ("# HELP e2e_condition A condition the end-to-end test switches.\n"
                "# TYPE e2e_condition gauge\n"
                f'e2e_condition{{replica="a"}} {self.value:g}\n')
        return web.Response(text=body, content_type="text/plain", charset="utf-8")


class Receiver(RecordingServer):
    """A webhook (or fake Alertmanager) receiver: a :class:`RecordingServer` answering ``status`` (200 or 503)."""

    def accepted_with(self, status: str, path: str | None = None) -> list[Recorded]:
        """Accepted webhook notifications whose JSON ``status`` is ``firing`` or ``resolved``."""
        return [r for r in self.accepted(path) if r.json().get("status") == status]


# -- the agent process ----------------------------------------------------------------------------


def write_config(
    tmp_path: Path,
    *,
    target: str,
    receivers: list[dict[str, Any]],
    routes: list[dict[str, Any]] | None = None,
    scale_out: bool = False,
    scaling: dict[str, Any] | None = None,
) -> Path:
    """The agent's config (and rule file) for one test; returns the config path.

    ``receivers`` are the config's receiver entries; the first is the root route's receiver,
    ``routes`` the child routes (default: one per receiver, ``continue: true``, so every
    receiver gets every alert). ``scale_out`` labels the alert ``action: scale_out`` and
    configures the matching scale-out action.
    """
    labels = {"severity": "warning", **({"action": "scale_out"} if scale_out else {})}
    rules = {"groups": [{"name": "e2e", "rules": [{
        "alert": ALERT, "expr": "e2e_condition > 0", "for": f"{FOR_S:g}s", "labels": labels,
        "annotations": {"summary": "The end-to-end condition is on."},
    }]}]}
    rule_file = tmp_path / "e2e.rules.yaml"
    rule_file.write_text(json.dumps(rules))  # JSON is YAML
    if routes is None:
        routes = [{"receiver": r["name"], "continue": True} for r in receivers]
    config: dict[str, Any] = {
        "targets": [{"url": target, "job": JOB}],
        "scrape": {"interval": f"{INTERVAL_S:g}s", "timeout": f"{INTERVAL_S:g}s"},
        "nvml": {"enabled": "false"},
        "server": {"listen": "127.0.0.1:0"},
        "rules": {"files": [str(rule_file)], "evaluation_interval": f"{INTERVAL_S:g}s"},
        "state": {"path": str(tmp_path / "state.db")},
        "receivers": receivers,
        "route": {"receiver": receivers[0]["name"], "group_by": ["alertname"], "group_wait": f"{GROUP_S:g}s",
                  "group_interval": f"{GROUP_S:g}s", "repeat_interval": "1h", "routes": routes},
        "actions": [{"type": "scale_out", "matchers": ['action="scale_out"']}] if scale_out else [],
        "notify": {"dispatch_interval": f"{DISPATCH_S:g}s", "retry_initial": f"{RETRY_INITIAL_S * 1000:g}ms",
                   "retry_max": "2s"},
        "log": {"format": "json", "level": "info"},
    }
    if scaling is not None:
        config["scaling"] = scaling
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


class AgentProcess:
    """One ``python -m agent run`` process; ``log`` is its JSON log file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = 0
        self.started_at = 0.0
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log_file, cwd=REPO,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.started_at = time.time()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------
    async def ready(self) -> AgentProcess:
        """Wait for the listen address in the log, then for ``/readyz`` (first scrape done)."""
        async def listening() -> int | None:
            if self.proc.poll() is not None:
                pytest.fail(f"agent exited with {self.proc.returncode}; its log:\n{self.log_tail()}")
            event = next((e for e in self.events() if e.get("event") == "serving"), None)
            return int(str(event["listen"]).rsplit(":", 1)[1]) if event else None

        self.port = await eventually(listening, timeout=START_DEADLINE_S, what="the agent's listen address")

        async def is_ready() -> bool | None:
            try:
                async with self._session.get(f"{self.base}/readyz") as r:
                    return True if r.status == 200 else None
            except aiohttp.ClientError:
                return None

        await eventually(is_ready, timeout=START_DEADLINE_S, what="the agent's /readyz")
        return self

    def kill(self) -> float:
        """SIGKILL (kill -9) and reap; returns the wall-clock time of the kill."""
        at = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return at

    async def close(self) -> None:
        """Kill if still running; close the HTTP session and the log file."""
        if self.proc.poll() is None:
            self.kill()
        await self._session.close()
        self._log_file.close()

    # -- its log ----------------------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line so far (other lines, e.g. a traceback, are skipped)."""
        out = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def event_time(self, event: str, **fields: Any) -> float | None:
        """Wall-clock time (from the log's timestamp) of the first log event named ``event`` with ``fields``."""
        found = next((e for e in self.events()
                      if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())), None)
        return parse_time(str(found["timestamp"])) if found else None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    # -- its HTTP API ---------------------------------------------------------------------------
    async def api(self, path: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``."""
        async with self._session.get(f"{self.base}/api/v1/{path}") as r:
            r.raise_for_status()
            return (await r.json())["data"]

    async def alert_state(self) -> str:
        """``pending``, ``firing`` or ``inactive``: the test rule's state as ``/api/v1/rules`` shows it."""
        groups = (await self.api("rules"))["groups"]
        return str(groups[0]["rules"][0]["state"])

    async def active_at(self) -> float | None:
        """``activeAt`` of the test alert in ``/api/v1/alerts`` (None when there is none)."""
        alerts = (await self.api("alerts"))["alerts"]
        found = next((a for a in alerts if a["labels"].get("alertname") == ALERT), None)
        return parse_time(found["activeAt"]) if found else None

    async def last_evaluation(self) -> float:
        """Wall-clock time of the rule group's last evaluation (0 before the first)."""
        groups = (await self.api("rules"))["groups"]
        last = groups[0]["lastEvaluation"]
        return parse_time(last) if last else 0.0

    async def evaluated_after(self, t: float, *, what: str = "an evaluation") -> None:
        """Wait until the rule group has been evaluated at a time later than ``t``."""
        async def check() -> bool | None:
            return True if await self.last_evaluation() > t else None
        await eventually(check, what=what)

    async def incidents(self) -> list[dict[str, Any]]:
        return list((await self.api("incidents"))["incidents"])

    async def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample of the agent's own ``/metrics`` (None when absent)."""
        async with self._session.get(f"{self.base}/metrics") as r:
            text = await r.text()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        series = f"{name}{{{want}}}" if labels else name
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            if head == series:
                return float(value)
        return None


@dataclass
class Agents:
    """Starts agent processes for one test; all are killed at teardown."""

    tmp_path: Path
    started: list[AgentProcess] = field(default_factory=list)

    async def start(self, config: Path) -> AgentProcess:
        """Start ``python -m agent run`` on ``config`` and wait until it is ready."""
        agent = AgentProcess(config, self.tmp_path / f"agent-{len(self.started) + 1}.log")
        self.started.append(agent)
        return await agent.ready()

    async def close(self) -> None:
        for agent in self.started:
            await agent.close()
            print(f"--- {agent.log.name} (exit {agent.proc.returncode}), last lines ---\n{agent.log_tail()}")


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[Agents]:
    """Start agent processes with ``await agents.start(config)``; every one is SIGKILLed at teardown."""
    runner = Agents(tmp_path)
    try:
        yield runner
    finally:
        await runner.close()


@pytest.fixture
async def target() -> AsyncIterator[MetricsTarget]:
    """The metrics target, condition off."""
    t = MetricsTarget()
    async with t.server:
        yield t


@pytest.fixture
async def hook() -> AsyncIterator[Receiver]:
    """A recording webhook receiver answering 200."""
    async with Receiver() as r:
        yield r


async def wait_for(check: Callable[[], Awaitable[Any]], *, what: str, timeout: float = 30.0) -> Any:
    """:func:`eventually` for a check returning a falsy value (not only None) while not done."""
    async def truthy() -> Any:
        result = await check()
        return result if result else None
    return await eventually(truthy, timeout=timeout, what=what)


async def quiet(agent: AgentProcess, *, what: str = "the agent running on") -> None:
    """Before a "nothing more happened" assertion: wait until the agent has evaluated its rules
    :data:`SETTLE_S` after now, by its own clock.

    A negative check cannot be polled for, so this waits for a positive event that comes after
    the window in which a wrong extra notification would have been queued and sent. A sleep in
    the test would not do: on a loaded machine the agent process may not have run meanwhile.
    """
    await agent.evaluated_after(time.time() + SETTLE_S, what=f"{what} (an evaluation {SETTLE_S:g} s on)")


# -- compressed time -------------------------------------------------------------------------------
_DURATION = re.compile(r"(\[|offset\s+)(\d+[smhd])((?::\d+[smhd])?\])?")


def compress_expr(expr: str, factor: float) -> str:
    """Divide every range and offset duration of a PromQL expression by ``factor``."""
    def scaled(m: re.Match[str]) -> str:
        tail = m.group(3) or ""
        if tail.startswith(":"):
            tail = ":" + format_duration(parse_duration(tail[1:-1]) / factor) + "]"
        return m.group(1) + format_duration(parse_duration(m.group(2)) / factor) + tail
    return _DURATION.sub(scaled, expr)


def compressed_rules(path: Path, factor: float, *, ranges: bool = False,
                     extra_groups: list[dict[str, Any]] | None = None) -> Path:
    """The bundled ``vllm.rules.yaml`` with time compressed ``factor`` times, written to ``path``: every
    group at 1 s, every ``for`` and ``keep_firing_for`` divided by ``factor``, and with ``ranges`` every
    range and offset too. Both sides of a differential test get the same file, so the scaling cancels."""
    data = yaml.safe_load((bundled_rules_dir() / "vllm.rules.yaml").read_text())
    for group in data["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if ranges:
                rule["expr"] = compress_expr(rule["expr"], factor)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = format_duration(parse_duration(rule[key]) / factor)
    data["groups"].extend(extra_groups or [])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
