"""Derivation layers on top of the base gauges: the capacity model and the forecast.

Each layer is an :data:`~sidecar.state.Extender`, called per engine
(:data:`~sidecar.state.TargetModelEngine`) after every good scrape with the
engine's history and the *sample* time, returning extra gauges. They read no
clock and do no I/O (the model's config.json is read once, at start-up, by
:func:`build_extenders`; only while that file is not there yet does the capacity
layer look for it again, once per scrape interval of sample time), so the forecast
benchmark replays simulated time through exactly this code.

- ``capacity``: :class:`CapacityLayer`, the theoretical capacity from config.json
  (only with ``model.config``; docs/capacity.md);
- ``forecast``: :class:`ForecastLayer`, demand, fill rate, time until full and the
  advice (docs/forecast.md);
- ``cache_labels``: reading vLLM's ``cache_config_info`` labels, for both.

Gauges are ``name -> value`` or ``name -> {extra label values: value}``.
"""

from __future__ import annotations

from ..config import Config
from ..state import Extender
from .capacity import CapacityLayer, Theory
from .forecast import ForecastLayer

__all__ = ["CapacityLayer", "ForecastLayer", "Theory", "build_extenders"]


def build_extenders(config: Config) -> tuple[Extender, ...]:
    """The layers this (validated) configuration enables, each given the settings it reads."""
    capacity = CapacityLayer(config.model, retry_s=config.scrape_interval_s) if config.model.config else None
    forecast = ForecastLayer(
        config.forecast,
        watermark=config.thresholds.watermark,
        target_usage=config.thresholds.target_usage,
        derive_window_s=config.derive_window_s,
        capacity=capacity,
    )
    return tuple(x for x in (capacity, forecast) if x is not None)
