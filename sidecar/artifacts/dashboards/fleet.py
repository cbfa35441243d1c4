"""**KV cache / Fleet** (``kvcache-overview``), the page most alerts open.

Every model and pod of the selected namespaces, one row per on-call question: firing alerts, pods
above the watermark, the worst time until full and usage by pod against the thresholds; per model
capacity vs demand; preemptions and requests waiting for KV; one recommendation per workload (the
weekly report's sizing, :mod:`.workload`) and each pod's own; and last, what users feel (latency,
queue, errors) from vLLM's own series. A pod table drills down to :mod:`.pod`.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from ...forecast.recommendation import ACTION_TEXT, REASON_TEXT
from ...units import prometheus_duration_seconds
from ..formatting import percent, promql_number
from ..params import DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID, VAR_DATASOURCE, VAR_MODEL_NAME, VAR_NAMESPACE, VAR_POD
from .display import (
    TIME_UNTIL_GRAPH_CAP_S,
    TIME_UNTIL_GRAPH_FLOOR_S,
    TIME_UNTIL_STAT_CAP_S,
    colored_cells,
    enum_texts,
    mapped_cells,
    not_filling,
    threshold_steps,
    usage_thresholds,
)
from .inputs import ROW_TITLES, USERS_ROW_TITLE, VAR_CLUSTER, DashboardParams, runbook_url
from .panel_kit import DashboardSpec, Graph, Panel, Q, Stat, Table
from .promql import Selectors, by_labels, clamped_time_until, legend_format
from .workload import workload_table

#: alerts/alertmanager.yaml's inhibit rule, which the Fleet's alert table applies: a critical source alert
#: mutes the warning targets on the same pod (``equal``: namespace, pod, and these).
INHIBIT_SOURCES = ("KVCacheAlmostFull", "KVCacheFullSoon")
INHIBIT_TARGETS = ("KVCacheAlmostFull", "KVCachePreemptions", "KVCacheRequestsWaitingForKV")
INHIBIT_EQUAL_OTHER = ("instance", "target")


def _firing_alerts(p: DashboardParams, s: Selectors) -> list[Panel]:
    alerts = "ALERTS" + s.namespace('alertname=~"KVCache.*"', 'alertstate="firing"')
    watermark = promql_number(p.thresholds.watermark)
    full_soon_s = prometheus_duration_seconds(p.full_soon_within)
    alert_runbook = runbook_url(p, "${__data.fields.alertname}")
    critical = alerts[:-1] + ', severity="critical"}'
    # alerts/alertmanager.yaml's inhibit rule, as a set: the firing alerts less the targets muted by a source
    # with the same `equal` labels (a label absent on both counts as equal there and in PromQL's `on`)
    source = "ALERTS" + s.namespace(
        f'alertname=~"{"|".join(INHIBIT_SOURCES)}"', 'alertstate="firing"', 'severity="critical"'
    )
    target = "ALERTS" + s.namespace(
        f'alertname=~"{"|".join(INHIBIT_TARGETS)}"', 'alertstate="firing"', 'severity="warning"'
    )
    equal = by_labels(p.namespace_label, p.pod_label, *INHIBIT_EQUAL_OTHER)[3:]
    delivered = f"{alerts}\nunless\n({target}\n  and on {equal}\n  {source})"
    return [
        Stat(
            "Pages firing (critical)",
            "Critical KVCache* alerts firing now in the selected namespaces: what paged. Warnings (tickets) are "
            "listed in the table beside it, not counted here. Above 0: open the table and each alert's runbook.",
            "none",
            Q(f"count({critical}) or vector(0)", "paging", instant=True),
            threshold_steps((None, "green"), (1, "red")),
        ),
        Stat(
            "Pods above the watermark",
            f"Pods with an engine above the {percent(p.thresholds.watermark)} paging watermark now. Above 0: those "
            "pods queue and preempt; see the usage and pod tables, then What to change.",
            "none",
            Q(
                f"count(max by ({p.namespace_label}, {p.pod_label}) (kvcache_usage_ratio{s.engine()}) > {watermark})"
                " or vector(0)",
                "pods",
                instant=True,
            ),
            threshold_steps((None, "green"), (1, "red")),
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
            threshold_steps((None, "red"), (full_soon_s, "orange"), (4 * full_soon_s, "green")),
            mappings=[not_filling(TIME_UNTIL_STAT_CAP_S)],
            runbook=runbook_url(p, "KVCacheFullSoon"),
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


def _pod_table(p: DashboardParams, s: Selectors) -> Table:
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
        styles={
            "Usage": colored_cells(usage_thresholds(p.thresholds)),
            "Time until full": mapped_cells(not_filling(cap)),
        },
        sort_by="Usage",
        links=[db.DashboardLink("Open the pod dashboard").url(drill)],
    )


def _fleet_fill(p: DashboardParams, s: Selectors) -> list[Panel]:
    return [
        *_firing_alerts(p, s),
        Graph(
            "KV usage by pod",
            f"KV-cache usage of each engine (kvcache_usage_ratio), with the {percent(p.thresholds.warning)} ticket and "
            f"{percent(p.thresholds.watermark)} paging thresholds drawn. A line whose peaks keep reaching the red band "
            "pages (KVCacheAlmostFull: above it for 5% of 10 minutes by default); compare its neighbours to tell "
            "load from imbalance.",
            "percentunit",
            [
                Q(
                    f"kvcache_usage_ratio{s.engine()}",
                    f"{legend_format(p.pod_label)} {{{{model_name}}}} engine {{{{engine}}}}",
                )
            ],
            min=0,
            max=1,
            thresholds=usage_thresholds(p.thresholds),
            runbook=runbook_url(p, "KVCacheAlmostFull"),
        ),
        _pod_table(p, s),
    ]


def _fleet_tokens(p: DashboardParams, s: Selectors) -> list[Panel]:
    by = f"by ({p.namespace_label}, model_name)"
    model = legend_format(p.namespace_label, "model_name")
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
            f"{percent(p.thresholds.watermark)} watermark line: the cache is the bottleneck; see What to change.",
            "percentunit",
            [Q(f"sum {by} (kvcache_demand_tokens{s.engine()})\n/\n{capacity}", f"{model} demand / capacity")],
            w=6,
            min=0,
            thresholds=threshold_steps((None, "green"), (p.thresholds.watermark, "red")),
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
                    clamped_time_until(f"kvcache_time_until_full_seconds{s.engine()}"),
                    f"{legend_format(p.pod_label)} engine {{{{engine}}}}",
                )
            ],
            min=TIME_UNTIL_GRAPH_FLOOR_S,
            max=TIME_UNTIL_GRAPH_CAP_S,
            log_scale=True,
            thresholds=threshold_steps((None, "red"), (prometheus_duration_seconds(p.full_soon_within), "transparent")),
            runbook=runbook_url(p, "KVCacheFullSoon"),
        ),
    ]


def _fleet_preempting(p: DashboardParams, s: Selectors) -> list[Panel]:
    by = f"by ({p.namespace_label}, model_name)"
    model = legend_format(p.namespace_label, "model_name")
    waiting = "kvcache_requests_waiting" + s.engine('reason=~"capacity|all"')
    above = f"(kvcache_usage_ratio{s.engine()} > bool {promql_number(p.thresholds.watermark)})"
    return [
        Graph(
            "Preemptions per second by model",
            "Requests vLLM preempted for lack of KV blocks, per second. Any sustained rate means the cache is too "
            "small for the load (KVCachePreemptions): raise capacity or lower concurrency.",
            "short",
            [Q(f"sum {by} (rate(kvcache_preemptions_total{s.engine()}[$__rate_interval]))", model)],
            axis_label="preemptions/s",
            min=0,
            runbook=runbook_url(p, "KVCachePreemptions"),
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
            runbook=runbook_url(p, "KVCacheRequestsWaitingForKV"),
        ),
    ]


def _fleet_change(p: DashboardParams, s: Selectors) -> list[Panel]:
    keys = (p.namespace_label, p.pod_label, "model_name", "engine")
    return [
        workload_table(p, s, over_range=False),
        Table(
            "Recommendation per pod",
            "Each sidecar's own top recommendation for its engine (kvcache_recommendation_info) and the "
            "gpu_memory_utilization it suggests, sized on that pod's own peak: replicas of one workload behind an "
            "uneven router can read differently here. What to apply is the workload's row above (and the weekly "
            "report); this table says which pod is hot. Reasons: docs/forecast.md.",
            [
                Q(f"max {by_labels(*keys, 'action', 'reason')} (kvcache_recommendation_info{s.engine()})"),
                Q(f"max {by_labels(*keys)} (kvcache_suggested_gpu_memory_utilization{s.engine()})"),
            ],
            {
                p.namespace_label: "Namespace",
                p.pod_label: "Pod",
                "model_name": "Model",
                "engine": "Engine",
                "action": "Action",
                "reason": "Reason",
                "Value #B": "Suggested gpu_memory_utilization",
            },
            units={"Suggested gpu_memory_utilization": "percentunit"},
            styles={"Action": mapped_cells(enum_texts(ACTION_TEXT)), "Reason": mapped_cells(enum_texts(REASON_TEXT))},
            w=24,
        ),
    ]


def _fleet_users(p: DashboardParams, s: Selectors) -> list[Panel]:
    """TTFT p95, requests waiting, preemptions and the failed and rejected shares per model, from vLLM's own
    series."""
    by = (p.namespace_label, "model_name")
    model = legend_format(*by)
    ttft = f"rate(vllm:time_to_first_token_seconds_bucket{s.engine()}[$__rate_interval])"
    finished = f"rate(vllm:request_success_total{s.engine()}[$__rate_interval])"
    failed_sel = s.engine('finished_reason=~"error|abort"')
    failed = f"rate(vllm:request_success_total{failed_sel}[$__rate_interval])"
    # vLLM 0.32+: the 503s of --max-num-queued-reqs/-tokens, per model (no engine label); such a request
    # never finishes, so its share is of the finished plus the rejected
    rejected = f"sum {by_labels(*by)} (rate(vllm:admission_rejections_total{s.engine()}[$__rate_interval]))"
    return [
        Graph(
            "Time to first token p95 by model",
            "What users wait before the first token (vllm:time_to_first_token_seconds, 95th percentile over the "
            "model's pods). Rising with KV usage: requests queue for blocks; see the rows above.",
            "s",
            [Q(f"histogram_quantile(0.95, sum {by_labels(*by, 'le')} ({ttft}))", model)],
            w=6,
            min=0,
        ),
        Graph(
            "Requests waiting by model",
            "Requests vLLM holds in its queue (vllm:num_requests_waiting), summed over the model's pods. Waiting "
            "while usage is above the watermark is KV pressure.",
            "short",
            [Q(f"sum {by_labels(*by)} (vllm:num_requests_waiting{s.engine()})", model)],
            w=6,
            axis_label="requests",
            min=0,
        ),
        Graph(
            "Preemptions by model (vLLM)",
            "Requests vLLM preempted (vllm:num_preemptions_total) per second: each one recomputes its prompt, so "
            "users see a stall. Any sustained rate: see What to change.",
            "short",
            [Q(f"sum {by_labels(*by)} (rate(vllm:num_preemptions_total{s.engine()}[$__rate_interval]))", model)],
            w=6,
            axis_label="preemptions/s",
            min=0,
        ),
        Graph(
            "Failed and rejected requests by model",
            "Share of requests users saw fail: finished ones that ended in error or were aborted "
            "(vllm:request_success_total by finished_reason; aborts include clients that gave up waiting), and "
            "requests turned away with a 503 because the queue was full (vllm:admission_rejections_total, vLLM "
            "0.32+), of the finished plus the rejected. Rejections sustained: the pool cannot drain the queue; see "
            "What to change.",
            "percentunit",
            [
                Q(f"sum {by_labels(*by)} ({failed})\n/\nsum {by_labels(*by)} ({finished})", f"{model} failed"),
                Q(
                    f"{rejected}\n/\n(sum {by_labels(*by)} ({finished}) + {rejected})",
                    f"{model} rejected at admission (503)",
                ),
            ],
            w=6,
            min=0,
        ),
    ]


def spec(p: DashboardParams, s: Selectors) -> DashboardSpec:
    """The Fleet dashboard: the four on-call rows, then what users feel."""
    return DashboardSpec(
        DASHBOARD_OVERVIEW_UID,
        "Is any pod about to run out of KV cache, how fast, is it preempting, and what to change: every model "
        "and pod of the selected namespaces. The page KV-cache alerts open.",
        "now-6h",
        "1m",
        [
            (ROW_TITLES[0], _fleet_fill(p, s)),
            (ROW_TITLES[1], _fleet_tokens(p, s)),
            (ROW_TITLES[2], _fleet_preempting(p, s)),
            (ROW_TITLES[3], _fleet_change(p, s)),
            (USERS_ROW_TITLE, _fleet_users(p, s)),
        ],
    )
