"""The known week's files say what its :class:`Known` says, and Prometheus' backfill reads them.

The series are the daemon's (the simulator's ``/metrics`` through :class:`sidecar.replay.Pipeline`),
the known figures come from the definition in ``known_week.py``; so these tests check the
daemon's gauges (usage, demand with its waiting requests, counters across the restart) against
the definition as much as they check the writers. The files are generated once per version of
the code (``.test-artifacts/known-week/``; several minutes the first time).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from known_week import (
    ALERT,
    ALERT_RULES,
    BACKFILL_FLAGS,
    DAY_S,
    HOUR_S,
    LLAMA,
    PODS,
    QWEN,
    WEEK_S,
    Figures,
    Known,
    Usage,
    cached_week,
)

from sidecar.history import HistoryStore

pytestmark = pytest.mark.timeout(1800)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+) (\d+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: the families the tests read back from week.om
_READ = {
    "kvcache_usage_ratio",
    "kvcache_demand_tokens",
    "kvcache_capacity_tokens",
    "kvcache_preemptions_total",
    "kvcache_prefix_cache_queries_tokens_total",
    "kvcache_prefix_cache_hits_tokens_total",
    "kvcache_requests_waiting",
    "ALERTS",
}


@pytest.fixture(scope="module")
def week() -> Known:
    return cached_week()


@pytest.fixture(scope="module")
def om(week: Known) -> dict:
    """week.om read back: {(name, pod, extra label key): [(t, value)]}, the TYPE lines and the line count."""
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
    types: dict[str, str] = {}
    label_cache: dict[str, dict[str, str]] = {}
    lines = 0
    last_family = None
    seen_families: list[str] = []
    with week.files["om"].open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                types[family] = kind
                last_family = family
                seen_families.append(family)
                continue
            if line.startswith("#"):
                assert line == "# EOF\n"
                continue
            lines += 1
            name = line[: line.index("{")]
            assert name.startswith(last_family), f"{name} outside its family {last_family}"
            if name not in _READ:
                continue
            m = _LINE.match(line)
            assert m, line
            labels = label_cache.get(m.group(2))
            if labels is None:
                labels = label_cache[m.group(2)] = dict(_LABEL.findall(m.group(2)))
            extra = f"{labels['severity']}|{labels['alertstate']}" if name == "ALERTS" else labels.get("reason", "")
            series[(name, labels["pod"], extra)].append((int(m.group(4)), float(m.group(3))))
    return {
        "series": series,
        "types": types,
        "lines": lines,
        "families": seen_families,
        "labels": list(label_cache.values()),
    }


def _current(points: list[tuple[int, float]], k: Known) -> list[tuple[int, float]]:
    return [(t, v) for t, v in points if k.start <= t < k.end]


def _previous(points: list[tuple[int, float]], k: Known) -> list[tuple[int, float]]:
    return [(t, v) for t, v in points if k.previous_start <= t < k.start]


def _increases(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Each sample's rise since the one before; a drop is a restart, so its rise is the new value."""
    return [(t, v - p if v >= p else v) for (_, p), (t, v) in zip(points, points[1:], strict=False)]


def _worst_hour(increases: list[tuple[int, float]]) -> tuple[int | None, float]:
    hours: dict[int, float] = defaultdict(float)
    for t, v in increases:
        hours[t - t % HOUR_S] += v
    worst = max(hours, key=lambda h: (hours[h], -h))
    return (worst if hours[worst] else None), hours[worst]


def _check_usage(values: list[float], expected: Usage, interval: int) -> None:
    """Exact: the exported usage is vLLM's float parsed back, and the known figures use the same float."""
    assert Usage.of(values, interval) == expected


