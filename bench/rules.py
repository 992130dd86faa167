"""Rule evaluation cost: the agent's engine against a real Prometheus 2.42, same rules, same targets.

    python bench/rules.py                      # 100 and 1,000 simulated targets, 4 minutes each
    python bench/rules.py --targets 100 --minutes 2

For each fleet size it starts `sre-agent simulate` (its own process), then, one after the
other, lets the agent and a Prometheus (if `prometheus` is on PATH; Debian's is 2.42)
scrape the same targets every `--interval` and evaluate the bundled rules/*.rules.yaml
every `--interval`. It reports the wall time of one evaluation of the whole rule set:
for the agent the sum over groups of each group's evaluation time, for Prometheus the
sum of `prometheus_rule_group_last_duration_seconds`, both averaged over the evaluations
of the last half of the run (when the 5-minute windows hold the most data), and the
ratio. Range windows longer than the run (the throughput baseline's 1 h) hold only what
the run scraped, equally for both. Not a test: compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from fleet import find_prometheus, prom_metrics, running_fleet, running_prometheus  # type: ignore[import-not-found]

from agent.app.daemon import Agent
from agent.app.logs import configure_logging
from agent.config import Config, bundled_rules_dir


async def bench_agent(urls: list[str], minutes: float, interval: float) -> dict[str, float]:
    cfg = Config.model_validate({
        "targets": [{"url": u} for u in urls],
        "scrape": {"interval": f"{interval:g}s", "timeout": f"{interval:g}s", "concurrency": 256},
        "rules": {"files": [str(bundled_rules_dir() / "*.rules.yaml")], "evaluation_interval": f"{interval:g}s"},
        "nvml": {"enabled": "false"},
        "server": {"listen": "127.0.0.1:0"},
    })
    agent = Agent(cfg)
    await agent.start(serve_http=False)
    step_ms = int(interval * 1000)
    seen: dict[tuple[int, int], float] = {}  # (group index, evaluation round) -> seconds
    end = time.monotonic() + minutes * 60
    try:
        while time.monotonic() < end:
            await asyncio.sleep(0.5)
            for i, g in enumerate(agent.rules.groups):
                if g.last_eval_ms:
                    seen[(i, g.last_eval_ms // step_ms)] = g.eval_seconds
        series = agent.store.stats()["series"]
        rules = sum(len(g.rules) for g in agent.rules.groups)
    finally:
        await agent.stop()
    by_round: dict[int, float] = {}
    for (_, rnd), secs in seen.items():
        by_round[rnd] = by_round.get(rnd, 0.0) + secs
    per_round = [by_round[r] for r in sorted(by_round)]
    last_half = per_round[len(per_round) // 2:] or per_round
    return {"eval_s": statistics.mean(last_half) if last_half else float("nan"), "rounds": len(per_round),
            "series": series, "rules": rules}


def _rule_durations(port: int) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in prom_metrics(port)
               if line.startswith("prometheus_rule_group_last_duration_seconds{"))


def bench_prometheus(binary: str, urls: list[str], minutes: float, interval: float) -> dict[str, float]:
    rule_files = [str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yaml"))]
    samples: list[float] = []
    with running_prometheus(binary, urls, interval, rule_files) as (port, _):
        end = time.monotonic() + minutes * 60
        time.sleep(interval)
        while time.monotonic() < end:
            time.sleep(interval)
            try:
                samples.append(_rule_durations(port))
            except OSError:
                continue
    last_half = samples[len(samples) // 2:] or samples
    return {"eval_s": statistics.mean(last_half) if last_half else float("nan"), "rounds": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--prometheus", default="auto", help="path to prometheus, 'auto' (PATH) or 'off'")
    args = ap.parse_args()
    configure_logging("console", "warning")
    prom = find_prometheus(args.prometheus)
    for n in args.targets:
        with running_fleet(n) as urls:
            a = asyncio.run(bench_agent(urls, args.minutes, args.interval))
            print(f"\n== {n} targets, {args.minutes:g} min, scrape and evaluate every {args.interval:g}s ==")
            print(f"agent:      {a['eval_s'] * 1000:8.1f} ms per evaluation of all {a['rules']:.0f} rules "
                  f"({a['rounds']:.0f} rounds, {a['series']:,.0f} series in the store)")
            if prom:
                p = bench_prometheus(prom, urls, args.minutes, args.interval)
                print(f"prometheus: {p['eval_s'] * 1000:8.1f} ms per evaluation "
                      f"(sum of prometheus_rule_group_last_duration_seconds, {p['rounds']:.0f} samples)")
                print(f"ratio (agent / prometheus): {a['eval_s'] / p['eval_s']:.2f}x  (goal: <= 2x)")
            else:
                print("prometheus: not found on PATH (apt-get install prometheus) - comparison skipped")


if __name__ == "__main__":
    main()
