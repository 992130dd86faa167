"""Capacity advice from the live fleet: what a running vLLM replica's KV cache really holds.

The planner (:mod:`agent.diagnose.plan.planner`) predicts capacity from a model's shape; a
running replica reports its own in ``vllm:cache_config_info`` (``num_gpu_blocks`` ×
``block_size`` tokens, with its ``cache_dtype`` and ``gpu_memory_utilization``). With a
window of its KV usage, waiting and running requests and preemptions — from the daemon's
store, or from one scrape that :func:`replicas_from_store` reads the same way —
:func:`capacity_advice` says what limits the replica and the change that removes its
preemptions or queueing:

* **KV cache full** (usage at or above :data:`SATURATED`, or preemptions in the window):
  admit what fits (``--max-num-seqs`` at :data:`TARGET_USAGE` of the cache at today's
  tokens per sequence), double the cache with ``--kv-cache-dtype fp8`` (where it is 16-bit),
  shorten ``--max-model-len`` so the running sequences fit at full length, or add replicas
  when requests also wait (the guide's rule: waiting above 2 × running means scale out);
* **requests wait with room in the cache** (usage below :data:`HEADROOM`): the scheduler's
  ``--max-num-seqs``, not memory, caps concurrency; raise it to what the cache holds;
* otherwise the replica has what it needs (an ``ok`` finding).

``max_model_len`` is not in ``cache_config_info`` (it belongs to vLLM's ModelConfig): the
caller passes it (``--max-model-len``, or the ``max_model_len`` that vLLM's ``/v1/models``
answers), with where it came from; without it the full-length sequence count is left out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE, Finding, runbook_url
from agent.series import METRIC_NAME, Labels, labels_get
from agent.store import SeriesMatcher, SeriesView, Store

__all__ = [
    "CAPACITY_ALERTS",
    "HEADROOM",
    "QUEUED",
    "SATURATED",
    "TARGET_USAGE",
    "WINDOW_MS",
    "ReplicaCapacity",
    "capacity_advice",
    "replicas_from_store",
]

#: The bundled alerts whose diagnosis is this advice (rules/vllm.rules.yaml).
CAPACITY_ALERTS = ("VLLMKVCacheSaturated", "VLLMScaleOutNeeded", "VLLMQueueingWithKVCacheHeadroom",
                   "VLLMPreemptionsSustained")
SATURATED = 0.95  # VLLMKVCacheSaturated's threshold (the guide: KV cache > 95 %)
HEADROOM = 0.8  # VLLMQueueingWithKVCacheHeadroom's threshold (the guide: < 80 % while requests wait)
#: Sizing target: advice leaves the cache this full at today's tokens per sequence, under the
#: saturation alert and with room for a sequence that grows longer than the average.
TARGET_USAGE = 0.9
SCALE_OUT_RATIO = 2.0  # VLLMScaleOutNeeded: waiting > 2 × running
#: Requests "wait" when at least one waits on average over the window: a request queued for one
#: scrape in fifteen minutes is no queue.
QUEUED = 1.0
WINDOW_MS = 15 * 60_000  # how much history the daemon's advice reads
_KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # V1 ≥ 0.9.2, V0 / V1 ≤ 0.11.2


@dataclass(frozen=True)
class ReplicaCapacity:
    """One replica's reported KV capacity and how it was used over a window (or at one scrape:
    then peak = mean and ``preemptions`` counts since the server started)."""

    instance: str
    job: str
    model: str
    num_gpu_blocks: int
    block_size: int
    cache_dtype: str
    gpu_memory_utilization: float | None
    kv_usage_peak: float
    kv_usage_mean: float
    running_peak: float
    running_mean: float
    waiting_peak: float
    waiting_mean: float
    preemptions: float
    preemptions_since: str  # "in the last 15 min" or "since the server started"
    max_model_len: int | None = None
    max_model_len_source: str = ""

    @property
    def tokens(self) -> int:
        """The KV cache's capacity in tokens: ``num_gpu_blocks × block_size``."""
        return self.num_gpu_blocks * self.block_size

    @property
    def full_length_seqs(self) -> int | None:
        """Sequences of ``max_model_len`` tokens the cache holds at once (whole blocks each)."""
        if not self.max_model_len:
            return None
        return self.num_gpu_blocks // math.ceil(self.max_model_len / self.block_size)

    def labels(self) -> dict[str, str]:
        return {k: v for k, v in (("instance", self.instance), ("job", self.job), ("model_name", self.model)) if v}


