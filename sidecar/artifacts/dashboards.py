"""The Grafana dashboards, built as code with Grafana's typed builders (``grafana-foundation-sdk``).

Three dashboards answer the on-call questions in order, one row per question (:data:`ROW_TITLES`):
is any pod about to fill, how many tokens are left and how fast they go, is it preempting, what to
change.

- **KV cache / Fleet** (``kvcache-overview``, the page most alerts open): firing alerts, pods above the
  watermark, the worst time until full, per model capacity vs demand, usage by pod against the
  thresholds, preemptions and requests waiting for KV, the recommendation per pod, a pod table that
  drills down to the pod view.
- **KV cache / Pod** (``kvcache-pod``): one pod's pool in tokens, trend, capacity model, scheduler
  queues, the users' latency from vLLM's own histograms, what to change, model/server info and the
  sidecar's own health.
- **KV cache / Capacity planning** (``kvcache-capacity``): a week per model from the recording rules
  of :func:`sidecar.artifacts.rules.recording_rules`.

The panels chart the sidecar's ``kvcache_*`` series (docs/metrics.md), which keep their names across
vLLM's metric renames; only the latency panel and the restart annotation read vLLM's own series.
Thresholds come from the same ``thresholds:`` section as the alerts and the sidecar's gauges, so the
lines drawn are the ones that page. Label names of Prometheus' discovery are parameters
(:class:`DashboardParams`, kube-prometheus defaults).

Pure: :func:`build_dashboards` maps the parameters to the dashboards' JSON mappings and
:func:`render_dashboard_json` to stable text (``make generate`` commits ``dashboards/*.json``; a test
keeps them equal). The SDK (an optional dependency, the ``dashboards`` extra) is imported only here,
and only the ``kv-sidecar dashboards`` command and the generator import this module.

Where the SDK cannot express a field Grafana reads, the encoded JSON is completed for that piece only
(:data:`ANNOTATION_FALLBACK_KEYS`): the SDK's ``AnnotationQuery`` has ``expr`` but not the Prometheus
annotation's ``titleFormat``/``textFormat``/``tagKeys``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from ..forecast.recommendation import ACTION_TEXT, REASON_TEXT
from ..metrics import CACHE_SETTINGS
from ..units import prometheus_duration_seconds
from .params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    DASHBOARD_POD_UID,
    VAR_DATASOURCE,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
    RuleParams,
    Thresholds,
)

#: Titles, in the order the links list them.
TITLES = {
    DASHBOARD_OVERVIEW_UID: "KV cache / Fleet",
    DASHBOARD_POD_UID: "KV cache / Pod",
    DASHBOARD_CAPACITY_UID: "KV cache / Capacity planning",
}

#: The rows of every dashboard, in on-call order (the pod view adds one for model, server and sidecar).
ROW_TITLES = (
    "Is any pod about to fill",
    "How many tokens are left and how fast",
    "Is it preempting",
    "What to change",
)

#: The Fleet dashboard's last row: what users feel, from vLLM's own series (the KV rows say why).
USERS_ROW_TITLE = "Are users hurting"

#: Keys added to each encoded annotation because the SDK's AnnotationQuery has no field for them.
ANNOTATION_FALLBACK_KEYS = ("tagKeys", "textFormat", "titleFormat")

#: The template variable of the cluster, first of the chain. Its "All" is ``.*``, and ``cluster=~".*"`` also
#: matches a series without the label (Prometheus: a matcher that matches the empty string selects series
#: without the label too, "Querying basics"): harmless where Prometheus holds one cluster and no such label.
VAR_CLUSTER = "cluster"

#: Grafana's custom unit for a rate of tokens (``suffix:`` units, "Standard options > Unit" docs): no
#: unit of Grafana's list counts tokens.
TOKENS_PER_S = "suffix: tokens/s"

#: alerts/alertmanager.yaml's inhibit rule, which the Fleet's alert table applies: a critical source alert
#: mutes the warning targets on the same pod (``equal``: namespace, pod, and these).
INHIBIT_SOURCES = ("KVCacheAlmostFull", "KVCacheFullSoon")
INHIBIT_TARGETS = ("KVCacheAlmostFull", "KVCachePreemptions", "KVCacheRequestsWaitingForKV")
INHIBIT_EQUAL_OTHER = ("instance", "target")

#: Tag of the three dashboards (Grafana's search and tag links).
TAG = "kvcache"

#: Time-until graphs are capped here: +Inf (not filling) cannot be drawn, and beyond it nothing is urgent.
TIME_UNTIL_GRAPH_CAP_S = 6 * 3600
#: The floor of the time-until graphs' log axis: "full within a minute" (0 s cannot be drawn on a log axis).
TIME_UNTIL_GRAPH_FLOOR_S = 60
#: The "worst time until full" figure is capped here and read as "not filling".
TIME_UNTIL_STAT_CAP_S = 7 * 86400


@dataclass(frozen=True)
class DashboardParams:
    """What the dashboards are made from: label names of Prometheus' discovery and the shared thresholds.

    ``namespace_label``/``pod_label`` are the labels Prometheus' service discovery puts on the sidecar's
    and vLLM's series (kube-prometheus PodMonitor: ``namespace``, ``pod``); the template variables keep
    their names (``namespace``, ``pod``) whatever the labels are, because alerts link to them.
    """

    namespace_label: str = "namespace"
    pod_label: str = "pod"
    #: the label a multi-cluster setup puts on every series (an external label or relabelling); may be absent
    cluster_label: str = "cluster"
    thresholds: Thresholds = field(default_factory=Thresholds)
    runbook_base_url: str = RuleParams().runbook_base_url
    sidecar_job: str = RuleParams().sidecar_job
    #: KVCacheFullSoon's window: the worst time until full turns red below it.
    full_soon_within: str = RuleParams().full_soon_within
    #: KVCacheCapacityMismatch's tolerance: the efficiency panel's band.
    capacity_mismatch_tolerance: float = RuleParams().capacity_mismatch_tolerance

    @classmethod
    def from_rules(cls, thresholds: Thresholds, rules: RuleParams, **labels: str) -> DashboardParams:
        """The parameters of the alert rules rendered from the same configuration, plus label names."""
        return cls(
            thresholds=thresholds,
            runbook_base_url=rules.runbook_base_url,
            sidecar_job=rules.sidecar_job,
            full_soon_within=rules.full_soon_within,
            capacity_mismatch_tolerance=rules.capacity_mismatch_tolerance,
            **labels,
        )


# ---------------------------------------------------------------------------
# PromQL pieces
# ---------------------------------------------------------------------------


def _num(x: float) -> str:
    """A threshold as PromQL text: 0.9 -> "0.9", 604800.0 -> "604800"."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _pct(x: float) -> str:
    """A threshold as descriptions say it: 0.9 -> "90%"."""
    return f"{round(x * 100, 4):g}%"


