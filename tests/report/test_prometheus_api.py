"""The one Prometheus API client (sidecar/prometheus_api.py) as its two users see it: the report's typed
answers, and the dashboards' ``panels.PrometheusAPI`` with Grafana's JSON result lists; against the local
Prometheus stand-in of test_prometheus_source.py (the answers are Prometheus' documented JSON)."""

from __future__ import annotations

import json

import pytest
from test_prometheus_source import send

from sidecar.artifacts.panels import PrometheusAPI, PrometheusError
from sidecar.prometheus_api import MAX_POINTS_PER_SERIES, PrometheusClient
from sidecar.report.prometheus import ReportSourceError

T0 = 1_795_392_000


def _answer(result_type: str, result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": result_type, "result": result}}).encode()


def test_label_values_is_a_get_with_its_matcher_and_checks_the_answer(stub):
    s = stub(lambda h, form: send(h, 200, json.dumps({"status": "success", "data": ["llm", "prod"]}).encode()))
    with PrometheusAPI(s.url) as api:
        assert api.label_values("namespace", 'kvcache_usage_ratio{job="kv"}') == ["llm", "prod"]
    ((path, _, form),) = s.requests
    assert path == "/api/v1/label/namespace/values" and form == {"match[]": 'kvcache_usage_ratio{job="kv"}'}

    bad = stub(lambda h, form: send(h, 200, json.dumps({"status": "success", "data": [1, 2]}).encode()))
    with pytest.raises(PrometheusError, match="label values of 'namespace' are not a list of strings"):
        PrometheusClient(bad.url).label_values("namespace")


def test_the_panels_client_answers_as_grafana_receives_them(stub):
    """Instant: the vector's dicts, a scalar as one series without labels; range: the points as JSON lists
    (never the report's cut-out bytes), with ``timeout`` and ``nocache`` sent."""
    vector = [{"metric": {"pod": "a"}, "value": [T0, "0.5"]}]
    matrix = [{"metric": {"pod": "a"}, "values": [[T0, "0.5"], [T0 + 60, "NaN"]]}]
    answers = {
        "/api/v1/query": lambda form: (
            _answer("scalar", [T0, "3"]) if form["query"] == "3" else _answer("vector", vector)
        ),
        "/api/v1/query_range": lambda form: json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": matrix}}, separators=(",", ":")
        ).encode(),
    }
    s = stub(lambda h, form: send(h, 200, answers[h.path](form)))
    with PrometheusAPI(s.url) as api:
        assert api.query("kvcache_usage_ratio", at=T0) == vector
        assert api.query("3") == [{"metric": {}, "value": [T0, "3"]}]
        assert api.query_range("kvcache_usage_ratio", T0, T0 + 60, 60) == matrix
    forms = [form for _, _, form in s.requests]
    assert forms[0] == {"query": "kvcache_usage_ratio", "time": f"{T0}.000", "timeout": "10s"}
    assert "time" not in forms[1]  # no time: the server's now
    assert forms[2] == {
        "query": "kvcache_usage_ratio",
        "start": f"{T0}.000",
        "end": f"{T0 + 60}.000",
        "step": "60",
        "nocache": "1",
        "timeout": "10s",
    }


def test_one_error_class_with_prometheus_own_text(stub):
    """The dashboards' PrometheusError is the report's ReportSourceError: one client, one error."""
    assert PrometheusError is ReportSourceError
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected"}).encode()
    s = stub(lambda h, form: send(h, 400, body))
    with PrometheusAPI(s.url) as api, pytest.raises(PrometheusError) as e:
        api.query("up{")
    assert str(e.value) == f"{s.url}/api/v1/query: HTTP 400: bad_data: 1:5: parse error: unexpected"


def test_the_panels_client_does_not_retry_by_default(stub):
    s = stub(lambda h, form: send(h, 503, b"overloaded"))
    with (
        PrometheusAPI(s.url) as api,
        pytest.raises(PrometheusError, match=r"HTTP 503: overloaded \(after 1 attempt\)$"),
    ):
        api.query("up")
    assert len(s.requests) == 1


def test_a_range_beyond_prometheus_resolution_is_refused_before_sending(stub):
    s = stub(lambda h, form: send(h, 200, _answer("matrix", [])))
    client = PrometheusClient(s.url)
    with pytest.raises(ValueError, match="11,001 points per series exceed"):
        client.range("up", T0, T0 + 60 * MAX_POINTS_PER_SERIES, 60)
    assert s.requests == [] and client.range("up", T0, T0 + 60 * (MAX_POINTS_PER_SERIES - 1), 60) == []
