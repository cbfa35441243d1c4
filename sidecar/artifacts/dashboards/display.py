"""How a value reads on a panel: Grafana units, value mappings and threshold colours.

Grafana draws what a panel's unit, mappings and thresholds say (Grafana docs, "Standard options",
"Configure value mappings", "Configure thresholds"); these are the ones the three dashboards share,
so a figure reads the same wherever it is shown.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from ...thresholds import Thresholds

#: Grafana's custom unit for a rate of tokens (``suffix:`` units, "Standard options > Unit" docs): no
#: unit of Grafana's list counts tokens.
TOKENS_PER_S = "suffix: tokens/s"

#: Time-until graphs are capped here: +Inf (not filling) cannot be drawn, and beyond it nothing is urgent.
TIME_UNTIL_GRAPH_CAP_S = 6 * 3600
#: The floor of the time-until graphs' log axis: "full within a minute" (0 s cannot be drawn on a log axis).
TIME_UNTIL_GRAPH_FLOOR_S = 60
#: The "worst time until full" figure is capped here and read as "not filling".
TIME_UNTIL_STAT_CAP_S = 7 * 86400


def threshold_steps(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute threshold steps: the first value is None (the base colour)."""
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def usage_thresholds(th: Thresholds) -> db.ThresholdsConfig:
    """Green, orange from the ticket threshold, red from the paging watermark."""
    return threshold_steps((None, "green"), (th.warning, "orange"), (th.watermark, "red"))


def not_filling(cap_s: int) -> dm.RangeMap:
    """Reads a time until full capped at ``cap_s`` as "not filling" (+Inf cannot be drawn or mapped)."""
    return dm.RangeMap(
        options=dm.DashboardRangeMapOptions(
            from_val=cap_s, to=1e12, result=dm.ValueMappingResult(text="not filling", color="green")
        )
    )


def enum_texts(texts: dict[str, str]) -> dm.ValueMap:
    """Reads each enum value (an action, a reason) as its human text: no raw ``shortfall_at_upper_bound``."""
    return dm.ValueMap(options={value: dm.ValueMappingResult(text=text) for value, text in texts.items()})


def colored_cells(steps: db.ThresholdsConfig) -> list[dm.DynamicConfigValue]:
    """A table column whose cells take the colour of their threshold step."""
    return [
        dm.DynamicConfigValue(id_val="thresholds", value=steps.build()),
        dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background", "mode": "basic"}),
    ]


def mapped_cells(*mappings: Any) -> list[dm.DynamicConfigValue]:
    """A table column whose values read as the mappings say."""
    return [dm.DynamicConfigValue(id_val="mappings", value=list(mappings))]
