"""Lead time and false pages of alert rules on replayed simulator runs, evaluated as Prometheus does.

What ``bench/forecast.py`` measures and ``tests/forecast_validation`` checks, in one place so
that the figures and the tests cannot disagree (method and results: docs/forecast-validation.md).

**Traces.** :func:`collect` replays one scenario of the fixed library
(``sidecar.simulator.LIBRARY``) in simulated time through the daemon's own code
(:mod:`sidecar.replay`: pre-filtered parse, vLLM adapter, ``ingest_success`` with the
capacity and forecast layers), one scrape every :data:`STEP_S` simulated seconds, after a
pre-roll at the scenario's initial rate (:func:`with_preroll`), and records the sidecar's
gauges as Prometheus would store them (:class:`Trace`).

**Rules.** :func:`firings` evaluates a :class:`Rule` every :data:`STEP_S` seconds:

- ``for:`` semantics: the alert becomes *pending* at the first evaluation where
  its expression has a result, and *fires* at the first evaluation at least
  ``for`` after that, provided every evaluation in between had a result; an
  evaluation without a result (condition false, or the gauge not published)
  resets it (Prometheus docs, "Alerting rules": ``for``; rules/alerting.go).
- ``max_over_time(x[d])`` / ``min_over_time(x[d])`` take the samples in ``(t − d, t]``.

**Outcomes.** Per run (:func:`outcome`): *lead time* = first preemption − first firing, in
simulated minutes (negative when the alert came late; ``n/a`` when the run never preempts),
and a *false page* = the alert fired in a run without any preemption. The first preemption
is ground truth: the first sample at which the simulator's preemption counter (summed over
restarts) has moved.

The rule whose figures are reported is :data:`FORECAST_RULE`; ``alerts/`` (``KVCacheFullSoon``)
must use exactly that expression and ``for``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .generations import Generation
from .replay import Pipeline, replay_config
from .settings import default
from .simulator import LIBRARY, Scenario, SimConfig, Simulator

#: Scrape and rule-evaluation interval, simulated seconds (the sidecar's default scrape interval).
STEP_S: float = default("scrape.interval")

#: The library in the order of the results table (docs/forecast-validation.md), which is the
#: library's own order; diurnal-day is 24 simulated hours, so one seed.
SCENARIOS: tuple[str, ...] = tuple(LIBRARY)
RAMPS = ("ramp-10m", "ramp-30m", "ramp-90m")
SINGLE_SEED = ("diurnal-day",)
#: Runs that end at or above saturation go on this long past the scenario's duration (the
#: profile holds its last rate), so that a late rule still fires and gets a (negative) lead
#: instead of a miss.
TAIL_S = 600.0
TAILED = RAMPS + ("restart-mid-ramp", "shared-prefix-heavy")
#: Pre-roll: every run first serves the scenario's initial arrival rate for this long, so the
#: scenario proper starts from a server already at that level (a ramp "from 20%" starts at 20%,
#: not from an empty cache) and the forecast window is full. Firings and preemptions are counted
#: from the end of the pre-roll; a run that preempts during the pre-roll is reported as such.
#: ``preroll_s=0`` (``bench/forecast.py --cold-start``) runs without it: the cache fills from empty at
#: t = 0, as after a restart.
PREROLL_S = 600.0

#: The ``--forecast.*`` flags of ``kv-sidecar run`` the bench runs with (arguments of
#: :func:`~sidecar.replay.replay_config`); see docs/forecast-validation.md for the sweep that chose them.
FORECAST_FLAGS: dict[str, Any] = {}  # the shipped defaults: window 10m, segment = window/6, min_samples 5


# ------------------------------------------------------------------------------------------------
# Traces: what Prometheus would have stored, one sample per 5 simulated seconds
# ------------------------------------------------------------------------------------------------

#: Gauges recorded per sample (sidecar names).
GAUGES = (
    "kvcache_usage_ratio",
    "kvcache_free_tokens",
    "kvcache_demand_tokens",
    "kvcache_fill_rate_tokens_per_second",
    "kvcache_time_until_full_seconds",
    "kvcache_time_until_watermark_seconds",
)


@dataclass
class Trace:
    scenario: str
    seed: int
    settings: str
    t: list[float] = field(default_factory=list)
    #: name -> values aligned with ``t`` (None = not published at that scrape)
    g: dict[str, list[float | None]] = field(default_factory=lambda: {n: [] for n in GAUGES})
    first_preemption: float | None = None
    #: preemptions after the pre-roll (the run's own), and during it
    preemptions: int = 0
    preroll_preemptions: int = 0


def with_preroll(scenario: Scenario, preroll_s: float) -> Scenario:
    """``scenario`` shifted by ``preroll_s``, preceded by its initial arrival rate held that long.

    Only the time axis moves: same length distributions, prefix mix and restart (shifted), so
    the scenario proper is the library's, started from a loaded server instead of an empty one.
    """
    if preroll_s <= 0:
        return scenario
    points = ((0.0, scenario.rate(0.0)),) + tuple((t + preroll_s, r) for t, r in scenario.rate_points)
    return dataclasses.replace(
        scenario,
        rate_points=points,
        duration_s=scenario.duration_s + preroll_s,
        restart_at=None if scenario.restart_at is None else scenario.restart_at + preroll_s,
    )


def collect(
    scenario: str, seed: int, settings: Sequence[Mapping[str, Any]], preroll_s: float = PREROLL_S
) -> list[Trace]:
    """Replay one run once and feed every page to one pipeline per forecast setting.

    Traces hold only the samples from the end of the pre-roll on, with times relative to it
    (t = 0 is the start of the library scenario); the pipelines see every sample.
    """
    sim = Simulator(SimConfig(), scenario=with_preroll(LIBRARY[scenario], preroll_s), seed=seed)
    pipes = [Pipeline(replay_config(**s), sim.config.model_name) for s in settings]
    traces = [Trace(scenario, seed, settings_name(s)) for s in settings]
    end = preroll_s + LIBRARY[scenario].duration_s + (TAIL_S if scenario in TAILED else 0.0)
    offset = last = 0  # preemptions summed over restarts (the counter restarts at 0)
    first = None
    at_start = 0
    n = 0
    while True:
        n += 1
        t = n * STEP_S
        if t > end + 1e-9:
            break
        sim.advance_to(t)
        # parsed once, by the first pipeline's Sidecar, and fed to every pipeline
        scrape = pipes[0].read(sim.render(Generation.V1_CAPACITY_LABELS).encode()) if sim.up else None
        now_p = sim.preemptions
        if now_p < last:
            offset += last
        last = now_p
        if t <= preroll_s + 1e-9:
            at_start = offset + now_p
        elif first is None and offset + now_p > at_start:
            first = t - preroll_s
        for pipe, tr in zip(pipes, traces, strict=True):
            pipe.ingest(t, scrape)
            if t > preroll_s + 1e-9:
                tr.t.append(t - preroll_s)
                for name in GAUGES:
                    tr.g[name].append(pipe.gauge(name))
    for tr in traces:
        tr.first_preemption = first
        tr.preemptions = offset + last - at_start
        tr.preroll_preemptions = at_start
    return traces


def settings_name(s: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(s.items())) or "defaults"


# ------------------------------------------------------------------------------------------------
# Rules, evaluated as Prometheus does
# ------------------------------------------------------------------------------------------------

Cond = Callable[[Trace, int], bool]


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str  # the PromQL, as it goes into alerts/
    for_s: float
    cond: Cond


def _v(tr: Trace, name: str, i: int) -> float | None:
    return tr.g[name][i]


def lt(name: str, x: float) -> Cond:
    def c(tr: Trace, i: int) -> bool:
        v = _v(tr, name, i)
        return v is not None and v < x

    return c


def gt(name: str, x: float) -> Cond:
    def c(tr: Trace, i: int) -> bool:
        v = _v(tr, name, i)
        return v is not None and v > x

    return c


def over_time(fn: Callable[[list[float]], float], name: str, range_s: float, op: Callable[[float], bool]) -> Cond:
    """``fn_over_time(name[range]) <op>``: over the published samples in ``(t − range, t]``."""

    def c(tr: Trace, i: int) -> bool:
        vals: list[float] = []
        j = i
        while j >= 0 and tr.t[j] > tr.t[i] - range_s:
            v = tr.g[name][j]
            if v is not None:
                vals.append(v)
            j -= 1
        return bool(vals) and op(fn(vals))

    return c


def both(*conds: Cond) -> Cond:
    return lambda tr, i: all(c(tr, i) for c in conds)


def firings(rule: Rule, tr: Trace) -> list[tuple[float, float]]:
    """Firing episodes ``(start, end)`` under Prometheus ``for:`` semantics (end = last firing evaluation)."""
    out: list[tuple[float, float]] = []
    active_at: float | None = None
    firing_since: float | None = None
    for i, t in enumerate(tr.t):
        if rule.cond(tr, i):
            if active_at is None:
                active_at = t
            if t - active_at >= rule.for_s - 1e-9:
                if firing_since is None:
                    firing_since = t
                    out.append((t, t))
                else:
                    out[-1] = (firing_since, t)
        else:
            active_at = firing_since = None
    return out


TTF, USAGE = "kvcache_time_until_full_seconds", "kvcache_usage_ratio"

#: The static page as first specified (usage above 0.9 for 5 minutes), for comparison.
STATIC_RULE = Rule("static", "kvcache_usage_ratio > 0.9", 300, gt(USAGE, 0.9))
#: KVCacheAlmostFull critical as committed in alerts/ (gap-tolerant), for comparison.
STATIC_ALERT = Rule(
    "static-alert", "max_over_time(kvcache_usage_ratio[1m]) > 0.9", 300, over_time(max, USAGE, 60, lambda v: v > 0.9)
)
#: The forecast page as first specified (time until full below 15 minutes for 2 minutes); named
#: ``forecast-issue`` in the bench's output and docs/forecast-validation.md.
FORECAST_SPECIFIED = Rule("forecast-issue", "kvcache_time_until_full_seconds < 900", 120, lt(TTF, 900))
#: The rule the bench recommends for KVCacheFullSoon (see docs/forecast-validation.md).
FORECAST_RULE = FORECAST_SPECIFIED

# ------------------------------------------------------------------------------------------------
# Summaries
# ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    scenario: str
    seed: int
    preemptions: int
    first_preemption: float | None
    first_firing: float | None
    episodes_before: int  # firing episodes that started before the first preemption
    firing_at_preemption: bool

    @property
    def lead_min(self) -> float | None:
        """First preemption − first firing (simulated minutes); None without preemption."""
        if self.first_preemption is None:
            return None
        if self.first_firing is None:
            return -math.inf  # never fired although it preempted: a miss
        return (self.first_preemption - self.first_firing) / 60.0

    @property
    def false_page(self) -> bool:
        return self.preemptions == 0 and self.first_firing is not None


def outcome(rule: Rule, tr: Trace) -> Outcome:
    eps = firings(rule, tr)
    fp = tr.first_preemption
    before = [e for e in eps if fp is not None and e[0] <= fp]
    at = any(s <= fp <= e + STEP_S for s, e in eps) if fp is not None else False
    return Outcome(tr.scenario, tr.seed, tr.preemptions, fp, eps[0][0] if eps else None, len(before), at)


def fmt_lead(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == -math.inf:
        return "miss"
    return f"{x:+.1f}"


def median_lead(outs: Sequence[Outcome]) -> float | None:
    leads = [o.lead_min for o in outs if o.lead_min is not None]
    return statistics.median(leads) if leads else None
