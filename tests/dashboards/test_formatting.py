"""The one way thresholds are written into the rules and the dashboards (``sidecar.artifacts.formatting``)."""

from __future__ import annotations

import pytest

from sidecar.alert_params import RuleParams
from sidecar.artifacts.formatting import percent, promql_number
from sidecar.thresholds import Thresholds
from sidecar.units import prometheus_duration_seconds


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Thresholds().watermark, "0.9"),  # the default paging watermark, as alerts/kvcache.rules.yaml compares
        (0.85, "0.85"),
        (prometheus_duration_seconds(RuleParams().full_soon_within), "900"),  # 15m: a whole float loses its ".0"
        (604800.0, "604800"),
        (0.123456789, "0.123456789"),  # every digit kept: PromQL compares against the configured value
        (0.1 + 0.2, "0.30000000000000004"),  # exactly the float, not a rounded neighbour
    ],
)
def test_promql_number_writes_the_exact_value(value, text):
    assert promql_number(value) == text
    assert float(text) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Thresholds().watermark, "90%"),
        (Thresholds().warning, "80%"),
        (0.07, "7%"),  # 0.07 * 100 is 7.000000000000001 in floating point
        (0.123456, "12.3456%"),
        (RuleParams().capacity_mismatch_tolerance, "20%"),  # the efficiency panel's "1 ± 20%"
    ],
)
def test_percent_reads_as_a_sentence_says_it(value, text):
    assert percent(value) == text
