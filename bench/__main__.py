"""``python -m bench``: every comparison in one run, one table of ratios.

    python -m bench                         # about 10 minutes: 1,000 simulated targets at 5 s
    python -m bench --quick --json q.json   # a smoke run, under 2 minutes: 100 targets at 2 s

Rows (bench/README.md says what each measures): ingest against prometheus_client's parser; the real
``sre-agent run`` process against Prometheus 2.42 and against vmagent + victoria-metrics + vmalert on
the same simulated vLLM fleet (CPU from /proc, RSS, ticks on time); rule evaluation time against
Prometheus' own; Prometheus mode against vmalert; 10 % of the targets hanging; the outbox. One fleet
(``sre-agent simulate`` processes, not counted) serves every row; the contenders run one after the
other, never together. The machine's load average is recorded beside the table: numbers from a
loaded machine are not the agent's.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shutil
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]  # the benches import each other by module name

import ingest  # type: ignore[import-not-found]  # noqa: E402
import outbox  # type: ignore[import-not-found]  # noqa: E402
import remote_eval  # type: ignore[import-not-found]  # noqa: E402
from fleet import running_fleet  # type: ignore[import-not-found]  # noqa: E402
from procs import hanging_targets  # type: ignore[import-not-found]  # noqa: E402
from table import Row, render, write_json  # type: ignore[import-not-found]  # noqa: E402
from whole import (  # type: ignore[import-not-found]  # noqa: E402
    Job,
    Window,
    measure_agent,
    measure_prometheus,
    measure_vm_stack,
)

from agent.app.logs import configure_logging  # noqa: E402

#: When the slow-interconnect replicas' incident has begun: the scenario's onset (60 s of model time at
#: speed 1) and a little more.
INCIDENT_ONSET_S = 70.0


def ingest_rows(quick: bool) -> list[Row]:
    reps = 3 if quick else 7
    rows = []
    for title, payload, scrapes in ingest.payloads(quick):
        us = ingest.bench(title, payload, scrapes, reps, quiet=True)
        store = max(0.0, 1 - us["scan"] / us["c"])
        rows.append(Row(f"ingest: {title} ({us['samples']:.0f} samples)", "us/scrape", us["c"], us["a"],
                        us["a"] / us["c"], (">=", 20.0),
                        note=f"speed-up (theirs/ours); the scan is {1 - store:.0%} of ours, the store {store:.0%}; "
                             f"full validated parse alone {us['a'] / us['b']:.1f}x"))
    return rows


def whole_rows(a: Window, prom: Window | None, vm: Window | None, interval: float, n: int) -> list[Row]:
    p = prom or Window()
    v = vm or Window()
    cpu = a.cpu_per_interval_s
    peers_up = [x for x in (p.up, v.up) if math.isfinite(x)]  # a missing peer has none
    return [
        Row(f"agent vs Prometheus: CPU per {interval:g} s interval, {n} targets", "CPU s", cpu,
            p.cpu_per_interval_s, cpu / p.cpu_per_interval_s, ("<=", 0.6),
            note="process CPU from /proc/<pid>/stat over the same window; the simulator is not counted"),
        Row("agent CPU per interval, share of one core", "%", 100 * cpu / interval, goal=("<=", 15.0)),
        Row("agent RSS (Prometheus beside it)", "MB", a.rss_mib * 1.048576, p.rss_mib * 1.048576,
            a.rss_mib / p.rss_mib, ("<=", 1000.0), on_ours=True, note="the goal is on ours"),
        Row("agent ticks late or missed (Prometheus: missed rule iterations)", "ticks", a.late + a.missed,
            p.missed_evals, goal=("==", 0.0),
            note=f"{a.cycles:.0f} scrape cycles run of {a.expected:.0f} due in the window; slowest sampled cycle "
                 f"{a.max_cycle_s:.2f} s of a {interval:g} s interval"),
        Row("agent vs vmagent + victoria-metrics + vmalert: CPU per interval", "CPU s", cpu,
            v.cpu_per_interval_s, cpu / v.cpu_per_interval_s, ("<=", 1.0),
            note=f"the stack's RSS {v.rss_mib * 1.048576:.0f} MB (three processes)"),
        Row("targets up at the window's end, the fewest of the three", "targets", a.up, min(peers_up, default=None),
            min([a.up, *peers_up]) / n, ("==", 1.0),
            note=f"ours, then the fewer of Prometheus ({p.up:.0f}) and the VM stack ({v.up:.0f}); ratio = the fewest "
                 f"of the three / {n} targets: below 1, a contender's scrapes failed (the simulator too slow for it) "
                 "and the CPU rows above compare unequal work"),
        Row("rules: one evaluation of the bundled rule set", "ms", a.eval_s * 1000, p.eval_s * 1000,
            a.eval_s / p.eval_s, ("<=", 1.0),
            note="sum over groups of sre_agent_rule_group_last_duration_seconds vs "
                 "prometheus_rule_group_last_duration_seconds, mean of once-per-interval samples"),
    ]


def prometheus_mode_rows(urls: list[str], quick: bool, interval: float, window: float) -> list[Row]:
    """``remote_eval.py``'s run: 2 minutes for the full run's 90 s windows (its averages take the second half)."""
    if any(shutil.which(b) is None for b in ("victoria-metrics", "vmagent", "vmalert")):
        return [Row("Prometheus mode: rule set against vmalert", "ms", None, note="VictoriaMetrics not installed")]
    r = asyncio.run(remote_eval.bench(urls, 0.35 if quick else (window + 30) / 60, interval, True,
                                      group_interval=interval if quick else None))
    return [Row("Prometheus mode: one evaluation of the rule set, vs vmalert", "ms", r["agent_s"] * 1000,
                r["vmalert_s"] * 1000, r["agent_s"] / r["vmalert_s"], ("<=", 1.0),
                note=f"same VictoriaMetrics fed by vmagent; agent CPU {r['agent_cpu_s'] * 1000:.0f} ms per round")]


def fault_rows(job: Job) -> list[Row]:
    """The same job run twice at once: by a clean agent over the healthy targets, and by a faulted one that
    also scrapes 10 % more targets that never answer. Both see the same fleet at the same moments, so a
    healthy target's alert may differ only by the fault (or by noise: an alert near its threshold that the two
    scrapers see on and off at different moments). An alert changed if it was active (pending or firing) in
    every poll of one agent's window and in none of the other's. The fleet's first tenth has a slow
    interconnect, so there are per-instance alerts to lose."""
    n_hang = max(1, len(job.urls) // 10)
    healthy = job.urls[:len(job.urls) - n_hang]
    with hanging_targets(n_hang) as hung, ThreadPoolExecutor(2) as pool:
        clean_run = pool.submit(measure_agent, replace(job, urls=healthy))
        f = measure_agent(replace(job, urls=healthy + hung))
        c = clean_run.result()
    instances = {u.split("/")[2] for u in healthy}
    hung_instances = {u.split("/")[2] for u in hung}
    lost = {a for a in c.always - f.ever if a[1] in instances}
    new = {a for a in f.always - c.ever if a[1] in instances}
    changed = Counter(name for name, _ in lost | new).most_common(3)
    steady = {a for a in c.always if a[1] in instances}
    return [
        Row(f"faults: {n_hang} more targets that hang, ticks late or missed", "ticks", f.late + f.missed,
            c.late + c.missed, goal=("==", 0.0),
            note=f"{f.cycles:.0f} cycles of {f.expected:.0f} due; slowest sampled {f.max_cycle_s:.2f} s (scrape "
                 f"timeout {job.timeout:g} s); theirs = the clean agent beside it"),
        Row("faults: healthy targets' alerts that changed", "alerts", len(lost | new), len(steady),
            goal=("==", 0.0),
            note=f"(alertname, instance) on healthy targets active throughout one agent's window and never in the "
                 f"other's: {len(lost)} lost, {len(new)} new; theirs = active throughout in the clean agent; the "
                 f"hanging targets raised {len({a for a in f.ever if a[1] in hung_instances})}; "
                 f"changed most: {', '.join(f'{k} {v}' for k, v in changed) or 'none'}"),
        Row("faults: agent CPU per interval, vs the clean agent", "CPU s", f.cpu_per_interval_s,
            c.cpu_per_interval_s, f.cpu_per_interval_s / c.cpu_per_interval_s,
            note="two agents and the simulator share the machine in this row"),
    ]


def outbox_rows(quick: bool) -> list[Row]:
    res = outbox.measure(200 if quick else 1000)
    full, memory = statistics.median(res["FULL"]), statistics.median(res["memory"])
    return [Row("outbox: notifications/s, synchronous=FULL vs in-memory", "notif/s", 1 / full, 1 / memory,
                memory / full, note="enqueue + attempt + ack each; the in-memory database is the floor")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 100 targets, 2 s interval, short windows")
    ap.add_argument("--json", type=Path, help="also write the table here")
    ap.add_argument("--targets", type=int, help="simulated targets (default 1000; --quick 100)")
    ap.add_argument("--window", type=float, help="measured seconds per contender (default 90; --quick 10)")
    ap.add_argument("--prometheus", default="prometheus", help="the Prometheus binary (default: on PATH)")
    args = ap.parse_args()
    configure_logging("console", "error")
    quick = args.quick
    n = args.targets or (100 if quick else 1000)
    interval = 2.0 if quick else 5.0
    window = args.window or (10.0 if quick else 90.0)
    prom = shutil.which(args.prometheus)
    vm_ok = all(shutil.which(b) for b in ("victoria-metrics", "vmagent", "vmalert"))
    started, load0 = time.time(), os.getloadavg()
    rows = ingest_rows(quick)
    print(f"ingest done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    # A tenth of the fleet has a slow interconnect: its per-instance alerts are what the faults row watches.
    with running_fleet(n, incident=max(1, n // 10)) as urls:
        onset = time.monotonic() + INCIDENT_ONSET_S
        job = Job(urls, interval, 0.8 * interval, interval if quick else None, 6.0 if quick else 20.0, window)
        a = measure_agent(job)
        p = measure_prometheus(prom, job) if prom else None
        v = measure_vm_stack(job) if vm_ok else None
        rows += whole_rows(a, p, v, interval, n)
        print(f"whole agent done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
        rows += prometheus_mode_rows(urls, quick, interval, window)
        time.sleep(max(0.0, onset - time.monotonic()))  # --quick gets here before the incident has begun
        rows += fault_rows(job)
    rows += outbox_rows(quick)
    meta: dict[str, object] = {
        "quick": quick, "targets": n, "interval_s": interval, "window_s": window,
        "seconds": round(time.time() - started),
        "loadavg_start": load0, "loadavg_end": os.getloadavg(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "prometheus": prom, "victoriametrics": vm_ok,
    }
    print(render(rows))
    print(f"\n{meta['seconds']} s; load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end "
          f"({os.cpu_count()} CPUs)")
    if args.json:
        write_json(args.json, rows, meta)


if __name__ == "__main__":
    main()
