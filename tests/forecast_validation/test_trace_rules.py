"""The paging rules on starts under load and on trace runs: the start guard, keep_firing_for, the trace figures.

The replays run through the daemon's own code (:mod:`sidecar.forecast_validation`), as
``bench/forecast.py`` does; docs/forecast-validation.md ("Real traffic") has the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.forecast_validation import (
    FORECAST_RULE,
    FORECAST_SPECIFIED,
    GAUGES,
    PAGE_BURST_RULE,
    PAGE_MEMORY_RULE,
    PAGE_RULE,
    START,
    TTF,
    USAGE,
    WATERMARK_CLASSES,
    Rule,
    Trace,
    any_firing,
    burst_rule,
    collect_trace,
    firings,
    gt,
    preemption_episodes,
    replay_run,
    samples_above,
    trace_outcome,
    warned_by,
    watermark_class,
    with_preroll,
)
from sidecar.replay import Replay, replay_config
from sidecar.simulator import LIBRARY, SCENARIOS, SimConfig, Simulator
from sidecar.simulator.trace import TracePlay, load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"

pytestmark = pytest.mark.timeout(180)


def _hand(n: int, step: float = 5.0) -> Trace:
    tr = Trace("hand", 0, "-")
    tr.t = [step * i for i in range(1, n + 1)]
    tr.g = {name: [None] * n for name in GAUGES}
    return tr


def test_the_engine_start_is_the_first_scrape_then_the_scrape_after_a_restart():
    # the demo "restart" scenario: steady load, the process restarts at 300 s and is down 20 s
    r = Replay(Simulator(SimConfig(), "restart", seed=1), replay_config())
    seen = {}
    r.run_until(400.0, every=5.0, on_sample=lambda r: seen.__setitem__(r.now, r.gauge(START)))
    assert seen[5.0] == 5.0 and seen[295.0] == 5.0
    # down from 300 s to 320 s (503: the gauges stay until scrape.staleness), back at 320 s with its
    # prompt_tokens counter from 0: that scrape is the new start
    assert seen[320.0] == 320.0 and seen[400.0] == 320.0


def test_a_new_server_under_load_does_not_page():
    """Scale-out: a replica that starts into a steady high load (steady-high, never preempts) from empty."""
    sim = Simulator(SimConfig(), LIBRARY["steady-high"], seed=1)
    (tr,) = replay_run(sim, "scale-out", 1, [{}], end_s=900.0, preroll_s=0.0)
    assert tr.preemptions == 0
    assert firings(FORECAST_SPECIFIED, tr) != []  # without the guard: a page about a server filling up
    assert firings(FORECAST_RULE, tr) == []


def test_a_restart_under_load_does_not_page_until_the_cache_really_fills():
    """restart-mid-ramp: without the guard the refill after the restart paged, before any preemption."""
    scenario = with_preroll(LIBRARY["restart-mid-ramp"], 600.0)
    restart = 600.0 + 15 * 60.0
    sim = Simulator(SimConfig(), scenario, seed=1)
    (tr,) = replay_run(sim, "restart", 1, [{}], end_s=restart + 12 * 60.0, preroll_s=600.0)
    back = restart - 600.0 + 20.0  # trace time of the first scrape of the new process
    unguarded = [s for s, _ in firings(FORECAST_SPECIFIED, tr) if back <= s < back + 600.0]
    first = tr.first_preemption if tr.first_preemption is not None else tr.t[-1]
    assert unguarded and unguarded[0] < first  # the refill read as "full soon"
    assert all(s >= back + 600.0 for s, _ in firings(FORECAST_RULE, tr))


def test_keep_firing_for_holds_a_page_through_a_dip_and_ends_it_after():
    tr = _hand(120)  # 10 minutes, every 5 s
    usage = [0.5] * 20 + [0.95] * 40 + [0.5] * 4 + [0.95] * 20 + [0.5] * 36
    tr.g[USAGE] = list(usage)
    bare = Rule("bare", "u > 0.9", 30, gt(USAGE, 0.9))
    kept = Rule("kept", "u > 0.9", 30, gt(USAGE, 0.9), keep_s=60)
    assert firings(bare, tr) == [(135.0, 300.0), (355.0, 420.0)]
    # the 20 s dip is held; after the last true evaluation (420 s) it fires while less than 60 s have
    # passed since the first false one (425 s): up to 480 s
    assert firings(kept, tr) == [(135.0, 480.0)]


def test_episodes_warnings_and_pages_per_saturating_hour():
    tr = _hand(720)  # an hour
    tr.preemption_times = [1000.0, 1050.0, 1100.0, 2000.0, 2100.0]  # 2 episodes (900 s apart > 2 min)
    tr.first_preemption = 1000.0
    assert preemption_episodes(tr) == [(1000.0, 1100.0), (2000.0, 2100.0)]
    tr.g[USAGE] = [0.95 if 400 <= t <= 1050 else 0.5 for t in tr.t]
    page = Rule("page", "u > 0.9", 0, gt(USAGE, 0.9))
    o = trace_outcome([page], tr)
    assert o.lead_min == pytest.approx(10.0)  # fires at 400 s, first preemption at 1000 s
    # the second episode (2000 s) had no page in the 15 minutes before it: the page ended at 1050 s
    assert (o.page_episodes, o.preemption_episodes, o.warned, o.saturating_hours) == (1, 2, 1, 1)
    assert o.pages_per_saturating_hour == 1.0 and not o.false_page
    # paged from 400 s to 1050 s (a 5-s evaluation each); it ended at its last preemption
    assert o.paged_min == pytest.approx((1050 - 400 + 5) / 60) and o.outlives_min == (0.0,)
    # two rules firing at overlapping times are one page episode for the pager
    tr.g[TTF] = [100.0 if 1055 <= t <= 1900 else None for t in tr.t]
    soon = Rule("soon", "ttf < 900", 0, lambda tr, i: tr.g[TTF][i] is not None)
    assert any_firing([page, soon], tr) == [(400.0, 1900.0)]
    both = trace_outcome([page, soon], tr)
    assert (both.page_episodes, both.warned) == (1, 2)  # the page goes on to 1900 s
    assert both.outlives_min == pytest.approx(((1900 - 1100) / 60,))  # 800 s past its last preemption (1100 s)


def test_a_run_without_preemptions_that_pages_is_a_false_page():
    tr = _hand(120)
    tr.g[USAGE] = [0.95] * 120
    o = trace_outcome([Rule("page", "u > 0.9", 0, gt(USAGE, 0.9))], tr)
    assert o.false_page and o.lead_min is None and o.pages_per_saturating_hour is None


def test_the_demo_restart_scenario_is_the_one_the_guard_is_checked_on():
    assert SCENARIOS["restart"].restart_at == 300.0 and SCENARIOS["restart"].restart_downtime_s == 20.0


def test_the_candidate_page_with_memory_remembers_a_preemption_for_30_minutes():
    """PAGE_MEMORY_RULE (measured, not shipped), at 5-s samples: a 2-minute burst that preempts, then one
    sample above 0.9 at 33m30s pages (21 minutes after the last preemption) where the shipped page does
    not, and one at 46m30s does not (the harness's ranges are Prometheus 3's, (t - d, t])."""
    tr = _hand(720)  # an hour
    peaks = {33 * 60.0 + 30, 46 * 60.0 + 30}
    tr.g[USAGE] = [0.97 if 630 <= t <= 750 else 0.95 if t in peaks else 0.5 for t in tr.t]
    (alone,) = firings(PAGE_RULE, tr)  # the shipped page: only the burst pages ...
    assert alone[0] == 660.0  # ... at its 7th sample above 0.9 (> 5 % of 120)
    tr.counter_times = [640.0, 690.0]  # preempting during the burst
    (burst, second) = firings(PAGE_MEMORY_RULE, tr)
    assert burst[0] == 640.0  # at the first preemption, with the usage above 0.9
    assert second == (2010.0, 2010.0 + 60.0 + 300.0 - 5.0)  # the peak, then [1m] and keep_firing_for
    # 46m30s is 33 minutes after the last preemption: no page
    assert all(s < 2790.0 for s, _ in firings(PAGE_MEMORY_RULE, tr))
    # the memory is the counter's: a preemption in the warm-up (negative time) counts as well
    tr.counter_times = [-60.0]
    tr.g[USAGE] = [0.95 if t == 600.0 else 0.5 for t in tr.t]
    assert firings(PAGE_MEMORY_RULE, tr) == [(600.0, 600.0 + 60.0 + 300.0 - 5.0)]
    tr.counter_times = [-1300.0]  # more than 30 minutes before
    assert firings(PAGE_MEMORY_RULE, tr) == []


def test_the_counter_moves_of_the_warm_up_are_kept_apart_from_the_runs_preemptions():
    """The synthetic Mooncake sample on a pool that preempts while it warms up: the moves before t = 0 are
    in counter_times (what increase() sees), not in preemption_times (what the figures count)."""
    play = TracePlay(load_trace(str(FIXTURES / "mooncake-synthetic-3min.jsonl")))
    config = SimConfig(
        max_model_len=16384, max_num_batched_tokens=16384, step_seconds_per_token=2e-6, num_gpu_blocks_override=1500
    )
    (tr,) = collect_trace(play, config, [{}], name="warm", preroll_s=60.0)
    assert tr.preroll_preemptions > 0 and any(m <= 0 for m in tr.counter_times)
    assert tr.preemption_times and tr.preemption_times == [m for m in tr.counter_times if m > 0]


def test_episodes_are_classed_by_what_usage_did_in_the_15_minutes_before_them():
    """watermark_class reads the 5-s samples in [start - 15 min, start): the sample at which the counter moved
    is not before it, and fewer than a minute of samples is a run that began saturated."""
    at_start, never, one, many = WATERMARK_CLASSES
    tr = _hand(720)  # an hour, every 5 s from 5 s
    tr.g[USAGE] = [0.5] * 720
    assert watermark_class(tr, 60.0) == at_start  # 11 samples before it (5..55 s)
    assert watermark_class(tr, 65.0) == never  # 12
    # a sample above 0.9 exactly 15 minutes before the start counts; one just outside does not
    tr.g[USAGE][tr.t.index(1000.0)] = 0.95
    assert watermark_class(tr, 1900.0) == one
    assert watermark_class(tr, 1905.0) == never
    # the start's own sample is not "before": its usage is what preempted
    assert watermark_class(tr, 1000.0) == never
    tr.g[USAGE][tr.t.index(1500.0)] = 0.91
    assert watermark_class(tr, 1900.0) == many
    assert watermark_class(tr, 1505.0) == many and watermark_class(tr, 1500.0) == one
    # exactly 0.9 is not above it; an unpublished sample is not above it either
    tr.g[USAGE][tr.t.index(1500.0)] = 0.9
    tr.g[USAGE][tr.t.index(1600.0)] = None
    assert watermark_class(tr, 1900.0) == one
    assert samples_above(tr) == 1


def test_warned_is_a_firing_at_the_start_or_in_the_15_minutes_before():
    assert warned_by([(100.0, 200.0)], 1100.0)  # ended exactly 15 min before
    assert not warned_by([(100.0, 195.0)], 1100.0)
    assert warned_by([(1100.0, 1100.0)], 1100.0)  # fires at the start
    assert not warned_by([(1105.0, 1200.0)], 1100.0)  # after it


def test_the_burst_headroom_arm_reads_the_gauge_its_for_and_the_usage_gate():
    tr = _hand(120)  # 10 minutes
    burst = "kvcache_burst_headroom_ratio"
    # headroom 0.05 from 100 s to 200 s, unpublished before 60 s (the gauge's first minute)
    tr.g[burst] = [None if t < 60 else 0.05 if 100 <= t <= 200 else 0.6 for t in tr.t]
    tr.g[USAGE] = [0.85 if 150 <= t <= 160 else 0.5 for t in tr.t]
    bare = burst_rule(0.1, 0.0)
    assert bare.expr == "kvcache_burst_headroom_ratio < 0.1" and bare.keep_s == 300.0
    assert firings(bare, tr) == [(100.0, 500.0)]  # held 5 minutes past 200 s: up to 500 s
    assert firings(burst_rule(0.1, 60.0), tr) == [(160.0, 500.0)]
    assert firings(burst_rule(0.1, 120.0), tr) == []  # true for 100 s only
    gated = burst_rule(0.1, 0.0, 0.8)
    assert gated.expr.endswith("and\nmax_over_time(kvcache_usage_ratio[1m]) > 0.8")
    # usage above 0.8 at 150-160 s, remembered by [1m] up to 210 s; the headroom is low only to 200 s
    assert firings(gated, tr) == [(150.0, 500.0)]
    assert firings(burst_rule(0.05, 0.0), tr) == []  # strictly below
    # the candidate measured on the traces (not shipped): as written on the page of docs/forecast-validation.md
    assert PAGE_BURST_RULE.expr == (
        "kvcache_burst_headroom_ratio < 0.5\nand\nmax_over_time(kvcache_usage_ratio[1m]) > 0.8"
    )
    assert (PAGE_BURST_RULE.for_s, PAGE_BURST_RULE.keep_s) == (30.0, 300.0)
