"""The vLLM dashboards: the fleet (``vllm-fleet``) and one replica in depth (``vllm-replica``).

Every query works on both metric generations (fixtures/vllm/CATALOG.md): where V1 renamed a
family the query is ``<new> or <old>`` evaluated per label set, exactly as the recording
rules in ``rules/vllm.rules.yaml`` do it:

* KV cache: ``vllm:kv_cache_usage_perc`` (V1 >= 0.9.2) or ``vllm:gpu_cache_usage_perc``
  (V0, V1 <= 0.11.2);
* inter-token latency: ``vllm:inter_token_latency_seconds`` (>= 0.10.2) or
  ``vllm:time_per_output_token_seconds`` (V0 until 0.11.0, V1 until 0.14.0);
* prefix cache: ``vllm:prefix_cache_{hits,queries}_total`` (V1 >= 0.9.2), else
  ``vllm:gpu_prefix_cache_{hits,queries}_total`` (V1 0.7.3-0.11), else V0's gauge
  ``vllm:gpu_prefix_cache_hit_rate`` where it is not -1 (prefix caching off);
* throughput from the ``*_tokens_total`` counters every release has, never the V0 gauges
  0.7.0 removed.

Every selector carries ``model_name!=""``: the production-stack router re-exports
``vllm:num_requests_*`` without ``model_name``. The V1 ``engine`` label (data-parallel rank)
is summed or maxed away by every ``by ()``. The scale-out panel reads the recording rules
``job_model:vllm_num_requests_{waiting,running}:sum``, the series the alert compares.
"""

from __future__ import annotations

from dashboards.kit import Board, Column, Q, Var
from dashboards.rules import factor, threshold

__all__ = ["fleet", "replica"]

_VARS = (
    Var("job", "job", "vllm:num_requests_running"),
    Var("model_name", "model_name", "vllm:num_requests_running"),
    Var("instance", "instance", "vllm:num_requests_running"),
)
_QUANTILES = (0.5, 0.95, 0.99)

# Thresholds: the alerts' numbers (rules/vllm.rules.yaml).
KV_HIGH = threshold("VLLMKVCacheSaturated", "instance_model:vllm_kv_cache_usage_ratio:max")
KV_HEADROOM = threshold("VLLMQueueingWithKVCacheHeadroom", "instance_model:vllm_kv_cache_usage_ratio:max")
TTFT = threshold("VLLMTimeToFirstTokenHigh", "instance_model:vllm_time_to_first_token_seconds:p99_rate5m")
ITL = threshold("VLLMInterTokenLatencyHigh", "instance_model:vllm_inter_token_latency_seconds:p99_rate5m")
E2E = threshold("VLLMEndToEndLatencyHigh", "instance_model:vllm_e2e_request_latency_seconds:p99_rate5m")
SCALE_OUT = factor("VLLMScaleOutNeeded", "job_model:vllm_num_requests_waiting:sum")


def _board(uid: str, title: str, description: str) -> Board:
    return Board(uid, title, description, tags=["vllm"], variables=_VARS, fixed='model_name!=""')


def _rate(b: Board, metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({b.sel(metric)}[$__rate_interval]))"


def _kv(b: Board, by: str) -> str:
    new, old = b.sel("vllm:kv_cache_usage_perc"), b.sel("vllm:gpu_cache_usage_perc")
    return f"max by ({by}) ({new}) or max by ({by}) ({old})"


def _buckets(b: Board, family: str, by: str) -> str:
    """Bucket rates of a histogram; the inter-token family falls back to its pre-0.10.2 name."""
    if family == "vllm:inter_token_latency_seconds":
        return (f"{_rate(b, 'vllm:inter_token_latency_seconds_bucket', by + ', le')} or "
                f"{_rate(b, 'vllm:time_per_output_token_seconds_bucket', by + ', le')}")  # fmt: skip
    return _rate(b, family + "_bucket", by + ", le")


