"""``sre-agent plan --from-target URL`` / ``--from-fleet CONFIG``: capacity advice from live replicas.

Each vLLM ``/metrics`` is scraped once (``text/plain; version=0.0.4``, as the daemon asks, read
by the agent's exposition parser) into a fresh store, and
:func:`~agent.diagnose.plan.fleet.capacity_advice` reads it as the daemon reads its history:
the replica's KV capacity (``vllm:cache_config_info``: ``num_gpu_blocks × block_size`` tokens),
how full it is, what runs, waits and was preempted since the server started, and the change
that removes preemptions or queueing. ``max_model_len`` comes from ``--max-model-len`` or, when
not given, from the server's ``/v1/models`` (vLLM's model card carries it); the output says
which. ``--from-fleet`` takes the targets of an agent config file.

Each reply has a total deadline (connect, headers and body together: ``--timeout``, else the
config's or the daemon's default ``scrape.timeout``) and a size cap (``scrape.body_limit``, 16 MiB
by default, counted after decompression), as the daemon's scraper has: a target that trickles its
answer or sends an endless body is a "no answer" (exit 2), never a hung command.

The network sits behind one function (``fetch``: URL → body), so tests pass their own.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.collect.exposition import parse
from agent.config import ScrapeConfig, load_config
from agent.diagnose.findings import Finding
from agent.diagnose.plan.fields import positive_int
from agent.diagnose.plan.fleet import ReplicaCapacity, capacity_advice, replicas_from_store
from agent.errors import ConfigError, DiagnosisError, ExpositionError, ScrapeError
from agent.promql.remote import read_capped
from agent.series import labels_from
from agent.store import Store

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_BODY_BYTES", "Fetch", "fetch_url", "run_live"]

Fetch = Callable[[str], bytes]
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
#: The daemon's defaults for one scrape (``scrape.timeout``, ``scrape.body_limit``): one place decides both.
DEFAULT_TIMEOUT_S: float = ScrapeConfig().timeout
MAX_BODY_BYTES: int = ScrapeConfig().body_limit


def fetch_url(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """GET an http(s) ``url`` with one deadline for the whole exchange and a cap on the body;
    :class:`~agent.errors.ScrapeError` when it times out, is too big or answers other than 2xx.
    Runs its own event loop: the CLI calls it from synchronous code."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeError(f"not an http(s) URL: {url}")
    return asyncio.run(_get(url, timeout_s, max_bytes))


async def _get(url: str, timeout_s: float, max_bytes: int) -> bytes:
    headers = {"Accept": _ACCEPT, "User-Agent": "sre-agent-plan"}
    too_big = f"body of more than {max_bytes:,} bytes (the limit, as the scraper's scrape.body_limit)"
    try:
        async with asyncio.timeout(timeout_s), aiohttp.ClientSession(headers=headers) as http, \
                http.get(url, allow_redirects=True) as resp:
            if not 200 <= resp.status < 300:
                raise ScrapeError(f"HTTP status {resp.status} {resp.reason or ''}".strip())
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise ScrapeError(too_big)
            body = await read_capped(resp.content, max_bytes + 1)
            if len(body) > max_bytes:
                raise ScrapeError(too_big)
            return body
    except TimeoutError as exc:
        raise ScrapeError(f"no complete answer within {timeout_s:g}s (--timeout)") from exc
    except aiohttp.ClientError as exc:
        raise ScrapeError(f"{type(exc).__name__}: {exc}") from exc


def _metrics_url(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _models_url(metrics_url: str) -> str:
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))


def _served_max_model_len(fetch: Fetch, metrics_url: str) -> int | None:
    """``max_model_len`` of the first model vLLM's OpenAI-compatible ``/v1/models`` lists."""
    try:
        data = json.loads(fetch(_models_url(metrics_url)))
        return positive_int(data["data"][0]["max_model_len"], "max_model_len")  # not NaN, inf, -1 or "4096"
    except (OSError, http.client.HTTPException, ScrapeError, DiagnosisError, ValueError, KeyError, IndexError,
            TypeError, RecursionError):
        return None  # not vLLM's OpenAI server, an older one without max_model_len, or no usable number


def scrape_replica(url: str, job: str, fetch: Fetch, *, max_model_len: int | None,
                   now_ms: int) -> tuple[list[ReplicaCapacity], str]:
    """One target's replicas (one per ``instance``; a data-parallel server reports one cache) and
    a problem line ("" when it answered)."""
    try:
        metrics = _metrics_url(url)
    except ValueError as exc:  # urlsplit: "Invalid IPv6 URL", a port that is not a number
        return [], f"{url}: not a URL ({exc})"
    try:
        body = fetch(metrics).decode("utf-8", errors="replace")
        families = parse(body)
    except (OSError, http.client.HTTPException, ScrapeError) as exc:
        return [], f"{metrics}: no answer ({exc})"
    except ExpositionError as exc:
        return [], f"{metrics}: not a Prometheus text exposition ({exc})"
    instance = urlsplit(metrics).netloc
    store = Store(3_600_000)
    for fam in families:
        for s in fam.samples:
            store.append(labels_from(s.name, {**s.labels, "instance": instance, "job": job}), now_ms, s.value)
    source = "--max-model-len"
    if max_model_len is None:
        max_model_len, source = _served_max_model_len(fetch, metrics), f"{_models_url(metrics)}"
    replicas = replicas_from_store(store, now_ms, window_ms=60_000, max_model_len=max_model_len,
                                   max_model_len_source=source if max_model_len else "")
    if not replicas:
        return [], (f"{metrics}: no vllm:cache_config_info (not a vLLM server, or its engine has not finished "
                    "starting; LMDeploy exports no cache config)")
    return replicas, ""