def _check_pod(k: Known, pod: str, fig: Figures, series: dict) -> None:
    usage = series[("kvcache_usage_ratio", pod, "")]
    _check_usage([v for _, v in _current(usage, k)], fig.usage, k.interval_s)
    assert len(_current(usage, k)) == fig.samples
    demand = series[("kvcache_demand_tokens", pod, "")]
    assert max(v for _, v in _current(demand, k)) == fig.peak_demand_tokens
    assert max(v for _, v in _previous(demand, k)) == fig.previous_peak_demand_tokens
    capacity = {v for _, v in series[("kvcache_capacity_tokens", pod, "")]}
    assert capacity == {fig.capacity_tokens}
    rises = [(t, v) for t, v in _increases(series[("kvcache_preemptions_total", pod, "")]) if k.start <= t < k.end]
    assert sum(v for _, v in rises) == fig.preemptions_total
    assert _worst_hour(rises) == (fig.worst_hour_start, fig.worst_hour_preemptions)
    queries = sum(
        v for t, v in _increases(series[("kvcache_prefix_cache_queries_tokens_total", pod, "")]) if k.start <= t < k.end
    )
    hits = sum(
        v for t, v in _increases(series[("kvcache_prefix_cache_hits_tokens_total", pod, "")]) if k.start <= t < k.end
    )
    assert (queries, hits) == (fig.prefix_queries_tokens, fig.prefix_hits_tokens)
    waiting = _current(series[("kvcache_requests_waiting", pod, "capacity")], k)
    assert sum(1 for _, v in waiting if v > 0) * k.interval_s / HOUR_S == fig.hours_waiting


def test_the_definition_has_the_stated_shape(week: Known):
    """The known figures carry the story the generator promises (so a report test has something to find)."""
    llama, qwen = week.models[(LLAMA.namespace, LLAMA.model_name)], week.models[(QWEN.namespace, QWEN.model_name)]
    usable = LLAMA.usable_blocks
    assert abs(llama.growth_ratio - 1.10) < 3 / usable  # block rounding only
    assert qwen.growth_ratio == 1.0  # not growing
    burst = week.pods[week.burst.pod]
    assert (burst.worst_hour_start, burst.worst_hour_preemptions) == (week.burst.start, 360)
    assert burst.hours_waiting == 1.0
    assert burst.usage.peak == pytest.approx(0.97, abs=1 / usable)
    assert week.pods[week.restart.pod].samples == WEEK_S // week.interval_s - 10
    assert week.pods["llama-0"].preemptions_total > 0  # above 0.95 at Wednesday's peak
    assert llama.preemptions_total == sum(week.pods[p.name].preemptions_total for p in PODS if p.model is LLAMA)
    assert qwen.preemptions_total == 0 and qwen.usage.hours_above_warning == 0
    assert llama.usage.hours_above_watermark > 0 and llama.usage.peak > 0.9
    assert week.pages and {p.severity for p in week.pages} == {"warning", "critical"}
    assert all(week.start <= p.start < week.end for p in week.pages)
    assert llama.theoretical_capacity_tokens / llama.capacity_tokens == pytest.approx(139280 / 131088)


def test_week_om_agrees_with_known(week: Known, om: dict):
    series = om["series"]
    for pod in PODS:
        _check_pod(week, pod.name, week.pods[pod.name], series)
    # The restart: exactly the ten scrapes of the outage are missing, and the counters restart from 0.
    r = week.restart
    times = {t for t, _ in series[("kvcache_usage_ratio", r.pod, "")]}
    assert not any(r.down_from <= t < r.back for t in times)
    assert {r.down_from - week.interval_s, r.back} <= times
    prompt = dict(series[("kvcache_prefix_cache_queries_tokens_total", r.pod, "")])
    assert prompt[r.back] < prompt[r.down_from - week.interval_s]
    # The model level: the hottest pod per scrape, demand summed over the pods present.
    for (namespace, model), fig in week.models.items():
        pods = [p.name for p in PODS if (p.model.namespace, p.model.model_name) == (namespace, model)]
        hottest: dict[int, float] = defaultdict(float)
        demand: dict[int, float] = defaultdict(float)
        for pod in pods:
            for t, v in _current(series[("kvcache_usage_ratio", pod, "")], week):
                hottest[t] = max(hottest[t], v)
            for t, v in _current(series[("kvcache_demand_tokens", pod, "")], week):
                demand[t] += v
        _check_usage([hottest[t] for t in sorted(hottest)], fig.usage, week.interval_s)
        assert max(demand.values()) == fig.peak_demand_tokens


def test_week_om_is_openmetrics_with_the_scrape_labels(week: Known, om: dict):
    assert len(om["families"]) == len(set(om["families"])), "a family appears twice: not contiguous"
    assert om["types"]["kvcache_preemptions"] == "counter" and om["types"]["kvcache_usage_ratio"] == "gauge"
    for labels in om["labels"]:
        assert {"namespace", "pod", "job", "instance", "model_name"} <= labels.keys(), labels
        if "alertname" not in labels:
            assert labels["target"] == labels["pod"] and labels["engine"] == "0"
    assert week.files["om"].read_text(encoding="utf-8")[-6:] == "# EOF\n"


