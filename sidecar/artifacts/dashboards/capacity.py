"""**KV cache / Capacity planning** (``kvcache-capacity``): a week per model, per day.

Reads only the recording rules of :func:`sidecar.artifacts.rules.recording_rules` (grouped by
namespace and model), so a week of history costs Prometheus a handful of series: peak and p95 usage,
hours above the thresholds, capacity against demand, preemptions and waiting requests per day,
the suggested gpu_memory_utilization and the workloads' sizing as the weekly report computes it
(:mod:`.workload`).
"""

from __future__ import annotations

from ..formatting import percent
from ..params import DASHBOARD_CAPACITY_UID
from .display import colored_cells, threshold_steps, usage_thresholds
from .inputs import ROW_TITLES, DashboardParams, runbook_url
from .panel_kit import DashboardSpec, Graph, Panel, Q, Table
from .promql import Selectors, legend_format
from .workload import workload_table


def _capacity_summary(p: DashboardParams, s: Selectors) -> Table:
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
        styles={
            "Peak usage": colored_cells(usage_thresholds(p.thresholds)),
            "p95 usage": colored_cells(usage_thresholds(p.thresholds)),
        },
        w=24,
        h=6,
        sort_by="Peak usage",
    )


def _capacity_usage(p: DashboardParams, s: Selectors) -> list[Panel]:
    m = s.model()
    model = legend_format(p.namespace_label, "model_name")
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
            thresholds=usage_thresholds(p.thresholds),
            runbook=runbook_url(p, "KVCacheOverProvisioned"),
        ),
        Graph(
            "Hours per day above the warning and the watermark",
            "Per model, over the trailing day: hours during which some pod was above the "
            f"{percent(p.thresholds.warning)} warning and above the {percent(p.thresholds.watermark)} watermark. "
            "Hours above the watermark are hours of "
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


def _capacity_tokens(p: DashboardParams, s: Selectors) -> list[Panel]:
    m = s.model()
    model = legend_format(p.namespace_label, "model_name")
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
            thresholds=threshold_steps((None, "green"), (1, "red")),
        ),
    ]


def _capacity_preempting(p: DashboardParams, s: Selectors) -> list[Panel]:
    m = s.model()
    model = legend_format(p.namespace_label, "model_name")
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


def _capacity_change(p: DashboardParams, s: Selectors) -> list[Panel]:
    m = s.model()
    model = legend_format(p.namespace_label, "model_name")
    return [
        Graph(
            "Suggested gpu_memory_utilization per day",
            f"Per model, the highest --gpu-memory-utilization its pods suggested over the trailing day (the value "
            f"that puts the peak at the {percent(p.thresholds.target_usage)} target usage). Steady above what vLLM "
            "runs with: raise it; below: lower it or run fewer replicas.",
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
        workload_table(p, s, over_range=True),
    ]


def spec(p: DashboardParams, s: Selectors) -> DashboardSpec:
    """The Capacity planning dashboard: the four on-call rows over a week of recording rules."""
    return DashboardSpec(
        DASHBOARD_CAPACITY_UID,
        "A week per model from the recording rules: peak and p95 usage, demand vs capacity, hours above the "
        "thresholds, preemptions per day and the suggested gpu_memory_utilization.",
        "now-7d",
        "5m",
        [
            (ROW_TITLES[0], _capacity_usage(p, s)),
            (ROW_TITLES[1], _capacity_tokens(p, s)),
            (ROW_TITLES[2], _capacity_preempting(p, s)),
            (ROW_TITLES[3], _capacity_change(p, s)),
        ],
    )
