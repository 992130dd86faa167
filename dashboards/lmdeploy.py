"""The LMDeploy dashboard (``lmdeploy``): ``lmdeploy serve api_server`` on its own names.

Names from fixtures/vllm/CATALOG.md §5 (v0.9.2-v0.16.0). LMDeploy has no prefix-cache miss
counter: the miss ratio is ``1 - lmdeploy:prefix_cache_hit_rate`` (the gauge the alert
uses, v0.14+), shown beside the token-level ratio from ``lmdeploy:cached_tokens_total``.
Its inter-token histogram is ``lmdeploy:iter_token_latency`` (v0.10+, no ``_seconds``).
"""

from __future__ import annotations

from dashboards.kit import Board, Q, Var
from dashboards.rules import factor, threshold

__all__ = ["board"]

_VARS = (
    Var("job", "job", "lmdeploy:num_requests_running"),
    Var("model_name", "model_name", "lmdeploy:num_requests_running"),
    Var("instance", "instance", "lmdeploy:num_requests_running"),
)
MISS = threshold("LMDeployPrefixCacheMissHigh", "job_model:lmdeploy_prefix_cache_miss_ratio:avg")
TTFT = threshold("LMDeployTimeToFirstTokenHigh", "instance_model:lmdeploy_time_to_first_token_seconds:p99_rate5m")
E2E = threshold("LMDeployEndToEndLatencyHigh", "instance_model:lmdeploy_e2e_request_latency_seconds:p99_rate5m")
SCALE_OUT = factor("LMDeployScaleOutNeeded", "job_model:lmdeploy_num_requests_waiting:sum")
_BY, _LEGEND = "instance, model_name", "{{instance}} {{model_name}}"


