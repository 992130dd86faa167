"""The series the report plots, and where they come from.

Six plots: the firing series (the rule's value side, with its threshold as a line or, when the
threshold is an expression, as a second series) and the context a person checks next on an LLM
server: KV-cache usage, requests waiting vs running, TTFT p99, generation throughput and GPU
memory per GPU. Each is a few PromQL range queries scoped to the incident's labels
(:func:`agent.app.triage.rule.scoped`), over a window around the incident (:func:`window`). GPUs are
scoped to the alert's ``gpu``/``Hostname`` labels, else to the node of its ``instance`` (dcgm-exporter's
``Hostname``), else (no such series) every GPU, the highest :data:`MAX_LINES` drawn.

Where the data comes from is one function, ``RangeQuery``: in embedded mode the agent's own engine
over its store (:func:`local_query`; on the event loop, where the store is written), in Prometheus
mode a range query on the source (:func:`remote_query` over :mod:`agent.promql.history`, blocking and
deadline-bound: the caller runs it in a thread). A query that fails (no answer in time, an answer too
large or malformed: :class:`~agent.errors.SourceError`) draws its plot empty with the reason; it never
fails the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent.app.triage.facts import Facts
from agent.app.triage.rule import scoped
from agent.errors import AgentError
from agent.promql import Engine
from agent.promql.history import RemoteHistory

__all__ = ["CONTEXT_FAMILIES", "MAX_LINES", "Line", "PlotData", "PlotSpec", "Query", "RangeQuery", "Window", "fetch",
           "local_query", "plot_specs", "remote_query", "window"]

#: One series: labels, times (Unix ms), values.
Points = tuple[dict[str, str], list[int], list[float]]
RangeQuery = Callable[[str, int, int, int], list[Points]]
MAX_LINES = 8  # per plot: the highest ones; a legend of 40 replicas is unreadable
_POINTS = 240  # per series across the window: finer than a plot's pixels need is waste
_MIN_PAD_MS = 5 * 60_000
_MAX_PAD_MS = 60 * 60_000
_VLLM_SCOPE = ("job", "instance", "model_name")
#: What the context plots read beyond the catalog's health families, so the embedded store keeps it
#: whatever rules are loaded (:func:`agent.app.rulefiles.keep_list`).
CONTEXT_FAMILIES = frozenset({"vllm:time_to_first_token_seconds_bucket", "lmdeploy:time_to_first_token_seconds_bucket",
                              "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting",
                              "vllm:num_requests_running", "vllm:generation_tokens_total", "DCGM_FI_DEV_FB_USED",
                              "DCGM_FI_DEV_FB_FREE", "lmdeploy:num_requests_waiting", "lmdeploy:num_requests_running",
                              "lmdeploy:generation_tokens_total", "lmdeploy:kv_cache_usage_perc"})
_GPU_SCOPE = ("gpu", "Hostname", "hostname", "UUID")


@dataclass(frozen=True)
class Window:
    """The plotted time range and the query step; ``start_ms``..``end_ms`` hold the incident with margins."""

    start_ms: int
    end_ms: int
    step_ms: int


def window(f: Facts, *, min_step_ms: int = 1000) -> Window:
    """The incident (pending to resolved, or now) with a margin of half its length each side, 5 min to
    1 h, never past now; the step gives about 240 points, at least ``min_step_ms`` (the scrape interval)."""
    length = max(f.end_ms - f.start_ms, 0)
    pad = min(max(length // 2, _MIN_PAD_MS), _MAX_PAD_MS)
    start, end = f.start_ms - pad, min(f.end_ms + pad, f.now_ms)
    step = max(min_step_ms, math.ceil((end - start) / _POINTS / 1000) * 1000)
    return Window(start, max(end, start + step), step)


@dataclass(frozen=True)
class Query:
    """One range query of a plot; ``legend`` names the labels that tell its series apart."""

    expr: str
    name: str  # the legend's prefix ("waiting", "value"); "" for none
    legend: tuple[str, ...] = ("instance",)
    role: str = "context"  # value | threshold | context


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    ylabel: str
    queries: tuple[Query, ...]
    threshold: float | None = None
    threshold_label: str = ""
    percent: bool = False  # a 0-100 axis
    caption: str = ""
    #: Asked instead when ``queries`` return no series at all (a guess at the scope that did not hold).
    fallback: tuple[Query, ...] = ()


@dataclass
class Line:
    label: str
    ts: list[int]
    values: list[float]
    role: str = "context"


@dataclass
class PlotData:
    spec: PlotSpec
    lines: list[Line] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(line.ts for line in self.lines)


def _unit(expr: str) -> str:
    """The firing series' axis label, from the metric names it reads (a rule has no unit field)."""
    e = expr.lower()
    if "ratio" in e or "perc" in e or "usage" in e:
        return "ratio (1 = 100 %)"
    if "seconds" in e:
        return "seconds"
    if "tokens" in e:
        return "tokens/s"
    if "requests" in e:
        return "requests"
    if "bytes" in e:
        return "bytes"
    return "value"


