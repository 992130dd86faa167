"""``sre-agent demo``: the simulated fleet and the agent together, with a live view.

The simulator's replica list is published as a Prometheus ``file_sd`` file that
the agent watches, exactly as a real deployment would wire a changing fleet, so
replicas added by ``POST /scale`` are picked up without a restart. The view reads
the agent's own store (not the simulator), so what it shows is what the agent saw.

The simulator and the agent share one model-time clock (:class:`ModelClock`): model time
runs ``time_scale`` times the wall, the agent's jobs run each ``interval / time_scale`` wall
seconds, and every duration (a rule's ``for``, ``group_wait``, cooldowns, rate windows) is
kept in model time, so nothing is shortened; the screen shows both clocks. The default
``story`` scenario tells one incident from surge to CUDA OOM, each step followed from the
agent's own records (:mod:`agent.app.story`), then a summary with each incident's report URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import structlog

from agent.app.daemon import Agent
from agent.app.story import Story
from agent.collect.discovery import instance_of
from agent.config import Config, bundled_rules_dir
from agent.promql import Sample
from agent.series import labels_get
from agent.simulate.server import Fleet, FleetConfig

__all__ = ["DemoReceivers", "FleetRow", "ModelClock", "demo_config", "fleet_rows", "render_view", "run_demo"]

log = structlog.get_logger(__name__)

#: The view's columns as PromQL, one query per column over every instance (``{p}`` is
#: ``vllm:`` or ``lmdeploy:``); the agent's own engine answers them from its store.
_COLUMNS = {
    "running": "sum by (instance) ({p}num_requests_running)",
    "waiting": "sum by (instance) ({p}num_requests_waiting)",
    "kv_usage": "max by (instance) ({p}kv_cache_usage_perc or {p}gpu_cache_usage_perc)",
    "gen_tokens_per_s": "sum by (instance) (rate({p}generation_tokens_total[1m]))",
    "ttft_p99_s": "histogram_quantile(0.99, sum by (instance, le) (rate({p}time_to_first_token_seconds_bucket[1m])))",
    "preemptions_per_s": "sum by (instance) (rate({p}num_preemptions_total[1m]))",
}


@dataclass(frozen=True, slots=True)
class FleetRow:
    job: str
    instance: str
    health: str
    error: str
    running: float | None
    waiting: float | None
    kv_usage: float | None
    gen_tokens_per_s: float | None
    ttft_p99_s: float | None
    preemptions_per_s: float | None


def _by_instance(agent: Agent, query: str, now_ms: int) -> dict[str, float]:
    result = agent.engine.instant(query, now_ms)
    if not isinstance(result, list):
        return {}
    return {labels_get(s.labels, "instance"): s.value for s in result if isinstance(s, Sample)}


def fleet_rows(agent: Agent, now_ms: int | None = None) -> list[FleetRow]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    columns = {
        (prefix, name): _by_instance(agent, query.format(p=prefix), now_ms)
        for prefix in ("vllm:", "lmdeploy:") for name, query in _COLUMNS.items()
    }
    rows = []
    for t in agent.scraper.targets.values():
        if t.spec.job not in ("vllm", "lmdeploy"):
            continue  # the GPU exporter: its numbers are not a replica's
        prefix = "lmdeploy:" if t.spec.job == "lmdeploy" else "vllm:"
        values = {name: columns[(prefix, name)].get(t.spec.instance) for name in _COLUMNS}
        rows.append(FleetRow(job=t.spec.job, instance=t.spec.instance, health=t.health, error=t.last_error,
                             **values))
    return sorted(rows, key=lambda r: (r.job, r.instance))


def _clock_text(seconds: float) -> str:
    s = max(int(seconds), 0)
    return f"{s // 60}:{s % 60:02d}"


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


class _NotificationFeed(io.StringIO):
    """Where the demo's console receiver writes: the view shows the last lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=8)

    def write(self, text: str) -> int:
        self.lines.extend(line for line in text.splitlines() if line.strip())
        return len(text)