@dataclass(frozen=True)
class _Sel:
    """Series selectors filtered by the template variables, with the configured label names."""

    ns: str
    pod: str
    cluster: str = "cluster"

    def engine(self, *extra: str) -> str:
        """An engine series of the sidecar (or of vLLM): cluster, namespace, model and pod."""
        return self._matchers(self._ns(), f'model_name=~"${VAR_MODEL_NAME}"', self._pod(), *extra)

    def pod_only(self, *extra: str) -> str:
        """A series without ``model_name`` (the sidecar's own health, a process): cluster, namespace and pod."""
        return self._matchers(self._ns(), self._pod(), *extra)

    def model(self, *extra: str) -> str:
        """A namespace/model recording rule: cluster, namespace and model."""
        return self._matchers(self._ns(), f'model_name=~"${VAR_MODEL_NAME}"', *extra)

    def namespace(self, *extra: str) -> str:
        """Any series of the selected namespaces (an alert): cluster and namespace."""
        return self._matchers(self._ns(), *extra)

    def _ns(self) -> str:
        return f'{self.cluster}=~"${VAR_CLUSTER}", {self.ns}=~"${VAR_NAMESPACE}"'

    def _pod(self) -> str:
        return f'{self.pod}=~"${VAR_POD}"'

    @staticmethod
    def _matchers(*matchers: str) -> str:
        return "{" + ", ".join(matchers) + "}"


def _by(*labels: str) -> str:
    """``by (a, b)``: the grouping clause of an aggregation."""
    return f"by ({', '.join(labels)})"


def _legend(*labels: str) -> str:
    """``{{a}}/{{b}}``: a legend naming each series by these labels."""
    return "/".join("{{" + label + "}}" for label in labels)


# ---------------------------------------------------------------------------
# Panel builders
# ---------------------------------------------------------------------------


def _datasource() -> dm.DataSourceRef:
    return dm.DataSourceRef(type_val="prometheus", uid="${" + VAR_DATASOURCE + "}")


@dataclass(frozen=True)
class Q:
    """One panel target: the expression, its legend, and whether it is an instant table query."""

    expr: str
    legend: str = ""
    instant: bool = False


def _targets(queries: Sequence[Q], *, table_format: bool = False) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    out: list[cogbuilder.Builder[cogvariants.Dataquery]] = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(_datasource())
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


