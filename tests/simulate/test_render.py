"""The fast renderer's bytes are prometheus_client's: every step of a loaded replica, in each flavor,
equals ``generate_latest`` over the same families (the reference is the library, not this code)."""

from __future__ import annotations

import pytest
from prometheus_client.core import GaugeMetricFamily

from agent.errors import SimulatorError
from agent.simulate.model import ReplicaModel, ReplicaParams
from agent.simulate.render import FLAVORS, Renderer, bounds_for
from agent.simulate.scenarios import get_scenario
from agent.simulate.template import Template


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("scenario", ["surge", "kv_pressure"])
def test_every_step_renders_what_generate_latest_renders(flavor: str, scenario: str) -> None:
    """Through a scenario's load (finish reasons appear, histograms fill, counters grow past exponent
    notation's thresholds), each step's body equals the reference byte for byte."""
    params = ReplicaParams()
    model = ReplicaModel(params, bounds_for(flavor, params.max_model_len), 11)
    renderer = Renderer(model, flavor, 'org/model "quoted" \\ name', created=1_764_000_000.123)
    sc = get_scenario(scenario)
    seen = set()
    for t in range(0, 300, 3):
        model.step(float(t), 3.0, sc.load(float(t), sc.rate_per_replica * sc.demand(float(t))))
        body = renderer.render()
        assert body == renderer.reference(), f"step at {t} s"
        seen.add(body)
    assert len(seen) > 80  # the values did change from step to step
    assert model.prompt_tokens > 1e6  # Go's exponent notation (floatToGoString) was exercised
    assert renderer.compiles <= 4  # compiled again only when a finish reason first appeared


def test_a_render_is_cached_within_a_step() -> None:
    params = ReplicaParams()
    model = ReplicaModel(params, bounds_for("v1", params.max_model_len), 1)
    renderer = Renderer(model, "v1", "m", created=0.0)
    first = renderer.render()
    assert renderer.render() is first and renderer.renders == 1


def test_a_value_program_that_disagrees_is_refused() -> None:
    """The compile checks the values it was given against the library's text, so a value program
    that drifted from the collector fails loudly instead of serving wrong numbers."""
    fam = GaugeMetricFamily("x", "help", labels=["a"])
    fam.add_metric(["1"], 2.0)
    fam.add_metric(["2"], 3.0)
    template = Template.compile([fam], [2.0, 3.0], shape=())
    assert template.fill([5.0, float("inf")]) == b'# HELP x help\n# TYPE x gauge\nx{a="1"} 5.0\nx{a="2"} +Inf\n'
    with pytest.raises(SimulatorError, match="first difference at sample 1"):
        Template.compile([fam], [2.0, 4.0], shape=())
    with pytest.raises(SimulatorError, match="1 values for 2 samples"):
        Template.compile([fam], [2.0], shape=())
    with pytest.raises(SimulatorError, match="3 values for a template of 2"):
        template.fill([1.0, 2.0, 3.0])
