"""The report's growth over five weeks of history, from a real Prometheus and from the embedded history.

Three models, one pod each, a sample a minute for five weeks (the report's week and the four before it),
the same data backfilled into Prometheus (``promtool``) and written to a history file:

- ``steady``: weekly peaks 40,000, 44,000, 47,000, 52,000, 55,000 tokens (weeks −4 … 0);
- ``gappy``: 30,000, 33,500, —, 39,000, 41,500: week −2 has no sample at all (a gap, never a zero);
- ``full``: 60,000 … 75,000 and 81,000 this week, over its 80,000 usable tokens.

Each week the demand sits at half its peak, and at the peak for one minute (Wednesday 12:00 UTC). Every pod
has 80,016 tokens (vLLM's figure, null block included) in blocks of 16: 80,000 usable.

The expected figures are worked out by hand below from those peaks (Montgomery, Peck & Vining section 2.2,
section 2.4.1; Student's t for 80 % from the NIST/SEMATECH table, section 1.3.6.7.2); the interval of the
weeks until full is checked by its definition: the fitted line's 80 % confidence band meets the capacity at its ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backfill import backfilled_prometheus

from sidecar.forecast.policy import AdviceSettings
from sidecar.history import HistoryStore
from sidecar.report.data import Period, Week
from sidecar.report.embedded import HistorySource
from sidecar.report.figures import compute
from sidecar.report.growth import WEEK_S, growth_text
from sidecar.report.prometheus import MODEL_USAGE_RULE, MODEL_WAITING_RULE, PrometheusSource
from sidecar.report.results import ModelReport
from sidecar.thresholds import Thresholds

DAY = 86_400
WEEK = int(WEEK_S)
#: The report's week ends at a midnight UTC at least a day ago; the history starts four weeks before it.
END = (int(time.time()) // DAY - 1) * DAY
PERIOD = Period(float(END - WEEK), float(END))
START = END - 5 * WEEK
MINUTES = 5 * WEEK // 60
#: The peak's minute in each week: Wednesday 12:00 UTC is 2 days 12 h after a Monday, any offset will do.
PEAK_MINUTE = (2 * DAY + 12 * 3600) // 60
CAPACITY, BLOCK, USABLE = 80_016, 16, 80_000.0
TH = Thresholds()
SETTINGS = AdviceSettings(target_usage=0.75, utilization_min=0.5, utilization_max=0.95, peak_window_s=3600.0)

#: Each model's weekly peaks, weeks −4 … 0 (None: no sample that week).
PEAKS: dict[str, list[float | None]] = {
    "steady": [40_000, 44_000, 47_000, 52_000, 55_000],
    "gappy": [30_000, 33_500, None, 39_000, 41_500],
    "full": [60_000, 65_000, 70_000, 75_000, 81_000],
}
NAMESPACE = "growth"
#: The 80 % two-sided critical value of Student's t (t_{0.90, ν}), NIST/SEMATECH e-Handbook section 1.3.6.7.2.
T80 = {2: 1.886, 3: 1.638}


def _labels(model: str) -> dict[str, str]:
    return {"namespace": NAMESPACE, "pod": f"{model}-0", "model_name": model, "engine": "0"}


def demand(model: str, minute: int) -> float | None:
    """The pod's demand at ``minute`` since START: half the week's peak, the peak at PEAK_MINUTE (None: no sample)."""
    week, within = divmod(minute, WEEK // 60)
    peak = PEAKS[model][week]
    if peak is None:
        return None
    return peak if within == PEAK_MINUTE else peak / 2


def samples(model: str, minute: int) -> list[tuple[str, dict[str, str], float]]:
    """What the pod's sidecar exported at ``minute``: usage, demand, capacity and the block size."""
    d = demand(model, minute)
    if d is None:
        return []
    own = _labels(model)
    return [
        ("kvcache_usage_ratio", own, min(1.0, d / USABLE)),
        ("kvcache_demand_tokens", own, d),
        ("kvcache_capacity_tokens", own, float(CAPACITY)),
        ("kvcache_server_info", {**own, "block_size": str(BLOCK), "kv_cache_memory_bytes": ""}, 1.0),
    ]


