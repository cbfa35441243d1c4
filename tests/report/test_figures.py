"""The report's figures: weeks built by hand with known series give known figures.

The expected values are derived here from the series' definitions (closed forms where there are
some, plain loops and ``statistics.quantiles`` otherwise), not from sidecar.report.figures; the
advice is compared with what sidecar.forecast.policy.advise returns for the same inputs; the
percentile definition is checked against a real promtool's ``quantile_over_time``.
"""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.capacity.budget import NonKVBytes
from sidecar.capacity.vllm_rules import utilization_flag
from sidecar.forecast.policy import AdviceSettings, Pool, ServedModel, advise
from sidecar.forecast.sizing import capacity_at_utilization, suggested_replicas
from sidecar.report import figures
from sidecar.report.data import ModelKey, Page, Period, PodSeries, Week, model_peaks
from sidecar.report.growth import AT_CAPACITY, NOT_ENOUGH_HISTORY, NOT_GROWING, TWO_POINTS
from sidecar.thresholds import Thresholds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "alerts"))
from alerttools import require_tool

T0 = 1_799_020_800.0  # Monday 2027-01-04 00:00 UTC
WEEK = Period(T0, T0 + 7 * 86_400)
N = WEEK.steps
BS = 16
CAP = 57_600.0  # 3,600 blocks of 16
USABLE = CAP - BS
THEO = 64_000.0
GIB = 2**30
TH = Thresholds()  # watermark 0.9, warning 0.8, target 0.75
SETTINGS = AdviceSettings(target_usage=0.75, utilization_min=0.5, utilization_max=0.95, peak_window_s=3600.0)
LLAMA = ModelKey("prod", "llama")
QWEN = ModelKey("prod", "qwen")
GAP = range(5000, 5060)  # a-1 restarts: an hour with no samples


def served(gpu_memory: float = 80 * GIB, kv_dtype_bytes: float = 2) -> ServedModel:
    return ServedModel(
        bytes_per_token=131_072,
        kv_dtype_bytes=kv_dtype_bytes,
        kv_heads=8,
        attention="gqa",
        tensor_parallel=1,
        gpu_memory_bytes=gpu_memory,
        non_kv_bytes=lambda: NonKVBytes(weights=16 * GIB, activation=2 * GIB, non_torch=GIB, cudagraph=0),
    )


def pod(period: Period, model: ModelKey, name: str, gap: range = range(0), **series) -> PodSeries:
    """A pod whose series are constants, lists or functions of the step; NaN in ``gap``."""
    p = PodSeries.empty(period, model, name, "0", {"pod": name})
    p.block_size, p.gpu_memory_utilization = BS, 0.9
    for key in ("block_size", "gpu_memory_utilization", "kv_cache_memory_bytes", "usage_quantiles", "seconds_above"):
        if key in series:
            setattr(p, key, series.pop(key))
    defaults = {"capacity_tokens": CAP, "theoretical_capacity_tokens": THEO, "preemptions": 0.0, "waiting_max": 0.0}
    for key, value in {**defaults, **series}.items():
        if callable(value):
            values = [float(value(i)) for i in range(period.steps)]
        elif isinstance(value, list):
            values = list(value)
        else:
            values = [float(value)] * period.steps
        for i in gap:
            values[i] = math.nan
        setattr(p, key, values)
    return p


def sine(i: int) -> float:
    return 0.5 + 0.45 * math.sin(2 * math.pi * i / 1440)  # one day, peak 0.95 at 06:00 UTC


def burst(i: int) -> float:
    return {30 * 60 + 3: 5.0, 30 * 60 + 40: 7.0}.get(i, 0.0)  # 12 preemptions in hour 30 (Tuesday 06:00)


def llama_pods(period: Period, scale: float = 1.0) -> list[PodSeries]:
    a0 = pod(
        period,
        LLAMA,
        "a-0",
        usage_mean=sine,
        usage_max=lambda i: sine(i) + 0.01,
        demand_max=lambda i: scale * sine(i) * USABLE,
        preemptions=burst,
        prefix_queries=100.0,
        prefix_hits=40.0,
        waiting_max=lambda i: 1.0 if sine(i) > 0.9 else 0.0,
        running_max=lambda i: 25.0 if i == 7 else 20.0,
    )
    a1 = pod(
        period,
        LLAMA,
        "a-1",
        gap=GAP if period == WEEK else range(0),
        usage_mean=0.3,
        usage_max=0.31,
        demand_max=scale * 0.3 * USABLE,
        prefix_queries=50.0,
        prefix_hits=10.0,
        running_max=5.0,
    )
    return [a0, a1]


