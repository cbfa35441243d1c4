"""One dashboard to one PNG: place the panels, fetch each one's data, paint it, and record how each came out."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..panels import PrometheusAPI
from .canvas import Canvas, font_points
from .colors import PANEL_BACKGROUND, PANEL_BORDER, TEXT
from .data import Mark, PanelData, TimeRange, fetch, fetch_annotations, variable_values
from .drawing import draw_header_and_footer, draw_message, draw_row, draw_stat, draw_table
from .layout import COLUMN_PX, FOOTER_PX, GRID_COLUMNS, HEADER_PX, ROW_PX, TITLE_PX, Box, Placed, layout, panel_box
from .timeseries import draw_timeseries

#: Panel types drawn from their queries (a gauge is drawn as a stat); any other shows its type.
DRAWN_TYPES = ("timeseries", "stat", "gauge", "table")


@dataclass(frozen=True)
class PanelStatus:
    """How one panel came out: ``data``, ``no data``, ``error`` (a query failed) or ``not rendered``."""

    id: int | None
    title: str
    type: str
    status: str
    detail: str = ""


@dataclass
class Snapshot:
    """The written PNG, each panel's outcome and each annotation's, and how long it took."""

    path: Path
    panels: list[PanelStatus]
    annotations: dict[str, str]
    seconds: float

    def status(self, title: str) -> str:
        """The outcome of the panel titled ``title`` (KeyError if there is none)."""
        for p in self.panels:
            if p.title == title:
                return p.status
        raise KeyError(f"no panel titled {title!r}; panels: {[p.title for p in self.panels]}")

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for p in self.panels:
            counts[p.status] = counts.get(p.status, 0) + 1
        parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return f"{len(self.panels)} panels: {parts}"


def render_dashboard(
    dashboard: dict[str, Any],
    api: PrometheusAPI,
    values: dict[str, Any],
    start: float,
    end: float,
    out: Path,
    *,
    step: float | None = None,
) -> Snapshot:
    """Query and draw every panel of ``dashboard`` over [start, end] into the PNG ``out``."""
    began = time.monotonic()
    tr = TimeRange.of(start, end, step)
    values = variable_values(dashboard, values)
    placed = layout(dashboard)
    grid_rows = max((p.y + p.h for p in placed), default=1)
    canvas = Canvas(GRID_COLUMNS * COLUMN_PX, HEADER_PX + grid_rows * ROW_PX + FOOTER_PX)
    marks, annotations = fetch_annotations(api, dashboard, values, tr)
    statuses = [draw_panel(canvas, p, api, dashboard, values, tr, marks) for p in placed]
    draw_header_and_footer(canvas, dashboard, values, tr, annotations)
    canvas.save(Path(out))
    panels = [s for s in statuses if s.type != "row"]
    return Snapshot(Path(out), panels, annotations, time.monotonic() - began)


def draw_panel(
    canvas: Canvas,
    place: Placed,
    api: PrometheusAPI,
    dashboard: Mapping[str, Any],
    values: Mapping[str, Any],
    tr: TimeRange,
    marks: list[Mark],
) -> PanelStatus:
    """One panel: its frame and title, then its content (or "no data"); its outcome."""
    panel = place.panel
    kind = panel.get("type", "")
    title = panel.get("title", "")
    frame = panel_box(place)
    if kind == "row":
        draw_row(canvas, frame, panel)
        return PanelStatus(panel.get("id"), title, kind, "row")
    canvas.fill(frame, PANEL_BACKGROUND, edge=PANEL_BORDER)
    canvas.text(
        frame.left + 8,
        frame.top + TITLE_PX / 2 + 1,
        title,
        fit=frame.width - 16,
        color=TEXT,
        fontsize=font_points(12.5),
        fontweight="bold",
        va="center",
    )
    body = Box(frame.left, frame.top + TITLE_PX, frame.width, frame.height - TITLE_PX)
    if kind not in DRAWN_TYPES:
        draw_message(canvas, body, f"({kind or 'untyped'} panel: type not rendered)")
        return PanelStatus(panel.get("id"), title, kind, "not rendered")
    data = fetch(api, dashboard, panel, values, tr)
    status, detail = _chart_status(panel, data)
    if status != "data":
        draw_message(canvas, body, "No data", detail)
    elif kind == "timeseries":
        draw_timeseries(canvas, body, panel, data, tr, marks)
    elif kind == "table":
        draw_table(canvas, body, panel, data)
    else:
        draw_stat(canvas, body, panel, data)
    return PanelStatus(panel.get("id"), title, kind, status, detail)


def _chart_status(panel: Mapping[str, Any], data: PanelData) -> tuple[str, str]:
    if data.has_data():
        return "data", "; ".join(data.errors)
    if data.errors:
        return "error", "; ".join(data.errors)
    if not panel.get("targets"):
        return "no data", "the panel has no queries"
    return "no data", "the queries returned no series"
