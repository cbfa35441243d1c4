"""The parts of ``python -m sidecar.artifacts.pictures`` that decide what lands in Prometheus.

The whole command (a simulated day, backfilled, drawn) takes minutes and is run by ``make pictures``,
not here; these tests hold the pieces whose mistakes would not show as an error but as a wrong
picture: which series are kept, the labels Prometheus gives them, the OpenMetrics text, and the
``ALERTS`` samples derived from the alerting rules.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sidecar.alert_params import RuleParams
from sidecar.artifacts.pictures import (
    DAY_START,
    FLEET,
    RULE_INTERVAL_S,
    VLLM_JOB,
    SeriesStore,
    alerts,
    queried_names,
)
from sidecar.artifacts.rules import build_rule_groups
from sidecar.artifacts.snapshot.cli import load_dashboards
from sidecar.thresholds import Thresholds

REPO = Path(__file__).resolve().parents[2]


def test_every_series_the_dashboards_and_rules_read_is_kept_and_no_other():
    dashboards = load_dashboards(REPO / "dashboards")
    wanted = queried_names(dashboards, build_rule_groups(Thresholds(), RuleParams())["groups"])
    for name in (
        "kvcache_usage_ratio",
        "vllm:time_to_first_token_seconds_bucket",  # histogram_quantile reads the buckets
        "process_start_time_seconds",  # the restarts annotation
        "up",
    ):
        assert name in wanted, name
    page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\nvllm:cache_unused_x 1\n"
    store = SeriesStore(wanted)
    store.add_page(page, FLEET[0].target_labels(VLLM_JOB), float(DAY_START))
    assert list(store.series) == ["vllm:num_requests_running"]


def test_the_scrape_labels_win_and_a_clashing_page_label_is_kept_as_exported():
    """Prometheus' default ``honor_labels: false``: the target's ``pod`` wins, the page's becomes ``exported_pod``."""
    store = SeriesStore(frozenset({"m"}))
    store.add_page('m{pod="inner",engine="0"} 2\n', {"job": "vllm", "pod": "vllm-a-0"}, 100.0)
    store.add_page('m{pod="inner",engine="0"} NaN\n', {"job": "vllm", "pod": "vllm-a-0"}, 130.0)
    out = io.StringIO()
    store.write(out)
    assert out.getvalue() == (
        "# TYPE m unknown\n"
        'm{engine="0",exported_pod="inner",job="vllm",pod="vllm-a-0"} 2.0 100\n'
        'm{engine="0",exported_pod="inner",job="vllm",pod="vllm-a-0"} NaN 130\n'
        "# EOF\n"
    )


class _Answers:
    """A Prometheus that answers every range query with the given ``result``."""

    def __init__(self, result: list[dict]) -> None:
        self.result = result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.result


def test_alerts_are_pending_until_their_for_then_firing_and_a_gap_starts_over():
    """A rule with ``for: 2m`` holding at 0, 60, 120, 180 s, then again from 300 s: pending, pending, firing,
    firing; after the gap pending again (Prometheus resets an alert that stopped holding)."""
    t0 = DAY_START
    held = [t0 + s for s in (0, 60, 120, 180, 300, 360)]
    api = _Answers([{"metric": {"pod": "p", "__name__": "x"}, "values": [[t, "1"] for t in held]}])
    rule = {"alert": "KVCacheAlmostFull", "expr": "x > 0.9", "for": "2m", "labels": {"severity": "warning"}}
    store = alerts(api, [rule])  # type: ignore[arg-type]
    states = {}
    for text, (times, _) in store.series["ALERTS"].items():
        state = "firing" if 'alertstate="firing"' in text else "pending"
        assert 'alertname="KVCacheAlmostFull"' in text and 'severity="warning"' in text and "__name__" not in text
        states.update({int(t - t0): state for t in times})
    assert states == {0: "pending", 60: "pending", 120: "firing", 180: "firing", 300: "pending", 360: "pending"}
    assert RULE_INTERVAL_S == 60


@pytest.mark.parametrize("hold", [None, "0s"])
def test_an_alert_without_for_fires_at_once(hold):
    api = _Answers([{"metric": {}, "values": [[DAY_START, "1"]]}])
    store = alerts(api, [{"alert": "A", "expr": "x", "for": hold, "labels": {"severity": "critical"}}])  # type: ignore[arg-type]
    (text,) = store.series["ALERTS"]
    assert 'alertstate="firing"' in text
