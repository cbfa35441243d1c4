"""Time until full measured from the level *now* (sidecar.forecast.earliest_full with ``peak_now``).

Hand-made demand series, sampled every 5 s, evaluated the way the forecast layer does: the trends over
10, 20 and 40 minutes, the level now being the highest demand of the last 100 s (one slice of the
10-minute window). Each test also shows what the window's own level gave (``peak_now=None``, the
estimator before): 0 for minutes after the load dropped, 0 and +Inf in turn on a saturated plateau.
"""

from __future__ import annotations

import math
import random

import pytest

from sidecar.forecast import earliest_full, recent_peak, trend_over

BS = 16
USABLE = 10_000.0  # usable tokens
WINDOWS = (600.0, 1200.0, 2400.0)
RECENT_S = 100.0


def until_full(series: list[tuple[float, float, float]], now: float, *, level_now: bool = True) -> float | None:
    """The gauge at ``now`` from ``(t, demand, used)`` samples; ``level_now=False``: the window's level."""
    pts = [(t, d) for t, d, _ in series if t <= now]
    _, demand, used = next(s for s in reversed(series) if s[0] <= now)
    trends = [trend_over(pts, now, w) for w in WINDOWS]
    if not level_now:
        return earliest_full(trends, demand=demand, free_tokens=USABLE - used, headroom_tokens=0, block_size=BS)[1]
    return earliest_full(
        trends,
        demand=demand,
        free_tokens=USABLE - used,
        headroom_tokens=0,
        block_size=BS,
        used_tokens=used,
        peak_now=recent_peak(pts, now, RECENT_S),
        recent_s=RECENT_S,
    )[1]


def saturated(t: float, rng: random.Random) -> tuple[float, float, float]:
    """A cache at its limit: at most 30 blocks free (a request just finished), a queue of 0-3000 tokens."""
    used = USABLE - BS * rng.choice([1, 1, 1, 5, 12, 30])
    return t, used + rng.uniform(0, 3000), used


def test_after_the_load_drops_the_gauge_leaves_0_within_one_slice():
    rng = random.Random(1)
    series = [saturated(5.0 * i, rng) for i in range(481)]  # 40 minutes saturated
    series += [(2400.0 + 5 * i, 3000.0 + 200 * (i % 4), 3000.0 + 200 * (i % 4)) for i in range(1, 121)]  # 10 min
    first = [(t, until_full(series, t)) for t, _, _ in series[481:511]]  # each sample of the first 150 s
    left = next(t for t, v in first if v != 0.0) - 2400.0
    assert 0 < left <= RECENT_S + 5  # the peak of the saturation has left the last 100 s
    later = [t for t, _, _ in series[481::6]]  # every 30 s of the 10 minutes after the drop
    assert all(until_full(series, t) == math.inf for t in later if t >= 2400.0 + RECENT_S + 5)  # flat: not filling
    # The window's own level (the estimator before) kept reading 0 for the whole 10 minutes after the drop:
    # the 20- and 40-minute envelopes still stand at the saturation's level.
    assert all(until_full(series, t, level_now=False) == 0.0 for t in later)


def test_a_saturated_plateau_reads_0_steadily():
    rng = random.Random(2)
    series = [saturated(5.0 * i, rng) for i in range(481)]
    now_values = [until_full(series, t) for t, _, _ in series[-60:]]  # the last 5 minutes
    assert now_values == [0.0] * 60
    # Before: +Inf whenever a request had just finished (more than a block free, no rising trend) and the
    # queue stood above the envelope's median level, 0 at the next scrape.
    before = [until_full(series, t, level_now=False) for t, _, _ in series[-60:]]
    flips = sum(1 for a, b in zip(before, before[1:], strict=False) if {a, b} == {0.0, math.inf})
    assert flips >= 2


def test_a_plateau_below_the_watermark_reads_inf_steadily():
    # A sawtooth between 0.4 and 0.6 of the cache: requests start and finish, the peaks do not rise.
    series = [(5.0 * i, 4000.0 + 100 * (i % 21), 4000.0 + 100 * (i % 21)) for i in range(481)]
    assert [until_full(series, t) for t, _, _ in series[-120::4]] == [math.inf] * 30


def test_a_ramp_reads_a_finite_decreasing_time_as_before():
    # 1000 + 2 t tokens with a sawtooth of 40 s teeth (up to 600 tokens): full at 10,000 near t = 4200.
    series = [(5.0 * i, 1000.0 + 10 * i + 75 * (i % 8), 1000.0 + 10 * i + 75 * (i % 8)) for i in range(721)]
    times = [t for t, _, _ in series if t >= 2400 and t % 60 == 0]  # once a minute over the last 20 minutes
    now = [until_full(series, t) for t in times]
    assert all(0 < v < math.inf for v in now)
    assert all(b < a for a, b in zip(now, now[1:], strict=False))
    # The peaks stand at 1525 + 2 t: (10,000 - 1525 - 2 t) / 2 s left, the same as from the window's level.
    for t, v in zip(times, now, strict=True):
        assert v == pytest.approx((USABLE - 1525 - 2 * t) / 2, abs=30)
        assert v == pytest.approx(until_full(series, t, level_now=False), abs=30)


def test_recent_peak_reads_only_the_last_span():
    pts = [(0.0, 9.0), (50.0, 1.0), (90.0, 3.0), (100.0, math.nan), (110.0, 2.0)]
    assert recent_peak(pts, 110.0, 60.0) == 3.0
    assert recent_peak(pts, 110.0, 200.0) == 9.0
    assert recent_peak(pts, 110.0, 5.0) == 2.0
    assert recent_peak(pts[:1], 110.0, 60.0) is None