def _num(text: str) -> float | None:
    try:
        return float(text) if text not in ("", "None") else None
    except ValueError:
        return None


def _finite(view: SeriesView | None) -> list[float]:
    return [] if view is None else [v for v in view.vals if not math.isnan(v)]


def _one(store: Store, name: str, at: list[SeriesMatcher], start: int, end: int) -> list[SeriesView]:
    return store.select([SeriesMatcher(METRIC_NAME, "=", name), *at], start, end)


def _summed(views: list[SeriesView]) -> tuple[float, float]:
    """``(peak, mean)`` of the sum over engines (data-parallel engines report one series each)."""
    by_t: dict[int, float] = {}
    for v in views:
        for t, x in zip(v.ts, v.vals, strict=True):
            if not math.isnan(x):
                by_t[t] = by_t.get(t, 0.0) + x
    vals = list(by_t.values())
    return (max(vals), sum(vals) / len(vals)) if vals else (0.0, 0.0)


def replicas_from_store(store: Store, now_ms: int, *, window_ms: int = WINDOW_MS,
                        match: dict[str, str] | None = None, max_model_len: int | None = None,
                        max_model_len_source: str = "") -> list[ReplicaCapacity]:
    """Every vLLM replica with a ``vllm:cache_config_info`` series in the window whose labels
    include ``match`` (e.g. an alert's ``instance`` or ``job``/``model_name``), with its usage
    from ``vllm:kv_cache_usage_perc`` (or ``gpu_cache_usage_perc``), ``num_requests_running``,
    ``num_requests_waiting`` and the increase of ``num_preemptions_total``."""
    start = now_ms - window_ms
    wanted = [SeriesMatcher(k, "=", v) for k, v in (match or {}).items() if k in ("instance", "job")]
    infos = _one(store, "vllm:cache_config_info", wanted, start, now_ms)
    by_instance: dict[str, Labels] = {}
    for info in sorted(infos, key=lambda v: v.ts[-1]):
        by_instance[labels_get(info.labels, "instance")] = info.labels  # the newest per instance
    out: list[ReplicaCapacity] = []
    for instance, labels in sorted(by_instance.items()):
        blocks, block = _num(labels_get(labels, "num_gpu_blocks")), _num(labels_get(labels, "block_size"))
        if not blocks or not block:
            continue
        at = [SeriesMatcher("instance", "=", instance)]
        model_filter = (match or {}).get("model_name")
        series = {name: [v for v in _one(store, name, at, start, now_ms)
                         if not model_filter or labels_get(v.labels, "model_name") == model_filter]
                  for name in (*_KV_NAMES, "vllm:num_requests_running", "vllm:num_requests_waiting",
                               "vllm:num_preemptions_total")}
        if model_filter and not any(series.values()):
            continue  # the alert is about another model served on this job
        kv = next((views for name in _KV_NAMES if (views := series[name])), [])
        kv_vals = [x for v in kv for x in _finite(v)]
        running, waiting = _summed(series["vllm:num_requests_running"]), _summed(series["vllm:num_requests_waiting"])
        preempt, one_sample = 0.0, True
        for v in series["vllm:num_preemptions_total"]:
            vals = _finite(v)
            one_sample = one_sample and len(vals) < 2
            preempt += vals[-1] if len(vals) < 2 else _increase(vals)
        model = next((m for views in series.values() for v in views if (m := labels_get(v.labels, "model_name"))), "")
        minutes = round(window_ms / 60_000)
        out.append(ReplicaCapacity(
            instance=instance, job=labels_get(labels, "job"), model=model, num_gpu_blocks=int(blocks),
            block_size=int(block), cache_dtype=labels_get(labels, "cache_dtype") or "auto",
            gpu_memory_utilization=_num(labels_get(labels, "gpu_memory_utilization")),
            kv_usage_peak=max(kv_vals, default=0.0), kv_usage_mean=sum(kv_vals) / len(kv_vals) if kv_vals else 0.0,
            running_peak=running[0], running_mean=running[1], waiting_peak=waiting[0], waiting_mean=waiting[1],
            preemptions=preempt,
            preemptions_since="since the server started" if one_sample else f"in the last {minutes} min",
            max_model_len=max_model_len, max_model_len_source=max_model_len_source))
    return out