def _render(r: ReplicaCapacity, f: Finding) -> list[str]:
    lines = [f"KV capacity: {r.instance}" + (f" ({r.model})" if r.model else "")]
    lines += [f"  {e}" for e in f.evidence]
    if f.ok:
        lines.append(f"OK: {f.summary}")
    elif f.setting:
        lines.append(f"Change: {f.setting} {f.suggested_value}")
        lines.append(f"  {f.summary}")
        lines += [f"  or {alt}" for alt in f.details.get("alternatives", [])]
    else:
        lines.append(f"Problem: {f.summary}")
    return lines


def run_live(args: argparse.Namespace, *, fetch: Fetch | None = None,
             clock: Callable[[], float] = time.time) -> int:
    """The ``--from-target``/``--from-fleet`` form of ``plan``; exit 0 when every replica serves
    its load, 1 when one needs a change, 2 when a target does not answer (in time, within the size
    cap, with 2xx) or the config is bad. ``fetch`` defaults to :func:`fetch_url` with ``--timeout``
    (else the config's ``scrape.timeout``) and the config's ``scrape.body_limit``."""
    targets: list[tuple[str, str]] = [(url, "vllm") for url in args.from_target or []]
    scrape = ScrapeConfig()
    if args.from_fleet is not None:
        try:
            cfg = load_config(args.from_fleet)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        targets += [(t.url, t.job) for t in cfg.targets]
        scrape = cfg.scrape
    get: Fetch = fetch or partial(fetch_url, timeout_s=getattr(args, "timeout", None) or scrape.timeout,
                                  max_bytes=scrape.body_limit)
    now_ms = int(clock() * 1000)
    results: list[tuple[ReplicaCapacity, Finding]] = []
    problems: list[str] = []
    for url, job in targets:
        replicas, problem = scrape_replica(url, job, get, max_model_len=args.max_model_len, now_ms=now_ms)
        if problem:
            problems.append(problem)
        results += [(r, capacity_advice(r)) for r in replicas]
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if args.json:
        print(json.dumps({"replicas": [{"instance": r.instance, "job": r.job, "model": r.model,
                                        "kv_cache_tokens": r.tokens, "full_length_seqs": r.full_length_seqs,
                                        "max_model_len": r.max_model_len,
                                        "max_model_len_source": r.max_model_len_source,
                                        "finding": f.to_json()} for r, f in results],
                          "fleet": _fleet_json(results), "errors": problems}, indent=2))
    else:
        out: list[str] = []
        for r, f in results:
            out += _render(r, f)
        if len(results) > 1:
            out.append(_fleet_line(results))
        if results:
            out.append(f"Runbook: {results[0][1].runbook_url}")
        print("\n".join(out))
    if problems:
        return EXIT_BAD_INPUT
    return EXIT_OK if all(f.ok for _, f in results) else EXIT_PROBLEM


def _fleet_json(results: list[tuple[ReplicaCapacity, Finding]]) -> dict[str, Any]:
    return {"replicas": len(results), "kv_cache_tokens": sum(r.tokens for r, _ in results),
            "running": round(sum(r.running_mean for r, _ in results), 1),
            "waiting": round(sum(r.waiting_mean for r, _ in results), 1),
            "preemptions": sum(r.preemptions for r, _ in results),
            "replicas_needed": _replicas_needed(results)}


def _replicas_needed(results: list[tuple[ReplicaCapacity, Finding]]) -> int:
    """Replicas of today's average size that serve all running and waiting requests at the
    sizing target, by what each serves now (``len(results)`` when none is saturated)."""
    total = sum(r.running_mean + r.waiting_mean for r, _ in results)
    served = [r.running_mean * min(1.0, 0.9 / r.kv_usage_peak) for r, f in results
              if r.kv_usage_peak > 0 and r.running_mean > 0]
    if not served or not any(r.waiting_mean > 0 for r, _ in results):
        return len(results)
    return max(len(results), math.ceil(total / (sum(served) / len(served))))


def _fleet_line(results: list[tuple[ReplicaCapacity, Finding]]) -> str:
    j = _fleet_json(results)
    return (f"Fleet: {j['replicas']} replicas, {j['kv_cache_tokens']:,} KV tokens, {j['running']:g} running, "
            f"{j['waiting']:g} waiting, {j['preemptions']:g} preemptions since start; "
            f"{j['replicas_needed']} replicas serve today's demand")
