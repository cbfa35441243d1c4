"""A period's series -> the report's figures, with the daemon's own sizing and advice functions.

What: :func:`compute` turns a :class:`~sidecar.report.data.Week` into a
:class:`~sidecar.report.results.Report`: per pod and per model the usage, capacity, pressure,
advice and timeline, per model the growth over the weeks the source read (:mod:`sidecar.report.growth`),
whether it needs action and a one-line summary. Pure: no I/O, no clock (``generated_at`` is given), no
set iteration (pods are sorted by name, models by rank), and no rounding (the renderers format).

Why here: both sources fill the same :class:`~sidecar.report.data.Week`, so a figure is defined
once, whatever the history came from.

Conventions and where they come from:

- **Percentiles** are Prometheus' φ-quantile (``quantile_over_time``, Prometheus docs "Functions";
  ``quantile`` in ``promql/quantile.go``): the values sorted, rank ``φ × (n − 1)``, linear
  interpolation between the two values around it (:func:`quantile`). A source that reduced them
  from raw samples (``PodSeries.usage_quantiles``) wins; otherwise they are taken over the steps'
  *means*, so within one step of what raw samples give. The peak is the largest step *maximum*.
- **Hours above** a threshold: ``PodSeries.seconds_above`` when the source counted raw samples
  (``count_over_time(usage > thr)`` × the scrape interval); otherwise a step counts in full when
  its *mean* exceeds the threshold (strictly, as ``> bool`` in the recording rules). For a series
  that crosses the threshold once within a step, the mean is above it about when more than half
  the step's samples are, so the error is at most a fraction of a step per crossing and has no
  sign; counting steps whose *maximum* is above would over-count every crossing by up to a step.
- **A model** is all pods of one :class:`~sidecar.report.data.ModelKey`. Its usage at each step is
  that of its hottest pod (max over pods, as the recording rule
  ``namespace_model:kvcache_usage_ratio:max``), unless the source gave ``Week.model_usage_quantiles``
  / ``Week.model_seconds_above``; its demand, capacity and counters at each step are sums over the
  pods that reported then (a pod in a restart gap adds nothing); waiting is "any pod waiting".
- **Capacity** is vLLM's figure, null block included; usable = capacity − block size, since
  ``BlockPool`` keeps block 0 as the null block (:mod:`sidecar.forecast.sizing`). The period's
  capacity is the last value; a pod's capacity is carried over its restart gaps (between its first
  and last sample), so that a restart does not make the model's sum dip, and not past its last
  sample (a pod replaced by a rollout stops counting).
- **Clock hours** (preemptions per hour, the worst hour) are UTC hours, the first one the hour that
  holds the period's start; the hour-of-week profile is UTC, Monday first.
- **Advice** is :func:`sidecar.forecast.policy.advise` over the period's peak demand, the pool's
  last settings and ``model.config`` when it describes the model (``served``): the function the
  daemon's gauges come from. Its effect (``peak_usage_after_ratio``) is the peak over the usable
  capacity the suggested setting gives (:func:`sidecar.forecast.sizing.capacity_at_utilization`,
  or whole blocks of the suggested KV bytes as vLLM's ``get_num_blocks`` floors them).
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..capacity.budget import NonKVBytes
from ..capacity.dtypes import DTYPE_BYTES, canonical_dtype
from ..capacity.errors import CapacityError
from ..forecast import policy
from ..forecast.policy import (
    AdviceSettings,
    Pool,
    Replica,
    ServedModel,
    WorkloadAdvice,
    advise,
    advise_workload,
    capacity_after,
    utilization_text,
)
from ..forecast.sizing import gpu_memory_from_largest_pool, gpu_memory_from_suggestion
from ..thresholds import Thresholds
from .data import ModelKey, Page, Period, PodSeries, Week
from .growth import (
    AT_CAPACITY,
    GROWING,
    NO_FIT,
    NO_PREVIOUS_DATA,
    NOT_ENOUGH_HISTORY,
    GrowthTrend,
    WeeklyPeak,
    growth_trend,
    weekly_peak,
)
from .results import Advice, Capacity, ModelReport, PodReport, Pressure, Report, Timeline, Usage

HOUR_S = 3600.0
DAY_S = 86_400.0
WEEK_S = 604_800.0
#: The percentiles of usage, by the key sources use in ``usage_quantiles``.
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
#: A model needs action when its peak meets its capacity within this many weeks at the growth seen.
NEEDS_ACTION_WEEKS_UNTIL_FULL = 4.0
#: ... or when it spent more than this many hours above the watermark (the paging threshold) ...
NEEDS_ACTION_HOURS_ABOVE_WATERMARK = 0.0
#: ... or preempted more than this many requests (vLLM evicted running requests to make room) ...
NEEDS_ACTION_PREEMPTIONS = 0.0
#: ... or when its advice is any action but this one.
NO_ACTION = "none"

#: Unix time 0 was a Thursday: weekday (Monday = 0) of day d since the epoch is (d + 3) mod 7.
_EPOCH_WEEKDAY = 3


def quantile(phi: float, values: Sequence[float]) -> float | None:
    """Prometheus' φ-quantile of ``values``: rank ``φ × (n − 1)``, linear between its neighbours.

    The definition of ``quantile_over_time`` and the ``quantile`` aggregation (Prometheus docs,
    "Functions"; ``quantile`` in ``promql/quantile.go``), so that a percentile computed here from
    steps matches one Prometheus computes from the same values. None for no values.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = phi * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


