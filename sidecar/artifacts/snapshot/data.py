"""What a panel shows, fetched as Grafana would: its targets' queries over the dashboard's time range.

Every target is interpolated with the dashboard's variables and Grafana's ``$__interval``,
``$__rate_interval`` and ``$__range`` (:func:`..panels.interpolate`), then sent to Prometheus' HTTP
API through :class:`..panels.PrometheusAPI`: an instant query at the end of the range for tables and
for targets that ask for one, else a range query. The dashboard's annotation queries become
:class:`Mark` regions. Nothing here draws.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..panels import ALL, PrometheusAPI, PrometheusError, interpolate, variables
from .colors import grafana_color

#: Grafana's default scrape interval for a Prometheus data source: the floor of ``$__rate_interval``.
GRAFANA_SCRAPE_INTERVAL = 15.0
#: Without an explicit step, about one point per 3 px of a full-width panel.
POINTS_PER_RANGE = 600


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
