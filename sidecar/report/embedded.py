"""The report's source on a single machine: the sidecar's own history file (``history.path``).

What: :class:`HistorySource` reads a :mod:`sidecar.history` file (read-only: it never creates,
changes or locks it for the daemon that writes it) and fills a :class:`~sidecar.report.data.Week`.

Resolution: the history holds one row per series and minute, so the steps are the history's
minutes: ``usage_max`` is the minute's largest sample, ``usage_mean`` its mean, counters are the
minute's increases (the store handles resets), capacities its last value. (The series and their reductions are
:data:`~sidecar.report.data.STEP_SERIES`, the table the Prometheus source reads too.) The week's percentiles
and hours above each threshold are left to :mod:`sidecar.report.figures`, which computes them from
these minutes (so within a minute of what raw samples give).

Labels: the history keeps the sidecar's own labels (``target``, ``model_name``, ``engine``), with no
``namespace``; a pod is its ``target``. ``--selector`` matches those labels, and ``pod`` as the target.
Pages: the history has no ``ALERTS`` series (alerts are Prometheus'), so ``Week.pages_known`` is False.
"""

from __future__ import annotations

import math
from collections.abc import Callable, MutableSequence
from pathlib import Path

from ..history import HistoryStore, Point
from .data import (
    HISTORY_PERIODS,
    INCREASE,
    LAST,
    MAX,
    MEAN,
    PREVIOUS_FIELDS,
    STEP_SERIES,
    ModelKey,
    Period,
    PodSeries,
    StepSeries,
    Week,
    model_peaks,
)
from .growth import WeeklyPeak
from .selector import Matcher, matches

#: What a history minute contributes to a step, for each reduction of :data:`~sidecar.report.data.STEP_SERIES`
#: (the history keeps each minute's largest, mean and last sample, and a counter's increase with resets handled).
_MINUTE: dict[str, Callable[[Point], float | None]] = {
    MAX: lambda p: p.max,
    MEAN: lambda p: p.mean,
    LAST: lambda p: p.last,
    INCREASE: lambda p: p.increase,
}
#: How a pod's several series of one step series (``only``: requests waiting by reason) combine in a step.
_COMBINE: dict[str, Callable[[float, float], float]] = {MAX: max}
_PodKey = tuple[str, str, str]  # (target, model_name, engine)


class HistorySource:
    """Read one period (and, asked, the periods before it) from a history file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self, period: Period, matchers: tuple[Matcher, ...] = (), compare_previous: bool = False) -> Week:
        """Every pod of the period whose labels match; raises :class:`~sidecar.history.HistoryError`."""
        store = HistoryStore.open(self.path, read_only=True)
        try:
            week = self._read(store, period, matchers)
            if compare_previous:
                week.history = self._history(store, period, matchers)
        finally:
            store.close()
        return week

    def _history(
        self, store: HistoryStore, period: Period, matchers: tuple[Matcher, ...]
    ) -> list[dict[ModelKey, WeeklyPeak]]:
        """The :data:`HISTORY_PERIODS` periods before ``period``, oldest first, each read (its demand alone) and
        reduced to its models' peaks before the next; a period without data is left out (a gap)."""
        peaks: list[dict[ModelKey, WeeklyPeak]] = []
        before = period
        for _ in range(HISTORY_PERIODS):
            before = before.previous()
            found = model_peaks(self._read(store, before, matchers, PREVIOUS_FIELDS))
            if found:
                peaks.insert(0, found)
        return peaks

    def _read(
        self, store: HistoryStore, period: Period, matchers: tuple[Matcher, ...], only: tuple[str, ...] = ()
    ) -> Week:
        """The period's pods; with ``only``, just those series of them (a period before: PREVIOUS_FIELDS)."""
        pods: dict[_PodKey, PodSeries] = {}

        def pod_of(labels: dict[str, str]) -> PodSeries | None:
            key = (labels.get("target", ""), labels.get("model_name", ""), labels.get("engine", ""))
            if key not in pods:
                return None
            return pods[key]

        for sid, labels in store.series("kvcache_usage_ratio"):
            key = (labels.get("target", ""), labels.get("model_name", ""), labels.get("engine", ""))
            if not matches(matchers, {**labels, "pod": key[0]}) or not store.points(sid, period.start, period.end):
                continue
            pods[key] = PodSeries.empty(period, ModelKey("", key[1]), key[0], key[2], dict(labels))

        for s in STEP_SERIES:
            if not only or s.field in only:
                _read_step_series(store, period, s, pod_of)
        if not only:
            for pod in pods.values():
                _read_pod_facts(store, period, pod)
        ordered = sorted(pods.values(), key=lambda p: (p.model, p.pod, p.engine))
        return Week(period=period, pods=ordered, pages=[], source=f"history {self.path}", pages_known=False)


