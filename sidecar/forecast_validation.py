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

**Arrival traces.** :func:`collect_trace` replays a real trace (:mod:`sidecar.simulator.trace`) on
:data:`TRACE_SERVER` with a pool sized by :data:`TRACE_SCALES`, its first :data:`TRACE_PREROLL_S` as
warm-up; :func:`trace_outcome` gives a rule's (or several rules' together) lead, page and preemption
episodes, the episodes warned and the pages per saturating hour.

The rules whose figures are reported are :data:`FORECAST_RULE` and :data:`PAGE_RULE` (and candidates such as
:data:`PAGE_MEMORY_RULE` and :data:`PAGE_BURST_RULE`, measured and not shipped); ``alerts/``
(``KVCacheFullSoon``, ``KVCacheAlmostFull`` critical) must use exactly their expression, ``for`` and
``keep_firing_for``.
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
from .simulator.trace import TracePlay

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

#: Trace runs: the first 10 minutes of the trace warm the server up and are not counted.
TRACE_PREROLL_S = 600.0
#: The server trace runs replay on: the library's model and block size, a context long enough for the
#: traces' prompts (Mooncake's reach 126k tokens) and a compute fast enough that one server keeps up with a
#: whole public trace (16k batched tokens per step, 2 us per token: prefill of the Mooncake conversation
#: hour keeps up, so what queues is KV, not compute). Its pool is sized per run by the peak usage scale
#: (:func:`~sidecar.simulator.trace.pool_for_peak`).
TRACE_SERVER = SimConfig(max_model_len=131072, max_num_batched_tokens=16384, step_seconds_per_token=2e-6)
#: Pool sizes of a trace run, as the usage the trace's peaks would reach (5-second samples of an unbounded
#: pool): 0.8 and 0.95 never preempt, or barely (0.95 is the tightest pool where the peaks reach 0.95);
#: 1.05 preempts only at the busiest minutes; 1.2 and 1.5 are heavier.
TRACE_SCALES = (0.8, 0.95, 1.05, 1.2, 1.5)

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
    "kvcache_engine_start_time_seconds",
    "kvcache_burst_tokens",
    "kvcache_burst_headroom_ratio",
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
    #: sample times (as ``t``) at which the preemption counter moved
    preemption_times: list[float] = field(default_factory=list)
    #: simulated time of ``t = 0`` (the end of the pre-roll): what the pipeline's clock read then
    origin: float = 0.0
    #: every sample time (as ``t``: negative during the pre-roll) at which the preemption counter moved,
    #: pre-roll included: what ``increase(kvcache_preemptions_total[...])`` sees on a Prometheus that
    #: scraped the warm-up too
    counter_times: list[float] = field(default_factory=list)


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
    """Replay one run of the library once and feed every page to one pipeline per forecast setting.

    Traces hold only the samples from the end of the pre-roll on, with times relative to it
    (t = 0 is the start of the library scenario); the pipelines see every sample.
    """
    sim = Simulator(SimConfig(), scenario=with_preroll(LIBRARY[scenario], preroll_s), seed=seed)
    end = preroll_s + LIBRARY[scenario].duration_s + (TAIL_S if scenario in TAILED else 0.0)
    return replay_run(sim, scenario, seed, settings, end_s=end, preroll_s=preroll_s)


def collect_trace(
    play: TracePlay,
    config: SimConfig,
    settings: Sequence[Mapping[str, Any]],
    *,
    name: str,
    preroll_s: float = TRACE_PREROLL_S,
    restart_at: float | None = None,
) -> list[Trace]:
    """Replay an arrival trace on ``config``'s server (:class:`~sidecar.simulator.trace.TracePlay`).

    The first ``preroll_s`` simulated seconds of the trace are its own warm-up (the server starts
    empty, as at a start under load, and that is not what a run measures: :func:`collect_start`
    does); firings and preemptions count from there. ``restart_at`` restarts the engine then
    (simulated seconds from the start of the replay).
    """
    sim = Simulator(config, play.scenario(config, restart_at=restart_at), 0, play)
    return replay_run(sim, name, 0, settings, end_s=play.duration_s, preroll_s=preroll_s)


