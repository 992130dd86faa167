"""What "nothing lost" costs: the SQLite outbox's enqueue + acknowledge per notification.

Every notification is written to the outbox before it is sent and deleted after the
receiver acknowledged it, each in its own transaction. The state database runs with
``synchronous=FULL`` so an acknowledged item survives a power cut, not only a crash of
the agent. This measures, on the same disk and in the same run, the per-notification
cost of that choice against ``synchronous=NORMAL`` (WAL's usual setting: survives a
crash of the process, may lose the last transactions on power loss) and against an
in-memory database (no durability at all, the floor).

    python bench/outbox.py            # about 10 s
    python bench/outbox.py --n 200    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.act.notification import AlertSnapshot, Notification
from agent.act.state import StateDB


def _notification(i: int) -> Notification:
    alert = AlertSnapshot(labels={"alertname": "VLLMKVCacheSaturated", "instance": f"10.0.0.{i % 250}:8000",
                                  "severity": "warning"},
                          annotations={"summary": "KV cache above 95 percent.", "description": "x" * 200},
                          status="firing", starts_at_ms=1_700_000_000_000 + i)
    return Notification(key=f"bench:{i}", receiver=f"r{i % 4}", kind="alerts", created_ms=1_700_000_000_000 + i,
                        group_key=f'root:{{alertname="VLLMKVCacheSaturated",i="{i}"}}', alerts=(alert,))


def _run(db: StateDB, n: int) -> list[float]:
    """Per-notification seconds for enqueue -> due -> begin_attempt -> ack, as the dispatcher does."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        now = 1_700_000_000_000 + i
        db.outbox.enqueue(_notification(i), now_ms=now)
        for item in db.outbox.due(now):
            db.outbox.begin_attempt(item.id, next_attempt_ms=now + 1000)
            db.outbox.ack(item.id, now_ms=now)
        out.append(time.perf_counter() - t0)
    return out


def measure(n: int) -> dict[str, list[float]]:
    """Per-notification seconds for ``n`` notifications in each mode: FULL (shipped), NORMAL, memory."""
    with tempfile.TemporaryDirectory(prefix="sre-agent-bench-") as tmp:
        results: dict[str, list[float]] = {}
        for mode in ("FULL", "NORMAL", "memory"):
            path = ":memory:" if mode == "memory" else str(Path(tmp) / f"{mode}.db")
            db = StateDB(path)
            if mode == "NORMAL":  # the bench's only reach into StateDB's connection
                with db._conn.guard("bench") as c:
                    c.execute("PRAGMA synchronous=NORMAL")
            results[mode] = _run(db, n)
            db.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000, help="notifications per mode (default 1000)")
    args = p.parse_args()
    results = measure(args.n)
    base = statistics.median(results["FULL"])
    print(f"{'mode':28} {'median ms':>10} {'p99 ms':>8} {'notif/s':>9} {'vs FULL':>8}")
    for mode, label in (("FULL", "synchronous=FULL (shipped)"), ("NORMAL", "synchronous=NORMAL"),
                        ("memory", "in-memory (no durability)")):
        xs = sorted(results[mode])
        med, p99 = statistics.median(xs), xs[int(len(xs) * 0.99) - 1]
        print(f"{label:28} {med * 1000:10.3f} {p99 * 1000:8.3f} {1 / med:9.0f} {base / med:7.2f}x")

if __name__ == "__main__":
    main()