def _quantile(b: Board, q: float, family: str, by: str) -> str:
    return f"histogram_quantile({q}, {_buckets(b, family, by)})"


def _quantiles(b: Board, family: str, by: str, legend: str) -> list[Q]:
    return [Q(_quantile(b, q, family, by), f"p{round(q * 100)} {legend}") for q in _QUANTILES]


def _mean(b: Board, family: str, by: str) -> str:
    return f"{_rate(b, family + '_sum', by)} / ({_rate(b, family + '_count', by)} > 0)"


def _hit_rate(b: Board, by: str) -> str:
    new = f"{_rate(b, 'vllm:prefix_cache_hits_total', by)} / ({_rate(b, 'vllm:prefix_cache_queries_total', by)} > 0)"
    old = (f"{_rate(b, 'vllm:gpu_prefix_cache_hits_total', by)} / "
           f"({_rate(b, 'vllm:gpu_prefix_cache_queries_total', by)} > 0)")  # fmt: skip
    v0 = f"avg by ({by}) ({b.sel('vllm:gpu_prefix_cache_hit_rate')} >= 0)"
    return f"({new}) or ({old}) or {v0}"


def _kv_panel(b: Board, by: str, legend: str) -> None:
    b.timeseries(
        "KV-cache usage", unit="percentunit", min_=0, max_=1,
        thresholds=[(KV_HEADROOM, "yellow"), (KV_HIGH, "red")],
        what="Share of the GPU KV cache in use (fullest data-parallel engine), V1 and V0 names. Dashed lines: "
             f"{KV_HEADROOM:.0%} (below it, waiting requests mean the scheduler limits, not memory, cap "
             f"concurrency) and {KV_HIGH:.0%} (the saturation alert).",
        bad=f"Above {KV_HIGH:.0%} for 10 minutes: requests are preempted or wait; lower --max-num-seqs or "
            f"--max-model-len, or add replicas. Below {KV_HEADROOM:.0%} while requests wait: raise --max-num-seqs.",
        runbooks=["VLLMKVCacheSaturated", "VLLMQueueingWithKVCacheHeadroom"],
        queries=[Q(_kv(b, by), legend)],
    )  # fmt: skip


def _latency_panels(b: Board, by: str, legend: str) -> None:
    b.timeseries(
        "Time to first token", unit="s", thresholds=[(TTFT, "red")],
        queries=_quantiles(b, "vllm:time_to_first_token_seconds", by, legend),
        what=f"p50, p95 and p99 time from arrival to the first output token. Dashed line: the alert's p99 "
             f"limit ({TTFT:g} s).",
        bad=f"p99 above {TTFT:g} s for 10 minutes: long prompts block the batch; enable chunked prefill "
            "(--enable-chunked-prefill, --max-num-batched-tokens) or add replicas.",
        runbooks=["VLLMTimeToFirstTokenHigh"],
    )  # fmt: skip
    b.timeseries(
        "Inter-token latency", unit="s", thresholds=[(ITL, "red")],
        queries=_quantiles(b, "vllm:inter_token_latency_seconds", by, legend),
        what="p50, p95 and p99 time between output tokens (vllm:inter_token_latency_seconds, or "
             f"vllm:time_per_output_token_seconds before 0.10.2). Dashed line: the alert's p99 limit ({ITL:g} s).",
        bad=f"p99 above {ITL:g} s for 10 minutes: batches are too large or prefills interrupt decoding; lower "
            "--max-num-seqs or --max-num-batched-tokens, or add replicas.",
        runbooks=["VLLMInterTokenLatencyHigh"],
    )  # fmt: skip
    b.timeseries(
        "End-to-end request latency", unit="s", thresholds=[(E2E, "red")],
        queries=_quantiles(b, "vllm:e2e_request_latency_seconds", by, legend),
        what=f"p50, p95 and p99 time from arrival to the last token. Dashed line: {E2E:g} s, the default proxy "
             "read timeout the alert uses.",
        bad=f"p99 at or above {E2E:g} s: default proxies (nginx, ingress-nginx) cut non-streamed requests off.",
        runbooks=["VLLMEndToEndLatencyHigh"],
    )  # fmt: skip
    b.timeseries(
        "Queue time", unit="s", queries=_quantiles(b, "vllm:request_queue_time_seconds", by, legend),
        what="p50, p95 and p99 time requests spent waiting before the scheduler ran them.",
        bad="Growing queue time with a full KV cache: capacity is short, scale out. Growing with KV-cache "
            "headroom: the scheduler limits (--max-num-seqs) cap concurrency.",
        runbooks=["VLLMScaleOutNeeded", "VLLMQueueingWithKVCacheHeadroom"],
    )  # fmt: skip