def _steps(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute threshold steps: the first value is None (the base colour)."""
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def _usage_steps(th: Thresholds) -> db.ThresholdsConfig:
    """Green, orange from the ticket threshold, red from the paging watermark."""
    return _steps((None, "green"), (th.warning, "orange"), (th.watermark, "red"))


def _runbook(p: DashboardParams, alert: str) -> str:
    """The runbook of one alert (``docs/runbooks/<alert>.md`` under ``alerts.runbook_base_url``)."""
    return f"{p.runbook_base_url}/{alert}.md"


def _runbook_links(url: str) -> list[cogbuilder.Builder[dm.DashboardLink]]:
    """The panel's link to the runbook of the alert it explains (Grafana's panel header menu)."""
    if not url:
        return []
    alert = url.rsplit("/", 1)[-1].removesuffix(".md")
    return [db.DashboardLink(f"Runbook: {alert}").url(url).target_blank(True)]


def _not_filling(cap_s: int) -> dm.RangeMap:
    """Reads a time until full capped at ``cap_s`` as "not filling" (+Inf cannot be drawn or mapped)."""
    return dm.RangeMap(
        options=dm.DashboardRangeMapOptions(
            from_val=cap_s, to=1e12, result=dm.ValueMappingResult(text="not filling", color="green")
        )
    )


def _until(expr: str) -> str:
    """A time until full/watermark for a log axis: at least a minute (0 = full now), at most the cap (not filling)."""
    return f"clamp({expr}, {TIME_UNTIL_GRAPH_FLOOR_S}, {TIME_UNTIL_GRAPH_CAP_S})"


def _enum_text(texts: dict[str, str]) -> dm.ValueMap:
    """Reads each enum value (an action, a reason) as its human text: no raw ``shortfall_at_upper_bound``."""
    return dm.ValueMap(options={value: dm.ValueMappingResult(text=text) for value, text in texts.items()})


def _fixed_color(color: str) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})


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
        p = (
            timeseries.Panel()
            .title(self.title)
            .description(self.description)
            .unit(self.unit)
            .datasource(_datasource())
            .span(self.w)
            .height(self.h)
            .targets(_targets(self.queries))
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
        if self.runbook:
            p = p.links(_runbook_links(self.runbook))
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
        p = (
            stat.Panel()
            .title(self.title)
            .description(self.description)
            .unit(self.unit)
            .datasource(_datasource())
            .span(self.w)
            .height(self.h)
            .targets(_targets([self.query]))
            .thresholds(self.thresholds)
            .color_mode(cm.BigValueColorMode.BACKGROUND)
            .graph_mode(cm.BigValueGraphMode.NONE)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )
        if self.mappings:
            p = p.mappings(list(self.mappings))
        if self.runbook:
            p = p.links(_runbook_links(self.runbook))
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
    #: column title -> more field properties (:func:`_colored`, :func:`_mapped`)
    styles: dict[str, list[dm.DynamicConfigValue]] = field(default_factory=dict)
    unit: str = "none"
    w: int = 12
    h: int = 8
    sort_by: str = ""
    links: Sequence[cogbuilder.Builder[dm.DashboardLink]] = ()
    runbook: str = ""  # the URL of the runbook of the alert this panel explains

    def build(self) -> table.Panel:
        p = (
            table.Panel()
            .title(self.title)
            .description(self.description)
            .unit(self.unit)
            .datasource(_datasource())
            .span(self.w)
            .height(self.h)
            .targets(_targets(self.queries, table_format=True))
            .cell_height(cm.TableCellHeight.SM)
        )
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
        if self.runbook:
            p = p.links(_runbook_links(self.runbook))
        return p


def _colored(steps: db.ThresholdsConfig) -> list[dm.DynamicConfigValue]:
    """A table column whose cells take the colour of their threshold step."""
    return [
        dm.DynamicConfigValue(id_val="thresholds", value=steps.build()),
        dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background", "mode": "basic"}),
    ]


def _mapped(*mappings: Any) -> list[dm.DynamicConfigValue]:
    """A table column whose values read as the mappings say."""
    return [dm.DynamicConfigValue(id_val="mappings", value=list(mappings))]


Panel = Graph | Stat | Table
Rows = list[tuple[str, list[Panel]]]


# ---------------------------------------------------------------------------
# Fleet: kvcache-overview
# ---------------------------------------------------------------------------


def _firing_alerts(p: DashboardParams, s: _Sel) -> list[Panel]:
    alerts = "ALERTS" + s.namespace('alertname=~"KVCache.*"', 'alertstate="firing"')
    watermark = _num(p.thresholds.watermark)
    full_soon_s = prometheus_duration_seconds(p.full_soon_within)
    alert_runbook = _runbook(p, "${__data.fields.alertname}")
    critical = alerts[:-1] + ', severity="critical"}'
    # alerts/alertmanager.yaml's inhibit rule, as a set: the firing alerts less the targets muted by a source
    # with the same `equal` labels (a label absent on both counts as equal there and in PromQL's `on`)
    source = "ALERTS" + s.namespace(
        f'alertname=~"{"|".join(INHIBIT_SOURCES)}"', 'alertstate="firing"', 'severity="critical"'
    )
    target = "ALERTS" + s.namespace(
        f'alertname=~"{"|".join(INHIBIT_TARGETS)}"', 'alertstate="firing"', 'severity="warning"'
    )
    equal = _by(p.namespace_label, p.pod_label, *INHIBIT_EQUAL_OTHER)[3:]
    delivered = f"{alerts}\nunless\n({target}\n  and on {equal}\n  {source})"
    return [
        Stat(
            "Pages firing (critical)",
            "Critical KVCache* alerts firing now in the selected namespaces: what paged. Warnings (tickets) are "
            "listed in the table beside it, not counted here. Above 0: open the table and each alert's runbook.",
            "none",
            Q(f"count({critical}) or vector(0)", "paging", instant=True),
            _steps((None, "green"), (1, "red")),
        ),
        Stat(
            "Pods above the watermark",
            f"Pods with an engine above the {_pct(p.thresholds.watermark)} paging watermark now. Above 0: those "
            "pods queue and preempt; see the usage and pod tables, then What to change.",
            "none",
            Q(
                f"count(max by ({p.namespace_label}, {p.pod_label}) (kvcache_usage_ratio{s.engine()}) > {watermark})"
                " or vector(0)",
                "pods",
                instant=True,
            ),
            _steps((None, "green"), (1, "red")),
        ),
        Stat(
            "Worst time until full",
            "The shortest time until an engine's KV cache is full at its current trend (kvcache_time_until_full_"
            f"seconds). Red below {p.full_soon_within} (KVCacheFullSoon): add capacity or shed load before "
            "preemptions start.",
            "s",
            Q(
                f"min(clamp_max(kvcache_time_until_full_seconds{s.engine()}, {TIME_UNTIL_STAT_CAP_S}))",
                "time until full",
                instant=True,
            ),
            _steps((None, "red"), (full_soon_s, "orange"), (4 * full_soon_s, "green")),
            mappings=[_not_filling(TIME_UNTIL_STAT_CAP_S)],
            runbook=_runbook(p, "KVCacheFullSoon"),
        ),
        Table(
            "Firing alerts",
            "Each firing KVCache* alert Alertmanager delivers (inhibited warnings left out) with its labels. "
            "Click a row for the alert's runbook; drill into the pod "
            "from the Pods table below.",
            [Q(delivered, instant=True)],
            {
                "alertname": "Alert",
                "severity": "Severity",
                p.namespace_label: "Namespace",
                "model_name": "Model",
                p.pod_label: "Pod",
            },
            h=5,
            links=[db.DashboardLink("Open the alert's runbook").url(alert_runbook).target_blank(True)],
        ),
    ]


def _pod_table(p: DashboardParams, s: _Sel) -> Table:
    by = f"by ({p.namespace_label}, model_name, {p.pod_label})"
    cap = TIME_UNTIL_STAT_CAP_S
    drill = (
        f"/d/{DASHBOARD_POD_UID}?var-{VAR_NAMESPACE}=${{__data.fields.{p.namespace_label}}}"
        f"&var-{VAR_MODEL_NAME}=${{__data.fields.model_name}}&var-{VAR_POD}=${{__data.fields.{p.pod_label}}}"
        f"&${{{VAR_CLUSTER}:queryparam}}&${{{VAR_DATASOURCE}:queryparam}}&${{__url_time_range}}"
    )
    return Table(
        "Pods",
        "One row per pod: highest engine usage, free tokens, time until full (capped at a week) and preemptions/s. "
        "Sorted by usage; click a row to open the pod's dashboard.",
        [
            Q(f"max {by} (kvcache_usage_ratio{s.engine()})"),
            Q(f"sum {by} (kvcache_free_tokens{s.engine()})"),
            Q(f"min {by} (clamp_max(kvcache_time_until_full_seconds{s.engine()}, {cap}))"),
            Q(f"sum {by} (rate(kvcache_preemptions_total{s.engine()}[$__rate_interval]))"),
        ],
        {
            p.namespace_label: "Namespace",
            "model_name": "Model",
            p.pod_label: "Pod",
            "Value #A": "Usage",
            "Value #B": "Free tokens",
            "Value #C": "Time until full",
            "Value #D": "Preemptions/s",
        },
        units={"Usage": "percentunit", "Free tokens": "short", "Time until full": "s", "Preemptions/s": "short"},
        styles={"Usage": _colored(_usage_steps(p.thresholds)), "Time until full": _mapped(_not_filling(cap))},
        sort_by="Usage",
        links=[db.DashboardLink("Open the pod dashboard").url(drill)],
    )


def _fleet_fill(p: DashboardParams, s: _Sel) -> list[Panel]:
    return [
        *_firing_alerts(p, s),
        Graph(
            "KV usage by pod",
            f"KV-cache usage of each engine (kvcache_usage_ratio), with the {_pct(p.thresholds.warning)} ticket and "
            f"{_pct(p.thresholds.watermark)} paging thresholds drawn. A line whose peaks keep reaching the red band "
            "pages (KVCacheAlmostFull: above it for 5% of 10 minutes by default); compare its neighbours to tell "
            "load from imbalance.",
            "percentunit",
            [Q(f"kvcache_usage_ratio{s.engine()}", f"{_legend(p.pod_label)} {{{{model_name}}}} engine {{{{engine}}}}")],
            min=0,
            max=1,
            thresholds=_usage_steps(p.thresholds),
            runbook=_runbook(p, "KVCacheAlmostFull"),
        ),
        _pod_table(p, s),
    ]


def _fleet_tokens(p: DashboardParams, s: _Sel) -> list[Panel]:
    by = f"by ({p.namespace_label}, model_name)"
    model = _legend(p.namespace_label, "model_name")
    capacity = f"sum {by} (kvcache_used_tokens{s.engine()} + kvcache_free_tokens{s.engine()})"
    return [
        Graph(
            "KV capacity and tokens held per model",
            "Per model, the usable KV capacity of the selected pods in tokens (used + free: vLLM's pool without "
            "its null block, hybrid models included) and the tokens held. Held near capacity: the pool is full; "
            "the panel beside it says by how much demand exceeds it.",
            "short",
            [Q(capacity, f"{model} capacity"), Q(f"sum {by} (kvcache_used_tokens{s.engine()})", f"{model} used")],
            w=6,
            axis_label="tokens",
            min=0,
        ),
        Graph(
            "Demand as a share of capacity per model",
            "Per model, the KV demand (tokens held plus what requests waiting for capacity need at the watermark) "
            "divided by the usable capacity: 100% fills the pool, 300% needs three times it. A ratio, not tokens "
            "on the capacity's axis: a demand many times the capacity would squash the capacity onto the x axis, "
            "and the ratio is the factor to scale the pool or the replicas by. Above the "
            f"{_pct(p.thresholds.watermark)} watermark line: the cache is the bottleneck; see What to change.",
            "percentunit",
            [Q(f"sum {by} (kvcache_demand_tokens{s.engine()})\n/\n{capacity}", f"{model} demand / capacity")],
            w=6,
            min=0,
            thresholds=_steps((None, "green"), (p.thresholds.watermark, "red")),
        ),
        Graph(
            "Time until full by pod",
            "Time until each engine's cache is full at its current trend (kvcache_time_until_full_seconds) on a "
            f"log axis from 1 min to {TIME_UNTIL_GRAPH_CAP_S // 3600} h, so three states read apart: a line at the "
            f"top is not filling, one in the middle is filling hours away, one in the red band (below "
            f"{p.full_soon_within}) is full soon and KVCacheFullSoon pages.",
            "s",
            [
                Q(
                    _until(f"kvcache_time_until_full_seconds{s.engine()}"),
                    f"{_legend(p.pod_label)} engine {{{{engine}}}}",
                )
            ],
            min=TIME_UNTIL_GRAPH_FLOOR_S,
            max=TIME_UNTIL_GRAPH_CAP_S,
            log_scale=True,
            thresholds=_steps((None, "red"), (prometheus_duration_seconds(p.full_soon_within), "transparent")),
            runbook=_runbook(p, "KVCacheFullSoon"),
        ),
    ]


def _fleet_preempting(p: DashboardParams, s: _Sel) -> list[Panel]:
    by = f"by ({p.namespace_label}, model_name)"
    model = _legend(p.namespace_label, "model_name")
    waiting = "kvcache_requests_waiting" + s.engine('reason=~"capacity|all"')
    above = f"(kvcache_usage_ratio{s.engine()} > bool {_num(p.thresholds.watermark)})"
    return [
        Graph(
            "Preemptions per second by model",
            "Requests vLLM preempted for lack of KV blocks, per second. Any sustained rate means the cache is too "
            "small for the load (KVCachePreemptions): raise capacity or lower concurrency.",
            "short",
            [Q(f"sum {by} (rate(kvcache_preemptions_total{s.engine()}[$__rate_interval]))", model)],
            axis_label="preemptions/s",
            min=0,
            runbook=_runbook(p, "KVCachePreemptions"),
        ),
        Graph(
            "Requests waiting for KV by model",
            "Requests waiting for scheduler capacity, and the part of them that waits while its engine is above the "
            "watermark, i.e. for KV blocks (KVCacheRequestsWaitingForKV). Waiting at low usage is max_num_seqs or "
            "the token budget, not KV.",
            "short",
            [
                Q(f"sum {by} ({waiting} * ignoring (reason) group_left () {above})", f"{model} waiting for KV"),
                Q(f"sum {by} ({waiting})", f"{model} waiting for capacity"),
            ],
            axis_label="requests",
            min=0,
            runbook=_runbook(p, "KVCacheRequestsWaitingForKV"),
        ),
    ]


def _fleet_change(p: DashboardParams, s: _Sel) -> list[Panel]:
    keys = (p.namespace_label, p.pod_label, "model_name", "engine")
    by = (p.namespace_label, "model_name")
    # kvcache_suggested_replicas is present only with a shortfall; a pod without one needs no more than itself
    replicas = (
        f"max {_by(*keys)} (kvcache_suggested_replicas{s.engine()})\n"
        f"or max {_by(*keys)} (kvcache_recommendation_info{s.engine()})"
    )
    return [
        Table(
            "Recommendation per pod",
            "The sidecar's current top recommendation for each engine (kvcache_recommendation_info), the "
            "gpu_memory_utilization it suggests and the replicas its own peak needs at the largest pool "
            "(kvcache_suggested_replicas, 1 without a shortfall): a workload needs the sum over its pods. "
            "Apply it on the next change window; reasons: docs/forecast.md.",
            [
                Q(f"max {_by(*keys, 'action', 'reason')} (kvcache_recommendation_info{s.engine()})"),
                Q(f"max {_by(*keys)} (kvcache_suggested_gpu_memory_utilization{s.engine()})"),
                Q(replicas),
            ],
            {
                p.namespace_label: "Namespace",
                p.pod_label: "Pod",
                "model_name": "Model",
                "engine": "Engine",
                "action": "Action",
                "reason": "Reason",
                "Value #B": "Suggested gpu_memory_utilization",
                "Value #C": "Replicas this pod's peak needs",
            },
            units={"Suggested gpu_memory_utilization": "percentunit", "Replicas this pod's peak needs": "none"},
            styles={"Action": _mapped(_enum_text(ACTION_TEXT)), "Reason": _mapped(_enum_text(REASON_TEXT))},
            w=24,
        ),
        Table(
            "Replicas per workload",
            "Per namespace and model: the pods running now and the replicas the pods' peaks need at the largest "
            "allowed pool, the sum of kvcache_suggested_replicas over the pods (1 for a pod without a shortfall). "
            "More needed than running: scale the Deployment, or apply the fp8 KV cache first when it is advised.",
            [
                Q(f"count {_by(*by)} (kvcache_recommendation_info{s.engine()})"),
                Q(f"sum {_by(*by)} ({replicas})"),
            ],
            {
                p.namespace_label: "Namespace",
                "model_name": "Model",
                "Value #A": "Pods running",
                "Value #B": "Replicas needed",
            },
            units={"Pods running": "none", "Replicas needed": "none"},
            w=24,
            h=6,
        ),
    ]


def _fleet_users(p: DashboardParams, s: _Sel) -> list[Panel]:
    """TTFT p95, requests waiting, preemptions and the error share per model, from vLLM's own series."""
    by = (p.namespace_label, "model_name")
    model = _legend(*by)
    ttft = f"rate(vllm:time_to_first_token_seconds_bucket{s.engine()}[$__rate_interval])"
    finished = f"rate(vllm:request_success_total{s.engine()}[$__rate_interval])"
    failed_sel = s.engine('finished_reason=~"error|abort"')
    failed = f"rate(vllm:request_success_total{failed_sel}[$__rate_interval])"
    return [
        Graph(
            "Time to first token p95 by model",
            "What users wait before the first token (vllm:time_to_first_token_seconds, 95th percentile over the "
            "model's pods). Rising with KV usage: requests queue for blocks; see the rows above.",
            "s",
            [Q(f"histogram_quantile(0.95, sum {_by(*by, 'le')} ({ttft}))", model)],
            w=6,
            min=0,
        ),
        Graph(
            "Requests waiting by model",
            "Requests vLLM holds in its queue (vllm:num_requests_waiting), summed over the model's pods. Waiting "
            "while usage is above the watermark is KV pressure.",
            "short",
            [Q(f"sum {_by(*by)} (vllm:num_requests_waiting{s.engine()})", model)],
            w=6,
            axis_label="requests",
            min=0,
        ),
        Graph(
            "Preemptions by model (vLLM)",
            "Requests vLLM preempted (vllm:num_preemptions_total) per second: each one recomputes its prompt, so "
            "users see a stall. Any sustained rate: see What to change.",
            "short",
            [Q(f"sum {_by(*by)} (rate(vllm:num_preemptions_total{s.engine()}[$__rate_interval]))", model)],
            w=6,
            axis_label="preemptions/s",
            min=0,
        ),
        Graph(
            "Failed requests by model",
            "Share of finished requests that ended in error or were aborted (vllm:request_success_total by "
            "finished_reason). Aborts include clients that gave up waiting.",
            "percentunit",
            [Q(f"sum {_by(*by)} ({failed})\n/\nsum {_by(*by)} ({finished})", model)],
            w=6,
            min=0,
        ),
    ]


