"""Prometheus alerting and recording rules, generated from the sidecar's thresholds.

The committed ``alerts/kvcache.rules.yaml`` is the output of this module with
the defaults (a test keeps them equal), so what pages on-call is reviewable
YAML *and* cannot drift from the watermark the sidecar reports headroom
against: both read the ``thresholds:`` section of the same configuration
(:class:`sidecar.thresholds.Thresholds`). Durations, the sidecar's job name
and link bases come from the ``alerts:`` section (:class:`RuleParams`).

Conventions (``../shared/reference/ops-conventions.md`` §1.2-§1.3, from the
monitoring-mixins guidelines): alert names share the ``KVCache`` prefix;
``severity`` is ``critical`` (pages), ``warning`` (tickets) or ``info``
(recorded only); every alert carries ``summary``, ``description``,
``runbook_url`` and ``dashboard_url``; recording rules are named
``level:metric:operations``.

Pure core: :func:`build_rule_groups` maps (thresholds, params) to the rule-file
mapping and :func:`render` to text. The ``kv-sidecar rules render`` command
(:func:`add_parser`/:func:`run`) is the thin I/O edge around them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from string import Template
from typing import Any, ClassVar, Mapping

import yaml

from .thresholds import Thresholds
from .units import prometheus_duration_seconds

#: Grafana dashboard uids the alerts link to; the dashboards reuse them, so
#: links in pages never break when a dashboard is re-imported.
DASHBOARD_OVERVIEW_UID = "kvcache-overview"
DASHBOARD_CAPACITY_UID = "kvcache-capacity"

#: File names ``rules render --out DIR`` writes.
RULES_FILE_NAME = "kvcache.rules.yaml"
PROMETHEUSRULE_FILE_NAME = "kvcache.prometheusrule.yaml"

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
    "KVCacheSidecarScrapeFailing",
    "KVCacheSidecarDown",
)



@dataclass(frozen=True)
class RuleParams:
    """Everything in the rules that is not a usage threshold (the ``alerts:`` config section).

    Durations are Prometheus duration strings because they are written into
    the rules verbatim.
    """

    #: ``job`` label Prometheus gives the sidecar's scrape target (a PodMonitor
    #: defaults to ``<namespace>/<podmonitor name>``: set ``jobLabel`` or this).
    sidecar_job: str = "kv-cache-sidecar"
    #: ``runbook_url`` = this + ``/<AlertName>.md``.
    runbook_base_url: str = "https://github.com/kv-cache-sidecar/kv-cache-sidecar/blob/main/docs/runbooks"
    #: Grafana root; ``dashboard_url`` = this + ``/d/<uid>?var-…``.
    dashboard_base_url: str = "https://grafana.example.com"
    #: Rule-group evaluation interval; ``None`` uses Prometheus' global one.
    evaluation_interval: str | None = None
    #: Window of ``max_over_time`` under the usage alerts. vLLM answers
    #: /metrics slowly exactly when saturated, and a saturated engine's usage
    #: dips between completions (0.89-1.0 on the real vLLM captures), so a
    #: missed scrape or a dip must not reset ``for:``. The window also
    #: lengthens every excursion by up to its own length: at 1m a 4-minute
    #: spike stays short of the 5m page, at 2m it would page.
    gap_window: str = "1m"
    #: KVCacheAlmostFull: warning above ``thresholds.warning`` for this long …
    warning_for: str = "15m"
    #: … critical (the page) above ``thresholds.watermark`` for this long.
    critical_for: str = "5m"
    #: KVCacheFullSoon: the forecast says full within this horizon …
    full_soon_within: str = "15m"
    #: … for this long (``bench/forecast.py`` measures lead time and false pages).
    full_soon_for: str = "2m"
    #: KVCachePreemptions: preemption rate over 5m above this (per second) …
    preemptions_per_second: float = 0.0
    preemptions_for: str = "10m"
    #: KVCacheRequestsWaitingForKV: waiting for capacity while above the watermark.
    waiting_for: str = "5m"
    #: KVCachePrefixHitRatioLow: namespace/model hit ratio (tokens) below this.
    prefix_hit_ratio_low: float = 0.2
    prefix_hit_ratio_for: str = "30m"
    #: KVCacheCapacityMismatch: |actual/theoretical - 1| above this (exact budgets only).
    capacity_mismatch_tolerance: float = 0.2
    capacity_mismatch_for: str = "15m"
    #: KVCacheOverProvisioned: awake-time usage quantile over a window below a ratio.
    overprovisioned_below: float = 0.3
    overprovisioned_quantile: float = 0.95
    overprovisioned_window: str = "1d"
    overprovisioned_for: str = "1h"
    #: KVCacheSidecarScrapeFailing: longer than vLLM's slowest restart (model loading: 20 s - 10 min).
    scrape_failing_for: str = "15m"
    #: KVCacheSidecarDown: as fast as the page it protects (``critical_for``).
    sidecar_down_for: str = "5m"

    _DURATIONS: ClassVar[tuple[str, ...]] = (
        "gap_window", "warning_for", "critical_for", "full_soon_within", "full_soon_for", "preemptions_for",
        "waiting_for", "prefix_hit_ratio_for", "capacity_mismatch_for", "overprovisioned_window",
        "overprovisioned_for", "scrape_failing_for", "sidecar_down_for")
    _FRACTIONS: ClassVar[tuple[str, ...]] = (
        "prefix_hit_ratio_low", "capacity_mismatch_tolerance", "overprovisioned_below", "overprovisioned_quantile")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, prefix: str = "alerts") -> tuple["RuleParams", list[str]]:
        """Params from the ``alerts:`` config mapping, plus every problem found (each naming the field).

        Unknown keys are problems (a typo would silently keep a default). On
        problems the defaults are returned for the bad fields.
        """
        problems: list[str] = []
        if mapping is None:
            return cls(), problems
        if not isinstance(mapping, Mapping):
            return cls(), [f"{prefix}: must be a mapping, got {type(mapping).__name__}"]
        names = [f.name for f in fields(cls)]
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(names)}"
                problems.append(f"{prefix}.{key}: unknown key ({hint})")
                continue
            if key in cls._FRACTIONS or key == "preemptions_per_second":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    try:
                        value = float(str(value))
                    except ValueError:
                        problems.append(f"{prefix}.{key}: must be a number, got {value!r}")
                        continue
                value = float(value)
            elif key == "evaluation_interval" and value is None:
                pass  # explicit null: Prometheus' global evaluation interval
            else:
                value = str(value)  # durations, job name, URLs are written into the rules as text
            values[key] = value
        params = cls(**values)
        bad = params.problems(prefix)
        problems.extend(bad)
        if bad:  # keep what is valid, default what is not
            bad_fields = {p.split(":", 1)[0].removeprefix(prefix + ".") for p in bad}
            params = cls(**{k: v for k, v in values.items() if k not in bad_fields})
        return params, problems

    def problems(self, prefix: str = "alerts") -> list[str]:
        """Every invalid field, each with the fix."""
        out: list[str] = []
        for name in self._DURATIONS + (("evaluation_interval",) if self.evaluation_interval is not None else ()):
            value = getattr(self, name)
            try:
                if prometheus_duration_seconds(value) <= 0:
                    out.append(f"{prefix}.{name}: must be longer than 0, got {value!r}")
            except ValueError as e:
                out.append(f"{prefix}.{name}: {e}")
        for name in self._FRACTIONS:
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                out.append(f"{prefix}.{name}: must be a fraction between 0 and 1, got {v!r}")
        if self.preemptions_per_second < 0:
            out.append(f"{prefix}.preemptions_per_second: must be 0 or more, got {self.preemptions_per_second!r}")
        if not re.fullmatch(r"[^\"\\\s]+", self.sidecar_job or ""):
            out.append(f"{prefix}.sidecar_job: must be a non-empty job label value without quotes, backslashes "
                       f"or spaces, got {self.sidecar_job!r} (e.g. kv-cache-sidecar)")
        for name in ("runbook_base_url", "dashboard_base_url"):
            v = getattr(self, name)
            if not re.fullmatch(r"https?://[^\s\"{}]+", v or "") or v.endswith("/"):
                out.append(f"{prefix}.{name}: must be an http(s) URL without a trailing slash, got {v!r} "
                           f"(e.g. https://grafana.example.com)")
        return out

    def fast(self) -> "RuleParams":
        """The ``fast`` variant: the same rules on a seconds scale, for the end-to-end test.

        Only timings change; expressions and thresholds are the defaults'.
        """
        return dataclasses.replace(self, **FAST_VARIANT)


#: Overrides of the ``fast`` variant (1 s evaluation; ``for:`` in seconds).
FAST_VARIANT: dict[str, str] = {
    "evaluation_interval": "1s",
    "gap_window": "5s",
    "warning_for": "20s",
    "critical_for": "40s",
    "full_soon_for": "10s",
    "preemptions_for": "20s",
    "waiting_for": "20s",
    "prefix_hit_ratio_for": "30s",
    "capacity_mismatch_for": "20s",
    "scrape_failing_for": "30s",
    "sidecar_down_for": "20s",
}

VARIANTS = ("default", "fast")


def load_thresholds(mapping: Mapping[str, Any] | None, prefix: str = "thresholds") -> tuple[Thresholds, list[str]]:
    """Thresholds from a ``thresholds:`` mapping, plus every problem (for callers without the full config)."""
    if mapping is None:
        return Thresholds(), []
    if not isinstance(mapping, Mapping):
        return Thresholds(), [f"{prefix}: must be a mapping, got {type(mapping).__name__}"]
    names = [f.name for f in fields(Thresholds)]
    values: dict[str, float] = {}
    problems: list[str] = []
    for key, value in mapping.items():
        if key not in names:
            problems.append(f"{prefix}.{key}: unknown key (allowed: {', '.join(names)})")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{prefix}.{key}: must be a number, got {value!r}")
        else:
            values[key] = float(value)
    th = Thresholds(**values)
    problems.extend(th.problems(prefix))
    return (Thresholds() if problems else th), problems


# ---------------------------------------------------------------------------
# Rule construction (pure)
# ---------------------------------------------------------------------------

# Where an engine-level alert happened, readable with or without Kubernetes
# labels: "llama (engine 0) on llm/vllm-0" or "… on 10.0.0.7:9437".
_WHERE_ENGINE = ("{{ $labels.model_name }} (engine {{ $labels.engine }}) on "
                 "{{ with $labels.namespace }}{{ . }}/{{ end }}{{ or $labels.pod $labels.instance }}")
_WHERE_MODEL = "{{ $labels.model_name }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }}"
_WHERE_SIDECAR = "{{ with $labels.namespace }}{{ . }}/{{ end }}{{ or $labels.pod $labels.instance }}"


def _pct(x: float) -> str:
    """0.9 -> "90%" (no float noise such as 90.00000000000001%)."""
    return f"{round(x * 100, 4):g}%"


def _num(x: float) -> str:
    """A threshold as PromQL text, exactly: 0.9 -> "0.9", 900.0 -> "900", 0.123456789 stays whole."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _fill(text: str, **values: Any) -> str:
    """Substitute ``${name}`` placeholders; Go-template ``$labels``/``$value`` are left alone."""
    return Template(text).safe_substitute(**values)


