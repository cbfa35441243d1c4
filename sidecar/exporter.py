"""The custom Collector: latest per-target snapshots -> metric families.

``collect()`` builds fresh families from the current snapshots on every
Prometheus scrape and keeps no state of its own. Derived series are withheld
once a target's last successful scrape is older than the staleness limit
(``scrape.staleness``), so alerts never run on frozen values. A few lines of
what it produces::

    kvcache_usage_ratio{engine="0",model_name="m",target="vllm"} 0.936
    kvcache_free_tokens{engine="0",model_name="m",target="vllm"} 384.0
    kvcache_requests_waiting{engine="0",model_name="m",reason="capacity",target="vllm"} 56.0
    kvcache_sidecar_scrape_errors_total{reason="timeout",target="vllm"} 0.0
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import __version__
from .metrics import BY_NAME, CATALOGUE
from .reload import ReloadStatus
from .state import TargetState


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family for one catalogue row (sidecar.metrics.CATALOGUE)."""
    doc = BY_NAME[name]
    labels = list(doc.labels)
    if doc.type == "counter":
        return CounterMetricFamily(name.removesuffix("_total"), doc.help, labels=labels)
    # gauges, and info series: gauges of value 1 with the information in their labels
    return GaugeMetricFamily(name, doc.help, labels=labels)


def _number(label: str | None) -> float | None:
    """A cache_config_info label as a finite number; None when absent or not one."""
    try:
        value = float(label) if label else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _add_target_own(add: Callable[[str, list[str], float | None], None], st: TargetState) -> None:
    """A target's self-monitoring series: up, duration, failures and dropped series by reason, changes."""
    snap, target = st.snapshot, st.target.name
    add("kvcache_sidecar_target_up", [target], 1.0 if snap.up else 0.0)
    if snap.last_duration_s is not None:
        add("kvcache_sidecar_scrape_duration_seconds", [target], snap.last_duration_s)
    for reason, count in st.errors.items():
        add("kvcache_sidecar_scrape_errors_total", [target, reason], count)
    for reason, count in st.dropped.items():
        add("kvcache_sidecar_series_dropped_total", [target, reason], count)
    if snap.last_success_wall is not None:
        add("kvcache_sidecar_last_success_timestamp_seconds", [target], snap.last_success_wall)
    add("kvcache_sidecar_config_changes_total", [target], st.config_changes)


#: Exported only when the embedded history is on (``history.path``).
HISTORY_ERRORS = "kvcache_sidecar_history_write_errors_total"
#: Exported only by a daemon that can reload its configuration (``kv-sidecar run``, ``demo``): not by
#: the in-process sidecars of replays and benchmarks, whose output stays what it was.
RELOAD_SERIES = (
    "kvcache_sidecar_config_last_reload_successful",
    "kvcache_sidecar_config_last_reload_success_timestamp_seconds",
    "kvcache_sidecar_config_reloads_total",
)