def _throughput_panels(b: Board, by: str, legend: str) -> None:
    b.timeseries(
        "Prompt and generation tokens/s", unit="count:tok/s",
        queries=[Q(_rate(b, "vllm:prompt_tokens_total", by), f"prompt {legend}"),
                 Q(_rate(b, "vllm:generation_tokens_total", by), f"generation {legend}")],
        what="Prefill (prompt) and decode (generation) tokens processed per second, from the counters every "
             "vLLM release exports.",
        bad="Generation falling to under 30% of its recent level while as many requests run: the engine got "
            "slower (inter-GPU bandwidth, throttling); run nccl-tests all_reduce_perf.",
        runbooks=["VLLMGenerationThroughputLow"],
    )  # fmt: skip
    b.timeseries(
        "Finished requests by reason", unit="reqps", stack=True,
        queries=[Q(_rate(b, "vllm:request_success_total", by + ", finished_reason"),
                   f"{{{{finished_reason}}}} {legend}")],
        what="Requests finished per second by reason: stop (end of sequence), length (max_tokens or "
             "max_model_len reached), abort (client gone), error (0.13+).",
        bad="abort rising: clients give up, usually on latency; length dominating: clients hit max_tokens or "
            "--max-model-len truncates them.",
        runbooks=["VLLMEndToEndLatencyHigh"],
    )  # fmt: skip
    b.timeseries(
        "Preemptions", unit="reqps",
        queries=[Q(_rate(b, "vllm:num_preemptions_total", by), legend)],
        what="Requests preempted per second because the KV cache could not hold the running batch.",
        bad="Any preemption in every 5-minute window for 15 minutes: raise --gpu-memory-utilization, or lower "
            "--max-num-seqs or --max-num-batched-tokens.",
        runbooks=["VLLMPreemptionsSustained"],
    )  # fmt: skip
    b.timeseries(
        "Prefix-cache hit rate", unit="percentunit", min_=0, max_=1,
        queries=[Q(_hit_rate(b, by), legend)],
        what="Share of queried prompt tokens served from the prefix cache (V1 counters; V0's block hit-rate "
             "gauge where prefix caching is on). No data: prefix caching is off or nothing was queried.",
        bad="A falling hit rate with shared prompts means more prefill work and a higher time to first token; "
            "the KV cache may be too small to keep the shared prefixes.",
        runbooks=["VLLMTimeToFirstTokenHigh", "VLLMKVCacheSaturated"],
    )  # fmt: skip