def replay_run(
    sim: Simulator,
    name: str,
    seed: int,
    settings: Sequence[Mapping[str, Any]],
    *,
    end_s: float,
    preroll_s: float,
) -> list[Trace]:
    """Scrape ``sim`` every :data:`STEP_S` up to ``end_s`` into one pipeline per forecast setting."""
    pipes = [Pipeline(replay_config(**s), sim.config.model_name) for s in settings]
    traces = [Trace(name, seed, settings_name(s)) for s in settings]
    offset = last = 0  # preemptions summed over restarts (the counter restarts at 0)
    at_start = total_before = 0
    moved: list[float] = []
    counted: list[float] = []  # moves of the counter, pre-roll included
    n = 0
    while True:
        n += 1
        t = n * STEP_S
        if t > end_s + 1e-9:
            break
        sim.advance_to(t)
        # parsed once, by the first pipeline's Sidecar, and fed to every pipeline
        scrape = pipes[0].read(sim.render(Generation.V1_CAPACITY_LABELS).encode()) if sim.up else None
        now_p = sim.preemptions
        if now_p < last:
            offset += last
        last = now_p
        total = offset + now_p
        if total > total_before:
            counted.append(t - preroll_s)
        if t <= preroll_s + 1e-9:
            at_start = total
        elif total > total_before:
            moved.append(t - preroll_s)
        total_before = total
        for pipe, tr in zip(pipes, traces, strict=True):
            pipe.ingest(t, scrape)
            if t > preroll_s + 1e-9:
                tr.t.append(t - preroll_s)
                for g in GAUGES:
                    tr.g[g].append(pipe.gauge(g))
    for tr in traces:
        tr.first_preemption = moved[0] if moved else None
        tr.preemption_times = list(moved)
        tr.preemptions = offset + last - at_start
        tr.preroll_preemptions = at_start
        tr.origin = preroll_s
        tr.counter_times = list(counted)
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
    #: ``keep_firing_for``: a firing alert stays firing this long after its expression last had a result
    keep_s: float = 0.0


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
    """Firing episodes ``(start, end)`` under Prometheus ``for:`` and ``keep_firing_for:`` semantics.

    ``end`` is the last evaluation at which the alert fired. With ``keep_firing_for`` a firing alert
    whose expression has no result stays firing while less than ``keep_s`` has passed since the first
    evaluation without one (``KeepFiringSince`` in Prometheus' rules/alerting.go; docs "Alerting
    rules"), then resolves; a result in between clears that; a pending alert resets at once, as without it.
    """
    out: list[tuple[float, float]] = []
    active_at: float | None = None
    firing_since: float | None = None
    keep_since: float | None = None
    for i, t in enumerate(tr.t):
        if rule.cond(tr, i):
            keep_since = None
            if active_at is None:
                active_at = t
            if t - active_at >= rule.for_s - 1e-9:
                if firing_since is None:
                    firing_since = t
                    out.append((t, t))
                else:
                    out[-1] = (firing_since, t)
        elif firing_since is not None and t - (t if keep_since is None else keep_since) < rule.keep_s - 1e-9:
            keep_since = t if keep_since is None else keep_since
            out[-1] = (firing_since, t)
        else:
            active_at = firing_since = keep_since = None
    return out


TTF, USAGE = "kvcache_time_until_full_seconds", "kvcache_usage_ratio"