class SidecarCollector(Collector):
    def __init__(
        self,
        states: Sequence[TargetState],
        *,
        staleness_s: float,
        clock: Callable[[], float] = time.time,
        history_errors: Callable[[], int] | None = None,
    ):
        # (targets, staleness) in one attribute: a reload swaps both at once, and collect() on the HTTP
        # thread reads them once, so it never sees the new targets with the old staleness.
        self._view: tuple[Sequence[TargetState], float] = (states, staleness_s)
        self._clock = clock
        self._history_errors = history_errors  # None: no history configured, no such series
        #: the daemon's reload status (set by the daemon; None: no reload series)
        self.reload_status: Callable[[], ReloadStatus] | None = None

    def reconfigure(self, states: Sequence[TargetState], staleness_s: float) -> None:
        """Export these targets with this staleness from the next collect() on (a reload)."""
        self._view = (states, staleness_s)

    def describe(self) -> Iterable[Metric]:
        """Every family of the catalogue, empty (collect() fills them per scrape).

        ``CollectorRegistry.register`` reads the names from here, so a registry refuses a second
        collector that exports any of them (``ValueError: Duplicated timeseries``) instead of
        serving two series of the same name.
        """
        return [_family(m.name) for m in CATALOGUE]

    def _exported(self) -> list[str]:
        """The catalogue's names this collector exports: the history's and the reloads' only when they apply."""
        skipped = set() if self._history_errors is not None else {HISTORY_ERRORS}
        if self.reload_status is None:
            skipped.update(RELOAD_SERIES)
        return [m.name for m in CATALOGUE if m.name not in skipped]

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        states, staleness_s = self._view
        fams = {name: _family(name) for name in self._exported()}

        def add(name: str, labels: list[str], value: float | None) -> None:
            if value is not None and not math.isnan(value):
                fams[name].add_metric(labels, float(value))

        for st in states:
            snap = st.snapshot
            target = st.target.name
            _add_target_own(add, st)

            fresh = snap.last_success_wall is not None and now - snap.last_success_wall <= staleness_s
            if not fresh:
                continue
            for (model_name, engine), d in snap.derived.items():
                key = [target, model_name, engine]
                add("kvcache_usage_ratio", key, d.usage_ratio)
                add("kvcache_capacity_tokens", key, d.capacity_tokens)
                add("kvcache_used_tokens", key, d.used_tokens)
                add("kvcache_free_tokens", key, d.free_tokens)
                add("kvcache_watermark_headroom_tokens", key, d.watermark_headroom_tokens)
                add("kvcache_prefix_cache_queries_tokens_total", key, d.prefix_cache_queries_tokens)
                add("kvcache_prefix_cache_hits_tokens_total", key, d.prefix_cache_hits_tokens)
                add("kvcache_preemptions_total", key, d.preemptions)
                add("kvcache_prefix_cache_hit_ratio", key, d.prefix_cache_hit_ratio)
                add("kvcache_preemptions_per_second", key, d.preemptions_per_second)
                add("kvcache_requests_running", key, d.requests_running)
                for reason, n in sorted(d.requests_waiting.items()):
                    add("kvcache_requests_waiting", key + [reason], n)
                if d.engine_asleep is not None:
                    add("kvcache_engine_asleep", key, 1.0 if d.engine_asleep else 0.0)
                cc = snap.cache_configs.get((model_name, engine), {})
                pool = d.pool
                add(
                    "kvcache_server_info",
                    key
                    + [
                        snap.engine_kind or "",
                        snap.generation or "",
                        cc.get("block_size", ""),
                        cc.get("num_gpu_blocks", ""),
                        cc.get("cache_dtype", ""),
                        cc.get("gpu_memory_utilization", ""),
                        cc.get("kv_cache_memory_bytes", ""),
                        cc.get("enable_prefix_caching", ""),
                        "true" if pool and pool.hybrid else "false",
                    ],
                    1.0,
                )
                utilization = _number(cc.get("gpu_memory_utilization"))
                if utilization is not None:
                    add("kvcache_gpu_memory_utilization", key, utilization)
                for name, value in snap.extra.get((model_name, engine), {}).items():
                    if isinstance(value, dict):
                        for extra_labels, v in value.items():
                            add(name, key + list(extra_labels), v)
                    else:
                        add(name, key, value)  # type: ignore[arg-type]

        self._add_own(fams)
        yield from fams.values()

    def _add_own(self, fams: dict[str, CounterMetricFamily | GaugeMetricFamily]) -> None:
        """The sidecar's own series: its version, its history's write errors when it keeps one, and the
        outcome of its configuration reloads when it can reload."""
        if self._history_errors is not None:
            fams[HISTORY_ERRORS].add_metric([], float(self._history_errors()))
        if self.reload_status is not None:
            status = self.reload_status()
            fams["kvcache_sidecar_config_last_reload_successful"].add_metric([], 1.0 if status.successful else 0.0)
            fams["kvcache_sidecar_config_last_reload_success_timestamp_seconds"].add_metric([], status.last_success_s)
            fams["kvcache_sidecar_config_reloads_total"].add_metric(["success"], float(status.successes))
            fams["kvcache_sidecar_config_reloads_total"].add_metric(["failure"], float(status.failures))
        fams["kvcache_sidecar_build_info"].add_metric([__version__], 1.0)