def qwen_pod(period: Period) -> PodSeries:
    return pod(
        period, QWEN, "b-0", usage_mean=0.7, usage_max=0.7, demand_max=0.7 * USABLE, prefix_queries=0.0, prefix_hits=0.0
    )


@pytest.fixture(scope="module")
def week() -> Week:
    previous = Week(WEEK.previous(), llama_pods(WEEK.previous(), scale=0.9) + [qwen_pod(WEEK.previous())], [], "test")
    pages = [
        Page("KVCacheAlmostFull", "warning", LLAMA, "a-0", T0 + 360 * 60, T0 + 400 * 60),
        Page("KVCacheFullSoon", "critical", LLAMA, "", T0 + 100, T0 + 200),
    ]
    # given in a scrambled order: the report sorts
    return Week(WEEK, [qwen_pod(WEEK), *reversed(llama_pods(WEEK))], pages, "test", history=[model_peaks(previous)])


@pytest.fixture(scope="module")
def report(week):
    return figures.compute(week, thresholds=TH, advice=SETTINGS, served={LLAMA: served()}, generated_at=123.0)


def p(values, phi):
    """The oracle: the standard library's inclusive (linear, n - 1) quantile."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(phi * 100) - 1]


# --- a pod -----------------------------------------------------------------------------------------


def test_pod_usage_from_steps(report):
    a0 = report.models[0].pods[0]
    assert (report.models[0].model, a0.pod) == (LLAMA, "a-0")
    means = [sine(i) for i in range(N)]
    assert a0.usage.peak_ratio == pytest.approx(0.96)
    for phi, got in ((0.5, a0.usage.p50_ratio), (0.95, a0.usage.p95_ratio), (0.99, a0.usage.p99_ratio)):
        assert got == pytest.approx(p(means, phi), abs=1e-12)
    # a step counts when its mean is above: sin > 2/3 (warning) and sin > 8/9 (watermark), per day
    assert a0.usage.hours_above_warning == pytest.approx(sum(v > 0.8 for v in means) / 60)
    assert a0.usage.hours_above_watermark == pytest.approx(sum(v > 0.9 for v in means) / 60)
    per_day = 24 * (math.pi - 2 * math.asin(2 / 3)) / (2 * math.pi)  # the closed form, within a step a crossing
    assert a0.usage.hours_above_warning == pytest.approx(7 * per_day, abs=14 / 60)


def test_pod_capacity_and_pressure(report):
    a0, a1 = report.models[0].pods
    c = a0.capacity
    assert (c.capacity_tokens, c.usable_tokens, c.theoretical_tokens) == (CAP, USABLE, THEO)
    assert c.efficiency_ratio == pytest.approx(0.9)
    assert c.peak_demand_tokens == pytest.approx(0.95 * USABLE)
    assert c.peak_demand_ratio == pytest.approx(0.95)
    assert c.idle_ratio == pytest.approx(0.05)
    pr = a0.pressure
    assert pr.preemptions == 12
    assert (pr.worst_hour_start, pr.worst_hour_preemptions) == (T0 + 30 * 3600, 12)
    assert pr.hours_waiting == pytest.approx(sum(sine(i) > 0.9 for i in range(N)) / 60)
    assert pr.prefix_hit_ratio == pytest.approx(0.4)
    # the restarted pod: NaN steps count nowhere
    assert a1.pressure.prefix_hit_ratio == pytest.approx(0.2)
    assert a1.usage.p50_ratio == pytest.approx(0.3)
    assert math.isnan(a1.timeline.usage_max_ratio[GAP[0]])  # no data: NaN (null in the JSON)
    assert a1.timeline.usable_tokens[GAP[0]] == USABLE  # the capacity carried over the gap
    assert (a1.pressure.preemptions, a1.pressure.worst_hour_start, a1.pressure.worst_hour_preemptions) == (0, None, 0)
    assert (a0.pages, a1.pages) == (1, 0)


def test_pod_timeline(report):
    a0 = report.models[0].pods[0]
    tl = a0.timeline
    assert (tl.step_s, tl.start, len(tl.usage_max_ratio)) == (60.0, T0, N)
    assert tl.demand_tokens[360] == pytest.approx(0.95 * USABLE)
    assert len(tl.preemptions_per_hour) == 168
    assert tl.preemptions_per_hour[30] == 12 and sum(tl.preemptions_per_hour) == 12
    profile = tl.hour_of_week_peak_ratio
    assert [len(row) for row in profile] == [24] * 7
    assert profile[0][6] == pytest.approx(0.96)  # Monday 06:00, the sine's top
    assert profile[3][18] == pytest.approx(max(sine(i) + 0.01 for i in range(3 * 1440 + 18 * 60, 3 * 1440 + 19 * 60)))


def test_pod_advice_is_the_policy(report):
    """The same inputs to sidecar.forecast.policy.advise give the same advice; the sentence shows the value."""
    a0 = report.models[0].pods[0]
    pool = Pool(CAP, BS, None, 0.9, None, 25.0)
    model = served()
    expected = advise(
        peak_demand_tokens=0.95 * USABLE, watched_s=WEEK.seconds, pool=pool, model=model, settings=SETTINGS
    )
    got = a0.advice
    assert (got.action, got.reason) == (expected.recommendation.action, expected.recommendation.reason)
    assert got.action == "raise_gpu_memory_utilization"
    assert expected.suggested_gpu_memory_utilization is not None
    assert got.suggested_gpu_memory_utilization == expected.suggested_gpu_memory_utilization[1]
    # C* = (cdiv(0.95 × 57,584 / 0.75, 16) + 1) × 16 = 72,960; u = 0.9 + 15,360 × 131,072 / 80 GiB
    assert got.suggested_gpu_memory_utilization == pytest.approx(0.9234375)
    assert got.levers == expected.lever_capacity_tokens
    assert got.capacity_shortfall_tokens is expected.capacity_shortfall_tokens is None
    new = capacity_at_utilization(
        u=0.9234375, u0=0.9, capacity_tokens=CAP, bytes_per_token=131_072, gpu_memory_bytes=80 * GIB, block_size=BS
    )
    assert new == 72_960
    assert got.peak_usage_after_ratio == pytest.approx(0.95 * USABLE / (new - BS))
    assert figures.utilization_text(0.9234375) == "0.924"
    assert got.sentence == (
        "Raise --gpu-memory-utilization from 0.90 to 0.924: the week's peak of 54,705 tokens "
        "would sit at 75.0% of 72,944."
    )


# --- a model ---------------------------------------------------------------------------------------


def test_model_figures_reduce_the_pods(report):
    m = report.models[0]
    assert m.model == LLAMA and [x.pod for x in m.pods] == ["a-0", "a-1"]
    hottest = [max(sine(i), 0.3) if i not in GAP else sine(i) for i in range(N)]
    assert m.usage.peak_ratio == pytest.approx(0.96)
    assert m.usage.p50_ratio == pytest.approx(p(hottest, 0.5), abs=1e-12)
    assert m.usage.hours_above_warning == report.models[0].pods[0].usage.hours_above_warning
    c = m.capacity
    assert (c.capacity_tokens, c.usable_tokens, c.theoretical_tokens) == (2 * CAP, 2 * USABLE, 2 * THEO)
    assert c.peak_demand_tokens == pytest.approx(1.25 * USABLE)  # 0.95 + 0.3 at 06:00, both pods up
    assert c.peak_demand_ratio == pytest.approx(0.625)
    assert m.pressure.preemptions == 12
    assert m.pressure.prefix_hit_ratio == pytest.approx((40 * N + 10 * (N - 60)) / (100 * N + 50 * (N - 60)))
    # the restart gap: the summed capacity does not dip, the demand is a-0's alone
    assert m.timeline.usable_tokens[GAP[0]] == 2 * USABLE
    assert m.timeline.demand_tokens[GAP[0]] == pytest.approx(sine(GAP[0]) * USABLE)
    assert m.timeline.demand_tokens[0] == pytest.approx((sine(0) + 0.3) * USABLE)
    assert [pg.alertname for pg in m.pages] == ["KVCacheFullSoon", "KVCacheAlmostFull"]  # by start


def test_model_growth(report):
    """Two weeks: the straight line through both peaks, no fit and no interval ("not enough history")."""
    g = report.models[0].growth
    assert (g.verdict, g.method, g.weeks_fitted) == (NOT_ENOUGH_HISTORY, TWO_POINTS, 2)
    assert g.previous_peak_demand_tokens == pytest.approx(0.9 * 1.25 * USABLE)
    assert g.change_ratio == pytest.approx(1 / 0.9 - 1)
    # (2 U - 1.25 U) / (1.25 U - 1.125 U) = 6 periods of one week
    assert g.weeks_until_full == pytest.approx(6.0)
    assert g.weeks_until_full_low is None and g.growth_standard_error_tokens_per_week is None


def test_model_advice_is_the_workloads_not_its_fullest_pods(report):
    """Two replicas, a-0 hot (peak 95%) and a-1 cold (30%): one recommendation for the workload, sized on the
    even share of its peak (1.25 U over 2 = 62.5%, within target), and the skew as its own finding."""
    m = report.models[0]
    assert [p.advice.action for p in m.pods] == ["raise_gpu_memory_utilization", "lower_gpu_memory_utilization"]
    a = m.advice
    assert (a.action, a.reason) == ("none", "within_target")
    assert a.even_share_tokens == pytest.approx(0.625 * USABLE)
    # ⌈1.25 U ÷ (0.75 × U)⌉ = 2 replicas at today's pool
    assert (a.replicas_now, a.replicas_needed_now, a.suggested_replicas) == (2, 2, 2)
    assert a.current_flags == ["--gpu-memory-utilization 0.90"] and a.set_flags == []
    assert a.sentence == (
        "Nothing to change: the period's peak of 71,980 tokens over 2 replicas put 62.5% of each replica's "
        "57,584 usable tokens in use, near the 75.0% target."
    )
    assert a.uneven.startswith("Load is uneven across replicas: a-0 peaked at 95.0% of its usable tokens ")
    assert "raise" not in m.summary and "lower" not in m.summary  # no contradictory per-pod advice


def test_workload_advice_sizes_replicas_and_flags():
    """The issue's fleet: 353,248 tokens of peak over one pool of 131,072 per replica at a 0.75 target: ⌈3.6⌉ = 4."""
    cap, peak = 131_072.0 + BS, 353_248.0
    pods = [
        pod(TWO_H, LLAMA, name, usage_mean=1.0, usage_max=1.0, demand_max=peak / 2, capacity_tokens=cap)
        for name in ("a-0", "a-1")
    ]
    for p_ in pods:
        p_.model_info = {"tp": "2", "pp": "1"}
    a = compute(*pods, served_models={LLAMA: served(gpu_memory=24 * GIB, kv_dtype_bytes=1)}).models[0].advice
    assert a.replicas_needed_now == 4  # 353,248 / 0.75 / 131,072 = 3.59
    assert a.action == "add_replicas" and a.set_flags == ["--gpu-memory-utilization 0.95"]
    assert a.suggested_replicas is not None and a.suggested_replicas <= 4
    assert a.gpus_per_replica == 2
    n = a.suggested_replicas
    assert a.sentence.startswith(
        f"Set --gpu-memory-utilization 0.90 → 0.95 on 2 → {n} replicas (4 → {2 * n} GPUs): 131,072 → "
    )


