"""A simulated vLLM/LMDeploy fleet for the demo, the integration tests and the benchmarks.

:mod:`.model` is the per-replica queueing model, :mod:`.render` turns it into the exact
``/metrics`` text vLLM or LMDeploy serves, :mod:`.scenarios` names the incidents the
agent's rules exist for, and :mod:`.server` serves N replicas on localhost ports with a
control port for ``POST /scale``; :mod:`.gpu` simulates the replicas' GPUs under dcgm-exporter's names.
"""

from __future__ import annotations

from agent.simulate.gpu import GpuBank, GpuParams
from agent.simulate.model import Load, ReplicaModel, ReplicaParams
from agent.simulate.render import Renderer, bounds_for
from agent.simulate.scenarios import SCENARIOS, Scenario, get_scenario
from agent.simulate.server import CONTENT_TYPE, Fleet, FleetConfig

__all__ = [
    "CONTENT_TYPE",
    "SCENARIOS",
    "Fleet",
    "FleetConfig",
    "GpuBank",
    "GpuParams",
    "Load",
    "Renderer",
    "ReplicaModel",
    "ReplicaParams",
    "Scenario",
    "bounds_for",
    "get_scenario",
]