def board() -> Board:
    b = Board("lmdeploy", "LMDeploy", "LMDeploy api_server: load, KV and prefix cache, tokens/s, latency.",
              tags=["lmdeploy"], variables=_VARS)

    def rate(metric: str, by: str = _BY) -> str:
        return f"sum by ({by}) (rate({b.sel(metric)}[$__rate_interval]))"

    def quantiles(family: str) -> list[Q]:
        return [Q(f"histogram_quantile({q}, {rate(family + '_bucket', _BY + ', le')})", f"p{round(q * 100)} {_LEGEND}")
                for q in (0.5, 0.95, 0.99)]  # fmt: skip

    b.row("Load")
    b.stat(
        "Target up", unit="bool_on_off", thresholds=[(1, "green")], base="red",
        queries=[Q(f'up{{job=~"$job", instance=~"$instance"}} and on (job, instance) '
                   f"last_over_time({b.sel('lmdeploy:num_requests_running')}[1h])", "{{instance}}")],
        what="Whether the last scrape of the api_server's /metrics succeeded (targets that served LMDeploy "
             "metrics in the last hour).",
        bad="Off for 10 minutes: the server is down, still loading, or runs with --disable-metrics.",
        runbooks=["LMDeployTargetDown"], width=24,
    )  # fmt: skip
    b.timeseries(
        "Requests running and waiting", unit="short",
        queries=[Q(f"sum by ({_BY}) ({b.sel('lmdeploy:num_requests_running')})", f"running {_LEGEND}"),
                 Q(f"sum by ({_BY}) ({b.sel('lmdeploy:num_requests_waiting')})", f"waiting {_LEGEND}")],
        what="Requests in the engine's batch and waiting for it (refreshed by LMDeploy every 10 s).",
        bad="Waiting that keeps growing: the backends are short of capacity; scale out.",
        runbooks=["LMDeployRequestQueueGrowing", "LMDeployScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "Scale-out rule: waiting vs running", unit="short",
        queries=[Q('job_model:lmdeploy_num_requests_waiting:sum{job=~"$job", model_name=~"$model_name"}',
                   "waiting {{model_name}}"),
                 Q(f'{SCALE_OUT:g} * job_model:lmdeploy_num_requests_running:sum'
                   '{job=~"$job", model_name=~"$model_name"}', f"{SCALE_OUT:g} x running {{{{model_name}}}}")],
        what=f"The scale-out rule's two sides per model (recording rules from rules/lmdeploy.rules.yaml): "
             f"waiting against {SCALE_OUT:g} x running.",
        bad=f"Waiting above {SCALE_OUT:g} x running for 5 minutes fires LMDeployScaleOutNeeded and scale-out.",
        runbooks=["LMDeployScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "KV-cache usage", unit="percentunit", min_=0, max_=1,
        queries=[Q(f"max by ({_BY}) ({b.sel('lmdeploy:gpu_cache_usage_perc')})", _LEGEND)],
        what="Share of the KV cache in use (for TurboMind: bytes held by live prefix-cache and checkpoint "
             "objects over the cache region). No alert uses it.",
        bad="Near 100% with requests waiting: the cache limits concurrency; raise --cache-max-entry-count or "
            "bound sessions with --session-len.",
        runbooks=["LMDeployScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "Prefix-cache miss ratio", unit="percentunit", min_=0, max_=1, thresholds=[(MISS, "red")],
        queries=[Q(f"1 - avg by ({_BY}) ({b.sel('lmdeploy:prefix_cache_hit_rate')})", f"gauge {_LEGEND}"),
                 Q(f"1 - {rate('lmdeploy:cached_tokens_total')} / ({rate('lmdeploy:prompt_tokens_total')} > 0)",
                   f"tokens {_LEGEND}")],
        what="Share of queried prefix tokens not found in the cache: 1 - LMDeploy's hit-rate gauge (what the "
             f"alert uses), and 1 - cached / prompt tokens. Dashed line: the alert's {MISS:.0%}. LMDeploy "
             "has no miss counter; both are derived (v0.14+).",
        bad=f"Above {MISS:.0%} for 10 minutes with prefix caching on: scale out so the shared prefixes fit "
            "in more KV cache.",
        runbooks=["LMDeployPrefixCacheMissHigh"],
    )  # fmt: skip
    b.row("Throughput")
    b.timeseries(
        "Prompt and generation tokens/s", unit="count:tok/s",
        queries=[Q(rate("lmdeploy:prompt_tokens_total"), f"prompt {_LEGEND}"),
                 Q(rate("lmdeploy:generation_tokens_total"), f"generation {_LEGEND}")],
        what="Prefill and decode tokens per second: the guide's token rate.",
        bad="Generation falling while requests keep running: the engine got slower; check GPU throttling and "
            "inter-GPU bandwidth.",
        runbooks=["LMDeployScaleOutNeeded", "diagnosis-nccl-bandwidth-low"],
    )  # fmt: skip
    b.timeseries(
        "Finished requests by reason", unit="reqps", stack=True,
        queries=[Q(rate("lmdeploy:request_success_total", _BY + ", finished_reason"),
                   f"{{{{finished_reason}}}} {_LEGEND}")],
        what="Requests finished per second by LMDeploy's ResponseType (FINISH, CANCEL, errors).",
        bad="CANCEL rising: clients give up; any *_ERROR (OUT_OF_MEMORY, INPUT_LENGTH_ERROR): requests fail.",
        runbooks=["LMDeployEndToEndLatencyHigh"],
    )  # fmt: skip
    b.row("Latency")
    b.timeseries(
        "Time to first token", unit="s", thresholds=[(TTFT, "red")],
        queries=quantiles("lmdeploy:time_to_first_token_seconds"),
        what=f"p50, p95 and p99 time to the first output token. Dashed line: the alert's p99 limit ({TTFT:g} s).",
        bad=f"p99 above {TTFT:g} s for 10 minutes: long prompts block; lower --max-prefill-token-num or add "
            "replicas.",
        runbooks=["LMDeployTimeToFirstTokenHigh"],
    )  # fmt: skip
    b.timeseries(
        "Inter-token latency", unit="s", queries=quantiles("lmdeploy:iter_token_latency"),
        what="p50, p95 and p99 time between output tokens (lmdeploy:iter_token_latency, v0.10+).",
        bad="A rising p99 makes streams stutter: batches are too large for the GPU; add replicas.",
        runbooks=["LMDeployEndToEndLatencyHigh"],
    )  # fmt: skip
    b.timeseries(
        "End-to-end request latency", unit="s", thresholds=[(E2E, "red")],
        queries=quantiles("lmdeploy:e2e_request_latency_seconds"),
        what=f"p50, p95 and p99 request latency. Dashed line: {E2E:g} s, the default proxy read timeout.",
        bad=f"p99 at or above {E2E:g} s: default proxies time requests out.",
        runbooks=["LMDeployEndToEndLatencyHigh"],
    )  # fmt: skip
    b.timeseries(
        "Queue time", unit="s", queries=quantiles("lmdeploy:request_queue_time_seconds"),
        what="p50, p95 and p99 time requests waited before the engine ran them.",
        bad="Growing queue time: capacity is short; scale out.",
        runbooks=["LMDeployRequestQueueGrowing"],
    )  # fmt: skip
    return b
