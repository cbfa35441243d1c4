"""The report's four plots per model, drawn headless with matplotlib to PNG bytes.

What: for one :class:`~sidecar.report.results.ModelReport`, (1) usage over the period (the hottest
pod at each step) with the warning and watermark lines and the ``target_usage`` the advice sizes
for, (2) peak demand against the usable capacity, (3) preemptions per hour as bars, (4) the
hour-of-week heat map (7 rows, Monday first, 24 columns, with a colour bar).

Why this way: the same :class:`~sidecar.report.results.Report` must give the same bytes on every
run (a report committed or attached twice should not differ), so each figure is a
:class:`matplotlib.figure.Figure` bound to its own Agg canvas (no pyplot, no process-wide backend),
drawn at a fixed size, DPI and font (DejaVu Sans, shipped with matplotlib), and saved with the PNG
``Software`` metadata removed (matplotlib writes its version there otherwise, see
``matplotlib.figure.Figure.savefig``'s ``metadata`` argument). The time axis is hours from the
period's start with UTC tick labels, so no local time zone leaks in.

matplotlib is an optional dependency (the ``report`` extra); this module imports it at the top
and :mod:`sidecar.report.render` imports this module only when a format needs plots.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .results import ModelReport, Report

DPI = 100
WIDTH_PX = 1100
HEIGHT_PX = 330
HEATMAP_HEIGHT_PX = 340
FONT = "DejaVu Sans"

# Colours (a light theme that prints well).
INK = "#1d2330"
GRID = "#d9dde5"
USAGE = "#2f6fdf"
DEMAND = "#2f6fdf"
USABLE = "#1b8a5a"
PREEMPT = "#c2452d"
WARNING = "#e0a100"
WATERMARK = "#c2452d"
TARGET = "#1b8a5a"
NO_DATA = "#eceef2"

#: The plots of a model, in the order the report shows them (each one file, ``<model>-<name>.png``).
PLOT_NAMES = ("usage", "demand", "preemptions", "heatmap")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

#: Tick spacings for the time axis, in hours: the first giving at most :data:`MAX_TICKS` ticks wins.
TICK_HOURS = (1 / 12, 0.25, 0.5, 1, 2, 3, 6, 12, 24, 48, 168)
MAX_TICKS = 9

_RC: Any = {  # matplotlib's stubs type rc_context's keys as literals
    "font.family": "sans-serif",
    "font.sans-serif": [FONT],
    "font.size": 10,
    "axes.edgecolor": INK,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "text.color": INK,
    "svg.hashsalt": "kvcache-report",
    "path.simplify": True,
}


def model_plots(report: Report, model: ModelReport) -> dict[str, bytes]:
    """The PNG bytes of ``model``'s plots, by name (:data:`PLOT_NAMES` order)."""
    drawers: dict[str, Callable[[Report, ModelReport, Any], None]] = {
        "usage": _usage,
        "demand": _demand,
        "preemptions": _preemptions,
        "heatmap": _heatmap,
    }
    out = {}
    with matplotlib.rc_context(_RC):
        for name in PLOT_NAMES:
            height = HEATMAP_HEIGHT_PX if name == "heatmap" else HEIGHT_PX
            fig = Figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI, facecolor="white")
            FigureCanvasAgg(fig)  # binds the Agg canvas to this figure only
            drawers[name](report, model, fig)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
            out[name] = buf.getvalue()
    return out


# ----------------------------------------------------------------------------- the four plots


def _usage(report: Report, model: ModelReport, fig: Any) -> None:
    """Usage of the hottest pod at each step, with the warning, watermark and target lines."""
    tl = model.timeline
    ax = _axes(fig, f"{model.model}: KV-cache usage (hottest pod at each step)")
    hours = _hours(len(tl.usage_max_ratio), tl.step_s)
    ax.plot(hours, _floats(tl.usage_max_ratio, 100.0), color=USAGE, linewidth=0.8, label="usage")
    for value, colour, label, style in (
        (report.watermark, WATERMARK, "watermark", "-"),
        (report.warning, WARNING, "warning", "--"),
        (report.target_usage, TARGET, "target usage", ":"),
    ):
        ax.axhline(value * 100.0, color=colour, linewidth=1.3, linestyle=style, label=f"{label} {value:.0%}")
    ax.set_ylim(0, 105)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0f}%"))
    _time_axis(ax, tl.start, len(tl.usage_max_ratio) * tl.step_s)
    ax.legend(loc="lower left", ncol=4, fontsize=9, frameon=True, framealpha=0.9)


