"""**KV cache / Pod** (``kvcache-pod``): one pod, opened from the Fleet's pod table or an alert.

Its pool in tokens and the trend, the capacity model against vLLM's own figure, scheduler queues and
the prefix cache, the users' latency from vLLM's own histograms, what to change, and a last row with
the model and server as the sidecar reads them and the sidecar's own health.
"""

from __future__ import annotations

from ...forecast.recommendation import ACTION_TEXT, REASON_TEXT
from ...metrics import CACHE_SETTINGS
from ...units import prometheus_duration_seconds
from ..formatting import percent
from ..params import DASHBOARD_POD_UID
from .display import (
    TIME_UNTIL_GRAPH_CAP_S,
    TIME_UNTIL_GRAPH_FLOOR_S,
    TOKENS_PER_S,
    enum_texts,
    mapped_cells,
    threshold_steps,
    usage_thresholds,
)
from .inputs import ROW_TITLES, DashboardParams, runbook_url
from .panel_kit import DashboardSpec, Graph, Panel, Q, Table
from .promql import Selectors, by_labels, clamped_time_until, legend_format


def _latency(s: Selectors) -> Graph:
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
        w=8,
        min=0,
        right_axis=("inter-token latency p95",),
    )


#: The offload tier's usage colours: a store to the tier is dropped only when no block of it can be freed,
#: so orange when nine tenths are pinned by transfers, red when nearly all are.
OFFLOAD_ORANGE, OFFLOAD_RED = 0.9, 0.98


def _offload(s: Selectors) -> Graph:
    """The second KV tier beside the GPU pool (vLLM's CPU offloading, ``--kv-offloading-size``)."""
    return Graph(
        "KV offload tier usage (CPU)",
        "Share of the offload tier's blocks pinned by transfers in flight (vLLM kv_offload_cpu_cache_usage_perc, "
        "experimental); cached-but-evictable blocks count as free. Near 1 for long: stores to the tier are "
        "dropped (raise --kv-offloading-size). The GPU pool's headroom is the KV pool in tokens panel. No data "
        "when the server has no offload tier.",
        "percentunit",
        [Q(f"max by (tier) (kvcache_offload_usage_ratio{s.engine()})", "{{tier}} tier (pinned by transfers)")],
        w=8,
        min=0,
        max=1,
        thresholds=threshold_steps((None, "green"), (OFFLOAD_ORANGE, "orange"), (OFFLOAD_RED, "red")),
    )


def _pod_fill(p: DashboardParams, s: Selectors) -> list[Panel]:
    engine = f"{legend_format(p.pod_label)} engine {{{{engine}}}}"
    cap = TIME_UNTIL_GRAPH_CAP_S
    return [
        Graph(
            "KV usage",
            f"KV-cache usage of each engine of the pod, with the {percent(p.thresholds.warning)} ticket and "
            f"{percent(p.thresholds.watermark)} paging thresholds. In the red band new requests queue and running "
            "ones get preempted once it is full.",
            "percentunit",
            [Q(f"kvcache_usage_ratio{s.engine()}", engine)],
            w=8,
            min=0,
            max=1,
            thresholds=usage_thresholds(p.thresholds),
            runbook=runbook_url(p, "KVCacheAlmostFull"),
        ),
        _offload(s),
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
            w=8,
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
                Q(clamped_time_until(f"kvcache_time_until_full_seconds{s.engine()}"), f"until full {engine}"),
                Q(clamped_time_until(f"kvcache_time_until_watermark_seconds{s.engine()}"), f"until watermark {engine}"),
            ],
            w=8,
            min=TIME_UNTIL_GRAPH_FLOOR_S,
            max=cap,
            log_scale=True,
            thresholds=threshold_steps((None, "red"), (prometheus_duration_seconds(p.full_soon_within), "transparent")),
            runbook=runbook_url(p, "KVCacheFullSoon"),
        ),
        _burst_headroom(s, engine),
    ]


#: The burst headroom graph's top: +Inf (no rise in the window) cannot be drawn, and a pool with this many
#: times the largest burst free is far from the cliff.
BURST_HEADROOM_GRAPH_CAP = 4


