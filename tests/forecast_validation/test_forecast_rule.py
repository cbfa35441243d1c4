"""The forecast alert fires before the first preemption on a ramp and stays quiet on steady-low.

Runs the replay and rule evaluation that ``bench/forecast.py`` reports
(:mod:`sidecar.forecast_validation`: 10-minute pre-roll at the scenario's initial rate, a scrape
and a rule evaluation every 5 simulated seconds, Prometheus ``for:`` semantics) with the rule and
forecast settings the bench reports, so the test and the results table of
docs/forecast-validation.md cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sidecar.forecast_validation import (
    FORECAST_FLAGS,
    FORECAST_RULE,
    FORECAST_SPECIFIED,
    GAUGES,
    PAGE_QUANTILE,
    PAGE_RULE,
    PAGE_WINDOW_S,
    STATIC_ALERT,
    STATIC_RULE,
    TTF,
    USAGE,
    Trace,
    collect,
    firings,
    fmt_lead,
    outcome,
)
from sidecar.units import parse_duration

pytestmark = pytest.mark.timeout(120)


def _one(scenario: str, seed: int) -> Trace:
    (trace,) = collect(scenario, seed, [FORECAST_FLAGS])
    return trace


def test_for_semantics_on_a_hand_made_series():
    """``for: 2m`` every 5 s: fires at the 25th consecutive true evaluation; one false one resets it."""
    tr = Trace("hand", 0, "-")
    tr.t = [5.0 * i for i in range(1, 80)]
    ttf = [100.0] * 30 + [None] + [100.0] * 48  # the gauge missing once at t=155 s
    tr.g = {n: [None] * len(tr.t) for n in GAUGES}
    tr.g[TTF] = ttf
    eps = firings(FORECAST_SPECIFIED, tr)
    assert eps == [(125.0, 150.0), (160.0 + 120.0, tr.t[-1])]


def test_fires_before_the_first_preemption_on_a_ramp():
    trace = _one("ramp-10m", 1)
    fc = outcome(FORECAST_RULE, trace)
    static = outcome(STATIC_RULE, trace)
    print(
        f"\nramp-10m seed 1: first preemption {trace.first_preemption / 60:.1f} min; forecast lead "
        f"{fmt_lead(fc.lead_min)} min, static lead {fmt_lead(static.lead_min)} min"
    )
    assert trace.preemptions > 0 and trace.first_preemption is not None
    assert fc.lead_min is not None and fc.lead_min > 0
    assert fc.firing_at_preemption
    assert static.lead_min is not None and fc.lead_min > static.lead_min


def test_quiet_on_steady_low():
    trace = _one("steady-low", 1)
    assert trace.preemptions == 0
    published = [v for v in trace.g[TTF] if v is not None]
    assert len(published) > 0.9 * len(trace.t)  # the forecast was there to fire, it did not
    assert firings(FORECAST_RULE, trace) == []
    assert firings(STATIC_RULE, trace) == []


def test_the_bench_evaluates_the_rules_that_are_shipped():
    """The validation figures describe alerts/kvcache.rules.yaml, not a copy that could drift."""
    shipped = Path(__file__).resolve().parents[2] / "alerts" / "kvcache.rules.yaml"
    rules = [r for g in yaml.safe_load(shipped.read_text())["groups"] for r in g["rules"] if "alert" in r]

    def shipped_rule(name, severity):
        (rule,) = [r for r in rules if r["alert"] == name and r["labels"]["severity"] == severity]
        return rule["expr"], parse_duration(rule.get("for", "0s")), parse_duration(rule.get("keep_firing_for", "0s"))

    assert (FORECAST_RULE.expr, FORECAST_RULE.for_s, FORECAST_RULE.keep_s) == shipped_rule(
        "KVCacheFullSoon", "critical"
    )
    assert (PAGE_RULE.expr, PAGE_RULE.for_s, PAGE_RULE.keep_s) == shipped_rule("KVCacheAlmostFull", "critical")
    # ... and the previous page, which the tables compare with, is no longer what is shipped
    assert STATIC_ALERT.expr != shipped_rule("KVCacheAlmostFull", "critical")[0]


def test_the_page_is_evaluated_with_the_window_and_quantile_of_its_expression():
    """PAGE_RULE's condition uses the window and quantile its expression says: 30 s above 0.9 in 10
    minutes (5 %) pages, 25 s does not, and the page outlives the last peak by the window, then
    keep_firing_for."""
    assert f"quantile_over_time({PAGE_QUANTILE:g}," in PAGE_RULE.expr
    assert f"[{PAGE_WINDOW_S / 60:g}m]" in PAGE_RULE.expr
    tr = Trace("hand", 0, "-")
    tr.t = [5.0 * i for i in range(0, 400)]
    tr.g = {n: [None] * len(tr.t) for n in GAUGES}

    def burst(samples: int) -> list[tuple[float, float]]:
        # 0.5 for 10 minutes, then `samples` scrapes at 0.95, then 0.5 again
        tr.g[USAGE] = [0.95 if 120 <= i < 120 + samples else 0.5 for i in range(len(tr.t))]
        return firings(PAGE_RULE, tr)

    assert burst(5) == []  # 25 s: 5 of 120 samples above, under 5 %
    ((start, end),) = burst(7)  # 35 s: 7 of 120 samples above
    assert start == tr.t[126]  # no for:, fires on the 7th sample above
    # the quantile drops once the first of the burst's samples leaves the 10-minute window,
    # then keep_firing_for holds the page 5 more minutes
    assert end == pytest.approx(tr.t[120] + PAGE_WINDOW_S + PAGE_RULE.keep_s - 5.0, abs=5.0)
