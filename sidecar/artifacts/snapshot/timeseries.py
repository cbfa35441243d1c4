"""The time series painter: lines or stacked areas, threshold lines and bands, annotations, axes and legend.

As Grafana's time series panel draws them: one line per series (filled by ``fillOpacity``), stacked
when ``stacking.mode`` is ``normal``; threshold steps as lines and bands when ``thresholdsStyle``
draws them; the y axis in the panel's unit with ticks on round values of it (10 min, not 667 s), or
a log axis (``scaleDistribution``); series an ``axisPlacement: right`` override moves get an axis
of their own; the dashboard's annotations as vertical marks; the legend below, in columns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from .canvas import Canvas, fit_text, font_points
from .colors import GRID_LINE, MUTED, PANEL_BACKGROUND, TEXT
from .data import Mark, PanelData, TimeRange
from .fields import field_custom, field_defaults, override, series_color, threshold_steps
from .layout import Box
from .units import format_value

#: The height of one legend line, and the most lines a legend takes (the rest is summed up as "+N more").
LEGEND_LINE_PX = 13
MAX_LEGEND_LINES = 3


def draw_timeseries(
    canvas: Canvas, box: Box, panel: Mapping[str, Any], data: PanelData, tr: TimeRange, marks: list[Mark]
) -> None:
    """Lines (or stacked areas) over the time range, thresholds, annotations, and a legend below."""
    names = [s.name for s in data.series] if _shows_legend(panel) else []
    shown, ncol, lines = _legend_layout(names, box.width - 12)
    legend_px = lines * LEGEND_LINE_PX + 6 if names else 0
    chart = Box(box.left + 56, box.top + 4, box.width - 76, box.height - legend_px - 24)
    ax = canvas.axes(chart)
    _style_axes(ax)
    stacked = (field_custom(panel).get("stacking") or {}).get("mode") == "normal"
    left, right = _split_by_axis(panel, data)
    handles = _draw_stacked(ax, panel, left) if stacked else _draw_lines(ax, panel, left)
    _y_axis(ax, panel)
    _draw_thresholds(ax, panel)
    _draw_marks(ax, marks)
    margin = _tick_label_width(ax) + 14
    right_margin = 20.0
    twin = None
    if right.series:
        # Grafana's axisPlacement "right" override: those series get an axis of their own on the right
        twin = ax.twinx()
        _style_axes(twin)
        twin.grid(False)
        right_handles = _draw_lines(twin, panel, right, first_color=len(left.series))
        _y_axis(twin, panel)
        right_margin = _tick_label_width(twin) + 14
        # the legend lists the series in query order, whichever axis they are on
        by_series = {id(s): h for s, h in zip([*left.series, *right.series], [*handles, *right_handles], strict=True)}
        handles = [by_series[id(s)] for s in data.series]
    chart = Box(box.left + margin, chart.top, box.width - margin - right_margin, chart.height)
    ax.set_position(canvas.rect(chart))
    if twin is not None:
        twin.set_position(canvas.rect(chart))
    _time_axis(ax, tr, chart.width)
    if not names:
        return
    if len(shown) < len(names):  # the last entry is "+N more"
        handles = [*handles[: len(shown) - 1], _invisible_handle()]
    labels = [fit_text(n, (box.width - 12) / ncol - 22, 10) for n in shown]
    legend_box = Box(box.left + 6, box.top + box.height - legend_px, box.width - 12, legend_px)
    canvas.fig.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=canvas.rect(legend_box),
        ncol=ncol,
        frameon=False,
        fontsize=font_points(10),
        labelcolor=TEXT,
        handlelength=1.2,
        handletextpad=0.4,
        columnspacing=1.2,
        borderaxespad=0,
        borderpad=0.1,
        labelspacing=0.2,
    )


def _invisible_handle() -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=PANEL_BACKGROUND, linewidth=0)


def _style_axes(ax: Any) -> None:
    ax.set_facecolor(PANEL_BACKGROUND)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_color(GRID_LINE)
    ax.tick_params(colors=MUTED, labelsize=font_points(10), length=0, pad=3)
    ax.grid(True, color=GRID_LINE, linewidth=0.6)
    ax.set_axisbelow(True)


def _legend_layout(names: list[str], width: float) -> tuple[list[str], int, int]:
    """The entries shown (the rest summed up as "+N more"), columns, and lines of the legend."""
    longest = max((len(n) for n in names), default=1)
    entry_px = min(longest, 48) * 6 + 22
    ncol = max(1, min(len(names), int(width // entry_px)))
    lines = math.ceil(len(names) / ncol)
    if lines <= MAX_LEGEND_LINES:
        return names, ncol, lines
    keep = ncol * MAX_LEGEND_LINES - 1
    return [*names[:keep], f"+{len(names) - keep} more"], ncol, MAX_LEGEND_LINES


def _time_axis(ax: Any, tr: TimeRange, width: float) -> None:
    from matplotlib import dates

    mdates: Any = dates  # matplotlib.dates is untyped
    span = tr.end - tr.start
    fmt = "%H:%M:%S" if span <= 600 else "%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M"
    locator = mdates.AutoDateLocator(tz=UTC, minticks=3, maxticks=max(3, int(width // 80)))
    low, high = _dates([tr.start, tr.end])
    # no label within half a label of either end, where it would run into the y axis or out of the panel
    margin = span * 40 / max(width, 1)
    inner = _dates([tr.start + margin, tr.end - margin])
    first, last = mdates.date2num(inner[0]), mdates.date2num(inner[1])
    ticks = [t for t in locator.tick_values(low, high) if first <= t <= last]
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=UTC))
    ax.set_xlim(low, high)


def _dates(times: Iterable[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, UTC) for t in times]


def _finite(values: list[float]) -> list[float]:
    return [v if math.isfinite(v) else math.nan for v in values]


def _split_by_axis(panel: Mapping[str, Any], data: PanelData) -> tuple[PanelData, PanelData]:
    """The series of the left axis and those an override puts on the right (``custom.axisPlacement``)."""
    right = [s for s in data.series if override(panel, "custom.axisPlacement", s.name, s.ref_id) == "right"]
    left = [s for s in data.series if all(s is not r for r in right)]
    return PanelData(left), PanelData(right)


def _draw_lines(ax: Any, panel: Mapping[str, Any], data: PanelData, *, first_color: int = 0) -> list[Any]:
    """One line per series (filled when the panel asks); the handles for the legend."""
    custom = field_custom(panel)
    fill = float(custom.get("fillOpacity") or 0) / 100
    width = float(custom.get("lineWidth") or 1) * 1.3
    handles = []
    for i, s in enumerate(data.series, start=first_color):
        color = series_color(panel, s, i)
        x, y = _dates(s.times), _finite(s.values)
        (line,) = ax.plot(x, y, color=color, linewidth=width, marker="o" if len(x) == 1 else None, markersize=3)
        if fill:
            bottom = float(field_defaults(panel).get("min") or 0)  # a log axis starts above 0
            ax.fill_between(x, y, bottom, color=color, alpha=fill, linewidth=0)
        handles.append(line)
    return handles


def _draw_stacked(ax: Any, panel: Mapping[str, Any], data: PanelData) -> list[Any]:
    """Series stacked in order on the union of their timestamps (a missing point counts as 0)."""
    times = sorted({t for s in data.series for t in s.times})
    x = _dates(times)
    base = [0.0] * len(times)
    fill = float(field_custom(panel).get("fillOpacity") or 40) / 100
    handles = []
    for i, s in enumerate(data.series):
        color = series_color(panel, s, i)
        by_time = dict(zip(s.times, _finite(s.values), strict=True))
        top = [
            b + (0.0 if math.isnan(by_time.get(t, math.nan)) else by_time[t]) for b, t in zip(base, times, strict=True)
        ]
        ax.fill_between(x, base, top, color=color, alpha=max(fill, 0.25), linewidth=0)
        (line,) = ax.plot(x, top, color=color, linewidth=1.3)
        handles.append(line)
        base = top
    return handles


def _draw_thresholds(ax: Any, panel: Mapping[str, Any]) -> None:
    """The panel's threshold steps as lines (and bands), when its ``thresholdsStyle`` draws them."""
    mode = (field_custom(panel).get("thresholdsStyle") or {}).get("mode", "off")
    if mode == "off":
        return
    steps = threshold_steps(panel)
    for i, (value, color) in enumerate(steps):
        if value is None:
            # the base step: a band from the axis' bottom to the next step, as Grafana shades it
            upper = next((v for v, _ in steps[i + 1 :] if v is not None), None)
            if "area" in mode and upper is not None and upper > ax.get_ylim()[0]:
                ax.axhspan(ax.get_ylim()[0], upper, color=color, alpha=0.12, linewidth=0)
            continue
        if "line" in mode or "dashed" in mode:
            ax.axhline(value, color=color, linewidth=1.1, linestyle="--" if "dashed" in mode else "-", alpha=0.9)
        if "area" in mode:
            upper = next((v for v, _ in steps[i + 1 :] if v is not None), None)
            ax.axhspan(value, upper if upper is not None else ax.get_ylim()[1], color=color, alpha=0.06, linewidth=0)


