"""Scrape-cycle cost over a simulated fleet: the agent's scraper against a real Prometheus.

    python bench/fleet.py                    # 100 and 1,000 targets
    python bench/fleet.py --targets 100 --cycles 3 --prometheus off

For each fleet size it starts `sre-agent simulate` in its own process (so the fleet's
CPU is not counted), then measures, in this process, a number of scrape cycles of the
agent's real Scraper + Store with the default keep-list: wall time per cycle, CPU
seconds per cycle and per scraped sample (HTTP + parse + store), and RSS. If a
`prometheus` binary is on PATH (Debian's package is 2.42), it then scrapes the same
targets at the same interval and its CPU per scraped sample is read from
/proc/<pid>/stat and its own `prometheus_tsdb_head_samples_appended_total`; the ratio
is printed. Not a test: numbers depend on the machine, ratios are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.app.daemon import keep_list
from agent.app.logs import configure_logging
from agent.collect.discovery import TargetSpec, instance_of
from agent.collect.scrape import Scraper
from agent.config import Config
from agent.store import Store

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def start_fleet(n: int, scenario: str = "steady") -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--port", "0", "--replicas", str(n), "--lmdeploy", "0",
         "--scenario", scenario, "--log-level", "error"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    urls = [proc.stdout.readline().strip() for _ in range(n)]
    if not all(u.startswith("http://") for u in urls):
        proc.kill()
        raise SystemExit(f"simulator did not start: {urls[:3]}")
    return proc, urls


#: Replicas per simulator process (the simulator serves at most 1,024): larger fleets start several.
FLEET_CHUNK = 1000


@contextmanager
def running_fleet(n: int, *, incident: int = 0) -> Iterator[list[str]]:
    """``sre-agent simulate`` processes with ``n`` replicas in all; yields their metrics URLs. The first
    ``incident`` of them run the ``slow_interconnect`` scenario in a process of their own: from a minute
    after start their inter-token latency is high, so per-instance alerts are pending on them."""
    procs: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    try:
        if incident:
            proc, chunk = start_fleet(incident, "slow_interconnect")
            procs.append(proc)
            urls += chunk
        for start in range(incident, n, FLEET_CHUNK):
            proc, chunk = start_fleet(min(FLEET_CHUNK, n - start))
            procs.append(proc)
            urls += chunk
        yield urls
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)



async def bench_agent(urls: list[str], cycles: int, interval: float) -> dict[str, float]:
    store = Store(3_600_000, keep_list(Config()))
    scraper = Scraper(store, timeout_s=interval, body_limit=16 << 20, concurrency=256)
    scraper.set_targets(
        TargetSpec(u, (("instance", instance_of(u)), ("job", "vllm"))) for u in urls
    )
    await scraper.scrape_all()  # warm-up: fills the series caches
    walls, cpus, samples = [], [], 0
    for _ in range(cycles):
        started = time.monotonic()
        w0, c0 = time.perf_counter(), time.process_time()
        await scraper.scrape_all()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        samples += sum(t.samples for t in scraper.targets.values())
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    down = sum(t.health != "up" for t in scraper.targets.values())
    await scraper.close()
    return {
        "wall_s": sorted(walls)[len(walls) // 2],
        "cpu_s": sorted(cpus)[len(cpus) // 2],
        "cpu_us_per_sample": sum(cpus) / samples * 1e6 if samples else float("nan"),
        "samples_per_cycle": samples / cycles,
        "stored_series": store.stats()["series"],
        "rss_mib": rss_mib(),
        "down": down,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prom_metrics(port: int) -> list[str]:
    """The lines of a local Prometheus' own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode()).splitlines()


def _prom_counter(port: int, name: str) -> float:
    for line in prom_metrics(port):
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


@contextmanager
def running_prometheus(binary: str, urls: list[str], interval: float, rule_files: list[str] | None = None
                       ) -> Iterator[tuple[int, int]]:
    """A Prometheus scraping ``urls`` (and evaluating ``rule_files``) every ``interval``, with
    its data in a temporary directory; yields (port, pid)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        targets = ", ".join(f"'{instance_of(u)}'" for u in urls)
        rules = ", ".join(f"'{f}'" for f in rule_files or [])
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(
            f"global: {{scrape_interval: {interval:g}s, scrape_timeout: {interval:g}s, "
            f"evaluation_interval: {interval:g}s}}\nrule_files: [{rules}]\n"
            f"scrape_configs:\n- job_name: vllm\n  static_configs:\n  - targets: [{targets}]\n"
        )
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            yield port, proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def bench_prometheus(binary: str, urls: list[str], cycles: int, interval: float) -> dict[str, float]:
    with running_prometheus(binary, urls, interval) as (port, pid):
        time.sleep(2 * interval + 2)  # start-up and the first scrapes (series creation) out of the window
        c0, a0 = proc_cpu_s(pid), _prom_counter(port, "prometheus_tsdb_head_samples_appended_total")
        time.sleep(cycles * interval)
        c1, a1 = proc_cpu_s(pid), _prom_counter(port, "prometheus_tsdb_head_samples_appended_total")
        rss = rss_mib(pid)
    appended = a1 - a0
    scraped = appended - 5 * len(urls) * cycles  # minus up/scrape_* synthetic series per scrape
    return {"cpu_s_per_cycle": (c1 - c0) / cycles, "cpu_us_per_sample": (c1 - c0) / scraped * 1e6,
            "samples_per_cycle": scraped / cycles, "rss_mib": rss}


def find_prometheus(choice: str) -> str | None:
    """``--prometheus``: 'auto' looks on PATH, 'off' disables, anything else is a path."""
    if choice == "auto":
        return shutil.which("prometheus")
    return None if choice == "off" else choice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between cycles (default 5)")
    ap.add_argument("--prometheus", default="auto", help="path to prometheus, 'auto' (PATH) or 'off'")
    args = ap.parse_args()
    configure_logging("console", "warning")
    prom = find_prometheus(args.prometheus)
    for n in args.targets:
        with running_fleet(n) as urls:
            a = asyncio.run(bench_agent(urls, args.cycles, args.interval))
            print(f"\n== {n} targets, {args.cycles} cycles every {args.interval:g}s ==")
            print(f"agent:      wall {a['wall_s'] * 1000:8.1f} ms/cycle  cpu {a['cpu_s'] * 1000:8.1f} ms/cycle  "
                  f"{a['cpu_us_per_sample']:6.2f} us/scraped sample  {a['samples_per_cycle']:,.0f} samples/cycle  "
                  f"{a['stored_series']:,} series stored  RSS {a['rss_mib']:.0f} MiB  down {a['down']:.0f}")
            if prom:
                p = bench_prometheus(prom, urls, args.cycles, args.interval)
                print(f"prometheus: cpu {p['cpu_s_per_cycle'] * 1000:8.1f} ms/cycle  "
                      f"{p['cpu_us_per_sample']:6.2f} us/scraped sample  {p['samples_per_cycle']:,.0f} samples/cycle  "
                      f"RSS {p['rss_mib']:.0f} MiB")
                print(f"ratio (prometheus / agent CPU per scraped sample): "
                      f"{p['cpu_us_per_sample'] / a['cpu_us_per_sample']:.2f}x")
            else:
                print("prometheus: not found on PATH (apt-get install prometheus) - comparison skipped")


if __name__ == "__main__":
    main()
