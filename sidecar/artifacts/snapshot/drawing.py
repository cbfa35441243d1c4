"""The other painters: a stat's big value, a table's rows, a row's header, "No data", and the picture's header
and footer (title, variables, time range, step and the annotations found).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..panels import ALL
from .canvas import Canvas, font_points
from .colors import MUTED, NO_DATA, PANEL_BORDER, TEXT
from .data import PanelData, TimeRange
from .fields import field_defaults, mapped_text, threshold_color
from .layout import FOOTER_PX, Box
from .table import table_rows
from .units import format_value, utc

#: The height of one table row (10.5 px text and its spacing).
TABLE_ROW_PX = 16


def draw_stat(canvas: Canvas, box: Box, panel: Mapping[str, Any], data: PanelData) -> None:
    """The last value of each series (up to 6), big, in the panel's unit and its threshold colour."""
    values = [(s.name, v) for s in data.series if (v := s.last()) is not None][:6]
    cols = min(len(values), 3 if box.width < 600 else 6)
    rows = math.ceil(len(values) / cols)
    cell_w, cell_h = box.width / cols, box.height / rows
    for i, (name, value) in enumerate(values):
        cell = Box(box.left + (i % cols) * cell_w, box.top + (i // cols) * cell_h, cell_w, cell_h)
        _draw_stat_value(canvas, cell, panel, value, name if len(values) > 1 else None)


def _draw_stat_value(canvas: Canvas, cell: Box, panel: Mapping[str, Any], value: float, name: str | None) -> None:
    """One value, as large as fits; the series name above it when the panel shows several."""
    defaults = field_defaults(panel)
    color = threshold_color(panel, value)
    background = (panel.get("options") or {}).get("colorMode") == "background"
    if background:
        canvas.fill(Box(cell.left + 4, cell.top + 2, cell.width - 8, cell.height - 6), color, alpha=0.85)
    label_px = 12 if name else 0
    big = canvas.text(
        cell.left + cell.width / 2,
        cell.top + (cell.height + label_px) / 2,
        mapped_text(defaults.get("mappings"), value)
        or format_value(value, defaults.get("unit"), defaults.get("decimals")),
        color="white" if background else color,
        fontsize=font_points(min((cell.height - label_px) * 0.55, 64)),
        fontweight="bold",
        ha="center",
        va="center",
    )
    canvas.shrink_to(big, cell.width * 0.8)
    if name:
        canvas.text(
            cell.left + cell.width / 2,
            cell.top + 8,
            name,
            fit=cell.width - 8,
            color=TEXT,
            fontsize=font_points(10),
            ha="center",
            va="center",
        )


def draw_table(canvas: Canvas, box: Box, panel: Mapping[str, Any], data: PanelData) -> None:
    """A small text table: a header, then as many rows as fit (and how many did not)."""
    columns, rows = table_rows(panel, data)
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    total = sum(min(w, 40) + 2 for w in widths) or 1
    col_px = [(min(w, 40) + 2) / total * (box.width - 12) for w in widths]
    fit = max(1, int((box.height - TABLE_ROW_PX - 6) // TABLE_ROW_PX))
    more = len(rows) - fit if len(rows) > fit else 0
    visible = rows[: fit - 1] if more else rows
    y = box.top + TABLE_ROW_PX / 2
    for cells, style in [(columns, "header"), *((r, "row") for r in visible)]:
        x = box.left + 6
        for cell, w in zip(cells, col_px, strict=True):
            canvas.text(
                x,
                y,
                cell,
                fit=w - 6,
                color=MUTED if style == "header" else TEXT,
                fontsize=font_points(10.5),
                fontweight="bold" if style == "header" else "normal",
                va="center",
            )
            x += w
        y += TABLE_ROW_PX
    if more:
        canvas.text(box.left + 6, y, f"… {more + 1} more rows", color=MUTED, fontsize=font_points(10), va="center")


def draw_message(canvas: Canvas, box: Box, text: str, detail: str = "") -> None:
    cx, cy = box.left + box.width / 2, box.top + box.height / 2
    canvas.text(cx, cy, text, color=NO_DATA, fontsize=font_points(15), ha="center", va="center")
    if detail:
        canvas.text(
            cx,
            cy + 20,
            detail,
            fit=box.width - 16,
            color=NO_DATA,
            fontsize=font_points(10),
            ha="center",
            va="center",
        )


def draw_row(canvas: Canvas, frame: Box, panel: Mapping[str, Any]) -> None:
    y = frame.top + frame.height / 2
    canvas.text(
        frame.left + 2, y, panel.get("title", ""), color=TEXT, fontsize=font_points(16), fontweight="bold", va="center"
    )
    line = canvas.axes(Box(frame.left, frame.top + frame.height - 1, frame.width, 1))
    line.set_axis_off()
    line.axhline(0.5, color=PANEL_BORDER, linewidth=1)


def _shown(value: Any) -> str:
    values = [value] if isinstance(value, str) else list(value)
    return "All" if ALL in values else ", ".join(values) or "(none)"


def draw_header_and_footer(
    canvas: Canvas,
    dashboard: Mapping[str, Any],
    values: Mapping[str, Any],
    tr: TimeRange,
    annotations: Mapping[str, str],
) -> None:
    """The dashboard title with the variables' values (Grafana's variable bar) and the time range at the
    top; a footer with title, uid, range, step and the annotations found."""
    var_text = "    ".join(f"{name}: {_shown(v)}" for name, v in values.items())
    canvas.text(
        10, 22, dashboard.get("title", ""), color=TEXT, fontsize=font_points(22), fontweight="bold", va="center"
    )
    canvas.text(10, 48, var_text, color=MUTED, fontsize=font_points(12.5), va="center")
    span = f"{utc(tr.start)} to {utc(tr.end)} UTC"
    canvas.text(canvas.width - 10, 22, span, color=TEXT, fontsize=font_points(12.5), ha="right", va="center")
    parts = [
        dashboard.get("title", ""),
        f"uid {dashboard.get('uid', '')}",
        span,
        f"step {tr.step:g}s",
        *(f"{name}={_shown(v)}" for name, v in values.items()),
    ]
    if annotations:
        parts.append("annotations: " + ", ".join(f"{n} ({o})" for n, o in annotations.items()))
    footer = " · ".join(parts)
    y = canvas.height - FOOTER_PX / 2
    canvas.text(10, y, footer, fit=canvas.width - 20, color=MUTED, fontsize=font_points(11), va="center")
