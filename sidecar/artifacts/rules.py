"""Prometheus alerting and recording rules, generated from the sidecar's thresholds.

The committed ``alerts/kvcache.rules.yaml`` is the output of this module with
the defaults (``make generate`` writes it, a test keeps them equal), so what
pages on-call is reviewable YAML *and* cannot drift from the watermark the
sidecar reports headroom against: both read the ``thresholds:`` section of the
same configuration (:class:`sidecar.artifacts.params.Thresholds`). Durations,
the sidecar's job name and link bases come from the ``alerts:`` section
(:class:`sidecar.artifacts.params.RuleParams`).

Conventions (the monitoring-mixins guidelines, "Guidelines for alert names,
labels, and annotations", github.com/monitoring-mixins/docs): alert names share
the ``KVCache`` prefix; ``severity`` is ``critical`` (pages), ``warning``
(tickets) or ``info`` (recorded only); every alert carries ``summary``,
``description``, ``runbook_url`` and ``dashboard_url``; recording rules are
named ``level:metric:operations`` (Prometheus docs, "Recording rules").

Pure: :func:`build_rule_groups` maps (thresholds, params) to the rule-file
mapping and :func:`render` to text. The ``kv-sidecar rules render`` command
(:mod:`sidecar.artifacts.cli`) is the I/O edge around them.
"""

from __future__ import annotations

import re
from string import Template
from typing import Any

from ..alert_params import RuleParams
from ..thresholds import Thresholds
from ..units import prometheus_duration_seconds
from .files import dump_yaml
from .formatting import percent, promql_number
from .kubernetes import prometheus_rule
from .panels import ALL
from .params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    DASHBOARD_POD_UID,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)

#: File names ``rules render --out DIR`` writes.
RULES_FILE_NAME = "kvcache.rules.yaml"
PROMETHEUSRULE_FILE_NAME = "kvcache.prometheusrule.yaml"

#: The output formats of :func:`render`: a plain Prometheus rule file, or a Kubernetes PrometheusRule.
FORMATS = ("rules", "prometheusrule")

#: Every alert this module generates, in file order (runbooks are
#: ``docs/runbooks/<name>.md``; a test keeps the two sets equal).
ALERT_NAMES = (
    "KVCacheAlmostFull",
    "KVCacheFullSoon",
    "KVCachePreemptions",
    "KVCacheRequestsWaitingForKV",
    "KVCachePrefixHitRatioLow",
    "KVCacheCapacityMismatch",
    "KVCacheOverProvisioned",
    "KVCacheModelConfigMissing",
    "KVCacheSidecarScrapeFailing",
    "KVCacheSidecarDown",
)


#: KVCacheFullSoon does not page until the engine has run this long (``kvcache_engine_start_time_seconds``):
#: the forecast's window (``forecast.window``, 10m), after which the trend is the new process' own.
FULL_SOON_AFTER_START = "10m"
#: KVCacheFullSoon keeps firing this long after its forecast last said "full soon" (Prometheus >= 2.42
#: ``keep_firing_for``): one page per saturation, not one per dip of the forecast (docs/forecast-validation.md).
FULL_SOON_KEEP_FIRING_FOR = "5m"


# ---------------------------------------------------------------------------
# Rule construction (pure)
# ---------------------------------------------------------------------------

# Where an engine-level alert happened, readable with or without Kubernetes
# labels: "llama (engine 0) on llm/vllm-0" or "… on 10.0.0.7:9437".
_WHERE_ENGINE = (
    "{{ $labels.model_name }} (engine {{ $labels.engine }}) on "
    "{{ with $labels.namespace }}{{ . }}/{{ end }}{{ or $labels.pod $labels.instance }}"
)
_WHERE_MODEL = "{{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }}"
_WHERE_SIDECAR = "{{ with $labels.namespace }}{{ . }}/{{ end }}{{ or $labels.pod $labels.instance }}"


def _fill(text: str, **values: Any) -> str:
    """Substitute ``${name}`` placeholders; Go-template ``$labels``/``$value`` are left alone."""
    return Template(text).safe_substitute(**values)