def _fleet(p: DashboardParams, s: _Sel) -> Rows:
    return [
        (ROW_TITLES[0], _fleet_fill(p, s)),
        (ROW_TITLES[1], _fleet_tokens(p, s)),
        (ROW_TITLES[2], _fleet_preempting(p, s)),
        (ROW_TITLES[3], _fleet_change(p, s)),
        (USERS_ROW_TITLE, _fleet_users(p, s)),
    ]


# ---------------------------------------------------------------------------
# Pod: kvcache-pod
# ---------------------------------------------------------------------------


def _latency(s: _Sel) -> Graph:
    def p95(bucket_rates: str) -> str:
        return f"histogram_quantile(0.95, sum by (le) ({bucket_rates}))"

    ttft = f"rate(vllm:time_to_first_token_seconds_bucket{s.engine()}[$__rate_interval])"
    # vLLM 0.11 renamed the inter-token histogram; `or` charts both generations.
    itl = (
        f"rate(vllm:inter_token_latency_seconds_bucket{s.engine()}[$__rate_interval])"
        f" or rate(vllm:time_per_output_token_seconds_bucket{s.engine()}[$__rate_interval])"
    )
    return Graph(
        "Latency p95 (vLLM)",
        "What users feel, from vLLM's own histograms over the selected pods: time to first token and inter-token "
        "latency, 95th percentile. Rising with usage near the watermark: requests queue for KV; see the preemption "
        "row. Inter-token latency is on the right-hand axis: it is about a hundredth of the time to first token.",
        "s",
        [Q(p95(ttft), "time to first token p95"), Q(p95(itl), "inter-token latency p95")],
        min=0,
        right_axis=("inter-token latency p95",),
    )


