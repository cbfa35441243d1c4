"""The report's embedded-history source: a history written with known minutes reads back as those steps."""

from __future__ import annotations

import math

import pytest

from sidecar.history import HistoryError, HistoryStore
from sidecar.report.data import ModelKey, Period
from sidecar.report.embedded import HistorySource
from sidecar.report.growth import WeeklyPeak
from sidecar.report.selector import SelectorError, parse_selector

T0 = 1_800_000_000.0  # a multiple of 60: minute i starts at T0 + 60 i
OWN = {"target": "vllm-a", "model_name": "llama", "engine": "0"}


def _write(path, minutes=10, *, target="vllm-a", restart_at=5):
    """Two samples a minute: usage 0.1 i and 0.1 i + 0.05; preemptions +2 a minute, a restart at ``restart_at``."""
    own = {**OWN, "target": target}
    store = HistoryStore.open(path, now=T0)
    preempted = 0.0
    for i in range(minutes):
        for half in (0, 1):
            ts = T0 + 60 * i + 30 * half
            preempted = 0.0 if (i == restart_at and half == 0) else preempted + 1
            store.record(
                ts,
                [
                    ("kvcache_usage_ratio", own, 0.1 * i + 0.05 * half, "gauge"),
                    ("kvcache_demand_tokens", own, 100.0 * i + 10 * half, "gauge"),
                    ("kvcache_capacity_tokens", own, 8192.0 if i < restart_at else 16384.0, "gauge"),
                    ("kvcache_preemptions_total", own, preempted, "counter"),
                    ("kvcache_requests_waiting", {**own, "reason": "capacity"}, float(i % 3), "gauge"),
                    ("kvcache_requests_waiting", {**own, "reason": "deferred"}, 99.0, "gauge"),
                    ("kvcache_gpu_memory_utilization", own, 0.9 if i < restart_at else 0.95, "gauge"),
                    ("kvcache_theoretical_capacity_tokens", {**own, "budget": "estimated"}, 8000.0, "gauge"),
                    (
                        "kvcache_server_info",
                        {
                            **own,
                            "block_size": "16",
                            "kv_cache_memory_bytes": "None",
                            "num_gpu_blocks": str(512 * (1 + (i >= restart_at))),
                        },
                        1.0,
                        "gauge",
                    ),
                ],
            )
    store.flush()
    store.close()


def test_minutes_become_steps(tmp_path):
    _write(tmp_path / "h.sqlite")
    period = Period(T0, T0 + 600)
    week = HistorySource(tmp_path / "h.sqlite").load(period)
    (pod,) = week.pods
    assert (pod.model, pod.pod, pod.engine) == (ModelKey("", "llama"), "vllm-a", "0")
    assert pod.usage_max == pytest.approx([0.1 * i + 0.05 for i in range(10)])
    assert pod.usage_mean == pytest.approx([0.1 * i + 0.025 for i in range(10)])
    assert list(pod.demand_max) == [100.0 * i + 10 for i in range(10)]
    assert list(pod.capacity_tokens) == [8192.0] * 5 + [16384.0] * 5
    # the first sample ever adds nothing; the restart's drop counts the new value (0), then +1 a sample
    assert list(pod.preemptions) == [1.0] + [2.0] * 4 + [1.0] + [2.0] * 4
    assert list(pod.waiting_max) == [float(i % 3) for i in range(10)]  # reason=capacity only
    assert list(pod.theoretical_capacity_tokens) == [8000.0] * 10
    assert pod.gpu_memory_utilization == 0.95 and pod.block_size == 16 and pod.kv_cache_memory_bytes is None
    assert all(math.isnan(x) for x in pod.prefix_queries)  # never recorded: no data, not zero
    assert week.pages == [] and week.pages_known is False
    assert pod.usage_quantiles is None  # figures computes them from the minutes