def _dashboard_url(params: RuleParams, uid: str, *, pod: bool = False) -> str:
    """The dashboard ``uid`` with its variables set from the alert's labels of the same names.

    A label the alert does not carry (the sidecar's own alerts have no ``model_name``; ``absent()``
    has no labels at all) selects All (Grafana's ``$__all`` in a URL), never an empty value that
    would match nothing.
    """
    variables = (VAR_NAMESPACE, VAR_MODEL_NAME) + ((VAR_POD,) if pod else ())
    query = "&".join(f'var-{v}={{{{ or $labels.{v} "{ALL}" | urlquery }}}}' for v in variables)
    return f"{params.dashboard_base_url}/d/{uid}?{query}"


def _alert(
    params: RuleParams,
    name: str,
    expr: str,
    severity: str,
    summary: str,
    description: str,
    *,
    for_: str | None,
    dashboard_uid: str,
    dashboard_pod: bool = True,
    keep_firing_for: str | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    if keep_firing_for:
        rule["keep_firing_for"] = keep_firing_for
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{params.runbook_base_url}/{name}.md",
    }
    # No Grafana configured: no link that would lead nowhere (the runbook names the dashboard).
    if params.dashboard_base_url:
        rule["annotations"]["dashboard_url"] = _dashboard_url(params, dashboard_uid, pod=dashboard_pod)
    return rule


#: Labels every recording rule keeps when it aggregates, besides ``namespace`` and ``model_name``: the
#: label a multi-cluster setup puts on every series (a target label from relabelling, or an external
#: label that Thanos Ruler or a Mimir/Cortex ruler sees on the series it evaluates over). Dropped, the
#: recorded series of two clusters would be summed into one and the dashboards' ``cluster`` variable
#: could not filter them. Absent on a series, it is an empty label and groups nothing away.
KEPT_LABELS = ("cluster",)
#: The owner workload of a pod (a Deployment's or a StatefulSet's name), put there by the PodMonitor's
#: relabelling (``deploy/base/podmonitor.yaml``); absent outside Kubernetes, where the workload is the
#: namespace and model alone.
WORKLOAD_LABEL = "workload"
#: The peak window of the workload's demand sum: each replica's largest sample in the minute before the
#: evaluation, summed. The rule group must be evaluated at least every minute (the default interval is
#: Prometheus' global one, 1m), or samples between two windows are never seen.
WORKLOAD_DEMAND_WINDOW = "1m"