#: The static page as first specified (usage above 0.9 for 5 minutes), for comparison.
STATIC_RULE = Rule("static", "kvcache_usage_ratio > 0.9", 300, gt(USAGE, 0.9))
#: KVCacheAlmostFull critical as shipped before the page became :data:`PAGE_RULE` (above 0.9 for 5
#: minutes, gap-tolerant), for comparison.
STATIC_ALERT = Rule(
    "static-alert", "max_over_time(kvcache_usage_ratio[1m]) > 0.9", 300, over_time(max, USAGE, 60, lambda v: v > 0.9)
)
#: The forecast page as first specified (time until full below 15 minutes for 2 minutes); named
#: ``forecast-issue`` in the bench's output and docs/forecast-validation.md.
FORECAST_SPECIFIED = Rule("forecast-issue", "kvcache_time_until_full_seconds < 900", 120, lt(TTF, 900))
START = "kvcache_engine_start_time_seconds"
#: KVCacheFullSoon waits this long after the engine's start (a fill from empty is not a capacity problem).
AFTER_START_S = 600.0


def started_within(seconds: float) -> Cond:
    """``time() - kvcache_engine_start_time_seconds < seconds``: the engine started less than that ago."""

    def c(tr: Trace, i: int) -> bool:
        v = tr.g[START][i]
        return v is not None and tr.t[i] + tr.origin - v < seconds

    return c


def unless(cond: Cond, guard: Cond) -> Cond:
    return lambda tr, i: cond(tr, i) and not guard(tr, i)


#: KVCacheFullSoon as shipped: the specified forecast page, not in the first 10 minutes after the engine
#: started (restart and scale-out under load), kept firing 5 minutes past its last "full soon" (one page
#: per saturation, not one per dip of the forecast). docs/forecast-validation.md, "Real traffic".
FORECAST_RULE = Rule(
    "forecast",
    "kvcache_time_until_full_seconds < 900\nunless\ntime() - kvcache_engine_start_time_seconds < 600",
    120,
    unless(lt(TTF, 900), started_within(AFTER_START_S)),
    keep_s=300,
)


def quantile(phi: float) -> Callable[[list[float]], float]:
    """Prometheus' ``quantile_over_time(phi, ...)``: rank ``phi × (n − 1)`` of the sorted values, linearly
    interpolated (promql/quantile.go, ``quantile``)."""

    def q(values: list[float]) -> float:
        v = sorted(values)
        rank = phi * (len(v) - 1)
        lo = math.floor(rank)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (rank - lo)

    return q


def either(*conds: Cond) -> Cond:
    """PromQL ``or`` of conditions on one series: a result when any has one."""
    return lambda tr, i: any(c(tr, i) for c in conds)


def preempted_within(range_s: float) -> Cond:
    """``increase(kvcache_preemptions_total[range]) > 0``: the counter moved between two samples of
    ``(t − range, t]`` (pre-roll moves included: Prometheus scraped the warm-up too). ``increase`` is the
    counter's rise over the range, resets counted as rises from 0 (Prometheus docs, "Query functions":
    ``increase()``), so a restart that zeroes the counter is no move."""

    def c(tr: Trace, i: int) -> bool:
        t = tr.t[i]
        return any(t - range_s + STEP_S - 1e-9 < m <= t + 1e-9 for m in tr.counter_times)

    return c


