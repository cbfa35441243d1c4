"""Draw a Grafana dashboard as one PNG from a real Prometheus: ``kv-sidecar dashboards snapshot``.

No Grafana runs here (nor in CI), so this is how a person looks at what the dashboards show:
every panel is queried as Grafana would query it (:mod:`.panels`: the same variables, the same
``$__interval``/``$__rate_interval``/``$__range``) and drawn with matplotlib where Grafana would
put it on its 24-column grid, in a dark, Grafana-like look:

- ``row`` panels are section headers; the panels of a collapsed row are drawn expanded below it,
  and everything further down moves down to make room (what Grafana does when a row is opened);
- ``timeseries``: one line per series, the legend from the target's ``legendFormat``, stacked when
  the panel stacks, threshold lines when the panel draws them, the y axis in the panel's unit (a
  second one on the right for the series an ``axisPlacement: right`` override puts there), and
  the dashboard's annotations (restarts, configuration changes, alerts) as vertical marks;
- ``stat``: the last value, in the panel's unit, coloured by its thresholds;
- ``table``: the first rows of the instant results, one column per label and per query value
  (the ``merge``, ``convertFieldType``, ``filterFieldsByName`` and ``organize`` transformations);
- any other type: its title and "(type not rendered)".

A query that fails or returns nothing draws "no data" in its panel (with the reason), so the picture
shows the gap; :class:`Snapshot` also records each panel's outcome for tests. matplotlib is an
optional dependency (the ``dashboards`` extra): it is imported inside the drawing functions only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..units import parse_duration
from .panels import ALL, PrometheusAPI, PrometheusError, interpolate, variables, walk_panels

# --- geometry (pixels at DPI) -------------------------------------------------------------------

DPI = 100
GRID_COLUMNS = 24
COLUMN_PX = 75  # 24 columns -> 1800 px wide
ROW_PX = 30  # one gridPos height unit (Grafana: 30 px plus margins)
GAP_PX = 4  # space around each panel
HEADER_PX = 64
FOOTER_PX = 34
TITLE_PX = 24  # the title band of a panel
LEGEND_LINE_PX = 13
MAX_LEGEND_LINES = 3
TABLE_ROW_PX = 16

#: Panel types drawn from their queries (a gauge is drawn as a stat); any other shows its type.
DRAWN_TYPES = ("timeseries", "stat", "gauge", "table")

#: Grafana's default scrape interval for a Prometheus data source: the floor of ``$__rate_interval``.
GRAFANA_SCRAPE_INTERVAL = 15.0
#: Without an explicit step, about one point per 3 px of a full-width panel.
POINTS_PER_RANGE = 600

# --- colours (Grafana's dark theme) -------------------------------------------------------------

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


# --- units --------------------------------------------------------------------------------------

_SI = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_IEC = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_DECIMAL_BYTES = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def _number(v: float, decimals: int | None) -> str:
    if decimals is not None:
        return f"{v:.{decimals}f}"
    a = abs(v)
    if a == 0 or a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    if a >= 0.01:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"


def _scaled(v: float, scales: Sequence[tuple[float, str]], suffix_sep: str, decimals: int | None) -> str:
    for factor, suffix in scales:
        if abs(v) >= factor:
            return f"{_number(v / factor, decimals)}{suffix_sep}{suffix}"
    return _number(v, decimals)


def _seconds(v: float, decimals: int | None) -> str:
    a = abs(v)
    if a == 0:
        return "0 s"
    for factor, suffix in ((86400 * 365, "year"), (86400 * 7, "week"), (86400, "day"), (3600, "hour")):
        if a >= factor:
            n = v / factor
            return f"{_number(n, decimals)} {suffix}{'' if abs(n) == 1 else 's'}"
    if a >= 60:
        return f"{_number(v / 60, decimals)} min"
    if a >= 1:
        return f"{_number(v, decimals)} s"
    if a >= 0.001:
        return f"{_number(v * 1000, decimals)} ms"
    return f"{_number(v * 1e6, decimals)} µs"


def format_value(v: float, unit: str | None, decimals: int | None = None) -> str:
    """``v`` as Grafana displays it in ``unit`` (the units our dashboards use, and a few more)."""
    if v is None or math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    unit = unit or "short"
    simple = {
        "percentunit": lambda: f"{_number(v * 100, decimals)}%",
        "percent": lambda: f"{_number(v, decimals)}%",
        "s": lambda: _seconds(v, decimals),
        "ms": lambda: _seconds(v / 1000, decimals),
        "m": lambda: _seconds(v * 60, decimals),
        "h": lambda: _seconds(v * 3600, decimals),
        "d": lambda: _seconds(v * 86400, decimals),
        "bytes": lambda: _scaled(v, _IEC, " ", decimals) + ("" if abs(v) >= 1024 else " B"),
        "decbytes": lambda: _scaled(v, _DECIMAL_BYTES, " ", decimals) + ("" if abs(v) >= 1000 else " B"),
        "reqps": lambda: _scaled(v, _SI, " ", decimals) + " req/s",
        "ops": lambda: _scaled(v, _SI, " ", decimals) + " ops/s",
        "none": lambda: _number(v, decimals),
        "dateTimeAsIso": lambda: datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%d %H:%M:%S"),
    }
    if unit in simple:
        return simple[unit]()
    # Grafana's custom units: "suffix:<text>" and "prefix:<text>" verbatim, "si:<unit>" scaled
    if unit.startswith("suffix:"):
        return f"{_number(v, decimals)}{unit[len('suffix:') :]}"
    if unit.startswith("prefix:"):
        return f"{unit[len('prefix:') :]}{_number(v, decimals)}"
    if unit.startswith("si:"):
        return f"{_scaled(v, _SI, ' ', decimals)}{unit[len('si:') :]}"
    if unit == "short":
        return _scaled(v, _SI, " ", decimals)
    # an unknown unit: the number, and the unit's own name as a suffix (Grafana's custom units)
    return f"{_scaled(v, _SI, ' ', decimals)} {unit}"


# --- the dashboard's layout ---------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A panel and where it is drawn, in grid units (``y`` after expanding collapsed rows)."""

    panel: dict[str, Any]
    x: int
    y: int
    w: int
    h: int


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