def recording_rules(th: Thresholds, kept: tuple[str, ...] = KEPT_LABELS) -> list[dict[str, str]]:
    """Per namespace/model and per workload aggregates for the dashboards and the weekly report.

    Every rule aggregates ``by (<kept labels>, namespace, model_name)`` (:data:`KEPT_LABELS`), so a
    recorded series keeps its cluster.

    Ratios are ratios of sums (``sum(rate(hits)) / sum(rate(queries))``, used
    over used + free), never averages of per-pod ratios, which would weigh an
    idle pod like a busy one (Prometheus docs, "Recording rules" practices:
    aggregate the numerator and denominator separately, then divide).

    The capacity-planning dashboard reads the ``:bool`` series: 1 while some
    pod of the model is above the warning (the watermark), else 0, so that
    ``avg_over_time(...[1d]) * 24`` is the hours per day spent above it. The
    weekly report (:mod:`sidecar.report.prometheus`) reads the model's usage
    from ``namespace_model:kvcache_usage_ratio:max`` and its time waiting from
    ``namespace_model:kvcache_requests_waiting:bool``. The ``namespace_model_workload:``
    series are the inputs of the workload's advice (:func:`workload_recording_rules`).
    """
    by = f"by ({', '.join((*kept, 'namespace', 'model_name'))})"

    def agg(op: str, metric: str) -> dict[str, str]:
        return {"record": f"namespace_model:{metric}:{op}", "expr": f"{op} {by} ({metric})"}

    def above(name: str, threshold: float) -> dict[str, str]:
        return {
            "record": f"namespace_model:kvcache_usage_above_{name}:bool",
            "expr": f"max {by} (kvcache_usage_ratio) > bool {promql_number(threshold)}",
        }

    def rate5m(counter: str) -> dict[str, str]:
        base = counter.removesuffix("_total")
        return {"record": f"namespace_model:{base}:rate5m", "expr": f"sum {by} (rate({counter}[5m]))"}

    return [
        agg("max", "kvcache_usage_ratio"),
        agg("avg", "kvcache_usage_ratio"),
        # Token-weighted usage of the whole namespace/model: used + free is
        # each engine's usable capacity (capacity minus the null block).
        {
            "record": "namespace_model:kvcache_used_per_usable_tokens:ratio",
            "expr": f"sum {by} (kvcache_used_tokens)\n/\n"
            f"(sum {by} (kvcache_used_tokens) + sum {by} (kvcache_free_tokens))",
        },
        agg("sum", "kvcache_capacity_tokens"),
        # The usable pool (vLLM's capacity without its null block), also for hybrid models, where
        # kvcache_capacity_tokens is not exported: what demand is compared with.
        {
            "record": "namespace_model:kvcache_usable_tokens:sum",
            "expr": f"sum {by} (kvcache_used_tokens + kvcache_free_tokens)",
        },
        agg("sum", "kvcache_used_tokens"),
        agg("sum", "kvcache_free_tokens"),
        agg("sum", "kvcache_demand_tokens"),
        agg("min", "kvcache_time_until_full_seconds"),
        agg("sum", "kvcache_requests_running"),
        {
            "record": "namespace_model_reason:kvcache_requests_waiting:sum",
            "expr": f"sum by ({', '.join((*kept, 'namespace', 'model_name', 'reason'))}) (kvcache_requests_waiting)",
        },
        rate5m("kvcache_preemptions_total"),
        rate5m("kvcache_prefix_cache_queries_tokens_total"),
        rate5m("kvcache_prefix_cache_hits_tokens_total"),
        {
            "record": "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m",
            "expr": f"sum {by} (rate(kvcache_prefix_cache_hits_tokens_total[5m]))\n/\n"
            f"sum {by} (rate(kvcache_prefix_cache_queries_tokens_total[5m]))",
        },
        # Usage only while the engine is awake: a sleeping engine reads 0 and
        # would drag the over-provisioning quantile down.
        {"record": "engine:kvcache_usage_ratio:awake", "expr": "kvcache_usage_ratio unless kvcache_engine_asleep == 1"},
        above("warning", th.warning),
        above("watermark", th.watermark),
        # 1 while some pod of the model has requests waiting for scheduler capacity (reason="all":
        # vLLM without the breakdown): the weekly report's time waiting per model, as
        # avg_over_time(...) like the hours above; threshold-free, so any report settings can use it.
        {
            "record": "namespace_model:kvcache_requests_waiting:bool",
            "expr": f'max {by} (kvcache_requests_waiting{{reason=~"capacity|all"}}) > bool 0',
        },
        agg("max", "kvcache_suggested_gpu_memory_utilization"),
        *workload_recording_rules(kept),
    ]