def _burst_headroom(s: Selectors, engine: str) -> Graph:
    """Free KV against the last hour's largest one-minute rise (docs/forecast.md, "kvcache_burst_*")."""
    cap = BURST_HEADROOM_GRAPH_CAP
    return Graph(
        "Burst headroom: free KV ÷ the last hour's largest one-minute rise",
        "Free KV tokens now (usable capacity minus the demand, waiting requests included) divided by the largest "
        "rise of the demand within one minute over forecast.burst_window (1 h by default; "
        "kvcache_burst_headroom_ratio). Below the red line at 1: a burst as large as the largest of that window "
        "would not fit now, and requests would wait or be preempted. On bursty traffic, where the time until full "
        "is 0 during bursts and not filling between them, this says how close the pool is to the cliff. Drawn at "
        f"most {cap} (a line at the top: no rise in the window, or {cap} times the burst free).",
        "short",
        [Q(f"clamp_max(kvcache_burst_headroom_ratio{s.engine()}, {cap})", engine)],
        w=8,
        axis_label="free ÷ burst",
        min=0,
        max=cap,
        thresholds=threshold_steps((None, "red"), (1, "transparent")),
    )


def _pod_tokens(p: DashboardParams, s: Selectors) -> list[Panel]:
    engine = f"{legend_format(p.pod_label)} engine {{{{engine}}}}"
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
            f"vLLM's capacity / the theoretical one. Outside 1 ± {percent(tol)} with budget=exact: configuration drift "
            "(KVCacheCapacityMismatch).",
            "percentunit",
            [Q(f"kvcache_capacity_efficiency_ratio{s.engine()}", f"{{{{budget}}}} {engine}")],
            w=6,
            thresholds=threshold_steps((None, "red"), (1 - tol, "green"), (1 + tol, "red")),
            runbook=runbook_url(p, "KVCacheCapacityMismatch"),
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


def _pod_preempting(p: DashboardParams, s: Selectors) -> list[Panel]:
    by_pod = by_labels(p.namespace_label, p.pod_label, "model_name")
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
            runbook=runbook_url(p, "KVCacheRequestsWaitingForKV"),
        ),
        Graph(
            "Preemptions per second",
            "Requests preempted for lack of KV blocks, per second. Sustained above 0: the pool is too small for the "
            "load; see What to change.",
            "short",
            [
                Q(
                    f"sum {by_labels(p.namespace_label, p.pod_label, 'model_name', 'engine')} "
                    f"(rate(kvcache_preemptions_total{s.engine()}[$__rate_interval]))",
                    f"{legend_format(p.pod_label)} engine {{{{engine}}}}",
                )
            ],
            w=8,
            axis_label="preemptions/s",
            min=0,
            runbook=runbook_url(p, "KVCachePreemptions"),
        ),
        Graph(
            "Preemptions per second by reason",
            "Preemptions per second by vLLM's reason (vLLM PR #58037, proposed after 0.32: no data on a vLLM "
            "without vllm:num_preemptions_by_reason). Only kv_full is KV capacity pressure: a running request "
            "found no free block, and a larger pool or fewer tokens per request stop it. priority (a "
            "higher-priority request took the blocks, --scheduling-policy priority) and prefix_cache_reset (a "
            "reset_prefix_cache call with requests running) are scheduling and operator actions that more KV "
            "memory does not stop. The reasons add up to the preemptions beside, which the KVCachePreemptions "
            "alert counts whatever the reason.",
            "short",
            [
                Q(
                    f"sum by (reason) (rate(kvcache_preemptions_by_reason_total{s.engine()}[$__rate_interval]))",
                    "preempted: {{reason}}",
                )
            ],
            w=8,
            axis_label="preemptions/s",
            min=0,
            runbook=runbook_url(p, "KVCachePreemptions"),
        ),
        Graph(
            "Admission rejections per second",
            "Requests the server turned away at admission because its queue was full, per second, by vLLM's "
            "reason (max_num_queued_reqs, max_num_queued_tokens): each one is a 503 a client sees. Sustained above "
            "0: the pool cannot drain the queue; add replicas or KV capacity (What to change) before raising "
            "--max-num-queued-reqs/-tokens, which only makes users wait longer. No data before vLLM 0.32.",
            "reqps",
            [
                Q(
                    f"sum by (reason) (rate(kvcache_admission_rejections_total{s.engine()}[$__rate_interval]))",
                    "rejected: {{reason}}",
                )
            ],
            w=12,
            axis_label="rejections/s",
            min=0,
        ),
        Graph(
            "Prefix-cache hit ratio",
            "Prompt tokens found in the prefix cache / tokens looked up, over the rate interval (V0 engines: "
            "vLLM's own hit-rate gauge). Low with shared system prompts: check routing affinity and "
            "enable_prefix_caching (KVCachePrefixHitRatioLow).",
            "percentunit",
            [Q(f"{hits}\n/\n{queries}\nor {v0_gauge}", legend_format(p.pod_label))],
            w=12,
            min=0,
            max=1,
            runbook=runbook_url(p, "KVCachePrefixHitRatioLow"),
        ),
    ]