def test_the_flags_are_spelt_as_the_configured_vllm_version_spells_them():
    """model.vllm_version 0.31.0 or later: vLLM's --device-memory-utilization alias (vLLM PR #56547), before
    and after the change; 0.30.0: the old name, which every version accepts."""
    cap, peak = 131_072.0 + BS, 353_248.0
    flags = {}
    for version in ("0.32.0", "0.30.0"):
        pods = [
            pod(TWO_H, LLAMA, name, usage_mean=1.0, usage_max=1.0, demand_max=peak / 2, capacity_tokens=cap)
            for name in ("a-0", "a-1")
        ]
        model = replace(served(gpu_memory=24 * GIB, kv_dtype_bytes=1), utilization_flag=utilization_flag(version))
        a = compute(*pods, served_models={LLAMA: model}).models[0].advice
        flags[version] = (a.current_flags, a.set_flags)
    assert flags["0.32.0"] == (["--device-memory-utilization 0.90"], ["--device-memory-utilization 0.95"])
    assert flags["0.30.0"] == (["--gpu-memory-utilization 0.90"], ["--gpu-memory-utilization 0.95"])


def test_one_replica_gets_the_daemons_advice():
    """advise_workload over one replica is advise() on it: the daemon's per-pod gauges."""
    from sidecar.forecast.policy import Replica, advise_workload

    pool = Pool(CAP, BS, None, 0.9, None, 25.0)
    model = served()
    for peak in (0.2 * USABLE, 0.75 * USABLE, 0.95 * USABLE, 3 * USABLE):
        w = advise_workload(
            replicas=[Replica("a-0", peak, pool)],
            peak_demand_tokens=peak,
            watched_s=1e6,
            model=model,
            settings=SETTINGS,
        )
        assert w is not None and not w.hot_replicas
        assert w.advice == advise(peak_demand_tokens=peak, watched_s=1e6, pool=pool, model=model, settings=SETTINGS)