#: KVCacheAlmostFull critical as shipped (``alerts.critical_*``, sidecar/artifacts/rules.py): "the peaks
#: keep reaching 90 %" read as "above 0.9 for more than 5 % of the last 10 minutes (30 s)", without
#: ``for:`` (a burst shorter than that never makes the expression true) and held 5 minutes
#: (docs/forecast-validation.md, "Real traffic").
PAGE_QUANTILE, PAGE_WINDOW_S, PAGE_KEEP_S, WATERMARK = 0.95, 600.0, 300.0, 0.9
PAGE_RULE = Rule(
    "page",
    f"quantile_over_time({PAGE_QUANTILE:g}, kvcache_usage_ratio[{PAGE_WINDOW_S / 60:g}m]) > {WATERMARK:g}",
    0,
    over_time(quantile(PAGE_QUANTILE), USAGE, PAGE_WINDOW_S, lambda v: v > WATERMARK),
    keep_s=PAGE_KEEP_S,
)
#: A candidate measured and not shipped (docs/forecast-validation.md, "Memory of earlier peaks"): the page,
#: or the memory of the last saturation: after a preemption within :data:`PAGE_REARM_S`, usage above the
#: watermark at all in the last :data:`PAGE_REARM_PEAK_S` pages again (the next burst at its first peak).
PAGE_REARM_S, PAGE_REARM_PEAK_S = 1800.0, 60.0
PAGE_MEMORY_RULE = Rule(
    "page-memory",
    f"{PAGE_RULE.expr}\nor\n(\n  max_over_time(kvcache_usage_ratio[{PAGE_REARM_PEAK_S / 60:g}m]) > {WATERMARK:g}\n"
    f"  and\n  increase(kvcache_preemptions_total[{PAGE_REARM_S / 60:g}m]) > 0\n)",
    0,
    either(
        PAGE_RULE.cond,
        both(
            over_time(max, USAGE, PAGE_REARM_PEAK_S, lambda v: v > WATERMARK),
            preempted_within(PAGE_REARM_S),
        ),
    ),
    keep_s=PAGE_KEEP_S,
)

BURST = "kvcache_burst_headroom_ratio"


def burst_rule(headroom: float, for_s: float, usage_gate: float | None = None) -> Rule:
    """A burst-headroom page arm (docs/forecast-validation.md, "A burst-headroom page arm"): the free KV
    now is less than ``headroom`` of the last hour's largest one-minute rise
    (``kvcache_burst_headroom_ratio``, docs/forecast.md), for ``for_s``, optionally only while usage
    reached ``usage_gate`` in the last minute; ``keep_firing_for`` as the shipped page. Measured with the
    shipped pair OR-ed in, as the pager sees them."""
    expr = f"{BURST} < {headroom:g}"
    cond = lt(BURST, headroom)
    name = f"headroom<{headroom:g}"
    if usage_gate is not None:
        expr += f"\nand\nmax_over_time(kvcache_usage_ratio[1m]) > {usage_gate:g}"
        gate: float = usage_gate
        cond = both(cond, over_time(max, USAGE, 60.0, lambda v: v > gate))
        name += f"&max1m(u)>{usage_gate:g}"
    if for_s:
        name += f" for {for_s:g}s"
    return Rule(name, expr, for_s, cond, keep_s=PAGE_KEEP_S)


#: The burst-headroom arm chosen on the Mooncake hours and the library and judged once on the held-out Azure
#: 2023 hours (docs/forecast-validation.md, "A burst-headroom page arm"): measured, not shipped.
PAGE_BURST_RULE = burst_rule(0.5, 30.0, 0.8)


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


# ------------------------------------------------------------------------------------------------
# Trace runs: episodes, warnings, pages per saturating hour
# ------------------------------------------------------------------------------------------------

#: Preemptions more than this apart start a new preemption episode.
EPISODE_GAP_S = 120.0
#: A preemption episode is warned when a page fires at its start or within this long before it.
WARN_BEFORE_S = 900.0


def preemption_episodes(tr: Trace, gap_s: float = EPISODE_GAP_S) -> list[tuple[float, float]]:
    """``(start, end)`` of each run of preemption samples; a gap longer than ``gap_s`` starts a new one."""
    out: list[tuple[float, float]] = []
    for t in tr.preemption_times:
        if out and t - out[-1][1] <= gap_s:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


#: A preemption episode with fewer samples than this (a minute of 5-s samples) in the WARN_BEFORE_S before it
#: started "at the start": the run began saturated, and no usage rule had anything to read.
AT_START_SAMPLES = 12
#: The classes of :func:`watermark_class`, in the bench's order.
WATERMARK_CLASSES = (
    "at the start",
    "never above 0.9",
    "one 5-s sample above 0.9",
    "above 0.9 on >= 2 samples",
)