def _dashboard_url(params: RuleParams, uid: str, *, pod: bool = False) -> str:
    url = (f"{params.dashboard_base_url}/d/{uid}?var-namespace={{{{ $labels.namespace | urlquery }}}}"
           f"&var-model_name={{{{ $labels.model_name | urlquery }}}}")
    if pod:
        url += "&var-pod={{ $labels.pod | urlquery }}"
    return url


def _alert(params: RuleParams, name: str, expr: str, severity: str, summary: str, description: str,
           *, for_: str | None, dashboard_uid: str, dashboard_pod: bool = True) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{params.runbook_base_url}/{name}.md",
        "dashboard_url": _dashboard_url(params, dashboard_uid, pod=dashboard_pod),
    }
    return rule


def recording_rules() -> list[dict[str, str]]:
    """Per namespace/model aggregates for the dashboards and the weekly report.

    Ratios are ratios of sums (``sum(rate(hits)) / sum(rate(queries))``, used
    over used + free), never averages of per-pod ratios, which would weigh an
    idle pod like a busy one (Prometheus docs, "Recording rules" practices:
    aggregate the numerator and denominator separately, then divide).
    """
    by = "by (namespace, model_name)"

    def agg(op: str, metric: str) -> dict[str, str]:
        return {"record": f"namespace_model:{metric}:{op}", "expr": f"{op} {by} ({metric})"}

    def rate5m(counter: str) -> dict[str, str]:
        base = counter.removesuffix("_total")
        return {"record": f"namespace_model:{base}:rate5m", "expr": f"sum {by} (rate({counter}[5m]))"}

    return [
        agg("max", "kvcache_usage_ratio"),
        agg("avg", "kvcache_usage_ratio"),
        # Token-weighted usage of the whole namespace/model: used + free is
        # each engine's usable capacity (capacity minus the null block).
        {"record": "namespace_model:kvcache_used_per_usable_tokens:ratio",
         "expr": f"sum {by} (kvcache_used_tokens)\n/\n"
                 f"(sum {by} (kvcache_used_tokens) + sum {by} (kvcache_free_tokens))"},
        agg("sum", "kvcache_capacity_tokens"),
        agg("sum", "kvcache_used_tokens"),
        agg("sum", "kvcache_free_tokens"),
        agg("sum", "kvcache_demand_tokens"),
        agg("min", "kvcache_time_until_full_seconds"),
        agg("sum", "kvcache_requests_running"),
        {"record": "namespace_model_reason:kvcache_requests_waiting:sum",
         "expr": "sum by (namespace, model_name, reason) (kvcache_requests_waiting)"},
        rate5m("kvcache_preemptions_total"),
        rate5m("kvcache_prefix_cache_queries_tokens_total"),
        rate5m("kvcache_prefix_cache_hits_tokens_total"),
        {"record": "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m",
         "expr": f"sum {by} (rate(kvcache_prefix_cache_hits_tokens_total[5m]))\n/\n"
                 f"sum {by} (rate(kvcache_prefix_cache_queries_tokens_total[5m]))"},
        # Usage only while the engine is awake: a sleeping engine reads 0 and
        # would drag the over-provisioning quantile down.
        {"record": "engine:kvcache_usage_ratio:awake",
         "expr": "kvcache_usage_ratio unless kvcache_engine_asleep == 1"},
    ]


