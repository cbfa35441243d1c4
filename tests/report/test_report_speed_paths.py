"""The short cuts that make a week of 64 pods cheap give what the plain way gives.

- Range answers: the points cut out of Prometheus' compact JSON as bytes read the same as the same answer
  parsed as JSON throughout (any other spacing), NaN, infinities and empty series included.
- The newest label set of an info series: an hour's step first, the minutes of that hour only on a tie.
- Several series of one pod (a restart with a new instance, two waiting reasons) are merged as Prometheus'
  ``max by`` would: the largest value at each step, NaN ignored; a series without gaps is put in one slice.
- The JSON report written piece by piece equals ``json.dumps(..., sort_keys=True, separators=(",", ":"))``
  of the same figures as plain lists, NaN and infinities as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_prometheus_source import quick, send
from test_render import week_report

from sidecar.prometheus_api import cut_values, points_of
from sidecar.report import render
from sidecar.report.data import ModelKey, Period
from sidecar.report.prometheus import _Batch, _merged, _Pod, _put, _Reader
from sidecar.thresholds import Thresholds

T0 = 1_795_392_000
PERIOD = Period(float(T0), float(T0 + 3600))


def _matrix(series: list[tuple[dict[str, str], list[tuple[float, str]]]], compact: bool) -> bytes:
    result = [{"metric": m, "values": [[t, v] for t, v in points]} for m, points in series]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(doc, separators=(",", ":") if compact else (", ", ": ")).encode()


SERIES = [
    ({"pod": "a", "instance": "10.0.0.1:9437"}, [(T0 + 59.999, "0.5"), (T0 + 119.999, "NaN"), (T0 + 179.999, "1e-05")]),
    ({"pod": "b", "weird": 'quote " and ]] and "values":['}, []),
    ({"pod": "c"}, [(T0 + 59.999, "+Inf"), (T0 + 119.999, "-Inf"), (T0 + 179.999, "42")]),
]


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def test_compact_answers_are_cut_and_read_like_json():
    body = _matrix(SERIES, compact=True)
    cut = cut_values(body)
    assert cut is not None
    stripped, points = cut
    doc = json.loads(stripped)
    assert [r["metric"] for r in doc["data"]["result"]] == [m for m, _ in SERIES]
    assert all(r["values"] == [] for r in doc["data"]["result"])
    for raw, (_, want) in zip(points, SERIES, strict=True):
        times, values = points_of(raw)
        assert list(times) == [t for t, _ in want]
        assert _same(list(values), [float(v) for _, v in want])
    assert cut_values(_matrix(SERIES, compact=False)) is None  # spaced JSON: parsed as JSON throughout
    with pytest.raises(ValueError):
        points_of(b'[1795392059.999,"0.5"],[1795392119.999')  # an odd number of tokens


def test_a_range_query_reads_the_same_compact_or_spaced(stub):
    answers = {}
    for compact in (True, False):
        body = _matrix(SERIES, compact)
        s = stub(lambda h, form, body=body: send(h, 200, body))
        got = quick(s.url).api.range("up", T0 + 59.999, T0 + 179.999)
        answers[compact] = [(labels, list(t), list(v)) for labels, t, v in got]
    assert [lb for lb, _, _ in answers[True]] == [lb for lb, _, _ in answers[False]] == [m for m, _ in SERIES]
    for (_, t1, v1), (_, t2, v2) in zip(answers[True], answers[False], strict=True):
        assert t1 == t2 and _same(v1, v2)


def test_a_malformed_compact_answer_is_one_line(stub):
    body = _matrix(SERIES[:1], compact=True).replace(b'"0.5"', b'"zero"')
    s = stub(lambda h, form: send(h, 200, body))
    with pytest.raises(Exception, match="malformed matrix") as e:
        quick(s.url).api.range("up", T0 + 59.999, T0 + 179.999)
    assert "\n" not in str(e.value)


def test_several_series_of_a_pod_merge_as_max_by():
    one = (array("d", [T0 + 59.999, T0 + 119.999]), array("d", [0.5, math.nan]))
    two = (array("d", [T0 + 119.999, T0 + 179.999, T0 + 239.999]), array("d", [0.25, 0.75, 0.1]))
    three = (array("d", [T0 + 59.999, T0 + 239.999]), array("d", [0.9, math.nan]))
    times, values = _merged([one, two, three])
    assert list(times) == [T0 + 59.999, T0 + 119.999, T0 + 179.999, T0 + 239.999]
    assert list(values) == [0.9, 0.25, 0.75, 0.1]  # NaN never wins, as in Prometheus' max
    assert _merged([one]) is one


def test_points_land_in_their_steps_with_or_without_gaps():
    steps = array("d", [math.nan]) * PERIOD.steps
    full = array("d", [T0 - 0.001 + 60 * k for k in range(0, 62)])  # the step before, all 60, one after
    _put(steps, PERIOD, full, array("d", [float(k) for k in range(62)]))
    assert list(steps) == [float(k) for k in range(1, 61)]  # one slice: the points outside are dropped
    gappy = array("d", [math.nan]) * PERIOD.steps
    _put(gappy, PERIOD, array("d", [T0 + 59.999, T0 + 179.999]), array("d", [1.0, math.inf]))
    assert gappy[0] == 1.0 and all(math.isnan(v) for v in gappy[1:])  # an infinity is no sample
    nan_inside = array("d", [7.0]) * PERIOD.steps
    _put(nan_inside, PERIOD, full[1:4], array("d", [1.0, math.nan, 3.0]))
    assert list(nan_inside[:3]) == [1.0, 7.0, 3.0]  # NaN leaves the step as it was


def _plain(value: Any) -> Any:
    """The report as json.dumps takes it: lists of floats, NaN and infinities as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple, array)):
        return [_plain(v) for v in value]
    if isinstance(value, ModelKey):  # workload and cluster only where the series carry them (docs/report.md)
        return {k: v for k, v in dataclasses.asdict(value).items() if v or k in ("namespace", "model_name")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def test_the_json_written_in_pieces_is_json_dumps():
    report = week_report()
    model = report.models[0]
    timeline = dataclasses.replace(
        model.timeline,
        usage_max_ratio=array("d", [0.5, math.nan, 0.25, math.inf]),
        demand_tokens=[1.0, None, -math.inf, 3.5e-07],
    )
    odd = dataclasses.replace(model, timeline=timeline, summary='ünïcode "quoted" \\ summary')
    report = dataclasses.replace(report, models=[odd, *report.models[1:]])
    want = json.dumps(_plain(report), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
    assert render.json_text(report) == want
    assert "".join(render.json_pieces(report)).isascii()


def test_info_labels_tied_in_the_last_hour_are_read_again_by_the_minute(stub):
    """Two label sets in the pod's last hour: the one in the later minute wins, not the first in the answer."""
    period = Period(float(T0), float(T0 + 7200))
    old = {"namespace": "ns", "model_name": "m", "pod": "p", "engine": "0", "block_size": "16"}
    new = {**old, "block_size": "32"}
    end = T0 + 7200 - 0.001

    def answer(h, form):
        if form["step"] == "3600":  # both seen in the last hour
            series = [(old, [(T0 + 3599.999, "1"), (end, "1")]), (new, [(end, "1")])]
        else:  # minute by minute: the old one stopped ten minutes before the end
            assert float(form["start"]) == pytest.approx(T0 + 3600 + 59.999) and float(form["end"]) == end
            series = [(old, [(end - 600, "1")]), (new, [(end - 300, "1"), (end, "1")])]
        send(h, 200, _matrix(series, compact=True))

    s = stub(answer)
    reader = _Reader(quick(s.url), ThreadPoolExecutor(1), "", (), Thresholds())
    b = _Batch("pod", [_Pod(ModelKey("ns", "m"), "p", "0", "pod", 1)])
    newest: dict[Any, dict[str, str]] = {}
    reader._newest_labels(b, period, "kvcache_server_info", "block_size, kv_cache_memory_bytes", newest)
    assert newest == {(*dataclasses.astuple(ModelKey("ns", "m")), "p", "0"): new}
    assert [form["step"] for _, _, form in s.requests] == ["3600", "60"]
