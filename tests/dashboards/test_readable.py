"""What an on-call engineer reads in five seconds: Grafana's own units, human text for every enum, the paging
count that matches what paged, and a row that says whether users hurt.

Grafana's unit ids are those of its unit picker (``packages/grafana-data/src/valueFormats/categories.ts`` in
grafana/grafana): a unit Grafana does not know is drawn as a bare number with the id as suffix.
"""

from __future__ import annotations

from typing import Any

from sidecar.artifacts.dashboards import USERS_ROW_TITLE, build_dashboards
from sidecar.artifacts.params import DASHBOARD_OVERVIEW_UID
from sidecar.forecast.recommendation import ACTIONS, REASONS

#: The ids of Grafana's unit picker these dashboards may use (categories.ts: Misc, Percent, Time, Throughput).
GRAFANA_UNITS = {
    "none", "short", "percent", "percentunit", "s", "ms", "µs", "ns", "m", "h", "d", "dtdurations", "dthms",
    "bytes", "decbytes", "reqps", "ops", "rps", "wps", "rpm", "opm", "bool", "locale",
}  # fmt: skip


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in d["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def _units(panel: dict[str, Any]) -> list[str]:
    field = panel.get("fieldConfig", {})
    units = [field.get("defaults", {}).get("unit", "")]
    for override in field.get("overrides", []):
        units += [p["value"] for p in override.get("properties", []) if p.get("id") == "unit"]
    return units


def test_every_unit_is_from_grafanas_list() -> None:
    for uid, d in build_dashboards().items():
        for panel in _panels(d):
            if panel.get("type") == "row":
                continue
            for unit in _units(panel):
                assert unit in GRAFANA_UNITS, f"{uid} {panel['title']!r}: unit {unit!r} is not Grafana's"


def test_preemptions_are_not_requests_per_second() -> None:
    """A preemption is no request served: no "req/s" on a preemption panel or column."""
    for uid, d in build_dashboards().items():
        for panel in _panels(d):
            text = panel.get("title", "") + " ".join(t.get("expr", "") for t in panel.get("targets", []))
            if "preemption" in text.lower():
                assert "reqps" not in _units(panel), f"{uid} {panel['title']!r}"


def _mapped_texts(panel: dict[str, Any], column: str) -> dict[str, str]:
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"].get("options") != column:
            continue
        for prop in override["properties"]:
            if prop["id"] == "mappings":
                return {k: v["text"] for m in prop["value"] for k, v in m["options"].items()}
    return {}


def test_every_action_and_reason_reads_as_text() -> None:
    tables = [
        (uid, p)
        for uid, d in build_dashboards().items()
        for p in _panels(d)
        if any("action, reason) (kvcache_recommendation_info" in t.get("expr", "") for t in p.get("targets", []))
    ]
    assert tables
    for uid, panel in tables:
        actions, reasons = _mapped_texts(panel, "Action"), _mapped_texts(panel, "Reason")
        assert set(actions) == set(ACTIONS) and set(reasons) == set(REASONS), (uid, panel["title"])
        assert not any("_" in text.replace("--", "") for text in (*actions.values(), *reasons.values()))


def test_the_paging_count_counts_what_paged() -> None:
    d = build_dashboards()[DASHBOARD_OVERVIEW_UID]
    (stat,) = [p for p in _panels(d) if p.get("title", "").startswith("Pages firing")]
    (expr,) = [t["expr"] for t in stat["targets"]]
    assert 'severity="critical"' in expr and " or (" not in expr.replace("or vector(0)", "")


def test_fleet_has_a_row_on_what_users_feel() -> None:
    d = build_dashboards()[DASHBOARD_OVERVIEW_UID]
    panels = d["panels"]
    (at,) = [i for i, p in enumerate(panels) if p.get("type") == "row" and p["title"] == USERS_ROW_TITLE]
    row = panels[at]["panels"] or [p for p in panels[at + 1 :] if p.get("type") != "row"]
    exprs = " ".join(t["expr"] for p in row for t in p.get("targets", []))
    for series in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
    ):
        assert series in exprs, series
