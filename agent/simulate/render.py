"""Render a simulated replica's state as the ``/metrics`` text vLLM or LMDeploy serves.

The agent's scraper, parser and rules must meet exactly what production emits, so the
text is produced by prometheus_client itself (``generate_latest`` over a custom
collector) the way vLLM and LMDeploy produce theirs: the same family names and types per
generation, HELP texts, label keys (``model_name``, ``engine``), ``_created`` series
where the real server has them, default buckets from :mod:`agent.collect.catalog`.

Three flavors: ``v1`` (vLLM 0.11.0, the V1 engine), ``v0`` (vLLM 0.7.3 on the V0 engine:
``gpu_cache_usage_perc``, ``time_per_output_token_seconds``, no ``engine`` label, no
``_created``, V0 HELP texts) and ``lmdeploy`` (0.14, ``lmdeploy:`` names).
:class:`Renderer` renders at most once per model step and serves the cached bytes to
every scrape in between; it fills a template cut from ``generate_latest``'s text with the step's
values (:mod:`agent.simulate.template`), so the bytes stay prometheus_client's at a fourteenth of
the cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from agent.collect import catalog
from agent.errors import SimulatorError
from agent.simulate.model import HIST_KEYS, ReplicaModel, ReplicaParams
from agent.simulate.template import Template

__all__ = ["FLAVORS", "VERSIONS", "Renderer", "bounds_for"]

FLAVORS: Final = ("v1", "v0", "lmdeploy")
#: What ``GET /version`` reports; the family sets below are those releases'.
VERSIONS: Final = {"v1": "0.11.0", "v0": "0.7.3", "lmdeploy": "0.14.0"}
_VERSION: Final = {k: catalog.parse_version(v) for k, v in VERSIONS.items()}

#: The family whose default buckets each model histogram takes (LMDeploy's own where it has one).
_BUCKETS_FROM: Final = {
    "ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
    "tpot": "request_time_per_output_token_seconds", "e2e": "e2e_request_latency_seconds",
    "queue": "request_queue_time_seconds", "inference": "request_inference_time_seconds",
    "prefill": "request_prefill_time_seconds", "decode": "request_decode_time_seconds",
    "prompt_tokens": "request_prompt_tokens", "generation_tokens": "request_generation_tokens",
    "max_tokens": "request_params_max_tokens", "n": "request_params_n",
    "iteration_tokens": "iteration_tokens_total", "cached_tokens": "request_cached_tokens",
    "hit_ratio": "request_cache_hit_ratio",
}  # fmt: skip
_LM_BUCKETS_FROM: Final = {"itl": "iter_token_latency", "tpot": "time_per_output_token_seconds"}

# Family rows: (kind, name, HELP, source). Kinds: g gauge, c counter, h histogram (source = model
# histogram key, "" = registered but never observed), s request_success, i cache_config_info,
# l lora_requests_info, b LMDeploy's label-less backend_config_info.
_RUN_V1 = "Number of requests in model execution batches."
_WAIT = "Number of requests waiting to be processed."
_KV = "GPU KV-cache usage. 1 means 100 percent usage."
_PROMPT, _GEN = "Number of prefill tokens processed.", "Number of generation tokens processed."
_SUCCESS = "Count of successfully processed requests."
_PREEMPT = "Cumulative number of preemption from the engine."
_CACHE_INFO = "Information of the LLMEngine CacheConfig"
_TTFT = "Histogram of time to first token in seconds."
_TPOT = "Histogram of time per output token in seconds."
_E2E = "Histogram of e2e request latency in seconds."
_ITER = "Histogram of number of tokens per engine_step."
_MAXGEN = "Histogram of maximum number of requested generation tokens."
_PHASE = "Histogram of time spent in {} phase for request."
_REQUEST_HISTS: Final = (
    ("h", "request_queue_time_seconds", _PHASE.format("WAITING"), "queue"),
    ("h", "request_inference_time_seconds", _PHASE.format("RUNNING"), "inference"),
    ("h", "request_prefill_time_seconds", _PHASE.format("PREFILL"), "prefill"),
    ("h", "request_decode_time_seconds", _PHASE.format("DECODE"), "decode"),
)
_PARAMS_HISTS: Final = (
    ("h", "request_max_num_generation_tokens", _MAXGEN, "max_tokens"),
    ("h", "request_params_n", "Histogram of the n request parameter.", "n"),
    ("h", "request_params_max_tokens", "Histogram of the max_tokens request parameter.", "max_tokens"),
)
_FAMILIES: Final[dict[str, tuple[tuple[str, str, str, str], ...]]] = {
    "v1": (
        ("g", "num_requests_running", _RUN_V1, "running"), ("g", "num_requests_waiting", _WAIT, "waiting"),
        ("g", "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv"),
        ("c", "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
         "queries"),
        ("c", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "hits"),
        ("c", "num_preemptions", _PREEMPT, "preemptions"), ("c", "prompt_tokens", _PROMPT, "prompt"),
        ("c", "generation_tokens", _GEN, "generation"), ("s", "request_success", _SUCCESS, ""),
        ("h", "request_prompt_tokens", _PROMPT, "prompt_tokens"),
        ("h", "request_generation_tokens", _GEN, "generation_tokens"),
        ("h", "iteration_tokens_total", _ITER, "iteration_tokens"), *_PARAMS_HISTS,
        ("h", "time_to_first_token_seconds", _TTFT, "ttft"),
        ("h", "time_per_output_token_seconds",
         _TPOT + "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", "itl"),
        ("h", "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
        ("h", "request_time_per_output_token_seconds",
         "Histogram of time_per_output_token_seconds per request.", "tpot"),
        ("h", "e2e_request_latency_seconds", _E2E, "e2e"), *_REQUEST_HISTS,
        ("i", "cache_config_info", _CACHE_INFO, ""),
    ),
    "v0": (
        ("i", "cache_config_info", _CACHE_INFO, ""),
        ("g", "num_requests_running", "Number of requests currently running on GPU.", "running"),
        ("g", "num_requests_swapped", "Number of requests swapped to CPU.", "zero"),
        ("g", "num_requests_waiting", _WAIT, "waiting"), ("g", "gpu_cache_usage_perc", _KV, "kv"),
        ("g", "cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", "zero"),
        ("g", "cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate.", "off"),
        ("g", "gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", "off"),
        ("l", "lora_requests_info", "Running stats on lora requests.", ""),
        ("c", "num_preemptions", _PREEMPT, "preemptions"), ("c", "prompt_tokens", _PROMPT, "prompt"),
        ("c", "generation_tokens", _GEN, "generation"), ("s", "request_success", _SUCCESS, ""),
        ("h", "iteration_tokens_total", _ITER, "iteration_tokens"),
        ("h", "time_to_first_token_seconds", _TTFT, "ttft"),
        ("h", "time_per_output_token_seconds", _TPOT, "itl"),
        ("h", "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", "e2e"),
        *_REQUEST_HISTS,
        ("h", "time_in_queue_requests", "Histogram of time the request spent in the queue in seconds.",
         "queue"),
        ("h", "model_forward_time_milliseconds", "Histogram of time spent in the model forward pass in ms.",
         ""),
        ("h", "model_execute_time_milliseconds",
         "Histogram of time spent in the model execute function in ms.", ""),
        ("h", "request_prompt_tokens", _PROMPT, "prompt_tokens"),
        ("h", "request_generation_tokens", _GEN, "generation_tokens"), *_PARAMS_HISTS,
    ),
    "lmdeploy": (
        ("b", "backend_config_info", "information of backend_config", ""),
        ("g", "num_requests_running", _RUN_V1, "running"), ("g", "num_requests_waiting", _WAIT, "waiting"),
        ("g", "num_api_requests_routed", "Number of requests routed to request handles.", "routed"),
        ("g", "num_api_requests_waiting", "Number of requests waiting for free request handles.", "zero"),
        ("g", "num_requests_succeeded", "Number of current succeeded requests.", "succeeded"),
        ("g", "num_requests_failed", "Number of current failed requests.", "failed"),
        ("g", "gpu_cache_usage_perc", _KV, "kv"),
        ("g", "prefix_cache_hit_rate",
         "Prefix-cache hit rate. 1 means 100 percent of queried prefix tokens hit.", "hit_rate"),
        ("c", "prompt_tokens", _PROMPT, "prompt"), ("c", "generation_tokens", _GEN, "generation"),
        ("c", "cached_tokens", "Total prefix-cached input tokens served.", "hits"),
        ("s", "request_success", _SUCCESS, ""),
        ("h", "request_prompt_tokens", _PROMPT, "prompt_tokens"),
        ("h", "request_generation_tokens", _GEN, "generation_tokens"),
        ("h", "request_cached_tokens", "Number of prefix-cached input tokens per request.", "cached_tokens"),
        ("h", "request_cache_hit_ratio",
         "Prefix cache hit ratio (cached_tokens / prompt_tokens) per request.", "hit_ratio"),
        ("h", "iteration_tokens_total", _ITER, "iteration_tokens"),
        ("h", "time_to_first_token_seconds", _TTFT, "ttft"),
        ("h", "time_per_output_token_seconds", _TPOT, "tpot"),
        ("h", "iter_token_latency", "Histogram of inter-token latency.", "itl"),
        ("h", "e2e_request_latency_seconds", _E2E, "e2e"), *_REQUEST_HISTS,
    ),
}  # fmt: skip
_VALUES: Final[dict[str, Callable[[ReplicaModel], float]]] = {
    "running": lambda m: m.num_running, "waiting": lambda m: m.num_waiting, "kv": lambda m: m.kv_usage,
    "zero": lambda m: 0.0, "off": lambda m: -1.0, "queries": lambda m: m.prefix_queries,
    "hits": lambda m: m.prefix_hits, "preemptions": lambda m: m.preemptions,
    "prompt": lambda m: int(m.prompt_tokens), "generation": lambda m: int(m.generation_tokens),
    "routed": lambda m: m.num_running + m.num_waiting, "hit_rate": lambda m: m.recent_hit_rate,
    "succeeded": lambda m: m.success["stop"] + m.success["length"], "failed": lambda m: m.success["abort"],
}  # fmt: skip
#: LMDeploy labels finishes with ``str(ResponseType.X)``.
_LM_REASONS: Final = {"stop": "ResponseType.FINISH", "length": "ResponseType.FINISH",
                      "abort": "ResponseType.CANCEL"}  # fmt: skip


def _check(flavor: str) -> None:
    if flavor not in FLAVORS:
        raise SimulatorError(f"unknown generation {flavor!r}; choose one of {', '.join(FLAVORS)}")


def bounds_for(flavor: str, max_model_len: int) -> dict[str, tuple[float, ...]]:
    """Bucket bounds for every model histogram, as the flavor's release defaults them."""
    _check(flavor)
    out: dict[str, tuple[float, ...]] = {}
    for key in HIST_KEYS:
        short = _LM_BUCKETS_FROM.get(key, _BUCKETS_FROM[key]) if flavor == "lmdeploy" else _BUCKETS_FROM[key]
        if catalog.family("lmdeploy:" + short) is not None and (flavor == "lmdeploy" or key == "hit_ratio"):
            name, version, track = "lmdeploy:" + short, None, catalog.Track.LMDEPLOY
        elif flavor == "lmdeploy" or key == "cached_tokens":
            name, version, track = "vllm:request_prompt_tokens", None, catalog.Track.V1
        else:
            name, version, track = "vllm:" + short, _VERSION[flavor], catalog.Track(flavor)
        out[key] = catalog.default_buckets(name, version, track=track, max_model_len=max_model_len) or ()
    return out


