"""What vLLM and LMDeploy export on ``/metrics``, version by version.

Rules, dashboards, the scraper's keep-list and the simulator all need the same facts:
which ``vllm:``/``lmdeploy:`` families exist in which release and engine (V0 or V1),
their type, what replaced a renamed or removed one, and the default histogram buckets.
They come from ``fixtures/vllm/CATALOG.md`` (vLLM wheels 0.4.0-0.33.0 read one by one,
LMDeploy tags v0.9.2-v0.16.0); ``tests/collect/test_catalog.py`` checks this table against
the machine-readable ``metrics_matrix.tsv`` copied beside the tests.

Names are wire names as a text-format scrape shows them on ``# TYPE`` lines: counters
carry ``_total`` (vLLM 0.9.0 renamed the code objects, not the wire names), histograms
are the base name. :func:`family` also accepts sample names (``_bucket``, ``_created``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

__all__ = [
    "DCGM_FIELDS", "NEWEST_LMDEPLOY", "NEWEST_VLLM", "SRE_AGENT_GPU_FAMILIES", "Family", "Generation", "Span",
    "Track", "Version", "cache_config_label_keys", "default_buckets", "default_keep_families",
    "detect_generation", "families", "family", "parse_version", "replacement",
]  # fmt: skip

Version = tuple[int, int, int]

NEWEST_VLLM: Version = (0, 33, 0)  # newest vLLM on PyPI when the catalog was researched
NEWEST_LMDEPLOY: Version = (0, 16, 0)  # newest LMDeploy tag read
_SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


class Track(StrEnum):
    """Which code path defines a family: vLLM's V0 or V1 engine, LMDeploy, or the
    production-stack router (which re-exports ``vllm:`` names with a ``server`` label)."""

    V0 = "v0"
    V1 = "v1"
    LMDEPLOY = "lmdeploy"
    ROUTER = "router"


def parse_version(text: str) -> Version:
    """``"0.8.3"`` or ``"v0.14.0"`` -> ``(0, 8, 3)``; extra parts (``.post1``) are ignored."""
    parts = text.strip().lstrip("v").split(".")
    nums = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:3]]
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def _fmt(v: Version) -> str:
    return ".".join(str(p) for p in v)


@dataclass(frozen=True, slots=True)
class Span:
    """One track's life of a family: the first and last sampled release defining it."""

    track: Track
    first: Version
    last: Version


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as it appears on the wire."""

    name: str
    type: str  # "gauge" | "counter" | "histogram" (Info is exposed as a gauge)
    spans: tuple[Span, ...]
    replacement: str | None = None  # a family name, or a PromQL expression for removed gauges
    deprecated: Version | None = None  # release whose HELP text first says DEPRECATED
    conditional: bool = False  # registered only with a feature on (LoRA, spec decode, ...)

    @property
    def generation(self) -> str:
        """``"v0"``, ``"v1"``, ``"both"`` (vLLM), ``"lmdeploy"`` or ``"router"``."""
        tracks = {s.track for s in self.spans}
        return "both" if tracks == {Track.V0, Track.V1} else next(iter(tracks)).value

    @property
    def first(self) -> Version:
        return min(s.first for s in self.spans)

    @property
    def last(self) -> Version:
        return max(s.last for s in self.spans)

    def span(self, track: Track) -> Span | None:
        return next((s for s in self.spans if s.track == track), None)


# Rows (";" also separates rows): names | type g/c/h (gauge/counter/histogram) | spans | flags. A span
# is "track:first-last"; an open end means "still in the newest release read". Flags: "c" registered
# only with a feature on, "d=X.Y.Z" HELP says DEPRECATED since, "r=..." what replaces it (rest of row).
# LMDeploy rows name their first family with its prefix; router families have no versions (0.0.0).
_V, _L = "vllm:", "lmdeploy:"
_TABLE = """
cache_config_info | g | v0:0.4.0-0.11.0 v1:0.8.0-
num_requests_running num_requests_waiting | g | v0:0.4.0-0.11.0 v1:0.7.1-
num_requests_swapped cpu_cache_usage_perc | g | v0:0.4.0-0.9.0 | d=0.8.0
gpu_cache_usage_perc | g | v0:0.4.0-0.11.0 v1:0.7.1-0.11.2 | d=0.9.2 r=vllm:kv_cache_usage_perc
prompt_tokens_total generation_tokens_total | c | v0:0.4.0-0.11.0 v1:0.7.1-
time_to_first_token_seconds | h | v0:0.4.0-0.11.0 v1:0.7.1-
time_per_output_token_seconds | h | v0:0.4.0-0.11.0 v1:0.7.1-0.14.0 \
| d=0.10.2 r=vllm:inter_token_latency_seconds
e2e_request_latency_seconds | h | v0:0.4.0-0.11.0 v1:0.7.3-
avg_prompt_throughput_toks_per_s | g | v0:0.4.0-0.6.6 | r=rate(vllm:prompt_tokens_total[1m])
avg_generation_throughput_toks_per_s | g | v0:0.4.0-0.6.6 | r=rate(vllm:generation_tokens_total[1m])
request_prompt_tokens request_generation_tokens | h | v0:0.4.2-0.11.0 v1:0.7.1-
request_params_best_of | h | v0:0.4.2-0.6.2 ; request_params_n | h | v0:0.4.2-0.11.0 v1:0.8.0-
request_success_total | c | v0:0.4.2-0.11.0 v1:0.7.2- ; num_preemptions_total | c | v0:0.4.3-0.11.0 v1:0.8.0-
spec_decode_draft_acceptance_rate | g | v0:0.5.3-0.9.2 \
| r=rate(vllm:spec_decode_num_accepted_tokens_total[5m]) / rate(vllm:spec_decode_num_draft_tokens_total[5m])
spec_decode_efficiency | g | v0:0.5.3-0.9.2 ; spec_decode_num_emitted_tokens_total | c | v0:0.5.3-0.9.2
spec_decode_num_accepted_tokens_total spec_decode_num_draft_tokens_total | c | v0:0.5.3-0.9.2 v1:0.8.3- | c
cpu_prefix_cache_hit_rate | g | v0:0.5.5-0.9.0 | d=0.8.0
gpu_prefix_cache_hit_rate | g | v0:0.5.5-0.9.0 | d=0.8.0 r=rate(vllm:prefix_cache_hits_total[5m]) \
/ rate(vllm:prefix_cache_queries_total[5m])
lora_requests_info | g | v0:0.6.4-0.11.0 v1:0.8.0- | c ; tokens_total | c | v0:0.6.4-0.7.3
iteration_tokens_total request_queue_time_seconds request_inference_time_seconds \
request_prefill_time_seconds request_decode_time_seconds | h | v0:0.6.4-0.11.0 v1:0.7.3-
time_in_queue_requests | h | v0:0.6.4-0.9.0 | d=0.8.0 r=vllm:request_queue_time_seconds
model_forward_time_milliseconds model_execute_time_milliseconds | h | v0:0.6.4-0.9.0 \
| d=0.8.0 r=vllm:request_inference_time_seconds
request_max_num_generation_tokens request_params_max_tokens | h | v0:0.6.4-0.11.0 v1:0.8.0-
inter_token_latency_seconds | h | v0:0.10.2-0.11.0 v1:0.10.2-
gpu_prefix_cache_queries_total | c | v1:0.7.3-0.11.2 | d=0.9.2 r=vllm:prefix_cache_queries_total
gpu_prefix_cache_hits_total | c | v1:0.7.3-0.11.2 | d=0.9.2 r=vllm:prefix_cache_hits_total
spec_decode_num_drafts_total spec_decode_num_accepted_tokens_per_pos_total | c | v1:0.8.5- | c
kv_cache_usage_perc | g | v1:0.9.2- ; prefix_cache_queries_total prefix_cache_hits_total | c | v1:0.9.2-
request_time_per_output_token_seconds | h | v1:0.11.0- ; engine_sleep_state | g | v1:0.11.1-
external_prefix_cache_queries_total external_prefix_cache_hits_total mm_cache_queries_total \
mm_cache_hits_total | c | v1:0.11.1-
corrupted_requests_total nixl_num_failed_transfers_total nixl_num_failed_notifications_total \
| c | v1:0.11.1- | c
nixl_xfer_time_seconds nixl_post_time_seconds nixl_bytes_transferred nixl_num_descriptors | h | v1:0.11.1- | c
kv_block_lifetime_seconds kv_block_idle_before_evict_seconds kv_block_reuse_gap_seconds | h | v1:0.12.0- | c
request_prefill_kv_computed_tokens | h | v1:0.13.0- ; nixl_num_kv_expired_reqs_total | c | v1:0.15.0- | c
prompt_tokens_by_source_total prompt_tokens_cached_total | c | v1:0.16.0-
prompt_tokens_recomputed_total | c | v1:0.16.0-0.19.0
estimated_flops_per_gpu_total estimated_read_bytes_per_gpu_total estimated_write_bytes_per_gpu_total \
| c | v1:0.17.0-
websocket_connections_active | g | v1:0.18.0- | c ; websocket_connections_total | c | v1:0.18.0- | c
websocket_connection_duration_seconds | h | v1:0.18.0- | c ; num_requests_waiting_by_reason | g | v1:0.20.0-
diffusion_num_denoising_steps_total diffusion_num_canvas_positions_total \
diffusion_num_committed_tokens_total | c | v1:0.24.0- | c
tool_call_parser_invocations_total | c | v1:0.24.0- ; request_num_preemptions | h | v1:0.30.0-
num_requests_kv_fetch_by_stage | g | v1:0.32.0- | c
watermark_requests_total nixl_num_notifications_after_expiry_total | c | v1:0.32.0- | c
prompt_tokens_cached_by_source_total admission_rejections_total | c | v1:0.32.0-
sleep_mode_operation_duration_seconds | h | v1:0.32.0- ; sleep_mode_operations_in_flight | g | v1:0.32.0-
rl_weight_update_operation_duration_seconds | h | v1:0.32.0- | c
rl_weight_update_operations_in_flight | g | v1:0.32.0- | c
current_qps avg_decoding_length num_prefill_requests num_decoding_requests avg_latency avg_itl \
healthy_pods_total | g | router:0.0.0-0.0.0 ; request_latency_seconds | h | router:0.0.0-0.0.0
num_incoming_requests_total input_tokens_total output_tokens_total request_errors_total \
| c | router:0.0.0-0.0.0
lmdeploy:backend_config_info num_requests_running num_requests_waiting gpu_cache_usage_perc \
| g | lmdeploy:0.9.2-
lmdeploy:num_api_requests_routed num_api_requests_waiting | g | lmdeploy:0.12.1-
lmdeploy:num_requests_finished | g | lmdeploy:0.9.2-0.12.0 | r=lmdeploy:num_requests_succeeded
lmdeploy:num_requests_unfinished | g | lmdeploy:0.9.2-0.12.0
lmdeploy:num_requests_completed | g | lmdeploy:0.12.1-0.12.2 | r=lmdeploy:num_requests_succeeded
lmdeploy:num_requests_succeeded num_requests_failed | g | lmdeploy:0.12.3-
lmdeploy:prefix_cache_hit_rate | g | lmdeploy:0.14.0- ; lmdeploy:cached_tokens_total | c | lmdeploy:0.14.0-
lmdeploy:prompt_tokens_total generation_tokens_total request_success_total | c | lmdeploy:0.9.2-
lmdeploy:request_prompt_tokens request_generation_tokens iteration_tokens_total time_to_first_token_seconds \
time_per_output_token_seconds e2e_request_latency_seconds request_queue_time_seconds \
request_inference_time_seconds request_prefill_time_seconds request_decode_time_seconds | h | lmdeploy:0.9.2-
lmdeploy:request_cached_tokens request_cache_hit_ratio | h | lmdeploy:0.14.0-
lmdeploy:iter_token_latency | h | lmdeploy:0.10.0-
lmdeploy:spec_decode_num_drafts_total spec_decode_num_draft_tokens_total \
spec_decode_num_accepted_tokens_total spec_decode_num_accepted_tokens_per_pos_total | c | lmdeploy:0.14.0- | c
lmdeploy:spec_decode_mean_accept_rate spec_decode_mean_accept_length spec_decode_per_position_accept_rate \
| g | lmdeploy:0.14.0- | c
"""
_TYPES = {"g": "gauge", "c": "counter", "h": "histogram"}


def _parse_row(row: str) -> list[Family]:
    cells = [c.strip() for c in row.split("|")]
    names, mtype, spans_text = cells[0].split(), _TYPES[cells[1]], cells[2]
    head, _, repl = (cells[3] if len(cells) > 3 else "").partition("r=")
    spans = []
    for text in spans_text.split():
        track, _, life = text.partition(":")
        first, _, last = life.partition("-")
        newest = NEWEST_LMDEPLOY if track == Track.LMDEPLOY else NEWEST_VLLM
        spans.append(Span(Track(track), parse_version(first), parse_version(last) if last else newest))
    prefix = _L if names[0].startswith(_L) else _V
    dep = next((parse_version(f[2:]) for f in head.split() if f.startswith("d=")), None)
    cond = "c" in head.split()
    return [Family(prefix + n.removeprefix(prefix), mtype, tuple(spans), repl.strip() or None, dep, cond)
            for n in names]  # fmt: skip


@cache
def _index() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for row in (r for line in _TABLE.strip().splitlines() for r in line.split(";")):
        for fam in _parse_row(row):
            out[fam.name] = fam
    return out


def families() -> tuple[Family, ...]:
    """Every family the catalog knows, vLLM (engine and router) then LMDeploy."""
    return tuple(_index().values())


def family(name: str) -> Family | None:
    """Look a family up by wire name, sample name (``..._bucket``) or vLLM code name
    (``vllm:prompt_tokens``, which is ``vllm:prompt_tokens_total`` on the wire)."""
    index = _index()
    if name in index:
        return index[name]
    for suffix in _SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in index:
                return index[base]
            if suffix == "_created" and base + "_total" in index:
                return index[base + "_total"]
    return index.get(name + "_total")


def replacement(name: str) -> str | None:
    """What to query instead of a renamed or removed family (a name or a PromQL expression)."""
    fam = family(name)
    return fam.replacement if fam else None


# -- histogram buckets (CATALOG §1.6) -------------------------------------------------------
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TTFT_084 = (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_TPOT_084 = (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LAT_V0_EARLY = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_LAT = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_LAT_084 = (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITER = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
_ITER_064 = (*_ITER[:11], 8096.0)  # 0.6.4's fixed list, typo included
#: Before 0.8.5 the buckets were the CUDA-graph capture sizes; the real captures show 1, 2, 4, 8..512.
_ITER_CUDAGRAPH = (1.0, 2.0, 4.0, *(float(i) for i in range(8, 513, 8)))
_KV_BLOCK = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
             1200, 1800)  # fmt: skip
_FORWARD_MS = (1, 2, 3, 5, 8, 10, 20, 30, 50, 80, 100, 200, 300, 500, 800, 1000, 2000, 3000)
_TOKEN_COUNT = _words("""request_prompt_tokens request_generation_tokens request_max_num_generation_tokens
    request_params_max_tokens request_prefill_kv_computed_tokens request_cached_tokens""")
_LATENCY = _words("""e2e_request_latency_seconds request_queue_time_seconds request_inference_time_seconds
    request_prefill_time_seconds request_decode_time_seconds time_in_queue_requests""")


def _one_two_five(limit: int) -> tuple[float, ...]:
    return tuple(float(m * 10**e) for e in range(12) for m in (1, 2, 5) if m * 10**e <= limit)


def default_buckets(
    name: str, version: Version | None = None, *, track: Track = Track.V1, max_model_len: int = 32768
) -> tuple[float, ...] | None:
    """The default upper bounds (without ``+Inf``) of a histogram family at a release.

    ``version`` defaults to the newest release read; ``max_model_len`` caps the 1-2-5
    token-count buckets (LMDeploy: ``session_len``). None for non-histograms."""
    fam = family(name)
    if fam is None or fam.type != "histogram":
        return None
    short = fam.name.split(":", 1)[1]
    if fam.name.startswith(_L):
        if short in ("time_per_output_token_seconds", "iter_token_latency"):
            return (0.005, *_TPOT, *_TPOT_084)
        if short == "request_cache_hit_ratio":
            return tuple(i / 10 for i in range(11))
        version, track = NEWEST_VLLM, Track.V1  # otherwise LMDeploy copied vLLM >= 0.8.4
    v = version or NEWEST_VLLM
    new = v >= (0, 8, 4)
    if short == "time_to_first_token_seconds":
        return _TTFT + _TTFT_084 if new else _TTFT
    if short in ("time_per_output_token_seconds", "inter_token_latency_seconds",
                 "request_time_per_output_token_seconds"):  # fmt: skip
        return _TPOT + _TPOT_084 if new else _TPOT
    if short in _LATENCY:
        if track == Track.V0 and v < (0, 6, 4):
            return _LAT_V0_EARLY
        return _LAT + _LAT_084 if new else _LAT
    if short == "iteration_tokens_total":
        return _ITER_064 if v < (0, 6, 5) else _ITER_CUDAGRAPH if v < (0, 8, 5) else _ITER
    if short in _TOKEN_COUNT:
        return _one_two_five(max_model_len)
    if short in ("request_params_n", "request_params_best_of"):
        return (1.0, 2.0, 5.0, 10.0, 20.0)
    fixed: tuple[float, ...] | None = (1, 2, 3, 4, 5, 10, 20) if short == "request_num_preemptions" else None
    fixed = _FORWARD_MS if short.endswith("_milliseconds") else _KV_BLOCK if short[:3] == "kv_" else fixed
    return None if fixed is None else tuple(float(b) for b in fixed)


# -- vllm:cache_config_info -------------------------------------------------------------------
#: V0 0.7.x label keys, as in the AIBrix capture (``fixtures/vllm/v0_0.7_aibrix_qwen15b_metrics.txt``).
_CACHE_CONFIG_V0 = _words("""block_size cache_dtype calculate_kv_scales cpu_offload_gb enable_prefix_caching
    gpu_memory_utilization is_attention_free num_cpu_blocks num_gpu_blocks num_gpu_blocks_override
    sliding_window swap_space_bytes""")
#: V1: one label per field of vLLM 0.10/0.11's ``CacheConfig`` dataclass plus ``engine``; the set
#: changes between releases (CATALOG §1.2), so consumers must read labels by name.
_CACHE_CONFIG_V1 = _words("""block_size cache_dtype calculate_kv_scales cpu_kvcache_space_bytes cpu_offload_gb
    enable_prefix_caching engine gpu_memory_utilization is_attention_free kv_sharing_fast_prefill
    mamba_cache_dtype mamba_ssm_cache_dtype num_cpu_blocks num_gpu_blocks num_gpu_blocks_override
    prefix_caching_hash_algo sliding_window swap_space""")


def cache_config_label_keys(track: Track) -> tuple[str, ...]:
    """The label keys of ``vllm:cache_config_info`` for one engine (sorted)."""
    return _CACHE_CONFIG_V0 if track == Track.V0 else _CACHE_CONFIG_V1


# -- what to store by default -----------------------------------------------------------------
_KEEP_VLLM = _words("""num_requests_running num_requests_waiting kv_cache_usage_perc gpu_cache_usage_perc
    num_preemptions_total prompt_tokens_total generation_tokens_total request_success_total
    time_to_first_token_seconds inter_token_latency_seconds time_per_output_token_seconds
    request_time_per_output_token_seconds e2e_request_latency_seconds request_queue_time_seconds
    prefix_cache_queries_total prefix_cache_hits_total gpu_prefix_cache_queries_total
    gpu_prefix_cache_hits_total gpu_prefix_cache_hit_rate cache_config_info""")
_KEEP_LMDEPLOY = _words("""num_requests_running num_requests_waiting gpu_cache_usage_perc
    prefix_cache_hit_rate cached_tokens_total prompt_tokens_total generation_tokens_total
    request_success_total time_to_first_token_seconds time_per_output_token_seconds iter_token_latency
    e2e_request_latency_seconds request_queue_time_seconds""")
#: dcgm-exporter field names the NVML poller (``agent/collect/nvml.py``) exports (DESIGN decision 6).
DCGM_FIELDS = _words("""FB_USED FB_FREE FB_TOTAL FB_RESERVED GPU_UTIL MEM_COPY_UTIL GPU_TEMP POWER_USAGE
    POWER_MGMT_LIMIT SM_CLOCK MEM_CLOCK CLOCK_THROTTLE_REASONS CLOCKS_EVENT_REASONS XID_ERRORS
    ECC_SBE_VOL_TOTAL ECC_DBE_VOL_TOTAL ECC_SBE_AGG_TOTAL ECC_DBE_AGG_TOTAL CORRECTABLE_REMAPPED_ROWS
    UNCORRECTABLE_REMAPPED_ROWS ROW_REMAP_FAILURE ROW_REMAP_PENDING NVLINK_BANDWIDTH_TOTAL
    PCIE_TX_THROUGHPUT PCIE_RX_THROUGHPUT""")
#: The NVML poller's own families (``agent/collect/nvml.py``): readings dcgm-exporter has no name for,
#: and the poller's health.
SRE_AGENT_GPU_FAMILIES = _words("""sre_agent_gpu_lost sre_agent_gpu_nvlink_up sre_agent_gpu_processes
    sre_agent_gpu_process_memory_bytes sre_agent_gpu_xid_errors_total sre_agent_nvml_up
    sre_agent_nvml_errors_total sre_agent_nvml_poll_duration_seconds""")


def default_keep_families() -> frozenset[str]:
    """Families the store keeps when no rule names them: the vLLM (both generations) and
    LMDeploy health families, the scrape-health series and the GPU families. The store
    itself matches ``_bucket``/``_sum``/``_count``/``_total``/``_created`` suffixes."""
    names = {_V + n for n in _KEEP_VLLM} | {_L + n for n in _KEEP_LMDEPLOY}
    names |= {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
    names |= {"DCGM_FI_DEV_" + f for f in DCGM_FIELDS} | set(SRE_AGENT_GPU_FAMILIES)
    return frozenset(names)


# -- which generation is this target? (CATALOG §7) -------------------------------------------
@dataclass(frozen=True, slots=True)
class Generation:
    """Best guess at what a target runs, from the names (and optionally labels, HELP texts
    and bucket bounds) of one scrape. ``evidence`` says why, for logs and ``sre-agent check``."""

    vendor: str  # "vllm" | "lmdeploy" | "unknown"
    track: Track | None
    min_version: Version | None
    max_version: Version | None
    evidence: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.min_version is None or self.max_version is None:
            return self.vendor
        eng = f" {self.track.value.upper()}" if self.track in (Track.V0, Track.V1) else ""
        return f"{self.vendor}{eng} {_fmt(self.min_version)}..{_fmt(self.max_version)}"


def detect_generation(
    names: Iterable[str],
    *,
    label_names: Iterable[str] = (),
    help_texts: Mapping[str, str] | None = None,
    bucket_bounds: Mapping[str, Iterable[float]] | None = None,
) -> Generation:
    """Guess vendor, engine and release range from one scrape: sample or family ``names``,
    the label keys seen on ``vllm:`` series, HELP texts and histogram ``le`` bounds by family.

    Every present family narrows the range to its own life; the cheat-sheet's label, HELP
    and bucket clues narrow it further. A clue that would empty the range is ignored."""
    raw = set(names)
    fams = {f.name: f for f in map(family, raw) if f is not None and f.generation != Track.ROUTER}
    labels = set(label_names)
    helps = {(f.name if (f := family(k)) else k): v for k, v in (help_texts or {}).items()}
    bounds = {(f.name if (f := family(k)) else k): v for k, v in (bucket_bounds or {}).items()}
    if not any(n.startswith(_V) for n in fams):
        lm = [f for f in fams.values() if f.name.startswith(_L)]
        if not lm:
            return Generation("unknown", None, None, None, ("no vllm: or lmdeploy: family",))
        lo, hi = max(f.first for f in lm), min(f.last for f in lm)
        return Generation("lmdeploy", Track.LMDEPLOY, lo, hi, ("lmdeploy: families",))
    running_help = helps.get(_V + "num_requests_running", "")
    votes: list[tuple[Track, str]] = [
        (Track(f.generation), f"{f.name} exists only in {f.generation}")
        for f in fams.values() if f.generation in (Track.V0, Track.V1)
    ]  # fmt: skip
    for hit, track, text in (
        ("engine" in labels, Track.V1, "engine label"),
        (any(n.startswith(_V) and n.endswith("_created") for n in raw), Track.V1, "_created series"),
        ("currently running on GPU" in running_help, Track.V0, "V0 HELP of num_requests_running"),
        ("model execution batches" in running_help, Track.V1, "V1 HELP of num_requests_running"),
    ):
        votes += [(track, text)] * (2 if hit and "HELP" in text else 1 if hit else 0)
    v0 = sum(1 for t, _ in votes if t == Track.V0)
    track = Track.V0 if v0 > len(votes) - v0 else Track.V1
    why = list(dict.fromkeys(text for t, text in votes if t == track))
    lo, hi = (0, 0, 0), NEWEST_VLLM
    for span in (f.span(track) for f in fams.values() if f.name.startswith(_V)):
        if span is not None:
            lo, hi = max(lo, span.first), min(hi, span.last)
    ttft = {float(b) for b in bounds.get(_V + "time_to_first_token_seconds", ())}
    iters = {float(b) for b in bounds.get(_V + "iteration_tokens_total", ())}
    clues: list[tuple[bool, Version, Version, str]] = [
        ("engine" in labels, (0, 8, 3), hi, "engine label: >= 0.8.3"),
        (track == Track.V1 and "model_name" in labels and "engine" not in labels, lo, (0, 8, 2),
         "model_name without engine label: <= 0.8.2"),
        (_V + "kv_cache_usage_perc" in fams and _V + "gpu_cache_usage_perc" not in fams, (0, 11, 0), hi,
         "kv_cache_usage_perc without gpu_cache_usage_perc: >= 0.11"),
        ("queried blocks" in helps.get(_V + "gpu_prefix_cache_queries_total", ""), lo, (0, 8, 5),
         "prefix cache counted in blocks: <= 0.8.5"),
        (2560.0 in ttft, (0, 8, 4), hi, "TTFT bucket 2560: >= 0.8.4"),
        (bool(ttft) and 2560.0 not in ttft, lo, (0, 8, 3), "no TTFT bucket 2560: <= 0.8.3"),
        (bool(iters - set(_ITER)), lo, (0, 8, 4), "CUDA-graph iteration buckets: <= 0.8.4"),
    ]  # fmt: skip
    for hit, floor, ceiling, text in clues:
        if hit and max(lo, floor) <= min(hi, ceiling):
            lo, hi = max(lo, floor), min(hi, ceiling)
            why.append(text)
        elif hit:
            why.append(f"ignored, contradicts the rest: {text}")
    return Generation("vllm", track, lo, hi, tuple(why))
