"""Several trend windows (forecast.window + forecast.long_windows): a slow ramp that one short window
reads as noise is caught by a longer one, and a flat load stays quiet in every window."""

from __future__ import annotations

import math

import pytest
from synthetic import slow_ramp

from sidecar.forecast import earliest_full, fill_rate, trend_over


def test_a_slow_ramp_is_noise_to_the_short_window_and_a_fill_to_the_long_ones():
    pts, now = slow_ramp(2400), 2400.0
    short, mid, long = (trend_over(pts, now, w) for w in (600, 1200, 2400))
    assert short.rate == 0.0  # gated: peaks 95, 650, 295, 850, 495, 1050 do not rise consistently
    assert mid.rate == pytest.approx(1.0) and long.rate == pytest.approx(1.0)
    # The peaks' line 1500 + t stands at 3900 now; the newest sample (t = 2400, no spike) is 3400.
    assert long.level == pytest.approx(3900.0)
    demand, free = pts[-1][1], 10_000 - pts[-1][1]
    best, until_full, until_mark = earliest_full(
        [short, mid, long], demand=demand, free_tokens=free, headroom_tokens=free - 1000, block_size=16
    )
    # free 6600 tokens, of which the peaks already take 3900 - 3400 = 500: 6100 s at 1 token/s.
    assert until_full == pytest.approx(6100.0)
    assert until_mark == pytest.approx(5100.0)
    assert best is mid  # a tie between 20m and 40m goes to the shorter window
    # The short window alone says "not filling".
    _, alone, _ = earliest_full([short], demand=demand, free_tokens=free, headroom_tokens=free, block_size=16)
    assert alone == math.inf


def test_a_flat_load_with_the_same_spikes_is_quiet_in_every_window():
    pts = [(t, y - t) for t, y in slow_ramp(2400)]  # same peaks, no rise
    for w in (600, 1200, 2400):
        assert trend_over(pts, 2400.0, w).rate <= 0.0, w
    best, until_full, _ = earliest_full(
        [trend_over(pts, 2400.0, w) for w in (600, 1200, 2400)],
        demand=1000.0,
        free_tokens=9000.0,
        headroom_tokens=8000.0,
        block_size=16,
    )
    assert until_full == math.inf and best is not None


def test_each_window_reads_only_its_own_samples():
    pts = slow_ramp(2400)
    recent = [p for p in pts if p[0] >= 1800]
    assert trend_over(pts, 2400.0, 600).rate == fill_rate(recent)
    assert trend_over(pts[:3], 2400.0, 600) is None  # fewer than 5 samples in the window


def test_no_trend_yet_still_says_full_when_one_block_is_left():
    assert earliest_full([None, None], demand=5000.0, free_tokens=16.0, headroom_tokens=0.0, block_size=16) == (
        None,
        0.0,
        0.0,
    )
    assert earliest_full([], demand=5000.0, free_tokens=4096.0, headroom_tokens=1000.0, block_size=16) == (
        None,
        None,
        None,
    )