def _pod_fill(p: DashboardParams, s: _Sel) -> list[Panel]:
    engine = f"{_legend(p.pod_label)} engine {{{{engine}}}}"
    cap = TIME_UNTIL_GRAPH_CAP_S
    return [
        Graph(
            "KV usage",
            f"KV-cache usage of each engine of the pod, with the {_pct(p.thresholds.warning)} ticket and "
            f"{_pct(p.thresholds.watermark)} paging thresholds. In the red band new requests queue and running "
            "ones get preempted once it is full.",
            "percentunit",
            [Q(f"kvcache_usage_ratio{s.engine()}", engine)],
            min=0,
            max=1,
            thresholds=_usage_steps(p.thresholds),
            runbook=_runbook(p, "KVCacheAlmostFull"),
        ),
        _latency(s),
        Graph(
            "KV pool in tokens",
            "The usable KV pool of the selected pods, stacked: tokens held, free tokens below the watermark "
            "(kvcache_watermark_headroom_tokens), and the free tokens above it. When the green band is gone the "
            "watermark is crossed.",
            "short",
            [
                Q(f"sum(kvcache_used_tokens{s.engine()})", "used"),
                Q(f"sum(kvcache_watermark_headroom_tokens{s.engine()})", "free below the watermark"),
                Q(
                    f"sum(kvcache_free_tokens{s.engine()}) - sum(kvcache_watermark_headroom_tokens{s.engine()})",
                    "free above the watermark",
                ),
            ],
            axis_label="tokens",
            min=0,
            stacked=True,
            colors={"used": "blue", "free below the watermark": "green", "free above the watermark": "red"},
        ),
        Graph(
            "Time until full and until the watermark",
            f"At the current fill trend, the time until the cache is full and until the paging watermark, on a log "
            f"axis from 1 min to {cap // 3600} h (a line at the top is not filling). Below {p.full_soon_within}: "
            "KVCacheFullSoon.",
            "s",
            [
                Q(_until(f"kvcache_time_until_full_seconds{s.engine()}"), f"until full {engine}"),
                Q(_until(f"kvcache_time_until_watermark_seconds{s.engine()}"), f"until watermark {engine}"),
            ],
            min=TIME_UNTIL_GRAPH_FLOOR_S,
            max=cap,
            log_scale=True,
            thresholds=_steps((None, "red"), (prometheus_duration_seconds(p.full_soon_within), "transparent")),
            runbook=_runbook(p, "KVCacheFullSoon"),
        ),
    ]


def _pod_tokens(p: DashboardParams, s: _Sel) -> list[Panel]:
    engine = f"{_legend(p.pod_label)} engine {{{{engine}}}}"
    tol = p.capacity_mismatch_tolerance
    return [
        Graph(
            "Fill rate",
            "Trend of the KV demand in tokens per second (kvcache_fill_rate_tokens_per_second). Positive and steady: "
            "the cache is filling; the time until full follows from it.",
            TOKENS_PER_S,
            [Q(f"kvcache_fill_rate_tokens_per_second{s.engine()}", engine)],
            w=6,
            axis_label="tokens/s",
        ),
        Graph(
            "Theoretical vs actual capacity",
            "vLLM's KV capacity in tokens against what the model's shape gives for vLLM's KV budget (budget=exact) "
            "or for the GPU memory (budget=estimated). Apart: check dtype, TP and num_gpu_blocks_override.",
            "short",
            [
                Q(f"kvcache_capacity_tokens{s.engine()}", f"vLLM {engine}"),
                Q(f"kvcache_theoretical_capacity_tokens{s.engine()}", f"theoretical ({{{{budget}}}}) {engine}"),
            ],
            w=6,
            axis_label="tokens",
            min=0,
        ),
        Graph(
            "Capacity efficiency",
            f"vLLM's capacity / the theoretical one. Outside 1 ± {_pct(tol)} with budget=exact: configuration drift "
            "(KVCacheCapacityMismatch).",
            "percentunit",
            [Q(f"kvcache_capacity_efficiency_ratio{s.engine()}", f"{{{{budget}}}} {engine}")],
            w=6,
            thresholds=_steps((None, "red"), (1 - tol, "green"), (1 + tol, "red")),
            runbook=_runbook(p, "KVCacheCapacityMismatch"),
        ),
        Graph(
            "Max concurrent requests vs running",
            "Requests that fit in the pool at once, by basis (vLLM's max_model_len assumption, observed mean and p95 "
            "lengths), against the requests running. Running near observed_mean: concurrency is at the KV limit.",
            "short",
            [
                Q(f"kvcache_max_concurrent_requests{s.engine()}", f"fits ({{{{basis}}}}) {engine}"),
                Q(f"kvcache_requests_running{s.engine()}", f"running {engine}"),
            ],
            w=6,
            axis_label="requests",
            min=0,
        ),
    ]


def _pod_preempting(p: DashboardParams, s: _Sel) -> list[Panel]:
    by_pod = _by(p.namespace_label, p.pod_label, "model_name")
    hits = f"sum {by_pod} (rate(kvcache_prefix_cache_hits_tokens_total{s.engine()}[$__rate_interval]))"
    queries = f"sum {by_pod} (rate(kvcache_prefix_cache_queries_tokens_total{s.engine()}[$__rate_interval]))"
    # vLLM V0 exports a hit-rate gauge and no counters; the sidecar passes it on as the ratio
    v0_gauge = f"avg {by_pod} (kvcache_prefix_cache_hit_ratio{s.engine()})"
    return [
        Graph(
            "Requests running and waiting",
            "Requests in the running batch and waiting, by vLLM's reason (capacity: KV blocks, max_num_seqs or the "
            "token budget). Waiting while usage is above the watermark is KV pressure.",
            "short",
            [
                Q(f"sum(kvcache_requests_running{s.engine()})", "running"),
                Q(f"sum by (reason) (kvcache_requests_waiting{s.engine()})", "waiting: {{reason}}"),
            ],
            w=8,
            axis_label="requests",
            min=0,
            runbook=_runbook(p, "KVCacheRequestsWaitingForKV"),
        ),
        Graph(
            "Preemptions per second",
            "Requests preempted for lack of KV blocks, per second. Sustained above 0: the pool is too small for the "
            "load; see What to change.",
            "short",
            [
                Q(
                    f"sum {_by(p.namespace_label, p.pod_label, 'model_name', 'engine')} "
                    f"(rate(kvcache_preemptions_total{s.engine()}[$__rate_interval]))",
                    f"{_legend(p.pod_label)} engine {{{{engine}}}}",
                )
            ],
            w=8,
            axis_label="preemptions/s",
            min=0,
            runbook=_runbook(p, "KVCachePreemptions"),
        ),
        Graph(
            "Prefix-cache hit ratio",
            "Prompt tokens found in the prefix cache / tokens looked up, over the rate interval (V0 engines: "
            "vLLM's own hit-rate gauge). Low with shared system prompts: check routing affinity and "
            "enable_prefix_caching (KVCachePrefixHitRatioLow).",
            "percentunit",
            [Q(f"{hits}\n/\n{queries}\nor {v0_gauge}", _legend(p.pod_label))],
            w=8,
            min=0,
            max=1,
            runbook=_runbook(p, "KVCachePrefixHitRatioLow"),
        ),
    ]