def openmetrics(path: Path) -> None:
    """The five weeks as OpenMetrics text for ``promtool``: each series' samples together, in time order."""
    with path.open("w", encoding="utf-8") as out:
        for index in range(4):  # the series of samples(), in that order
            for model in PEAKS:
                for minute in range(MINUTES):
                    found = samples(model, minute)
                    if found:
                        name, labels, value = found[index]
                        text = ",".join(f'{k}="{v}"' for k, v in {**labels, "job": "kv-cache-sidecar"}.items())
                        out.write(f"{name}{{{text}}} {value} {START + 60 * minute}\n")
        out.write("# EOF\n")


def history_file(path: Path) -> None:
    """The same five weeks in the sidecar's history (kept 40 days: the default 8 keeps one week before)."""
    store = HistoryStore.open(path, now=START, retention_s=40 * DAY, max_bytes=2**30)
    for minute in range(MINUTES):
        found = [
            (n, {**labels, "target": labels["pod"]}, v, "gauge") for m in PEAKS for n, labels, v in samples(m, minute)
        ]
        if found:
            store.record(START + 60 * minute + 30, found)
    store.flush()
    store.close()


def _models(week: Week) -> dict[str, ModelReport]:
    report = compute(week, thresholds=TH, advice=SETTINGS, generated_at=0.0)
    return {m.model.model_name: m for m in report.models}


@pytest.fixture(scope="module")
def from_prometheus(tmp_path_factory) -> Iterator[dict[str, ModelReport]]:
    work = tmp_path_factory.mktemp("growth-prometheus")
    openmetrics(work / "weeks.om")
    # the recording rules are evaluated over the report's week only (the weeks before are read for their demand)
    with backfilled_prometheus(
        work, work / "weeks.om", PERIOD.start - 3600, PERIOD.end, TH, records=(MODEL_USAGE_RULE, MODEL_WAITING_RULE)
    ) as url:
        source = PrometheusSource(url, concurrency=2)
        week = source.load(PERIOD, f'{{namespace="{NAMESPACE}"}}', compare_previous=True, thresholds=TH)
        yield _models(week)


@pytest.fixture(scope="module")
def from_history(tmp_path_factory) -> dict[str, ModelReport]:
    path = tmp_path_factory.mktemp("growth-history") / "history.sqlite"
    history_file(path)
    return _models(HistorySource(path).load(PERIOD, compare_previous=True))