def test_alerts_fire_where_the_exported_usage_says(week: Known, om: dict):
    """Every firing sample of ALERTS sits at the end of ``for:`` of exported usage above the threshold,
    and the firings, read back as intervals, are the known pages."""
    series = om["series"]
    rules = {severity: (threshold, hold) for severity, threshold, hold in ALERT_RULES}
    found = []
    for pod in PODS:
        usage = dict(series[("kvcache_usage_ratio", pod.name, "")])
        for severity, (threshold, hold) in rules.items():
            firing = [t for t, _ in series.get(("ALERTS", pod.name, f"{severity}|firing"), [])]
            for t in firing:
                window = range(t - hold, t + 1, week.interval_s)
                assert all(usage.get(s, 0.0) > threshold for s in window), (pod.name, severity, t)
            for t, _ in series.get(("ALERTS", pod.name, f"{severity}|pending"), []):
                assert usage[t] > threshold and t not in firing
            for i, t in enumerate(firing):  # runs of consecutive firing evaluations -> [start, end)
                if i == 0 or firing[i - 1] != t - week.interval_s:
                    found.append((pod.name, severity, t, t + week.interval_s))
                else:
                    found[-1] = (*found[-1][:3], t + week.interval_s)
    expected = [(p.pod, p.severity, p.start, p.end) for p in week.previous_pages + week.pages]
    assert sorted(found) == sorted(expected)
    assert all(p.alertname == ALERT for p in week.pages)


def test_history_agrees_with_known(week: Known):
    """The embedded history (one row per minute; one scrape a minute, so max = mean = last)."""
    store = HistoryStore.open(week.files["history"], read_only=True)
    try:
        for pod in PODS:
            fig = week.pods[pod.name]
            (sid, labels), *more = store.series("kvcache_usage_ratio", {"target": pod.name})
            assert not more and set(labels) == {"target", "model_name", "engine"}
            points = store.points(sid, week.start, week.end)
            assert all(p.count == 1 for p in points)
            _check_usage([p.max for p in points], fig.usage, week.interval_s)
            ((sid, _),) = store.series("kvcache_demand_tokens", {"target": pod.name})
            assert max(p.max for p in store.points(sid, week.start, week.end)) == fig.peak_demand_tokens
            previous = store.points(sid, week.previous_start, week.start)
            assert max(p.max for p in previous) == fig.previous_peak_demand_tokens
            ((sid, _),) = store.series("kvcache_preemptions_total", {"target": pod.name})
            rises = [(p.minute, p.increase or 0.0) for p in store.points(sid, week.start, week.end)]
            assert sum(v for _, v in rises) == fig.preemptions_total
            assert _worst_hour(rises) == (fig.worst_hour_start, fig.worst_hour_preemptions)
        r = week.restart
        ((sid, _),) = store.series("kvcache_usage_ratio", {"target": r.pod})
        assert store.points(sid, r.down_from, r.back) == []
    finally:
        store.close()


def _promtool() -> str:
    repo_tool = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "promtool"
    tool = str(repo_tool) if repo_tool.exists() else shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is needed (make test installs it into .tools/bin)")
    return tool


def test_promtool_backfills_the_week(week: Known, om: dict, tmp_path: Path):
    """``promtool tsdb create-blocks-from openmetrics`` reads every sample of week.om into blocks.

    With :data:`BACKFILL_FLAGS` (blocks of up to a week) it takes seconds; with promtool's default of
    2-hour blocks it parses the whole file once per block, 168 times (about 4 minutes here).
    """
    out = tmp_path / "blocks"
    done = subprocess.run(
        [_promtool(), "tsdb", "create-blocks-from", "openmetrics", *BACKFILL_FLAGS, str(week.files["om"]), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metas = [json.loads(p.read_text()) for p in out.glob("*/meta.json")]
    assert metas
    assert sum(m["stats"]["numSamples"] for m in metas) == om["lines"]
    assert min(m["minTime"] for m in metas) == week.previous_start * 1000
    assert max(m["maxTime"] for m in metas) > (week.end - DAY_S) * 1000
