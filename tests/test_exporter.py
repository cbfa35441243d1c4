"""The custom collector describes what it exports, so a registry refuses duplicates."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily

from sidecar.exporter import SidecarCollector
from sidecar.metrics import CATALOGUE


def _collector() -> SidecarCollector:
    return SidecarCollector([], staleness_s=60.0)


def test_describe_lists_every_family_of_the_catalogue_empty():
    described = list(_collector().describe())
    assert [m.name for m in described] == [m.name.removesuffix("_total") for m in CATALOGUE]
    assert all(m.samples == [] for m in described)
    assert [m.type for m in described] == ["counter" if m.type == "counter" else "gauge" for m in CATALOGUE]


def test_a_second_sidecar_collector_is_refused():
    registry = CollectorRegistry(auto_describe=False)  # as the daemon creates it
    registry.register(_collector())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(_collector())


def test_a_collector_exporting_one_of_the_names_is_refused():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_collector())

    class Other:
        def describe(self):
            return [GaugeMetricFamily("kvcache_usage_ratio", "someone else's usage")]

        def collect(self):
            return []

    with pytest.raises(ValueError, match="kvcache_usage_ratio"):
        registry.register(Other())
    # a counter's exposed names count too: kvcache_preemptions_total is the family kvcache_preemptions
    with pytest.raises(ValueError, match="kvcache_preemptions_total"):
        Gauge("kvcache_preemptions_total", "a gauge named like the sidecar's counter", registry=registry)


def test_the_collector_is_refused_where_one_of_its_names_is_taken():
    registry = CollectorRegistry(auto_describe=False)
    Gauge("kvcache_usage_ratio", "not the sidecar's", registry=registry)
    with pytest.raises(ValueError, match="kvcache_usage_ratio"):
        registry.register(_collector())


# --- a value of the wrong shape is refused and counted, never a failed page ------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("kvcache_demand_tokens", "12"),  # a string: had no .items(), AttributeError out of collect()
        ("kvcache_requests_waiting", {(1,): 2.0}),  # a label that is not a string: generate_latest failed
        ("kvcache_demand_tokens", 10**400),  # an int past a float: OverflowError out of collect()
        ("kvcache_requests_waiting", {("capacity",): 10**400}),
        ("kvcache_requests_waiting", [("capacity", 1.0)]),  # a list, not a mapping
        ("kvcache_requests_waiting", {"capacity": 1.0}),  # labels not a tuple (a str of length 8)
    ],
)
def test_a_value_of_the_wrong_shape_is_refused_and_the_page_served(name, value):
    from prometheus_client import generate_latest

    from sidecar.config import load_config
    from sidecar.metrics import BY_NAME
    from sidecar.state import Snapshot, TargetState

    config = load_config(None, env={}, flags={}, flag_targets=["http://127.0.0.1:9/m"])
    state = TargetState(target=config.targets[0], history_s=60.0)
    good = BY_NAME["kvcache_usage_ratio"]
    state.snapshot = Snapshot(up=True, last_success_wall=0.0, values={("m", "0"): {BY_NAME[name]: value, good: 0.5}})
    collector = SidecarCollector([state], staleness_s=60.0, clock=lambda: 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    page = generate_latest(registry).decode()
    assert 'kvcache_usage_ratio{engine="0",model_name="m",target="127.0.0.1:9"} 0.5' in page
    assert "kvcache_sidecar_export_errors_total 1.0" in page
    assert f"{name}{{" not in page  # nothing of the refused value, not even part of it