def test_ranking_and_summary(report):
    llama, qwen = report.models
    assert (llama.needs_action, qwen.needs_action) == (True, False)
    assert report.summary == [llama.summary]
    watermark_h = sum(sine(i) > 0.9 for i in range(N)) / 60
    assert llama.summary == (
        f"prod/llama: peak usage 96.0%, {watermark_h:.1f} h above the watermark, 12 preemptions, 1 critical page, "
        "1 warning, full in 6.0 weeks at this growth (two weeks only: no uncertainty); nothing to change: the "
        "period's peak of 71,980 tokens over 2 replicas put 62.5% of each replica's 57,584 usable tokens in use, "
        "near the 75.0% target; load is uneven across replicas: a-0 peaked at 95.0% of its usable tokens while the "
        "even share of the workload's peak is 62.5%; check the router's balancing (session affinity, prefix-aware "
        "routing) before resizing."
    )
    assert ". " not in llama.summary  # one sentence
    assert qwen.summary == (
        "prod/qwen: peak usage 70.0%; nothing to change: the period's peak of 40,309 tokens over 1 replica put "
        "70.0% of each replica's 57,584 usable tokens in use, near the 75.0% target."
    )
    assert qwen.advice.action == "none" and qwen.advice.reason == "within_target"
    assert qwen.pressure.prefix_hit_ratio is None  # prefix caching off: no queries
    assert qwen.growth.verdict == NOT_ENOUGH_HISTORY and qwen.growth.weeks_until_full is None  # flat: never full
    assert (report.watermark, report.warning, report.target_usage, report.generated_at) == (0.9, 0.8, 0.75, 123.0)