def test_a_period_cuts_the_steps_and_the_periods_before_are_each_models_peak(tmp_path):
    """Of the periods before (up to 7), each model's peak of summed demand and the share of steps seen."""
    _write(tmp_path / "h.sqlite")
    period = Period(T0 + 300, T0 + 600)
    week = HistorySource(tmp_path / "h.sqlite").load(period, compare_previous=True)
    assert week.pods[0].usage_max == pytest.approx([0.55, 0.65, 0.75, 0.85, 0.95])
    # minutes 0-4 (demand 100 i, then 100 i + 10): peak 410, every step seen; the 6 periods before are empty
    assert week.history == [{ModelKey("", "llama"): WeeklyPeak(T0, 410.0, 1.0)}]
    # a 10-minute period from T0 + 300: the one before starts at T0 - 300, half of its minutes hold data
    longer = HistorySource(tmp_path / "h.sqlite").load(Period(T0 + 300, T0 + 900), compare_previous=True)
    assert longer.history == [{ModelKey("", "llama"): WeeklyPeak(T0 - 300, 410.0, 0.5)}]


def test_no_previous_data_is_no_history_and_a_pod_outside_the_period_is_left_out(tmp_path):
    _write(tmp_path / "h.sqlite")
    week = HistorySource(tmp_path / "h.sqlite").load(Period(T0, T0 + 600), compare_previous=True)
    assert week.history == []
    assert HistorySource(tmp_path / "h.sqlite").load(Period(T0 + 3600, T0 + 7200)).pods == []


def test_the_selector_picks_pods(tmp_path):
    path = tmp_path / "h.sqlite"
    _write(path, target="vllm-a")
    _write(path, target="vllm-b")
    source, period = HistorySource(path), Period(T0, T0 + 600)
    assert [p.pod for p in source.load(period).pods] == ["vllm-a", "vllm-b"]
    assert [p.pod for p in source.load(period, parse_selector('{pod="vllm-b"}')).pods] == ["vllm-b"]
    assert [p.pod for p in source.load(period, parse_selector('{target=~"vllm-.", target!="vllm-a"}')).pods] == [
        "vllm-b"
    ]
    assert source.load(period, parse_selector('{namespace="prod"}')).pods == []  # no namespace in a history


@pytest.mark.parametrize("bad", ['namespace="prod"', "{namespace=prod}", '{a=~"("}', "{a=}"])
def test_a_bad_selector_says_how_to_write_one(bad):
    with pytest.raises(SelectorError, match="namespace=|regular expression|matcher"):
        parse_selector(bad)


def test_missing_and_foreign_files_are_refused_untouched(tmp_path):
    with pytest.raises(HistoryError, match="no history file"):
        HistorySource(tmp_path / "nope.sqlite").load(Period(T0, T0 + 60))
    assert not (tmp_path / "nope.sqlite").exists()  # the report never creates one
    foreign = tmp_path / "notes.txt"
    foreign.write_bytes(b"hello\n" * 1000)
    with pytest.raises(HistoryError):
        HistorySource(foreign).load(Period(T0, T0 + 60))
    assert foreign.read_bytes() == b"hello\n" * 1000


def test_read_while_the_daemon_writes_and_after_it_stopped(tmp_path):
    path = tmp_path / "h.sqlite"
    writer = HistoryStore.open(path, now=T0)
    writer.record(T0, [("kvcache_usage_ratio", OWN, 0.5, "gauge")])
    writer.record(T0 + 60, [("kvcache_usage_ratio", OWN, 0.6, "gauge")])  # the first minute is written
    (pod,) = HistorySource(path).load(Period(T0, T0 + 120)).pods  # the writer is still open (WAL)
    assert pod.usage_max[0] == 0.5 and math.isnan(pod.usage_max[1])
    writer.close()
    assert not path.with_name("h.sqlite-wal").exists()
    (pod,) = HistorySource(path).load(Period(T0, T0 + 120)).pods
    assert list(pod.usage_max) == [0.5, 0.6]
    # no writer: read as immutable, nothing created beside the file (the daemon's folder may not be ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite"]


def test_a_directory_is_refused_with_a_message(tmp_path):
    with pytest.raises(HistoryError, match="a directory"):
        HistorySource(tmp_path).load(Period(T0, T0 + 60))