def alerting_rules(th: Thresholds, p: RuleParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(capacity alerts, sidecar self-monitoring alerts)."""
    usage_peak = f"max_over_time(kvcache_usage_ratio[{p.gap_window}])"
    full_within_s = prometheus_duration_seconds(p.full_soon_within)
    ov, cap = DASHBOARD_OVERVIEW_UID, DASHBOARD_CAPACITY_UID

    capacity = [
        _alert(p, "KVCacheAlmostFull", f"{usage_peak} > {_num(th.warning)}", "warning",
               f"KV cache usage is above {_pct(th.warning)}.",
               _fill("KV cache of ${where} has been above ${thr} for ${for_} (peak of the last ${gap}: "
                     "{{ $value | humanizePercentage }}). At ${page} for ${page_for} this pages.",
                     where=_WHERE_ENGINE, thr=_pct(th.warning), for_=p.warning_for, gap=p.gap_window,
                     page=_pct(th.watermark), page_for=p.critical_for),
               for_=p.warning_for, dashboard_uid=ov),
        _alert(p, "KVCacheAlmostFull", f"{usage_peak} > {_num(th.watermark)}", "critical",
               f"KV cache usage is above the {_pct(th.watermark)} paging watermark.",
               _fill("KV cache of ${where} has been above the ${thr} watermark for ${for_} (peak of the last "
                     "${gap}: {{ $value | humanizePercentage }}). New requests queue and running ones are "
                     "preempted once it is full.",
                     where=_WHERE_ENGINE, thr=_pct(th.watermark), for_=p.critical_for, gap=p.gap_window),
               for_=p.critical_for, dashboard_uid=ov),
        _alert(p, "KVCacheFullSoon", f"kvcache_time_until_full_seconds < {_num(full_within_s)}", "critical",
               f"KV cache is forecast to be full within {p.full_soon_within}.",
               _fill("At the current fill rate the KV cache of ${where} is full in "
                     "{{ $value | humanizeDuration }} (forecast below ${within} for ${for_}).",
                     where=_WHERE_ENGINE, within=p.full_soon_within, for_=p.full_soon_for),
               for_=p.full_soon_for, dashboard_uid=cap),
        _alert(p, "KVCachePreemptions", f"rate(kvcache_preemptions_total[5m]) > {_num(p.preemptions_per_second)}",
               "warning", "vLLM keeps preempting requests for lack of KV cache.",
               _fill("${where} has preempted requests for ${for_} ({{ $value | printf \"%.2f\" }} preemptions/s "
                     "over 5m): each preemption throws away a request's KV and recomputes it.",
                     where=_WHERE_ENGINE, for_=p.preemptions_for),
               for_=p.preemptions_for, dashboard_uid=ov),
        # Waiting alone is also caused by max_num_seqs or the per-step token
        # budget (seen on real vLLM at usage < 0.4): only waiting *while the
        # cache is above the watermark* is KV pressure. reason="all" is what
        # the sidecar exports for vLLM versions without the reason breakdown.
        _alert(p, "KVCacheRequestsWaitingForKV",
               f'max_over_time(kvcache_requests_waiting{{reason=~"capacity|all"}}[{p.gap_window}]) > 0\n'
               f"and ignoring (reason)\n"
               f"{usage_peak} > {_num(th.watermark)}",
               "warning", "Requests are queued because the KV cache is full.",
               _fill("{{ $value | humanize }} requests of ${where} have waited for scheduler capacity "
                     "(reason {{ $labels.reason }}) while the KV cache was above ${thr}, for ${for_}.",
                     where=_WHERE_ENGINE, thr=_pct(th.watermark), for_=p.waiting_for),
               for_=p.waiting_for, dashboard_uid=ov),
        _alert(p, "KVCachePrefixHitRatioLow",
               "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m"
               f" < {_num(p.prefix_hit_ratio_low)}",
               "warning", f"Prefix cache hit ratio is below {_pct(p.prefix_hit_ratio_low)}.",
               _fill("Only {{ $value | humanizePercentage }} of the prompt tokens of ${where} were found in "
                     "the prefix cache over 5m, for ${for_}.",
                     where=_WHERE_MODEL, for_=p.prefix_hit_ratio_for),
               for_=p.prefix_hit_ratio_for, dashboard_uid=ov, dashboard_pod=False),
        _alert(p, "KVCacheCapacityMismatch",
               f'abs(kvcache_capacity_efficiency_ratio{{budget="exact"}} - 1) > {_num(p.capacity_mismatch_tolerance)}',
               "warning", "Actual KV capacity differs from the model's theoretical capacity.",
               _fill("vLLM's KV capacity for ${where} is off from what its configured KV memory should hold by "
                     "{{ $value | humanizePercentage }} (tolerance ${tol}): the served configuration is not the "
                     "one the sidecar was told.",
                     where=_WHERE_ENGINE, tol=_pct(p.capacity_mismatch_tolerance)),
               for_=p.capacity_mismatch_for, dashboard_uid=cap),
        _alert(p, "KVCacheOverProvisioned",
               f"quantile_over_time({_num(p.overprovisioned_quantile)}, engine:kvcache_usage_ratio:awake"
               f"[{p.overprovisioned_window}]) < {_num(p.overprovisioned_below)}\n"
               # only engines that have existed for the whole window
               f"and present_over_time(kvcache_usage_ratio[1h] offset "
               f"{_window_minus_1h(p.overprovisioned_window)})\n"
               f"unless kvcache_engine_asleep == 1",
               "info", "KV cache is over-provisioned.",
               _fill("p${q} of the awake-time KV usage of ${where} over ${window} is "
                     "{{ $value | humanizePercentage }}, below ${below}: memory could go to a smaller "
                     "gpu_memory_utilization or fewer replicas.",
                     where=_WHERE_ENGINE, q=f"{round(p.overprovisioned_quantile * 100, 2):g}",
                     window=p.overprovisioned_window, below=_pct(p.overprovisioned_below)),
               for_=p.overprovisioned_for, dashboard_uid=cap),
    ]

    job = f'job="{p.sidecar_job}"'
    sidecar = [
        # last_success is absent until the first successful scrape, so a
        # model that is still loading (20 s - 10 min) cannot fire this.
        _alert(p, "KVCacheSidecarScrapeFailing",
               "kvcache_sidecar_target_up == 0\nand\nkvcache_sidecar_last_success_timestamp_seconds",
               "warning", "The KV-cache sidecar cannot read vLLM's metrics.",
               _fill("Sidecar ${where} has failed to scrape its target {{ $labels.target }} for ${for_}; "
                     "its KV gauges, and the alerts on them, are going stale.",
                     where=_WHERE_SIDECAR, for_=p.scrape_failing_for),
               for_=p.scrape_failing_for, dashboard_uid=ov),
        # critical: with the sidecar gone the KVCacheAlmostFull page cannot fire.
        _alert(p, "KVCacheSidecarDown", f"up{{{job}}} == 0\nor\nabsent(up{{{job}}})", "critical",
               "The KV-cache sidecar is down; KV-cache pages cannot fire.",
               _fill("{{ with $labels.instance }}Prometheus has failed to scrape the sidecar at {{ . }}"
                     "{{ else }}No target of job ${job} is known to Prometheus{{ end }} for ${for_}, so "
                     "KV-cache alerts for it are blind.",
                     job=p.sidecar_job, for_=p.sidecar_down_for),
               for_=p.sidecar_down_for, dashboard_uid=ov),
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


def build_rule_groups(thresholds: Thresholds, params: RuleParams) -> dict[str, Any]:
    """The rule-file mapping (``{"groups": [...]}``) for these thresholds and params."""
    capacity, sidecar = alerting_rules(thresholds, params)
    groups = [
        {"name": "kvcache.rules", "rules": recording_rules()},
        {"name": "kvcache-capacity", "rules": capacity},
        {"name": "kvcache-sidecar", "rules": sidecar},
    ]
    if params.evaluation_interval:
        for g in groups:
            # "interval" right after "name", as Prometheus' docs write it
            rules = g.pop("rules")
            g["interval"] = params.evaluation_interval
            g["rules"] = rules
    return {"groups": groups}


def prometheus_rule(groups: Mapping[str, Any], name: str = "kv-cache-sidecar") -> dict[str, Any]:
    """The Kubernetes ``PrometheusRule`` (prometheus-operator) whose ``spec.groups`` are ``groups``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "kv-cache-sidecar", "app.kubernetes.io/component": "alerting"},
        },
        "spec": {"groups": groups["groups"]},
    }


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (readable PromQL), no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def render(thresholds: Thresholds, params: RuleParams, fmt: str = "rules", variant: str = "default") -> str:
    """The file text: a header saying how it was made, then the YAML."""
    if variant == "fast":
        params = params.fast()
    groups = build_rule_groups(thresholds, params)
    doc = groups if fmt == "rules" else prometheus_rule(groups)
    header = (
        "# Generated by `kv-sidecar rules render` (sidecar/rules.py); do not edit by hand.\n"
        "# Change the `thresholds:`/`alerts:` config sections or the generator, then re-render;\n"
        "# tests/alerts checks that the committed default equals the generated one.\n"
        f"# variant={variant} watermark={_num(thresholds.watermark)} warning={_num(thresholds.warning)} "
        f"target_usage={_num(thresholds.target_usage)}\n"
    )
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1_000_000,
                     allow_unicode=True)
    return header + body