def render_view(agent: Agent, scenario: str, clock: ModelClock, clear: bool, *,
                notifications: Iterable[str] = (), story: Sequence[str] = (), summary: Sequence[str] = ()) -> str:
    rows = fleet_rows(agent, int(clock() * 1000))
    nv = agent.nvml
    gpu = "GPU: " + ("disabled" if nv is None else ("NVML ok" if nv.available else f"unavailable ({nv.reason})"))
    wall, model = clock.elapsed()
    targets = list(agent.scraper.targets.values())
    up = sum(t.health == "up" for t in targets)
    head = (f"sre-agent demo | scenario {scenario} | model time {_clock_text(model)} = wall {_clock_text(wall)} "
            f"x{clock.scale:g} | {up}/{len(targets)} targets up | {gpu}")
    lines = [head, "",
             f"{'job':9} {'instance':22} {'health':6} {'running':>8} {'waiting':>8} {'KV %':>6} "
             f"{'gen tok/s':>10} {'TTFT p99':>9} {'preempt/s':>9}"]
    for r in rows:
        kv = None if r.kv_usage is None else r.kv_usage * 100
        line = (f"{r.job:9} {r.instance:22} {r.health:6} {_fmt(r.running, '8.0f')} {_fmt(r.waiting, '8.0f')} "
                f"{_fmt(kv, '6.1f')} {_fmt(r.gen_tokens_per_s, '10.0f')} "
                f"{_fmt(r.ttft_p99_s, '8.2f')}{'s' if r.ttft_p99_s is not None else ' '} "
                f"{_fmt(r.preemptions_per_s, '9.2f')}")
        lines.append(line + (f"  {r.error}" if r.error else ""))
    lines += ["", "the story so far (model time is what the rules' `for` counts):"]
    lines += [f"  {s}" for s in story] or ["  (waiting for the surge)"]
    lines += [f"  {s}" for s in summary]
    alerts = sorted(agent.rules.alerts(), key=lambda a: (a.state.value != "firing", dict(a.labels)["alertname"]))
    lines += ["", f"alerts ({sum(a.state.value == 'firing' for a in alerts)} firing, "
                  f"{sum(a.state.value == 'pending' for a in alerts)} pending):"]
    for a in alerts[:12]:
        lab = dict(a.labels)
        where = lab.get("instance") or lab.get("model_name") or lab.get("job") or ""
        lines.append(f"  {a.state.value.upper():8} {lab['alertname']:32} {lab.get('severity', ''):8} {where:22} "
                     f"{a.annotations.get('summary', '')}")
    if len(alerts) > 12:
        lines.append(f"  ... and {len(alerts) - 12} more (GET /api/v1/alerts)")
    desired = agent.act.views.desired_replicas
    lines += ["", "notifications (console receiver) and scaling: "
              + (", ".join(f"{svc} wants {n} replicas" for svc, n in desired.items()) or "no scale-out yet")]
    lines += [f"  {n}" for n in notifications] or ["  (none yet: alerts notify after `for` and group_wait)"]
    st = agent.store.stats()
    lines += ["", f"store: {st['series']} series, {st['samples']} samples | agent API: "
              f"http://127.0.0.1:{agent.port}/api/v1/targets  /metrics", ""]
    return ("\x1b[H\x1b[2J" if clear else "") + "\n".join(lines)


def _file_sd_groups(fleet: Fleet) -> list[dict[str, Any]]:
    """The fleet's targets as file_sd groups, one per job (vLLM first, then LMDeploy, then the
    simulated host's dcgm-exporter, which stands in for NVML on a machine without GPUs)."""
    groups: dict[str, list[str]] = {"vllm": [], "lmdeploy": [], "dcgm": []}
    for info in fleet.state():
        groups["lmdeploy" if info["kind"] == "lmdeploy" else "vllm"].append(instance_of(str(info["url"])))
    if fleet.dcgm_url is not None:
        groups["dcgm"].append(instance_of(fleet.dcgm_url))
    return [{"targets": addrs, "labels": {"job": job}} for job, addrs in groups.items() if addrs]