def watermark_class(tr: Trace, start: float, watermark: float = WATERMARK, before_s: float = WARN_BEFORE_S) -> str:
    """What usage did in the ``before_s`` before a preemption episode starting at ``start``: one of
    :data:`WATERMARK_CLASSES`, from the 5-s samples in ``[start − before_s, start)`` (the sample at which the
    counter moved is not "before"). Which episodes a page at the ``watermark`` can warn at all: one with
    no sample above it gives a usage page nothing to read, one with a single sample only a page on a
    single sample (docs/forecast-validation.md, "Which episodes a watermark page can warn")."""
    usage = [v for t, v in zip(tr.t, tr.g[USAGE], strict=True) if start - before_s - 1e-9 <= t < start - 1e-9]
    if len(usage) < AT_START_SAMPLES:
        return WATERMARK_CLASSES[0]
    above = sum(1 for v in usage if v is not None and v > watermark)
    return WATERMARK_CLASSES[min(above, 2) + 1]


def samples_above(tr: Trace, watermark: float = WATERMARK) -> int:
    """The 5-s samples of ``tr`` with usage above ``watermark``: what a page on a single sample would page
    on (in a run without preemptions, each one a false page)."""
    return sum(1 for v in tr.g[USAGE] if v is not None and v > watermark)


@dataclass
class TraceOutcome:
    """One rule on one trace run: the figures of the trace table (docs/forecast-validation.md)."""

    lead_min: float | None  # first preemption − first firing; -inf = never fired; None = no preemption
    page_episodes: int
    preemption_episodes: int
    warned: int  # preemption episodes with a firing at their start or within WARN_BEFORE_S before
    saturating_hours: int  # 60-minute bins of the run holding a preemption
    #: minutes during which a page fired
    paged_min: float = 0.0
    #: for each page episode that ended before the run did and followed a preemption (one in it or in the
    #: WARN_BEFORE_S before it): minutes from its last preemption to its end (how long it outlived it)
    outlives_min: tuple[float, ...] = ()

    @property
    def false_page(self) -> bool:
        return self.preemption_episodes == 0 and self.page_episodes > 0

    @property
    def pages_per_saturating_hour(self) -> float | None:
        return self.page_episodes / self.saturating_hours if self.saturating_hours else None


def any_firing(rules: Sequence[Rule], tr: Trace) -> list[tuple[float, float]]:
    """The episodes during which at least one of ``rules`` fires (what a pager sees of them together)."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(ep for r in rules for ep in firings(r, tr)):
        if merged and s <= merged[-1][1] + STEP_S + 1e-9:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def warned_by(eps: Sequence[tuple[float, float]], start: float) -> bool:
    """A preemption episode starting at ``start`` is warned by firing episodes ``eps`` when one fires at its
    start or within :data:`WARN_BEFORE_S` before it."""
    return any(s <= start and e >= start - WARN_BEFORE_S for s, e in eps)


def trace_outcome(rules: Sequence[Rule], tr: Trace) -> TraceOutcome:
    """The figures of ``rules`` together (one rule: its own) on one run."""
    eps = any_firing(rules, tr)
    pre = preemption_episodes(tr)
    warned = sum(warned_by(eps, p0) for p0, _ in pre)
    hours = len({int(t // 3600) for t in tr.preemption_times})
    fp = tr.first_preemption
    lead = None if fp is None else (-math.inf if not eps else (fp - eps[0][0]) / 60.0)
    outlives = []
    for s, e in eps:
        last = [p for p in tr.preemption_times if s - WARN_BEFORE_S <= p <= e]
        if last and tr.t and e < tr.t[-1] - STEP_S / 2:
            outlives.append((e - last[-1]) / 60.0)
    paged = sum(e - s + STEP_S for s, e in eps) / 60.0
    return TraceOutcome(lead, len(eps), len(pre), warned, hours, paged, tuple(outlives))
