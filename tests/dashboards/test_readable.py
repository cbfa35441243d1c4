"""What an on-call engineer reads in five seconds: Grafana's own units, human text for every enum, the paging
count that matches what paged, and a row that says whether users hurt.

Grafana's unit ids are those of its unit picker (``packages/grafana-data/src/valueFormats/categories.ts`` in
grafana/grafana): a unit Grafana does not know is drawn as a bare number with the id as suffix. Its custom
units (``suffix:<text>``, ``prefix:<text>``: ``valueFormats.ts``, ``getValueFormat``) name what Grafana's
list has no unit for (tokens/s).
"""

from __future__ import annotations

import re
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


#: Grafana's explicit custom units: a text after or before the number.
CUSTOM_UNIT = re.compile(r"(suffix|prefix):.*\S.*")


def test_every_unit_is_from_grafanas_list() -> None:
    for uid, d in build_dashboards().items():
        for panel in _panels(d):
            if panel.get("type") == "row":
                continue
            for unit in _units(panel):
                known = unit in GRAFANA_UNITS or CUSTOM_UNIT.fullmatch(unit)
                assert known, f"{uid} {panel['title']!r}: unit {unit!r} is neither Grafana's nor suffix:/prefix:"


def test_the_unit_check_refuses_what_grafana_does_not_know() -> None:
    for unit in ("tokens/s", "req/s", "suffix:", "suffix: ", "percentage"):
        assert unit not in GRAFANA_UNITS and not CUSTOM_UNIT.fullmatch(unit), unit


def test_a_bare_count_on_a_graph_says_what_it_counts() -> None:
    """ "short"/"none" is a bare number: the graph's axis label names it (tokens, requests, preemptions/s)."""
    for uid, d in build_dashboards().items():
        for panel in _panels(d):
            defaults = panel.get("fieldConfig", {}).get("defaults", {})
            if panel.get("type") == "timeseries" and defaults.get("unit") in ("short", "none"):
                assert defaults.get("custom", {}).get("axisLabel"), f"{uid} {panel['title']!r}"


