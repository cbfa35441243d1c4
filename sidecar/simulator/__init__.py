"""The built-in vLLM simulator: a paged-KV engine model served as vLLM's ``/metrics``.

Public API::

    from sidecar.simulator import SimConfig, Simulator, SCENARIOS
    sim = Simulator(SimConfig(), scenario="ramp-30m", seed=1)
    sim.advance(60.0); sim.now; sim.render(Generation.V1_CAPACITY_LABELS)

See docs/simulator.md.
"""

from .config import SimConfig
from .exposition import CONTENT_TYPE
from .scenarios import CALIBRATION, LIBRARY, SCENARIOS, Scenario
from .simulation import Simulator, SimulatorConfigError

__all__ = [
    "CALIBRATION",
    "CONTENT_TYPE",
    "LIBRARY",
    "SCENARIOS",
    "Scenario",
    "SimConfig",
    "Simulator",
    "SimulatorConfigError",
]