def _read_step_series(
    store: HistoryStore, period: Period, s: StepSeries, pod_of: Callable[[dict[str, str]], PodSeries | None]
) -> None:
    """Every pod's series ``s`` from its one-minute rows; ``only`` and ``ranked_by`` as :class:`StepSeries` says."""
    label, ranks = s.ranked_by or ("", ("",))
    for rank in ranks:  # the higher rank last: it wins a minute both fill
        for sid, labels in store.series(s.metric):
            pod = pod_of(labels)
            if pod is None or (s.only and labels.get(s.only[0]) not in s.only[1]):
                continue
            if label and labels.get(label, ranks[0]) != rank:
                continue
            points = store.points(sid, period.start, period.end)
            _fill(getattr(pod, s.field), period, points, _MINUTE[s.reduce], _COMBINE.get(s.reduce) if s.only else None)


def _fill(
    steps: MutableSequence[float],
    period: Period,
    points: list[Point],
    value: Callable[[Point], float | None],
    combine: Callable[[float, float], float] | None = None,
) -> None:
    """Put each minute's value in its step; ``combine`` merges with a value already there (several series)."""
    for p in points:
        i = period.index(p.minute)
        v = value(p)
        if i is None or v is None or math.isnan(v):
            continue
        steps[i] = v if combine is None or math.isnan(steps[i]) else combine(steps[i], v)


def _last(store: HistoryStore, period: Period, name: str, labels: dict[str, str]) -> tuple[float, float] | None:
    """(minute, last value) of the newest minute of ``name`` with the pod's labels, None when absent."""
    newest: tuple[float, float] | None = None
    for sid, _ in store.series(name, labels):
        points = store.points(sid, period.start, period.end)
        if points and (newest is None or points[-1].minute >= newest[0]):
            newest = (points[-1].minute, points[-1].last)
    return newest


def _largest(store: HistoryStore, period: Period, name: str, labels: dict[str, str]) -> float | None:
    """The largest sample of ``name`` with these labels in the period (any other labels), None when absent."""
    values = [
        p.max
        for sid, _ in store.series(name, labels)
        for p in store.points(sid, period.start, period.end)
        if p.max is not None and math.isfinite(p.max)
    ]
    return max(values) if values else None


def _read_pod_facts(store: HistoryStore, period: Period, pod: PodSeries) -> None:
    """The pod's last-seen settings: pool labels, GPU utilization, bytes per token, model shape (its step
    series are read by :func:`_read_step_series`)."""
    own: dict[str, str] = {k: pod.labels[k] for k in ("target", "model_name", "engine") if k in pod.labels}
    found = _last(store, period, "kvcache_gpu_memory_utilization", own)
    pod.gpu_memory_utilization = found[1] if found else None
    found = _last(store, period, "kvcache_theoretical_bytes_per_token", own)
    pod.bytes_per_token = found[1] if found else None
    pod.suggested_gpu_memory_utilization_max = _largest(store, period, "kvcache_suggested_gpu_memory_utilization", own)
    pod.fp8_lever_capacity_tokens = _largest(
        store, period, "kvcache_lever_capacity_tokens", {**own, "lever": "fp8_kv_cache"}
    )
    info = _newest_labels(store, period, "kvcache_server_info", own)
    if info:
        pod.block_size = _int(info.get("block_size"))
        kv_bytes = _int(info.get("kv_cache_memory_bytes"))
        pod.kv_cache_memory_bytes = float(kv_bytes) if kv_bytes else None
    model = _newest_labels(store, period, "kvcache_model_info", own)
    pod.model_info = {k: v for k, v in model.items() if k not in own}
    found = _last(store, period, "kvcache_gpu_memory_bytes", own)  # what the sidecar sizes with, and the GPU
    pod.gpu_memory_bytes = found[1] if found else None
    pod.gpu_name = _newest_labels(store, period, "kvcache_gpu_memory_bytes", own).get("gpu", "")


def _newest_labels(store: HistoryStore, period: Period, name: str, own: dict[str, str]) -> dict[str, str]:
    """The labels of the info series ``name`` seen last in the period ({} when none)."""
    newest: tuple[float, dict[str, str]] | None = None
    for sid, labels in store.series(name, own):
        points = store.points(sid, period.start, period.end)
        if points and (newest is None or points[-1].minute >= newest[0]):
            newest = (points[-1].minute, labels)
    return newest[1] if newest else {}


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None
