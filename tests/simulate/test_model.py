"""Invariants of the simulated replica model and of what each scenario makes it do."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from agent.errors import SimulatorError
from agent.simulate.model import ReplicaModel, ReplicaParams
from agent.simulate.render import bounds_for
from agent.simulate.scenarios import SCENARIOS, get_scenario


@dataclass
class Run:
    """One replica driven through a scenario second by second, with a sample per step."""

    model: ReplicaModel
    kv: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)
    generation: list[float] = field(default_factory=list)


def drive(scenario: str, seconds: int, *, seed: int = 7, flavor: str = "v1") -> Run:
    params = ReplicaParams()
    run = Run(ReplicaModel(params, bounds_for(flavor, params.max_model_len), seed))
    sc = get_scenario(scenario)
    for t in range(seconds):
        run.model.step(float(t), 1.0, sc.load(float(t), sc.rate_per_replica * sc.demand(float(t))))
        run.kv.append(run.model.kv_usage)
        run.running.append(run.model.num_running)
        run.waiting.append(run.model.num_waiting)
        run.preemptions.append(run.model.preemptions)
        run.generation.append(run.model.generation_tokens)
    return run


def tokens_per_s(run: Run, start: int, end: int) -> float:
    return (run.generation[end - 1] - run.generation[start - 1]) / (end - start)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kv_usage_stays_between_zero_and_one(scenario: str) -> None:
    """KV-cache usage is a ratio in [0, 1] in every scenario, however hard it is pushed."""
    run = drive(scenario, 240)
    assert all(0.0 <= kv <= 1.0 for kv in run.kv)


def test_steady_is_healthy() -> None:
    """Steady load keeps KV around 40-70 %, the queue empty and nothing preempted."""
    run = drive("steady", 300)
    settled = run.kv[60:]
    assert 0.35 <= sum(settled) / len(settled) <= 0.7
    assert max(run.waiting[60:]) <= 5
    assert run.preemptions[-1] == 0


def test_waiting_outgrows_running_under_surge() -> None:
    """After the surge waiting exceeds 2x running within two minutes and keeps growing."""
    run = drive("surge", 360)
    assert run.waiting[50] <= 5
    assert run.waiting[180] > 2 * run.running[180]
    assert run.waiting[359] > run.waiting[240] > run.waiting[180]


def test_kv_pressure_saturates_and_preempts() -> None:
    """Long prompts and generations push KV above 95 % and cause recompute preemptions."""
    run = drive("kv_pressure", 300)
    assert max(run.kv[60:]) > 0.95
    assert sum(kv > 0.95 for kv in run.kv[60:]) > 60
    assert run.preemptions[-1] > 0


def test_kv_pressure_rarely_dips_under_95_percent_once_saturated() -> None:
    """Once saturated, kv_pressure's cache is above 95 % at over 99 % of the 15 s evaluations (four seeds,
    20 minutes each): every dip restarts VLLMKVCacheSaturated's 10-minute `for`, and the scenario test waits
    for one `for` to run through. The request shapes before this bound dipped at 3-5 % of evaluations."""
    evaluations = [kv for seed in (1, 2, 3, 7) for kv in drive("kv_pressure", 1320, seed=seed).kv[120::15]]
    dips = sum(kv <= 0.95 for kv in evaluations)
    assert dips <= 0.01 * len(evaluations), (dips, len(evaluations))


def test_counters_never_decrease() -> None:
    """Token, preemption, success and histogram counters only go up, step after step."""
    params = ReplicaParams()
    model = ReplicaModel(params, bounds_for("v1", params.max_model_len), 3)
    sc = get_scenario("kv_pressure")
    last: list[float] = []
    for t in range(200):
        model.step(float(t), 1.0, sc.load(float(t), sc.rate_per_replica * sc.demand(float(t))))
        now = [model.prompt_tokens, model.generation_tokens, model.preemptions, model.prefix_queries,
               model.prefix_hits, *model.success.values(), *(h.count for h in model.hists.values()),
               *(h.sum for h in model.hists.values())]  # fmt: skip
        assert all(b >= a for a, b in zip(last, now, strict=False)), t
        last = now


def test_histogram_counts_equal_completed_requests() -> None:
    """Every finished request is observed once in each per-request histogram, and buckets add up."""
    run = drive("surge", 240)
    m = run.model
    completed = m.success["stop"] + m.success["length"]
    assert completed > 1000
    per_request = ("e2e", "queue", "inference", "prefill", "decode", "tpot", "prompt_tokens", "n")
    for key in per_request:
        assert m.hists[key].count == completed, key
        assert m.hists[key].cumulative()[-1] == completed, key
    assert m.hists["ttft"].count >= completed  # first tokens also count requests still decoding


def test_slow_interconnect_cuts_generation_throughput_about_tenfold() -> None:
    """With 1/10 of the interconnect bandwidth generation tokens/s fall roughly tenfold."""
    run = drive("slow_interconnect", 300)
    before, after = tokens_per_s(run, 20, 60), tokens_per_s(run, 120, 300)
    assert 6.0 <= before / after <= 16.0
    assert run.model.last_iteration_s > 0.1


def test_same_seed_same_run_and_seeds_differ() -> None:
    """The model is deterministic given its seed; another seed gives another trajectory."""
    a, b, c = drive("surge", 120, seed=1), drive("surge", 120, seed=1), drive("surge", 120, seed=2)
    assert a.model.state() == b.model.state()
    assert a.kv == b.kv
    assert a.model.state() != c.model.state()


def test_dead_replica_stops_moving() -> None:
    """A replica marked dead keeps its last numbers: counters freeze, nothing is admitted."""
    run = drive("steady", 60)
    run.model.alive = False
    frozen = run.model.state()
    run.model.step(60.0, 1.0, get_scenario("steady").load(60.0, 10.0))
    after = run.model.state()
    assert {k: v for k, v in after.items() if k not in ("alive", "time")} == {
        k: v for k, v in frozen.items() if k not in ("alive", "time")
    }


def test_params_reject_a_pool_smaller_than_one_sequence() -> None:
    """A KV pool that cannot hold one max_model_len sequence is refused with SimulatorError."""
    with pytest.raises(SimulatorError):
        ReplicaParams(num_gpu_blocks=100, max_model_len=8192)


def test_unknown_scenario_names_the_valid_ones() -> None:
    """Asking for a scenario that does not exist lists the ones that do."""
    with pytest.raises(SimulatorError, match="steady"):
        get_scenario("meltdown")


def test_clients_give_up_behind_preempted_requests() -> None:
    """Requests that never started expire after client_timeout_s even when preempted ones (whose
    clients keep waiting) sit at the head of the queue."""
    params = ReplicaParams(client_timeout_s=30.0)
    model = ReplicaModel(params, bounds_for("v1", params.max_model_len), 3)
    heavy = get_scenario("kv_pressure").incident
    assert heavy is not None
    t = 0.0
    for _ in range(400):
        model.step(t, 1.0, replace(heavy, arrival_rate=12.0))
        t += 1.0
        never_started = [r.arrival for r in model.waiting if r.admitted < 0]
        assert not never_started or t - min(never_started) <= 30.0 + 1.0
    assert model.preemptions > 0 and model.success["abort"] > 0


def test_a_pinned_tenant_adds_its_own_requests() -> None:
    """``extra`` arrivals come with their own shape: the story's pinned tenant fills the KV cache
    that the replica's share of the balanced stream alone leaves half empty."""
    sc = get_scenario("story")
    assert sc.tenant is not None
    params = ReplicaParams()
    alone = ReplicaModel(params, bounds_for("v1", params.max_model_len), 5)
    pinned = ReplicaModel(params, bounds_for("v1", params.max_model_len), 5)
    kv_alone, kv_pinned = [], []
    for t in range(300):
        load = sc.load(float(t), 6.0)
        alone.step(float(t), 1.0, load)
        pinned.step(float(t), 1.0, load, sc.tenant)
        kv_alone.append(alone.kv_usage)
        kv_pinned.append(pinned.kv_usage)
    assert max(kv_alone[120:]) < 0.8
    assert min(kv_pinned[200:]) > 0.9
    assert pinned.prompt_tokens > 1.5 * alone.prompt_tokens
