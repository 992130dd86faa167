"""Ingest benchmark: prometheus_client's parser vs ours, on the same bytes.

Run from the repository root:  python bench/ingest.py  [--quick]

For each payload it times, per scrape of the whole payload:
  (a) prometheus_client.parser.text_string_to_metric_families, consuming every sample;
  (b) agent.collect.exposition.parse(), the full validated parse;
  (c) the scraper's own ingest path (Scraper.ingest: Scanner(wants=store.keep).scan() plus a
      store write through the per-target series cache, staleness bookkeeping and the target's
      synthetic series), over repeated scrapes of the same payload with advancing timestamps
      (steady state: the cache is warm, which is what every scrape after the first sees),
      once with the keep-list of the vLLM families the health rules use and once keeping all.
Throughput is payload samples (kept or skipped) per second of wall time (perf_counter); CPU time
(process_time) is printed beside it. Each figure is the best and the median of several
repetitions. Payloads: the real vLLM captures in tests/fixtures/vllm/ and a synthetic vLLM V1
payload for 1 and for 10 models, rendered by prometheus_client itself so its bytes are what
vLLM serves (names and buckets from the vLLM metric catalog, V1 as of 0.33.0).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.collect.discovery import TargetSpec  # noqa: E402
from agent.collect.exposition import Scanner, parse  # noqa: E402 - after the path fix-up above
from agent.collect.scrape import Scraper, Target  # noqa: E402
from agent.store import KeepList, Store  # noqa: E402

#: The vLLM families the health rules read (both name generations).
RULE_FAMILIES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_success_total",
    "vllm:cache_config_info",
]


def _floats(spec: str) -> list[float]:
    return [float(b) for b in spec.split()]


# Bucket lists of vLLM >= 0.8.4 (CATALOG.md section 1.6).
TTFT = _floats("0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560")
ITL = _floats("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80")
LATENCY = _floats("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680")
ITERATION = _floats("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384")
TOKENS = _floats("1 2 5 10 20 50 100 200 500 1000 2000 5000 10000 20000")  # max_model_len 32768
PARAMS_N = _floats("1 2 5 10 20")
PREEMPTIONS = _floats("1 2 3 4 5 10 20")
HTTP_HIGHR = _floats("0.01 0.025 0.05 0.075 0.1 0.25 0.5 0.75 1 1.5 2 2.5 3 3.5 4 4.5 5 7.5 10 30 60")

#: V1 histograms (vLLM 0.33.0 HELP texts): name, help, buckets, typical observation size.
HISTOGRAMS: list[tuple[str, str, list[float], float]] = [
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION, 300),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS, 3000),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS, 800),
    (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        TOKENS,
        1000,
    ),
    ("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N, 1.5),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKENS, 1000),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        TOKENS,
        2000,
    ),
    (
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        PREEMPTIONS,
        1,
    ),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT, 0.3),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL, 0.03),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ITL,
        0.03,
    ),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY, 8),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        LATENCY,
        0.5,
    ),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        LATENCY,
        7,
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        LATENCY,
        0.3,
    ),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", LATENCY, 6),
]
HTTP_HANDLERS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize"]


def synthetic_v1(models: int, seed: int = 7) -> str:
    """A vLLM V1 (0.33-era) /metrics body for ``models`` served models, one engine each,
    plus the http_* families of prometheus-fastapi-instrumentator and prometheus_client's
    process/platform/gc collectors, as a single-process vLLM serves them."""
    rnd = random.Random(seed)
    reg = CollectorRegistry()
    GCCollector(registry=reg)
    PlatformCollector(registry=reg)
    ProcessCollector(registry=reg)
    lab = ["model_name", "engine"]

    def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, [*lab, *extra], registry=reg, multiprocess_mode="mostrecent")

    def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, [*lab, *extra], registry=reg)

    def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
        return Histogram(name, doc, lab, buckets=buckets, registry=reg)

    running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
    waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
    by_reason = gauge("vllm:num_requests_waiting_by_reason", "Waiting requests by reason.", ("reason",))
    sleep = gauge("vllm:engine_sleep_state", "Engine sleep state.", ("sleep_state",))
    kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    counters = {
        n: counter(f"vllm:{n}", d)
        for n, d in [
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            ("external_prefix_cache_queries", "External prefix cache queries."),
            ("external_prefix_cache_hits", "External prefix cache hits."),
            ("mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
            ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
            ("num_preemptions", "Cumulative number of preemption from the engine."),
            ("prompt_tokens", "Number of prefill tokens processed."),
            ("prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
            ("generation_tokens", "Number of generation tokens processed."),
            ("estimated_flops_per_gpu", "Estimated number of floating point operations per GPU."),
            ("estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU."),
            ("estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU."),
        ]
    }
    by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
    success = counter("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
    hists = [(histogram(name, doc, buckets), scale) for name, doc, buckets, scale in HISTOGRAMS]
    cache_info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [
            "block_size",
            "cache_dtype",
            "enable_prefix_caching",
            "gpu_memory_utilization",
            "num_cpu_blocks",
            "num_gpu_blocks",
            "sliding_window",
            "swap_space_bytes",
            "engine",
        ],
        registry=reg,
        multiprocess_mode="mostrecent",
    )
    http_total = Counter(
        "http_requests_total",
        "Total number of requests by method, status and handler.",
        ["handler", "method", "status"],
        registry=reg,
    )
    http_in = Summary(
        "http_request_size_bytes",
        "Content length of incoming requests by handler.",
        ["handler"],
        registry=reg,
    )
    http_out = Summary(
        "http_response_size_bytes",
        "Content length of outgoing responses by handler.",
        ["handler"],
        registry=reg,
    )
    http_highr = Histogram(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels.",
        registry=reg,
        buckets=HTTP_HIGHR,
    )
    http_dur = Histogram(
        "http_request_duration_seconds",
        "Latency with only few buckets by handler.",
        ["handler", "method"],
        buckets=[0.1, 0.5, 1],
        registry=reg,
    )

    for i in range(models):
        m = (f"meta-llama/Llama-3.1-8B-Instruct-{i}", "0")
        running.labels(*m).set(rnd.randint(0, 64))
        waiting.labels(*m).set(rnd.randint(0, 20))
        for reason in ("capacity", "deferred"):
            by_reason.labels(*m, reason).set(rnd.randint(0, 10))
        for state in ("awake", "weights_offloaded", "discard_all"):
            sleep.labels(*m, state).set(1 if state == "awake" else 0)
        kv.labels(*m).set(rnd.random())
        for c in counters.values():
            c.labels(*m).inc(rnd.randint(0, 10**7))
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            by_source.labels(*m, source).inc(rnd.randint(0, 10**6))
        for reason in ("stop", "length", "abort", "error", "repetition"):
            success.labels(*m, reason).inc(rnd.randint(0, 10**4))
        for h, scale in hists:
            child = h.labels(*m)
            for _ in range(200):
                child.observe(rnd.expovariate(1 / scale))
        cache_info.labels("16", "auto", "True", "0.9", "0", str(40000 + i), "None", "4294967296", "0").set(1)
    for handler in HTTP_HANDLERS:
        for status in ("2xx", "4xx"):
            http_total.labels(handler, "POST", status).inc(rnd.randint(1, 10**5))
        for _ in range(50):
            http_in.labels(handler).observe(rnd.randint(100, 10**5))
            http_out.labels(handler).observe(rnd.randint(100, 10**5))
            http_dur.labels(handler, "POST").observe(rnd.expovariate(2))
            http_highr.observe(rnd.expovariate(2))
    return generate_latest(reg).decode()


def _best_median(fn: Callable[[], None], reps: int) -> tuple[float, float, float]:
    """(best wall, median wall, median CPU) seconds of ``fn`` over ``reps`` runs."""
    walls, cpus = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    return min(walls), statistics.median(walls), statistics.median(cpus)


class Ingest:
    """The scraper's own write path for one target (``Scraper.ingest``: scan, series cache,
    append, staleness bookkeeping, the target's synthetic series), without the HTTP fetch."""

    def __init__(self, keep: KeepList) -> None:
        self.scraper = Scraper(Store(3_600_000, keep), timeout_s=10, body_limit=1 << 30, concurrency=1)
        self.target = Target(TargetSpec("http://bench:8000/metrics", (("instance", "bench:8000"), ("job", "vllm"))))
        self.now_ms = 1_700_000_000_000

    def scrape(self, payload: str) -> int:
        self.now_ms += 5_000
        self.scraper.ingest(self.target, payload, self.now_ms)
        return self.target.samples


