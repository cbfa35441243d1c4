"""Derivation layers on top of the base gauges: the capacity model and the forecast.

Each layer is an :data:`~sidecar.state.Extender`, called per engine
(:data:`~sidecar.state.TargetModelEngine`) after every good scrape with one
:class:`~sidecar.state.Step` (the engine's history, the *sample* time, the base
derivation), returning extra gauges keyed by catalogue row
(:data:`sidecar.metrics.Values`). Pure: no clock, no file, only the typed
observation (:mod:`sidecar.observation`); the model's config.json is found, loaded
and watched at the edge (:mod:`sidecar.model_source`: the daemon calls
:func:`~sidecar.model_source.refresh_models` per scrape), so the forecast benchmark
replays simulated time through exactly this code.

- ``capacity``: :class:`CapacityLayer`, the theoretical capacity from config.json
  (only with ``model.config``; docs/capacity.md); hands the served model on to
- ``forecast``: :class:`ForecastLayer`, demand, fill rate, time until full and the
  advice (docs/forecast.md).

Gauges are ``row -> value`` or ``row -> {extra label values: value}``.
"""

from __future__ import annotations

from ..config import Config
from ..state import Extender
from .capacity import CapacityLayer, Theory
from .forecast import ForecastLayer

__all__ = ["CapacityLayer", "ForecastLayer", "Theory", "build_extenders"]


def build_extenders(config: Config) -> tuple[Extender, ...]:
    """The layers this (validated) configuration enables, each given the settings it reads."""
    capacity = None
    if config.model.config:  # its model is looked for at the edge: model_source.refresh_models, per scrape
        capacity = CapacityLayer(config.model, retry_s=config.scrape_interval_s)
    forecast = ForecastLayer(
        config.forecast,
        watermark=config.thresholds.watermark,
        target_usage=config.thresholds.target_usage,
        derive_window_s=config.derive_window_s,
    )
    return tuple(x for x in (capacity, forecast) if x is not None)
