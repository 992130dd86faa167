"""Tests for agent.diagnose.plan.fleet: live capacity advice from a replica's cache_config_info and its
usage history, on stores filled from the simulator's kv_pressure, surge and steady scenarios and on
hand-built stores whose arithmetic the comments show."""

from __future__ import annotations

import pytest

from agent.config import CAPACITY_ALERTS as CONFIG_CAPACITY_ALERTS
from agent.diagnose.plan.fleet import CAPACITY_ALERTS, ReplicaCapacity, capacity_advice, replicas_from_store
from agent.series import labels_from
from agent.store import Store
from tests.simstore import MODEL, simulated_store

T0 = 1_750_000_000.0
NOW_MS = int((T0 + 900) * 1000)
# The simulator's default replica: 8,192 blocks of 16 tokens, max_model_len 8,192.
TOKENS = 8192 * 16  # 131,072
FULL_LENGTH = 8192 // (8192 // 16)  # 8,192 blocks / 512 blocks per sequence = 16


def _replica(scenario: str, seconds: int = 900) -> ReplicaCapacity:
    store = simulated_store(scenario, seconds, t0_s=T0)
    (r,) = replicas_from_store(store, int((T0 + seconds) * 1000), max_model_len=8192, max_model_len_source="test")
    return r


def test_capacity_alert_names_agree_with_the_default_diagnose_action() -> None:
    """The daemon's capacity alerts and the default config's diagnose matcher name the same alerts."""
    assert CONFIG_CAPACITY_ALERTS.split("|") == list(CAPACITY_ALERTS)


def test_capacity_comes_from_cache_config_info() -> None:
    """KV capacity is num_gpu_blocks x block_size tokens, and full-length sequences whole blocks of max_model_len."""
    r = _replica("steady", 120)
    assert (r.instance, r.job, r.model, r.cache_dtype) == ("gpu-node-1:8000", "vllm", MODEL, "auto")
    assert (r.num_gpu_blocks, r.block_size, r.tokens, r.full_length_seqs) == (8192, 16, TOKENS, FULL_LENGTH)
    assert r.gpu_memory_utilization == 0.9
    assert r.preemptions_since == "in the last 15 min"


def test_steady_replica_is_fine() -> None:
    """Steady load: an ok finding with the capacity evidence and nothing to change."""
    f = capacity_advice(_replica("steady", 600))
    assert f.ok and (f.kind, f.setting) == ("kv-cache-capacity", "")
    assert f.evidence[0] == ("gpu-node-1:8000: KV cache 8,192 blocks × 16 tokens = 131,072 tokens "
                             "(vllm:cache_config_info, cache_dtype auto, gpu_memory_utilization 0.9)")
    assert f.evidence[1] == "= 16 full-length sequences of 8,192 tokens (max_model_len from test)"
    assert f.runbook_url.endswith("runbooks/diagnosis-kv-cache-capacity.md")