def fleet() -> Board:
    """``vllm-fleet``: every model and replica at once, and a per-model table."""
    b = _board("vllm-fleet", "vLLM fleet",
               "Load, KV cache, throughput and latency of every vLLM server, on V0 and V1 metric names.")
    by, legend = "model_name", "{{model_name}}"
    b.row("Load")
    b.timeseries(
        "Requests running and waiting", unit="short",
        queries=[Q(f"sum by (model_name) ({b.sel('vllm:num_requests_running')})", "running {{model_name}}"),
                 Q(f"sum by (model_name) ({b.sel('vllm:num_requests_waiting')})", "waiting {{model_name}}")],
        what="Requests in the running batch and in the waiting queue, per model, summed over replicas.",
        bad="Waiting that keeps growing: the backends are short of capacity; scale out.",
        runbooks=["VLLMRequestQueueGrowing", "VLLMScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "Scale-out rule: waiting vs running", unit="short",
        queries=[Q('job_model:vllm_num_requests_waiting:sum{job=~"$job", model_name=~"$model_name"}',
                   "waiting {{model_name}}"),
                 Q(f'{SCALE_OUT:g} * job_model:vllm_num_requests_running:sum{{job=~"$job", model_name=~"$model_name"}}',
                   f"{SCALE_OUT:g} x running {{{{model_name}}}}")],
        what=f"The scale-out rule's two sides per model (recording rules from rules/vllm.rules.yaml): waiting "
             f"requests against {SCALE_OUT:g} x running requests.",
        bad=f"Waiting above {SCALE_OUT:g} x running for 5 minutes fires VLLMScaleOutNeeded and the agent's "
            "scale-out action.",
        runbooks=["VLLMScaleOutNeeded"],
    )  # fmt: skip
    _kv_panel(b, "instance, model_name", "{{instance}} {{model_name}}")
    b.row("Throughput")
    _throughput_panels(b, by, legend)
    b.row("Latency")
    _latency_panels(b, by, legend)
    b.row("Models")
    b.table(
        "Models", hide=[],
        columns=[
            Column("Replicas", f"count by (model_name) (max by (model_name, instance) "
                               f"({b.sel('vllm:num_requests_running')}))", "short"),
            Column("Running", f"sum by (model_name) ({b.sel('vllm:num_requests_running')})", "short"),
            Column("Waiting", f"sum by (model_name) ({b.sel('vllm:num_requests_waiting')})", "short"),
            Column("KV cache (max)", _kv(b, by), "percentunit"),
            Column("Generation tok/s", _rate(b, "vllm:generation_tokens_total", by), "count:tok/s"),
            Column("TTFT p99", _quantile(b, 0.99, "vllm:time_to_first_token_seconds", by), "s"),
            Column("ITL p99", _quantile(b, 0.99, "vllm:inter_token_latency_seconds", by), "s"),
            Column("E2E p99", _quantile(b, 0.99, "vllm:e2e_request_latency_seconds", by), "s"),
        ],
        what="One row per model: replicas, load, the fullest KV cache, throughput and p99 latencies now.",
        bad=f"KV cache above {KV_HIGH:.0%}, TTFT p99 above {TTFT:g} s, ITL p99 above {ITL:g} s or E2E p99 at "
            f"{E2E:g} s: see the panels above and the runbooks.",
        runbooks=["VLLMKVCacheSaturated", "VLLMTimeToFirstTokenHigh", "VLLMScaleOutNeeded"],
    )  # fmt: skip
    return b


def replica() -> Board:
    """``vllm-replica``: the selected instances one by one, with what the fleet view sums away."""
    b = _board("vllm-replica", "vLLM replica",
               "One vLLM server in depth: scheduler, KV cache, token rates, request shapes, phase times.")
    by, legend = "instance, model_name", "{{instance}} {{model_name}}"
    b.row("Health")
    b.stat(
        "Target up", unit="bool_on_off", thresholds=[(1, "green")], base="red",
        queries=[Q(f'up{{job=~"$job", instance=~"$instance"}} and on (job, instance) '
                   f"last_over_time({b.sel('vllm:num_requests_running')}[1h])", "{{instance}}")],
        what="Whether the last scrape of the server's /metrics succeeded (vLLM opens it only once the model is "
             "loaded; targets that served vLLM metrics in the last hour).",
        bad="Off for 10 minutes: the engine is dead, still loading, or unreachable.",
        runbooks=["VLLMTargetDown", "VLLMAllTargetsDown"], width=8,
    )  # fmt: skip
    b.stat(
        "KV-cache usage now", unit="percentunit", thresholds=[(KV_HEADROOM, "yellow"), (KV_HIGH, "red")],
        queries=[Q(_kv(b, by), legend)],
        what="The KV cache's fill now, per server.", bad=f"Above {KV_HIGH:.0%}: preemptions follow.",
        runbooks=["VLLMKVCacheSaturated"], width=8,
    )  # fmt: skip
    b.table(
        "Cache configuration", width=8, height=4,
        hide=["__name__", "job", "engine", "cache_dtype", "calculate_kv_scales", "cpu_kvcache_space_bytes",
              "cpu_offload_gb", "is_attention_free", "kv_sharing_fast_prefill", "mamba_cache_dtype",
              "mamba_ssm_cache_dtype", "num_gpu_blocks_override", "prefix_caching_hash_algo", "sliding_window",
              "swap_space", "swap_space_bytes", "num_cpu_blocks"],
        # the info series has CacheConfig's fields for labels, and no model_name
        columns=[Column("Info", 'vllm:cache_config_info{job=~"$job", instance=~"$instance"}', "none")],
        what="vLLM's CacheConfig as the server reports it (vllm:cache_config_info): block size, KV blocks, "
             "--gpu-memory-utilization, prefix caching.",
        bad="Few GPU blocks for the model's --max-model-len x --max-num-seqs means preemption; compare with "
            "`sre-agent plan`.",
        runbooks=["diagnosis-kv-cache-capacity"],
    )  # fmt: skip
    b.row("Scheduler and KV cache")
    b.timeseries(
        "Requests running and waiting", unit="short",
        queries=[Q(f"sum by ({by}) ({b.sel('vllm:num_requests_running')})", f"running {legend}"),
                 Q(f"sum by ({by}) ({b.sel('vllm:num_requests_waiting')})", f"waiting {legend}")],
        what="The server's running batch and waiting queue (data-parallel engines summed).",
        bad="Waiting above twice running for 5 minutes, across the model's replicas, triggers scale-out.",
        runbooks=["VLLMScaleOutNeeded", "VLLMRequestQueueGrowing"],
    )  # fmt: skip
    _kv_panel(b, by, legend)
    b.row("Throughput")
    _throughput_panels(b, by, legend)
    b.timeseries(
        "Tokens per engine step", unit="short",
        queries=[Q(_mean(b, "vllm:iteration_tokens_total", by), legend)],
        what="Mean tokens the engine processed per step (vllm:iteration_tokens_total): the batch size in tokens.",
        bad="Small steps while requests wait: the scheduler limits (--max-num-batched-tokens, --max-num-seqs) "
            "hold the batch back.",
        runbooks=["VLLMQueueingWithKVCacheHeadroom"],
    )  # fmt: skip
    b.timeseries(
        "Request length p95", unit="short",
        queries=[Q(_quantile(b, 0.95, "vllm:request_prompt_tokens", by), f"prompt {legend}"),
                 Q(_quantile(b, 0.95, "vllm:request_generation_tokens", by), f"generation {legend}")],
        what="p95 prompt and generation length of finished requests, in tokens.",
        bad="Longer prompts raise time to first token and KV-cache use; plan capacity for the new shape.",
        runbooks=["VLLMTimeToFirstTokenHigh"],
    )  # fmt: skip
    b.row("Latency")
    _latency_panels(b, by, legend)
    b.timeseries(
        "Prefill and decode time (mean)", unit="s",
        queries=[Q(_mean(b, "vllm:request_prefill_time_seconds", by), f"prefill {legend}"),
                 Q(_mean(b, "vllm:request_decode_time_seconds", by), f"decode {legend}")],
        what="Mean time a request spends in prefill and in decode.",
        bad="Prefill time rising: long prompts; decode time rising with the same lengths: the engine is slower "
            "per token (bandwidth, throttling).",
        runbooks=["VLLMTimeToFirstTokenHigh", "VLLMGenerationThroughputLow"],
    )  # fmt: skip
    return b
