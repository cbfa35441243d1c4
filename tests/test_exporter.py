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
