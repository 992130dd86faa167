"""The metric catalog against the extracted per-version matrix and real ``/metrics`` captures."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collect import catalog
from agent.collect.catalog import Track, parse_version
from tests.conftest import FIXTURES, SHARED

MATRIX = FIXTURES / "vllm" / "metrics_matrix.tsv"


def _matrix_rows() -> list[dict[str, str]]:
    lines = [line for line in MATRIX.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def _wire_family(row: dict[str, str]) -> str:
    first = row["wire"].split(",")[0]
    return first.removesuffix("_bucket") if row["type"] == "histogram" else first


def _capture(name: str) -> Path:
    for base in (FIXTURES / "vllm", SHARED / "fixtures" / "vllm"):
        if (base / name).exists():
            return base / name
    pytest.skip(f"capture {name} not present (copied from ../shared/fixtures/vllm)")


def _detect(text: str) -> catalog.Generation:
    """Run detection on everything one scrape shows, read with prometheus_client's parser."""
    names: set[str] = set()
    labels: set[str] = set()
    helps: dict[str, str] = {}
    bounds: dict[str, list[float]] = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        helps[fam.name] = fam.documentation
        for s in fam.samples:
            names.add(s.name)
            if s.name.startswith("vllm:"):
                labels |= set(s.labels) - {"le"}
            if s.labels.get("le", "+Inf") != "+Inf":
                bounds[fam.name].append(float(s.labels["le"]))
    return catalog.detect_generation(names, label_names=labels, help_texts=helps, bucket_bounds=bounds)


def test_matrix_fixture_names_its_source() -> None:
    """The copied matrix keeps the header lines that say where it was extracted from."""
    head = MATRIX.read_text(encoding="utf-8").splitlines()[0]
    assert head.startswith("#") and "PyPI wheels" in head


def test_every_matrix_family_is_known_with_its_type() -> None:
    """Each vLLM family in the matrix exists in the catalog with the same wire type."""
    for row in _matrix_rows():
        fam = catalog.family(_wire_family(row))
        assert fam is not None, row["wire"]
        expected = "gauge" if row["type"] == "info" else row["type"]
        assert fam.type == expected, fam.name


def test_catalog_spans_match_the_matrix_versions() -> None:
    """Per engine, the first and last release of each family equal the matrix's (code renames merged)."""
    spans: dict[tuple[str, str], tuple[tuple[int, int, int], tuple[int, int, int]]] = {}
    for row in _matrix_rows():
        key = (row["track"].lower(), _wire_family(row))
        first, last = parse_version(row["first"]), parse_version(row["last"])
        if key in spans:
            first, last = min(first, spans[key][0]), max(last, spans[key][1])
        spans[key] = (first, last)
    for (track, name), (first, last) in spans.items():
        fam = catalog.family(name)
        assert fam is not None
        span = fam.span(Track(track))
        assert span is not None, f"{name} has no {track} span"
        assert (span.first, span.last) == (first, last), name


def test_default_buckets_match_the_matrix_for_the_newest_release() -> None:
    """Explicit bucket lists in the matrix equal :func:`default_buckets` at the row's last release."""
    checked = 0
    for row in _matrix_rows():
        if not row["buckets"].startswith("["):
            continue
        bounds = [float(b) for b in row["buckets"].strip("[]").split(",")]
        track = Track(row["track"].lower())
        got = catalog.default_buckets(_wire_family(row), parse_version(row["last"]), track=track)
        assert got == tuple(bounds), row["wire"]
        checked += 1
    assert checked > 20


