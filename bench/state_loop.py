"""Does a slow disk stall the agent? /healthz and scrape latency while the state database commits.

Every notification costs the state database three commits (enqueue, attempt, acknowledge)
and every rule evaluation one more, each ending in an ``fsync``. On a busy or network disk an
``fsync`` takes tens of milliseconds; if commits ran on the event loop, every one of them
would hold up scrapes and ``/healthz`` for that long. This runs the real agent
(``python -m agent run``) twice against the same local target and webhook, once on the plain
disk and once with every ``fsync``/``fdatasync`` slowed to ``--fsync-ms`` (an ``LD_PRELOAD``
shim compiled here with ``cc``), and reports, from outside the process, ``/healthz``
round-trip times (sampled every 20 ms) and the agent's own last-scrape durations.

    python bench/state_loop.py                  # about 70 s
    python bench/state_loop.py --seconds 10     # a smoke run
    python bench/state_loop.py --agent-src DIR  # run another checkout's agent (before/after)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = (ROOT / "tests" / "fixtures" / "vllm" / "v1_0.8_prodstack_qwen32b_metrics.txt").read_bytes()
ALERTS = 10  # each its own group, re-notified every second: about 10 notifications (30 commits) a second

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
static void pause_ms(void) {
    const char *v = getenv("SLOW_FSYNC_MS");
    long ms = v ? atol(v) : 50;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, 0);
}
int fsync(int fd) { static int (*real)(int); if (!real) real = dlsym(RTLD_NEXT, "fsync"); pause_ms(); return real(fd); }
int fdatasync(int fd) {
    static int (*real)(int); if (!real) real = dlsym(RTLD_NEXT, "fdatasync"); pause_ms(); return real(fd);
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_shim(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("this benchmark needs a C compiler (cc) for its slow-fsync shim")
    src, lib = tmp / "slowfsync.c", tmp / "slowfsync.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"], check=True)
    return lib


def write_config(tmp: Path, target: str, hook: str, port: int, db: str) -> Path:
    rules = tmp / "bench.rules.yaml"
    rules.write_text("groups:\n  - name: bench\n    interval: 1s\n    rules:\n" + "".join(
        f"      - alert: Bench{i}\n        expr: vector(1)\n" for i in range(ALERTS)))
    cfg = tmp / "agent.yaml"
    cfg.write_text(f"""
targets: [{{url: "{target}"}}]
scrape: {{interval: 1s, timeout: 1s}}
nvml: {{enabled: false}}
server: {{listen: "127.0.0.1:{port}"}}
rules: {{files: ["{rules}"]}}
state: {{path: "{db}"}}
receivers: [{{name: hook, webhook: {{url: "{hook}"}}}}]
route: {{receiver: hook, group_by: [alertname], group_wait: 0s, group_interval: 1s, repeat_interval: 1s}}
log: {{level: warning}}
""")
    return cfg


async def measure(src: Path, cfg: Path, env: dict[str, str], port: int, seconds: float) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agent", "run", "--config", str(cfg),
                                                cwd=src, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    health: list[float] = []
    scrape: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with http.get(base + "/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not become ready within 30 s")
                await asyncio.sleep(0.1)
            end = time.monotonic() + seconds
            next_metrics = 0.0
            while time.monotonic() < end:
                t0 = time.perf_counter()
                async with http.get(base + "/healthz") as r:
                    await r.read()
                health.append(time.perf_counter() - t0)
                if time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + 1.0
                    async with http.get(base + "/metrics") as r:
                        for line in (await r.text()).splitlines():
                            if line.startswith("sre_agent_target_scrape_duration_seconds{"):
                                scrape.append(float(line.rsplit(" ", 1)[1]))
                await asyncio.sleep(0.02)
    finally:
        proc.terminate()
        await proc.wait()
    health.sort()
    return {"health_p50": statistics.median(health), "health_p99": health[int(len(health) * 0.99) - 1],
            "health_max": health[-1], "scrape_p50": statistics.median(scrape), "scrape_max": max(scrape)}


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="sampling time per mode (default 30)")
    p.add_argument("--fsync-ms", type=int, default=50, help="added to every fsync in the slow mode (default 50)")
    p.add_argument("--agent-src", type=Path, default=ROOT, help="checkout whose agent/ to run (default: this one)")
    args = p.parse_args()
    received = 0

    async def target(_: web.Request) -> web.Response:
        return web.Response(body=PAYLOAD, content_type="text/plain")

    async def hook(_: web.Request) -> web.Response:
        nonlocal received
        received += 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", target)
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    side = free_port()
    await web.TCPSite(runner, "127.0.0.1", side).start()
    results: dict[str, dict[str, float]] = {}
    notified: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="sre-agent-bench-") as tmp_name:
        tmp = Path(tmp_name)
        shim = build_shim(tmp)
        for mode in ("plain disk", f"fsync +{args.fsync_ms} ms"):
            port = free_port()
            cfg = write_config(tmp, f"http://127.0.0.1:{side}/metrics", f"http://127.0.0.1:{side}/hook", port,
                               str(tmp / f"state-{port}.db"))
            env = {**os.environ, "PYTHONPATH": str(args.agent_src.resolve())}
            if mode != "plain disk":
                env |= {"LD_PRELOAD": str(shim), "SLOW_FSYNC_MS": str(args.fsync_ms)}
            before = received
            results[mode] = await measure(args.agent_src.resolve(), cfg, env, port, args.seconds)
            notified[mode] = received - before
    await runner.cleanup()
    plain = results["plain disk"]
    print(f"agent from {args.agent_src}; {ALERTS} alerts re-notified every second; {args.seconds:g} s per mode")
    print(f"{'mode':18} {'healthz p50':>12} {'p99':>9} {'max':>9} {'scrape p50':>11} {'max':>9} {'notified':>9}")
    for mode, r in results.items():
        print(f"{mode:18} {r['health_p50'] * 1e3:10.2f}ms {r['health_p99'] * 1e3:7.2f}ms {r['health_max'] * 1e3:7.1f}ms"
              f" {r['scrape_p50'] * 1e3:9.2f}ms {r['scrape_max'] * 1e3:7.1f}ms {notified[mode]:9d}")
    slow = results[f"fsync +{args.fsync_ms} ms"]
    ratio = {k: slow[k] / plain[k] for k in plain}
    print(f"slow/plain: healthz p99 {ratio['health_p99']:.2f}x, max {ratio['health_max']:.2f}x; "
          f"scrape p50 {ratio['scrape_p50']:.2f}x, max {ratio['scrape_max']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