def test_deterministic(week, report):
    shuffled = replace(week, pods=random.Random(7).sample(week.pods, len(week.pods)))
    again = figures.compute(shuffled, thresholds=TH, advice=SETTINGS, served={LLAMA: served()}, generated_at=123.0)
    assert again == report


# --- edge cases on a two-hour period -----------------------------------------------------------------

TWO_H = Period(T0, T0 + 7200)


def compute(*pods: PodSeries, previous: list[PodSeries] | None = None, served_models=None, **week_fields):
    history = [model_peaks(Week(TWO_H.previous(), previous, [], "test"))] if previous is not None else []
    w = Week(TWO_H, list(pods), [], "test", history=history, **week_fields)
    return figures.compute(w, thresholds=TH, advice=SETTINGS, served=served_models, generated_at=0.0)


def flat(model: ModelKey = LLAMA, name: str = "p", demand: float = 0.7 * USABLE, period: Period = TWO_H, **kw):
    usage = min(1.0, demand / USABLE)
    return pod(period, model, name, **{"usage_mean": usage, "usage_max": usage, "demand_max": demand, **kw})


def test_empty_week():
    r = compute()
    assert (r.models, r.summary) == ([], [])


def test_all_nan_pod():
    r = compute(pod(TWO_H, LLAMA, "dead", capacity_tokens=math.nan, theoretical_capacity_tokens=math.nan))
    (m,) = r.models
    u = m.pods[0].usage
    assert (u.peak_ratio, u.p50_ratio, u.p95_ratio, u.p99_ratio) == (None, None, None, None)
    assert (u.hours_above_warning, u.hours_above_watermark) == (0, 0)
    c = m.capacity
    assert (c.capacity_tokens, c.usable_tokens, c.peak_demand_tokens, c.peak_demand_ratio, c.idle_ratio) == (None,) * 5
    assert (m.advice.action, m.advice.reason) == ("none", "insufficient_data")
    assert m.advice.sentence.startswith("No advice: vLLM's capacity")
    assert len(m.pods[0].timeline.usage_max_ratio) == 120 and all(
        math.isnan(v) for v in m.pods[0].timeline.usage_max_ratio
    )
    assert m.timeline.hour_of_week_peak_ratio == [[None] * 24 for _ in range(7)]
    assert m.growth.verdict == "no previous data" and not m.needs_action and r.summary == []


