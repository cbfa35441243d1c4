"""What the engine tests share: the sidecar's own read pipeline on one target of a given engine.

An adapter is registered for the test only (``sidecar.engines.ADAPTERS`` is patched), so these tests
run before and after the lead adds the engine's row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import pytest

from sidecar import engines
from sidecar.replay import Pipeline, replay_config
from sidecar.simulator import Simulator

#: ``pipeline_for(adapter_module, model_name, *, capacity_tokens=None, **replay_config_flags)``
PipelineFor = Callable[..., Pipeline]


@pytest.fixture
def pipeline_for(monkeypatch: pytest.MonkeyPatch) -> PipelineFor:
    """A factory: an in-process Sidecar (read pipeline, derivations, exporter) on one target whose
    ``engine`` is the adapter's KIND and whose ``capacity_tokens`` setting is given; ``model_name`` is the
    label its gauges are read with."""

    def make(
        adapter: ModuleType, model_name: str, *, capacity_tokens: int | None = None, **flags: str | float | None
    ) -> Pipeline:
        monkeypatch.setitem(engines.ADAPTERS, adapter.KIND, adapter)
        config = replay_config(**flags)  # type: ignore[arg-type]
        target = dataclasses.replace(config.targets[0], engine=adapter.KIND, capacity_tokens=capacity_tokens)
        return Pipeline(dataclasses.replace(config, targets=(target,)), model_name=model_name)

    return make


@pytest.fixture
def busy_simulator() -> Simulator:
    """The vllm-cpu load scenario at its first second with requests both running and waiting (the state
    a page of any engine is checked against)."""
    sim = Simulator(scenario="vllm-cpu-1gib-load", seed=1)
    for t in range(1, 120):
        sim.advance_to(float(t))
        if sim.running and sim.waiting:
            return sim
    pytest.fail("the load scenario never had requests running and waiting at once")