def _increase(vals: list[float]) -> float:
    """A counter's increase over the samples, across resets (no extrapolation)."""
    total = 0.0
    for a, b in itertools.pairwise(vals):
        total += b - a if b >= a else b
    return total


def _seqs_for_tokens(r: ReplicaCapacity, tokens: int) -> int:
    """Concurrent sequences ``tokens`` of cache holds at :data:`TARGET_USAGE`, at the tokens per
    running sequence seen (peak usage over mean running)."""
    if r.running_mean <= 0 or r.kv_usage_peak <= 0:
        return 0
    per_seq = r.kv_usage_peak * r.tokens / max(r.running_mean, 1.0)
    return max(1, math.floor(tokens * TARGET_USAGE / per_seq))


def _evidence(r: ReplicaCapacity) -> list[str]:
    util = f", gpu_memory_utilization {r.gpu_memory_utilization:g}" if r.gpu_memory_utilization is not None else ""
    lines = [f"{r.instance}: KV cache {r.num_gpu_blocks:,} blocks × {r.block_size} tokens = {r.tokens:,} tokens "
             f"(vllm:cache_config_info, cache_dtype {r.cache_dtype}{util})"]
    if (seqs := r.full_length_seqs) is not None:
        lines.append(f"= {seqs} full-length sequence{'' if seqs == 1 else 's'} of {r.max_model_len:,} tokens "
                     f"(max_model_len from {r.max_model_len_source or 'the caller'})")
    lines += [f"KV cache usage peak {r.kv_usage_peak:.0%}, mean {r.kv_usage_mean:.0%}",
              f"running {r.running_mean:.0f} (peak {r.running_peak:.0f}), waiting {r.waiting_mean:.0f} "
              f"(peak {r.waiting_peak:.0f})",
              f"preemptions {r.preemptions:.0f} {r.preemptions_since}"]
    return lines