def _publish(path: Path, groups: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1), encoding="utf-8")
    tmp.replace(path)  # atomic: the agent never reads a half-written file


@dataclass(frozen=True, slots=True)
class DemoReceivers:
    """Real receivers the demo also sends to, beside its console: a Slack bot token read from a
    file (and the channel), and Alertmanager base URLs."""

    slack_token_file: Path | None = None
    slack_channel: str = ""
    slack_api_url: str = "https://slack.com/api/"
    alertmanager: tuple[str, ...] = ()


class ModelClock:
    """Model time for the agent: starts at the wall time it was made, then runs ``scale`` times
    faster. Durations in the agent (``for``, ``group_wait``, cooldowns, rate windows) are true in
    model time; only the wall is compressed."""

    def __init__(self, scale: float, wall: Callable[[], float] = time.time) -> None:
        self.scale, self._wall = scale, wall
        self.start = wall()

    def __call__(self) -> float:
        return self.start + (self._wall() - self.start) * self.scale

    def elapsed(self) -> tuple[float, float]:
        """(wall, model) seconds since the start."""
        wall = self._wall() - self.start
        return wall, wall * self.scale


def demo_config(fleet: Fleet, *, tmp: Path, sd: Path, listen: str, interval: str,
                receivers: DemoReceivers | None = None) -> Config:
    """The agent's configuration for the demo: the bundled rules over the fleet's file_sd, the
    simulator's logs tailed for OOM evidence, scale-out through the simulator's ``POST /scale``,
    the console receiver (and whatever real receivers were given)."""
    rc = receivers or DemoReceivers()
    extra: list[dict[str, Any]] = []
    if rc.slack_token_file is not None:
        extra.append({"name": "slack", "slack": {"token_file": str(rc.slack_token_file), "channel": rc.slack_channel,
                                                 "api_url": rc.slack_api_url}})
    if rc.alertmanager:
        extra.append({"name": "alertmanager", "alertmanager": {"urls": list(rc.alertmanager)}})
    cfg = fleet.config
    return Config.model_validate({
        "targets": [],
        "file_sd": [{"files": [str(sd)], "refresh_interval": "30s"}],
        "scrape": {"interval": interval, "timeout": "2s"},
        "server": {"listen": listen},
        "rules": {"files": [str(bundled_rules_dir() / "*.rules.yaml")], "evaluation_interval": interval},
        "state": {"path": str(tmp / "state.db")},
        "nvml": {"enabled": False},  # the simulated GPUs come from the fleet's dcgm-exporter target
        "notify": {"dispatch_interval": "5s"},
        "diagnostics": {"oom": {"log_files": [str(tmp / "logs" / "vllm-*.log")]}},
        "receivers": [{"name": "console", "console": {}}, *extra],
        "route": {"receiver": "console", "group_by": ["alertname"], "group_wait": "5s",
                  "group_interval": "30s", "repeat_interval": "1h",
                  # the real receivers get everything too; the last route keeps the console's feed
                  "routes": [*({"receiver": r["name"], "continue": True} for r in extra),
                             *([{"receiver": "console"}] if extra else [])]},
        # the bundled scale-out rules carry action=scale_out; the simulator's control port takes it
        "scaling": {"services": [{
            "name": "vllm", "matchers": ['job="vllm"'], "webhook": {"url": f"{fleet.control_url}/scale"},
            "min_replicas": cfg.replicas, "max_replicas": cfg.replicas + 4, "step": 2,
            "initial_replicas": cfg.replicas, "scale_out_cooldown": "2m"}]},
    })