# --- step series --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Steps:
    """One pod's or one model's per-step series, NaN where nothing was reported.

    A pod's are its :class:`~sidecar.report.data.PodSeries` series themselves (never changed here),
    the rest ``array("d")``: a week of 64 pods as lists of floats took 200 MB more.
    """

    usage_max: Sequence[float]
    usage_mean: Sequence[float]
    demand: Sequence[float]
    capacity: Sequence[float]  # carried over restart gaps
    usable: Sequence[float]  # capacity - block size; NaN where the block size is unknown
    theoretical: Sequence[float]  # carried over restart gaps
    preemptions: Sequence[float]
    prefix_queries: Sequence[float]
    prefix_hits: Sequence[float]
    waiting: Sequence[float]


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _carry(values: Sequence[float]) -> array[float]:
    """The series with each gap between its first and last value filled with the value before it."""
    out = array("d", values)
    last = math.nan
    seen = [i for i, v in enumerate(values) if math.isfinite(v)]
    if not seen:
        return out
    for i in range(seen[0], seen[-1] + 1):
        if math.isfinite(out[i]):
            last = out[i]
        else:
            out[i] = last
    return out


def _pod_steps(pod: PodSeries) -> _Steps:
    capacity = _carry(pod.capacity_tokens)
    bs = pod.block_size
    return _Steps(
        usage_max=pod.usage_max,
        usage_mean=pod.usage_mean,
        demand=pod.demand_max,
        capacity=capacity,
        usable=array("d", (c - bs for c in capacity)) if bs else array("d", [math.nan]) * len(capacity),
        theoretical=_carry(pod.theoretical_capacity_tokens),
        preemptions=pod.preemptions,
        prefix_queries=pod.prefix_queries,
        prefix_hits=pod.prefix_hits,
        waiting=pod.waiting_max,
    )


def _combine(columns: Iterable[Sequence[float]], how: str) -> array[float]:
    """Per step, the max or sum of the finite values of the columns; NaN where none is finite."""
    out = array("d")
    for row in zip(*columns, strict=True):
        values = _finite(row)
        if not values:
            out.append(math.nan)
        else:
            out.append(max(values) if how == "max" else math.fsum(values))
    return out


def _sum_where_capacity(pods: Sequence[_Steps], attr: str, n: int) -> array[float]:
    """Per step, the sum over the pods with a capacity then of ``attr`` (NaN if one of them lacks it)."""
    out = array("d")
    columns = [(p.capacity, getattr(p, attr)) for p in pods]
    for i in range(n):
        present = [values[i] for capacity, values in columns if math.isfinite(capacity[i])]
        out.append(math.fsum(present) if present else math.nan)
    return out


def _model_steps(pods: Sequence[_Steps], n: int) -> _Steps:
    """The model's steps: the hottest pod's usage, sums of demand, capacity and counters, any pod waiting."""
    return _Steps(
        usage_max=_combine((p.usage_max for p in pods), "max"),
        usage_mean=_combine((p.usage_mean for p in pods), "max"),
        demand=_combine((p.demand for p in pods), "sum"),
        capacity=_combine((p.capacity for p in pods), "sum"),
        usable=_sum_where_capacity(pods, "usable", n),
        theoretical=_sum_where_capacity(pods, "theoretical", n),
        preemptions=_combine((p.preemptions for p in pods), "sum"),
        prefix_queries=_combine((p.prefix_queries for p in pods), "sum"),
        prefix_hits=_combine((p.prefix_hits for p in pods), "sum"),
        waiting=_combine((p.waiting for p in pods), "max"),
    )


# --- the figures --------------------------------------------------------------------------------


def _usage(
    s: _Steps,
    period: Period,
    thresholds: Thresholds,
    reduced: Mapping[str, float] | None,
    seconds_above: Mapping[str, float] | None,
) -> Usage:
    """Peak and percentiles (the source's when given, else the steps'), hours above each threshold."""
    means = _finite(s.usage_mean) or _finite(s.usage_max)  # a source without means: the maxima
    maxima = _finite(s.usage_max)
    if reduced is not None:
        figures: dict[str, float | None] = {k: reduced.get(k) for k in ("max", "p50", "p95", "p99")}
    else:
        figures = {"max": max(maxima) if maxima else None}
        figures.update({key: quantile(phi, means) for key, phi in QUANTILES})
    if seconds_above is not None:
        warning_h = seconds_above.get("warning", 0.0) / HOUR_S
        watermark_h = seconds_above.get("watermark", 0.0) / HOUR_S
    else:
        hours_per_step = period.step_s / HOUR_S
        warning_h = sum(1 for v in means if v > thresholds.warning) * hours_per_step
        watermark_h = sum(1 for v in means if v > thresholds.watermark) * hours_per_step
    return Usage(
        peak_ratio=figures["max"],
        p50_ratio=figures["p50"],
        p95_ratio=figures["p95"],
        p99_ratio=figures["p99"],
        hours_above_warning=warning_h,
        hours_above_watermark=watermark_h,
    )


def _last(values: Sequence[float]) -> tuple[int | None, float | None]:
    for i in range(len(values) - 1, -1, -1):
        if math.isfinite(values[i]):
            return i, values[i]
    return None, None


def _value(values: Sequence[float], i: int | None) -> float | None:
    if i is None or not math.isfinite(values[i]):
        return None
    return values[i]


