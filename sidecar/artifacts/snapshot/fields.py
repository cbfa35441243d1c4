"""A panel's field configuration as Grafana applies it: defaults, thresholds, value mappings, overrides.

``fieldConfig.defaults`` holds the panel's unit, decimals, min/max, colour, threshold steps and
value mappings; ``fieldConfig.overrides`` change one property for the series or columns a matcher
picks (by name, by regular expression, by query). Pure functions over the dashboard JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .colors import NAMED_COLORS, NO_DATA, PALETTE, grafana_color
from .data import Series


def field_defaults(panel: Mapping[str, Any]) -> dict[str, Any]:
    """``fieldConfig.defaults``: what applies to every series or column without an override."""
    return (panel.get("fieldConfig") or {}).get("defaults") or {}


def field_custom(panel: Mapping[str, Any]) -> dict[str, Any]:
    """``fieldConfig.defaults.custom``: the panel type's own options (line width, fill, stacking, axis scale)."""
    return field_defaults(panel).get("custom") or {}


def threshold_steps(panel: Mapping[str, Any]) -> list[tuple[float | None, str]]:
    """The threshold steps as (value, colour); the base step's value is None (Grafana: -Infinity)."""
    steps = (field_defaults(panel).get("thresholds") or {}).get("steps") or []
    return [(s.get("value"), grafana_color(s.get("color"), NAMED_COLORS["green"])) for s in steps]


def threshold_color(panel: Mapping[str, Any], v: float | None) -> str:
    """The colour of the threshold step ``v`` falls in (Grafana: the last step at or below it)."""
    color = NAMED_COLORS["green"]
    if v is None:
        return NO_DATA
    for value, step_color in threshold_steps(panel):
        if value is None or v >= value:
            color = step_color
    return color


def mapped_text(mappings: Any, v: float | str) -> str | None:
    """The text a value or range mapping gives ``v`` (Grafana's "Value mappings"), else None. A text
    (a label column such as an action) matches a value mapping's key exactly."""
    for mapping in mappings or []:
        options = mapping.get("options") or {}
        if isinstance(v, str):
            if mapping.get("type") == "value" and v in options:
                return (options[v] or {}).get("text")
            continue
        if mapping.get("type") == "range":
            low, high = options.get("from"), options.get("to")
            if (low is None or v >= low) and (high is None or v <= high):
                return (options.get("result") or {}).get("text")
        elif mapping.get("type") == "value":
            for key, result in options.items():
                if _same_number(key, v):
                    return (result or {}).get("text")
    return None


def _same_number(key: str, v: float) -> bool:
    try:
        return float(key) == v
    except ValueError:
        return False


def _matches(matcher: Mapping[str, Any], name: str, ref_id: str) -> bool:
    kind, option = matcher.get("id"), matcher.get("options")
    if kind == "byName":
        return option == name
    if kind == "byRegexp":
        return isinstance(option, str) and re.fullmatch(option, name) is not None
    if kind == "byFrameRefID":
        return option == ref_id
    return False


def override(panel: Mapping[str, Any], prop: str, name: str, ref_id: str = "") -> Any:
    """The value of field-config override ``prop`` (e.g. ``color``, ``unit``) for a series or column."""
    found = None
    for o in (panel.get("fieldConfig") or {}).get("overrides") or []:
        if _matches(o.get("matcher") or {}, name, ref_id):
            for p in o.get("properties") or []:
                if p.get("id") == prop:
                    found = p.get("value")
    return found


def series_color(panel: Mapping[str, Any], s: Series, index: int) -> str:
    """An override's fixed colour, else the panel's fixed colour, else the palette's next one."""
    color = override(panel, "color", s.name, s.ref_id) or field_defaults(panel).get("color") or {}
    if color.get("mode") == "fixed" and color.get("fixedColor"):
        return grafana_color(color["fixedColor"])
    return PALETTE[index % len(PALETTE)]
