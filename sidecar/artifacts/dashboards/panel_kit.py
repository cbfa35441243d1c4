"""The panel kit: :class:`Graph`, :class:`Stat` and :class:`Table`, each a frozen description that
builds its Grafana panel with the SDK's typed builders, and :class:`Q`, one query of a panel.

A dashboard module lists its rows as :data:`Rows` (a title and its panels) and describes itself as a
:class:`DashboardSpec`; :mod:`.assemble` turns the specs into dashboards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from ..params import VAR_DATASOURCE


def datasource_ref() -> dm.DataSourceRef:
    """The Prometheus data source the ``datasource`` variable selects: every query and variable uses it."""
    return dm.DataSourceRef(type_val="prometheus", uid="${" + VAR_DATASOURCE + "}")


@dataclass(frozen=True)
class Q:
    """One panel target: the expression, its legend, and whether it is an instant table query."""

    expr: str
    legend: str = ""
    instant: bool = False


def _targets(queries: Sequence[Q], *, table_format: bool = False) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    """The panel's Prometheus targets, ref ids A, B, ... in order; a table's are instant queries in table format."""
    out: list[cogbuilder.Builder[cogvariants.Dataquery]] = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(datasource_ref())
        if q.legend:
            t = t.legend_format(q.legend)
        if q.instant or table_format:
            t = t.instant()
        else:
            t = t.range()
        if table_format:
            t = t.format(pm.PromQueryFormat.TABLE)
        out.append(t)
    return out


def _runbook_links(url: str) -> list[cogbuilder.Builder[dm.DashboardLink]]:
    """The panel's link to the runbook of the alert it explains (Grafana's panel header menu)."""
    if not url:
        return []
    alert = url.rsplit("/", 1)[-1].removesuffix(".md")
    return [db.DashboardLink(f"Runbook: {alert}").url(url).target_blank(True)]


def _fixed_color(color: str) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})


#: The SDK's panel builders the kit makes; each has the same header, size, target and link methods.
_PanelBuilder = TypeVar("_PanelBuilder", timeseries.Panel, stat.Panel, table.Panel)


def _framed(
    panel: _PanelBuilder, spec: Graph | Stat | Table, targets: list[cogbuilder.Builder[cogvariants.Dataquery]]
) -> _PanelBuilder:
    """What every panel of the kit sets: title, description, unit, data source, size, queries, runbook link."""
    panel = (
        panel.title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(datasource_ref())
        .span(spec.w)
        .height(spec.h)
        .targets(targets)
    )
    return panel.links(_runbook_links(spec.runbook)) if spec.runbook else panel


@dataclass(frozen=True)
class Graph:
    """A time series panel: what it charts, and how."""

    title: str
    description: str
    unit: str
    queries: Sequence[Q]
    w: int = 12
    h: int = 8
    axis_label: str = ""
    min: float | None = None
    max: float | None = None
    stacked: bool = False
    thresholds: db.ThresholdsConfig | None = None
    colors: dict[str, str] = field(default_factory=dict)  # legend -> fixed colour
    runbook: str = ""  # the URL of the runbook of the alert this panel explains
    #: legends drawn on a right-hand axis of their own (a series an order of magnitude apart)
    right_axis: tuple[str, ...] = ()
    #: a log-10 y axis (needs ``min`` > 0): minutes and hours both read on one time-until axis
    log_scale: bool = False

    def build(self) -> timeseries.Panel:
        """The SDK's time series panel: lines (or stacked areas), legend below, thresholds as dashed lines and bands."""
        p = (
            _framed(timeseries.Panel(), self, _targets(self.queries))
            .fill_opacity(30 if self.stacked else 10)
            .legend(
                cb.VizLegendOptions()
                .show_legend(True)
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
            )
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        )
        if self.axis_label:
            p = p.axis_label(self.axis_label)
        if self.log_scale:
            p = p.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
        if self.min is not None:
            p = p.min(self.min)
        if self.max is not None:
            p = p.max(self.max)
        if self.stacked:
            p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
        if self.thresholds is not None:
            p = p.thresholds(self.thresholds).thresholds_style(
                cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED_AND_AREA)
            )
        for legend, color in self.colors.items():
            p = p.override_by_name(legend, [_fixed_color(color)])
        for legend in self.right_axis:
            p = p.override_by_name(legend, [dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right")])
        return p


@dataclass(frozen=True)
class Stat:
    """A single figure, coloured by thresholds."""

    title: str
    description: str
    unit: str
    query: Q
    thresholds: db.ThresholdsConfig
    w: int = 4
    h: int = 5
    mappings: Sequence[Any] = ()
    runbook: str = ""  # the URL of the runbook of the alert this panel explains

    def build(self) -> stat.Panel:
        """The SDK's stat panel: the last non-null value, its background coloured by the thresholds."""
        p = (
            _framed(stat.Panel(), self, _targets([self.query]))
            .thresholds(self.thresholds)
            .color_mode(cm.BigValueColorMode.BACKGROUND)
            .graph_mode(cm.BigValueGraphMode.NONE)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )
        if self.mappings:
            p = p.mappings(list(self.mappings))
        return p


@dataclass(frozen=True)
class Table:
    """Instant queries as one table: label columns, then one value column per query, renamed."""

    title: str
    description: str
    queries: Sequence[Q]
    #: source field -> column title, in column order (a value column is "Value" or "Value #<refId>")
    columns: dict[str, str]
    #: column title -> unit, for the value columns
    units: dict[str, str] = field(default_factory=dict)
    #: label fields whose values are numbers (e.g. ``gpu_memory_utilization="0.9"``): converted to numbers
    #: (Grafana's convertFieldType transformation) so that their column's unit applies ("90%", not "0.9")
    numeric: tuple[str, ...] = ()
    #: column title -> more field properties (:func:`colored_cells`, :func:`mapped_cells`)
    styles: dict[str, list[dm.DynamicConfigValue]] = field(default_factory=dict)
    unit: str = "none"
    w: int = 12
    h: int = 8
    sort_by: str = ""
    links: Sequence[cogbuilder.Builder[dm.DashboardLink]] = ()
    runbook: str = ""  # the URL of the runbook of the alert this panel explains

    def build(self) -> table.Panel:
        """The SDK's table panel: the queries merged, the columns kept, ordered and renamed."""
        p = _framed(table.Panel(), self, _targets(self.queries, table_format=True)).cell_height(cm.TableCellHeight.SM)
        if len(self.queries) > 1:
            p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        if self.numeric:
            conversions = [{"targetField": name, "destinationType": "number"} for name in self.numeric]
            p = p.with_transformation(
                dm.DataTransformerConfig(id_val="convertFieldType", options={"conversions": conversions, "fields": {}})
            )
        p = p.with_transformation(
            dm.DataTransformerConfig(id_val="filterFieldsByName", options={"include": {"names": list(self.columns)}})
        ).with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {},
                    "indexByName": {name: i for i, name in enumerate(self.columns)},
                    "renameByName": dict(self.columns),
                },
            )
        )
        for column in dict.fromkeys([*self.units, *self.styles]):
            unit = [dm.DynamicConfigValue(id_val="unit", value=self.units[column])] if column in self.units else []
            p = p.override_by_name(column, unit + self.styles.get(column, []))
        if self.sort_by:
            p = p.sort_by([cb.TableSortByFieldState().display_name(self.sort_by).desc(True)])
        if self.links:
            p = p.data_links(list(self.links))
        return p


#: Any panel of the kit: each has ``build()``, which returns the SDK's panel builder.
Panel = Graph | Stat | Table
#: A dashboard's rows, in order: the row's title (an on-call question) and its panels.
Rows = list[tuple[str, list[Panel]]]


@dataclass(frozen=True)
class DashboardSpec:
    """One dashboard as its module describes it; :mod:`.assemble` adds the shared frame and builds it."""

    uid: str
    description: str
    time_from: str
    refresh: str
    rows: Rows
