"""The report's source on a single machine: the sidecar's own history file (``history.path``).

What: :class:`HistorySource` reads a :mod:`sidecar.history` file (read-only: it never creates,
changes or locks it for the daemon that writes it) and fills a :class:`~sidecar.report.data.Week`.

Resolution: the history holds one row per series and minute, so the steps are the history's
minutes: ``usage_max`` is the minute's largest sample, ``usage_mean`` its mean, counters are the
minute's increases (the store handles resets), capacities its last value. The week's percentiles
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
from .data import PREVIOUS_FIELDS, ModelKey, Period, PodSeries, Week
from .selector import Matcher, matches

#: (series name, PodSeries list field, what a minute contributes)
_STEP_FIELDS: tuple[tuple[str, str, Callable[[Point], float | None]], ...] = (
    ("kvcache_usage_ratio", "usage_max", lambda p: p.max),
    ("kvcache_usage_ratio", "usage_mean", lambda p: p.mean),
    ("kvcache_demand_tokens", "demand_max", lambda p: p.max),
    ("kvcache_capacity_tokens", "capacity_tokens", lambda p: p.last),
    ("kvcache_preemptions_total", "preemptions", lambda p: p.increase),
    ("kvcache_prefix_cache_queries_tokens_total", "prefix_queries", lambda p: p.increase),
    ("kvcache_prefix_cache_hits_tokens_total", "prefix_hits", lambda p: p.increase),
    ("kvcache_requests_running", "running_max", lambda p: p.max),
)
_PodKey = tuple[str, str, str]  # (target, model_name, engine)


class HistorySource:
    """Read one period (and the one before it) from a history file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self, period: Period, matchers: tuple[Matcher, ...] = (), compare_previous: bool = False) -> Week:
        """Every pod of the period whose labels match; raises :class:`~sidecar.history.HistoryError`."""
        store = HistoryStore.open(self.path, read_only=True)
        try:
            week = self._read(store, period, matchers)
            if compare_previous:
                previous = self._read(store, period.previous(), matchers, PREVIOUS_FIELDS)
                week.previous = previous if previous.pods else None
        finally:
            store.close()
        return week

    def _read(
        self, store: HistoryStore, period: Period, matchers: tuple[Matcher, ...], only: tuple[str, ...] = ()
    ) -> Week:
        """The period's pods; with ``only``, just those series of them (the period before: PREVIOUS_FIELDS)."""
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

        for name, attr, value in _STEP_FIELDS:
            if only and attr not in only:
                continue
            for sid, labels in store.series(name):
                pod = pod_of(labels)
                if pod is not None:
                    _fill(getattr(pod, attr), period, store.points(sid, period.start, period.end), value)
        if not only:
            for sid, labels in store.series("kvcache_requests_waiting"):
                pod = pod_of(labels)
                if pod is not None and labels.get("reason") in ("capacity", "all"):
                    _fill(pod.waiting_max, period, store.points(sid, period.start, period.end), lambda p: p.max, max)
            for pod in pods.values():
                _read_pod_facts(store, period, pod)
        ordered = sorted(pods.values(), key=lambda p: (p.model, p.pod, p.engine))
        return Week(period=period, pods=ordered, pages=[], source=f"history {self.path}", pages_known=False)


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
    """The pod's last-seen settings: pool labels, GPU utilization, bytes per token, model shape."""
    own: dict[str, str] = {k: pod.labels[k] for k in ("target", "model_name", "engine") if k in pod.labels}
    for budget in ("estimated", "exact"):  # exact wins where both exist
        for sid, _ in store.series("kvcache_theoretical_capacity_tokens", {**own, "budget": budget}):
            points = store.points(sid, period.start, period.end)
            _fill(pod.theoretical_capacity_tokens, period, points, lambda p: p.last)
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