def _pod_change(p: DashboardParams, s: Selectors) -> list[Panel]:
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
                    f"suggested ({{{{basis}}}}) {legend_format(p.pod_label)} engine {{{{engine}}}}",
                ),
                Q(
                    f"kvcache_gpu_memory_utilization{s.engine()}",
                    f"current {legend_format(p.pod_label)} engine {{{{engine}}}}",
                ),
            ],
            min=0,
            max=1,
        ),
        Table(
            "Recommendation",
            "The sidecar's current top recommendation for each engine of the pod. Follow the action on the next "
            "change window; what each reason means: docs/forecast.md.",
            [Q(f"max {by_labels(*keys, 'action', 'reason')} (kvcache_recommendation_info{s.engine()})")],
            {p.pod_label: "Pod", "model_name": "Model", "engine": "Engine", "action": "Action", "reason": "Reason"},
            styles={"Action": mapped_cells(enum_texts(ACTION_TEXT)), "Reason": mapped_cells(enum_texts(REASON_TEXT))},
        ),
    ]


def _titles(p: DashboardParams, titles: tuple[str, ...], labels: tuple[str, ...]) -> dict[str, str]:
    """Column titles of an info table: the pod and engine first, then each label's title."""
    return {p.pod_label: "Pod", "model_name": "Model", "engine": "Engine", **dict(zip(labels, titles, strict=True))}


def _pod_info(p: DashboardParams, s: Selectors) -> list[Panel]:
    model_labels = ("architecture", "attention", "kv_dtype", "tp", "pp")
    server_labels = ("engine_kind", "metrics_generation", *CACHE_SETTINGS, "hybrid")
    keys = (p.pod_label, "model_name", "engine")
    errors = (
        f"sum {by_labels(p.namespace_label, p.pod_label, 'reason')} "
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
                Q(f"kvcache_sidecar_target_up{s.pod_only()}", f"sidecar → {{{{target}}}} {legend_format(p.pod_label)}"),
                Q("up" + s.pod_only(f'job="{p.sidecar_job}"'), f"Prometheus → sidecar {legend_format(p.pod_label)}"),
            ],
            w=8,
            axis_label="up = 1",
            min=0,
            max=1,
            runbook=runbook_url(p, "KVCacheSidecarDown"),
        ),
        Graph(
            "Sidecar scrape duration",
            "How long the sidecar's last scrape of vLLM took (HTTP and parsing). Rising towards the target's "
            "timeout: vLLM answers slowly, typically when saturated; past it the scrapes fail (see errors).",
            "s",
            [
                Q(
                    f"kvcache_sidecar_scrape_duration_seconds{s.pod_only()}",
                    f"{legend_format(p.pod_label)} → {{{{target}}}}",
                )
            ],
            w=8,
            min=0,
        ),
        Graph(
            "Sidecar scrape errors",
            "Failed scrapes of vLLM per second, by reason (refused, timeout, http_5xx, ...; every reason is exported "
            "from the start, at 0). The reason says where to look: the network, vLLM's health, the URL, or the "
            "body size limit.",
            "short",
            [Q(errors, f"{{{{reason}}}} {legend_format(p.pod_label)}")],
            w=8,
            axis_label="errors/s",
            min=0,
            runbook=runbook_url(p, "KVCacheSidecarScrapeFailing"),
        ),
    ]


def spec(p: DashboardParams, s: Selectors) -> DashboardSpec:
    """The Pod dashboard: the four on-call rows, then model, server and sidecar."""
    return DashboardSpec(
        DASHBOARD_POD_UID,
        "One pod's KV cache: its pool in tokens, trend, capacity model, queues, the users' latency, what to "
        "change, and the sidecar's own health.",
        "now-6h",
        "1m",
        [
            (ROW_TITLES[0], _pod_fill(p, s)),
            (ROW_TITLES[1], _pod_tokens(p, s)),
            (ROW_TITLES[2], _pod_preempting(p, s)),
            (ROW_TITLES[3], _pod_change(p, s)),
            ("Model, server and sidecar", _pod_info(p, s)),
        ],
    )