def _demand(report: Report, model: ModelReport, fig: Any) -> None:
    """Peak demand (tokens the running requests hold and need) against the usable capacity."""
    tl = model.timeline
    ax = _axes(fig, f"{model.model}: peak demand vs usable capacity (tokens)")
    hours = _hours(len(tl.demand_tokens), tl.step_s)
    ax.plot(hours, _floats(tl.usable_tokens), color=USABLE, linewidth=1.6, label="usable capacity")
    ax.plot(hours, _floats(tl.demand_tokens), color=DEMAND, linewidth=0.8, label="peak demand")
    top = max(_finite(tl.demand_tokens) + _finite(tl.usable_tokens) + [1.0])
    ax.set_ylim(0, top * 1.08)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _short_tokens(v)))
    _time_axis(ax, tl.start, len(tl.demand_tokens) * tl.step_s)
    ax.legend(loc="lower left", ncol=2, fontsize=9, frameon=True, framealpha=0.9)


def _preemptions(report: Report, model: ModelReport, fig: Any) -> None:
    """Preemptions per hour as bars (one bar per hour of the period)."""
    tl = model.timeline
    ax = _axes(fig, f"{model.model}: preemptions per hour")
    counts = [c if math.isfinite(c) else 0.0 for c in tl.preemptions_per_hour]
    ax.bar([i + 0.5 for i in range(len(counts))], counts, width=0.9, color=PREEMPT, linewidth=0)
    ax.set_ylim(0, max(counts + [1.0]) * 1.1)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    if not any(counts):
        ax.text(0.5, 0.5, "no preemptions", transform=ax.transAxes, ha="center", va="center", color="#6b7280")
    _time_axis(ax, tl.start, max(len(counts), 1) * 3600.0)


def _heatmap(report: Report, model: ModelReport, fig: Any) -> None:
    """Peak usage by hour of the week (UTC): 7 rows, Monday first, 24 columns, with a colour bar."""
    import numpy as np
    from matplotlib import colormaps

    grid = model.timeline.hour_of_week_peak_ratio
    values = np.full((7, 24), np.nan)
    for day, row in enumerate(grid[:7]):
        for hour, v in enumerate(row[:24]):
            if v is not None and math.isfinite(v):
                values[day, hour] = v * 100.0
    cmap = colormaps["YlOrRd"].with_extremes(bad=NO_DATA)
    ax = fig.add_axes((0.07, 0.14, 0.80, 0.72))
    ax.set_title(f"{model.model}: peak usage by hour of week (UTC)", loc="left", fontsize=12, fontweight="bold")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=100, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(7), DAYS)
    ax.set_xticks(range(0, 24, 2), [f"{h:02d}" for h in range(0, 24, 2)])
    ax.set_xlabel("hour (UTC)")
    ax.set_xticks([x - 0.5 for x in range(25)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(8)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.2)
    ax.tick_params(which="minor", length=0)
    bar = fig.colorbar(image, cax=fig.add_axes((0.89, 0.14, 0.018, 0.72)))
    bar.set_label("peak usage")
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0f}%"))


# ----------------------------------------------------------------------------- helpers


def _axes(fig: Any, title: str) -> Any:
    ax = fig.add_axes((0.07, 0.16, 0.88, 0.72))  # room for the last tick label
    ax.set_title(title, loc="left", fontsize=12, fontweight="bold")
    ax.grid(True, color=GRID, linewidth=0.7)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def _hours(n: int, step_s: float) -> list[float]:
    """The x of each step: hours from the period's start (the step's start)."""
    return [i * step_s / 3600.0 for i in range(n)]


def _floats(values: Sequence[float | None], scale: float = 1.0) -> list[float]:
    """None (no data) as NaN, which matplotlib draws as a gap."""
    return [math.nan if v is None else v * scale for v in values]


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _time_axis(ax: Any, start: float, seconds: float) -> None:
    """Ticks at round UTC times (midnights for a week) labelled with the weekday and date or the time."""
    span_h = max(seconds / 3600.0, 1 / 60)
    every = next((h for h in TICK_HOURS if span_h / h <= MAX_TICKS), TICK_HOURS[-1])
    step_s = every * 3600.0
    first = math.ceil(start / step_s) * step_s
    ticks, labels = [], []
    t = first
    while t <= start + seconds + 1e-6:
        ticks.append((t - start) / 3600.0)
        labels.append(_tick_label(t, every))
        t += step_s
    ax.set_xlim(0, span_h)
    ax.set_xticks(ticks, labels)


def _tick_label(t: float, every_h: float) -> str:
    when = datetime.fromtimestamp(t, UTC)
    if every_h >= 24:
        return when.strftime("%a %d %b")
    if when.hour == 0 and when.minute == 0:
        return when.strftime("%a %d\n%H:%M")
    return when.strftime("%H:%M")


def _short_tokens(v: float) -> str:
    """An axis label: 1.2M, 350k, 900."""
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}"
