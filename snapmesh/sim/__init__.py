"""The deterministic simulator: scenario files in, snapshots out (docs/scenarios.md).

The fault fuzzer (`fuzz`) runs the production machines, the nodes'
(snapmesh.protocol.node.machine) and the controller's (snapmesh.protocol.controller.machine),
in a simulated world (`world`: `disk`, `network`, `controller`) under random faults.
"""

from snapmesh.sim.scenario import Scenario, ScenarioError, from_dict, loads
from snapmesh.sim.simulator import Simulator, simulate

__all__ = ["Scenario", "ScenarioError", "Simulator", "from_dict", "loads", "simulate"]
