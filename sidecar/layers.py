"""Optional derivation layers added on top of the base gauges, chosen from the configuration.

Each layer is an :data:`~sidecar.state.Extender`: pure, called per
(model_name, engine) after every good scrape with the key's history and the
sample time, returning extra gauges for the exporter.
"""

from __future__ import annotations

from .config import Config
from .state import Extender


def build_extenders(config: Config) -> tuple[Extender, ...]:
    """The layers this configuration enables; raises ConfigError for an unusable model section."""
    return ()
