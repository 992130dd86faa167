"""Rule evaluation through a remote server: the agent in Prometheus mode against vmalert, same rules,
same VictoriaMetrics, same simulated fleet.

    python bench/remote_eval.py                      # 100 and 1,000 simulated targets, 2 minutes each
    python bench/remote_eval.py --targets 100 --minutes 1
    python bench/remote_eval.py --targets 5000 --interval 15 --minutes 3 --vmalert off   # the agent alone

For each fleet size it starts `sre-agent simulate` (its own process), a VictoriaMetrics single node
and a vmagent scraping the fleet every `--interval` (Debian's `victoria-metrics` package ships all
three, and vmalert), then lets vmalert and the agent (`source.type: prometheus`, recording rules
evaluated by the agent too, so both run the whole rule set) evaluate the bundled rules/*.rules.yaml
against that VictoriaMetrics at the same time, at the groups' own interval (15 s). vmalert 1.79 cannot read
`keep_firing_for`, so both get a copy without it. It reports the wall time of one evaluation of the
whole rule set: for the agent the sum over groups of each group's evaluation time, for vmalert the
sum over groups of `vmalert_iteration_duration_seconds` (sum / count), both over the last half of
the run, and the ratio; and the agent's own CPU time per round of the whole rule set (this process runs
nothing else), which a loaded machine inflates less than wall time. Both pay the same VictoriaMetrics
for the queries; what differs is the client: one form-POST per rule on aiohttp and the alert state
machine against vmalert's Go.
Not a test: compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import yaml
from fleet import free_port, running_fleet  # type: ignore[import-not-found]

from agent.app.daemon import Agent
from agent.app.logs import configure_logging
from agent.collect.discovery import instance_of
from agent.config import Config, bundled_rules_dir


def _wait_ready(port: int, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} not ready after {timeout:g}s")


@contextmanager
def running(args: list[str], port: int, what: str) -> Iterator[int]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, what)
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def rules_without_keep_firing(directory: Path, group_interval: float | None = None) -> list[str]:
    out = []
    for path in sorted(bundled_rules_dir().glob("*.rules.yaml")):
        data = yaml.safe_load(path.read_text())
        for g in data["groups"]:
            if group_interval is not None:  # a short run (python -m bench --quick) evaluates more often
                g["interval"] = f"{group_interval:g}s"
            for r in g["rules"]:
                r.pop("keep_firing_for", None)
        copy = directory / path.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(str(copy))
    return out


Iterations = dict[str, tuple[float, float]]  # group -> (seconds, iterations) so far


def vmalert_iterations(port: int) -> Iterations:
    """vmalert's ``vmalert_iteration_duration_seconds`` sum and count per group."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for m in re.finditer(r'^vmalert_iteration_duration_seconds_(sum|count)\{group="([^"]*)"[^}]*\} (\S+)$', text, re.M):
        (sums if m[1] == "sum" else counts)[m[2]] = float(m[3])
    return {g: (sums[g], counts.get(g, 0.0)) for g in sums}


def mean_round_s(before: Iterations, after: Iterations) -> float:
    """Sum over groups of the mean iteration time between two readings."""
    total = 0.0
    for g, (secs, n) in after.items():
        secs0, n0 = before.get(g, (0.0, 0.0))
        if n > n0:
            total += (secs - secs0) / (n - n0)
    return total