def workload_recording_rules(kept: tuple[str, ...] = KEPT_LABELS) -> list[dict[str, str]]:
    """The inputs of one recommendation per workload, as the weekly report sizes it.

    The workload is ``namespace`` + ``model_name`` (+ :data:`WORKLOAD_LABEL` where the PodMonitor
    knows the owner). The report (:func:`sidecar.forecast.policy.advise_workload`, through
    ``sidecar.report.figures``) takes the workload's peak as the largest sum over its replicas of
    each one's largest demand in a minute, and its pool as the smallest replica's; these record
    exactly those per-minute terms, so a dashboard gets the report's figures with ``max_over_time``
    and ``last_over_time`` (dashboards/README.md, "One recommendation per workload"):

    - ``:sum_max1m``: the sum over the replicas of each one's largest ``kvcache_demand_tokens`` in
      the last minute (its ``max_over_time`` is the workload's peak);
    - ``:max_max1m``: the largest of them (its ``max_over_time`` is the hottest replica's peak, for
      "load is uneven across replicas");
    - ``kvcache_capacity_tokens:count``: the replicas with a KV pool (vLLM's capacity is exported);
    - ``kvcache_usable_tokens:min``: the smallest replica's usable tokens (capacity − the null
      block: ``kvcache_used_tokens + kvcache_free_tokens``), of the replicas with a capacity.

    And the terms of the workload's ``--gpu-memory-utilization`` (``suggest_gpu_memory_utilization``
    in ``sidecar/forecast/sizing.py``: ``u* = u0 + (C* − C0) × bytes_per_token ÷ M``, rewritten
    ``u* = (u0 − C0 × k) + C* × k`` with ``k = bytes_per_token ÷ M``, the share of the GPU one token
    takes), per replica, the smallest and the largest (equal when the replicas run one pool; the
    dashboards show the value only then):

    - ``kvcache_gpu_memory_utilization_per_token:min|max``: ``k``, from
      ``kvcache_theoretical_bytes_per_token`` and ``kvcache_gpu_memory_bytes`` (M, as the advice sizes);
    - ``kvcache_gpu_memory_utilization_non_kv:min|max``: ``u0 − C0 × k``, the share not holding KV;
    - ``kvcache_block_size:max``: capacity − usable (vLLM's null block is one block);
    - ``kvcache_kv_cache_memory_bytes:count``: replicas sized by ``--kv-cache-memory-bytes`` (a byte count
      in ``kvcache_server_info``; vLLM ignores the utilization then);
    - ``kvcache_gpu_memory_bytes:count`` by ``gpu`` too: the GPU's name where ``model.gpu_memory`` gave one.
    """
    labels = (*kept, "namespace", "model_name", WORKLOAD_LABEL)
    by = f"by ({', '.join(labels)})"
    demand = f"max_over_time(kvcache_demand_tokens[{WORKLOAD_DEMAND_WINDOW}])"
    level = "namespace_model_workload"
    per_token = "(kvcache_theoretical_bytes_per_token / max without (basis, gpu) (kvcache_gpu_memory_bytes))"
    non_kv = f"(kvcache_gpu_memory_utilization - kvcache_capacity_tokens * {per_token})"
    return [
        {"record": f"{level}:kvcache_demand_tokens:sum_max1m", "expr": f"sum {by} ({demand})"},
        {"record": f"{level}:kvcache_demand_tokens:max_max1m", "expr": f"max {by} ({demand})"},
        {"record": f"{level}:kvcache_capacity_tokens:count", "expr": f"count {by} (kvcache_capacity_tokens)"},
        {
            "record": f"{level}:kvcache_usable_tokens:min",
            "expr": f"min {by} ((kvcache_used_tokens + kvcache_free_tokens) and kvcache_capacity_tokens)",
        },
        *(
            {"record": f"{level}:kvcache_gpu_memory_utilization_{name}:{op}", "expr": f"{op} {by} {expr}"}
            for name, expr in (("per_token", per_token), ("non_kv", non_kv))
            for op in ("min", "max")
        ),
        {
            "record": f"{level}:kvcache_block_size:max",
            "expr": f"max {by} (kvcache_capacity_tokens - (kvcache_used_tokens + kvcache_free_tokens))",
        },
        {
            "record": f"{level}:kvcache_kv_cache_memory_bytes:count",
            # a byte count, as the report reads the label ("" and vLLM's "None": not set)
            "expr": f'count {by} (kvcache_server_info{{kv_cache_memory_bytes=~"0*[1-9][0-9]*([.][0-9]*)?"}})',
        },
        {
            "record": f"{level}:kvcache_gpu_memory_bytes:count",
            "expr": f"count by ({', '.join((*labels, 'gpu'))}) (kvcache_gpu_memory_bytes)",
        },
    ]


