"""The paging rules on starts under load and on trace runs: the start guard, keep_firing_for, the trace figures.

The replays run through the daemon's own code (:mod:`sidecar.forecast_validation`), as
``bench/forecast.py`` does; docs/forecast-validation.md ("Real traffic") has the figures.
"""

from __future__ import annotations

import pytest

from sidecar.forecast_validation import (
    FORECAST_RULE,
    FORECAST_SPECIFIED,
    GAUGES,
    START,
    TTF,
    USAGE,
    Rule,
    Trace,
    any_firing,
    firings,
    gt,
    preemption_episodes,
    replay_run,
    trace_outcome,
    with_preroll,
)
from sidecar.replay import Replay, replay_config
from sidecar.simulator import LIBRARY, SCENARIOS, SimConfig, Simulator

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
    # two rules firing at overlapping times are one page episode for the pager
    tr.g[TTF] = [100.0 if 1055 <= t <= 1900 else None for t in tr.t]
    soon = Rule("soon", "ttf < 900", 0, lambda tr, i: tr.g[TTF][i] is not None)
    assert any_firing([page, soon], tr) == [(400.0, 1900.0)]
    both = trace_outcome([page, soon], tr)
    assert (both.page_episodes, both.warned) == (1, 2)  # the page goes on to 1900 s


def test_a_run_without_preemptions_that_pages_is_a_false_page():
    tr = _hand(120)
    tr.g[USAGE] = [0.95] * 120
    o = trace_outcome([Rule("page", "u > 0.9", 0, gt(USAGE, 0.9))], tr)
    assert o.false_page and o.lead_min is None and o.pages_per_saturating_hour is None


def test_the_demo_restart_scenario_is_the_one_the_guard_is_checked_on():
    assert SCENARIOS["restart"].restart_at == 300.0 and SCENARIOS["restart"].restart_downtime_s == 20.0
