"""An offline fleet for the dashboard tests: simulated replicas rendered, parsed and stored, with the rules.

One store per generation (vLLM V0, vLLM V1, LMDeploy): the simulator's replica models are
stepped every 15 s under load, each step's ``/metrics`` text (what :mod:`agent.simulate.render`
serves) is parsed and appended with ``job``/``instance`` labels and ``up``, and the bundled
recording rules are evaluated into the same store after each step, as Prometheus would.
A query that returns nothing here, on one generation, names a family that generation lacks.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.promql import Engine
from agent.promql.values import Sample
from agent.rules.files import load_rule_files
from agent.series import labels_from
from agent.simulate.model import Load, ReplicaModel, ReplicaParams
from agent.simulate.render import Renderer, bounds_for
from agent.store import Store

__all__ = ["STEP_MS", "T0_MS", "Fleet", "build"]

T0_MS = 1_700_000_000_000
STEP_MS = 15_000
RULES = Path(__file__).resolve().parents[2] / "rules"
_JOBS = {"v0": "vllm", "v1": "vllm", "lmdeploy": "lmdeploy"}


class Fleet:
    """A store holding ``replicas`` simulated servers of one generation, and an engine over it."""

    def __init__(self, flavor: str, *, replicas: int = 2, steps: int = 40) -> None:
        self.flavor = flavor
        self.store = Store(3600_000)
        self.engine = Engine(self.store)
        params = ReplicaParams()
        records = [r for g in load_rule_files(sorted(RULES.glob("*.rules.yaml"))) for r in g.rules
                   if r.kind == "record"]  # fmt: skip
        models = [ReplicaModel(params, bounds_for(flavor, params.max_model_len), seed=i) for i in range(replicas)]
        renderers = [Renderer(m, flavor, "llama-3-8b", created=T0_MS / 1000) for m in models]
        load = Load(arrival_rate=20.0)
        for step in range(steps):
            ts = T0_MS + step * STEP_MS
            for i, (model, renderer) in enumerate(zip(models, renderers, strict=True)):
                model.step(step * STEP_MS / 1000, STEP_MS / 1000, load)
                target = {"job": _JOBS[flavor], "instance": f"10.0.0.{i + 1}:8000"}
                self._append(renderer.render().decode(), target, ts)
                self.store.append(labels_from("up", target), ts, 1.0)
            for r in records:
                result = self.engine.instant(r.expr, ts)
                if isinstance(result, list):
                    for s in (x for x in result if isinstance(x, Sample)):
                        self.store.append(labels_from(r.name, {k: v for k, v in s.labels if k != "__name__"}),
                                          ts, s.value)  # fmt: skip
        self.now_ms = T0_MS + (steps - 1) * STEP_MS

    def _append(self, text: str, target: dict[str, str], ts: int) -> None:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.store.append(labels_from(s.name, {**s.labels, **target}), ts, float(s.value))

    def query(self, expr: str) -> list[Sample]:
        """The instant result of ``expr`` at the last step (a vector; empty for a scalar or string)."""
        result = self.engine.instant(expr, self.now_ms)
        return [s for s in result if isinstance(s, Sample)] if isinstance(result, list) else []


def build(flavor: str) -> Fleet:
    return Fleet(flavor)
