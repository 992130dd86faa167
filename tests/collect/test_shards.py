"""scrape.shards: an agent keeps the targets whose Prometheus hashmod of ``__address__`` equals its
index. Checked against a real Prometheus 2.42 doing the same relabelling (``hashmod`` then ``keep``) on
the same addresses, and the config's index from a number or a StatefulSet pod name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.collect.discovery import all_targets, hashmod
from agent.config import Config, load_config
from agent.errors import ConfigError
from tests.alertmanager import eventually
from tests.prometheus import Prometheus

# Ports nothing listens on (scrapes fail fast), and names without a port (hashed as written, before
# Prometheus adds the default port)
ADDRESSES = [f"127.0.0.1:{port}" for port in range(1, 41)] + [f"vllm-{i}.vllm.svc" for i in range(8)]
TOTAL = 4


def _agent_keeps(index: int) -> set[str]:
    config = Config.model_validate({
        "targets": [{"url": f"http://{a}/metrics"} for a in ADDRESSES],
        "scrape": {"shards": {"total": TOTAL, "index": index}},
    })
    return {t.url.split("//")[1].split("/")[0] for t in all_targets(config, None)}


async def test_the_agents_shards_are_prometheus_hashmod_shards(tmp_path: Path) -> None:
    scrape = [{
        "job_name": f"shard-{index}", "scrape_interval": "1h", "scrape_timeout": "1s",
        "static_configs": [{"targets": ADDRESSES}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "modulus": TOTAL, "target_label": "__tmp_hash", "action": "hashmod"},
            {"source_labels": ["__tmp_hash"], "regex": str(index), "action": "keep"},
        ],
    } for index in range(TOTAL)]
    async with Prometheus(tmp_path / "prom", [], scrape_configs=scrape) as prom:
        async def listed() -> dict[str, set[str]] | None:
            active = (await prom.api("targets?state=active"))["activeTargets"]
            by_job: dict[str, set[str]] = {}
            for t in active:
                by_job.setdefault(t["labels"]["job"], set()).add(t["discoveredLabels"]["__address__"])
            if sum(len(v) for v in by_job.values()) == len(ADDRESSES):
                return by_job
            await asyncio.sleep(0.1)
            return None

        prometheus = await eventually(listed, timeout=30, what="Prometheus listing every sharded target")
    for index in range(TOTAL):
        assert _agent_keeps(index) == prometheus.get(f"shard-{index}", set()), index
    assert all(_agent_keeps(i) for i in range(TOTAL))  # each shard has some of the 48 targets


def test_hashmod_is_md5s_low_eight_bytes() -> None:
    """md5("a") = 0cc175b9c0f1b6a8 31c399e269772661: the low 8 bytes as a big-endian integer."""
    assert hashmod("a", 2**64 - 1) == 0x31C399E269772661 % (2**64 - 1)
    assert hashmod("a", 7) == 0x31C399E269772661 % 7


@pytest.mark.parametrize(("value", "index"), [("3", 3), ("sre-agent-shard-2", 2), ("shard-10", 10)])
def test_the_index_comes_from_a_number_or_a_pod_name(tmp_path: Path, value: str, index: int) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("scrape: {shards: {total: 16, index_env: POD_NAME}}\n")
    assert load_config(f, environ={"POD_NAME": value}).scrape.shards.index == index  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "environ", "message"), [
    ("scrape: {shards: {total: 4, index: 4}}\n", {}, "index 4 is not below total 4"),
    ("scrape: {shards: {total: 4}}\n", {}, "give index (0 to total - 1) or index_env"),
    ("scrape: {shards: {total: 4, index_env: POD_NAME}}\n", {}, "environment variable 'POD_NAME' is not set"),
    ("scrape: {shards: {total: 4, index_env: POD_NAME}}\n", {"POD_NAME": "sre-agent"}, "does not end in a shard"),
    ("scrape: {shards: {total: 4, index: 1, index_env: X}}\n", {"X": "1"}, "give index or index_env, not both"),
    ("scrape: {shards: {total: 0, index: 0}}\n", {}, "scrape.shards.total"),
])
def test_bad_shard_settings_are_named(tmp_path: Path, text: str, environ: dict[str, str], message: str) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ=environ)
    assert any(message in e for e in info.value.errors), info.value.errors
