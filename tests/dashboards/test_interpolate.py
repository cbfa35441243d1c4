"""Grafana's variable substitution as sidecar.artifacts.panels reproduces it.

Expected strings are what Grafana 11's Prometheus data source sends for the same variable state
(``interpolateQueryExpr`` / ``prometheusSpecialRegexEscape`` in datasource.ts): a multi-value or
includeAll variable's values are regex-escaped inside the PromQL string (``\\\\.`` for a dot, which
PromQL's string literal turns into the regex ``\\.``), several values become ``(a|b)``, All is the
allValue.
"""

from __future__ import annotations

import pytest

from sidecar.artifacts.panels import ALL, interpolate, label_values_query, queries, regex_escape, walk_panels

DASHBOARD = {
    "uid": "d",
    "templating": {
        "list": [
            {
                "name": "pod",
                "type": "query",
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "query": {"query": 'label_values(kvcache_usage_ratio{namespace=~"$namespace"}, pod)'},
            },
            {
                "name": "namespace",
                "type": "query",
                "multi": False,
                "includeAll": False,
                "query": "label_values(kvcache_usage_ratio, namespace)",
            },
        ]
    },
    "panels": [
        {
            "type": "row",
            "title": "r",
            "panels": [{"id": 2, "title": "inner", "targets": [{"refId": "A", "expr": "x"}]}],
        },
        {"id": 1, "title": "top", "targets": [{"refId": "A", "expr": "y", "instant": True}, {"refId": "B"}]},
    ],
    "annotations": {"list": [{"name": "restarts", "expr": "changes(z[$__interval]) > 0"}]},
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (ALL, 'up{pod=~".*"}'),
        ([ALL], 'up{pod=~".*"}'),
        ("vllm-0", 'up{pod=~"vllm-0"}'),
        (["vllm-0", "vllm-1"], 'up{pod=~"(vllm-0|vllm-1)"}'),
        ("meta-llama/Llama-3.1-8B", 'up{pod=~"meta-llama/Llama-3\\\\.1-8B"}'),
    ],
)
def test_multi_value_variable_is_regex_escaped(value, expected):
    assert interpolate('up{pod=~"$pod"}', {"pod": value}, dashboard=DASHBOARD) == expected


def test_single_value_variable_is_inserted_as_is():
    assert interpolate('up{namespace=~"${namespace}"}', {"namespace": "a.b"}, dashboard=DASHBOARD) == (
        'up{namespace=~"a.b"}'
    )


def test_macros_and_unknown_variables():
    expr = "rate(x[$__rate_interval]) + increase(y[$__range]) + z[[__interval]] + $unknown"
    assert interpolate(expr, {}, interval="5s", rate_interval="4s", range_="300s") == (
        "rate(x[4s]) + increase(y[300s]) + z5s + $unknown"
    )


def test_regex_escape_matches_grafana():
    assert regex_escape("a.b|c") == "a\\\\.b\\\\|c"
    assert regex_escape("back\\slash") == "back\\\\\\\\slash"


def test_queries_lists_panels_in_rows_annotations_and_variables():
    found = [(q.kind, q.title, q.ref_id, q.expr, q.instant) for q in queries(DASHBOARD)]
    assert found == [
        ("panel", "inner", "A", "x", False),
        ("panel", "top", "A", "y", True),
        ("annotation", "restarts", "", "changes(z[$__interval]) > 0", False),
        ("variable", "pod", "", 'label_values(kvcache_usage_ratio{namespace=~"$namespace"}, pod)', False),
        ("variable", "namespace", "", "label_values(kvcache_usage_ratio, namespace)", False),
    ]
    assert [p["title"] for p in walk_panels(DASHBOARD)] == ["inner", "top"]


def test_label_values_query():
    assert label_values_query('label_values(kvcache_usage_ratio{namespace=~"$namespace"}, pod)') == (
        'kvcache_usage_ratio{namespace=~"$namespace"}',
        "pod",
    )
    assert label_values_query("label_values(namespace)") == (None, "namespace")
    with pytest.raises(ValueError, match="label_values"):
        label_values_query("query_result(up)")