def test_the_fill_rate_is_in_tokens_per_second() -> None:
    (panel,) = [p for d in build_dashboards().values() for p in _panels(d) if p.get("title") == "Fill rate"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "suffix: tokens/s"


def test_ratios_read_as_percent_everywhere() -> None:
    """Every ratio is 0-1 and shown as percentunit; no 0-100 "percent"; the server table's
    gpu_memory_utilization label is converted to a number so that it reads "90%", not "0.9"."""
    built = build_dashboards()
    for uid, d in built.items():
        for panel in _panels(d):
            assert "percent" not in _units(panel), f"{uid} {panel['title']!r}"
    (server,) = [p for d in built.values() for p in _panels(d) if p.get("title") == "Server"]
    (convert,) = [t["options"] for t in server["transformations"] if t["id"] == "convertFieldType"]
    assert {"targetField": "gpu_memory_utilization", "destinationType": "number"} in convert["conversions"]
    units = {
        o["matcher"]["options"]: p["value"]
        for o in server["fieldConfig"]["overrides"]
        for p in o["properties"]
        if p["id"] == "unit"
    }
    assert units["GPU memory util."] == "percentunit"


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
        for text in (*actions.values(), *reasons.values()):
            assert " " in text and not RAW_ENUM.search(text), (uid, panel["title"], text)


#: A raw action or reason value (``shortfall_at_upper_bound``) inside a text. A setting's own name may be
#: quoted (TensorRT-LLM's ``free_gpu_memory_fraction``): it is what the user edits, not an enum value.
RAW_ENUM = re.compile(r"\b(?:" + "|".join(re.escape(v) for v in sorted({*ACTIONS, *REASONS}) if "_" in v) + r")\b")


def test_the_raw_enum_check_refuses_a_raw_value() -> None:
    raw = next(v for v in sorted(REASONS) if "_" in v)
    assert RAW_ENUM.search(f"see {raw}") and not RAW_ENUM.search("raise free_gpu_memory_fraction (TensorRT-LLM)")


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


def test_demand_is_charted_as_a_share_of_capacity() -> None:
    """A demand of 6 M tokens squashes a 260 K capacity onto the x axis of a shared token axis: every graph
    of the demand charts it divided by the capacity, in percent, and capacity in tokens is a panel of its own."""
    seen = 0
    for uid, d in build_dashboards().items():
        for panel in _panels(d):
            exprs = [t.get("expr", "") for t in panel.get("targets", [])]
            if panel.get("type") != "timeseries" or not any("demand_tokens" in e for e in exprs):
                continue
            seen += 1
            assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit", (uid, panel["title"])
            for expr in exprs:
                assert re.search(r"demand_tokens.*\n/\n.*(usable_tokens|free_tokens)", expr, re.S), (uid, expr)
    assert seen == 2  # Fleet and Capacity planning


def test_the_alert_table_leaves_out_what_alertmanager_inhibits() -> None:
    """The Fleet's "Firing alerts" table applies alerts/alertmanager.yaml's inhibit rule: the same source
    and target alerts and severities, and the same ``equal`` labels."""
    import yaml
    from fixtures import REPO

    from sidecar.artifacts.dashboards import INHIBIT_EQUAL_OTHER, INHIBIT_SOURCES, INHIBIT_TARGETS

    (rule,) = yaml.safe_load((REPO / "alerts" / "alertmanager.yaml").read_text(encoding="utf-8"))["inhibit_rules"]
    assert rule["source_matchers"] == [f'alertname=~"{"|".join(INHIBIT_SOURCES)}"', 'severity="critical"']
    assert rule["target_matchers"] == [f'alertname=~"{"|".join(INHIBIT_TARGETS)}"', 'severity="warning"']
    assert rule["equal"] == ["namespace", "pod", *INHIBIT_EQUAL_OTHER]
    d = build_dashboards()[DASHBOARD_OVERVIEW_UID]
    (table,) = [p for p in _panels(d) if p.get("title") == "Firing alerts"]
    (expr,) = [t["expr"] for t in table["targets"]]
    assert f"and on ({', '.join(rule['equal'])})" in expr and "\nunless\n" in expr


def test_the_alert_table_query_on_prometheus_drops_exactly_the_inhibited_warnings(tmp_path) -> None:
    """The "Firing alerts" query evaluated by Prometheus' engine (``promtool test rules``, a
    ``promql_expr_test``) on ALERTS series: on pod a, a page mutes its KVCacheAlmostFull and
    KVCachePreemptions warnings but not a KVCacheCapacityMismatch warning; on pod b (no page) the
    warning stays."""
    import subprocess

    import yaml
    from alerttools import require_tool

    from sidecar.artifacts.panels import interpolate

    d = build_dashboards()[DASHBOARD_OVERVIEW_UID]
    (table,) = [p for p in _panels(d) if p.get("title") == "Firing alerts"]
    expr = interpolate(table["targets"][0]["expr"], {"cluster": "$__all", "namespace": "$__all"}, dashboard=d)

    def alert(name: str, severity: str, pod: str) -> dict[str, str]:
        return {
            "__name__": "ALERTS",
            "alertname": name,
            "alertstate": "firing",
            "severity": severity,
            "namespace": "ns",
            "pod": pod,
            "instance": f"{pod}:8080",
        }

    firing = [
        alert("KVCacheAlmostFull", "critical", "a"),
        alert("KVCacheAlmostFull", "warning", "a"),
        alert("KVCachePreemptions", "warning", "a"),
        alert("KVCacheCapacityMismatch", "warning", "a"),
        alert("KVCacheAlmostFull", "warning", "b"),
    ]

    def selector(labels: dict[str, str]) -> str:
        return labels["__name__"] + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__") + "}"

    delivered = [firing[0], firing[3], firing[4]]
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": selector(a), "values": "1x5"} for a in firing],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "2m",
                        "exp_samples": [{"labels": selector(a), "value": 1} for a in delivered],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "firing_alerts_test.yaml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    done = subprocess.run([require_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