def _cache_config(params: ReplicaParams, flavor: str) -> dict[str, str]:
    """``vllm:cache_config_info`` labels: ``str()`` of every CacheConfig field, as vLLM does."""
    v0 = flavor == "v0"
    values = {
        "block_size": str(params.block_size), "cache_dtype": "auto", "calculate_kv_scales": "False",
        "cpu_kvcache_space_bytes": "None", "cpu_offload_gb": "0", "enable_prefix_caching": str(not v0),
        "engine": "0", "gpu_memory_utilization": str(params.gpu_memory_utilization),
        "is_attention_free": "False", "kv_sharing_fast_prefill": "False", "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "2048" if v0 else "None",
        "num_gpu_blocks": str(params.num_gpu_blocks), "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "swap_space": "4",
        "swap_space_bytes": str(4 << 30),
    }  # fmt: skip
    track = catalog.Track.V0 if v0 else catalog.Track.V1
    return {k: values[k] for k in catalog.cache_config_label_keys(track)}


class _Collector:
    """A prometheus_client collector over one replica model, yielding families in the
    order the real server registers them."""

    def __init__(self, model: ReplicaModel, flavor: str, model_name: str, created: float) -> None:
        self.model, self.flavor, self.created, self.started = model, flavor, created, model.now
        self.keys = ["model_name"] if flavor == "v0" else ["model_name", "engine"]
        self.values = [model_name] if flavor == "v0" else [model_name, "0"]
        self.prefix = "lmdeploy:" if flavor == "lmdeploy" else "vllm:"
        self.with_created = flavor == "v1"  # V0 and LMDeploy call disable_created_metrics()
        self.cache_config = _cache_config(model.params, flavor)
        zero = catalog.default_buckets("vllm:model_forward_time_milliseconds") or ()
        # prometheus_client ships floatToGoString without annotations
        les = {k: [floatToGoString(b) for b in h.bounds] for k, h in model.hists.items()}  # type: ignore[no-untyped-call]
        les[""] = [floatToGoString(b) for b in zero]  # type: ignore[no-untyped-call]
        self.les: dict[str, list[str]] = les

    def collect(self) -> Iterator[Metric]:
        for kind, name, doc, source in _FAMILIES[self.flavor]:
            yield self._family(kind, self.prefix + name, doc, source)

    def sample_values(self) -> tuple[tuple[str, ...], list[float]]:
        """The value program: every sample's value in the order ``generate_latest`` prints what
        :meth:`collect` yields (a family's samples, then its ``_created`` gauge), and the shape (the
        finish reasons shown: the only part of the sample set that changes over a replica's life)."""
        m, out = self.model, []
        created = [self.created] if self.with_created else []
        reasons: dict[str, float] = {}
        for kind, _, _, source in _FAMILIES[self.flavor]:
            if kind == "g":
                out.append(_VALUES[source](m))
            elif kind == "c":
                out += [_VALUES[source](m), *created]
            elif kind == "s":
                reasons = self._reasons()
                out += [*reasons.values(), *created * len(reasons)]
            elif kind == "h":
                cum, total = self._cumulative(source)
                out += [*cum, cum[-1], total, *created]
            elif kind == "l":
                out.append(self.created + m.now - self.started)
            else:
                out.append(1.0)
        return tuple(reasons), out

    def _family(self, kind: str, name: str, doc: str, source: str) -> Metric:
        m = self.model
        if kind == "g":
            gauge = GaugeMetricFamily(name, doc, labels=self.keys)
            gauge.add_metric(self.values, _VALUES[source](m))
            return gauge
        if kind == "c":
            return self._counter(name, doc, {"": _VALUES[source](m)})
        if kind == "s":
            return self._counter(name, doc, self._reasons(), "finished_reason")
        if kind == "h":
            return self._histogram(name, doc, source)
        if kind == "b":
            return GaugeMetricFamily(name, doc, value=1.0)
        info = GaugeMetricFamily(name, doc, labels=list(self.cache_config) if kind == "i" else
                                 ["max_lora", "running_lora_adapters", "waiting_lora_adapters"])  # fmt: skip
        if kind == "i":
            info.add_metric(list(self.cache_config.values()), 1.0)
        else:  # lora_requests_info holds set_to_current_time()
            info.add_metric(["0", "", ""], self.created + m.now - self.started)
        return info

    def _reasons(self) -> dict[str, float]:
        reasons: dict[str, float] = {}
        for reason, count in self.model.success.items():
            label = _LM_REASONS[reason] if self.flavor == "lmdeploy" else reason
            if count or self.flavor == "v1":  # V1 creates every reason at start-up
                reasons[label] = reasons.get(label, 0.0) + count
        return reasons

    def _cumulative(self, key: str) -> tuple[list[int], float]:
        """A histogram's cumulative bucket counts (``+Inf`` last) and sum."""
        if key:
            hist = self.model.hists[key]
            return hist.cumulative(), hist.sum
        # V0's detailed-trace histograms exist but stay empty without --collect-detailed-traces
        return [0] * (len(self.les[""]) + 1), 0.0

    def _counter(self, name: str, doc: str, values: dict[str, float], label: str = "") -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=[*self.keys, label] if label else self.keys)
        created = self.created if self.with_created else None
        for extra, value in values.items():
            fam.add_metric([*self.values, extra] if label else self.values, value, created=created)
        return fam

    def _histogram(self, name: str, doc: str, key: str) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=self.keys)
        les = self.les[key]
        cum, total = self._cumulative(key)
        buckets = [*zip(les, map(float, cum), strict=False), ("+Inf", float(cum[-1]))]
        fam.add_metric(self.values, buckets, total)
        if self.with_created:
            labels = dict(zip(self.keys, self.values, strict=True))
            fam.samples.append(Sample(fam.name + "_created", labels, self.created))
        return fam


class Renderer:
    """Exposition bytes for one replica, rendered at most once per model step, through a
    :class:`~agent.simulate.template.Template` compiled from ``generate_latest``'s own text."""

    def __init__(self, model: ReplicaModel, flavor: str, model_name: str, *, created: float) -> None:
        _check(flavor)
        self.model = model
        self.renders = 0
        self.compiles = 0
        self._collector = _Collector(model, flavor, model_name, created)
        self._template: Template | None = None
        self._step = -1
        self._body = b""

    def render(self) -> bytes:
        """The text-format body (``text/plain; version=0.0.4``) for the model's current step."""
        if self._step != self.model.steps:
            shape, values = self._collector.sample_values()
            if self._template is None or self._template.shape != shape:
                self._template = Template.compile(list(self._collector.collect()), values, shape)
                self.compiles += 1
            self._body = self._template.fill(values)
            self._step = self.model.steps
            self.renders += 1
        return self._body

    def reference(self) -> bytes:
        """``generate_latest`` over the replica's families: what :meth:`render` must equal."""
        return generate_latest(self._collector)