def test_no_block_size_no_advice():
    (m,) = compute(flat(block_size=None)).models
    assert m.capacity.usable_tokens is None and m.capacity.peak_demand_ratio is None
    assert (m.advice.action, m.advice.reason) == ("none", "insufficient_data")


def test_at_capacity_without_previous():
    (m,) = compute(flat(demand=USABLE + 100)).models
    g = m.growth
    assert (g.verdict, g.weeks_until_full, g.weeks_until_full_low, g.weeks_until_full_high) == (AT_CAPACITY, 0, 0, 0)
    assert (g.previous_peak_demand_tokens, g.change_ratio) == (None, None)
    assert m.needs_action
    # the pod is already full: never "full in N weeks"; without bytes per token the value cannot be sized,
    # the replicas at today's setting can: ⌈57,684 ÷ (0.75 × 57,584)⌉ = 2
    assert m.summary == (
        "prod/llama: peak usage 100.0%, 2.0 h above the watermark, already full on p (peak demand 100.2% of its "
        "usable tokens); raise --gpu-memory-utilization from 0.90 (no value: no sidecar exported the model's bytes "
        "per token and sizing, and the report's model.config does not describe it), or run 1 → 2 replicas at "
        "today's setting: the period's peak of 57,684 tokens would sit at 50.1% (target 75.0%)."
    )
    assert "full in" not in m.summary and m.advice.replicas_needed_now == 2


def test_a_drop_is_never_full_and_a_flat_history_is_not_growing():
    (m,) = compute(flat(demand=0.6 * USABLE), previous=[flat(demand=0.7 * USABLE, period=TWO_H.previous())]).models
    assert m.growth.verdict == NOT_ENOUGH_HISTORY and m.growth.change_ratio == pytest.approx(-1 / 7)
    assert m.growth.weeks_until_full is None and "full in" not in m.summary
    # four periods within 0.1 % of each other: the fit's interval holds zero
    periods = [TWO_H.previous().previous().previous(), TWO_H.previous().previous(), TWO_H.previous()]
    history = [
        model_peaks(Week(p, [flat(demand=(0.7 + d) * USABLE, period=p)], [], "t"))
        for p, d in zip(periods, (0.0007, -0.0007, 0.0003), strict=True)
    ]
    w = Week(TWO_H, [flat(demand=0.7 * USABLE)], [], "t", history=history)
    (m,) = figures.compute(w, thresholds=TH, advice=SETTINGS, generated_at=0.0).models
    assert (m.growth.verdict, m.growth.weeks_fitted, m.growth.weeks_until_full) == (NOT_GROWING, 4, None)


def test_growth_converts_periods_to_weeks():
    prev = [flat(demand=0.5 * USABLE, period=TWO_H.previous())]
    (m,) = compute(flat(demand=0.7 * USABLE), previous=prev).models
    # 0.3 U left at 0.2 U per two hours: 1.5 periods of 7,200 s
    assert m.growth.weeks_until_full == pytest.approx(1.5 * 7200 / 604_800)
    assert m.needs_action  # full within four weeks


def test_hours_above_count_the_mean():
    p0 = flat(usage_mean=0.85, usage_max=0.95)
    p0.usage_mean[3] = 0.5
    (m,) = compute(p0).models
    assert m.usage.hours_above_warning == pytest.approx(119 / 60)
    assert m.usage.hours_above_watermark == 0
    assert m.usage.peak_ratio == 0.95


def test_source_reduced_figures_win():
    p0 = flat(usage_quantiles={"max": 0.99, "p50": 0.1, "p95": 0.2, "p99": 0.3}, seconds_above={"warning": 90.0})
    p0.seconds_waiting = 1800.0
    reduced = {LLAMA: {"max": 0.98, "p50": 0.11, "p95": 0.21, "p99": 0.31}}
    (m,) = compute(p0, model_usage_quantiles=reduced, model_seconds_above={LLAMA: {"watermark": 36.0}}).models
    u = m.pods[0].usage
    assert (u.peak_ratio, u.p50_ratio, u.p95_ratio, u.p99_ratio) == (0.99, 0.1, 0.2, 0.3)
    assert (u.hours_above_warning, u.hours_above_watermark) == (0.025, 0)
    assert m.pods[0].pressure.hours_waiting == 0.5
    assert (m.usage.peak_ratio, m.usage.p99_ratio, m.usage.hours_above_watermark) == (0.98, 0.31, 0.01)
    assert m.needs_action  # time above the watermark


