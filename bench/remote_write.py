"""Remote-write throughput: samples a second encoded, queued in the state database and sent to a real VictoriaMetrics.

Stages, each timed on its own over the same samples (``--series`` series of rule-output shape, six
labels, ``--samples`` in all, a second apart per series):

* **encode**: :class:`~agent.act.remote_write.wire.Encoder` (protobuf) into ``WriteRequest`` bytes;
* **compress**: snappy block (cramjam) of 2,000-sample requests;
* **enqueue**: :meth:`RemoteWriteQueue.enqueue` as the daemon calls it, in evaluation-sized chunks
  (encode + SQLite insert + commit with ``fsync``, on the writer thread);
* **drain**: the sender emptying the queue into VictoriaMetrics (read rows, join, compress, POST, delete);
* **floor**: the same request bodies POSTed to VictoriaMetrics back to back with nothing else, the
  server-and-HTTP ceiling the drain is measured against.

The sample count VictoriaMetrics holds afterwards is checked. A comparison with vmagent is not made:
vmagent forwards remote write it receives (or scrapes), so it never does our encode-and-persist step;
the floor is the fair yardstick for what the queue adds.

    python bench/remote_write.py                         # 200,000 samples, about 10 s
    python bench/remote_write.py --samples 1000000 --series 5000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.act.remote_write.queue import RemoteWriteQueue, Sample  # noqa: E402
from agent.act.remote_write.wire import CONTENT_HEADERS, Encoder, compress  # noqa: E402
from agent.act.state import StateDB  # noqa: E402
from agent.config import RemoteWriteConfig  # noqa: E402
from agent.series import labels_from  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_samples(n: int, series: int, start_ms: int, name: str) -> list[Sample]:
    labels = [labels_from(name, {"job": "vllm", "namespace": "serving", "model": f"model-{i % 20}",
                                 "instance": f"10.0.{i // 250}.{i % 250}:8000", "cluster": "a"})
              for i in range(series)]
    return [(labels[i % series], float(i), start_ms + (i // series) * 1000) for i in range(n)]


async def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(f"{url}/-/ready") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("victoria-metrics did not become ready")


async def count(url: str, name: str, at_s: float) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/internal/force_flush") as r:
            r.raise_for_status()
        q = urllib.parse.urlencode({"query": f"sum(count_over_time({name}[30d]))", "time": f"{at_s:.3f}"})
        for _ in range(100):
            async with s.get(f"{url}/api/v1/query?{q}") as r:
                result = (await r.json())["data"]["result"]
            if result:
                return int(float(result[0]["value"][1]))
            await asyncio.sleep(0.1)
    return 0


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} samples/s  ({seconds * 1000:8.1f} ms)"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=1000, help="samples per enqueue (one evaluation's output)")
    args = ap.parse_args()
    binary = shutil.which("victoria-metrics") or shutil.which("victoria-metrics-prod")
    if binary is None:
        raise SystemExit("no victoria-metrics binary on PATH (apt-get install victoria-metrics)")
    n, per_send = args.samples, 2000
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - (n // args.series + 1) * 1000
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        vm = subprocess.Popen([binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp}/vm",
                               "-retentionPeriod=100y", "-search.latencyOffset=0s", "-loggerLevel=ERROR"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await wait_ready(url)
            print(f"{binary}; {n:,} samples over {args.series:,} series")

            rows = make_samples(n, args.series, start_ms, "bench_floor")
            t0 = time.perf_counter()
            enc = Encoder()
            payloads = [enc.encode(rows[i:i + per_send]) for i in range(0, n, per_send)]
            t1 = time.perf_counter()
            bodies = [compress(p) for p in payloads]
            t2 = time.perf_counter()
            raw, packed = sum(map(len, payloads)), sum(map(len, bodies))
            print(f"encode    {rate(n, t1 - t0)}   {raw / n:.0f} B/sample")
            print(f"compress  {rate(n, t2 - t1)}   {packed / n:.1f} B/sample on the wire")
            async with aiohttp.ClientSession(headers=CONTENT_HEADERS) as s:
                t0 = time.perf_counter()
                for body in bodies:
                    async with s.post(f"{url}/api/v1/write", data=body) as r:
                        assert r.status == 204, r.status
                t_floor = time.perf_counter() - t0
            print(f"floor     {rate(n, t_floor)}   (pre-encoded bodies POSTed back to back)")

            rows = make_samples(n, args.series, start_ms, "bench_queue")
            db = StateDB(Path(tmp) / "state.db")
            cfg = RemoteWriteConfig.model_validate({"url": f"{url}/api/v1/write",
                                                    "queue": {"capacity": n, "max_samples_per_send": per_send}})
            q = RemoteWriteQueue(cfg, db)
            t0 = time.perf_counter()
            for i in range(0, n, args.chunk):
                await q.enqueue(rows[i:i + args.chunk], now_ms)
            t_enqueue = time.perf_counter() - t0
            print(f"enqueue   {rate(n, t_enqueue)}   (encode + SQLite commit, chunks of {args.chunk:,})")
            q.start()
            t0 = time.perf_counter()
            while q.stats.sent < n:
                await asyncio.sleep(0.005)
            t_drain = time.perf_counter() - t0
            await q.stop()
            await db.aclose()
            print(f"drain     {rate(n, t_drain)}   ({t_drain / t_floor:.2f}x the floor)")
            print(f"end to end{rate(n, t_enqueue + t_drain)}")
            got = await count(url, "bench_queue", now_ms / 1000)
            print(f"VictoriaMetrics holds {got:,} of {n:,} queued samples" + ("" if got == n else "  <-- MISMATCH"))
            if got != n:
                raise SystemExit(1)
        finally:
            vm.terminate()
            vm.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
