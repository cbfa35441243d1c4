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

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import __version__
from .metrics import BY_NAME, CATALOGUE, KEY, Gauge, MetricDoc, Values
from .reload_status import ReloadStatus
from .state import TargetState

log = logging.getLogger("kv_sidecar.exporter")

#: Families yielded only when some engine has a value for them: series of a newer engine version that
#: no page before it carries, so that a server without them shows no empty HELP/TYPE lines and the
#: exposition of every older page stays what it was (tests/test_exposition_unchanged.py).
#: ``kvcache_preemptions_by_reason_total``: vLLM PR #58037 (proposed after 0.32).
ONLY_WHEN_SET = frozenset({"kvcache_preemptions_by_reason_total"})

_Family = CounterMetricFamily | GaugeMetricFamily


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family for one catalogue row (sidecar.metrics.CATALOGUE)."""
    doc = BY_NAME[name]
    labels = list(doc.labels)
    if doc.type == "counter":
        return CounterMetricFamily(name.removesuffix("_total"), doc.help, labels=labels)
    # gauges, and info series: gauges of value 1 with the information in their labels
    return GaugeMetricFamily(name, doc.help, labels=labels)


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


#: Exported only once non-zero: a value the catalogue does not know (a bug) is refused and counted.
EXPORT_ERRORS = "kvcache_sidecar_export_errors_total"
#: Catalogue rows a healthy sidecar never exports (tests that expect every row emitted skip these).
ONLY_ON_FAULT = (EXPORT_ERRORS,)
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
        #: values refused since the start (EXPORT_ERRORS), and the names already logged
        self.export_errors = 0
        self._refused: set[str] = set()

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
            for (model_name, engine), values in snap.values.items():
                self._add_values(fams, [target, model_name, engine], values)

        self._add_own(fams)
        for name, fam in fams.items():
            if name == EXPORT_ERRORS and not self.export_errors:  # a healthy page has no such family
                continue
            if name in ONLY_WHEN_SET and not fam.samples:
                continue
            yield fam

    def _add_values(self, fams: dict[str, _Family], key: list[str], values: Values) -> None:
        """One engine's values into their families. A value whose row is not the catalogue's, or whose
        labels do not fit it, is refused: logged once per name and counted (EXPORT_ERRORS), never a
        failed page."""
        for doc, value in values.items():
            fam = fams.get(doc.name)
            try:
                row = BY_NAME.get(doc.name)
                if fam is None or (row is not doc and row != doc):
                    raise KeyError(f"{doc.name} is not a row of sidecar.metrics.CATALOGUE")
                _add(fam, doc, key, value)
            except (KeyError, ValueError, TypeError) as e:
                self._refuse(doc, e)

    def _refuse(self, doc: MetricDoc, error: Exception) -> None:
        self.export_errors += 1
        if doc.name not in self._refused:
            self._refused.add(doc.name)
            log.error(
                "exporter refused a value of %s: %s (a derivation bug; counted in %s, logged once per name)",
                doc.name,
                error,
                EXPORT_ERRORS,
            )

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
        if self.export_errors:
            fams[EXPORT_ERRORS].add_metric([], float(self.export_errors))
        fams["kvcache_sidecar_build_info"].add_metric([__version__], 1.0)


def _add(fam: _Family, doc: MetricDoc, key: list[str], value: Gauge) -> None:
    """One engine's value of ``doc`` into its family: a number, or a number per tuple of the row's
    labels beyond :data:`~sidecar.metrics.KEY`; None and NaN are not exported.

    The whole value is checked before any sample is added, and anything that is not what
    :data:`~sidecar.metrics.Gauge` says (a string, a label that is not a string, an int too large for a
    float) raises :class:`ValueError`: the caller refuses and counts it. Left through, a non-string label
    would fail ``generate_latest`` for the whole page, after ``collect()`` returned.
    """
    if value is None:
        return
    samples: list[tuple[list[str], float]] = []
    if isinstance(value, int | float):
        if len(doc.labels) != len(KEY):
            raise ValueError(f"a number for a row labelled {doc.labels}")
        samples.append((key, _number(value)))
    elif isinstance(value, Mapping):
        extra = len(doc.labels) - len(KEY)
        for labels, v in value.items():
            if not isinstance(labels, tuple) or len(labels) != extra or not all(isinstance(x, str) for x in labels):
                raise ValueError(f"labels {labels!r} for a row labelled {doc.labels}")
            if v is not None:
                samples.append((key + list(labels), _number(v)))
    else:
        raise ValueError(f"a {type(value).__name__} is not a gauge value")
    for label_values, number in samples:
        if not math.isnan(number):
            fam.add_metric(label_values, number)


def _number(value: object) -> float:
    """``value`` as a float; :class:`ValueError` for what is not a real number (a string, an int past a float)."""
    if not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{value!r} does not fit a float") from None
