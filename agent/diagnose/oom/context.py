"""What the daemon knows about a failed vLLM server besides its logs: :class:`OomContext`.

The OOM verdict (:mod:`agent.diagnose.oom.verdict`) reads evidence lines; many of its fixes need
numbers the lines may not carry: the engine's cache config (``vllm:cache_config_info``), the
GPU's size and memory history (NVML or dcgm-exporter), the container's memory limit.
:func:`context_from_store` gathers them for one vLLM instance from the series store, and
:func:`effective_context` lays what the log says over them: where both say something the log
wins, because it describes the run that failed. Kept apart from the verdict because this is
the one part of OOM diagnosis that reads the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agent.diagnose.oom.evidence import EngineConfig
from agent.series import METRIC_NAME, Labels, labels_get
from agent.store import SeriesMatcher, Store

__all__ = ["HISTORY_MS", "OomContext", "context_from_store", "effective_context"]

_GIB = 2**30
HISTORY_MS = 15 * 60 * 1000  # how far back context_from_store reads the GPU's memory


@dataclass(frozen=True)
class OomContext:
    """What the daemon knows besides the logs. ``gpu_memory_history`` holds
    ``(t_ms, used_bytes, total_bytes)`` samples of the serving GPU, oldest first;
    ``swap_space_bytes`` is pinned host swap (V0; V1 reports the flag but pins nothing)."""

    model: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    swap_space_bytes: int | None = None
    gpu_name: str | None = None  # e.g. dcgm-exporter's modelName "NVIDIA H100 80GB HBM3", or --gpu
    gpu_memory_history: list[tuple[int, int, int]] = field(default_factory=list)
    container_memory_limit_bytes: int | None = None

    @property
    def gpu_total_bytes(self) -> int | None:
        return self.gpu_memory_history[-1][2] if self.gpu_memory_history else None


def _f(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "None") else None
    except ValueError:
        return None


def context_from_store(store: Store, instance: str, now_ms: int, *, gpu: str | None = None) -> OomContext:
    """The context of one vLLM ``instance``: its ``vllm:cache_config_info`` labels, its served
    model (any vLLM series' ``model_name``) and ``DCGM_FI_DEV_FB_USED``/``FB_FREE`` (MiB) of a
    GPU on its host over the last 15 minutes. GPUs belong to the instance's host by their
    ``Hostname``/``hostname`` label (or their exporter's ``instance`` host); a store that holds
    one host's GPUs only (the agent's own NVML poller) matches as a whole. Of several GPUs the
    one closest to full is taken, unless ``gpu`` (index or UUID) names one."""
    start, at = now_ms - HISTORY_MS, SeriesMatcher("instance", "=", instance)
    info = store.select([SeriesMatcher(METRIC_NAME, "=", "vllm:cache_config_info"), at], start, now_ms)
    labels = dict(max(info, key=lambda v: v.ts[-1]).labels) if info else {}
    swap = _f(labels.get("swap_space_bytes"))  # V0 only: V1 has no CPU swap blocks
    model = _served_model(store, at)
    host = instance.rsplit(":", 1)[0].strip("[]")
    used = store.select([SeriesMatcher(METRIC_NAME, "=", "DCGM_FI_DEV_FB_USED")], start, now_ms)
    free_series = store.select([SeriesMatcher(METRIC_NAME, "=", "DCGM_FI_DEV_FB_FREE")], start, now_ms)
    free = {_rest(v.labels): v for v in free_series}
    cands = [v for v in used if _host(v.labels) == host] or (used if len({_host(v.labels) for v in used}) == 1 else [])
    best: tuple[float, list[tuple[int, int, int]], Labels] = (-1.0, [], ())
    for v in cands:
        if gpu is not None and gpu not in (labels_get(v.labels, "gpu"), labels_get(v.labels, "UUID")):
            continue
        f = free.get(_rest(v.labels))
        fmap = dict(zip(f.ts, f.vals, strict=True)) if f is not None else {}
        hist = [(t, round(u * 2**20), round((u + fmap[t]) * 2**20)) for t, u in zip(v.ts, v.vals, strict=True)
                if t in fmap and u + fmap[t] > 0]  # NaN (staleness) fails the comparison
        peak = max((u / total for _, u, total in hist), default=-1.0)
        if hist and peak > best[0]:
            best = (peak, hist, v.labels)
    return OomContext(model=model, gpu_memory_utilization=_f(labels.get("gpu_memory_utilization")),
                      swap_space_bytes=int(swap) if swap is not None else None,
                      kv_cache_dtype=labels.get("cache_dtype"), gpu_name=labels_get(best[2], "modelName") or None,
                      gpu_memory_history=best[1])


#: vLLM gauges every version exports with ``model_name``: looked up by name (one series per instance).
_MODEL_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _served_model(store: Store, at: SeriesMatcher) -> str | None:
    """Any vLLM series' ``model_name``: the usual gauges first, by name; the whole ``vllm:`` namespace
    only if they are missing (that scan reads every vLLM series of every instance: at 1,000 targets,
    run for each target that went down in a cycle, it was 15 % of the agent's CPU)."""
    for name in (*_MODEL_GAUGES, None):
        by = SeriesMatcher(METRIC_NAME, "=", name) if name else SeriesMatcher(METRIC_NAME, "=~", "vllm:.*")
        found = next((m for s in store.iter_series([by, at]) if (m := labels_get(s.labels, "model_name"))), None)
        if found:
            return found
    return None


def _rest(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] != METRIC_NAME)


def _host(labels: Labels) -> str:
    return (labels_get(labels, "Hostname") or labels_get(labels, "hostname")
            or labels_get(labels, "instance").rsplit(":", 1)[0].strip("[]"))


def effective_context(e: EngineConfig, c: OomContext) -> OomContext:
    """The context with what the log says laid over it."""
    log_says: dict[str, Any] = {
        "model": e.model, "max_model_len": e.max_model_len, "max_num_seqs": e.max_num_seqs,
        "gpu_memory_utilization": e.gpu_memory_utilization, "tensor_parallel_size": e.tensor_parallel_size,
        "quantization": e.quantization, "kv_cache_dtype": e.kv_cache_dtype,
        "swap_space_bytes": round(e.swap_space_gib * _GIB) if e.swap_space_gib is not None else None}
    return replace(c, **{k: v for k, v in log_says.items() if v is not None})