async def run_demo(
    fleet_cfg: FleetConfig,
    *,
    listen: str,
    interval: str = "15s",
    time_scale: float = 6.0,
    duration: float = 0.0,
    out: TextIO = sys.stdout,
    receivers: DemoReceivers | None = None,
    exit_after_story: bool = False,
) -> int:
    """Run until Ctrl-C (or ``duration`` wall seconds, or once the story is told with
    ``exit_after_story``), redrawing the view about every second. ``interval`` is the scrape and
    evaluation interval in model time; ``time_scale`` model seconds pass per wall second, in the
    simulator and in the agent alike."""
    with tempfile.TemporaryDirectory(prefix="sre-agent-demo-") as tmp_name:
        tmp = Path(tmp_name)
        fleet = Fleet(replace(fleet_cfg, speed=time_scale, step_s=min(fleet_cfg.step_s, 0.5),
                              log_dir=fleet_cfg.log_dir or tmp / "logs"))
        await fleet.start()
        try:
            return await _run(fleet, tmp, listen=listen, interval=interval, time_scale=time_scale,
                              duration=duration, out=out, receivers=receivers, exit_after_story=exit_after_story)
        finally:
            await fleet.stop()


async def _run(fleet: Fleet, tmp: Path, *, listen: str, interval: str, time_scale: float, duration: float,
               out: TextIO, receivers: DemoReceivers | None, exit_after_story: bool) -> int:
    sd = tmp / "fleet.json"
    published = _file_sd_groups(fleet)
    _publish(sd, published)
    config = demo_config(fleet, tmp=tmp, sd=sd, listen=listen, interval=interval, receivers=receivers)
    feed = _NotificationFeed()
    clock = ModelClock(time_scale)
    agent = Agent(config, notify_stream=feed, clock=clock, time_scale=time_scale)
    await agent.start()
    sc = fleet.scenario
    story = Story(surge_at_s=sc.onset_s if sc.surge != 1.0 else None, surge=sc.surge,
                  initial_replicas=fleet.config.replicas)
    clear, summarised, summary = out.isatty(), False, []
    print(f"simulator control: {fleet.control_url} (POST /scale {{\"replicas\": N}}); "
          f"agent: http://{listen}/; time scale x{time_scale:g} (model time runs {time_scale:g}x the wall)",
          file=out, flush=True)
    start_ms = int(clock.start * 1000)
    try:
        while not duration or clock.elapsed()[0] < duration:
            await asyncio.sleep(1.0)
            groups = _file_sd_groups(fleet)
            if groups != published:  # the fleet was scaled: tell the agent
                _publish(sd, groups)
                published = groups
            wall, model = clock.elapsed()
            for step in story.update(wall_s=wall, model_s=model, start_model_ms=start_ms, events=list(agent.events),
                                     replicas=fleet.state(), incidents=await agent.incidents_json(200)):
                log.info("demo step", step=step.key, wall_s=round(step.wall_s, 1), model_s=round(step.model_s, 1))
            lines = [s.line() for s in story.reached.values()]
            if story.done and not summarised:
                summarised = True
                summary = await incident_summary(agent, listen, start_ms)
                print("\n".join(["", "story complete:", *lines, *summary, ""]), file=out, flush=True)
            print(render_view(agent, sc.name, clock, clear, notifications=feed.lines, story=lines,
                              summary=summary), file=out, flush=True)
            if summarised and exit_after_story:
                break
    finally:
        with contextlib.suppress(Exception):
            await agent.stop()
    return 0


async def incident_summary(agent: Agent, listen: str, start_ms: int) -> list[str]:
    """Step 8: one line per incident of the run, with its report's URL."""
    host = listen.rsplit(":", 1)[0] or "127.0.0.1"
    base = f"http://{host}:{agent.port}"
    lines = ["incidents (each links its triage report):"]
    for inc in reversed(await agent.incidents_json(200)):
        start = (int(inc["started_ms"]) - start_ms) / 1000
        lasted = (int(inc["resolved_ms"]) - int(inc["started_ms"])) / 1000
        state = "open" if inc["status"] == "open" else f"resolved after {lasted:.0f}s"
        kinds = sorted({str(e["kind"]) for e in inc.get("events", [])})
        lines.append(f"  model +{start:5.0f}s  {inc['alertname']:30} {state:22} {', '.join(kinds):32} "
                     f"{base}/incidents/{inc['id']}")
    return lines
