"""What a weekly report is computed from: every pod's series over one period, on one step grid.

Both sources fill the same structures, so the figures, the plots and the three formats never know
where the history came from:

- :mod:`sidecar.report.prometheus` reads the Prometheus HTTP API (and so Thanos, Mimir,
  VictoriaMetrics): per-step series reduced on the server (``max_over_time``, ``last_over_time``
  over each step), and the week's percentiles and hours above each threshold reduced there too
  (``quantile_over_time``, ``count_over_time`` over raw samples), which it puts in the optional
  fields of :class:`PodSeries`;
- :mod:`sidecar.report.embedded` reads the sidecar's own history (:mod:`sidecar.history`), whose
  resolution is one minute; it leaves the optional fields empty and :mod:`sidecar.report.figures`
  computes them from the step series.

The grid: step ``i`` covers ``[start + i × step, start + (i + 1) × step)``; a value is NaN when the
step holds no sample. ``start`` and ``end`` are multiples of the step, so a rerun for the same
period reads the same steps. The step is one minute (:data:`STEP_S`): the embedded history's
resolution, and within Prometheus' 11,000 points per series for a day chunk (1,440 points) and for
a whole week (10,080).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, MutableSequence
from dataclasses import dataclass, field
from typing import Any

from .growth import HISTORY_WEEKS, WeeklyPeak, weekly_peak

#: The report's resolution in seconds (one row of the embedded history).
STEP_S = 60.0
#: The alerts whose firings the report lists (the ``ALERTS`` series).
PAGED_ALERTS = ("KVCacheAlmostFull", "KVCacheFullSoon")
#: What the sources read of each period before this one (``--compare-previous``): the demand, which
#: :func:`model_peaks` reduces at once to each model's peak (``Week.history``). One series a pod, not
#: ten, and one period at a time: the memory stays about one week's, however many periods are read.
PREVIOUS_FIELDS = ("demand_max",)
#: The periods before this one ``--compare-previous`` reads: with this one, the weeks the growth is
#: fitted over (:data:`sidecar.report.growth.HISTORY_WEEKS`).
HISTORY_PERIODS = HISTORY_WEEKS - 1

NAN = math.nan

#: How a step's samples become the step's value (:class:`StepSeries`).
MAX, MEAN, LAST, INCREASE = "max", "mean", "last", "increase"


@dataclass(frozen=True)
class StepSeries:
    """Which of the sidecar's series fills which per-step field of :class:`PodSeries`, and how.

    ``reduce`` says what a step holds: its largest sample (MAX), their mean (MEAN), the last one (LAST),
    or a counter's increase within the step with resets handled (INCREASE). ``only`` keeps the series
    whose label has one of the values (a pod's several series are then combined by ``reduce``);
    ``ranked_by`` orders a pod's series by a label's value, lowest rank first: at a step two of them
    fill, the later wins (a missing label counts as the first value).
    """

    field: str
    metric: str
    reduce: str
    only: tuple[str, tuple[str, ...]] | None = None
    ranked_by: tuple[str, tuple[str, ...]] | None = None

    def only_matcher(self) -> str:
        """``only`` as a PromQL label matcher (``reason=~"capacity|all"``); "" without it."""
        if self.only is None:
            return ""
        label, values = self.only
        return f'{label}=~"{"|".join(values)}"'


#: Every per-step series of a pod, in :class:`PodSeries` order: the one table both sources read
#: (:mod:`sidecar.report.prometheus` turns each reduction into a PromQL ``*_over_time`` per step,
#: :mod:`sidecar.report.embedded` into a field of the history's one-minute rows).
STEP_SERIES: tuple[StepSeries, ...] = (
    StepSeries("usage_max", "kvcache_usage_ratio", MAX),
    StepSeries("usage_mean", "kvcache_usage_ratio", MEAN),
    StepSeries("demand_max", "kvcache_demand_tokens", MAX),
    StepSeries("capacity_tokens", "kvcache_capacity_tokens", LAST),
    # budget="exact" (measured by vLLM's profile run) wins over "estimated" where both exist
    StepSeries(
        "theoretical_capacity_tokens",
        "kvcache_theoretical_capacity_tokens",
        LAST,
        ranked_by=("budget", ("estimated", "exact")),
    ),
    StepSeries("preemptions", "kvcache_preemptions_total", INCREASE),
    StepSeries("prefix_queries", "kvcache_prefix_cache_queries_tokens_total", INCREASE),
    StepSeries("prefix_hits", "kvcache_prefix_cache_hits_tokens_total", INCREASE),
    # requests waiting because the KV cache is full ("capacity"), or for any reason where vLLM does not say
    StepSeries("waiting_max", "kvcache_requests_waiting", MAX, only=("reason", ("capacity", "all"))),
    StepSeries("running_max", "kvcache_requests_running", MAX),
)


def step_series(field_name: str) -> StepSeries:
    """The :data:`STEP_SERIES` row of a :class:`PodSeries` field."""
    return next(s for s in STEP_SERIES if s.field == field_name)


#: A per-step series: an ``array("d")`` from the sources (8 bytes a step, a week of 64 pods' ten series
#: is 52 MB where lists of floats took 206 MB); any sequence of floats where tests build one by hand.
Steps = MutableSequence[float]


@dataclass(frozen=True)
class Period:
    """``[start, end)`` in Unix seconds, both multiples of ``step_s``."""

    start: float
    end: float
    step_s: float = STEP_S

    def __post_init__(self) -> None:
        if not (self.end > self.start and self.step_s > 0):
            raise ValueError(f"period: need end > start and a positive step, got {self}")
        if self.start % self.step_s or self.end % self.step_s:
            raise ValueError(f"period: start and end must be multiples of the step ({self.step_s:g}s), got {self}")

    @property
    def steps(self) -> int:
        return int((self.end - self.start) // self.step_s)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def time(self, i: int) -> float:
        """Start of step ``i``."""
        return self.start + i * self.step_s

    def index(self, t: float) -> int | None:
        """The step holding ``t``; None outside the period."""
        if not self.start <= t < self.end:
            return None
        return int((t - self.start) // self.step_s)

    def previous(self) -> Period:
        """The period of the same length just before this one (the history of the growth, ``--compare-previous``)."""
        return Period(self.start - self.seconds, self.start, self.step_s)

    @classmethod
    def ending(cls, end: float, seconds: float, step_s: float = STEP_S) -> Period:
        """The period of ``seconds`` whose end is ``end`` rounded down to the step."""
        stop = math.floor(end / step_s) * step_s
        length = math.ceil(seconds / step_s) * step_s
        return cls(stop - length, stop, step_s)


@dataclass(frozen=True, order=True)
class ModelKey:
    """A workload serving a model: the report's first level, one recommendation each.

    The namespace and model, and where the series carry them the ``workload`` label (the owner
    Deployment or StatefulSet, set by the PodMonitor) and the ``cluster`` label (an external label
    behind Thanos, Mimir or federation): two Deployments serving one model in one namespace, or one
    model in two clusters, are two workloads, as on the dashboards' "Advice per workload" tables
    (the recording rules aggregate ``by (cluster, namespace, model_name, workload)``). Without those
    labels a workload is the namespace and model, and prints as before.
    """

    namespace: str  # "" when the series carry no namespace label (embedded history, plain Prometheus)
    model_name: str
    workload: str = ""  # the owner Deployment or StatefulSet ("": no workload label)
    cluster: str = ""  # "": no cluster label

    def __str__(self) -> str:
        name = f"{self.namespace}/{self.model_name}" if self.namespace else self.model_name
        where = [f"workload {self.workload}"] * bool(self.workload) + [f"cluster {self.cluster}"] * bool(self.cluster)
        return f"{name} ({', '.join(where)})" if where else name

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> ModelKey:
        """The workload a series belongs to, from its labels."""
        return cls(
            labels.get("namespace", ""),
            labels.get("model_name", ""),
            labels.get(WORKLOAD_LABEL, ""),
            labels.get(CLUSTER_LABEL, ""),
        )


#: The labels that split a model into workloads (sidecar.artifacts.rules: WORKLOAD_LABEL, KEPT_LABELS).
WORKLOAD_LABEL = "workload"
CLUSTER_LABEL = "cluster"


def steps(period: Period) -> array[float]:
    """An empty per-step series (all NaN)."""
    return array("d", [NAN]) * period.steps


@dataclass
class PodSeries:
    """One engine of one pod over the period: the second level of the report.

    Every series has one value per step of the period (NaN: no sample). ``pod`` is the ``pod`` label
    when the series have one (Kubernetes), else ``instance``, else the sidecar's ``target``.
    """

    model: ModelKey
    pod: str
    engine: str
    #: the labels that identify this pod's series at the source (selectors are built from them)
    labels: dict[str, str]
    usage_max: Steps  # kvcache_usage_ratio: the step's largest sample
    #: kvcache_usage_ratio: the step's mean (may stay NaN where usage_quantiles and the model's are given)
    usage_mean: Steps
    demand_max: Steps  # kvcache_demand_tokens: the step's largest sample
    capacity_tokens: Steps  # kvcache_capacity_tokens: the step's last sample (vLLM's, null block included)
    #: kvcache_theoretical_capacity_tokens, the step's last sample, budget="exact" if present, else "estimated"
    theoretical_capacity_tokens: Steps
    #: increases within the step, counter resets handled (a drop counts the new value)
    preemptions: Steps  # kvcache_preemptions_total
    prefix_queries: Steps  # kvcache_prefix_cache_queries_tokens_total
    prefix_hits: Steps  # kvcache_prefix_cache_hits_tokens_total
    waiting_max: Steps  # kvcache_requests_waiting{reason=~"capacity|all"}: the step's largest sample
    running_max: Steps  # kvcache_requests_running: the step's largest sample (NaN when requests_running_peak is set)
    #: the last values seen in the period (None: never seen)
    gpu_memory_utilization: float | None = None  # kvcache_gpu_memory_utilization
    block_size: int | None = None  # kvcache_server_info{block_size}
    kv_cache_memory_bytes: float | None = None  # kvcache_server_info{kv_cache_memory_bytes}, when set
    bytes_per_token: float | None = None  # kvcache_theoretical_bytes_per_token
    #: kvcache_model_info's labels (architecture, attention, kv_dtype, tp, pp), last seen
    model_info: dict[str, str] = field(default_factory=dict)
    #: the sidecar's own sizing, the largest of the period (None: not exported): what the report sizes
    #: with where it has no model.config for the model (sidecar.report.figures, "exported model")
    suggested_gpu_memory_utilization_max: float | None = None  # kvcache_suggested_gpu_memory_utilization
    fp8_lever_capacity_tokens: float | None = None  # kvcache_lever_capacity_tokens{lever="fp8_kv_cache"}
    #: the GPU memory per rank the sidecar sizes with (kvcache_gpu_memory_bytes, last seen; None: not exported)
    gpu_memory_bytes: float | None = None
    gpu_name: str = ""  # its gpu label: model.gpu_memory's GPU name ("": not given as a name)
    #: Figures a source reduced itself from raw samples; None = compute them from the step series.
    usage_quantiles: dict[str, float] | None = None  # keys "max", "p50", "p95", "p99"
    seconds_above: dict[str, float] | None = None  # keys "warning", "watermark": seconds with usage above each
    seconds_waiting: float | None = None  # seconds with requests waiting for KV
    #: the largest kvcache_requests_running sample, from a source that reduced it (None: the largest of running_max)
    requests_running_peak: float | None = None

    @classmethod
    def empty(cls, period: Period, model: ModelKey, pod: str, engine: str, labels: dict[str, str]) -> PodSeries:
        """A pod with every per-step series (:data:`STEP_SERIES`) all NaN."""
        series: dict[str, Any] = {s.field: steps(period) for s in STEP_SERIES}  # the Steps fields, by name
        return cls(model=model, pod=pod, engine=engine, labels=labels, **series)


@dataclass(frozen=True)
class Page:
    """One firing of a paged alert, at step resolution: ``[start, end)``."""

    alertname: str
    severity: str
    model: ModelKey
    pod: str  # "" when the alert is per model
    start: float
    end: float


@dataclass
class Week:
    """Everything a source read for one period (the name says what it usually is)."""

    period: Period
    pods: list[PodSeries]
    pages: list[Page]
    #: where the data came from, as the report prints it ("Prometheus http://...", "history /var/lib/...")
    source: str
    #: the periods before this one (``--compare-previous``), oldest first, each reduced to its models'
    #: peaks (:func:`model_peaks`); a period without data is absent (a gap), never a period of zeros
    history: list[dict[ModelKey, WeeklyPeak]] = field(default_factory=list)
    #: False when the source cannot know the pages (the embedded history has no ALERTS series)
    pages_known: bool = True
    #: Per-model figures a source reduced itself from the raw samples of the model's hottest pod
    #: (``namespace_model:kvcache_usage_ratio:max``); a model absent here: computed from its pods' steps.
    model_usage_quantiles: dict[ModelKey, dict[str, float]] = field(default_factory=dict)  # as usage_quantiles
    model_seconds_above: dict[ModelKey, dict[str, float]] = field(default_factory=dict)  # as seconds_above
    #: seconds with requests waiting for KV in some pod of the model, from the recorded
    #: ``namespace_model:kvcache_requests_waiting:bool``; a model absent here: from its pods' steps
    model_seconds_waiting: dict[ModelKey, float] = field(default_factory=dict)


def model_peaks(week: Week) -> dict[ModelKey, WeeklyPeak]:
    """Each model's peak demand in ``week`` (:func:`~sidecar.report.growth.weekly_peak`), from its pods' ``demand_max``.

    Per step, the sum of the model's pods that reported then (a pod in a restart gap adds nothing), as
    :mod:`sidecar.report.figures` sums a model's demand for this week's peak; NaN where none did. A
    model with no sample in the period is absent. This is what a source keeps of a period before this
    one, so that reading eight weeks costs about one week's memory.
    """
    by_model: dict[ModelKey, list[PodSeries]] = {}
    for pod in week.pods:
        by_model.setdefault(pod.model, []).append(pod)
    peaks: dict[ModelKey, WeeklyPeak] = {}
    for model in sorted(by_model):
        summed = steps(week.period)
        for pod in by_model[model]:
            for i, v in enumerate(pod.demand_max):
                if not math.isnan(v):
                    summed[i] = v if math.isnan(summed[i]) else summed[i] + v
        peak = weekly_peak(week.period.start, summed)
        if peak is not None:
            peaks[model] = peak
    return peaks