def _pod_change(p: DashboardParams, s: _Sel) -> list[Panel]:
    keys = (p.namespace_label, p.pod_label, "model_name", "engine")
    return [
        Graph(
            "Suggested vs current gpu_memory_utilization",
            "The --gpu-memory-utilization at which the recent peak demand sits at the target usage, by basis, "
            "against the one vLLM runs with now. Apply the suggestion on the next deploy when the recommendation "
            "says raise/lower_gpu_memory_utilization (with --kv-cache-memory-bytes set, vLLM ignores utilization).",
            "percentunit",
            [
                Q(
                    f"kvcache_suggested_gpu_memory_utilization{s.engine()}",
                    f"suggested ({{{{basis}}}}) {_legend(p.pod_label)} engine {{{{engine}}}}",
                ),
                Q(
                    f"kvcache_gpu_memory_utilization{s.engine()}",
                    f"current {_legend(p.pod_label)} engine {{{{engine}}}}",
                ),
            ],
            min=0,
            max=1,
        ),
        Table(
            "Recommendation",
            "The sidecar's current top recommendation for each engine of the pod. Follow the action on the next "
            "change window; what each reason means: docs/forecast.md.",
            [Q(f"max {_by(*keys, 'action', 'reason')} (kvcache_recommendation_info{s.engine()})")],
            {p.pod_label: "Pod", "model_name": "Model", "engine": "Engine", "action": "Action", "reason": "Reason"},
            styles={"Action": _mapped(_enum_text(ACTION_TEXT)), "Reason": _mapped(_enum_text(REASON_TEXT))},
        ),
    ]


def _titles(p: DashboardParams, titles: tuple[str, ...], labels: tuple[str, ...]) -> dict[str, str]:
    """Column titles of an info table: the pod and engine first, then each label's title."""
    return {p.pod_label: "Pod", "model_name": "Model", "engine": "Engine", **dict(zip(labels, titles, strict=True))}


def _pod_info(p: DashboardParams, s: _Sel) -> list[Panel]:
    model_labels = ("architecture", "attention", "kv_dtype", "tp", "pp")
    server_labels = ("engine_kind", "metrics_generation", *CACHE_SETTINGS, "hybrid")
    keys = (p.pod_label, "model_name", "engine")
    errors = (
        f"sum {_by(p.namespace_label, p.pod_label, 'reason')} "
        f"(rate(kvcache_sidecar_scrape_errors_total{s.pod_only()}[$__rate_interval]))"
    )
    return [
        Table(
            "Model",
            "What the sidecar's capacity model assumes: architecture, attention kind, KV dtype, TP and PP. Check "
            "after a model or flag change that it still matches vLLM.",
            [Q(f"max by ({', '.join(keys + model_labels)}) (kvcache_model_info{s.engine()})")],
            _titles(p, ("Architecture", "Attention", "KV dtype", "TP", "PP"), model_labels),
            h=5,
        ),
        Table(
            "Server",
            "The inference server as the sidecar reads it: kind, detected metrics generation, cache settings. A new "
            "metrics_generation after an upgrade is expected.",
            [Q(f"max by ({', '.join(keys + server_labels)}) (kvcache_server_info{s.engine()})")],
            _titles(
                p,
                (
                    "Engine kind",
                    "Metrics generation",
                    "Block size",
                    "GPU blocks",
                    "Cache dtype",
                    "GPU memory util.",
                    "KV cache memory",
                    "Prefix caching",
                    "Hybrid",
                ),
                server_labels,
            ),
            units={"GPU memory util.": "percentunit", "KV cache memory": "bytes"},
            numeric=("gpu_memory_utilization", "kv_cache_memory_bytes"),
            h=5,
        ),
        Graph(
            "Sidecar scrape health",
            "1 when the sidecar's last scrape of vLLM succeeded, and when Prometheus' last scrape of the sidecar did "
            "(up). 0 for long: vLLM is down or loading (KVCacheSidecarScrapeFailing), or the sidecar is "
            "(KVCacheSidecarDown).",
            "none",
            [
                Q(f"kvcache_sidecar_target_up{s.pod_only()}", f"sidecar → {{{{target}}}} {_legend(p.pod_label)}"),
                Q("up" + s.pod_only(f'job="{p.sidecar_job}"'), f"Prometheus → sidecar {_legend(p.pod_label)}"),
            ],
            w=8,
            axis_label="up = 1",
            min=0,
            max=1,
            runbook=_runbook(p, "KVCacheSidecarDown"),
        ),
        Graph(
            "Sidecar scrape duration",
            "How long the sidecar's last scrape of vLLM took (HTTP and parsing). Rising towards the target's "
            "timeout: vLLM answers slowly, typically when saturated; past it the scrapes fail (see errors).",
            "s",
            [Q(f"kvcache_sidecar_scrape_duration_seconds{s.pod_only()}", f"{_legend(p.pod_label)} → {{{{target}}}}")],
            w=8,
            min=0,
        ),
        Graph(
            "Sidecar scrape errors",
            "Failed scrapes of vLLM per second, by reason (refused, timeout, http_5xx, ...; every reason is exported "
            "from the start, at 0). The reason says where to look: the network, vLLM's health, the URL, or the "
            "body size limit.",
            "short",
            [Q(errors, f"{{{{reason}}}} {_legend(p.pod_label)}")],
            w=8,
            axis_label="errors/s",
            min=0,
            runbook=_runbook(p, "KVCacheSidecarScrapeFailing"),
        ),
    ]


def _pod(p: DashboardParams, s: _Sel) -> Rows:
    return [
        (ROW_TITLES[0], _pod_fill(p, s)),
        (ROW_TITLES[1], _pod_tokens(p, s)),
        (ROW_TITLES[2], _pod_preempting(p, s)),
        (ROW_TITLES[3], _pod_change(p, s)),
        ("Model, server and sidecar", _pod_info(p, s)),
    ]


# ---------------------------------------------------------------------------
# Capacity planning: kvcache-capacity (recording rules, per day)
# ---------------------------------------------------------------------------