# ---------------------------------------------------------------------------
# CLI edge: kv-sidecar rules render
# ---------------------------------------------------------------------------

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rules`` (with the ``render`` action) on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "rules", help="render the Prometheus alerting/recording rules",
        description="Render the alert and recording rules from the thresholds: and alerts: config sections "
                    "(the same file `kv-sidecar run --config.file` reads). Flags win over the file.")
    parser.add_argument("action", choices=["render"], help="what to do")
    parser.add_argument("--config.file", dest="config_file", metavar="FILE", default=None,
                        help="sidecar configuration YAML; its thresholds: and alerts: sections are used "
                             "(default: none)")
    parser.add_argument("--out", default="-", metavar="DIR|-",
                        help=f"directory to write {RULES_FILE_NAME} (or {PROMETHEUSRULE_FILE_NAME}) into, "
                             f"atomically; '-' prints to stdout (default: -)")
    parser.add_argument("--format", choices=["rules", "prometheusrule"], default="rules",
                        help="plain Prometheus rule file, or a Kubernetes PrometheusRule (default: rules)")
    parser.add_argument("--variant", choices=list(VARIANTS), default="default",
                        help="'fast' shortens every for: to seconds and evaluates every 1s, for end-to-end tests "
                             "(default: default)")
    # The same spellings as `kv-sidecar run` (--thresholds.watermark), so one flag means one thing.
    parser.add_argument("--thresholds.watermark", dest="watermark", type=float, default=None, metavar="FRACTION",
                        help="override thresholds.watermark: the page (critical) (default: from the config, else 0.9)")
    parser.add_argument("--thresholds.warning", dest="warning", type=float, default=None, metavar="FRACTION",
                        help="override thresholds.warning: the ticket (default: from the config, else 0.8)")
    parser.add_argument("--thresholds.target-usage", dest="target_usage", type=float, default=None,
                        metavar="FRACTION",
                        help="override thresholds.target_usage (default: from the config, else 0.75)")
    parser.add_argument("--alerts.sidecar-job", dest="sidecar_job", default=None, metavar="JOB",
                        help="override alerts.sidecar_job: the Prometheus job label of the sidecar "
                             "(default: from the config, else kv-cache-sidecar)")
    parser.add_argument("--alerts.runbook-base-url", dest="runbook_base_url", default=None, metavar="URL",
                        help=f"override alerts.runbook_base_url (default: from the config, else "
                             f"{RuleParams.runbook_base_url})")
    parser.add_argument("--alerts.dashboard-base-url", dest="dashboard_base_url", default=None, metavar="URL",
                        help=f"override alerts.dashboard_base_url, the Grafana root URL (default: from the config, "
                             f"else {RuleParams.dashboard_base_url})")
    parser.set_defaults(func=run)
    return parser