#: The namespace/model prefix-cache hit ratio (tokens), recorded by :func:`recording_rules`.
_HIT_RATIO = "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m"


def alerting_rules(th: Thresholds, p: RuleParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(capacity alerts, sidecar self-monitoring alerts)."""
    usage_peak = f"max_over_time(kvcache_usage_ratio[{p.gap_window}])"
    full_within_s = prometheus_duration_seconds(p.full_soon_within)
    ov, cap, pod = DASHBOARD_OVERVIEW_UID, DASHBOARD_CAPACITY_UID, DASHBOARD_POD_UID

    capacity = [
        _alert(
            p,
            "KVCacheAlmostFull",
            f"{usage_peak} > {promql_number(th.warning)}",
            "warning",
            f"KV cache usage is above {percent(th.warning)}.",
            _fill(
                "KV cache of ${where} has been above ${thr} for ${for_} (peak of the last ${gap}: "
                "{{ $value | humanizePercentage }}). Once it is above ${page} for ${share} of ${window} this pages.",
                where=_WHERE_ENGINE,
                thr=percent(th.warning),
                for_=p.warning_for,
                gap=p.gap_window,
                page=percent(th.watermark),
                share=percent(1 - p.critical_quantile),
                window=p.critical_window,
            ),
            for_=p.warning_for,
            dashboard_uid=ov,
        ),
        # The page: "the peaks keep reaching the watermark", not "above it for N minutes without a dip",
        # which real bursts never are (docs/forecast-validation.md, "Real traffic"). No for:: a burst
        # shorter than (1 - quantile) x window never makes the expression true; keep_firing_for holds
        # the page between bursts of one saturation. sidecar.forecast_validation.PAGE_RULE models it.
        _alert(
            p,
            "KVCacheAlmostFull",
            f"quantile_over_time({promql_number(p.critical_quantile)}, kvcache_usage_ratio[{p.critical_window}]) "
            f"> {promql_number(th.watermark)}",
            "critical",
            f"KV cache usage keeps reaching the {percent(th.watermark)} paging watermark.",
            _fill(
                "KV cache of ${where} was above the ${thr} watermark for more than ${share} of the last "
                "${window} (p${q}: {{ $value | humanizePercentage }}). New requests queue and running ones "
                "are preempted once it is full.",
                where=_WHERE_ENGINE,
                thr=percent(th.watermark),
                share=percent(1 - p.critical_quantile),
                window=p.critical_window,
                q=f"{round(p.critical_quantile * 100, 2):g}",
            ),
            for_=None,
            dashboard_uid=ov,
            keep_firing_for=p.critical_keep_firing_for,
        ),
        _alert(
            p,
            "KVCacheFullSoon",
            # A server that starts, restarts or scales out under load fills from empty in a minute: not a
            # capacity problem, so no page until it has run FULL_SOON_AFTER_START (the forecast's window).
            f"kvcache_time_until_full_seconds < {promql_number(full_within_s)}\n"
            f"unless\n"
            f"time() - kvcache_engine_start_time_seconds"
            f" < {promql_number(prometheus_duration_seconds(FULL_SOON_AFTER_START))}",
            "critical",
            f"KV cache is forecast to be full within {p.full_soon_within}.",
            _fill(
                "At the current fill rate the KV cache of ${where} is full in "
                "{{ $value | humanizeDuration }} (forecast below ${within} for ${for_}; not in the first "
                "${after} after the engine started).",
                where=_WHERE_ENGINE,
                within=p.full_soon_within,
                for_=p.full_soon_for,
                after=FULL_SOON_AFTER_START,
            ),
            for_=p.full_soon_for,
            dashboard_uid=ov,
            keep_firing_for=FULL_SOON_KEEP_FIRING_FOR,
        ),
        _alert(
            p,
            "KVCachePreemptions",
            f"rate(kvcache_preemptions_total[5m]) > {promql_number(p.preemptions_per_second)}",
            "warning",
            "vLLM keeps preempting requests for lack of KV cache.",
            _fill(
                '${where} has preempted requests for ${for_} ({{ $value | printf "%.2f" }} preemptions/s '
                "over 5m, above ${floor}/s): each preemption throws away a request's KV and recomputes it.",
                where=_WHERE_ENGINE,
                for_=p.preemptions_for,
                floor=promql_number(p.preemptions_per_second),
            ),
            for_=p.preemptions_for,
            dashboard_uid=ov,
        ),
        # Waiting alone is also caused by max_num_seqs or the per-step token
        # budget (seen on real vLLM at usage < 0.4): only waiting *while the
        # cache is above the watermark* is KV pressure. reason="all" is what
        # the sidecar exports for vLLM versions without the reason breakdown.
        _alert(
            p,
            "KVCacheRequestsWaitingForKV",
            f'max_over_time(kvcache_requests_waiting{{reason=~"capacity|all"}}[{p.gap_window}]) > 0\n'
            f"and ignoring (reason)\n"
            f"{usage_peak} > {promql_number(th.watermark)}",
            "warning",
            "Requests are queued because the KV cache is full.",
            _fill(
                "{{ $value | humanize }} requests of ${where} have waited for scheduler capacity "
                "(reason {{ $labels.reason }}) while the KV cache was above ${thr}, for ${for_}.",
                where=_WHERE_ENGINE,
                thr=percent(th.watermark),
                for_=p.waiting_for,
            ),
            for_=p.waiting_for,
            dashboard_uid=ov,
        ),
        # Only a workload that has shared prefixes (its usual ratio is high) and lost them: one
        # without shared prefixes sits near 0 by nature, which is no fault (llm-d's
        # guides/recipes/observability/alerts/kv-cache-alerting-rules.yaml, KVCachePrefixHitRateLow).
        _alert(
            p,
            "KVCachePrefixHitRatioLow",
            f"{_HIT_RATIO} < {promql_number(p.prefix_hit_ratio_low)}\n"
            f"and\n"
            f"quantile_over_time(0.5, {_HIT_RATIO}[{p.prefix_hit_ratio_baseline}])"
            f" >= {promql_number(p.prefix_hit_ratio_usual)}",
            "warning",
            f"Prefix cache hit ratio is below {percent(p.prefix_hit_ratio_low)}.",
            _fill(
                "Only {{ $value | humanizePercentage }} of the prompt tokens of ${where} were found in "
                "the prefix cache over 5m, for ${for_}, where the median of the last ${baseline} is at "
                "least ${usual}: the workload shares prefixes, the cache no longer finds them.",
                where=_WHERE_MODEL,
                for_=p.prefix_hit_ratio_for,
                baseline=p.prefix_hit_ratio_baseline,
                usual=percent(p.prefix_hit_ratio_usual),
            ),
            for_=p.prefix_hit_ratio_for,
            dashboard_uid=pod,
            dashboard_pod=False,
        ),
        _alert(
            p,
            "KVCacheCapacityMismatch",
            f'abs(kvcache_capacity_efficiency_ratio{{budget="exact"}} - 1)'
            f" > {promql_number(p.capacity_mismatch_tolerance)}",
            "warning",
            "Actual KV capacity differs from the model's theoretical capacity.",
            _fill(
                "vLLM's KV capacity for ${where} is off from what its configured KV memory should hold by "
                "{{ $value | humanizePercentage }} (tolerance ${tol}): the served configuration is not the "
                "one the sidecar was told.",
                where=_WHERE_ENGINE,
                tol=percent(p.capacity_mismatch_tolerance),
            ),
            for_=p.capacity_mismatch_for,
            dashboard_uid=pod,
        ),
        _alert(
            p,
            "KVCacheOverProvisioned",
            f"quantile_over_time({promql_number(p.overprovisioned_quantile)}, engine:kvcache_usage_ratio:awake"
            f"[{p.overprovisioned_window}]) < {promql_number(p.overprovisioned_below)}\n"
            # only engines that have existed for the whole window
            f"and present_over_time(kvcache_usage_ratio[1h] offset "
            f"{_window_minus_1h(p.overprovisioned_window)})\n"
            f"unless kvcache_engine_asleep == 1",
            "info",
            "KV cache is over-provisioned.",
            _fill(
                "p${q} of the awake-time KV usage of ${where} over ${window} is "
                "{{ $value | humanizePercentage }}, below ${below}: memory could go to a smaller "
                "gpu_memory_utilization or fewer replicas.",
                where=_WHERE_ENGINE,
                q=f"{round(p.overprovisioned_quantile * 100, 2):g}",
                window=p.overprovisioned_window,
                below=percent(p.overprovisioned_below),
            ),
            for_=p.overprovisioned_for,
            dashboard_uid=cap,
        ),
    ]

    job = f'job="{p.sidecar_job}"'
    sidecar = [
        # model.config set but never loaded: without this only the log says so, and the capacity
        # gauges are silently absent. `reason` is aggregated away so that waiting -> not_found does
        # not restart for:; the description reads the current reason back.
        _alert(
            p,
            "KVCacheModelConfigMissing",
            "max without (reason) (kvcache_model_config_loaded) == 0",
            "warning",
            "The sidecar cannot load the model's config.json; capacity gauges are missing.",
            _fill(
                "Sidecar ${where} has not loaded model.config for {{ $labels.model_name }} for ${for_} "
                "(reason: {{ range printf `kvcache_model_config_loaded{instance=%q, target=%q, engine=%q}` "
                "$labels.instance $labels.target $labels.engine | query }}{{ .Labels.reason }}{{ end }}"
                "); the theoretical capacity and the advice that needs it are absent.",
                where=_WHERE_SIDECAR,
                for_=p.model_config_missing_for,
            ),
            for_=p.model_config_missing_for,
            dashboard_uid=pod,
        ),
        # last_success is absent until the first successful scrape, so a
        # model that is still loading (20 s - 10 min) cannot fire this.
        _alert(
            p,
            "KVCacheSidecarScrapeFailing",
            "kvcache_sidecar_target_up == 0\nand\nkvcache_sidecar_last_success_timestamp_seconds",
            "warning",
            "The KV-cache sidecar cannot read vLLM's metrics.",
            _fill(
                "Sidecar ${where} has failed to scrape its target {{ $labels.target }} for ${for_}; "
                "its KV gauges, and the alerts on them, are going stale.",
                where=_WHERE_SIDECAR,
                for_=p.scrape_failing_for,
            ),
            for_=p.scrape_failing_for,
            dashboard_uid=pod,
        ),
        # critical: with the sidecar gone the KVCacheAlmostFull page cannot fire.
        _alert(
            p,
            "KVCacheSidecarDown",
            f"up{{{job}}} == 0\nor\nabsent(up{{{job}}})",
            "critical",
            "The KV-cache sidecar is down; KV-cache pages cannot fire.",
            _fill(
                "{{ with $labels.instance }}Prometheus has failed to scrape the sidecar at {{ . }}"
                "{{ else }}No target of job ${job} is known to Prometheus{{ end }} for ${for_}, so "
                "KV-cache alerts for it are blind.",
                job=p.sidecar_job,
                for_=p.sidecar_down_for,
            ),
            for_=p.sidecar_down_for,
            dashboard_uid=pod,
        ),
    ]
    return capacity, sidecar


def _window_minus_1h(window: str) -> str:
    """The offset at which a 1h presence check looks back to the start of ``window`` (1d -> 23h)."""
    seconds = int(max(prometheus_duration_seconds(window) - 3600, 0))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


#: PromQL words that are not metric names (operators, modifiers, aggregation clauses, literals).
_KEYWORDS = frozenset("and or unless by without on ignoring group_left group_right bool offset inf nan atan2".split())
#: A label list follows these words: ``by (namespace, model_name)`` names labels, not metrics.
_LABEL_LISTS = frozenset("by without on ignoring group_left group_right".split())
_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|`[^`]*`|\[[^\]]*\]|\{[^}]*\}|[a-zA-Z_:][a-zA-Z0-9_:]*|\d[\w.]*|\s+|.',
)


def scoped(expr: str, matcher: str) -> str:
    """``expr`` with ``matcher`` (``namespace="llm-prod"``) added to every series it selects.

    What prometheus-operator's ``enforcedNamespaceLabel`` does to a PrometheusRule, done here so
    that a plain Prometheus gets the same: ``kvcache_usage_ratio`` becomes
    ``kvcache_usage_ratio{namespace="llm-prod"}`` and ``up{job="x"}`` becomes
    ``up{job="x", namespace="llm-prod"}``; functions, keywords, label lists of ``by (...)``,
    strings and ranges are left alone.
    """
    out: list[str] = []
    tokens = [m.group(0) for m in _TOKEN.finditer(expr)]
    i, after_label_list_word = 0, False
    while i < len(tokens):
        tok = tokens[i]
        nxt = next((t for t in tokens[i + 1 :] if not t.isspace()), "")
        if tok.isspace():
            out.append(tok)
        elif after_label_list_word and tok == "(":
            # copy the label list up to its closing parenthesis
            j = tokens.index(")", i)
            out.extend(tokens[i : j + 1])
            i, after_label_list_word = j + 1, False
            continue
        elif (
            re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", tok)
            and tok.lower() not in _KEYWORDS
            and nxt != "("  # a function
            and nxt.lower() not in ("by", "without")  # an aggregation: sum by (...) (...)
        ):
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if following.startswith("{"):
                inner = following[1:-1].strip()
                out.append(f"{tok}{{{inner + ', ' if inner else ''}{matcher}}}")
                i += 2
                continue
            out.append(f"{tok}{{{matcher}}}")
        else:
            out.append(tok)
        after_label_list_word = tok.lower() in _LABEL_LISTS if not tok.isspace() else after_label_list_word
        i += 1
    return "".join(out)


def build_rule_groups(thresholds: Thresholds, params: RuleParams) -> dict[str, Any]:
    """The rule-file mapping (``{"groups": [...]}``) for these thresholds and params.

    With ``params.namespace`` every rule reads that namespace only (:func:`scoped`): two
    installations in one Prometheus then alert and record each for its own namespace.
    """
    capacity, sidecar = alerting_rules(thresholds, params)
    groups: list[dict[str, Any]] = [
        {"name": "kvcache.rules", "rules": recording_rules(thresholds)},
        {"name": "kvcache-capacity", "rules": capacity},
        {"name": "kvcache-sidecar", "rules": sidecar},
    ]
    if params.namespace:
        for g in groups:
            for rule in g["rules"]:
                rule["expr"] = scoped(rule["expr"], f'namespace="{params.namespace}"')
    if params.evaluation_interval:
        for g in groups:
            # "interval" right after "name", as Prometheus' docs write it
            rules = g.pop("rules")
            g["interval"] = params.evaluation_interval
            g["rules"] = rules
    return {"groups": groups}


def render(thresholds: Thresholds, params: RuleParams, fmt: str = "rules", variant: str = "default") -> str:
    """The file text: a header saying how it was made, then the YAML."""
    if variant == "fast":
        params = params.fast()
    groups = build_rule_groups(thresholds, params)
    doc = groups if fmt == "rules" else prometheus_rule(groups)
    header = (
        "# Generated by `kv-sidecar rules render` (sidecar/artifacts/rules.py); do not edit by hand.\n"
        "# Change the `thresholds:`/`alerts:` config sections or the generator, then re-render\n"
        "# (the repository's alerts/kvcache.rules.yaml: `make generate`; a test keeps it current).\n"
        f"# variant={variant} watermark={promql_number(thresholds.watermark)} "
        f"warning={promql_number(thresholds.warning)} target_usage={promql_number(thresholds.target_usage)}\n"
    )
    return header + dump_yaml(doc)
