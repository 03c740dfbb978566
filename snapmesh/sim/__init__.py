"""The deterministic simulator: scenario files in, snapshots out (docs/scenarios.md)."""

from snapmesh.sim.scenario import Scenario, ScenarioError, from_dict, loads
from snapmesh.sim.simulator import Simulator, simulate

__all__ = ["Scenario", "ScenarioError", "Simulator", "from_dict", "loads", "simulate"]