def _capacity_summary(p: DashboardParams, s: _Sel) -> Table:
    m = s.model()
    return Table(
        "Per model over the selected range",
        "For each model over the dashboard's range (a week by default): peak and p95 of the highest pod usage, "
        "hours per day above the warning and the watermark, preemptions per day and the highest suggested "
        "gpu_memory_utilization. Plan capacity where hours above the watermark or preemptions are not 0. Per day "
        "means at the pace of the time the model was observed: a model seen for 3 hours, 1 of them above, reads "
        "8 hours/day.",
        [
            Q(f"max_over_time(namespace_model:kvcache_usage_ratio:max{m}[$__range])"),
            Q(f"quantile_over_time(0.95, namespace_model:kvcache_usage_ratio:max{m}[$__range])"),
            Q(f"avg_over_time(namespace_model:kvcache_usage_above_warning:bool{m}[$__range]) * 24"),
            Q(f"avg_over_time(namespace_model:kvcache_usage_above_watermark:bool{m}[$__range]) * 24"),
            Q(f"avg_over_time(namespace_model:kvcache_preemptions:rate5m{m}[$__range]) * 86400"),
            Q(f"max_over_time(namespace_model:kvcache_suggested_gpu_memory_utilization:max{m}[$__range])"),
        ],
        {
            p.namespace_label: "Namespace",
            "model_name": "Model",
            "Value #A": "Peak usage",
            "Value #B": "p95 usage",
            "Value #C": "Hours/day above warning",
            "Value #D": "Hours/day above watermark",
            "Value #E": "Preemptions/day",
            "Value #F": "Suggested gpu_memory_utilization",
        },
        units={
            "Peak usage": "percentunit",
            "p95 usage": "percentunit",
            "Hours/day above warning": "h",
            "Hours/day above watermark": "h",
            "Preemptions/day": "short",
            "Suggested gpu_memory_utilization": "percentunit",
        },
        styles={"Peak usage": _colored(_usage_steps(p.thresholds)), "p95 usage": _colored(_usage_steps(p.thresholds))},
        w=24,
        h=6,
        sort_by="Peak usage",
    )


def _capacity_usage(p: DashboardParams, s: _Sel) -> list[Panel]:
    m = s.model()
    model = _legend(p.namespace_label, "model_name")
    return [
        _capacity_summary(p, s),
        Graph(
            "Peak and p95 usage per day",
            "Per model, over the trailing day: the peak and the 95th percentile of the highest pod usage. A p95 "
            "near the watermark means the model runs saturated for more than an hour a day.",
            "percentunit",
            [
                Q(f"max_over_time(namespace_model:kvcache_usage_ratio:max{m}[1d])", f"{model} peak"),
                Q(f"quantile_over_time(0.95, namespace_model:kvcache_usage_ratio:max{m}[1d])", f"{model} p95"),
            ],
            min=0,
            max=1,
            thresholds=_usage_steps(p.thresholds),
            runbook=_runbook(p, "KVCacheOverProvisioned"),
        ),
        Graph(
            "Hours per day above the warning and the watermark",
            f"Per model, over the trailing day: hours during which some pod was above the {_pct(p.thresholds.warning)}"
            f" warning and above the {_pct(p.thresholds.watermark)} watermark. Hours above the watermark are hours of "
            "queueing and preemption risk. Measured over the part of the day the model was observed, scaled to 24 "
            "hours (a model that started an hour ago reads at that hour's pace).",
            "h",
            [
                Q(f"avg_over_time(namespace_model:kvcache_usage_above_warning:bool{m}[1d]) * 24", f"{model} warning"),
                Q(
                    f"avg_over_time(namespace_model:kvcache_usage_above_watermark:bool{m}[1d]) * 24",
                    f"{model} watermark",
                ),
            ],
            min=0,
        ),
    ]


def _capacity_tokens(p: DashboardParams, s: _Sel) -> list[Panel]:
    m = s.model()
    model = _legend(p.namespace_label, "model_name")
    capacity = f"max_over_time(namespace_model:kvcache_usable_tokens:sum{m}[1d])"
    return [
        Graph(
            "KV capacity per day",
            "Per model, over the trailing day: the largest usable KV capacity of its pods in tokens. A step is a "
            "change of replicas or cache settings; compare it with the demand's share beside it.",
            "short",
            [Q(capacity, f"{model} capacity")],
            axis_label="tokens",
            min=0,
        ),
        Graph(
            "Peak demand as a share of capacity per day",
            "Per model, over the trailing day: the peak KV demand divided by the capacity (100% fills the pool, 300% "
            "needs three times it). A ratio rather than both in tokens, where a demand many times the capacity "
            "squashes the capacity onto the x axis. Above 100%: the model needs more KV (see the suggested "
            "utilization below).",
            "percentunit",
            [Q(f"max_over_time(namespace_model:kvcache_demand_tokens:sum{m}[1d])\n/\n{capacity}", f"{model} peak")],
            min=0,
            thresholds=_steps((None, "green"), (1, "red")),
        ),
    ]


def _capacity_preempting(p: DashboardParams, s: _Sel) -> list[Panel]:
    m = s.model()
    model = _legend(p.namespace_label, "model_name")
    return [
        Graph(
            "Preemptions per day",
            "Per model, requests preempted for lack of KV blocks over the trailing day, at the pace of the part of "
            "the day the model was observed. Not 0 on most days: the KV pool is too small for the load.",
            "short",
            [Q(f"avg_over_time(namespace_model:kvcache_preemptions:rate5m{m}[1d]) * 86400", model)],
            axis_label="preemptions/day",
            min=0,
        ),
        Graph(
            "Peak requests waiting per day",
            "Per model and reason, the most requests waiting at once over the trailing day. Waiting for capacity "
            "with hours above the watermark is KV pressure.",
            "short",
            [
                Q(
                    f"max_over_time(namespace_model_reason:kvcache_requests_waiting:sum{m}[1d])",
                    f"{model} {{{{reason}}}}",
                )
            ],
            axis_label="requests",
            min=0,
        ),
    ]


def _capacity_change(p: DashboardParams, s: _Sel) -> list[Panel]:
    m = s.model()
    model = _legend(p.namespace_label, "model_name")
    return [
        Graph(
            "Suggested gpu_memory_utilization per day",
            f"Per model, the highest --gpu-memory-utilization its pods suggested over the trailing day (the value "
            f"that puts the peak at the {_pct(p.thresholds.target_usage)} target usage). Steady above what vLLM runs "
            "with: raise it; below: lower it or run fewer replicas.",
            "percentunit",
            [
                Q(
                    f"max_over_time(namespace_model:kvcache_suggested_gpu_memory_utilization:max{m}[1d])",
                    f"{model} suggested",
                )
            ],
            w=24,
            min=0,
            max=1,
        ),
    ]


def _capacity(p: DashboardParams, s: _Sel) -> Rows:
    return [
        (ROW_TITLES[0], _capacity_usage(p, s)),
        (ROW_TITLES[1], _capacity_tokens(p, s)),
        (ROW_TITLES[2], _capacity_preempting(p, s)),
        (ROW_TITLES[3], _capacity_change(p, s)),
    ]


# ---------------------------------------------------------------------------
# What every dashboard has: variables, annotations, links
# ---------------------------------------------------------------------------


