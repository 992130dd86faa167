"""Peak memory of the agent's scraper under a cardinality attack, with the default limits and without.

    python bench/cardinality.py                          # 50,000 new series a scrape, 20 scrapes
    python bench/cardinality.py --series 5000 --scrapes 5

Why: a target that puts a request ID or a counter in a label mints new series every scrape, and
without a limit each one lives in the store until retention drops it, so memory grows for an
hour. This script serves such a target on 127.0.0.1 (in this process) and runs the agent's real
Scraper + Store, wired as the daemon wires them (the default keep-list from the bundled rules;
the attack uses a kept family, ``vllm:num_requests_waiting``), in a child process per mode, so
each mode's peak RSS (``VmHWM``) is its own:

* ``limits on``: the defaults (``scrape.new_series_limit`` 10,000, the label limits,
  ``store.max_series`` 1,000,000): each scrape adds more new series than the limit and fails;
* ``limits off``: every limit 0: each scrape's series are stored.

It prints both, the ratio, and the memory per stored series with limits off. Not a test:
numbers depend on the machine; the ratio is what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent.app.daemon import keep_list
from agent.app.logs import configure_logging
from agent.collect.discovery import TargetSpec, expand_globs, instance_of
from agent.collect.scrape import Scraper
from agent.config import Config
from agent.rules.files import load_rule_files
from agent.store import Store

LIMITS_OFF = {"scrape": {"label_limit": 0, "label_name_length_limit": 0, "label_value_length_limit": 0,
                         "new_series_limit": 0, "sample_limit": 0}, "store": {"max_series": 0}}


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _attack_server(series: int) -> ThreadingHTTPServer:
    """A target whose every scrape has ``series`` series never seen before (a counter in a label)."""
    lock, scrapes = threading.Lock(), [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                scrapes[0] += 1
                n = scrapes[0]
            body = "".join(f'vllm:num_requests_waiting{{model_name="m",request_id="{n}-{i}"}} 1\n'
                           for i in range(series)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def _child(mode: str, url: str, scrapes: int) -> dict[str, Any]:
    configure_logging("console", "error", stream=sys.stderr)
    config = Config.model_validate(LIMITS_OFF if mode == "off" else {})
    groups = load_rule_files(expand_globs(config.rules.files))
    store = Store(int(config.store.retention * 1000), keep_list(config, groups), max_series=config.store.max_series)
    sc = config.scrape
    scraper = Scraper(store, timeout_s=60.0, body_limit=sc.body_limit, concurrency=sc.concurrency,
                      sample_limit=sc.sample_limit, label_limit=sc.label_limit,
                      label_name_length_limit=sc.label_name_length_limit,
                      label_value_length_limit=sc.label_value_length_limit, new_series_limit=sc.new_series_limit)
    scraper.set_targets([TargetSpec(url, (("instance", instance_of(url)), ("job", "vllm")))])
    base_kib = _status_kib("VmRSS")
    for _ in range(scrapes):
        await scraper.scrape_all()
    target = next(iter(scraper.targets.values()))
    await scraper.close()
    return {"mode": mode, "base_kib": base_kib, "peak_kib": _status_kib("VmHWM"), "series": store.series_count,
            "failures": target.failures, "scrapes": target.scrapes, "last_error": target.last_error}


def _run_child(mode: str, url: str, scrapes: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--url", url, "--scrapes", str(scrapes)],
                         check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", type=int, default=50_000, help="new series per scrape (default 50,000)")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.child, args.url, args.scrapes))))
        return
    server = _attack_server(args.series)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    print(f"attack: {args.series:,} new series a scrape, {args.scrapes} scrapes")
    results = {mode: _run_child(mode, url, args.scrapes) for mode in ("on", "off")}
    server.shutdown()
    for mode, r in results.items():
        print(f"limits {mode:3}: peak RSS {r['peak_kib'] / 1024:8.1f} MiB "
              f"(after start-up {r['base_kib'] / 1024:6.1f} MiB)"
              f"  series stored {r['series']:>9,}  failed scrapes {r['failures']}/{r['scrapes']}"
              f"  last_error: {r['last_error'] or '-'}")
    on, off = results["on"], results["off"]
    print(f"peak RSS off/on: {off['peak_kib'] / on['peak_kib']:.1f}x; growth off/on: "
          f"{(off['peak_kib'] - off['base_kib']) / max(on['peak_kib'] - on['base_kib'], 1):.1f}x")
    if off["series"]:
        per = (off["peak_kib"] - off["base_kib"]) * 1024 / off["series"]
        print(f"limits off: about {per:,.0f} bytes of peak RSS per stored series (one sample each)")


if __name__ == "__main__":
    main()
