"""Per-rule evaluation cost of the bundled rule set, with a cProfile of one evaluation.

    python bench/profile_rules.py                      # 100 simulated targets, 26 scrape cycles
    python bench/profile_rules.py --targets 1000 --cycles 12
    python bench/profile_rules.py --save /tmp/s.pkl    # keep the scraped store ...
    python bench/profile_rules.py --load /tmp/s.pkl --dump /tmp/a.txt   # ... replay it, write every rule's result

It starts `sre-agent simulate` in a subprocess and scrapes it `--cycles` times 15 s apart
on an injected clock, evaluating the rules after each cycle as the daemon does ("live":
the mean and best whole-set time over the last half of the cycles, when the 5-minute
windows are full). Then it replays the last `--repeat` + 1 evaluation times on the final
store (the first one as a warm-up), so that every timed evaluation sees one new sample
per series as in the daemon, and prints each rule's best time, the total, and a cProfile
of one more evaluation sorted by own time.

`--save`/`--load` pickle the store so that two versions of the engine can be timed, and
their results compared (`--dump`: each rule's expression evaluated at the last cycle's
time, one sorted line per sample, floats as `repr`), on exactly the same data; `--load`
skips the live part. Not a test: compare numbers within one machine and one run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pickle
import pstats
import statistics
import time
from pathlib import Path

from fleet import start_fleet  # type: ignore[import-not-found]

from agent.app.daemon import Agent, rule_paths
from agent.app.logs import configure_logging
from agent.config import Config, bundled_rules_dir
from agent.promql import Engine, Sample, Scalar
from agent.rules.files import load_rule_files
from agent.rules.manager import RuleManager
from agent.store import Store

T0 = 1_700_000_000
STEP_S = 15


def _rule_files() -> list[str]:
    return [str(bundled_rules_dir() / "*.rules.yaml")]


async def _scrape(urls: list[str], cycles: int) -> tuple[Store, int, list[float]]:
    now = [0.0]
    cfg = Config.model_validate({
        "targets": [{"url": u} for u in urls], "scrape": {"interval": "15s", "timeout": "10s", "concurrency": 256},
        "rules": {"files": _rule_files()}, "nvml": {"enabled": "false"},
    })
    agent = Agent(cfg, clock=lambda: now[0])
    live: list[float] = []
    for i in range(cycles):
        now[0] = T0 + i * STEP_S
        await agent.scrape_cycle()
        t0 = time.perf_counter()
        agent.rules.eval_all(int(now[0] * 1000))
        live.append(time.perf_counter() - t0)
        await asyncio.sleep(0.3)  # let the simulator's counters move between scrapes
    await agent.scraper.close()
    return agent.store, int(now[0] * 1000), live


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=26)
    ap.add_argument("--repeat", type=int, default=5, help="replayed evaluations; the best per rule is shown")
    ap.add_argument("--top", type=int, default=12, help="rules to list")
    ap.add_argument("--save", type=Path, help="pickle the scraped store (and the evaluation time) here")
    ap.add_argument("--load", type=Path, help="use a pickled store instead of scraping")
    ap.add_argument("--dump", type=Path, help="write every rule's result at the evaluation time here")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    configure_logging("console", "warning")

    if args.load:
        store, t_ms = pickle.loads(args.load.read_bytes())
    else:
        proc, urls = start_fleet(args.targets)
        try:
            store, t_ms, live = asyncio.run(_scrape(urls, args.cycles))
        finally:
            proc.terminate()
            proc.wait()
        half = live[len(live) // 2:]
        print(f"live: whole set mean {statistics.mean(half) * 1000:.2f} ms, best {min(half) * 1000:.2f} ms "
              f"over the last {len(half)} cycles")
    if args.save:
        args.save.write_bytes(pickle.dumps((store, t_ms)))
    print(f"store: {store.stats()}")

    groups = load_rule_files(rule_paths(_rule_files()))
    engine = Engine(store, subquery_step_ms=STEP_S * 1000)
    if args.dump:
        lines = []
        for spec in groups:
            for rs in spec.rules:
                res = engine.instant(rs.expr, t_ms)
                if isinstance(res, Scalar):
                    lines.append(f"{rs.name} scalar {res.value!r}")
                elif isinstance(res, list):
                    lines.extend(sorted(f"{rs.name} {s.labels} {s.value!r}" for s in res if isinstance(s, Sample)))
        args.dump.write_text("\n".join(lines) + "\n")
        print(f"wrote {len(lines)} result lines to {args.dump}")

    rules = RuleManager(groups, store, Engine(store, subquery_step_ms=STEP_S * 1000), default_interval_s=STEP_S)
    best: dict[str, float] = {}
    totals = []
    for n in range(-1, args.repeat):  # -1: the warm-up (fills the engine's caches)
        at_ms = t_ms - (args.repeat - 1 - n) * STEP_S * 1000
        t0 = time.perf_counter()
        for g in rules.groups:
            rules.eval_group(g, at_ms)
        if n < 0:
            continue
        totals.append(time.perf_counter() - t0)
        for g in rules.groups:
            for rule in g.rules:
                ms = rule.eval_seconds * 1000
                best[rule.spec.name] = min(best.get(rule.spec.name, ms), ms)
    rows = sorted(((ms, name) for name, ms in best.items()), reverse=True)
    for ms, name in rows[: args.top]:
        print(f"{ms:8.2f} ms {name}")
    print(f"replay: sum of per-rule best {sum(best.values()):.2f} ms; whole set best {min(totals) * 1000:.2f} ms, "
          f"median {statistics.median(totals) * 1000:.2f} ms")
    if not args.no_profile:
        prof = cProfile.Profile()
        prof.runcall(rules.eval_all, t_ms + STEP_S * 1000)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
