"""A model's growth from several weeks of peak demand: a fitted trend, its uncertainty, and when it meets capacity.

What: :func:`growth_trend` takes the peak demand of each week a model has (oldest first, each with its
week's start and the share of the week its demand was seen) and the usable capacity now, and returns a
:class:`GrowthTrend`: the growth in tokens a week, its standard error and ~80 % interval, the weeks until
the trend meets the capacity with their interval, and a verdict. :func:`growth_text` says it in one
phrase for the report. Pure: no clock, no I/O, the standard library only (the daemon's dependencies
carry no numpy or scipy).

Why this shape (what a planner needs from a handful of weekly peaks):

- **The weekly peak, and only weeks seen enough.** A restart loses minutes of samples, not the week's
  peak, so a week with a restart reads as what it was. A week seen for only part of its length (the
  sidecar deployed mid-week, an outage of days) may have missed its busiest day, so it would read as
  a drop: weeks below :data:`MIN_COVERAGE_RATIO` are left out (and counted in ``weeks_skipped``).
  Weeks with no data are absent, never zero; the fit uses each week's real position in time, so a
  missing week leaves a gap, not a fall.
- **A straight line, fitted by least squares** (``peak ≈ a + b × weeks``), not an exponential:

  1. with the 3-8 weeks a report has, the two cannot be told apart: growing by a share ``r`` a week
     drifts from the straight line through the same weeks by about ``r² k² / 2`` of the level after
     ``k`` weeks (under 2 % for 5 %/week over 4 weeks), less than the scatter of a week's peak, which
     is one extreme sample. Picking by best fit would flip between the two on noise, and "full in"
     with it;
  2. a least-squares fit on ``log(peak)`` is not least squares on tokens: it weighs the early, small
     weeks more, and a week with zero demand has no logarithm;
  3. demand grows by steps (a team, a feature, a longer context) more than by compounding; the fit is
     redone every week over the last :data:`HISTORY_WEEKS` weeks, so a steepening trend shows within
     weeks. Where growth does compound, the line through past weeks is flatter than the latest weeks
     and "full in" is late: the interval's fast end is shown for that reason.

- **Student's t intervals** (n − 2 degrees of freedom), at :data:`CONFIDENCE` (80 %: a planner's
  "likely range", a 1-in-10 chance on each side): for the slope ``b ± t·se(b)``, and for the week the
  line meets the capacity, the weeks where the line's confidence band contains the capacity (Fieller's
  interval, the inverse of the band). The slow end is "not within the horizon" when the lower band
  never reaches the capacity, which is exactly when the slope's interval includes zero.

Sources: Montgomery, Peck & Vining, *Introduction to Linear Regression Analysis* (5th ed., 2012),
section 2.2 (least squares), section 2.4.1 (interval on the slope), section 2.4.2 (interval on the mean response); the
NIST/SEMATECH e-Handbook of Statistical Methods, section 4.5.1.1 (the mean response's interval) and section 4.5.2.1
(calibration: reading a fitted line backwards, there with prediction intervals); Draper & Smith,
*Applied Regression Analysis* (3rd ed., 1998), section 3.2 (inverse regression, the straight-line case);
Abramowitz & Stegun, *Handbook of Mathematical Functions* (1964), 26.7.3-26.7.4 (Student's t).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

WEEK_S = 604_800.0
#: Two-sided level of the intervals: 80 %, the true value below the low end 1 time in 10, above the high end 1 in 10.
CONFIDENCE = 0.80
#: A week seen for less than this share of its length is left out of the fit: five days of seven.
#: A week missing more may have missed its busiest day, and its peak would read as a drop.
MIN_COVERAGE_RATIO = 5 / 7
#: The fit uses the last this many weeks: long enough for 6 degrees of freedom, short enough that a
#: change of trend shows within weeks (two months of weekly reports).
HISTORY_WEEKS = 8
#: The least weeks a fit with an uncertainty needs (one degree of freedom left for the scatter).
MIN_FIT_WEEKS = 3
#: Weeks ahead the trend is read at most: half a year, a GPU purchase's lead time; a straight line
#: through two months of peaks says nothing trustworthy past it.
HORIZON_WEEKS = 26.0
#: Growth at or below this share of the peak a week is noise, not growth: one more request's worth of
#: tokens at the peak moves it by about this much on a busy engine (the figure of
#: ``sidecar.report.figures.GROWTH_NOISE_RATIO``, per period there).
GROWTH_NOISE_RATIO = 0.01

GROWING = "growing"
NOT_GROWING = "not growing"
AT_CAPACITY = "at capacity"
NO_PREVIOUS_DATA = "no previous data"
NOT_ENOUGH_HISTORY = "not enough history"
#: How the growth was measured.
LEAST_SQUARES, TWO_POINTS, NO_FIT = "least squares", "two points", "none"


@dataclass(frozen=True)
class WeeklyPeak:
    """One week of one model: its peak demand and how much of the week it was seen."""

    week_start: float  # Unix seconds
    peak_demand_tokens: float  # the week's largest summed kvcache_demand_tokens of the model
    coverage_ratio: float = 1.0  # share of the week's steps with a sample of the model's demand (0-1)


def weekly_peak(week_start: float, demand_tokens: Sequence[float]) -> WeeklyPeak | None:
    """A week's :class:`WeeklyPeak` from the model's per-step summed demand (NaN: no sample that step).

    The peak is the largest sample, the coverage the share of steps that have one. None when no step
    has one: a week without data is absent from the history, never a week of zero demand.
    """
    if not demand_tokens:
        raise ValueError("weekly_peak: no steps (the week's demand series is empty)")
    seen = [d for d in demand_tokens if not math.isnan(d)]
    if not seen:
        return None
    return WeeklyPeak(week_start, max(seen), len(seen) / len(demand_tokens))


@dataclass(frozen=True)
class GrowthTrend:
    """The growth of a model's weekly peak demand, and when it meets the usable capacity.

    ``weeks_until_full`` and its interval count from the latest week's start; ``None`` there means
    "not within :data:`HORIZON_WEEKS`" (or not growing). "at capacity" has 0 weeks, never a number
    beside it. The first four fields are those of ``sidecar.report.results.Growth``.
    """

    previous_peak_demand_tokens: float | None  # the latest fitted week before this one
    change_ratio: float | None  # (this week's peak − that one's) ÷ that one's
    weeks_until_full: float | None
    #: "growing", "not growing", "at capacity", "no previous data", "not enough history"
    verdict: str
    method: str  # "least squares", "two points" (fewer than MIN_FIT_WEEKS weeks), "none"
    weeks_fitted: int
    weeks_skipped: int  # weeks left out: seen for less than MIN_COVERAGE_RATIO of their length
    growth_tokens_per_week: float | None = None
    growth_standard_error_tokens_per_week: float | None = None  # None: two points have none
    growth_low_tokens_per_week: float | None = None  # the CONFIDENCE interval of the growth
    growth_high_tokens_per_week: float | None = None
    #: growth ÷ the trend's value at the latest week (two points: ÷ the earlier week's peak, as change_ratio)
    growth_ratio_per_week: float | None = None
    trend_peak_demand_tokens: float | None = None  # the trend's value at the latest week
    weeks_until_full_low: float | None = None  # the fast end: the line's upper band meets the capacity
    weeks_until_full_high: float | None = None  # the slow end; None: not within HORIZON_WEEKS
    confidence: float = CONFIDENCE
    horizon_weeks: float = HORIZON_WEEKS  # the weeks ahead the trend was read at most
    usable_tokens: float | None = None  # the capacity it was read against (None: not known)


# --- Student's t ------------------------------------------------------------------------------------------


def t_central_probability(t: float, df: int) -> float:
    """``P(|T| ≤ t)`` for Student's t with ``df`` degrees of freedom (``A(t|ν)``), exactly.

    Abramowitz & Stegun 26.7.3 (odd ν) and 26.7.4 (even ν), with ``θ = atan(t / √ν)``:
    odd: ``(2/π)·(θ + sin θ·(cos θ + ⅔cos³θ + … + (2·4…(ν−3))/(3·5…(ν−2))·cos^(ν−2) θ))`` (``2θ/π`` for ν = 1);
    even: ``sin θ·(1 + ½cos²θ + (1·3)/(2·4)·cos⁴θ + … + (1·3…(ν−3))/(2·4…(ν−2))·cos^(ν−2) θ)``.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"Student's t: degrees of freedom must be a positive integer, got {df!r}")
    if t < 0:
        raise ValueError(f"Student's t: A(t|ν) needs t ≥ 0, got {t!r}")
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(3, df - 1, 2):  # the power of cos θ: 3, 5, …, ν − 2
            term *= (k - 1) / k * cos2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):  # the power of cos θ: 2, 4, …, ν − 2
        term *= (k - 1) / k * cos2
        total += term
    return math.sin(theta) * total