def test_buckets_change_at_0_8_4_and_0_8_5() -> None:
    """TTFT gains 20..2560 s at 0.8.4; iteration buckets leave the CUDA-graph sizes at 0.8.5."""
    old = catalog.default_buckets("vllm:time_to_first_token_seconds", (0, 8, 3))
    new = catalog.default_buckets("vllm:time_to_first_token_seconds", (0, 8, 4))
    assert old is not None and new is not None and 2560.0 not in old and new[-1] == 2560.0
    cuda = catalog.default_buckets("vllm:iteration_tokens_total", (0, 8, 4))
    assert cuda is not None and cuda[:4] == (1.0, 2.0, 4.0, 8.0) and cuda[-1] == 512.0
    early = catalog.default_buckets("vllm:e2e_request_latency_seconds", (0, 6, 3), track=Track.V0)
    assert early is not None and early[0] == 1.0
    assert catalog.default_buckets("vllm:request_prompt_tokens", max_model_len=8192) == (
        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
    assert catalog.default_buckets("vllm:num_requests_running") is None


def test_renamed_and_removed_families_name_their_replacement() -> None:
    """Renames point at the new family; removed throughput gauges point at a rate() expression."""
    assert catalog.replacement("vllm:gpu_cache_usage_perc") == "vllm:kv_cache_usage_perc"
    assert catalog.replacement("vllm:time_per_output_token_seconds") == "vllm:inter_token_latency_seconds"
    removed = catalog.replacement("vllm:avg_generation_throughput_toks_per_s")
    assert removed == "rate(vllm:generation_tokens_total[1m])"
    assert catalog.replacement("vllm:kv_cache_usage_perc") is None
    gpu = catalog.family("vllm:gpu_cache_usage_perc")
    assert gpu is not None and gpu.deprecated == (0, 9, 2) and gpu.generation == "both"


def test_lookup_accepts_sample_and_code_names() -> None:
    """Sample names (_bucket, _created) and V1 code names resolve to the wire family."""
    e2e = catalog.family("vllm:e2e_request_latency_seconds")
    assert e2e is not None and catalog.family("vllm:e2e_request_latency_seconds_bucket") == e2e
    assert catalog.family("vllm:prompt_tokens") == catalog.family("vllm:prompt_tokens_total")
    assert catalog.family("vllm:prompt_tokens_created") == catalog.family("vllm:prompt_tokens_total")
    assert catalog.family("vllm:no_such_metric") is None


def test_lmdeploy_families_and_versions() -> None:
    """LMDeploy's hit-rate gauge starts at 0.14 and its ITL histogram has no _seconds suffix."""
    hit = catalog.family("lmdeploy:prefix_cache_hit_rate")
    assert hit is not None and hit.type == "gauge" and hit.first == (0, 14, 0)
    assert hit.generation == "lmdeploy"
    assert catalog.family("lmdeploy:iter_token_latency") is not None
    assert catalog.family("lmdeploy:iter_token_latency_seconds") is None
    cached = catalog.family("lmdeploy:cached_tokens_total")
    assert cached is not None and cached.type == "counter"


def test_default_keep_families_cover_both_generations_and_gpus() -> None:
    """The default keep-list holds V0 and V1 health names, LMDeploy, scrape health and GPU families."""
    keep = catalog.default_keep_families()
    expected = {
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds", "vllm:num_requests_waiting", "vllm:cache_config_info",
        "lmdeploy:prefix_cache_hit_rate", "lmdeploy:cached_tokens_total", "up", "scrape_duration_seconds",
        "scrape_samples_scraped", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "sre_agent_gpu_lost",
    }  # fmt: skip
    assert expected <= keep, expected - keep
    for name in keep:
        if name.startswith(("vllm:", "lmdeploy:")):
            assert catalog.family(name) is not None, name


def test_cache_config_v0_keys_match_the_real_capture() -> None:
    """The V0 label keys of vllm:cache_config_info are exactly those in the AIBrix capture."""
    facts = text_string_to_metric_families(_capture("v0_0.7_aibrix_qwen15b_metrics.txt").read_text())
    info = next(f for f in facts if f.name == "vllm:cache_config_info")
    assert tuple(sorted(info.samples[0].labels)) == catalog.cache_config_label_keys(Track.V0)
    assert "engine" in catalog.cache_config_label_keys(Track.V1)


def test_detect_generation_on_the_v0_capture() -> None:
    """The AIBrix dump is recognised as V0 around 0.7 (V0-only gauges, V0 HELP, CUDA-graph buckets)."""
    gen = _detect(_capture("v0_0.7_aibrix_qwen15b_metrics.txt").read_text())
    assert (gen.vendor, gen.track) == ("vllm", Track.V0)
    assert gen.min_version is not None and gen.max_version is not None
    assert gen.min_version <= (0, 7, 3) <= gen.max_version <= (0, 9, 0)


def test_detect_generation_on_the_v1_capture() -> None:
    """The production-stack dump is V1 without the engine label, so 0.7.3..0.8.2."""
    gen = _detect(_capture("v1_0.8_prodstack_qwen32b_metrics.txt").read_text())
    assert (gen.vendor, gen.track) == ("vllm", Track.V1)
    assert (gen.min_version, gen.max_version) == ((0, 7, 3), (0, 8, 2))
    assert any("engine label" in e for e in gen.evidence)


def test_detect_generation_from_names_alone() -> None:
    """Names alone separate V1 >= 0.11 from LMDeploy and from targets that are neither."""
    v1 = catalog.detect_generation(["vllm:kv_cache_usage_perc", "vllm:request_time_per_output_token_seconds"])
    assert v1.track == Track.V1 and v1.min_version == (0, 11, 0)
    lm = catalog.detect_generation(["lmdeploy:prefix_cache_hit_rate", "lmdeploy:num_requests_running"])
    assert lm.vendor == "lmdeploy" and lm.min_version == (0, 14, 0)
    assert catalog.detect_generation(["process_cpu_seconds_total"]).vendor == "unknown"
    assert str(v1).startswith("vllm V1 0.11.0")