def test_kv_pressure_advises_replicas_with_fewer_sequences_and_fp8_as_alternatives() -> None:
    """kv_pressure (KV above 95 %, preemptions, a queue far above 2x running): a warning whose change is more
    replicas; capping --max-num-seqs at what fills the cache to 90 % at today's tokens per sequence (fewer than
    ran: no preemptions) and fp8 (twice the tokens) are the alternatives."""
    r = _replica("kv_pressure")
    assert r.kv_usage_peak > 0.95 and r.preemptions > 0 and r.waiting_mean > 2 * r.running_mean
    f = capacity_advice(r)
    assert (f.ok, f.severity, f.labels["instance"]) == (False, "warning", "gpu-node-1:8000")
    fits = int(TOKENS * 0.9 // (r.kv_usage_peak * TOKENS / r.running_mean))
    replicas = -(-(r.running_mean + r.waiting_mean) // fits)  # ceil
    assert (f.setting, f.suggested_value) == ("replicas", f"+{replicas - 1:.0f}")
    assert fits < r.running_peak
    alternatives = f.details["alternatives"]
    assert alternatives[0].startswith("--kv-cache-dtype fp8: an fp8 cache holds 262,144 tokens")
    assert alternatives[1].startswith(f"--max-num-seqs {fits}: ")
    assert f.evidence[-1] == f"preemptions {r.preemptions:.0f} in the last 15 min"
    assert "is full — usage peaked at 100%" in f.summary


def test_surge_advises_more_replicas() -> None:
    """surge (waiting passes 2x running, the cache full): the change is more replicas, sized by what one
    replica serves at 90 % KV usage."""
    r = _replica("surge", 600)
    assert r.waiting_mean > 2 * r.running_mean
    f = capacity_advice(r)
    assert f.setting == "replicas" and f.suggested_value.startswith("+")
    assert int(f.suggested_value[1:]) >= 1
    assert "waiting" in f.evidence[3]


def _store_with(kv: float, running: float, waiting: float, preemptions: tuple[float, float] = (0.0, 0.0),
                cache_dtype: str = "auto") -> Store:
    store = Store(3_600_000)
    at = {"instance": "10.0.0.1:8000", "job": "vllm"}
    info = {**at, "num_gpu_blocks": "1000", "block_size": "16", "cache_dtype": cache_dtype,
            "gpu_memory_utilization": "0.9", "engine": "0"}
    series = {"vllm:cache_config_info": (1.0, 1.0), "vllm:kv_cache_usage_perc": (kv, kv),
              "vllm:num_requests_running": (running, running), "vllm:num_requests_waiting": (waiting, waiting),
              "vllm:num_preemptions_total": preemptions}
    for name, (a, b) in series.items():
        labels = info if name == "vllm:cache_config_info" else {**at, "model_name": "m", "engine": "0"}
        store.append(labels_from(name, labels), NOW_MS - 60_000, a)
        store.append(labels_from(name, labels), NOW_MS, b)
    return store


def test_queueing_with_headroom_raises_max_num_seqs() -> None:
    """Requests wait at 50 % KV usage with 20 running: the cache holds 20 x 0.9 / 0.5 = 36 such sequences, fewer
    than the 50 running and waiting, so --max-num-seqs goes to 36 and a replica more serves the rest."""
    (r,) = replicas_from_store(_store_with(0.5, 20, 30), NOW_MS)
    f = capacity_advice(r)
    assert (f.severity, f.setting, f.suggested_value) == ("info", "--max-num-seqs", "36")
    assert f.details["alternatives"][0].startswith("replicas +1: ")
    assert r.full_length_seqs is None and "full-length" not in "\n".join(f.evidence)


def test_preemptions_counted_as_the_counter_increase() -> None:
    """Preemptions are the increase of num_preemptions_total over the window (10 -> 14 = 4), across the
    full cache, and a shorter --max-model-len is offered where it is known."""
    store = _store_with(0.99, 40, 0, preemptions=(10.0, 14.0))
    (r,) = replicas_from_store(store, NOW_MS, max_model_len=4096, max_model_len_source="--max-model-len")
    assert r.preemptions == 4
    f = capacity_advice(r)
    # 16,000 tokens; 0.99 x 16,000 / 40 = 396 tokens per sequence; 16,000 x 0.9 / 396 = 36.4 -> 36
    assert (f.setting, f.suggested_value) == ("--max-num-seqs", "36")
    # 1,000 blocks // 40 sequences = 25 blocks = 400 tokens each at full length
    assert "--max-model-len 400: 40 sequences fit even at full length (400 tokens each)" in f.details["alternatives"]


def test_fp8_cache_is_not_suggested_again() -> None:
    """A replica already on an fp8 KV cache is not told to use one."""
    (r,) = replicas_from_store(_store_with(0.99, 40, 0, preemptions=(0, 3), cache_dtype="fp8"), NOW_MS)
    f = capacity_advice(r)
    assert not any(a.startswith("--kv-cache-dtype") for a in f.details["alternatives"])


@pytest.mark.parametrize("match", [{"instance": "10.0.0.2:8000"}, {"job": "other"}, {"model_name": "n"}])
def test_match_selects_the_alerts_replicas(match: dict[str, str]) -> None:
    """An alert about another instance, job or model gets no replica of this store."""
    assert replicas_from_store(_store_with(0.99, 40, 0), NOW_MS, match=match) == []