def test_clock_hours_of_an_unaligned_period():
    period = Period(T0 + 1800, T0 + 1800 + 7200)
    p0 = flat(period=period, preemptions=lambda i: 2.0 if i in (0, 100, 101) else 0.0)
    w = Week(period, [p0], [], "test")
    (m,) = figures.compute(w, thresholds=TH, advice=SETTINGS, generated_at=0).models
    # 00:30-01:00, 01:00-02:00, 02:00-02:30: step 100 is 02:10
    assert m.timeline.preemptions_per_hour == [2.0, 0.0, 4.0]
    assert (m.pressure.worst_hour_start, m.pressure.worst_hour_preemptions) == (T0 + 7200, 4.0)


def test_hour_of_week():
    assert figures.hour_of_week(T0) == (0, 0)
    assert figures.hour_of_week(T0 + 2 * 86_400 + 14 * 3600 + 59) == (2, 14)  # Wednesday 14:00
    assert figures.hour_of_week(T0 - 1) == (6, 23)  # Sunday 23:59:59


def test_warm_up_gate_withholds_lowering():
    """A pod seen for 30 minutes with a low peak: the policy withholds 'lower', the sentence says why."""
    young = flat(demand=0.3 * USABLE)
    for key in ("usage_mean", "usage_max", "demand_max", "capacity_tokens"):
        getattr(young, key)[30:] = [math.nan] * 90
    (m,) = compute(young, served_models={LLAMA: served()}).models
    assert (m.advice.action, m.advice.reason) == ("none", "insufficient_data")
    assert m.advice.sentence.startswith("No advice yet: ") and m.advice.suggested_gpu_memory_utilization is None
    old = flat(demand=0.3 * USABLE)
    (m,) = compute(old, served_models={LLAMA: served()}).models
    assert m.advice.action == "lower_gpu_memory_utilization"
    assert figures.utilization_text(m.advice.suggested_gpu_memory_utilization) in m.advice.sentence


def test_add_replicas_over_the_model():
    """Two pods beyond what the GPU can give: replicas counted on the model's summed peak."""
    small = served(gpu_memory=8 * GIB, kv_dtype_bytes=1)  # fp8 already: no fp8 lever
    pods = [flat(name="r-0", demand=2 * USABLE), flat(name="r-1", demand=1.5 * USABLE)]
    (m,) = compute(*pods, served_models={LLAMA: small}).models
    pool = Pool(CAP, BS, None, 0.9, None, None)
    expected = advise(peak_demand_tokens=2 * USABLE, watched_s=7200, pool=pool, model=small, settings=SETTINGS)
    r0 = m.pods[0].advice
    assert (r0.action, r0.suggested_replicas) == ("add_replicas", expected.suggested_replicas)
    assert r0.capacity_shortfall_tokens == expected.capacity_shortfall_tokens > 0
    c_max = capacity_at_utilization(
        u=0.95, u0=0.9, capacity_tokens=CAP, bytes_per_token=131_072, gpu_memory_bytes=8 * GIB, block_size=BS
    )
    n = suggested_replicas(
        peak_demand_tokens=3.5 * USABLE, target_usage=0.75, capacity_per_replica_tokens=c_max, block_size=BS
    )
    assert m.advice.suggested_replicas == n > r0.suggested_replicas
    assert m.advice.peak_usage_after_ratio == pytest.approx(3.5 * USABLE / (n * (c_max - BS)))
    assert m.advice.sentence.startswith(f"Set --gpu-memory-utilization 0.90 → 0.95 on 2 → {n} replicas: ")
    assert r0.sentence.startswith(f"Run {r0.suggested_replicas} replicas at --gpu-memory-utilization 0.95: ")


