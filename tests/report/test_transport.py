"""The report's requests under a hostile or broken Prometheus: a total deadline however slowly it sends,
cancellation, no secret in any message, malformed answers as one line, and memory that follows the data.

Against local stand-ins (tests/report/conftest.py ``stub``, and a raw socket server for the drip);
the wall time of a drip is measured by bench/hostile_report.py, here only that the request ends.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from sidecar import outbound
from sidecar.report.data import Period
from sidecar.report.prometheus import PrometheusSource, ReportSourceError, _owned

from rawserver import RawServer  # isort: skip
from rawserver import drip as answer_by_drip  # isort: skip
from test_prometheus_source import EMPTY, PERIOD, quick, send  # isort: skip

TOKEN = "s3cr3t-token-value"


@pytest.fixture
def drip():
    server = RawServer(answer_by_drip(0.1, 100_000))
    yield server
    server.close()


def test_a_dripping_server_cannot_outlast_the_timeout(drip):
    source = quick(drip.url, timeout_s=1.0, retries=3)
    started = time.monotonic()
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    took = time.monotonic() - started
    assert "no whole answer within 1s (--timeout)" in str(e.value) and source.attempts == 1
    assert took < 30  # ends (bench/hostile_report.py measures how close to 1 s); without a deadline: days


def test_cancel_all_ends_a_request_in_flight(drip, monkeypatch):
    monkeypatch.setattr(outbound, "CANCELLED", threading.Event())
    source = quick(drip.url, timeout_s=600.0)
    failure: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(failure, source.load, PERIOD), daemon=True)
    t.start()
    time.sleep(0.5)  # the request is in flight, the answer dripping
    assert t.is_alive()
    outbound.cancel_all()
    t.join(10)
    assert not t.is_alive() and isinstance(failure[0], ReportSourceError) and "shutting down" in str(failure[0])


def _catch(into: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:
        into.append(e)


@pytest.mark.parametrize("password", ["p@ss@word", "zq/xy:w@rd", "plain"])
def test_a_url_password_is_never_shown_whatever_it_holds(stub, password):
    from urllib.parse import quote

    s = stub(lambda h, form: send(h, 200, EMPTY))
    host = s.url.removeprefix("http://")
    raw = f"http://user:{password}@{host}"
    try:
        source = PrometheusSource(raw)
    except ReportSourceError as e:  # a '/' makes it no URL httpx can send to: said without quoting it
        assert e.exit_code == 2 and "zq" not in str(e) and "xy" not in str(e) and "%2F" in str(e)
        return
    assert source.shown == f"http://{host}" and password not in source.shown and "ss" not in source.shown
    week = quick(f"http://user:{quote(password, safe='')}@{host}").load(PERIOD)
    assert password not in week.source and quote(password, safe="") not in week.source


def test_a_server_error_quoting_the_request_never_shows_the_token(stub, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")

    def echo(h, form):  # a proxy that quotes the request it refused
        send(h, 400, f"bad request; headers: Authorization: {h.headers['Authorization']}\r\nX-Key: k3y-v4lue".encode())

    s = stub(echo)
    source = quick(s.url, bearer_token_file=str(token_file), headers={"X-Key": "k3y-v4lue"})
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    message = str(e.value)
    assert TOKEN not in message and "k3y-v4lue" not in message and "Bearer ***" in message
    assert "\n" not in message and "\r" not in message


@pytest.mark.parametrize(
    "result, says",
    [
        ([{"metric": {"pod": 7}, "value": [1, "1"]}], "labels must be a mapping of strings"),
        ([{"metric": {"pod": {"x": 1}}, "value": [1, "1"]}], "labels must be a mapping of strings"),
        ([{"metric": ["pod"], "value": [1, "1"]}], "labels must be a mapping of strings"),
        ([{"metric": {"pod": "a"}, "value": ["Infinity", "1"]}], "finite time"),
        ([{"metric": {"pod": "a"}, "value": ["NaN", "1"]}], "finite time"),
        ([{"metric": {"pod": "a"}, "value": [1]}], "finite time"),
    ],
)
def test_a_malformed_discovery_answer_is_one_line(stub, result, says):
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    s = stub(lambda h, form: send(h, 200, body))
    with pytest.raises(ReportSourceError) as e:
        quick(s.url).load(PERIOD)
    assert says in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 1


@pytest.mark.parametrize("time_text", ["Infinity", "NaN", "1e400"])
def test_a_range_answer_with_a_time_that_is_not_finite_is_one_line(stub, time_text):
    pod = {"namespace": "n", "model_name": "m", "pod": "p", "engine": "0"}
    vector = {"resultType": "vector", "result": [{"metric": pod, "value": [1, "1"]}]}
    found = json.dumps({"status": "success", "data": vector})

    def answer(h, form):
        if "count by" in form["query"]:
            send(h, 200, found.encode())
        elif form.get("step"):
            point = f'[{time_text},"0.5"]'
            labels = json.dumps(pod, separators=(",", ":"))
            series = f'{{"metric":{labels},"values":[{point}]}}'
            body = f'{{"status":"success","data":{{"resultType":"matrix","result":[{series}]}}}}'
            send(h, 200, body.encode())
        else:
            send(h, 200, EMPTY)

    s = stub(answer)
    with pytest.raises(ReportSourceError) as e:
        quick(s.url).load(PERIOD)
    assert "malformed matrix" in str(e.value) and "\n" not in str(e.value)


def _discovery(pods: int) -> bytes:
    result = [
        {"metric": {"namespace": "n", "model_name": "m", "pod": f"p{i}", "engine": "0"}, "value": [1, "1"]}
        for i in range(pods)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_more_pods_than_the_cap_are_refused_naming_the_flag_before_any_is_allocated(stub):
    body = _discovery(30)
    s = stub(lambda h, form: send(h, 200, body if "count by" in form["query"] else EMPTY))
    source = quick(s.url, max_pods=20)
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    assert e.value.exit_code == 2 and "30 pods match, more than --max-pods 20" in str(e.value)
    assert source.queries == 1  # refused on the discovery answer


EMPTY_MATRIX = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()


def test_pods_named_without_data_share_one_empty_series(stub):
    """A discovery answer may name many pods; their series cost memory only when data arrive."""
    body = _discovery(200)

    def answer(h, form):
        send(h, 200, body if "count by" in form["query"] else EMPTY_MATRIX if form.get("step") else EMPTY)

    s = stub(answer)
    week = quick(s.url, pods_per_query=100).load(PERIOD)
    assert len(week.pods) == 200
    arrays = {id(getattr(p, name)) for p in week.pods for name in ("usage_max", "demand_max", "preemptions")}
    assert len(arrays) == 1  # one shared all-NaN array, not 600
    pod = week.pods[0]
    mine = _owned(pod, "usage_max")
    mine[0] = 0.5
    assert pod.usage_max[0] == 0.5 and week.pods[1].usage_max[0] != 0.5  # a write gets its own copy
    assert _owned(pod, "usage_max") is mine
    assert len(mine) == Period(PERIOD.start, PERIOD.end).steps
