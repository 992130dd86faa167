"""``sre-agent demo``: the simulated fleet and the agent together, with a live view.

The simulator's replica list is published as a Prometheus ``file_sd`` file that
the agent watches, exactly as a real deployment would wire a changing fleet, so
replicas added by ``POST /scale`` are picked up without a restart. The view reads
the agent's own store (not the simulator), so what it shows is what the agent saw.
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agent.app.daemon import Agent
from agent.collect.discovery import instance_of
from agent.config import Config, bundled_rules_dir
from agent.promql import Sample
from agent.series import labels_get
from agent.simulate.server import Fleet, FleetConfig

__all__ = ["FleetRow", "fleet_rows", "render_view", "run_demo"]

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


def fleet_rows(agent: Agent) -> list[FleetRow]:
    now_ms = int(time.time() * 1000)
    columns = {
        (prefix, name): _by_instance(agent, query.format(p=prefix), now_ms)
        for prefix in ("vllm:", "lmdeploy:") for name, query in _COLUMNS.items()
    }
    rows = []
    for t in agent.scraper.targets.values():
        prefix = "lmdeploy:" if t.spec.job == "lmdeploy" else "vllm:"
        values = {name: columns[(prefix, name)].get(t.spec.instance) for name in _COLUMNS}
        rows.append(FleetRow(job=t.spec.job, instance=t.spec.instance, health=t.health, error=t.last_error,
                             **values))
    return sorted(rows, key=lambda r: (r.job, r.instance))


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


def render_view(agent: Agent, scenario: str, started: float, clear: bool,
                notifications: Iterable[str] = ()) -> str:
    rows = fleet_rows(agent)
    nv = agent.nvml
    gpu = "GPU: " + ("disabled" if nv is None else ("NVML ok" if nv.available else f"unavailable ({nv.reason})"))
    head = (f"sre-agent demo | scenario {scenario} | {time.time() - started:5.0f}s | "
            f"{sum(r.health == 'up' for r in rows)}/{len(rows)} targets up | {gpu}")
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
    """The fleet's targets as file_sd groups, one per job (vLLM first, then LMDeploy)."""
    groups: dict[str, list[str]] = {"vllm": [], "lmdeploy": []}
    for info in fleet.state():
        groups["lmdeploy" if info["kind"] == "lmdeploy" else "vllm"].append(instance_of(str(info["url"])))
    return [{"targets": addrs, "labels": {"job": job}} for job, addrs in groups.items() if addrs]


def _publish(path: Path, groups: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1), encoding="utf-8")
    tmp.replace(path)  # atomic: the agent never reads a half-written file


async def run_demo(
    fleet_cfg: FleetConfig,
    *,
    listen: str,
    interval: str,
    duration: float = 0.0,
    out: TextIO = sys.stdout,
) -> int:
    """Run until Ctrl-C (or ``duration`` seconds), redrawing the view every ~2 s."""
    fleet = Fleet(fleet_cfg)
    await fleet.start()
    try:
        with tempfile.TemporaryDirectory(prefix="sre-agent-demo-") as tmp:
            sd = Path(tmp) / "fleet.json"
            published = _file_sd_groups(fleet)
            _publish(sd, published)
            config = Config.model_validate({
                "targets": [],
                "file_sd": [{"files": [str(sd)], "refresh_interval": "30s"}],
                "scrape": {"interval": interval, "timeout": interval},
                "server": {"listen": listen},
                "rules": {"files": [str(bundled_rules_dir() / "*.rules.yaml")], "evaluation_interval": interval},
                "state": {"path": str(Path(tmp) / "state.db")},
                "route": {"receiver": "console", "group_by": ["alertname"], "group_wait": "5s",
                          "group_interval": "30s", "repeat_interval": "1h"},
                # the bundled scale-out rules carry action=scale_out; the simulator's control port takes it
                "scaling": {"services": [{
                    "name": "vllm", "matchers": ['job="vllm"'], "webhook": {"url": f"{fleet.control_url}/scale"},
                    "min_replicas": fleet_cfg.replicas, "max_replicas": fleet_cfg.replicas + 4,
                    "initial_replicas": fleet_cfg.replicas, "scale_out_cooldown": "1m"}]},
            })
            feed = _NotificationFeed()
            agent = Agent(config, notify_stream=feed)
            await agent.start()
            started, clear = time.time(), out.isatty()
            print(f"simulator control: {fleet.control_url} (POST /scale {{\"replicas\": N}}); "
                  f"agent: http://{listen}/", file=out, flush=True)
            try:
                while not duration or time.time() - started < duration:
                    await asyncio.sleep(min(2.0, config.scrape.interval))
                    groups = _file_sd_groups(fleet)
                    if groups != published:  # the fleet was scaled: tell the agent
                        _publish(sd, groups)
                        published = groups
                    print(render_view(agent, fleet_cfg.scenario, started, clear, feed.lines), file=out, flush=True)
            finally:
                with contextlib.suppress(Exception):
                    await agent.stop()
    finally:
        await fleet.stop()
    return 0