def _variables(p: DashboardParams) -> list[Any]:
    """The data source, then cluster -> namespace -> model_name -> pod, each filtered by the ones before.

    Where no series has a cluster label the cluster variable has no value but "All" (``.*``), which
    matches series without the label: every dashboard works as if it had no such variable."""
    cluster = f'{p.cluster_label}=~"${VAR_CLUSTER}"'
    namespace = f'{cluster}, {p.namespace_label}=~"${VAR_NAMESPACE}"'
    chain = [
        (VAR_CLUSTER, "Cluster", p.cluster_label, "kvcache_usage_ratio"),
        (VAR_NAMESPACE, "Namespace", p.namespace_label, f"kvcache_usage_ratio{{{cluster}}}"),
        (VAR_MODEL_NAME, "Model", "model_name", f"kvcache_usage_ratio{{{namespace}}}"),
        (VAR_POD, "Pod", p.pod_label, f'kvcache_usage_ratio{{{namespace}, model_name=~"${VAR_MODEL_NAME}"}}'),
    ]
    out: list[Any] = [db.DatasourceVariable(VAR_DATASOURCE).label("Data source").type("prometheus")]
    for name, label, source_label, series in chain:
        out.append(
            db.QueryVariable(name)
            .label(label)
            .datasource(_datasource())
            .query(f"label_values({series}, {source_label})")
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )
    return out


def _annotations(p: DashboardParams, s: _Sel) -> list[tuple[db.AnnotationQuery, dict[str, str]]]:
    """(annotation, the keys the SDK cannot set) for restarts, configuration changes and KVCacheAlmostFull."""
    ns, pod = p.namespace_label, p.pod_label
    where = f"{_legend(ns)}/{_legend(pod)}"
    started = f"process_start_time_seconds{s.pod_only()}"
    settings = (ns, "model_name", *CACHE_SETTINGS)

    def query(name: str, color: str, expr: str) -> db.AnnotationQuery:
        return db.AnnotationQuery().name(name).datasource(_datasource()).enable(True).icon_color(color).expr(expr)

    return [
        (
            # A new process start time of a vLLM target: a restart in place (the value changes) or a
            # new pod (a rollout: the series is new, absent a rate interval ago; also true once where
            # Prometheus' data begins). The `and` drops the sidecar's own process (same pod, other
            # instance). Over $__rate_interval, which overlaps the previous step by a scrape, so a
            # change between two steps is not missed.
            query(
                "vLLM restarts",
                "purple",
                f"(\n  changes({started}[$__rate_interval]) > 0\n  or\n"
                f"  ({started} unless {started} offset $__rate_interval)\n)\n"
                f"and on ({ns}, {pod}, instance) vllm:num_requests_running{s.pod_only()}",
            ),
            {"titleFormat": "vLLM restarted", "textFormat": where, "tagKeys": f"{ns},{pod}"},
        ),
        (
            # A change the sidecar saw in place (its counter), or cache settings the model did not run with
            # a rate interval ago anywhere in the namespace (a rollout with new flags replaces the pods,
            # and their sidecars with them; a rollout with the same flags is not a change).
            query(
                "Configuration changes",
                "blue",
                f"increase(kvcache_sidecar_config_changes_total{s.pod_only()}[$__rate_interval]) > 0\n"
                f"or\n(\n  kvcache_server_info{s.engine()}\n"
                f"  unless on ({', '.join(settings)})\n"
                f"  kvcache_server_info{s.engine()} offset $__rate_interval\n)",
            ),
            {"titleFormat": "vLLM cache configuration changed", "textFormat": where, "tagKeys": f"{ns},{pod}"},
        ),
        (
            query(
                "KVCacheAlmostFull",
                "red",
                f'ALERTS{{alertname="KVCacheAlmostFull", alertstate="firing", {s.engine()[1:-1]}}}',
            ),
            {
                "titleFormat": "KVCacheAlmostFull ({{severity}})",
                "textFormat": f"{{{{model_name}}}} on {where}",
                "tagKeys": "severity",
            },
        ),
    ]


def _links(uid: str, p: DashboardParams) -> list[cogbuilder.Builder[dm.DashboardLink]]:
    """The two other dashboards (keeping the variables and the time range), then the runbooks."""
    out: list[cogbuilder.Builder[dm.DashboardLink]] = [
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/{other}")
        .icon("dashboard")
        .tooltip(f"Open {title} with the same variables and time range")
        .include_vars(True)
        .keep_time(True)
        for other, title in TITLES.items()
        if other != uid
    ]
    out.append(
        db.DashboardLink("Runbooks")
        .type(dm.DashboardLinkType.LINK)
        .url(p.runbook_base_url)
        .icon("doc")
        .tooltip("What to do for each KVCache* alert")
        .target_blank(True)
    )
    return out


# ---------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    uid: str
    description: str
    time_from: str
    refresh: str
    rows: Rows


def _specs(p: DashboardParams, s: _Sel) -> list[_Spec]:
    return [
        _Spec(
            DASHBOARD_OVERVIEW_UID,
            "Is any pod about to run out of KV cache, how fast, is it preempting, and what to change: every model "
            "and pod of the selected namespaces. The page KV-cache alerts open.",
            "now-6h",
            "1m",
            _fleet(p, s),
        ),
        _Spec(
            DASHBOARD_POD_UID,
            "One pod's KV cache: its pool in tokens, trend, capacity model, queues, the users' latency, what to "
            "change, and the sidecar's own health.",
            "now-6h",
            "1m",
            _pod(p, s),
        ),
        _Spec(
            DASHBOARD_CAPACITY_UID,
            "A week per model from the recording rules: peak and p95 usage, demand vs capacity, hours above the "
            "thresholds, preemptions per day and the suggested gpu_memory_utilization.",
            "now-7d",
            "5m",
            _capacity(p, s),
        ),
    ]


def _build(spec: _Spec, p: DashboardParams, s: _Sel) -> dict[str, Any]:
    d = (
        db.Dashboard(TITLES[spec.uid])
        .uid(spec.uid)
        .description(spec.description)
        .tags([TAG])
        .readonly()
        .timezone("utc")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time(spec.time_from, "now")
        .refresh(spec.refresh)
        .variables(_variables(p))
        .links(_links(spec.uid, p))
    )
    annotations = _annotations(p, s)
    for annotation, _ in annotations:
        d = d.annotation(annotation)
    for title, panels in spec.rows:
        d = d.with_row(db.Row(title))
        for panel in panels:
            d = d.with_panel(panel.build())
    model = d.build()
    for i, built in enumerate(model.panels or [], start=1):
        built.id_val = i
    doc: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    # Fallback: Prometheus annotation keys the SDK's AnnotationQuery has no field for.
    for encoded, (_, extra) in zip(doc["annotations"]["list"], annotations, strict=True):
        encoded.update(extra)
    return doc


def build_dashboards(params: DashboardParams | None = None) -> dict[str, dict[str, Any]]:
    """uid -> the dashboard's JSON mapping (classic Grafana 11.6 schema), for these parameters."""
    p = params or DashboardParams()
    s = _Sel(p.namespace_label, p.pod_label, p.cluster_label)
    return {spec.uid: _build(spec, p, s) for spec in _specs(p, s)}


def render_dashboard_json(dashboard: dict[str, Any]) -> str:
    """Stable text: sorted keys, two-space indent, a trailing newline."""
    return JSONEncoder(sort_keys=True, indent=2, ensure_ascii=False).encode(dashboard) + "\n"