# --- querying -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeRange:
    """The dashboard's time range, its query step and the interval macros Grafana derives from them."""

    start: float
    end: float
    step: float

    @classmethod
    def of(cls, start: float, end: float, step: float | None) -> TimeRange:
        if end <= start:
            raise ValueError(f"empty time range: start {start} is not before end {end}")
        return cls(start, end, step if step else max(1.0, round((end - start) / POINTS_PER_RANGE)))

    def macros(self) -> dict[str, str]:
        """``interpolate``'s keyword arguments: Grafana's ``$__interval`` (the step),
        ``$__rate_interval`` (max(interval + scrape interval, 4 x scrape interval)) and ``$__range``."""
        rate = max(self.step + GRAFANA_SCRAPE_INTERVAL, 4 * GRAFANA_SCRAPE_INTERVAL)
        return {
            "interval": f"{int(math.ceil(self.step))}s",
            "rate_interval": f"{int(math.ceil(rate))}s",
            "range_": f"{int(math.ceil(self.end - self.start))}s",
        }


@dataclass
class Series:
    """One series of a panel: its legend, its labels, the query it came from and its points."""

    name: str
    labels: dict[str, str]
    ref_id: str
    times: list[float]
    values: list[float]

    def last(self) -> float | None:
        """The last value that is a number (Grafana's "Last *" reduction), None without one."""
        for v in reversed(self.values):
            if not math.isnan(v):
                return v
        return None


@dataclass
class PanelData:
    """What a panel's targets returned, and the errors of those that failed."""

    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def has_data(self) -> bool:
        return any(s.last() is not None for s in self.series)