def bench(title: str, payload: str, scrapes: int, reps: int, *, quiet: bool = False) -> dict[str, float]:
    """Time (a), (b), (c), (c') and the scan alone on ``payload``; print the block unless ``quiet``.
    Returns best microseconds per scrape by row key ("a", "b", "c", "c_all", "scan") and "samples"."""
    probe = Scanner()
    kept_rules = sum(1 for _ in Scanner(KeepList(RULE_FAMILIES)).scan(payload))
    for _ in probe.scan(payload):
        pass
    samples = probe.samples_total

    def run_client() -> None:
        for _ in range(scrapes):
            for family in text_string_to_metric_families(payload):
                for _sample in family.samples:
                    pass

    def run_parse() -> None:
        for _ in range(scrapes):
            parse(payload)

    keep = KeepList(RULE_FAMILIES)

    def run_scan() -> None:
        for _ in range(scrapes):
            for _sample in Scanner(keep).scan(payload):
                pass

    def make_ingest(keep: KeepList) -> Callable[[], None]:
        ingest = Ingest(keep)
        ingest.scrape(payload)  # the first scrape fills the series cache

        def run() -> None:
            for _ in range(scrapes):
                ingest.scrape(payload)

        return run

    if not quiet:
        print(f"\n== {title}: {len(payload):,} bytes, {samples:,} samples, {kept_rules} kept by the keep-list")
    rows = [
        ("a", "(a) prometheus_client text_string_to_metric_families", run_client),
        ("b", "(b) agent.collect.exposition.parse (full)", run_parse),
        ("c", "(c) ingest: scan + store, rule keep-list", make_ingest(KeepList(RULE_FAMILIES))),
        ("c_all", "(c') ingest: scan + store, keep all", make_ingest(KeepList(None))),
        ("scan", "    of which the scan alone, rule keep-list", run_scan),
    ]
    us: dict[str, float] = {"samples": float(samples)}
    for key, label, fn in rows:
        best, median, cpu = _best_median(fn, reps)
        n = samples * scrapes
        us[key] = best / scrapes * 1e6
        if not quiet:
            print(
                f"  {label:<55} best {n / best:>12,.0f} samples/s  median {n / median:>12,.0f}  "
                f"cpu {n / cpu:>12,.0f}  ({best / scrapes * 1e6:,.1f} us/scrape)"
            )
    if not quiet:
        a = us["a"]
        print(f"  ratio (c)/(a) = {a / us['c']:.1f}x   (c')/(a) = {a / us['c_all']:.1f}x   (b)/(a) = {a / us['b']:.1f}x"
              f"   scan = {us['scan'] / us['c']:.0%} of (c)")
    return us


def payloads(quick: bool) -> list[tuple[str, str, int]]:
    """(title, payload, scrapes per repetition): the real captures, then synthetic V1 for 1 and 10 models."""
    out = [(f"capture {path.name}", path.read_text(), 50 if quick else 200)
           for path in sorted((ROOT / "tests" / "fixtures" / "vllm").glob("*_metrics.txt"))]
    out += [(f"synthetic vLLM V1, {m} model(s)", synthetic_v1(m), 5 if quick else 20) for m in (1, 10)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = ap.parse_args()
    reps = 3 if args.quick else 7
    print(f"python {sys.version.split()[0]}; best and median of {reps} repetitions")
    for title, payload, scrapes in payloads(args.quick):
        bench(title, payload, scrapes=scrapes, reps=reps)

if __name__ == "__main__":
    main()
