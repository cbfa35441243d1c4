"""Where each panel goes: Grafana's 24-column grid in pixels, and collapsed rows drawn open.

A panel's ``gridPos`` (x, y, w, h) is in grid units: 24 columns across, rows of :data:`ROW_PX`. The
picture is :data:`GRID_COLUMNS` x :data:`COLUMN_PX` = 1800 px wide, with a header band above the grid
and a footer below it. :func:`layout` places every panel (opening collapsed rows the way Grafana does
when a row is clicked), :func:`panel_box` gives a placed panel's rectangle in pixels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..panels import walk_panels

# grid geometry, in pixels at the picture's DPI
GRID_COLUMNS = 24
COLUMN_PX = 75  # 24 columns -> 1800 px wide
ROW_PX = 30  # one gridPos height unit (Grafana: 30 px plus margins)
GAP_PX = 4  # space around each panel
HEADER_PX = 64
FOOTER_PX = 34
TITLE_PX = 24  # the title band of a panel


@dataclass(frozen=True)
class Placed:
    """A panel and where it is drawn, in grid units (``y`` after expanding collapsed rows)."""

    panel: dict[str, Any]
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Box:
    """A rectangle in figure pixels, origin at the top left."""

    left: float
    top: float
    width: float
    height: float


def _grid(panel: Mapping[str, Any]) -> tuple[int, int, int, int]:
    gp = panel.get("gridPos") or {}
    return int(gp.get("x", 0)), int(gp.get("y", 0)), int(gp.get("w", 12)), int(gp.get("h", 8))


def layout(dashboard: Mapping[str, Any]) -> list[Placed]:
    """Every panel of the dashboard with its position; collapsed rows are drawn open.

    A collapsed row carries its panels with the positions they had when the row was open. They are
    moved to start right under the row, and every panel further down moves down by their height.
    """
    top = sorted(dashboard.get("panels", []), key=lambda p: (_grid(p)[1], _grid(p)[0]))
    placed: list[Placed] = []
    shift = 0
    for panel in top:
        x, y, w, h = _grid(panel)
        placed.append(Placed(panel, x, y + shift, w, h))
        children = list(walk_panels({"panels": [panel]})) if panel.get("type") == "row" else []
        if children:
            child_top = min(_grid(c)[1] for c in children)
            offset = y + shift + h - child_top
            for c in children:
                cx, cy, cw, ch = _grid(c)
                placed.append(Placed(c, cx, cy + offset, cw, ch))
            shift += max(_grid(c)[1] + _grid(c)[3] for c in children) - child_top
    return placed


def panel_box(place: Placed) -> Box:
    """The pixel rectangle of a placed panel: its grid cell, less :data:`GAP_PX` on every side."""
    return Box(
        place.x * COLUMN_PX + GAP_PX,
        HEADER_PX + place.y * ROW_PX + GAP_PX,
        place.w * COLUMN_PX - 2 * GAP_PX,
        place.h * ROW_PX - 2 * GAP_PX,
    )