def legend(fmt: str | None, labels: Mapping[str, str]) -> str:
    """Grafana's legend: ``{{label}}`` substituted; without a format, ``name{label="v", ...}``."""
    if fmt and fmt != "__auto":
        return re.sub(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    name = labels.get("__name__", "")
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{inner}}}" if inner or not name else name or "value"


def _as_float(text: str) -> float:
    return float(text)  # Prometheus sends "NaN", "+Inf" and "-Inf", which float() reads


def fetch(
    api: PrometheusAPI,
    dashboard: Mapping[str, Any],
    panel: Mapping[str, Any],
    values: Mapping[str, Any],
    tr: TimeRange,
) -> PanelData:
    """Run every target of ``panel``: an instant query at the end of the range when the target asks
    for one (and for tables, which show the current state), else a range query."""
    data = PanelData()
    instant_panel = panel.get("type") == "table"
    for target in panel.get("targets", []):
        if target.get("hide") or not target.get("expr"):
            continue
        expr = interpolate(target["expr"], values, dashboard=dashboard, **tr.macros())
        ref = target.get("refId", "")
        instant = instant_panel or (bool(target.get("instant")) and not target.get("range"))
        try:
            if instant:
                result = api.query(expr, at=tr.end)
                points = [(r["metric"], [r["value"]]) for r in result]
            else:
                result = api.query_range(expr, tr.start, tr.end, tr.step)
                points = [(r["metric"], r["values"]) for r in result]
        except PrometheusError as e:
            data.errors.append(f"{ref}: {e}")
            continue
        for labels, samples in points:
            data.series.append(
                Series(
                    legend(target.get("legendFormat"), labels),
                    dict(labels),
                    ref,
                    [float(t) for t, _ in samples],
                    [_as_float(v) for _, v in samples],
                )
            )
    return data


@dataclass(frozen=True)
class Mark:
    """An annotation to draw on the time series: a point or a region of the time axis."""

    name: str
    start: float
    end: float
    color: str


def fetch_annotations(
    api: PrometheusAPI, dashboard: Mapping[str, Any], values: Mapping[str, Any], tr: TimeRange
) -> tuple[list[Mark], dict[str, str]]:
    """The dashboard's enabled Prometheus annotations as marks, and each one's outcome.

    Grafana's Prometheus annotations: an event wherever the series has a value; consecutive steps
    join into one region.
    """
    marks: list[Mark] = []
    outcome: dict[str, str] = {}
    for ann in dashboard.get("annotations", {}).get("list", []):
        if not ann.get("expr") or ann.get("enable") is False:
            continue
        name = ann.get("name", "annotation")
        expr = interpolate(ann["expr"], values, dashboard=dashboard, **tr.macros())
        try:
            result = api.query_range(expr, tr.start, tr.end, tr.step)
        except PrometheusError as e:
            outcome[name] = f"error: {e}"
            continue
        found = [m for r in result for m in _regions(name, [float(t) for t, _ in r["values"]], ann, tr.step)]
        marks.extend(found)
        outcome[name] = f"{len(found)} event{'s' if len(found) != 1 else ''}"
    return marks, outcome


def _regions(name: str, times: list[float], ann: Mapping[str, Any], step: float) -> list[Mark]:
    color = grafana_color(ann.get("iconColor"), "#FF9830")
    out: list[Mark] = []
    for t in sorted(times):
        if out and t - out[-1].end <= step * 1.5:
            out[-1] = Mark(name, out[-1].start, t, color)
        else:
            out.append(Mark(name, t, t, color))
    return out


