"""The figures of a report, as :mod:`sidecar.report.figures` computes them and the renderers show them.

Plain frozen dataclasses of numbers and strings: :mod:`sidecar.report.render` turns them into
Markdown, HTML and JSON (``dataclasses.asdict``), so a figure exists once. Units are in the field
names (``_tokens``, ``_s``, ``_ratio`` for 0-1). ``None`` means "not known" (no data, no
``model.config``), never zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .data import ModelKey, Page, Period
from .growth import GrowthTrend


@dataclass(frozen=True)
class Usage:
    """``kvcache_usage_ratio`` over the period."""

    peak_ratio: float | None
    p50_ratio: float | None
    p95_ratio: float | None
    p99_ratio: float | None
    hours_above_warning: float
    hours_above_watermark: float


@dataclass(frozen=True)
class Capacity:
    """Capacity against the period's peak demand."""

    capacity_tokens: float | None  # vLLM's, null block included (last value of the period)
    usable_tokens: float | None  # capacity - one block (what usage is measured against)
    theoretical_tokens: float | None  # from config.json (kvcache_theoretical_capacity_tokens)
    efficiency_ratio: float | None  # capacity / theoretical
    peak_demand_tokens: float | None  # largest kvcache_demand_tokens of the period
    peak_demand_ratio: float | None  # peak demand / usable
    idle_ratio: float | None  # share of the usable capacity never used at the peak: max(0, 1 - peak / usable)


@dataclass(frozen=True)
class Pressure:
    """What running out looked like: preemptions, queueing, prefix-cache reuse."""

    preemptions: float
    worst_hour_start: float | None  # Unix time of the hour with most preemptions (None: no preemption)
    worst_hour_preemptions: float
    hours_waiting: float  # time with requests waiting for KV
    prefix_hit_ratio: float | None  # hits / queries over the period (None: prefix caching off)


@dataclass(frozen=True)
class Advice:
    """The recommendation sized on the period's peak at ``thresholds.target_usage``.

    Computed with :func:`sidecar.forecast.policy.advise`, the function the daemon's gauges come from.
    """

    action: str  # sidecar.forecast.recommendation.ACTIONS
    reason: str  # sidecar.forecast.recommendation.REASONS
    sentence: str  # what to do and its effect, in one sentence
    suggested_gpu_memory_utilization: float | None = None
    suggested_kv_cache_memory_bytes: int | None = None
    capacity_shortfall_tokens: int | None = None
    suggested_replicas: int | None = None
    #: lever -> capacity in tokens it would give (fp8_kv_cache, half_kv_heads, max_model_len)
    levers: dict[str, float] = field(default_factory=dict)
    #: usage the period's peak would sit at after the change (None: no change computed)
    peak_usage_after_ratio: float | None = None
    #: A model's advice is its workload's (sidecar.forecast.policy.advise_workload); a pod's leaves these empty.
    #: the memory flag vLLM runs with now, and the exact flags to set ("--gpu-memory-utilization 0.924")
    current_flags: list[str] = field(default_factory=list)
    set_flags: list[str] = field(default_factory=list)
    replicas_now: int | None = None
    #: replicas the peak needs at target_usage at today's setting (suggested_replicas: with the advice applied)
    replicas_needed_now: int | None = None
    #: GPUs one replica takes (tp × pp from kvcache_model_info; None: not exported)
    gpus_per_replica: int | None = None
    #: one replica's capacity (vLLM's figure, tokens) now and with the advice applied
    capacity_now_tokens: float | None = None
    capacity_after_tokens: float | None = None
    #: requests of max_model_len one replica holds now and after (None: max_model_len unknown)
    concurrency_now: int | None = None
    concurrency_after: int | None = None
    #: the workload's peak ÷ replicas: what each replica holds behind a balanced router
    even_share_tokens: float | None = None
    #: a finding of its own: "load is uneven across replicas: ..." ("" when it is not)
    uneven: str = ""
    #: the GPU's name (model.gpu_memory given as one, in the report's configuration or the sidecars'
    #: kvcache_gpu_memory_bytes{gpu}); "" when not known
    gpu: str = ""


@dataclass(frozen=True)
class Timeline:
    """Per-step series for the plots (one value per step of the period, NaN or None = no data).

    :mod:`sidecar.report.figures` gives ``array("d")`` series with NaN (8 bytes a step); JSON shows null.
    """

    step_s: float
    start: float
    usage_max_ratio: Sequence[float | None]
    demand_tokens: Sequence[float | None]
    usable_tokens: Sequence[float | None]
    #: preemptions per hour (one value per hour of the period)
    preemptions_per_hour: list[float]
    #: hour-of-week profile: 7 rows (Monday first) of 24 peak usages (None: no data that hour)
    hour_of_week_peak_ratio: list[list[float | None]]


@dataclass(frozen=True)
class PodReport:
    pod: str
    engine: str
    usage: Usage
    capacity: Capacity
    pressure: Pressure
    advice: Advice
    pages: int  # firings of the paged alerts for this pod (alerts per model count for the model only)
    timeline: Timeline


@dataclass(frozen=True)
class ModelReport:
    model: ModelKey
    #: the model's figures: usage of its hottest pod at each step, capacities and demand summed
    usage: Usage
    capacity: Capacity
    pressure: Pressure
    growth: GrowthTrend  # the weekly peaks' fitted trend (sidecar.report.growth)
    advice: Advice
    pages: list[Page]
    pods: list[PodReport]
    timeline: Timeline
    needs_action: bool
    #: one sentence for the summary at the top of the report
    summary: str


@dataclass(frozen=True)
class Report:
    period: Period
    source: str
    generated_at: float  # the only field that differs between two runs over the same period
    watermark: float
    warning: float
    target_usage: float
    #: models ranked: those that need action first, the most urgent first
    models: list[ModelReport]
    #: the summary at the top: one sentence per model that needs action, in rank order
    summary: list[str]
    #: False when the source cannot know the pages (the embedded history has no ALERTS series)
    pages_known: bool = True