@functools.lru_cache(maxsize=256)
def student_t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with ``P(|T| ≤ t) = confidence``: the two-sided critical value (``t_{(1+c)/2, ν}``).

    :func:`t_central_probability` increases with ``t``, so bisection finds it to the last bits; e.g.
    ``student_t_quantile(0.80, 6) = 1.440`` and ``(0.95, 10) = 2.228`` (NIST/SEMATECH e-Handbook
    section 1.3.6.7.2, the table of critical values of Student's t).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"Student's t: confidence must be between 0 and 1, got {confidence!r}")
    low, high = 0.0, 1.0
    while t_central_probability(high, df) < confidence:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if t_central_probability(middle, df) < confidence else (low, middle)
    return high


# --- the fitted line --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """A least-squares line ``y = mean_y + slope·(x − mean_x)`` and what its intervals need.

    Montgomery, Peck & Vining section 2.2: ``slope = Sxy / Sxx``, ``Sxx = Σ(x − x̄)²``, ``Sxy = Σ(x − x̄)(y − ȳ)``;
    the residual standard deviation ``s = √(Σ(y − ŷ)² / (n − 2))`` (NaN for two points).
    """

    n: int
    mean_x: float
    mean_y: float
    slope: float
    sxx: float
    residual_sd: float

    def at(self, x: float) -> float:
        return self.mean_y + self.slope * (x - self.mean_x)

    @property
    def slope_standard_error(self) -> float:
        """``se(b) = s / √Sxx`` (Montgomery, Peck & Vining section 2.4.1)."""
        return self.residual_sd / math.sqrt(self.sxx)

    def band_half_width(self, x: float, t: float) -> float:
        """Half the width of the line's confidence band at ``x``: ``t·s·√(1/n + (x − x̄)²/Sxx)`` (section 2.4.2)."""
        return t * self.residual_sd * math.sqrt(1 / self.n + (x - self.mean_x) ** 2 / self.sxx)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """The least-squares line through the points (at least two, not all at one ``x``)."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError(f"fit_line: need two or more (x, y) pairs, got {n} x and {len(ys)} y")
    mean_x, mean_y = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line: all points share one x, so there is no slope")
    slope = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    residuals = math.fsum((y - (mean_y + slope * (x - mean_x))) ** 2 for x, y in zip(xs, ys, strict=True))
    residual_sd = math.sqrt(residuals / (n - 2)) if n > 2 else math.nan
    return Line(n, mean_x, mean_y, slope, sxx, residual_sd)


def weeks_until_line_meets(line: Line, capacity: float, t: float) -> tuple[float, float, float | None]:
    """When the line meets ``capacity``: (the line itself, the fast end, the slow end), in ``x``; slope > 0.

    The point is ``x̄ + (C − ȳ)/b``. The interval (Fieller; Draper & Smith section 3.2) is every ``x`` where the
    confidence band ``line(x) ± t·s·√(1/n + (x − x̄)²/Sxx)`` contains ``C``. With ``u = x − x̄``,
    ``d = C − ȳ``, ``q = t·se(b)`` and ``h² = t²s²/n``, the band's edges meet ``C`` where
    ``(b² − q²)·u² − 2bd·u + d² − h² = 0``; the root with ``b·u ≥ d`` is where the lower edge meets it
    (the slow end), that with ``b·u ≤ d`` where the upper edge does (the fast end). When ``b ≤ q``
    (the slope's interval includes zero) the lower edge never stays above ``C``: no slow end (None).
    The fast end is the first ``x`` from which the upper edge stays at or above ``C``.
    """
    if not line.slope > 0:
        raise ValueError(f"weeks_until_line_meets: the line must rise, its slope is {line.slope!r}")
    b, d = line.slope, capacity - line.mean_y
    q = t * line.slope_standard_error
    h2 = (t * line.residual_sd) ** 2 / line.n
    roots = _quadratic_roots(b * b - q * q, -2 * b * d, d * d - h2)
    tolerance = 1e-9 * (abs(d) + math.sqrt(h2) + 1.0)
    upper = [u for u in roots if b * u - d <= tolerance]
    lower = [u for u in roots if b * u - d >= -tolerance]
    fast = line.mean_x + max(upper) if upper else -math.inf  # no root: the band holds C everywhere
    slow = line.mean_x + max(lower) if b > q and lower else None
    return line.mean_x + d / b, fast, slow


def _quadratic_roots(a: float, b: float, c: float) -> list[float]:
    """The real roots of ``a·u² + b·u + c`` (a straight line when ``a`` is 0)."""
    if a == 0:
        return [-c / b] if b else []
    discriminant = b * b - 4 * a * c
    if discriminant < 0:
        return []
    root = math.sqrt(discriminant)
    # the form that does not subtract two near-equal numbers (Numerical Recipes section 5.6)
    q = -(b + math.copysign(root, b)) / 2
    return sorted({q / a, c / q} if q else {0.0})


# --- the verdict ------------------------------------------------------------------------------------------


def growth_trend(
    peaks: Sequence[WeeklyPeak],
    usable_tokens: float | None,
    at_capacity: bool = False,
    confidence: float = CONFIDENCE,
    history_weeks: int = HISTORY_WEEKS,
    min_coverage_ratio: float = MIN_COVERAGE_RATIO,
    horizon_weeks: float = HORIZON_WEEKS,
) -> GrowthTrend:
    """The growth of ``peaks`` (oldest first, the last one this week) and the weeks until it meets ``usable_tokens``.

    - "at capacity" (0 weeks) when ``at_capacity`` (a pod of the model already met its own capacity)
      or this week's peak met ``usable_tokens``: it wins over any "full in N weeks";
    - "no previous data" when no week before this one was given;
    - "not enough history" when fewer than :data:`MIN_FIT_WEEKS` weeks are seen enough: with two, the
      two-point figure of the weekly report before this fit (``(C − peak) ÷ (peak − previous)``
      periods), without an uncertainty; with one, nothing;
    - else a least-squares line over the last ``history_weeks`` weeks seen enough: "growing" when its
      growth's interval lies above zero and the growth is more than :data:`GROWTH_NOISE_RATIO` of the
      trend a week, with the weeks until full and their interval (:func:`weeks_until_line_meets`),
      each None past ``horizon_weeks``; otherwise "not growing".

    ``usable_tokens`` None (capacity not known): the growth without weeks until full.
    """
    _check(peaks, usable_tokens, confidence, history_weeks, min_coverage_ratio, horizon_weeks)
    latest = peaks[-1]
    fitted = [p for p in peaks if p.coverage_ratio >= min_coverage_ratio][-history_weeks:]
    skipped = sum(1 for p in peaks if p.coverage_ratio < min_coverage_ratio)
    before = [p for p in fitted if p is not latest]
    previous = before[-1] if before else None
    change = _change(latest.peak_demand_tokens, previous.peak_demand_tokens if previous else None)
    base = GrowthTrend(
        previous_peak_demand_tokens=previous.peak_demand_tokens if previous else None,
        change_ratio=change,
        weeks_until_full=None,
        verdict=NOT_ENOUGH_HISTORY,
        method=NO_FIT,
        weeks_fitted=len(fitted),
        weeks_skipped=skipped,
        confidence=confidence,
        horizon_weeks=horizon_weeks,
        usable_tokens=usable_tokens,
    )
    if len(fitted) >= MIN_FIT_WEEKS:
        trend = _least_squares(base, fitted, latest, usable_tokens, confidence, horizon_weeks)
    elif len(fitted) == 2:
        trend = _two_points(base, fitted, latest, usable_tokens, horizon_weeks)
    else:
        trend = base
    if len(peaks) == 1:
        trend = replace(trend, verdict=NO_PREVIOUS_DATA)
    if at_capacity or (usable_tokens is not None and latest.peak_demand_tokens >= usable_tokens):
        trend = replace(
            trend, verdict=AT_CAPACITY, weeks_until_full=0.0, weeks_until_full_low=0.0, weeks_until_full_high=0.0
        )
    return trend


def _check(
    peaks: Sequence[WeeklyPeak],
    usable_tokens: float | None,
    confidence: float,
    history_weeks: int,
    min_coverage_ratio: float,
    horizon_weeks: float,
) -> None:
    """Every problem with the input at once, each naming the value (a caller's bug, never the data's)."""
    problems = []
    if not peaks:
        problems.append("no weeks: give at least this week's peak")
    for i, p in enumerate(peaks):
        if not (math.isfinite(p.peak_demand_tokens) and p.peak_demand_tokens >= 0):
            problems.append(f"peaks[{i}].peak_demand_tokens: need a finite number ≥ 0, got {p.peak_demand_tokens!r}")
        if not 0 <= p.coverage_ratio <= 1:
            problems.append(f"peaks[{i}].coverage_ratio: need 0 to 1, got {p.coverage_ratio!r}")
        if not math.isfinite(p.week_start):
            problems.append(f"peaks[{i}].week_start: not a time, got {p.week_start!r}")
        elif i and not p.week_start > peaks[i - 1].week_start:
            problems.append(f"peaks[{i}].week_start: weeks must be oldest first with no repeats ({p.week_start!r})")
    if usable_tokens is not None and not (math.isfinite(usable_tokens) and usable_tokens > 0):
        problems.append(f"usable_tokens: need a positive number or None, got {usable_tokens!r}")
    if not 0 < confidence < 1:
        problems.append(f"confidence: need a share between 0 and 1, got {confidence!r}")
    if history_weeks < MIN_FIT_WEEKS:
        problems.append(f"history_weeks: need at least {MIN_FIT_WEEKS}, got {history_weeks!r}")
    if not 0 <= min_coverage_ratio <= 1:
        problems.append(f"min_coverage_ratio: need 0 to 1, got {min_coverage_ratio!r}")
    if not horizon_weeks > 0:
        problems.append(f"horizon_weeks: need a positive number, got {horizon_weeks!r}")
    if problems:
        raise ValueError("growth_trend: " + "; ".join(problems))


def _change(peak: float, previous: float | None) -> float | None:
    return (peak - previous) / previous if previous else None


def _within(weeks: float | None, horizon_weeks: float) -> float | None:
    """Weeks from now (0 at the least), None past the horizon or never."""
    if weeks is None or weeks > horizon_weeks:
        return None
    return max(0.0, weeks)


def _two_points(
    base: GrowthTrend,
    fitted: Sequence[WeeklyPeak],
    latest: WeeklyPeak,
    usable_tokens: float | None,
    horizon_weeks: float,
) -> GrowthTrend:
    """The weekly report's figure before the fit: the straight line through the last two weeks seen.

    Its weeks until full count from the latest week, as the fit's do (later than ``now`` when the
    latest week was seen too little to count).
    """
    before, now = fitted
    weeks_apart = (now.week_start - before.week_start) / WEEK_S
    elapsed = (latest.week_start - now.week_start) / WEEK_S
    growth = (now.peak_demand_tokens - before.peak_demand_tokens) / weeks_apart
    ratio = growth / before.peak_demand_tokens if before.peak_demand_tokens else None
    weeks = None
    if usable_tokens is not None and ratio is not None and ratio > GROWTH_NOISE_RATIO:
        weeks = _within((usable_tokens - now.peak_demand_tokens) / growth - elapsed, horizon_weeks)
    return replace(
        base,
        method=TWO_POINTS,
        weeks_fitted=2,
        growth_tokens_per_week=growth,
        growth_ratio_per_week=ratio,
        trend_peak_demand_tokens=now.peak_demand_tokens,
        weeks_until_full=weeks,
    )


def _least_squares(
    base: GrowthTrend,
    fitted: Sequence[WeeklyPeak],
    latest: WeeklyPeak,
    usable_tokens: float | None,
    confidence: float,
    horizon_weeks: float,
) -> GrowthTrend:
    """The least-squares line over the fitted weeks, ``x`` in weeks from the latest week's start."""
    xs = [(p.week_start - latest.week_start) / WEEK_S for p in fitted]
    line = fit_line(xs, [p.peak_demand_tokens for p in fitted])
    t = student_t_quantile(confidence, line.n - 2)
    se = line.slope_standard_error
    now = line.at(0.0)
    ratio = line.slope / now if now > 0 else None
    low = line.slope - t * se
    growing = low > 0 and (ratio is None or ratio > GROWTH_NOISE_RATIO)
    trend = replace(
        base,
        verdict=GROWING if growing else NOT_GROWING,
        method=LEAST_SQUARES,
        weeks_fitted=line.n,
        growth_tokens_per_week=line.slope,
        growth_standard_error_tokens_per_week=se,
        growth_low_tokens_per_week=low,
        growth_high_tokens_per_week=line.slope + t * se,
        growth_ratio_per_week=ratio,
        trend_peak_demand_tokens=now,
    )
    if not growing or usable_tokens is None:
        return trend
    point, fast, slow = weeks_until_line_meets(line, usable_tokens, t)
    return replace(
        trend,
        weeks_until_full=_within(point, horizon_weeks),
        weeks_until_full_low=_within(fast, horizon_weeks),
        weeks_until_full_high=_within(slow, horizon_weeks),
    )


# --- in words ---------------------------------------------------------------------------------------------


def growth_text(trend: GrowthTrend) -> str:
    """The trend in one phrase for the report's tables; "already full" never beside a number of weeks.

    E.g. ``growing +3.7%/week (80%: +3.5 to +3.9%), full in 3.0 weeks (80%: 2.7 to 3.4 weeks), over 8 weeks``,
    ``not growing: -0.6%/week (80%: -4.6 to +3.5%), over 8 weeks``,
    ``not enough history (2 weeks): +4.0%/week on two points, full in 24.0 weeks``.
    """
    if trend.verdict == AT_CAPACITY:
        return "already full"
    if trend.verdict == NO_PREVIOUS_DATA:
        return NO_PREVIOUS_DATA
    if trend.method == NO_FIT:
        return f"{NOT_ENOUGH_HISTORY} ({trend.weeks_fitted} week{'s' if trend.weeks_fitted != 1 else ''} seen enough)"
    if trend.method == TWO_POINTS:
        text = f"{NOT_ENOUGH_HISTORY} (2 weeks): {_per_week(trend.growth_ratio_per_week)} on two points"
        return text + (f", full in {_weeks(trend.weeks_until_full)}" if trend.weeks_until_full is not None else "")
    level = f"{trend.confidence * 100:.0f}%"
    growth = f"{_per_week(trend.growth_ratio_per_week)} ({level}: {_range(trend)})"
    over = f"over {trend.weeks_fitted} weeks" + (f", {trend.weeks_skipped} skipped" if trend.weeks_skipped else "")
    if trend.verdict != GROWING:
        noise = (trend.growth_low_tokens_per_week or 0.0) > 0
        return f"not growing: {growth}{', within noise' if noise else ''}, {over}"
    if trend.usable_tokens is None:
        return f"growing {growth}, {over}"
    later = f"over {trend.horizon_weeks:.0f} weeks"
    if trend.weeks_until_full is None and trend.weeks_until_full_low is None:
        return f"growing {growth}, not full within {trend.horizon_weeks:.0f} weeks, {over}"
    point = _weeks(trend.weeks_until_full) if trend.weeks_until_full is not None else later
    fast = f"{trend.weeks_until_full_low:.1f}" if trend.weeks_until_full_low is not None else "?"
    slow = _weeks(trend.weeks_until_full_high) if trend.weeks_until_full_high is not None else later
    return f"growing {growth}, full in {point} ({level}: {fast} to {slow}), {over}"


def _weeks(weeks: float) -> str:
    return f"{weeks:.1f} weeks"


def _per_week(ratio: float | None) -> str:
    return f"{ratio * 100:+.1f}%/week" if ratio is not None else "growth unknown"


def _range(trend: GrowthTrend) -> str:
    now = trend.trend_peak_demand_tokens
    low, high = trend.growth_low_tokens_per_week, trend.growth_high_tokens_per_week
    if not now or now <= 0 or low is None or high is None:
        return "—"
    return f"{low / now * 100:+.1f} to {high / now * 100:+.1f}%"
