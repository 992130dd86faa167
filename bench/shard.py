"""A scrape shard as deployed: one `sre-agent run` process scraping its hashmod share of a simulated fleet
and remote-writing what it scraped (and its recording results) to a real VictoriaMetrics.

    python bench/shard.py                                   # 1,000 simulated targets, 2 shards, 5 s, 2 minutes
    python bench/shard.py --targets 2000 --shards 2 --interval 15 --minutes 3

It starts `sre-agent simulate` (its own processes, not counted), a VictoriaMetrics single node and the
agent configured as ``deploy/kubernetes/shards`` configures a shard: ``scrape.shards: {total: S,
index: 0}`` over every simulated target (so it keeps its ~1/S share by Prometheus' hashmod),
``store.keep_all``, no rules, ``remote_write: [{write: [scraped]}]``. After a warm-up of two intervals
it reads, over the rest of the run, the agent process' CPU time from ``/proc/<pid>/stat`` (utime +
stime), its RSS and its own counters (remote-write samples and compressed bytes the TSDB acknowledged),
and counts the target scrapes that ran in the TSDB (one ``up`` sample each: a cycle longer than the
interval skips the next). It prints CPU per target scrape, cores per 1,000 targets at 15 s, samples
written per target scrape, wire bytes per sample, and the TSDB's own storage bytes per row after a
forced flush (a short run compresses worse than a long one: an upper bound). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from fleet import free_port, proc_cpu_s, rss_mib, running_fleet  # type: ignore[import-not-found]
from remote_eval import running  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def _metric_sum(text: str, name: str, label_re: str = "") -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if label_re and not re.search(label_re, m.group(1) or ""):
            continue
        total += float(m.group(2))
    return total


def _wait_agent(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"agent exited with {proc.returncode}")
        try:
            _get(f"http://127.0.0.1:{port}/readyz")
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("agent not ready")


def bench(urls: list[str], shards: int, interval: float, minutes: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        vm_port, agent_port = free_port(), free_port()
        vm = f"http://127.0.0.1:{vm_port}"
        cfg = {
            "targets": [{"url": u, "job": "vllm"} for u in urls],
            "scrape": {"interval": f"{interval:g}s", "timeout": f"{min(interval, 10):g}s", "concurrency": 256,
                       "shards": {"total": shards, "index": 0}},
            "remote_write": [{"url": f"{vm}/api/v1/write", "write": ["scraped"]}],
            "nvml": {"enabled": "false"}, "server": {"listen": f"127.0.0.1:{agent_port}"},
            # as deploy/kubernetes/shards: no rules (the central pair evaluates), every scraped family kept
            "rules": {"files": []}, "store": {"keep_all": True},
            "state": {"path": str(work / "agent.db")}, "log": {"level": "error"},
        }
        (work / "agent.yaml").write_text(json.dumps(cfg))
        with running(["victoria-metrics", f"-httpListenAddr=127.0.0.1:{vm_port}", f"-storageDataPath={work}/vm",
                      "-search.latencyOffset=1s", "-loggerLevel=ERROR"], vm_port, "VictoriaMetrics"):
            proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(work / "agent.yaml")],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _wait_agent(agent_port, proc)
                time.sleep(2 * interval)  # warm-up: series caches filled, the queue at its steady state
                kept = len(json.loads(_get(f"http://127.0.0.1:{agent_port}/api/v1/targets"))["data"]["targets"])
                m0, c0, t0 = _get(f"http://127.0.0.1:{agent_port}/metrics"), proc_cpu_s(proc.pid), time.monotonic()
                time.sleep(max(interval, minutes * 60 - 2 * interval))
                m1, c1, t1 = _get(f"http://127.0.0.1:{agent_port}/metrics"), proc_cpu_s(proc.pid), time.monotonic()
                rss = rss_mib(proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            _get(f"{vm}/internal/force_flush")
            time.sleep(2)
            vmm = _get(f"{vm}/metrics")
            # the scrapes that really ran in the window: one `up` sample each, counted in the TSDB
            query = urllib.parse.urlencode({"query": f'sum(count_over_time(up{{job="vllm"}}[{int(t1 - t0)}s]))',
                                            "time": f"{time.time() - (time.monotonic() - t1):.3f}"})
            result = json.loads(_get(f"{vm}/api/v1/query?{query}"))["data"]["result"]
            ups = float(result[0]["value"][1]) if result else 0.0
    samples = _metric_sum(m1, "sre_agent_remote_write_sent_samples_total") - _metric_sum(
        m0, "sre_agent_remote_write_sent_samples_total")
    wire = _metric_sum(m1, "sre_agent_remote_write_sent_bytes_total") - _metric_sum(
        m0, "sre_agent_remote_write_sent_bytes_total")
    window = t1 - t0
    cycles = _metric_sum(m1, "sre_agent_scrape_cycles_total") - _metric_sum(m0, "sre_agent_scrape_cycles_total")
    scrapes = ups  # target scrapes that ran (a cycle longer than the interval skips the next)
    pending = _metric_sum(m1, "sre_agent_remote_write_pending_samples")
    dropped = _metric_sum(m1, "sre_agent_remote_write_dropped_samples_total") - _metric_sum(
        m0, "sre_agent_remote_write_dropped_samples_total")
    cpu = c1 - c0
    rows = _metric_sum(vmm, "vm_rows", r'type="storage/')
    size = _metric_sum(vmm, "vm_data_size_bytes", r'type="storage/')
    return {"kept": kept, "window_s": window, "target_scrapes": scrapes, "cycles": cycles,
            "cycles_expected": window / interval,
            "last_cycle_s": _metric_sum(m1, "sre_agent_scrape_cycle_duration_seconds"),
            "rw_pending_end": pending, "rw_dropped": dropped, "cpu_s": cpu, "cores": cpu / window,
            "cpu_ms_per_target_scrape": cpu / scrapes * 1000 if scrapes else float("nan"),
            "cores_per_1k_at_15s": cpu / scrapes * 1000 / 15 if scrapes else float("nan"),
            "samples_per_target_scrape": samples / scrapes if scrapes else float("nan"),
            "wire_bytes_per_sample": wire / samples if samples else float("nan"),
            "tsdb_bytes_per_row": size / rows if rows else float("nan"), "tsdb_rows": rows, "rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=1000, help="simulated targets in the whole fleet")
    ap.add_argument("--shards", type=int, default=2, help="scrape.shards.total (this agent is index 0)")
    ap.add_argument("--interval", type=float, default=5.0, help="scrape and evaluation interval, seconds")
    ap.add_argument("--minutes", type=float, default=2.0)
    args = ap.parse_args()
    if shutil.which("victoria-metrics") is None:
        raise SystemExit("needs victoria-metrics on PATH (apt-get install victoria-metrics)")
    with running_fleet(args.targets) as urls:
        r = bench(urls, args.shards, args.interval, args.minutes)
    print(json.dumps({"fleet": args.targets, "shards": args.shards, "interval_s": args.interval, **r}, indent=1))


if __name__ == "__main__":
    main()