def test_kv_cache_memory_bytes_mode():
    """kv_cache_memory_bytes set: the advice names that flag, sized from vLLM's own bytes per token."""
    p0 = flat(demand=0.95 * USABLE, kv_cache_memory_bytes=CAP * 131_072)
    (m,) = compute(p0).models
    a = m.advice
    assert a.action == "raise_kv_cache_memory_bytes" and a.suggested_kv_cache_memory_bytes == 72_960 * 131_072
    assert a.peak_usage_after_ratio == pytest.approx(0.95 * USABLE / (72_960 - BS))
    assert a.sentence.startswith(
        f"Set --kv-cache-memory-bytes 7549747200 (7.0 GiB) → {72_960 * 131_072} (8.9 GiB) on 1 replica: "
    )


def test_quantile_matches_prometheus(tmp_path):
    """figures.quantile is quantile_over_time: the same values through a real promtool give the same numbers."""
    promtool = require_tool("promtool")
    values = [0.42, 0.07, 0.93, 0.5, 0.5, 0.11, 0.78, 0.64, 0.29, 0.86, 0.35]  # 11 samples, one a minute
    tests = []
    for phi in (0.5, 0.9, 0.95, 0.99):
        q = figures.quantile(phi, values)
        tests.append(
            f"      - expr: quantile_over_time({phi}, usage[11m])\n"
            f"        eval_time: 10m\n"
            f"        exp_samples:\n"
            f"          - labels: '{{pod=\"a\"}}'\n"
            f"            value: {q!r}\n"
        )
    body = textwrap.dedent(
        f"""\
        rule_files: []
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'usage{{pod="a"}}'
                values: '{" ".join(map(str, values))}'
            promql_expr_test:
        """
    ) + "".join(tests)
    (tmp_path / "t.yml").write_text(body)
    run = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert figures.quantile(0.5, []) is None
    assert figures.quantile(0.25, [1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    assert figures.quantile(0.95, [0.0, 1.0]) == pytest.approx(0.95)


@pytest.mark.parametrize("export", ["fp8_lever", "suggestion"])
def test_sized_from_what_the_sidecars_exported(export):
    """Without model.config the report sizes from the sidecars' exports: bytes per token, the KV dtype, and the
    GPU memory their own figures imply (80 GiB: C_max at 0.95 = 57,600 + 0.05 × 80 GiB ÷ 131,072 = 90,368 tokens,
    the fp8 lever twice that; or the suggestion 0.9234375 for the 0.95 peak), as with model.config."""
    from sidecar.forecast.sizing import gpu_memory_from_largest_pool, gpu_memory_from_suggestion

    assert gpu_memory_from_largest_pool(
        max_capacity_tokens=90_368, u_max=0.95, u0=0.9, capacity_tokens=CAP, bytes_per_token=131_072
    ) == pytest.approx(80 * GIB)
    assert gpu_memory_from_suggestion(
        suggested=0.9234375,
        u0=0.9,
        capacity_tokens=CAP,
        peak_demand_tokens=0.95 * USABLE,
        target_usage=0.75,
        bytes_per_token=131_072,
        block_size=BS,
        lo=0.5,
        hi=0.95,
    ) == pytest.approx(80 * GIB)
    assert gpu_memory_from_suggestion(
        suggested=0.95, u0=0.9, capacity_tokens=CAP, peak_demand_tokens=2 * USABLE, target_usage=0.75,
        bytes_per_token=131_072, block_size=BS, lo=0.5, hi=0.95,
    ) is None  # clamped: says nothing of M  # fmt: skip

    def exported() -> PodSeries:
        p0 = flat(demand=0.95 * USABLE)
        p0.bytes_per_token = 131_072
        p0.model_info = {"kv_dtype": "bfloat16", "attention": "gqa", "tp": "1", "pp": "1"}
        if export == "fp8_lever":
            p0.fp8_lever_capacity_tokens = 2 * 90_368.0
        else:
            p0.suggested_gpu_memory_utilization_max = 0.9234375
        return p0

    with_config = compute(flat(demand=0.95 * USABLE), served_models={LLAMA: served()}).models[0].advice
    from_exports = compute(exported()).models[0].advice
    bare = compute(flat(demand=0.95 * USABLE)).models[0].advice
    assert bare.set_flags == [] and "no value" in bare.sentence  # nothing exported: a direction only
    assert from_exports.suggested_gpu_memory_utilization == pytest.approx(0.9234375)
    assert from_exports.set_flags == with_config.set_flags == ["--gpu-memory-utilization 0.924"]
    assert from_exports.capacity_after_tokens == with_config.capacity_after_tokens == 72_960