def _draw_marks(ax: Any, marks: list[Mark]) -> None:
    for m in marks:
        start, end = _dates([m.start, m.end])
        if m.end > m.start:
            ax.axvspan(start, end, color=m.color, alpha=0.07, linewidth=0)
        ax.axvline(start, color=m.color, linewidth=1.0, linestyle=":", alpha=0.9)


def _tick_scale(unit: str | None, magnitude: float) -> float:
    """The step ticks are rounded in: minutes, hours or days for durations, KiB/MiB/GiB for bytes."""
    if unit == "s":
        return next((f for f in (86400, 3600, 60) if magnitude >= 2 * f), 1)
    if unit == "bytes":
        return next((f for f in (2**40, 2**30, 2**20, 2**10) if magnitude >= f), 1)
    return 1


def _unit_locator(unit: str | None) -> Any:
    """A y-axis locator putting about 4 ticks on round values of the unit (10 min, not 667 s)."""
    from matplotlib.ticker import MaxNLocator

    class UnitLocator(MaxNLocator):
        def tick_values(self, vmin: float, vmax: float) -> Any:
            scale = _tick_scale(unit, max(abs(vmin), abs(vmax)))
            return [t * scale for t in super().tick_values(vmin / scale, vmax / scale)]

    return UnitLocator(nbins=4, steps=[1, 2, 2.5, 3, 5, 10])


