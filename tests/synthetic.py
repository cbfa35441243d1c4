"""Synthetic demand series shared by the forecast tests (tests/ is on sys.path)."""

from __future__ import annotations


def slow_ramp(until_s: float, spike: float = 500.0) -> list[tuple[float, float]]:
    """1000 + t tokens (1 token/s), sampled every 5 s, plus one peak of ``spike`` at t = 100 b + 50 in odd b.

    The peaks of 100-s slices alternate (95, 650, 295, 850, 495, 1050 above 1000 + 100 b): over a
    10-minute window of six 100-s slices that is S = 9 of 15 pairs, tau 0.6, below the 0.73 of
    the Mann–Kendall gate. In 200-s or 400-s slices each slice holds one or two spikes and its
    peak is the last one, 1500 + t: a straight line of slope 1.
    """
    pts = []
    for i in range(int(until_s // 5) + 1):
        t = 5.0 * i
        y = 1000.0 + t + (spike if int(t // 100) % 2 == 1 and t % 100 == 50 else 0.0)
        pts.append((t, y))
    return pts
