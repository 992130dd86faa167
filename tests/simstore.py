"""A store filled from the simulator as the daemon's scrapes would fill it: one replica model
driven through a scenario, its ``/metrics`` rendered and parsed every scrape interval."""

from __future__ import annotations

from agent.collect.exposition import parse
from agent.series import labels_from
from agent.simulate.model import ReplicaModel, ReplicaParams
from agent.simulate.render import Renderer, bounds_for
from agent.simulate.scenarios import get_scenario
from agent.store import Store

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def simulated_store(scenario: str, seconds: int, *, t0_s: float, instance: str = "gpu-node-1:8000",
                    store: Store | None = None, seed: int = 7, interval_s: int = 15,
                    params: ReplicaParams | None = None) -> Store:
    """``store`` (a new one by default) with one V1 replica's scrapes at ``t0_s + t`` for every
    ``interval_s`` of ``seconds`` of ``scenario``, labelled ``job="vllm"`` and ``instance``."""
    p = params or ReplicaParams()
    model = ReplicaModel(p, bounds_for("v1", p.max_model_len), seed)
    renderer = Renderer(model, "v1", MODEL, created=t0_s)
    sc = get_scenario(scenario)
    out = store if store is not None else Store(3_600_000)
    for t in range(seconds):
        model.step(float(t), 1.0, sc.load(float(t), sc.rate_per_replica * sc.demand(float(t))))
        if (t + 1) % interval_s:
            continue
        ts_ms = int((t0_s + t + 1) * 1000)
        for fam in parse(renderer.render().decode()):
            for s in fam.samples:
                out.append(labels_from(s.name, {**s.labels, "job": "vllm", "instance": instance}), ts_ms, s.value)
    return out
