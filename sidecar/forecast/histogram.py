"""Prometheus cumulative histograms over a window: the delta of two snapshots, its mean and quantiles.

Used on ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens``
(buckets 1-2-5 up to ``max_model_len``, ``build_1_2_5_buckets`` in ``vllm/v1/metrics/loggers.py``) to get
the request lengths of the window, as ``rate()`` + ``histogram_quantile()``
would in PromQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HistogramSnapshot:
    """One scrape of a histogram: ``(le, cumulative_count)`` buckets (``+Inf`` last), ``_sum``, ``_count``."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @classmethod
    def of(cls, buckets: Sequence[tuple[float, float]], sum: float, count: float) -> HistogramSnapshot:
        """Build from any sequence of ``(le, cumulative)``, sorted by ``le``."""
        ordered = tuple(sorted((float(le), float(c)) for le, c in buckets))
        if not ordered or ordered[-1][0] != math.inf:
            raise ValueError('buckets: the highest bucket must be le="+Inf" (Prometheus histogram exposition)')
        return cls(ordered, float(sum), float(count))


def window_delta(old: HistogramSnapshot | None, new: HistogramSnapshot) -> HistogramSnapshot:
    """Observations made between two snapshots: ``new − old`` per bucket, sum and count.

    Reset-safe like PromQL ``increase()``: when anything went down (the process
    restarted, counters start again from 0) or the bucket bounds changed (a
    restart with another ``max_model_len`` changes vLLM's bucket list), the newer
    snapshot alone is what was observed since the restart. ``old=None`` (no
    snapshot at the window start yet) also gives ``new``.
    """
    if old is None:
        return new
    same_bounds = [le for le, _ in old.buckets] == [le for le, _ in new.buckets]
    went_down = (
        new.count < old.count
        or new.sum < old.sum
        or (same_bounds and any(n < o for (_, o), (_, n) in zip(old.buckets, new.buckets, strict=False)))
    )
    if not same_bounds or went_down:
        return new
    return HistogramSnapshot(
        tuple((le, n - o) for (le, o), (_, n) in zip(old.buckets, new.buckets, strict=False)),
        new.sum - old.sum,
        new.count - old.count,
    )


def window_mean(old: HistogramSnapshot | None, new: HistogramSnapshot) -> float | None:
    """Mean observation over the window: ``Δsum ÷ Δcount`` (PromQL ``rate(x_sum) / rate(x_count)``).

    ``None`` when nothing was observed in the window.
    """
    d = window_delta(old, new)
    return d.sum / d.count if d.count > 0 else None


def window_quantile(q: float, old: HistogramSnapshot | None, new: HistogramSnapshot) -> float | None:
    """The ``q``-quantile of the window's observations, as PromQL ``histogram_quantile`` estimates it.

    Semantics of Prometheus ``histogram_quantile`` (prometheus docs, "Functions:
    histogram_quantile"; ``promql/quantile.go``): rank = q × total count; find the
    first bucket whose cumulative count reaches the rank; interpolate linearly
    between its lower bound (the previous ``le``, or 0 for the first bucket when
    its upper bound is positive) and its upper bound. A rank that lands in the
    ``+Inf`` bucket returns the highest finite bound. The estimate is only as
    good as the buckets (vLLM's 500–1000 bucket turns 512-token prompts into a
    median of 750).

    ``None`` when nothing was observed or there is no finite bucket (PromQL: NaN).
    ``q`` outside [0, 1] is a programming error here (PromQL would answer ±Inf).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: must be within [0, 1], got {q!r}")
    d = window_delta(old, new)
    buckets = list(d.buckets)
    # Cumulative counts can be slightly non-monotonic after float arithmetic;
    # PromQL forces monotonicity the same way (a bucket is at least the one below).
    for i in range(1, len(buckets)):
        if buckets[i][1] < buckets[i - 1][1]:
            buckets[i] = (buckets[i][0], buckets[i - 1][1])
    total = buckets[-1][1]
    if total <= 0 or len(buckets) < 2:
        return None
    rank = q * total
    idx = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if idx == len(buckets) - 1:
        return buckets[-2][0]
    upper, cum = buckets[idx]
    if idx == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = buckets[idx - 1]
    in_bucket = cum - below
    if in_bucket <= 0:
        # Only reachable for rank 0 at an empty leading bucket: the lowest possible value.
        return lower
    return lower + (upper - lower) * (rank - below) / in_bucket