def variable_values(dashboard: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The value of every query/custom variable: as given, else its saved current value, else All."""
    out: dict[str, Any] = {}
    for name, var in variables(dashboard).items():
        if var.get("type") in ("datasource", "constant", "interval", "textbox") and name not in given:
            continue
        if name in given:
            out[name] = given[name]
            continue
        current = (var.get("current") or {}).get("value")
        out[name] = current if current not in (None, "", []) else ALL
    return {**out, **{k: v for k, v in given.items() if k not in out}}


# --- drawing ------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Box:
    """A rectangle in figure pixels, origin at the top left."""

    left: float
    top: float
    width: float
    height: float


class Canvas:
    """A matplotlib figure addressed in pixels from the top left, as Grafana lays out panels."""

    def __init__(self, width: float, height: float) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.width, self.height = width, height
        self.fig: Any = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor=BACKGROUND)
        # the Agg backend, bound to this figure only (no pyplot, no process-wide backend switch)
        agg: Any = FigureCanvasAgg(self.fig)
        self.renderer = agg.get_renderer()

    def rect(self, box: Box) -> list[float]:
        """``box`` in figure fractions ``[left, bottom, width, height]``."""
        return [
            box.left / self.width,
            1 - (box.top + box.height) / self.height,
            box.width / self.width,
            box.height / self.height,
        ]

    def axes(self, box: Box, **kwargs: Any) -> Any:
        return self.fig.add_axes(self.rect(box), **kwargs)

    def text(self, x: float, y: float, s: str, *, fit: float | None = None, **kwargs: Any) -> Any:
        """Text at pixel (x, y) from the top left; cut with an ellipsis to ``fit`` pixels wide when given."""
        text = self.fig.text(x / self.width, 1 - y / self.height, s, **kwargs)
        if fit is not None:
            width = text.get_window_extent(renderer=self.renderer).width
            while width > fit and len(s) > 1:
                s = s[: max(1, min(len(s) - 1, int(len(s) * fit / width) - 1))]
                text.set_text(s + "…")
                width = text.get_window_extent(renderer=self.renderer).width
        return text

    def shrink_to(self, text: Any, width: float) -> None:
        """Make ``text``'s font smaller until it is at most ``width`` pixels wide."""
        extent = text.get_window_extent(renderer=self.renderer).width
        if extent > width:
            text.set_fontsize(text.get_fontsize() * width / extent)

    def fill(self, box: Box, color: str, *, edge: str | None = None, alpha: float = 1.0) -> None:
        """A filled rectangle behind everything drawn on axes."""
        from matplotlib.patches import Rectangle

        left, bottom, width, height = self.rect(box)
        self.fig.patches.append(
            Rectangle(
                (left, bottom),
                width,
                height,
                transform=self.fig.transFigure,
                facecolor=color,
                edgecolor=edge or color,
                linewidth=0.8,
                alpha=alpha,
                zorder=-10,  # under the axes (zorder 0) drawn on it
            )
        )

    def save(self, out: Path) -> None:
        """Write the PNG atomically: a temporary file in the same directory, then a rename."""
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                self.fig.savefig(f, format="png", dpi=DPI, facecolor=BACKGROUND)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _fit(text: str, width_px: float, font_px: float) -> str:
    """``text`` shortened with an ellipsis to about ``width_px`` at ``font_px`` (average glyph 0.58 em)."""
    room = max(1, int(width_px / (font_px * 0.58)))
    return text if len(text) <= room else text[: max(1, room - 1)] + "…"


def _pt(px: float) -> float:
    """A font size in points for ``px`` pixels at :data:`DPI`."""
    return px * 72 / DPI


def _defaults(panel: Mapping[str, Any]) -> dict[str, Any]:
    return (panel.get("fieldConfig") or {}).get("defaults") or {}


def _custom(panel: Mapping[str, Any]) -> dict[str, Any]:
    return _defaults(panel).get("custom") or {}


def _threshold_steps(panel: Mapping[str, Any]) -> list[tuple[float | None, str]]:
    steps = (_defaults(panel).get("thresholds") or {}).get("steps") or []
    return [(s.get("value"), grafana_color(s.get("color"), NAMED_COLORS["green"])) for s in steps]


def threshold_color(panel: Mapping[str, Any], v: float | None) -> str:
    """The colour of the threshold step ``v`` falls in (Grafana: the last step at or below it)."""
    color = NAMED_COLORS["green"]
    if v is None:
        return NO_DATA
    for value, step_color in _threshold_steps(panel):
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
    color = override(panel, "color", s.name, s.ref_id) or _defaults(panel).get("color") or {}
    if color.get("mode") == "fixed" and color.get("fixedColor"):
        return grafana_color(color["fixedColor"])
    return PALETTE[index % len(PALETTE)]


def _message(canvas: Canvas, box: Box, text: str, detail: str = "") -> None:
    cx, cy = box.left + box.width / 2, box.top + box.height / 2
    canvas.text(cx, cy, text, color=NO_DATA, fontsize=_pt(15), ha="center", va="center")
    if detail:
        canvas.text(
            cx,
            cy + 20,
            detail,
            fit=box.width - 16,
            color=NO_DATA,
            fontsize=_pt(10),
            ha="center",
            va="center",
        )


def _style_axes(ax: Any) -> None:
    ax.set_facecolor(PANEL_BACKGROUND)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_color(GRID_LINE)
    ax.tick_params(colors=MUTED, labelsize=_pt(10), length=0, pad=3)
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
    custom = _custom(panel)
    fill = float(custom.get("fillOpacity") or 0) / 100
    width = float(custom.get("lineWidth") or 1) * 1.3
    handles = []
    for i, s in enumerate(data.series, start=first_color):
        color = series_color(panel, s, i)
        x, y = _dates(s.times), _finite(s.values)
        (line,) = ax.plot(x, y, color=color, linewidth=width, marker="o" if len(x) == 1 else None, markersize=3)
        if fill:
            bottom = float(_defaults(panel).get("min") or 0)  # a log axis starts above 0
            ax.fill_between(x, y, bottom, color=color, alpha=fill, linewidth=0)
        handles.append(line)
    return handles


def _or_zero(v: float) -> float:
    return 0.0 if math.isnan(v) else v


def _draw_stacked(ax: Any, panel: Mapping[str, Any], data: PanelData) -> list[Any]:
    """Series stacked in order on the union of their timestamps (a missing point counts as 0)."""
    times = sorted({t for s in data.series for t in s.times})
    x = _dates(times)
    base = [0.0] * len(times)
    fill = float(_custom(panel).get("fillOpacity") or 40) / 100
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
    mode = (_custom(panel).get("thresholdsStyle") or {}).get("mode", "off")
    if mode == "off":
        return
    steps = _threshold_steps(panel)
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

    defaults = _defaults(panel)
    unit = defaults.get("unit")
    scale = _custom(panel).get("scaleDistribution") or {}
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
    stacked = (_custom(panel).get("stacking") or {}).get("mode") == "normal"
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
    labels = [_fit(n, (box.width - 12) / ncol - 22, 10) for n in shown]
    legend_box = Box(box.left + 6, box.top + box.height - legend_px, box.width - 12, legend_px)
    canvas.fig.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=canvas.rect(legend_box),
        ncol=ncol,
        frameon=False,
        fontsize=_pt(10),
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
    defaults = _defaults(panel)
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
        fontsize=_pt(min((cell.height - label_px) * 0.55, 64)),
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
            fontsize=_pt(10),
            ha="center",
            va="center",
        )


