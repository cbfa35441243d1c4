"""The Mann–Kendall gate of fill_rate: wandering peaks are not a fill, a ramp is."""

from __future__ import annotations

import pytest

from sidecar.forecast import fill_rate
from sidecar.forecast.trend import MIN_TREND_TAU, kendall_tau


def test_kendall_tau_on_hand_made_points():
    assert kendall_tau([(0, 1), (1, 2), (2, 3)]) == 1.0
    assert kendall_tau([(0, 3), (1, 2), (2, 1)]) == -1.0
    assert kendall_tau([(0, 1), (1, 3), (2, 2), (3, 4)]) == pytest.approx((5 - 1) / 6)


def test_peaks_wandering_around_a_high_level_are_not_a_fill():
    # Six slices of 100 s whose peaks go 90k, 95k, 88k, 96k, 91k, 97k tokens: the Theil–Sen slope of
    # these is positive (+~15 tokens/s), but only 10 of 15 pairs rise (tau 0.33 < 0.73).
    peaks = [90_000, 95_000, 88_000, 96_000, 91_000, 97_000]
    samples = [(i * 100.0 + 50.0, float(p)) for i, p in enumerate(peaks)]
    samples += [(i * 100.0 + 10.0, 60_000.0) for i in range(6)]  # troughs between the peaks
    assert MIN_TREND_TAU == 0.73
    assert fill_rate(samples) == 0.0


def test_a_noisy_ramp_still_fills():
    peaks = [60_000, 66_000, 64_000, 75_000, 80_000, 86_000]  # one dip: 14 of 15 pairs rise
    samples = [(i * 100.0 + 50.0, float(p)) for i, p in enumerate(peaks)]
    samples += [(i * 100.0 + 10.0, p - 20_000.0) for i, p in enumerate(peaks)]
    assert fill_rate(samples) > 40
