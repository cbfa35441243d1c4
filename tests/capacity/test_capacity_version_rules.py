"""The version table: which profile rules a vLLM version follows, and how the scraped page dates a server."""

from __future__ import annotations

import pytest

from sidecar.capacity import CapacityError
from sidecar.capacity.vllm_rules import VERSION_RULES, rules_for, served_version


@pytest.mark.parametrize(
    ("version", "engine", "since"),
    [
        ("0.6.5", "V0", (0, 6, 4)),
        ("0.7.3", "V0", (0, 6, 4)),
        ("0.8.3", "V1", (0, 8, 0)),
        ("0.8.4", "V1", (0, 8, 4)),
        ("0.9.0", "V1", (0, 9, 0)),
        ("0.10.1", "V1", (0, 9, 1)),
        ("0.11.0", "V1", (0, 11, 0)),
        ("0.20.2", "V1", (0, 11, 0)),
        ("0.21.0", "V1", (0, 21, 0)),
        ("0.31.0", "V1", (0, 21, 0)),
        ("0.32.0", "V1", (0, 32, 0)),
        (None, "V1", (0, 32, 0)),
    ],
)
def test_each_version_finds_its_row(version, engine, since):
    rules = rules_for(version)
    assert (rules.engine, rules.since) == (engine, since)


def test_the_table_is_in_version_order_and_graphs_start_at_0_21():
    assert [r.since for r in VERSION_RULES] == sorted(r.since for r in VERSION_RULES)
    assert [r.since for r in VERSION_RULES if r.cudagraph_subtracted][0] == (0, 21, 0)
    assert all(r.cudagraph_subtracted for r in VERSION_RULES if r.since >= (0, 21, 0))


def test_v0_on_request_up_to_0_10_only():
    assert rules_for("0.9.2", "V0").engine == "V0"
    with pytest.raises(CapacityError, match="no V0 engine"):
        rules_for("0.11.0", "V0")


def test_v1_on_request_before_it_was_the_default():
    assert rules_for("0.7.3", "V1").since == (0, 8, 0)


def test_too_old_a_version_is_refused_with_the_fix():
    with pytest.raises(CapacityError, match="give 0.6.4 or later"):
        rules_for("0.5.4")


def test_the_page_dates_the_server_when_the_setting_is_older_or_absent():
    capacity_labels = {"block_size": "16", "kv_cache_size_tokens": "1000"}
    assert served_version(capacity_labels, None) == "0.21.0"
    assert served_version(capacity_labels, "0.11.0") == "0.21.0"  # the page shows a later server
    assert served_version(capacity_labels, "0.25.1") == "0.25.1"
    assert served_version({"kv_cache_memory_bytes": "None"}, None) == "0.10.2"
    assert served_version({"block_size": "16"}, "0.9.2") == "0.9.2"
    assert served_version({"block_size": "16"}, None) is None  # the newest rules