def _capacity(s: _Steps) -> Capacity:
    """The last capacity of the period (usable and theoretical at the same step) against the peak demand."""
    i, capacity = _last(s.capacity)
    usable, theoretical = _value(s.usable, i), _value(s.theoretical, i)
    demands = _finite(s.demand)
    peak = max(demands) if demands else None
    ratio = peak / usable if peak is not None and usable else None
    return Capacity(
        capacity_tokens=capacity,
        usable_tokens=usable,
        theoretical_tokens=theoretical,
        efficiency_ratio=capacity / theoretical if capacity is not None and theoretical else None,
        peak_demand_tokens=peak,
        peak_demand_ratio=ratio,
        idle_ratio=max(0.0, 1.0 - ratio) if ratio is not None else None,
    )


def _first_hour(period: Period) -> float:
    return math.floor(period.start / HOUR_S) * HOUR_S


def _hour_steps(period: Period) -> list[range]:
    """The steps in each UTC clock hour of the period, the first the hour holding the period's start."""
    first = _first_hour(period)
    hours = math.ceil((period.end - first) / HOUR_S)
    if HOUR_S % period.step_s == 0:  # whole steps to the hour: the hour of step i is (offset + i) // per_hour
        per_hour, offset = int(HOUR_S // period.step_s), int((period.start - first) // period.step_s)
        return [
            range(max(0, h * per_hour - offset), min(period.steps, (h + 1) * per_hour - offset)) for h in range(hours)
        ]
    out: list[list[int]] = [[] for _ in range(hours)]
    for i in range(period.steps):
        out[int((period.time(i) - first) // HOUR_S)].append(i)
    return [range(o[0], o[-1] + 1) if o else range(0) for o in out]


def _per_hour(values: Sequence[float], period: Period) -> list[float]:
    """Sums per UTC clock hour, the first the hour holding the period's start (NaN steps add nothing)."""
    return [sum((v for v in values[h.start : h.stop] if math.isfinite(v)), 0.0) for h in _hour_steps(period)]


def _pressure(s: _Steps, period: Period, seconds_waiting: float | None) -> Pressure:
    """Preemptions (total, worst clock hour), time waiting for KV, prefix hits over queries."""
    per_hour = _per_hour(s.preemptions, period)
    total = math.fsum(per_hour)
    worst_start: float | None = None
    worst = 0.0
    if total > 0:
        at = max(range(len(per_hour)), key=lambda h: (per_hour[h], -h))  # the earliest of equal hours
        worst_start, worst = _first_hour(period) + at * HOUR_S, per_hour[at]
    if seconds_waiting is not None:
        waiting_h = seconds_waiting / HOUR_S
    else:
        waiting_h = sum(1 for v in s.waiting if math.isfinite(v) and v > 0) * period.step_s / HOUR_S
    both = [(h, q) for h, q in zip(s.prefix_hits, s.prefix_queries, strict=True) if math.isfinite(h + q)]
    hits, queries = math.fsum(h for h, _ in both), math.fsum(q for _, q in both)
    return Pressure(
        preemptions=total,
        worst_hour_start=worst_start,
        worst_hour_preemptions=worst,
        hours_waiting=waiting_h,
        prefix_hit_ratio=hits / queries if queries > 0 else None,
    )


def hour_of_week(t: float) -> tuple[int, int]:
    """(weekday with Monday = 0, hour) of Unix time ``t`` in UTC."""
    day = math.floor(t / DAY_S)
    return (day + _EPOCH_WEEKDAY) % 7, int((t - day * DAY_S) // HOUR_S)


def _timeline(s: _Steps, period: Period) -> Timeline:
    profile: list[list[float | None]] = [[None] * 24 for _ in range(7)]
    first = _first_hour(period)
    for h, steps in enumerate(_hour_steps(period)):
        values = _finite(s.usage_max[steps.start : steps.stop])
        if values:
            day, hour = hour_of_week(first + h * HOUR_S)
            cell = profile[day][hour]
            profile[day][hour] = max(values) if cell is None else max(cell, *values)
    return Timeline(
        step_s=period.step_s,
        start=period.start,
        usage_max_ratio=s.usage_max,
        demand_tokens=s.demand,
        usable_tokens=s.usable,
        preemptions_per_hour=_per_hour(s.preemptions, period),
        hour_of_week_peak_ratio=profile,
    )


# --- advice -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Advised:
    """A pod's advice, with what it took to size it (the model's advice reuses them)."""

    advice: Advice
    peak: float | None
    #: capacity (vLLM's figure) the suggested setting gives; None: no setting suggested
    new_capacity: float | None
    block_size: int | None


def _tokens(v: float) -> str:
    return f"{v:,.0f}"


def _percent(r: float) -> str:
    """As the renderers show a ratio (``pct``): one decimal, so a sentence and a table never disagree."""
    return f"{r * 100:.1f}%"


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def _setting_text(raw: policy.Advice, pool: Pool) -> str:
    """The suggested memory setting as a flag (empty when none is suggested)."""
    if raw.suggested_kv_cache_memory_bytes is not None:
        return f"--kv-cache-memory-bytes {raw.suggested_kv_cache_memory_bytes}"
    if raw.suggested_gpu_memory_utilization is not None:
        flag = policy.lever_flag(pool) or "--gpu-memory-utilization"
        return f"{flag} {utilization_text(raw.suggested_gpu_memory_utilization[1])}"
    return ""


def _change_sentence(raw: policy.Advice, pool: Pool, peak: float, new_usable: float) -> str:
    """A raise/lower of the memory setting, from what to what, and where the peak would sit."""
    verb = "Raise" if raw.recommendation.action.startswith("raise_") else "Lower"
    effect = (
        f"the week's peak of {_tokens(peak)} tokens would sit at {_percent(peak / new_usable)} of {_tokens(new_usable)}"
    )
    kv = raw.suggested_kv_cache_memory_bytes
    if kv is not None:
        now = pool.kv_cache_memory_bytes
        start = f" from {int(now)} ({_gib(now)})" if now else ""
        return f"{verb} --kv-cache-memory-bytes{start} to {kv} ({_gib(kv)}): {effect}."
    assert raw.suggested_gpu_memory_utilization is not None
    u = utilization_text(raw.suggested_gpu_memory_utilization[1])
    u0 = pool.gpu_memory_utilization
    start = f" from {u0:.2f}" if u0 else ""
    return f"{verb} {policy.lever_flag(pool) or '--gpu-memory-utilization'}{start} to {u}: {effect}."


def _sentence(
    raw: policy.Advice, pool: Pool, peak: float, usable: float, new_capacity: float | None, target: float
) -> str:
    """What to do, in one sentence, with its computed effect."""
    action, reason = raw.recommendation.action, raw.recommendation.reason
    sat = f"the week's peak of {_tokens(peak)} tokens sat at {_percent(peak / usable)} of {_tokens(usable)} usable"
    new_usable = new_capacity - pool.block_size if new_capacity is not None else None
    if action == NO_ACTION:
        if reason == "within_target":
            return f"Nothing to change: {sat}, near the {_percent(target)} target."
        return f"No advice yet: {sat}, but the pod was watched for less than forecast.peak_window."
    if action in ("add_replicas", "enable_fp8_kv_cache"):
        return _shortfall_sentence(raw, pool, peak, sat, new_capacity)
    if action.startswith(("raise_", "lower_")) and action != "lower_max_model_len" and new_usable:
        return _change_sentence(raw, pool, peak, new_usable)
    flag = "--" + action.split("_", 1)[1].replace("_", "-")
    verb = action.split("_", 1)[0].capitalize()
    why = "above" if action.startswith("raise_") else "below"
    hint = " (give model.config to size the new value)" if action != "lower_max_model_len" else ""
    return f"{verb} {flag}{hint}: {sat}, {why} the {_percent(target)} target."


def _shortfall_sentence(raw: policy.Advice, pool: Pool, peak: float, sat: str, new_capacity: float | None) -> str:
    """fp8 KV cache or more replicas: the GPU cannot hold the peak at target even at the upper bound."""
    setting = _setting_text(raw, pool)
    at = f" at {setting}" if setting else ""
    short = raw.capacity_shortfall_tokens
    lacks = f"; one replica lacks {_tokens(short)} tokens at target even at the upper bound" if short else ""
    bs = pool.block_size
    if raw.recommendation.action == "enable_fp8_kv_cache":
        fp8 = raw.lever_capacity_tokens.get("fp8_kv_cache")
        if fp8 and fp8 > bs:
            effect = f"the week's peak of {_tokens(peak)} tokens would sit at {_percent(peak / (fp8 - bs))}"
            return f"Enable an fp8 KV cache (--kv-cache-dtype fp8){at}: {effect} of {_tokens(fp8 - bs)}{lacks}."
        return f"Enable an fp8 KV cache (--kv-cache-dtype fp8){at}: {sat}{lacks}."
    n = raw.suggested_replicas
    if n and new_capacity and new_capacity > bs:
        each = new_capacity - bs
        effect = f"the week's peak of {_tokens(peak)} tokens would sit at {_percent(peak / (n * each))}"
        return f"Run {n} replicas{at}: {effect} of each replica's {_tokens(each)}{lacks}."
    return f"Add replicas{at}: {sat}{lacks}."


def _no_advice(s: PodSeries | None, capacity: Capacity | None) -> Advice:
    if s is None or capacity is None:
        why = "no pod reported"
    elif capacity.capacity_tokens is None or not (s.block_size and capacity.usable_tokens):
        why = "vLLM's capacity or block size is unknown (a hybrid model, or no kvcache_server_info)"
    else:
        why = "no demand was recorded"
    return Advice(action="none", reason="insufficient_data", sentence=f"No advice: {why}.")


def _watched_s(pod: PodSeries, period: Period) -> float:
    """How long the pod was seen: from its first to its last step with a usage or capacity sample."""
    pairs = zip(pod.usage_max, pod.capacity_tokens, strict=True)
    seen = [i for i, (u, c) in enumerate(pairs) if math.isfinite(u) or math.isfinite(c)]
    return (seen[-1] - seen[0] + 1) * period.step_s if seen else 0.0


def _pod_pool(pod: PodSeries, capacity_tokens: float, block_size: int, model: ServedModel | None) -> Pool:
    """The pod's last KV pool, as the advice policy reads it (its peak of running requests included);
    the utilization flag spelt as the configured vLLM version spells it (``model.vllm_version``)."""
    running = [pod.requests_running_peak] if pod.requests_running_peak is not None else _finite(pod.running_max)
    return Pool(
        capacity_tokens=capacity_tokens,
        block_size=block_size,
        kv_cache_memory_bytes=pod.kv_cache_memory_bytes,
        gpu_memory_utilization=pod.gpu_memory_utilization,
        max_model_len=None,
        requests_running=max(running) if running else None,
        flag=model.utilization_flag if model is not None else None,
    )


def _pod_advice(
    pod: PodSeries, capacity: Capacity, period: Period, model: ServedModel | None, settings: AdviceSettings
) -> _Advised:
    """:func:`~sidecar.forecast.policy.advise` on the pod's peak and last pool; the warm-up gate is the time seen."""
    peak, c0, bs, usable = capacity.peak_demand_tokens, capacity.capacity_tokens, pod.block_size, capacity.usable_tokens
    if peak is None or c0 is None or not bs or not usable or usable <= 0:
        return _Advised(_no_advice(pod, capacity), peak, None, bs)
    pool = _pod_pool(pod, c0, bs, model)
    raw = advise(peak_demand_tokens=peak, watched_s=_watched_s(pod, period), pool=pool, model=model, settings=settings)
    new_capacity = capacity_after(raw, pool, model) if raw.recommendation.action != NO_ACTION else None
    after = _after_ratio(raw, peak, new_capacity, bs)
    advice = Advice(
        action=raw.recommendation.action,
        reason=raw.recommendation.reason,
        sentence=_sentence(raw, pool, peak, usable, new_capacity, settings.target_usage),
        suggested_gpu_memory_utilization=(
            raw.suggested_gpu_memory_utilization[1] if raw.suggested_gpu_memory_utilization else None
        ),
        suggested_kv_cache_memory_bytes=raw.suggested_kv_cache_memory_bytes,
        capacity_shortfall_tokens=raw.capacity_shortfall_tokens,
        suggested_replicas=raw.suggested_replicas,
        levers=dict(raw.lever_capacity_tokens),
        peak_usage_after_ratio=after,
    )
    return _Advised(advice, peak, new_capacity, bs)


def _after_ratio(raw: policy.Advice, peak: float, new_capacity: float | None, bs: int) -> float | None:
    """Where the peak would sit after the change: over the new usable tokens (per replica, for replicas)."""
    action = raw.recommendation.action
    if action == NO_ACTION:
        return None
    if action == "enable_fp8_kv_cache":
        new_capacity = raw.lever_capacity_tokens.get("fp8_kv_cache")
    if new_capacity is None or new_capacity <= bs:
        return None
    replicas = raw.suggested_replicas if action == "add_replicas" and raw.suggested_replicas else 1
    return peak / (replicas * (new_capacity - bs))


def _gpus_per_replica(pods: Sequence[PodSeries]) -> int | None:
    """tp × pp from ``kvcache_model_info`` (the sidecar's model section); None when no pod exported it."""
    for p in pods:
        try:
            return int(p.model_info["tp"]) * int(p.model_info.get("pp", "1"))
        except (KeyError, ValueError):
            continue
    return None


def _replica(pod: PodSeries, capacity: Capacity, model: ServedModel | None) -> Replica | None:
    peak, c0, bs = capacity.peak_demand_tokens, capacity.capacity_tokens, pod.block_size
    if peak is None or c0 is None or not bs or c0 <= bs:
        return None
    pool = _pod_pool(pod, c0, bs, model)
    return Replica(pod.pod, peak, pool)


def _flag_value(flag: str) -> tuple[str, str]:
    """``--name value`` -> (name, value as shown: bytes with their GiB beside)."""
    name, _, value = flag.partition(" ")
    if name == "--kv-cache-memory-bytes" and value.isdigit():
        value = f"{value} ({_gib(float(value))})"
    return name, value


def _flag_change(now: Sequence[str], to: Sequence[str]) -> str:
    """krr-style ``--gpu-memory-utilization 0.90 → 0.95, --kv-cache-dtype fp8``: a flag set now shows both values."""
    current = dict(_flag_value(f) for f in now)
    parts = []
    for flag in to:
        name, value = _flag_value(flag)
        parts.append(f"{name} {current[name]} → {value}" if name in current else f"{name} {value}")
    return ", ".join(parts)


def _replicas_text(n: int, need: int, gpus: int | None, gpu: str = "") -> str:
    """``H100-80GB × 2 → 3 replicas (4 → 6 GPUs)``: the GPU's name when known (``model.gpu_memory``)."""
    text = f"{n} → {need} replicas" if need != n else f"{n} replica{'s' if n != 1 else ''}"
    if gpu:
        text = f"{gpu} × {text}"
    if gpus:
        text += f" ({n * gpus} → {need * gpus} GPUs)" if need != n else f" ({n * gpus} GPUs)"
    return text


def _workload_sentence(w: WorkloadAdvice, target: float, gpus: int | None, gpu: str = "") -> str:
    """krr-style: current → recommended, replicas and GPUs, and what it changes, in one sentence."""
    a = w.advice
    action = a.recommendation.action
    usable_now, usable_after = w.capacity_now_tokens - w.block_size, w.capacity_after_tokens - w.block_size
    n = w.replicas_now
    peak = f"the period's peak of {_tokens(w.peak_demand_tokens)} tokens"
    pods = f"{n} replica{'s' if n != 1 else ''}"
    if action == NO_ACTION:
        if a.recommendation.reason == "within_target":
            return (
                f"Nothing to change: {peak} over {pods} put {_percent(w.even_share_tokens / usable_now)} of each "
                f"replica's {_tokens(usable_now)} usable tokens in use, near the {_percent(target)} target."
            )
        return f"No advice yet: {peak} over {pods}, but the pods were watched for less than forecast.peak_window."
    if not w.set_flags:
        # a direction without a value: neither model.config nor the sidecars' exports size it
        flag = "--" + action.split("_", 1)[1].replace("_", "-")
        verb = action.split("_", 1)[0].capitalize()
        now = f" from {', '.join(_flag_value(f)[1] for f in w.current_flags)}" if w.current_flags else ""
        replicas = _replicas_text(n, w.replicas_needed_now, gpus, gpu)
        after = w.peak_demand_tokens / (w.replicas_needed_now * usable_now)
        return (
            f"{verb} {flag}{now} (no value: no sidecar exported the model's bytes per token and sizing, and the "
            f"report's model.config does not describe it), or run {replicas} at today's setting: {peak} would sit "
            f"at {_percent(after)} (target {_percent(target)})."
        )
    tokens = f"{_tokens(usable_now)} → {_tokens(usable_after)} usable tokens per replica"
    if w.concurrency_now is not None and w.concurrency_after is not None:
        tokens += f", {w.concurrency_now} → {w.concurrency_after} max-length requests"
    return (
        f"Set {_flag_change(w.current_flags, w.set_flags)} on {_replicas_text(n, w.replicas_needed, gpus, gpu)}: "
        f"{tokens}; {peak} would sit at {_percent(w.peak_usage_after_ratio)} (target {_percent(target)})."
    )


def _uneven(w: WorkloadAdvice, reports: Mapping[str, PodReport]) -> str:
    """The finding "load is uneven across replicas" with the hottest replica's figures ("" when even)."""
    if not w.hot_replicas:
        return ""
    name = w.hot_replicas[0]
    hot = reports[name].capacity.peak_demand_ratio
    share = w.even_share_tokens / (w.capacity_now_tokens - w.block_size)
    others = f" and {len(w.hot_replicas) - 1} more" if len(w.hot_replicas) > 1 else ""
    return (
        f"Load is uneven across replicas: {name}{others} peaked at {_percent(hot or 0)} of its usable tokens "
        f"while the even share of the workload's peak is {_percent(share)}; check the router's balancing "
        "(session affinity, prefix-aware routing) before resizing."
    )


def _model_advice(
    rows: Sequence[tuple[PodSeries, PodReport]],
    model_peak: float | None,
    served: ServedModel | None,
    settings: AdviceSettings,
    period: Period,
) -> Advice:
    """The workload's one recommendation (:func:`~sidecar.forecast.policy.advise_workload`) over its pods.

    The model's peak demand (the largest sum over its pods at one step) spread evenly over the pods
    that reported a pool; a pod whose own peak is far above that share is a finding of its own.
    """
    replicas = [r for r in (_replica(pod, report.capacity, served) for pod, report in rows) if r is not None]
    if not replicas or model_peak is None:
        return _no_advice(rows[0][0] if rows else None, rows[0][1].capacity if rows else None)
    watched = max(_watched_s(pod, period) for pod, _ in rows)
    w = advise_workload(
        replicas=replicas, peak_demand_tokens=model_peak, watched_s=watched, model=served, settings=settings
    )
    if w is None:
        return _no_advice(None, None)
    raw = w.advice
    gpus = _gpus_per_replica([pod for pod, _ in rows])
    gpu = _gpu_name(served, [pod for pod, _ in rows])
    return Advice(
        action=raw.recommendation.action,
        reason=raw.recommendation.reason,
        sentence=_workload_sentence(w, settings.target_usage, gpus, gpu),
        suggested_gpu_memory_utilization=(
            raw.suggested_gpu_memory_utilization[1] if raw.suggested_gpu_memory_utilization else None
        ),
        suggested_kv_cache_memory_bytes=raw.suggested_kv_cache_memory_bytes,
        capacity_shortfall_tokens=raw.capacity_shortfall_tokens,
        suggested_replicas=w.replicas_needed,
        levers=dict(raw.lever_capacity_tokens),
        peak_usage_after_ratio=w.peak_usage_after_ratio if raw.recommendation.action != NO_ACTION else None,
        current_flags=list(w.current_flags),
        set_flags=list(w.set_flags),
        replicas_now=w.replicas_now,
        replicas_needed_now=w.replicas_needed_now,
        gpus_per_replica=gpus,
        capacity_now_tokens=w.capacity_now_tokens,
        capacity_after_tokens=w.capacity_after_tokens,
        concurrency_now=w.concurrency_now,
        concurrency_after=w.concurrency_after,
        even_share_tokens=w.even_share_tokens,
        uneven=_uneven(w, {report.pod: report for _, report in rows}),
        gpu=gpu,
    )


def _gpu_name(served: ServedModel | None, pods: Sequence[PodSeries]) -> str:
    """The GPU's name: the report's ``model.gpu_memory`` when a GPU name, else the sidecars' (the ``gpu``
    label of ``kvcache_gpu_memory_bytes``, the first pod's that has one); "" when none is known."""
    if served is not None and served.gpu_name:
        return served.gpu_name
    return next((p.gpu_name for p in pods if p.gpu_name), "")


# --- the report ---------------------------------------------------------------------------------


def _pod_report(
    pod: PodSeries, week: Week, thresholds: Thresholds, served: ServedModel | None, settings: AdviceSettings
) -> tuple[PodReport, _Advised, _Steps]:
    period = week.period
    s = _pod_steps(pod)
    capacity = _capacity(s)
    advised = _pod_advice(pod, capacity, period, served, settings)
    report = PodReport(
        pod=pod.pod,
        engine=pod.engine,
        usage=_usage(s, period, thresholds, pod.usage_quantiles, pod.seconds_above),
        capacity=capacity,
        pressure=_pressure(s, period, pod.seconds_waiting),
        advice=advised.advice,
        pages=sum(1 for p in week.pages if p.model == pod.model and p.pod == pod.pod),
        timeline=_timeline(s, period),
    )
    return report, advised, s


def _by_model(pods: Iterable[PodSeries]) -> dict[ModelKey, list[PodSeries]]:
    out: dict[ModelKey, list[PodSeries]] = {}
    for pod in sorted(pods, key=lambda p: (p.model, p.pod, p.engine)):
        out.setdefault(pod.model, []).append(pod)
    return out


def _no_demand(usable_tokens: float | None, had_history: bool) -> GrowthTrend:
    """The growth of a model with no demand sample this period: nothing to fit; "no previous data" without
    earlier weeks either, else "not enough history" (this week is missing)."""
    return GrowthTrend(
        previous_peak_demand_tokens=None,
        change_ratio=None,
        weeks_until_full=None,
        verdict=NOT_ENOUGH_HISTORY if had_history else NO_PREVIOUS_DATA,
        method=NO_FIT,
        weeks_fitted=0,
        weeks_skipped=0,
        usable_tokens=usable_tokens,
    )


def _history_peaks(week: Week) -> dict[ModelKey, list[WeeklyPeak]]:
    """Each model's weekly peaks in the periods before this one (``Week.history``), oldest first.

    The sources reduced each period to its models' peaks as they read it
    (:func:`sidecar.report.data.model_peaks`: the same per-step sum of the pods' demand as this
    period's :func:`_model_steps`); a period where the model had no sample is absent (a gap).
    """
    peaks: dict[ModelKey, list[WeeklyPeak]] = {}
    for period_peaks in week.history:
        for model, peak in period_peaks.items():
            peaks.setdefault(model, []).append(peak)
    return peaks


def needs_action(advice: Advice, usage: Usage, pressure: Pressure, growth: GrowthTrend) -> bool:
    """Any advice but ``none``, uneven load, time above the watermark, preemptions, or full within a few weeks."""
    return (
        advice.action != NO_ACTION
        or bool(advice.uneven)
        or usage.hours_above_watermark > NEEDS_ACTION_HOURS_ABOVE_WATERMARK
        or pressure.preemptions > NEEDS_ACTION_PREEMPTIONS
        or (growth.weeks_until_full is not None and growth.weeks_until_full < NEEDS_ACTION_WEEKS_UNTIL_FULL)
    )


def _summary(
    model: ModelKey,
    usage: Usage,
    pressure: Pressure,
    growth: GrowthTrend,
    advice: Advice,
    pages: Sequence[Page] = (),
    full: Sequence[PodReport] = (),
) -> str:
    """One sentence: what the model went through, then what to do."""
    facts = [f"peak usage {_percent(usage.peak_ratio)}" if usage.peak_ratio is not None else "no usage data"]
    if usage.hours_above_watermark > 0:
        facts.append(f"{usage.hours_above_watermark:.1f} h above the watermark")
    if pressure.preemptions > 0:
        facts.append(f"{_tokens(pressure.preemptions)} preemptions")
    critical = sum(1 for p in pages if p.severity == "critical")
    if pages:
        warnings = len(pages) - critical
        facts.append(
            f"{critical} critical page{'s' if critical != 1 else ''}, {warnings} warning{'s' if warnings != 1 else ''}"
        )
    if full:
        hottest = max(full, key=lambda p: (p.capacity.peak_demand_ratio or 0.0, p.pod))
        facts.append(
            f"already full on {hottest.pod} (peak demand {_percent(hottest.capacity.peak_demand_ratio or 0.0)} "
            "of its usable tokens)"
        )
    elif growth.verdict == AT_CAPACITY:
        facts.append("already full (peak demand at the usable capacity)")
    elif growth.weeks_until_full is not None:
        facts.append(_full_in(growth))
    todo = advice.sentence[0].lower() + advice.sentence[1:]
    if advice.uneven:
        todo = todo.rstrip(".") + "; " + advice.uneven[0].lower() + advice.uneven[1:]
    return f"{model}: {', '.join(facts)}; {todo}"


def _full_in(growth: GrowthTrend) -> str:
    """ "full in N weeks" with how it was measured: the fit's interval and weeks, or the two points it rests on."""
    text = f"full in {growth.weeks_until_full:.1f} weeks at this growth"
    if growth.verdict != GROWING:  # two points: no fit, no interval
        return f"{text} (two weeks only: no uncertainty)"
    low, high = growth.weeks_until_full_low, growth.weeks_until_full_high
    fast = f"{low:.1f}" if low is not None else "?"
    slow = f"{high:.1f} weeks" if high is not None else f"over {growth.horizon_weeks:.0f} weeks"
    return f"{text} ({growth.confidence * 100:.0f}%: {fast} to {slow}, fitted over {growth.weeks_fitted} weeks)"


def _urgency(m: ModelReport) -> tuple[bool, float, float, str]:
    """Sort key: needing action first, then the peak demand's share of capacity, preemptions, the name."""
    ratio = m.capacity.peak_demand_ratio
    return (not m.needs_action, -(ratio if ratio is not None else -math.inf), -m.pressure.preemptions, str(m.model))


def _model_report(
    model: ModelKey,
    pods: Sequence[PodSeries],
    week: Week,
    thresholds: Thresholds,
    served: ServedModel | None,
    settings: AdviceSettings,
    history: Sequence[WeeklyPeak],
) -> ModelReport:
    period = week.period
    rows = [_pod_report(p, week, thresholds, served, settings) for p in pods]
    s = _model_steps([steps for _, _, steps in rows], period.steps)
    usage = _usage(s, period, thresholds, week.model_usage_quantiles.get(model), week.model_seconds_above.get(model))
    capacity = _capacity(s)
    pressure = _pressure(s, period, week.model_seconds_waiting.get(model))
    full = [r for r, _, _ in rows if (r.capacity.peak_demand_ratio or 0.0) >= 1.0]
    this_week = weekly_peak(period.start, s.demand)
    peaks = [*history, this_week] if this_week is not None else []
    # no usable tokens (a pool of one block, an engine asleep): the growth without weeks until full
    usable = capacity.usable_tokens if capacity.usable_tokens and capacity.usable_tokens > 0 else None
    growth = growth_trend(peaks, usable, at_capacity=bool(full)) if peaks else _no_demand(usable, bool(history))
    advice = _model_advice(
        [(p, r) for p, (r, _, _) in zip(pods, rows, strict=True)], capacity.peak_demand_tokens, served, settings, period
    )
    pages: list[Page] = sorted(
        (p for p in week.pages if p.model == model), key=lambda p: (p.start, p.alertname, p.pod, p.end)
    )
    return ModelReport(
        model=model,
        usage=usage,
        capacity=capacity,
        pressure=pressure,
        growth=growth,
        advice=advice,
        pages=pages,
        pods=[r for r, _, _ in rows],
        timeline=_timeline(s, period),
        needs_action=needs_action(advice, usage, pressure, growth),
        summary=_summary(model, usage, pressure, growth, advice, pages, full),
    )


def _kv_dtype_bytes(label: str | None) -> int | None:
    """Bytes per element of ``kvcache_model_info``'s ``kv_dtype`` label (None: unknown)."""
    try:
        return DTYPE_BYTES[canonical_dtype(label)] if label else None
    except (CapacityError, KeyError):
        return None


def _same(non_kv: NonKVBytes) -> NonKVBytes:
    return non_kv


def exported_model(pods: Sequence[PodSeries], settings: AdviceSettings) -> ServedModel | None:
    """What the sidecars' exports say of a model the report has no ``model.config`` for.

    Bytes per token from ``kvcache_theoretical_bytes_per_token``, the KV dtype, attention and TP from
    ``kvcache_model_info``, and the GPU memory ``M`` the sidecar sized with: exported
    (``kvcache_gpu_memory_bytes``, with the GPU's name), else recovered from its own figures: the
    largest pool (``kvcache_lever_capacity_tokens{lever="fp8_kv_cache"}`` ÷ dtype bytes,
    :func:`~sidecar.forecast.sizing.gpu_memory_from_largest_pool`), else its largest suggestion
    (:func:`~sidecar.forecast.sizing.gpu_memory_from_suggestion`). Only for pools sized by
    ``gpu_memory_utilization`` (with ``kv_cache_memory_bytes`` the pool gives bytes per token itself);
    None when no pod exported enough. The non-KV bytes are what the budget leaves: ``M × u0 − C0 × bpt``.
    """
    for pod in pods:
        _, c0 = _last(pod.capacity_tokens)
        demands = _finite(pod.demand_max)
        bpt, u0, bs = pod.bytes_per_token, pod.gpu_memory_utilization, pod.block_size
        if pod.kv_cache_memory_bytes or not (bpt and u0 and bs and c0 and demands):
            continue
        dtype_bytes = _kv_dtype_bytes(pod.model_info.get("kv_dtype"))
        memory = pod.gpu_memory_bytes  # what the sidecar sized with, exported (kvcache_gpu_memory_bytes)
        if memory is None and pod.fp8_lever_capacity_tokens and dtype_bytes:
            memory = gpu_memory_from_largest_pool(
                max_capacity_tokens=pod.fp8_lever_capacity_tokens / dtype_bytes,
                u_max=settings.utilization_max,
                u0=u0,
                capacity_tokens=c0,
                bytes_per_token=bpt,
            )
        if memory is None and pod.suggested_gpu_memory_utilization_max is not None:
            memory = gpu_memory_from_suggestion(
                suggested=pod.suggested_gpu_memory_utilization_max,
                u0=u0,
                capacity_tokens=c0,
                peak_demand_tokens=max(demands),
                target_usage=settings.target_usage,
                bytes_per_token=bpt,
                block_size=bs,
                lo=settings.utilization_min,
                hi=settings.utilization_max,
            )
        if memory is None:
            continue
        rest = NonKVBytes(weights=max(0, int(memory * u0 - c0 * bpt)), activation=0, non_torch=0, cudagraph=0)
        try:
            tp = int(pod.model_info.get("tp", "1"))
        except ValueError:
            tp = 1
        return ServedModel(
            bytes_per_token=bpt,
            kv_dtype_bytes=dtype_bytes or 1,  # unknown: no fp8 lever
            kv_heads=1,  # not exported: no fewer-heads lever
            attention=pod.model_info.get("attention", ""),
            tensor_parallel=tp,
            gpu_memory_bytes=memory,
            non_kv_bytes=functools.partial(_same, rest),
            gpu_name=pod.gpu_name,
        )
    return None


def compute(
    week: Week,
    *,
    thresholds: Thresholds,
    advice: AdviceSettings,
    served: Mapping[ModelKey, ServedModel] | None = None,
    generated_at: float,
) -> Report:
    """The report of ``week``: every pod and model's figures, models ranked, the summary of those that need action.

    ``served``: what ``model.config`` says of the models it describes (the others get the advice
    the pool alone allows). Ranking: models that need action (:func:`needs_action`) first, then by
    peak demand over usable capacity (highest first), preemptions, name.
    """
    served = served or {}
    history = _history_peaks(week)
    models = [
        _model_report(
            model,
            pods,
            week,
            thresholds,
            served.get(model) or exported_model(pods, advice),
            advice,
            history.get(model, []),
        )
        for model, pods in _by_model(week.pods).items()
    ]
    models.sort(key=_urgency)
    return Report(
        period=week.period,
        source=week.source,
        generated_at=generated_at,
        watermark=thresholds.watermark,
        warning=thresholds.warning,
        target_usage=thresholds.target_usage,
        models=models,
        summary=[m.summary for m in models if m.needs_action],
        pages_known=week.pages_known,
    )