def _selector(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    return scoped("x", labels, names)[1:]  # the matchers of the scoped dummy selector: {job="..."} or ""


def _both(template: str, labels: Mapping[str, str]) -> str:
    """The query for vLLM's family names or LMDeploy's (``{p}``: the prefix, ``{s}``: the scope)."""
    s = _selector(labels, _VLLM_SCOPE)
    return " or ".join(f"({template.format(p=p, s=s)})" for p in ("vllm:", "lmdeploy:"))


def plot_specs(f: Facts, w: Window) -> list[PlotSpec]:
    """The report's plots for ``f`` (the firing series first)."""
    rule, labels = f.rule, f.labels
    rate_w = f"{max(60, 4 * w.step_ms // 1000)}s"
    specs: list[PlotSpec] = []
    if rule is not None:
        queries = [Query(scoped(rule.value_expr, labels), "value", _legend(labels), "value")]
        if rule.threshold_expr is not None:
            queries.append(Query(scoped(rule.threshold_expr, labels), "threshold", _legend(labels), "threshold"))
        caption = f"{rule.value_expr} {rule.condition}".strip()
        specs.append(PlotSpec("firing", f"{rule.name}: the firing series", _unit(rule.value_expr), tuple(queries),
                              rule.threshold, f"threshold {rule.op} {rule.threshold:g}"
                              if rule.threshold is not None else "", caption=caption))
    gpu_query = ("100 * DCGM_FI_DEV_FB_USED{s} / (DCGM_FI_DEV_FB_USED{s} + DCGM_FI_DEV_FB_FREE{s})", "GPU",
                 ("Hostname", "gpu"))
    gpu = _selector(labels, _GPU_SCOPE)
    host = labels.get("instance", "").rpartition(":")[0].strip("[]") if ":" in labels.get("instance", "") else ""
    fleet_wide = (Query(gpu_query[0].format(s=""), *gpu_query[1:]),)
    gpu_queries: tuple[Query, ...]
    gpu_fallback: tuple[Query, ...]
    if gpu:  # the alert names its GPU or node
        gpu_queries, gpu_fallback = (Query(gpu_query[0].format(s=gpu), *gpu_query[1:]),), ()
    elif host:  # a server's alert: the GPUs of its node (dcgm-exporter's Hostname), else every GPU
        node = _selector({"Hostname": host}, ("Hostname",))
        gpu_queries, gpu_fallback = (Query(gpu_query[0].format(s=node), *gpu_query[1:]),), fleet_wide
    else:
        gpu_queries, gpu_fallback = fleet_wide, ()
    specs += [
        PlotSpec("kv", "KV-cache usage", "KV cache used (%)",
                 (Query("100 * " + _both("max by (instance) ({p}kv_cache_usage_perc{s} or "
                                         "{p}gpu_cache_usage_perc{s})", labels), ""),), percent=True,
                 caption="vllm:kv_cache_usage_perc (V1) or vllm:gpu_cache_usage_perc (V0), per instance"),
        PlotSpec("queue", "Requests waiting vs running", "requests",
                 (Query(_both("sum by (instance) ({p}num_requests_waiting{s})", labels), "waiting"),
                  Query(_both("sum by (instance) ({p}num_requests_running{s})", labels), "running")),
                 caption="num_requests_waiting and num_requests_running, per instance"),
        PlotSpec("ttft", "Time to first token, p99", "seconds",
                 (Query(_both(f"histogram_quantile(0.99, sum by (instance, le) "
                              f"(rate({{p}}time_to_first_token_seconds_bucket{{s}}[{rate_w}])))", labels), "p99"),),
                 caption=f"histogram_quantile(0.99, rate(time_to_first_token_seconds_bucket[{rate_w}]))"),
        PlotSpec("throughput", "Generation throughput", "tokens/s",
                 (Query(_both(f"sum by (instance) (rate({{p}}generation_tokens_total{{s}}[{rate_w}]))", labels),
                        ""),),
                 caption=f"rate(generation_tokens_total[{rate_w}]), per instance"),
        PlotSpec("gpu", "GPU memory used, per GPU", "framebuffer used (%)", gpu_queries, threshold=95.0,
                 threshold_label="95 % (GPUMemoryNearFull)", percent=True,
                 caption="DCGM_FI_DEV_FB_USED / (FB_USED + FB_FREE), per GPU", fallback=gpu_fallback),
    ]
    return specs


def _legend(labels: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(k for k in ("instance", "model_name", "gpu") if k in labels) or ("instance",)


def _label(q: Query, labels: Mapping[str, str]) -> str:
    parts = [labels[k] for k in q.legend if labels.get(k)]
    text = " ".join(([q.name] if q.name else []) + parts) or q.name or "series"
    return text if len(text) <= 40 else text[:39] + "…"


def fetch(spec: PlotSpec, w: Window, query: RangeQuery, incident_labels: Mapping[str, str]) -> PlotData:
    """Run ``spec``'s queries over ``w`` (its fallback if they find no series). Series whose labels disagree
    with the incident's (a label both carry with different values) are dropped; at most :data:`MAX_LINES`
    lines, the highest kept."""
    data = _run(spec, spec.queries, w, query, incident_labels)
    if spec.fallback and not data.lines and not data.errors:
        data = _run(spec, spec.fallback, w, query, incident_labels)
    return data


def _run(spec: PlotSpec, queries: tuple[Query, ...], w: Window, query: RangeQuery,
         incident_labels: Mapping[str, str]) -> PlotData:
    data = PlotData(spec)
    for q in queries:
        try:
            result = query(q.expr, w.start_ms, w.end_ms, w.step_ms)
        except AgentError as exc:  # SourceError, PromQLError: this plot says why, the report goes on
            data.errors.append(str(exc))
            continue
        lines = []
        for labels, ts, vs in result:
            if q.role != "context" and any(incident_labels.get(k, v) != v for k, v in labels.items()
                                           if k != "__name__"):
                continue
            lines.append(Line(_label(q, labels), ts, vs, q.role))
        if len(lines) == 1 and q.name and q.role != "context":  # one value (threshold) series: its name says it
            lines[0].label = q.name
        lines.sort(key=lambda line: -max((v for v in line.values if math.isfinite(v)), default=-math.inf))
        data.lines += lines[:MAX_LINES]
    return data


def local_query(engine: Engine) -> RangeQuery:
    """Range queries on the agent's own engine (embedded mode; call on the event loop)."""
    def run(expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Points]:
        return [(dict(s.labels), list(s.ts), list(s.values)) for s in engine.range(expr, start_ms, end_ms, step_ms)]
    return run


def remote_query(history: RemoteHistory, *, deadline: float | None = None) -> RangeQuery:
    """Range queries on the source (Prometheus mode; blocking, call in a thread). ``deadline`` (a
    :func:`time.monotonic` time) bounds all of them together: a query it leaves no time for fails at once,
    and its plot says so."""
    def run(expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Points]:
        return history.query_range(expr, start_ms, end_ms, step_s=step_ms / 1000, deadline=deadline)
    return run
