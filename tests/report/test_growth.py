"""Growth from several weeks of peak demand: hand-computed fits, a calibration over seeded noise, and the verdicts.

The expected numbers are worked by hand from the textbook formulas (their arithmetic is in the
comments), never read back from sidecar.report.growth; Student's t is checked against the NIST/SEMATECH
e-Handbook's table (section 1.3.6.7.2) and the closed forms for 1 and 2 degrees of freedom. The calibration
tests draw 1,000 noisy series with a fixed seed: an interval that is too narrow (a normal quantile
for Student's, dividing by n instead of n − 2) covers the truth in about 70 % of them and fails.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from sidecar.report import growth
from sidecar.report.growth import (
    AT_CAPACITY,
    GROWING,
    LEAST_SQUARES,
    NO_FIT,
    NO_PREVIOUS_DATA,
    NOT_ENOUGH_HISTORY,
    NOT_GROWING,
    TWO_POINTS,
    WEEK_S,
    WeeklyPeak,
    fit_line,
    growth_text,
    growth_trend,
    student_t_quantile,
    t_central_probability,
    weekly_peak,
    weeks_until_line_meets,
)

T0 = 1_799_020_800.0  # Monday 2027-01-04 00:00 UTC


def weeks(peaks, coverage=None, at=None):
    """Weekly peaks, oldest first: week ``at[i]`` (default ``i``) after T0, fully seen unless told."""
    at = range(len(peaks)) if at is None else at
    coverage = [1.0] * len(peaks) if coverage is None else coverage
    return [WeeklyPeak(T0 + w * WEEK_S, p, c) for w, p, c in zip(at, peaks, coverage, strict=True)]


# --- Student's t --------------------------------------------------------------------------------------------

# NIST/SEMATECH e-Handbook section 1.3.6.7.2, upper critical values: two-sided 80 % is its 0.90 column,
# 95 % its 0.975 column, 99 % its 0.995 column (three decimals).
NIST_T = [
    (0.80, 1, 3.078),
    (0.80, 2, 1.886),
    (0.80, 3, 1.638),
    (0.80, 4, 1.533),
    (0.80, 5, 1.476),
    (0.80, 6, 1.440),
    (0.80, 8, 1.397),
    (0.80, 10, 1.372),
    (0.80, 20, 1.325),
    (0.80, 30, 1.310),
    (0.80, 100, 1.290),
    (0.95, 1, 12.706),
    (0.95, 5, 2.571),
    (0.95, 10, 2.228),
    (0.95, 30, 2.042),
    (0.99, 1, 63.657),
    (0.99, 10, 3.169),
]


@pytest.mark.parametrize(("confidence", "df", "table"), NIST_T)
def test_t_quantile_matches_the_nist_table(confidence, df, table):
    assert student_t_quantile(confidence, df) == pytest.approx(table, abs=5e-4)


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.99])
def test_t_quantile_closed_forms_for_one_and_two_degrees_of_freedom(confidence):
    # ν = 1 is Cauchy: P(|T| ≤ t) = 2·atan(t)/π, so t = tan(π·c/2); ν = 2: P = t/√(2 + t²), so t = c·√(2/(1 − c²)).
    assert student_t_quantile(confidence, 1) == pytest.approx(math.tan(math.pi * confidence / 2), rel=1e-12)
    assert student_t_quantile(confidence, 2) == pytest.approx(
        confidence * math.sqrt(2 / (1 - confidence**2)), rel=1e-12
    )


def test_t_approaches_the_normal_quantile_with_many_degrees_of_freedom():
    # Abramowitz & Stegun 26.7.5 (Cornish-Fisher): t ≈ z + (z³ + z)/(4ν) + O(1/ν²); at ν = 2000 the next term is ~1e-7
    z = statistics.NormalDist().inv_cdf(0.90)  # 1.28155
    assert student_t_quantile(0.80, 2000) == pytest.approx(z + (z**3 + z) / (4 * 2000), abs=1e-6)


def test_t_probability_is_a_distribution():
    for df in (1, 2, 3, 7, 8):
        assert t_central_probability(0.0, df) == 0.0
        assert t_central_probability(1e9, df) == pytest.approx(1.0, abs=1e-8)
        values = [t_central_probability(t / 10, df) for t in range(60)]
        assert values == sorted(values)


def test_t_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="positive integer"):
        t_central_probability(1.0, 0)
    with pytest.raises(ValueError, match="positive integer"):
        t_central_probability(1.0, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="between 0 and 1"):
        student_t_quantile(1.0, 3)


# --- small exact cases, by hand -----------------------------------------------------------------------------


def test_three_weeks_by_hand():
    # x = −2, −1, 0 (weeks from the latest); y = 100, 110, 130. x̄ = −1, ȳ = 340/3 = 113.33, Sxx = 2,
    # Sxy = (−1)(−13.33) + 0 + (1)(16.67) = 30, b = 15. Residuals 1.667, −3.333, 1.667: SSE = 16.667,
    # s² = SSE/(n − 2) = 16.667, se(b) = √(16.667/2) = 2.8868. t(80 %, 1) = 3.0777: 15 ± 8.8845.
    # The line at x = 0: 113.33 + 15 = 128.33; it meets 200 at x̄ + (200 − ȳ)/b = −1 + 86.667/15 = 4.7778.
    # Band edges (u = x − x̄, d = 86.667, q = t·se = 8.8845, h² = t²s²/3 = 52.623):
    # (225 − 78.934)·u² − 2600·u + (7511.1 − 52.623) = 0 → u = (1300 ± √600,563)/146.066 = 3.5946, 14.2055,
    # so the fast end is x = 2.5946 and the slow end x = 13.2055.
    trend = growth_trend(weeks([100, 110, 130]), usable_tokens=200)
    assert trend.verdict == GROWING and trend.method == LEAST_SQUARES and trend.weeks_fitted == 3
    assert trend.growth_tokens_per_week == pytest.approx(15.0)
    assert trend.growth_standard_error_tokens_per_week == pytest.approx(2.88675, rel=1e-5)
    assert trend.growth_low_tokens_per_week == pytest.approx(6.1155, rel=1e-4)
    assert trend.growth_high_tokens_per_week == pytest.approx(23.8845, rel=1e-4)
    assert trend.trend_peak_demand_tokens == pytest.approx(128.3333, rel=1e-6)
    assert trend.growth_ratio_per_week == pytest.approx(15 / 128.3333, rel=1e-6)
    assert trend.weeks_until_full == pytest.approx(4.7778, rel=1e-4)
    assert trend.weeks_until_full_low == pytest.approx(2.5946, rel=1e-4)
    assert trend.weeks_until_full_high == pytest.approx(13.2055, rel=1e-4)
    # the week before and the change, as the report's figure rows show them
    assert trend.previous_peak_demand_tokens == 110 and trend.change_ratio == pytest.approx(20 / 110)


def test_four_weeks_on_a_straight_line_have_no_uncertainty():
    # 100, 120, 140, 160: b = 20 exactly, every residual 0, se 0; 200 is met 40/20 = 2 weeks after 160.
    trend = growth_trend(weeks([100, 120, 140, 160]), usable_tokens=200)
    assert trend.growth_tokens_per_week == pytest.approx(20.0)
    assert trend.growth_standard_error_tokens_per_week == pytest.approx(0.0, abs=1e-12)
    assert trend.growth_low_tokens_per_week == pytest.approx(20.0)
    assert (trend.weeks_until_full, trend.weeks_until_full_low, trend.weeks_until_full_high) == pytest.approx(
        (2.0, 2.0, 2.0)
    )
    assert growth_text(trend) == (
        "growing +12.5%/week (80%: +12.5 to +12.5%), full in 2.0 weeks (80%: 2.0 to 2.0 weeks), over 4 weeks"
    )


def test_eight_weeks_by_hand():
    # y = 1000 + 50·w + 10·r, r = (+1, −1, −1, +1, +1, −1, −1, +1) for w = 0..7: Σr = 0 and Σw·r = 0, so the
    # fit is the line itself, b = 50, and SSE = 8·10² = 800. s² = 800/6, Sxx = 42, se = √(800/6/42) = 1.78174;
    # t(80 %, 6) = 1.43976: 50 ± 2.56527. The line at the latest week is 1350; 1500 is 150/50 = 3 weeks on.
    r = [1, -1, -1, 1, 1, -1, -1, 1]
    trend = growth_trend(weeks([1000 + 50 * w + 10 * r[w] for w in range(8)]), usable_tokens=1500)
    assert trend.growth_tokens_per_week == pytest.approx(50.0)
    assert trend.growth_standard_error_tokens_per_week == pytest.approx(1.78174, rel=1e-5)
    assert (trend.growth_low_tokens_per_week, trend.growth_high_tokens_per_week) == pytest.approx(
        (47.43473, 52.56527), rel=1e-6
    )
    assert trend.trend_peak_demand_tokens == pytest.approx(1350.0)
    assert trend.weeks_until_full == pytest.approx(3.0)
    assert trend.weeks_until_full_low < 3.0 < trend.weeks_until_full_high


def test_the_interval_ends_are_where_the_band_edges_meet_the_capacity():
    """Fieller's ends: the upper edge of the line's band meets C at the fast end, the lower edge at the slow."""
    xs, ys = [-5.0, -4.0, -3.0, -2.0, -1.0, 0.0], [900.0, 980.0, 1010.0, 1100.0, 1120.0, 1210.0]
    line = fit_line(xs, ys)
    t = student_t_quantile(0.80, len(xs) - 2)
    point, fast, slow = weeks_until_line_meets(line, 1600.0, t)
    assert line.at(point) == pytest.approx(1600.0)
    assert line.at(fast) + line.band_half_width(fast, t) == pytest.approx(1600.0)
    assert slow is not None and line.at(slow) - line.band_half_width(slow, t) == pytest.approx(1600.0)
    assert fast < point < slow


# --- calibration ---------------------------------------------------------------------------------------------


def _noisy(rng, n, slope, level, sd):
    """``n`` weekly peaks on the line ``level + slope·w`` (w = 0..n − 1) plus Gaussian noise of ``sd``."""
    return weeks([level + slope * w + rng.gauss(0.0, sd) for w in range(n)])


@pytest.mark.parametrize(("n", "seed"), [(5, 20251), (8, 20252)])
def test_the_80_percent_growth_interval_holds_the_true_growth_in_80_percent_of_trials(n, seed):
    rng, slope, hits = random.Random(seed), 40.0, 0
    for _ in range(1000):
        trend = growth_trend(_noisy(rng, n, slope, 1000.0, 60.0), usable_tokens=None)
        hits += trend.growth_low_tokens_per_week <= slope <= trend.growth_high_tokens_per_week
    # binomial(1000, 0.8): sd 12.6, so 760-840 is ±3.2 sd; a normal quantile (df 3: 71 %) falls outside
    assert 760 <= hits <= 840


def test_the_80_percent_weeks_interval_holds_the_true_week_in_80_percent_of_trials():
    # true line 1000 + 50·w over w = 0..7: 1350 at the latest week, 1800 met 9 weeks later
    rng, hits = random.Random(20253), 0
    for _ in range(1000):
        trend = growth_trend(_noisy(rng, 8, 50.0, 1000.0, 40.0), usable_tokens=1800.0, horizon_weeks=1000.0)
        assert trend.verdict == GROWING
        slow = trend.weeks_until_full_high if trend.weeks_until_full_high is not None else math.inf
        hits += trend.weeks_until_full_low <= 9.0 <= slow
    assert 760 <= hits <= 840


# --- shapes of history ---------------------------------------------------------------------------------------


def test_a_flat_series_is_not_growing():
    trend = growth_trend(weeks([1000] * 6), usable_tokens=2000)
    assert trend.verdict == NOT_GROWING and trend.growth_tokens_per_week == 0.0
    assert trend.weeks_until_full is None and trend.weeks_until_full_high is None
    assert growth_text(trend) == "not growing: +0.0%/week (80%: +0.0 to +0.0%), over 6 weeks"


def test_a_falling_series_is_not_growing():
    trend = growth_trend(weeks([1000, 950, 900, 850]), usable_tokens=2000)
    assert trend.verdict == NOT_GROWING and trend.growth_tokens_per_week == pytest.approx(-50.0)
    assert trend.weeks_until_full is None


def test_growth_within_noise_is_not_growing():
    # +10 tokens a week on ~1070 is 0.93 %/week, under GROWTH_NOISE_RATIO (1 %), though the fit is exact
    trend = growth_trend(weeks([1000 + 10 * w for w in range(8)]), usable_tokens=3000)
    assert trend.verdict == NOT_GROWING and trend.growth_low_tokens_per_week > 0
    assert "within noise" in growth_text(trend)


def test_one_outlier_week_in_a_flat_series_widens_the_interval_but_is_not_growth():
    # 1000 every week but the fourth (w = 3, 1500): Σ(w − 3.5) = 0, so b = Σ(w − 3.5)·y / Sxx = (3 − 3.5)·500/42
    # = −5.95 a week; the spike's residual makes se(b) 29.4 and the interval −48 to +36
    trend = growth_trend(weeks([1000, 1000, 1000, 1500, 1000, 1000, 1000, 1000]), usable_tokens=5000)
    assert trend.verdict == NOT_GROWING
    assert trend.growth_tokens_per_week == pytest.approx(-250 / 42)
    assert trend.growth_low_tokens_per_week < 0 < trend.growth_high_tokens_per_week
    assert trend.growth_standard_error_tokens_per_week > 20


def test_one_outlier_week_in_a_growing_series_keeps_the_true_growth_inside_a_wider_interval():
    clean = [1000 + 50 * w for w in range(8)]
    spiked = clean[:3] + [clean[3] + 400] + clean[4:]
    trend = growth_trend(weeks(spiked), usable_tokens=3000)
    assert trend.verdict == GROWING
    assert trend.growth_low_tokens_per_week < 50 < trend.growth_high_tokens_per_week
    # the slow end is past the horizon: the outlier leaves the growth too uncertain to promise a date
    assert trend.weeks_until_full_low is not None and trend.weeks_until_full_high is None
    assert "(80%: 18.9 to over 26 weeks)" in growth_text(trend)


# --- at capacity -----------------------------------------------------------------------------------------------


def test_a_peak_that_met_the_capacity_is_at_capacity_never_full_in_n_weeks():
    trend = growth_trend(weeks([100, 120, 140, 160, 205]), usable_tokens=200)
    assert trend.verdict == AT_CAPACITY
    assert (trend.weeks_until_full, trend.weeks_until_full_low, trend.weeks_until_full_high) == (0.0, 0.0, 0.0)
    assert growth_text(trend) == "already full"


def test_a_pod_already_full_makes_the_model_at_capacity_whatever_its_trend():
    # the model's summed peak is far from its summed capacity, but one pod met its own
    trend = growth_trend(weeks([100, 100, 100]), usable_tokens=10_000, at_capacity=True)
    assert trend.verdict == AT_CAPACITY and trend.weeks_until_full == 0.0
    assert growth_text(trend) == "already full"
    short = growth_trend(weeks([100, 150]), usable_tokens=10_000, at_capacity=True)
    assert short.verdict == AT_CAPACITY and growth_text(short) == "already full"


# --- gaps, restarts, short history -------------------------------------------------------------------------


def test_a_missing_week_is_a_gap_not_a_drop():
    # weeks 0, 1, 3, 4, 5 on 100 + 10·w: the slope is 10 a week across the gap (not 10 a row)
    # (read as consecutive rows it would be 12.5 a week); 200 is met (200 − 150)/10 = 5 weeks after week 5
    trend = growth_trend(weeks([100, 110, 130, 140, 150], at=[0, 1, 3, 4, 5]), usable_tokens=200)
    assert trend.growth_tokens_per_week == pytest.approx(10.0)
    assert trend.weeks_until_full == pytest.approx(5.0)


def test_a_week_seen_too_little_is_left_out():
    # the third week was seen for a day (coverage 1/7): its peak 40 would read as a collapse
    with_partial = weeks([100, 110, 40, 130, 140], coverage=[1, 1, 1 / 7, 1, 1])
    trend = growth_trend(with_partial, usable_tokens=200)
    without = growth_trend([p for i, p in enumerate(with_partial) if i != 2], usable_tokens=200)
    assert trend.weeks_skipped == 1 and trend.weeks_fitted == 4
    assert trend.verdict == GROWING
    assert trend.growth_tokens_per_week == pytest.approx(without.growth_tokens_per_week)
    assert trend.weeks_until_full == pytest.approx(without.weeks_until_full)
    assert growth_text(trend).endswith("over 4 weeks, 1 skipped")
    # five days of seven is enough to count
    kept = growth_trend(weeks([100, 110, 120], coverage=[1, 5 / 7, 1]), usable_tokens=200)
    assert kept.weeks_fitted == 3 and kept.weeks_skipped == 0


def test_a_restart_does_not_lower_the_weekly_peak():
    steps = [500.0] * 10_080
    steps[2000] = 900.0  # the week's busiest minute
    steps[5000:5060] = [math.nan] * 60  # an hour of restart: no samples
    peak = weekly_peak(T0, steps)
    assert peak.peak_demand_tokens == 900.0 and peak.coverage_ratio == pytest.approx(1 - 60 / 10_080)
    assert weekly_peak(T0, [math.nan] * 10) is None  # a week without data is absent, not zero


def test_two_weeks_are_not_enough_history_and_fall_back_to_two_points():
    # today's figure: (usable − peak) ÷ (peak − previous) weeks = (200 − 104) ÷ 4 = 24
    trend = growth_trend(weeks([100, 104]), usable_tokens=200)
    assert trend.verdict == NOT_ENOUGH_HISTORY and trend.method == TWO_POINTS
    assert trend.growth_tokens_per_week == pytest.approx(4.0) and trend.weeks_until_full == pytest.approx(24.0)
    assert trend.growth_standard_error_tokens_per_week is None and trend.weeks_until_full_high is None
    assert growth_text(trend) == "not enough history (2 weeks): +4.0%/week on two points, full in 24.0 weeks"
    # a change within noise gives no date, as before
    assert growth_trend(weeks([100, 100.5]), usable_tokens=200).weeks_until_full is None
    # a latest week seen too little: the line through the two before, read from the latest week (24 − 1)
    late = growth_trend(weeks([100, 104, 50], coverage=[1, 1, 0.2]), usable_tokens=200)
    assert late.method == TWO_POINTS and late.weeks_skipped == 1 and late.weeks_until_full == pytest.approx(23.0)


def test_one_week_has_no_previous_data_and_too_little_coverage_is_not_enough_history():
    assert growth_trend(weeks([100]), usable_tokens=200).verdict == NO_PREVIOUS_DATA
    assert growth_text(growth_trend(weeks([100]), usable_tokens=200)) == NO_PREVIOUS_DATA
    thin = growth_trend(weeks([100, 110, 120], coverage=[0.1, 0.2, 1.0]), usable_tokens=200)
    assert thin.verdict == NOT_ENOUGH_HISTORY and thin.method == NO_FIT and thin.weeks_skipped == 2
    assert growth_text(thin) == "not enough history (1 week seen enough)"


def test_only_the_last_history_weeks_are_fitted():
    # ten weeks flat, then eight growing: the fit sees the eight (HISTORY_WEEKS) and their slope
    peaks = weeks([1000] * 10 + [1000 + 50 * w for w in range(1, 9)])
    trend = growth_trend(peaks, usable_tokens=5000)
    assert trend.weeks_fitted == growth.HISTORY_WEEKS
    assert trend.growth_tokens_per_week == pytest.approx(50.0)


def test_slow_growth_is_not_full_within_the_horizon():
    trend = growth_trend(weeks([1000 + 20 * w + (5 if w % 2 else -5) for w in range(8)]), usable_tokens=5000)
    assert trend.verdict == GROWING and trend.weeks_until_full is None and trend.weeks_until_full_low is None
    assert "not full within 26 weeks" in growth_text(trend)


def test_growth_without_a_known_capacity_has_no_weeks():
    trend = growth_trend(weeks([100, 110, 130]), usable_tokens=None)
    assert trend.verdict == GROWING and trend.weeks_until_full is None
    assert growth_text(trend) == "growing +11.7%/week (80%: +4.8 to +18.6%), over 3 weeks"


def test_bad_input_names_every_problem_at_once():
    bad = [WeeklyPeak(T0, -1.0, 1.0), WeeklyPeak(T0, 100.0, 1.5)]
    with pytest.raises(ValueError) as error:
        growth_trend(bad, usable_tokens=0.0)
    message = str(error.value)
    assert "peaks[0].peak_demand_tokens" in message and "peaks[1].coverage_ratio" in message
    assert "peaks[1].week_start: weeks must be oldest first" in message and "usable_tokens" in message
    with pytest.raises(ValueError, match="no weeks"):
        growth_trend([], usable_tokens=100.0)
