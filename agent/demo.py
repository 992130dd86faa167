"""``sre-agent demo``: the simulated fleet and the agent together, with a live view.

The simulator's replica list is published as a Prometheus ``file_sd`` file that
the agent watches, exactly as a real deployment would wire a changing fleet, so
replicas added by ``POST /scale`` are picked up without a restart. The view reads
the agent's own store (not the simulator), so what it shows is what the agent saw.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agent.config import Config, bundled_rules_dir
from agent.daemon import Agent
from agent.discovery import instance_of
from agent.series import is_stale
from agent.simulate.server import Fleet, FleetConfig
from agent.store import Matcher, Store

__all__ = ["FleetRow", "fleet_rows", "render_view", "run_demo"]

_RATE_WINDOW_MS = 30_000


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


def _last(store: Store, prefix: str, names: tuple[str, ...], instance: str) -> float | None:
    """Sum over series of the first name (e.g. V1 then V0 spelling) that has fresh data."""
    for name in names:
        total, found = 0.0, False
        for s in store.iter_series([Matcher("__name__", "=", prefix + name), Matcher("instance", "=", instance)]):
            if s.vals and not is_stale(s.vals[-1]):
                total += s.vals[-1]
                found = True
        if found:
            return total
    return None


def _increase(ts: Any, vals: Any, now_ms: int) -> tuple[float, float] | None:
    """Counter increase and seconds covered over the last window (reset-aware)."""
    j = len(vals)
    if j < 2 or is_stale(vals[-1]):
        return None
    i = max(bisect.bisect_left(ts, now_ms - _RATE_WINDOW_MS), 0)
    if j - i < 2:
        i = j - 2
    inc = 0.0
    for k in range(i + 1, j):
        a, b = vals[k - 1], vals[k]
        if is_stale(a) or is_stale(b):
            continue
        inc += b - a if b >= a else b
    return inc, (ts[j - 1] - ts[i]) / 1000


def _rate(store: Store, prefix: str, name: str, instance: str, now_ms: int) -> float | None:
    total, found = 0.0, False
    for s in store.iter_series([Matcher("__name__", "=", prefix + name), Matcher("instance", "=", instance)]):
        r = _increase(s.ts, s.vals, now_ms)
        if r and r[1] > 0:
            total += r[0] / r[1]
            found = True
    return total if found else None


def _p99(store: Store, prefix: str, name: str, instance: str, now_ms: int) -> float | None:
    """The 99th percentile from classic buckets' increase over the window."""
    by_le: dict[float, float] = {}
    for s in store.iter_series([Matcher("__name__", "=", f"{prefix}{name}_bucket"),
                                Matcher("instance", "=", instance)]):
        r = _increase(s.ts, s.vals, now_ms)
        if r is not None:
            le = float(dict(s.labels)["le"])
            by_le[le] = by_le.get(le, 0.0) + r[0]
    if not by_le or by_le.get(float("inf"), 0.0) <= 0:
        return None
    bounds = sorted(by_le)
    rank = 0.99 * by_le[float("inf")]
    prev_b, prev_c = 0.0, 0.0
    for b in bounds:
        c = by_le[b]
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_b, prev_c = b, c
    return None


def fleet_rows(agent: Agent) -> list[FleetRow]:
    store, now_ms = agent.store, int(time.time() * 1000)
    rows = []
    for t in agent.scraper.targets.values():
        inst = t.spec.instance
        p = "lmdeploy:" if t.spec.job == "lmdeploy" else "vllm:"
        ttft = _p99(store, p, "time_to_first_token_seconds", inst, now_ms)
        rows.append(FleetRow(
            job=t.spec.job, instance=inst, health=t.health, error=t.last_error,
            running=_last(store, p, ("num_requests_running",), inst),
            waiting=_last(store, p, ("num_requests_waiting",), inst),
            kv_usage=_last(store, p, ("kv_cache_usage_perc", "gpu_cache_usage_perc"), inst),
            gen_tokens_per_s=_rate(store, p, "generation_tokens_total", inst, now_ms),
            ttft_p99_s=ttft,
            preemptions_per_s=_rate(store, p, "num_preemptions_total", inst, now_ms),
        ))
    return sorted(rows, key=lambda r: (r.job, r.instance))


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_view(agent: Agent, scenario: str, started: float, clear: bool) -> str:
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
    st = agent.store.stats()
    lines += ["", f"store: {st['series']} series, {st['samples']} samples | agent API: "
              f"http://127.0.0.1:{agent.port}/api/v1/targets  /metrics", ""]
    return ("\x1b[H\x1b[2J" if clear else "") + "\n".join(lines)


def _file_sd_groups(fleet: Fleet, vllm_replicas: int) -> list[dict[str, Any]]:
    """The fleet's targets as file_sd groups, one per job (vLLM first, then LMDeploy)."""
    groups: dict[str, list[str]] = {"vllm": [], "lmdeploy": []}
    for i, info in enumerate(fleet.state()):
        kind = str(info.get("kind", "vllm" if i < vllm_replicas else "lmdeploy"))
        groups["lmdeploy" if kind == "lmdeploy" else "vllm"].append(instance_of(str(info["url"])))
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
            published = _file_sd_groups(fleet, fleet_cfg.replicas)
            _publish(sd, published)
            config = Config.model_validate({
                "targets": [],
                "file_sd": [{"files": [str(sd)], "refresh_interval": "30s"}],
                "scrape": {"interval": interval, "timeout": interval},
                "server": {"listen": listen},
                "rules": {"files": [str(bundled_rules_dir() / "*.rules.yaml")], "evaluation_interval": interval},
            })
            agent = Agent(config)
            await agent.start()
            started, clear = time.time(), out.isatty()
            print(f"simulator control: {fleet.control_url} (POST /scale {{\"replicas\": N}}); "
                  f"agent: http://{listen}/", file=out, flush=True)
            try:
                while not duration or time.time() - started < duration:
                    await asyncio.sleep(min(2.0, config.scrape.interval))
                    groups = _file_sd_groups(fleet, fleet_cfg.replicas)
                    if groups != published:  # the fleet was scaled: tell the agent
                        _publish(sd, groups)
                        published = groups
                    print(render_view(agent, fleet_cfg.scenario, started, clear), file=out, flush=True)
            finally:
                with contextlib.suppress(Exception):
                    await agent.stop()
    finally:
        await fleet.stop()
    return 0