def _transformation(panel: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The options of the panel's first transformation ``kind`` (``merge``, ``organize``, ...), else None."""
    for t in panel.get("transformations") or []:
        if t.get("id") == kind and not t.get("disabled"):
            return t.get("options") or {}
    return None


def _table_records(panel: Mapping[str, Any], data: PanelData) -> list[dict[str, Any]]:
    """One record per row as Grafana's table builds it from instant results in table format.

    Each query is a frame of rows ``Time``, its labels, and ``Value`` (``Value #<refId>`` when the
    panel has several queries). The ``merge`` transformation joins the frames' rows on the labels
    they share; without it the table shows the first query's frame.
    """
    refs = [t.get("refId", "") for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]
    merge = _transformation(panel, "merge") is not None
    records: list[dict[str, Any]] = []
    for s in data.series:
        if not merge and refs and s.ref_id != refs[0]:
            continue
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        value_field = f"Value #{s.ref_id}" if len(refs) > 1 else "Value"
        record = {"Time": s.times[-1] if s.times else None, **labels, value_field: s.last()}
        into = next((r for r in records if merge and _joins(r, labels, value_field)), None)
        if into is None:
            records.append(record)
        else:
            into.update(record)
    return _to_numbers(panel, records)


def _to_numbers(panel: Mapping[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Grafana's ``convertFieldType`` to ``number``: a label such as ``gpu_memory_utilization="0.9"`` becomes
    0.9, so the column's unit applies; a text that is no number becomes empty (Grafana: null)."""
    conversions = (_transformation(panel, "convertFieldType") or {}).get("conversions") or []
    for conversion in conversions:
        name = conversion.get("targetField")
        if conversion.get("destinationType") != "number" or not name:
            continue
        for record in records:
            value = record.get(name)
            if isinstance(value, str):
                try:
                    record[name] = float(value)
                except ValueError:
                    record[name] = None
    return records


def _joins(row: Mapping[str, Any], labels: Mapping[str, str], value_field: str) -> bool:
    shared = [k for k in labels if k in row]
    return value_field not in row and bool(shared) and all(row[k] == labels[k] for k in shared)


def _table_fields(panel: Mapping[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """The fields shown, in order: Time, the labels (sorted), the values; then ``filterFieldsByName``
    and ``organize`` (exclude, order)."""
    seen = {k for r in records for k in r}
    values = sorted(k for k in seen if k == "Value" or k.startswith("Value #"))
    fields = [*(["Time"] if "Time" in seen else []), *sorted(seen - {"Time", *values}), *values]
    keep = _transformation(panel, "filterFieldsByName")
    if keep is not None:
        include = (keep.get("include") or {}).get("names")
        pattern = (keep.get("include") or {}).get("pattern")
        exclude = set((keep.get("exclude") or {}).get("names") or [])
        fields = [
            f
            for f in fields
            if (include is None or f in include) and (pattern is None or re.fullmatch(pattern, f)) and f not in exclude
        ]
    organize = _transformation(panel, "organize") or {}
    hidden = organize.get("excludeByName") or {}
    order = organize.get("indexByName") or {}
    fields = [f for f in fields if not hidden.get(f)]
    return sorted(fields, key=lambda f: order.get(f, 1000 + fields.index(f)))


def _cell(panel: Mapping[str, Any], field_name: str, shown_name: str, v: Any) -> str:
    if field_name == "Time" and isinstance(v, float):
        return _utc(v)
    mappings = override(panel, "mappings", shown_name) or override(panel, "mappings", field_name)
    mappings = mappings or _defaults(panel).get("mappings")
    if isinstance(v, float):
        unit = (
            override(panel, "unit", shown_name) or override(panel, "unit", field_name) or _defaults(panel).get("unit")
        )
        return mapped_text(mappings, v) or format_value(v, unit, _defaults(panel).get("decimals"))
    if isinstance(v, str):
        return mapped_text(mappings, v) or v
    return ""


def table_rows(panel: Mapping[str, Any], data: PanelData) -> tuple[list[str], list[list[str]]]:
    """Column headers and cell texts as Grafana's table shows the panel's instant results: frames per
    query (joined by ``merge``), fields picked by ``filterFieldsByName``, ordered and renamed by
    ``organize``, sorted by the panel's ``sortBy``, values in the unit of the column's override."""
    records = _table_records(panel, data)
    fields = _table_fields(panel, records)
    rename = (_transformation(panel, "organize") or {}).get("renameByName") or {}
    shown = [rename.get(f) or f for f in fields]
    for sort in reversed((panel.get("options") or {}).get("sortBy") or []):
        if sort.get("displayName") in shown:
            _sort_by(records, fields[shown.index(sort["displayName"])], bool(sort.get("desc")))
    rows = [[_cell(panel, f, n, r.get(f)) for f, n in zip(fields, shown, strict=True)] for r in records]
    return shown, rows


def _sort_by(records: list[dict[str, Any]], field_name: str, desc: bool) -> None:
    """Sort in place by one field: numbers by value, after (or, descending, before) the rest."""

    def key(record: Mapping[str, Any]) -> tuple[int, float, str]:
        v = record.get(field_name)
        if isinstance(v, float) and not math.isnan(v):
            return (1, v, "")
        return (0, 0.0, "" if v is None else str(v))

    records.sort(key=key, reverse=desc)


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
                fontsize=_pt(10.5),
                fontweight="bold" if style == "header" else "normal",
                va="center",
            )
            x += w
        y += TABLE_ROW_PX
    if more:
        canvas.text(box.left + 6, y, f"… {more + 1} more rows", color=MUTED, fontsize=_pt(10), va="center")


def _chart_status(panel: Mapping[str, Any], data: PanelData) -> tuple[str, str]:
    if data.has_data():
        return "data", "; ".join(data.errors)
    if data.errors:
        return "error", "; ".join(data.errors)
    if not panel.get("targets"):
        return "no data", "the panel has no queries"
    return "no data", "the queries returned no series"


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
    frame = Box(
        place.x * COLUMN_PX + GAP_PX,
        HEADER_PX + place.y * ROW_PX + GAP_PX,
        place.w * COLUMN_PX - 2 * GAP_PX,
        place.h * ROW_PX - 2 * GAP_PX,
    )
    if kind == "row":
        _draw_row(canvas, frame, panel)
        return PanelStatus(panel.get("id"), title, kind, "row")
    canvas.fill(frame, PANEL_BACKGROUND, edge=PANEL_BORDER)
    canvas.text(
        frame.left + 8,
        frame.top + TITLE_PX / 2 + 1,
        title,
        fit=frame.width - 16,
        color=TEXT,
        fontsize=_pt(12.5),
        fontweight="bold",
        va="center",
    )
    body = Box(frame.left, frame.top + TITLE_PX, frame.width, frame.height - TITLE_PX)
    if kind not in DRAWN_TYPES:
        _message(canvas, body, f"({kind or 'untyped'} panel: type not rendered)")
        return PanelStatus(panel.get("id"), title, kind, "not rendered")
    data = fetch(api, dashboard, panel, values, tr)
    status, detail = _chart_status(panel, data)
    if status != "data":
        _message(canvas, body, "No data", detail)
    elif kind == "timeseries":
        draw_timeseries(canvas, body, panel, data, tr, marks)
    elif kind == "table":
        draw_table(canvas, body, panel, data)
    else:
        draw_stat(canvas, body, panel, data)
    return PanelStatus(panel.get("id"), title, kind, status, detail)


def _draw_row(canvas: Canvas, frame: Box, panel: Mapping[str, Any]) -> None:
    y = frame.top + frame.height / 2
    canvas.text(frame.left + 2, y, panel.get("title", ""), color=TEXT, fontsize=_pt(16), fontweight="bold", va="center")
    line = canvas.axes(Box(frame.left, frame.top + frame.height - 1, frame.width, 1))
    line.set_axis_off()
    line.axhline(0.5, color=PANEL_BORDER, linewidth=1)


def _shown(value: Any) -> str:
    values = [value] if isinstance(value, str) else list(value)
    return "All" if ALL in values else ", ".join(values) or "(none)"


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


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
    canvas.text(10, 22, dashboard.get("title", ""), color=TEXT, fontsize=_pt(22), fontweight="bold", va="center")
    canvas.text(10, 48, var_text, color=MUTED, fontsize=_pt(12.5), va="center")
    span = f"{_utc(tr.start)} to {_utc(tr.end)} UTC"
    canvas.text(canvas.width - 10, 22, span, color=TEXT, fontsize=_pt(12.5), ha="right", va="center")
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
    canvas.text(10, y, footer, fit=canvas.width - 20, color=MUTED, fontsize=_pt(11), va="center")


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


# --- the command --------------------------------------------------------------------------------


class UsageError(Exception):
    """Bad input to the command (exit 2); the message is one line."""


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kv-sidecar dashboards snapshot``."""
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus to query (required), e.g. http://127.0.0.1:9090"
    )
    parser.add_argument(
        "--dashboards",
        metavar="DIR",
        default="dashboards",
        help="directory of dashboard JSON files to draw (default: dashboards)",
    )
    parser.add_argument(
        "--out", metavar="DIR", default="snapshots", help="where <uid>.png is written (default: snapshots)"
    )
    parser.add_argument(
        "--var",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a template variable's value, repeatable (twice for two values); unset variables are All",
    )
    parser.add_argument(
        "--from",
        dest="from_",
        metavar="DURATION",
        default=None,
        help="draw the last DURATION, e.g. 1h or now-6h (default: each dashboard's own time range)",
    )
    parser.add_argument(
        "--step", metavar="DURATION", default=None, help="query step (default: the range / 600, at least 1s)"
    )


def parse_vars(items: Sequence[str]) -> dict[str, Any]:
    """``["pod=a", "pod=b", "namespace=x"]`` -> ``{"pod": ["a", "b"], "namespace": "x"}``."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--var: expected NAME=VALUE, got {item!r}")
        name = name.strip()
        if name in out:
            out[name] = [*([out[name]] if isinstance(out[name], str) else out[name]), value]
        else:
            out[name] = value
    return out


def _duration_ago(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text.removeprefix("now-"))
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    if seconds <= 0:
        raise UsageError(f"{flag}: must be above zero, got {text!r}")
    return seconds


def load_dashboards(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` dashboard in ``directory`` (sorted by file name); UsageError when there is none."""
    if not directory.is_dir():
        raise UsageError(f"--dashboards: {directory} is not a directory")
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"--dashboards: {path}: not readable JSON: {e}") from None
        if not isinstance(doc, dict) or not doc.get("uid") or not isinstance(doc.get("panels"), list):
            raise UsageError(f"--dashboards: {path}: not a Grafana dashboard (needs uid and panels)")
        out.append(doc)
    if not out:
        raise UsageError(f"--dashboards: no *.json dashboard in {directory}")
    return out


def _own_range(dashboard: Mapping[str, Any]) -> float:
    """The length of the dashboard's saved relative time range (``now-7d``), else one hour."""
    try:
        return _duration_ago(str((dashboard.get("time") or {}).get("from", "now-1h")), "time.from")
    except UsageError:
        return 3600.0


def snapshot_command(args: argparse.Namespace) -> int:
    """``kv-sidecar dashboards snapshot``: 0 when every PNG is written, 2 on bad input, 1 when
    Prometheus cannot be reached."""
    try:
        if not args.prometheus_url:
            raise UsageError("--prometheus-url is required")
        values = parse_vars(args.var)
        ago = _duration_ago(args.from_, "--from") if args.from_ else None
        step = _duration_ago(args.step, "--step") if args.step else None
        dashboards = load_dashboards(Path(args.dashboards))
    except UsageError as e:
        print(f"kv-sidecar dashboards snapshot: {e}", file=sys.stderr)
        return 2
    with PrometheusAPI(args.prometheus_url) as api:
        try:
            api.query("vector(1)")
        except PrometheusError as e:
            print(f"kv-sidecar dashboards snapshot: Prometheus not usable: {e}", file=sys.stderr)
            return 1
        end = time.time()
        for dashboard in dashboards:
            out = Path(args.out) / f"{dashboard['uid']}.png"
            try:
                snap = render_dashboard(
                    dashboard, api, values, end - (ago or _own_range(dashboard)), end, out, step=step
                )
            except OSError as e:
                print(f"kv-sidecar dashboards snapshot: --out: cannot write {out}: {e.strerror or e}", file=sys.stderr)
                return 2
            print(f"wrote {snap.path} ({snap.summary()}) in {snap.seconds:.1f}s", file=sys.stderr)
    return 0