def _band(xs: list[float], ys: list[float], x: float, t: float) -> tuple[float, float]:
    """The fitted line's confidence band at ``x`` (lower, upper), written out: ŷ ± t·s·√(1/n + (x − x̄)²/Sxx)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((a - mx) ** 2 for a in xs)
    b = sum((a - mx) * (c - my) for a, c in zip(xs, ys, strict=True)) / sxx
    s = math.sqrt(sum((c - (my + b * (a - mx))) ** 2 for a, c in zip(xs, ys, strict=True)) / (n - 2))
    half = t * s * math.sqrt(1 / n + (x - mx) ** 2 / sxx)
    return my + b * (x - mx) - half, my + b * (x - mx) + half


def _check_steady(m: ModelReport) -> None:
    """x = −4 … 0, y = 40, 44, 47, 52, 55 (thousand tokens): x̄ = −2, ȳ = 47.6, Sxx = 10,
    Sxy = (−2)(−7.6) + (−1)(−3.6) + 0 + (1)(4.4) + (2)(7.4) = 38, so b = 3.8 thousand a week; the line at
    week 0 is 47.6 + 2 × 3.8 = 55.2; residuals 0, 0.2, −0.6, 0.6, −0.2: SSE = 0.8, s² = 0.8 / 3,
    se(b) = √(0.8 / 3 / 10) = 0.163299; with t = 1.638 (ν = 3) the growth is 3,800 ± 267.5 a week; full
    when 55.2 + 3.8 x = 80: x = 24.8 / 3.8 = 6.526 weeks."""
    g = m.growth
    assert (g.verdict, g.method, g.weeks_fitted, g.weeks_skipped) == ("growing", "least squares", 5, 0)
    assert g.growth_tokens_per_week == pytest.approx(3_800.0, rel=1e-9)
    assert g.growth_standard_error_tokens_per_week == pytest.approx(163.299, rel=1e-5)
    assert g.growth_low_tokens_per_week == pytest.approx(3_800.0 - 1.638 * 163.299, rel=1e-4)
    assert g.growth_high_tokens_per_week == pytest.approx(3_800.0 + 1.638 * 163.299, rel=1e-4)
    assert g.trend_peak_demand_tokens == pytest.approx(55_200.0, rel=1e-9)
    assert g.growth_ratio_per_week == pytest.approx(3_800 / 55_200, rel=1e-9)
    assert g.weeks_until_full == pytest.approx(24.8 / 3.8, rel=1e-9)
    assert (g.previous_peak_demand_tokens, g.change_ratio) == (52_000.0, pytest.approx(55 / 52 - 1))
    # the interval's ends: where the band's upper edge (fast) and lower edge (slow) meet the 80,000 usable tokens
    xs, ys = [-4.0, -3.0, -2.0, -1.0, 0.0], [40_000.0, 44_000.0, 47_000.0, 52_000.0, 55_000.0]
    assert g.weeks_until_full_low is not None and g.weeks_until_full_high is not None
    assert g.weeks_until_full_low < g.weeks_until_full < g.weeks_until_full_high
    assert _band(xs, ys, g.weeks_until_full_low, T80[3])[1] == pytest.approx(USABLE, rel=1e-3)
    assert _band(xs, ys, g.weeks_until_full_high, T80[3])[0] == pytest.approx(USABLE, rel=1e-3)
    assert m.needs_action is False  # 6.5 weeks away, nothing else to do
    assert "full in 6.5 weeks (80%: " in growth_text(g) and "over 5 weeks" in growth_text(g)


def _check_gappy(m: ModelReport) -> None:
    """Week −2 is absent, so x = −4, −3, −1, 0 (a gap, not four weeks in a row), y = 30, 33.5, 39, 41.5:
    x̄ = −2, ȳ = 36, Sxx = 4 + 1 + 1 + 4 = 10, Sxy = 12 + 2.5 + 3 + 11 = 28.5, b = 2.85 thousand a week
    (read as consecutive weeks it would be 4.0); the line at 0 is 41.7; residuals −0.3, 0.35, 0.15, −0.2:
    SSE = 0.275, s² = 0.1375 (ν = 2), se(b) = √(0.01375) = 0.117260; t = 1.886; full at
    (80 − 41.7) / 2.85 = 13.439 weeks."""
    g = m.growth
    assert (g.verdict, g.method, g.weeks_fitted, g.weeks_skipped) == ("growing", "least squares", 4, 0)
    assert g.growth_tokens_per_week == pytest.approx(2_850.0, rel=1e-9)
    assert g.growth_standard_error_tokens_per_week == pytest.approx(117.260, rel=1e-5)
    assert g.growth_low_tokens_per_week == pytest.approx(2_850.0 - 1.886 * 117.260, rel=1e-4)
    assert g.trend_peak_demand_tokens == pytest.approx(41_700.0, rel=1e-9)
    assert g.weeks_until_full == pytest.approx(38.3 / 2.85, rel=1e-9)
    assert g.previous_peak_demand_tokens == 39_000.0  # the latest week seen before this one: week −1
    xs, ys = [-4.0, -3.0, -1.0, 0.0], [30_000.0, 33_500.0, 39_000.0, 41_500.0]
    assert g.weeks_until_full_low is not None and g.weeks_until_full_high is not None
    assert _band(xs, ys, g.weeks_until_full_low, T80[2])[1] == pytest.approx(USABLE, rel=1e-3)
    assert _band(xs, ys, g.weeks_until_full_high, T80[2])[0] == pytest.approx(USABLE, rel=1e-3)


def _check_full(m: ModelReport) -> None:
    """81,000 tokens at the peak over 80,000 usable: already full, whatever the trend says."""
    g = m.growth
    assert (g.verdict, g.weeks_until_full, g.weeks_until_full_low, g.weeks_until_full_high) == ("at capacity", 0, 0, 0)
    assert g.weeks_fitted == 5 and g.growth_tokens_per_week == pytest.approx(5_200.0, rel=1e-9)  # fitted all the same
    assert growth_text(g) == "already full" and m.needs_action
    assert "already full on full-0" in m.summary and "full in" not in m.summary


def _check(models: dict[str, ModelReport]) -> None:
    assert sorted(models) == ["full", "gappy", "steady"]
    _check_steady(models["steady"])
    _check_gappy(models["gappy"])
    _check_full(models["full"])


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_growth_over_five_weeks_from_prometheus(from_prometheus):
    _check(from_prometheus)


def test_growth_over_five_weeks_from_the_embedded_history(from_history):
    _check(from_history)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_both_sources_give_the_same_growth(from_prometheus, from_history):
    for name, m in from_prometheus.items():
        assert m.growth == from_history[name].growth, name
