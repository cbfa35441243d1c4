"""The pieces every engine adapter shares (sidecar/engines/families.py): numbers, histograms, no capacity."""

from __future__ import annotations

import math

from sidecar.engines import families
from sidecar.observation import KVPool, Observation, Rejections


def _one(labels: object) -> str:
    return "0"


def test_a_histogram_per_key_with_copies_added_up() -> None:
    by_name = {
        "h_bucket": [({"le": "10"}, 1.0), ({"le": "+Inf"}, 3.0), ({"le": "10"}, 2.0), ({"le": "+Inf"}, 2.0)],
        "h_count": [({}, 3.0), ({}, 2.0)],
        "h_sum": [({}, 40.0), ({}, 10.0)],
    }
    rejections = Rejections()
    (h,) = families.histograms(by_name, "h", rejections, _one).values()
    assert h.buckets == ((10.0, 3.0), (math.inf, 5.0)) and (h.count, h.sum) == (5.0, 50.0)
    assert rejections.counts == {}


def test_a_histogram_that_cannot_be_one_is_dropped_and_counted() -> None:
    falls = {"h_bucket": [({"le": "10"}, 4.0), ({"le": "+Inf"}, 3.0)], "h_count": [({}, 3.0)]}
    rejections = Rejections()
    assert families.histograms(falls, "h", rejections, _one) == {}
    assert rejections.counts == {"histogram_mismatch": 1}
    nan_bound = {"h_bucket": [({"le": "x"}, 1.0)], "h_count": [({}, 1.0)]}
    assert families.histograms(nan_bound, "h", rejections, _one) == {}
    assert rejections.counts == {"histogram_mismatch": 1, "invalid_value": 1}


def test_as_float_and_usable_count() -> None:
    assert families.as_float(10**400) == math.inf and families.as_float(3) == 3.0
    assert families.usable_count(0.0) and not families.usable_count(-1.0) and not families.usable_count(math.nan)


def test_no_capacity_counts_each_engine_without_a_pool_and_names_the_gauges() -> None:
    rejections = Rejections()
    without = [Observation("m", "0"), Observation("m", "1", usage_ratio=0.5)]
    absent = families.no_capacity(without, rejections, field="f", reason="set it")
    assert rejections.counts == {"no_capacity": 2} and rejections.examples == {("no_capacity", "f"): "set it"}
    assert absent["kvcache_capacity_tokens"] == "set it"
    assert "kvcache_usage_ratio" not in absent  # an engine's own fraction needs no capacity
    mixed = [Observation("m", "0"), Observation("m", "1", pool=KVPool(capacity_tokens=10))]
    rejections = Rejections()
    assert families.no_capacity(mixed, rejections, field="f", reason="r") == {}  # published for one engine
    assert rejections.counts == {"no_capacity": 1}
