"""Grafana's dark theme: the background and text colours, its named colours and its classic series palette.

Threshold steps, overrides and annotations name colours the way Grafana's JSON does (``"red"``,
``"#F2495C"``, ``"rgb(242, 73, 92)"``); :func:`grafana_color` turns each into something matplotlib draws.
"""

from __future__ import annotations

import re

BACKGROUND = "#111217"
PANEL_BACKGROUND = "#181b1f"
PANEL_BORDER = "#2c3235"
TEXT = "#d8d9da"
MUTED = "#8e8e9e"
GRID_LINE = "#2c3235"
NO_DATA = "#8e8e9e"
#: Grafana's named colours (packages/grafana-data/src/themes/palette) used in threshold steps.
NAMED_COLORS = {
    "green": "#73BF69",
    "dark-green": "#37872D",
    "semi-dark-green": "#56A64B",
    "light-green": "#96D98D",
    "red": "#F2495C",
    "dark-red": "#C4162A",
    "semi-dark-red": "#E02F44",
    "light-red": "#FF7383",
    "yellow": "#FADE2A",
    "dark-yellow": "#E0B400",
    "semi-dark-yellow": "#F2CC0C",
    "light-yellow": "#FFEE52",
    "orange": "#FF9830",
    "dark-orange": "#FA6400",
    "semi-dark-orange": "#FF780A",
    "light-orange": "#FFB357",
    "blue": "#5794F2",
    "dark-blue": "#1F60C4",
    "semi-dark-blue": "#3274D9",
    "light-blue": "#8AB8FF",
    "purple": "#B877D9",
    "dark-purple": "#8F3BB8",
    "semi-dark-purple": "#A352CC",
    "light-purple": "#CA95E5",
    "text": TEXT,
    "transparent": "#00000000",
}
#: Grafana's classic series palette, in order.
PALETTE = "#7EB26D #EAB839 #6ED0E0 #EF843C #E24D42 #1F78C1 #BA43A6 #705DA0 #508642 #CCA300".split()


def grafana_color(name: str | None, default: str = TEXT) -> str:
    """A Grafana colour (named, ``#rrggbb`` or ``rgb(...)``) as something matplotlib draws."""
    if not name:
        return default
    if name in NAMED_COLORS:
        return NAMED_COLORS[name]
    m = re.fullmatch(r"rgba?\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*[\d.]+\s*)?\)", name)
    if m:
        return "#{:02x}{:02x}{:02x}".format(*(int(g) for g in m.groups()))
    return name