async def bench(urls: list[str], minutes: float, interval: float, with_vmalert: bool = True,
                group_interval: float | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rules = rules_without_keep_firing(work, group_interval)
        vm_port, agent_port, alert_port, am_port = free_port(), free_port(), free_port(), free_port()
        scrape = {"global": {"scrape_interval": f"{interval:g}s"}, "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [instance_of(u) for u in urls]}]}]}
        (work / "vmagent.yml").write_text(json.dumps(scrape))
        vm_url = f"http://127.0.0.1:{vm_port}"
        with running(["victoria-metrics", f"-httpListenAddr=127.0.0.1:{vm_port}", f"-storageDataPath={work}/vm",
                      "-search.latencyOffset=1s", "-loggerLevel=ERROR"], vm_port, "VictoriaMetrics"), \
             running(["vmagent", f"-httpListenAddr=127.0.0.1:{agent_port}", f"-promscrape.config={work}/vmagent.yml",
                      f"-remoteWrite.url={vm_url}/api/v1/write", f"-remoteWrite.tmpDataPath={work}/vmagent",
                      "-loggerLevel=ERROR"], agent_port, "vmagent"), \
             (running(["vmalert", f"-httpListenAddr=127.0.0.1:{alert_port}", f"-datasource.url={vm_url}",
                       f"-remoteWrite.url={vm_url}", f"-evaluationInterval={interval:g}s",
                       f"-notifier.url=http://127.0.0.1:{am_port}", "-loggerLevel=ERROR",
                       *(f"-rule={r}" for r in rules)], alert_port, "vmalert") if with_vmalert else nullcontext()):
            cfg = Config.model_validate({
                "source": {"type": "prometheus", "url": vm_url, "recording_rules": "agent"},
                "rules": {"files": rules, "evaluation_interval": f"{interval:g}s"},
                "nvml": {"enabled": "false"}, "server": {"listen": "127.0.0.1:0"},
                "state": {"path": str(work / "agent.db")},
            })
            agent = Agent(cfg)
            await agent.start(serve_http=False)
            step_ms = int(interval * 1000)
            seen: dict[tuple[int, int], float] = {}
            half = time.monotonic() + minutes * 30
            end = time.monotonic() + minutes * 60
            vm_half: Iterations | None = None
            cpu_half: tuple[float, int] | None = None  # this process' CPU time and rounds seen at half time
            try:
                while time.monotonic() < end:
                    await asyncio.sleep(0.5)
                    if cpu_half is None and time.monotonic() >= half:
                        cpu_half = (time.process_time(), len({rnd for _, rnd in seen}))
                    for i, g in enumerate(agent.rules.groups):
                        if g.last_eval_ms:
                            seen[(i, g.last_eval_ms // step_ms)] = g.eval_seconds
                    if with_vmalert and vm_half is None and time.monotonic() >= half:
                        vm_half = vmalert_iterations(alert_port)
                vm_s = mean_round_s(vm_half or {}, vmalert_iterations(alert_port)) if with_vmalert else math.nan
                cpu_end = (time.process_time(), len({rnd for _, rnd in seen}))
            finally:
                await agent.stop()
    c0, r0 = cpu_half or (0.0, 0)
    cpu_per_round = (cpu_end[0] - c0) / (cpu_end[1] - r0) if cpu_end[1] > r0 else math.nan
    by_round: dict[int, float] = {}
    for (_, rnd), secs in seen.items():
        by_round[rnd] = by_round.get(rnd, 0.0) + secs
    per_round = [by_round[r] for r in sorted(by_round)]
    last_half = per_round[len(per_round) // 2:] or per_round
    return {"agent_s": statistics.mean(last_half) if last_half else float("nan"),
            "vmalert_s": vm_s, "rounds": len(per_round), "agent_cpu_s": cpu_per_round}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, action="append", help="fleet sizes (default 100 and 1000)")
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=5.0, help="scrape and evaluation interval, seconds")
    ap.add_argument("--vmalert", choices=("on", "off"), default="on",
                    help="off: the agent alone (a large fleet on a small machine; no ratio)")
    ap.add_argument("--log-level", default="error", help="the agent's log level (warning: failed evaluations)")
    args = ap.parse_args()
    needed = ("victoria-metrics", "vmagent", "vmalert") if args.vmalert == "on" else ("victoria-metrics", "vmagent")
    missing = [b for b in needed if shutil.which(b) is None]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} on PATH (apt-get install victoria-metrics)")
    configure_logging("console", args.log_level)
    print(f"{'targets':>8} {'agent (ms)':>11} {'vmalert (ms)':>13} {'agent/vmalert':>14} {'rounds':>7} "
          f"{'agent CPU/round (ms)':>21}")
    for n in args.targets or [100, 1000]:
        with running_fleet(n) as urls:
            r = asyncio.run(bench(urls, args.minutes, args.interval, args.vmalert == "on"))
        print(f"{n:>8} {r['agent_s'] * 1000:>11.1f} {r['vmalert_s'] * 1000:>13.1f} "
              f"{r['agent_s'] / r['vmalert_s']:>14.2f} {r['rounds']:>7.0f} {r['agent_cpu_s'] * 1000:>21.1f}",
              flush=True)


if __name__ == "__main__":
    main()