def _load(args: argparse.Namespace) -> tuple[Thresholds, RuleParams, list[str]]:
    """Thresholds and params from the config file (as the sidecar reads it) and flag overrides."""
    from .config import ConfigError, load_config  # the sidecar's own loader: one reading of thresholds:

    flags = {("thresholds", k): getattr(args, k) for k in ("watermark", "warning", "target_usage")}
    source = args.config_file or "flags"
    try:
        cfg = load_config(args.config_file, flags=flags)
    except ConfigError as e:
        # Only the thresholds:/alerts: sections matter here, but a config the
        # sidecar would refuse is not one to render rules from either.
        return Thresholds(), RuleParams(), [f"{e.source}: {p}" for p in e.problems]
    alerts = dict(cfg.alerts or {})
    for k in ("sidecar_job", "runbook_base_url", "dashboard_base_url"):
        if getattr(args, k) is not None:
            alerts[k] = getattr(args, k)
    params, problems = RuleParams.from_mapping(alerts)
    return cfg.thresholds, params, [f"{source}: {p}" for p in problems]


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    """``kv-sidecar rules render``: 0 on success, 2 on a bad configuration or output path."""
    thresholds, params, problems = _load(args)
    if problems:
        for p in problems:
            print(f"kv-sidecar rules: {p}", file=sys.stderr)
        return 2
    text = render(thresholds, params, fmt=args.format, variant=args.variant)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        print(f"kv-sidecar rules: --out: {out_dir} is not a directory (give a directory, or - for stdout)",
              file=sys.stderr)
        return 2
    path = out_dir / (RULES_FILE_NAME if args.format == "rules" else PROMETHEUSRULE_FILE_NAME)
    try:
        write_atomically(path, text)
    except OSError as e:
        print(f"kv-sidecar rules: --out: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0