#: Round values of a unit for a log axis' ticks (seconds: 1 min, 5 min, 15 min, 1 h, 6 h, 1 day, 1 week).
_LOG_TICKS: dict[str, tuple[float, ...]] = {"s": (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)}


def _y_axis(ax: Any, panel: Mapping[str, Any]) -> None:
    from matplotlib.ticker import FuncFormatter

    defaults = field_defaults(panel)
    unit = defaults.get("unit")
    scale = field_custom(panel).get("scaleDistribution") or {}
    if scale.get("type") == "log" and defaults.get("min") and defaults.get("max"):
        # Grafana's log axis (scaleDistribution log): ticks at the unit's round values within the range
        from matplotlib.ticker import FixedLocator, NullLocator

        low, high = float(defaults["min"]), float(defaults["max"])
        ax.set_yscale("log", base=float(scale.get("log") or 10))
        ticks = [t for t in _LOG_TICKS.get(unit or "", ()) if low <= t <= high] or [low, high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, unit)))
        ax.set_ylim(low, high)
        return
    ax.yaxis.set_major_locator(_unit_locator(unit))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, unit)))
    low, high = ax.get_ylim()
    if defaults.get("min") is not None:
        low = float(defaults["min"])
    if defaults.get("max") is not None:
        high = float(defaults["max"])
    if high > low:
        ax.set_ylim(low, high)


def _shows_legend(panel: Mapping[str, Any]) -> bool:
    """Grafana hides the legend with ``showLegend: false`` (or the older ``displayMode: hidden``)."""
    options = (panel.get("options") or {}).get("legend") or {}
    return options.get("showLegend", True) is not False and options.get("displayMode") != "hidden"


def _tick_label_width(ax: Any) -> float:
    """Pixels the widest y tick label takes at the tick font size (about 0.6 em a glyph)."""
    low, high = ax.get_ylim()
    formatter = ax.yaxis.get_major_formatter()
    ticks = [t for t in ax.yaxis.get_major_locator()() if low <= t <= high]
    longest = max((len(formatter(t, i)) for i, t in enumerate(ticks)), default=4)
    return min(max(longest * 6.0, 24.0), 140.0)