def capacity_advice(r: ReplicaCapacity, *, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> Finding:
    """The one change that removes this replica's preemptions or queueing (``setting`` and
    ``suggested_value``), the other changes that would also work in ``details["alternatives"]``,
    and the numbers behind it as ``evidence``."""
    evidence = _evidence(r)
    details: dict[str, object] = {
        "kv_cache_tokens": r.tokens, "num_gpu_blocks": r.num_gpu_blocks, "block_size": r.block_size,
        "cache_dtype": r.cache_dtype, "max_model_len": r.max_model_len, "max_model_len_source": r.max_model_len_source,
        "full_length_seqs": r.full_length_seqs, "kv_usage_peak": round(r.kv_usage_peak, 4),
        "kv_usage_mean": round(r.kv_usage_mean, 4), "running_mean": round(r.running_mean, 1),
        "waiting_mean": round(r.waiting_mean, 1), "preemptions": r.preemptions}
    base = Finding(kind="kv-cache-capacity", summary="", severity="info", evidence=evidence, details=details,
                   runbook_url=runbook_url("diagnosis-kv-cache-capacity", runbook_base), labels=r.labels())
    where = f"{r.instance}" + (f" ({r.model})" if r.model else "")
    full = r.kv_usage_peak >= SATURATED or r.preemptions > 0
    options: list[tuple[str, str, str]] = []  # (setting, value, what it does)
    fits = _seqs_for_tokens(r, r.tokens)
    demand = r.running_mean + r.waiting_mean
    if full:
        if fits and demand > fits:
            replicas = math.ceil(demand / fits)
            if r.waiting_mean >= QUEUED:
                options.append(("replicas", f"+{replicas - 1}", f"{replicas} replicas like this one serve the "
                                f"{demand:.0f} running and waiting requests at {TARGET_USAGE:.0%} KV usage"))
        if r.cache_dtype in ("auto", "bfloat16", "float16", "half"):
            options.append(("--kv-cache-dtype", "fp8", f"an fp8 cache holds {2 * r.tokens:,} tokens, about "
                                                       f"{_seqs_for_tokens(r, 2 * r.tokens)} sequences like today's "
                                                       "(check output quality on your own traffic)"))
        if fits:
            options.append(("--max-num-seqs", str(fits), f"{fits} sequences at today's length fill the cache to "
                                                         f"{TARGET_USAGE:.0%}: no preemptions, the rest wait"))
        if r.max_model_len and r.running_peak >= 1:
            length = r.num_gpu_blocks // math.ceil(r.running_peak) * r.block_size
            if r.block_size <= length < r.max_model_len:
                options.append(("--max-model-len", str(length), f"{r.running_peak:.0f} sequences fit even at full "
                                                                f"length ({length:,} tokens each)"))
        if r.waiting_mean <= SCALE_OUT_RATIO * r.running_mean:  # not a scale-out case: cap concurrency first
            options.sort(key=lambda o: o[0] != "--max-num-seqs")
        head = (f"{where}: the KV cache ({r.tokens:,} tokens) is full — usage peaked at {r.kv_usage_peak:.0%} with "
                f"{r.preemptions:.0f} preemptions {r.preemptions_since}")
        severity = "warning"
    elif r.waiting_mean >= QUEUED and r.kv_usage_peak < HEADROOM:
        # what the cache holds at the sizing target, but no more than there is demand for
        raise_to = min(fits, math.ceil(demand)) if fits else math.ceil(demand)
        options.append(("--max-num-seqs", str(raise_to), f"the cache has room for {raise_to} sequences at today's "
                                                          "length (--max-num-batched-tokens may cap admission too)"))
        if fits and demand > fits:
            replicas = math.ceil(demand / fits)
            options.append(("replicas", f"+{replicas - 1}", f"{replicas} replicas like this one serve the "
                                                            f"{demand:.0f} running and waiting requests"))
        head = (f"{where}: {r.waiting_mean:.0f} requests wait while the KV cache is at most {r.kv_usage_peak:.0%} "
                "full: the scheduler's limits, not memory, cap concurrency")
        severity = "info"
    elif r.waiting_mean >= QUEUED:  # between the two thresholds: the cache is what limits, nothing is preempted yet
        if fits and demand > fits:
            replicas = math.ceil(demand / fits)
            options.append(("replicas", f"+{replicas - 1}", f"{replicas} replicas like this one serve the "
                                                            f"{demand:.0f} running and waiting requests"))
        head = (f"{where}: {r.waiting_mean:.0f} requests wait with the KV cache up to {r.kv_usage_peak:.0%} full: "
                "it is near its capacity, without preemptions yet")
        severity = "info"
    else:
        return replace(base, ok=True, summary=f"{where}: the KV cache ({r.tokens:,} tokens) serves the load: usage "
                                              f"peak {r.kv_usage_peak:.0%}, nothing waits or is preempted")
    if not options:
        return replace(base, summary=head, severity=severity)
    setting, value, why = options[0]
    details["alternatives"] = [f"{s} {v}: {w}" for s, v, w in options[1:]]
    return replace(base, summary=f"{head}; {setting} {value}: {why}", severity=severity, setting=setting,
                   suggested_value=value)
