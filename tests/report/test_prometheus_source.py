"""The report's Prometheus source: a known dataset backfilled into a real Prometheus reads back exactly,
and every way the HTTP API can fail gives one line and the right exit code.

The dataset (:func:`dataset`): two days at one sample a minute, on the minute, of two pods of model
``llm/m`` and one pod of model ``n`` that has no ``pod`` label (named by its ``instance``):

- ``vllm-a``: usage ``(k mod 100) / 100`` at minute ``k`` (so known quantiles and minutes above),
  preemptions ``100 + k`` (the hour before the period too: the first step rises from there),
  prefix queries/hits +100/+25 a minute, capacity 16,384 (theoretical: estimated 16,000 and exact
  16,384), only ``reason="deferred"`` waiting (so no time waiting for KV);
- ``vllm-b``: usage 0.3, 0.92 for two hours; waiting for capacity for one hour, and in a second series
  (``reason="all"``) for an hour from the middle of that one; a restart at minute 1,530 (ten minutes
  without samples, then a counter reset to 5, new capacity, block size and KV bytes);
- ``ALERTS``: a warning ``KVCacheAlmostFull`` on vllm-b (pending for 5 minutes, then firing for 115),
  a 3-minute ``KVCacheFullSoon``, and a firing alert of another name (not a page).

The recording rules of ``alerts/kvcache.rules.yaml`` are backfilled over the period with ``promtool
tsdb create-blocks-from rules``, evaluated by that Prometheus, as a Prometheus with the rules would
have recorded them.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import httpx
import pytest
from backfill import backfilled_prometheus
from processes import free_port

from sidecar.forecast.policy import AdviceSettings
from sidecar.report.data import PREVIOUS_FIELDS, ModelKey, Page, Period
from sidecar.report.figures import compute
from sidecar.report.growth import NOT_ENOUGH_HISTORY, WeeklyPeak
from sidecar.report.prometheus import PrometheusSource, ReportSourceError
from sidecar.thresholds import Thresholds

DAY = 86_400
MINUTES = 2 * 24 * 60
#: The period: two whole days ending at a midnight three days ago (recent enough for any retention).
T0 = (int(time.time()) // DAY - 3) * DAY
PERIOD = Period(float(T0), float(T0 + 2 * DAY))
TH = Thresholds()  # warning 0.8, watermark 0.9
LLM_M = ModelKey("llm", "m")
RESTART, GAP = 1530, 10  # vllm-b has no samples in minutes [1530, 1540)

A = {
    "namespace": "llm",
    "pod": "vllm-a",
    "instance": "10.0.0.7:9437",
    "target": "vllm",
    "model_name": "m",
    "engine": "0",
}
B = {**A, "pod": "vllm-b", "instance": "10.0.0.8:9437"}
C = {"instance": "10.0.0.9:9437", "target": "vllm", "model_name": "n", "engine": "0"}  # no namespace, no pod


def usage_a(k: int) -> float:
    return (k % 100) / 100


def usage_b(k: int) -> float:
    return 0.92 if 300 <= k < 420 else 0.3


def b_up(k: int) -> bool:
    return not RESTART <= k < RESTART + GAP


def waiting_b_capacity(k: int) -> float:
    return 2.0 if 300 <= k < 360 else 0.0


def waiting_b_all(k: int) -> float:
    """A second series of waiting requests (``reason="all"``), half an hour inside the first one's hour."""
    return 1.0 if 330 <= k < 390 else 0.0


def waiting_b(k: int) -> float:
    return max(waiting_b_capacity(k), waiting_b_all(k))


def preemptions_b(k: int) -> float:
    return 2.0 * k if k < RESTART else 5.0 + 2.0 * (k - RESTART - GAP)


def firing(k: int) -> tuple[str, str, str] | None:
    if 300 <= k < 305:
        return ("KVCacheAlmostFull", "warning", "pending")
    if 305 <= k < 420:
        return ("KVCacheAlmostFull", "warning", "firing")
    if 1000 <= k < 1003:
        return ("KVCacheFullSoon", "critical", "firing")
    return None


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def dataset() -> str:
    """The OpenMetrics text: each family's samples together, each series in time order, seconds."""
    job = {"job": "kv-cache-sidecar"}
    a, b, c = {**A, **job}, {**B, **job}, {**C, **job}
    period = range(MINUTES)
    b_minutes = [k for k in period if b_up(k)]
    after = lambda k: k >= RESTART  # noqa: E731
    series: list[tuple[str, dict[str, str], list[tuple[int, float]]]] = [
        ("kvcache_usage_ratio", a, [(k, 0.5 if k < 0 else usage_a(k)) for k in range(-60, MINUTES)]),
        ("kvcache_usage_ratio", b, [(k, usage_b(k)) for k in b_minutes]),
        ("kvcache_usage_ratio", c, [(k, 0.1) for k in period]),
        (
            "kvcache_demand_tokens",
            a,
            [(k, 3_000 if k < 0 else round(usage_a(k) * 10_000)) for k in range(-60, MINUTES)],
        ),
        ("kvcache_demand_tokens", b, [(k, round(usage_b(k) * 8_000)) for k in b_minutes]),
        ("kvcache_capacity_tokens", a, [(k, 16_384) for k in period]),
        ("kvcache_capacity_tokens", b, [(k, 12_288 if after(k) else 8_192) for k in b_minutes]),
        ("kvcache_theoretical_capacity_tokens", {**a, "budget": "estimated"}, [(k, 16_000) for k in period]),
        ("kvcache_theoretical_capacity_tokens", {**a, "budget": "exact"}, [(k, 16_384) for k in period]),
        ("kvcache_theoretical_capacity_tokens", {**b, "budget": "estimated"}, [(k, 12_000) for k in b_minutes]),
        ("kvcache_preemptions_total", a, [(k, 100 + k) for k in range(-60, MINUTES)]),
        ("kvcache_preemptions_total", b, [(k, preemptions_b(k)) for k in b_minutes]),
        ("kvcache_prefix_cache_queries_tokens_total", a, [(k, 100 * k) for k in period]),
        ("kvcache_prefix_cache_hits_tokens_total", a, [(k, 25 * k) for k in period]),
        ("kvcache_requests_waiting", {**a, "reason": "deferred"}, [(k, 7) for k in period]),
        ("kvcache_requests_waiting", {**b, "reason": "capacity"}, [(k, waiting_b_capacity(k)) for k in b_minutes]),
        ("kvcache_requests_waiting", {**b, "reason": "all"}, [(k, waiting_b_all(k)) for k in b_minutes]),
        ("kvcache_requests_running", a, [(k, 4) for k in period]),
        ("kvcache_requests_running", b, [(k, 2) for k in b_minutes]),
        ("kvcache_gpu_memory_utilization", a, [(k, 0.9) for k in period]),
        ("kvcache_gpu_memory_utilization", b, [(k, 0.95 if after(k) else 0.85) for k in b_minutes]),
        ("kvcache_theoretical_bytes_per_token", a, [(k, 131_072) for k in period]),
        ("kvcache_server_info", {**a, "block_size": "16", "kv_cache_memory_bytes": ""}, [(k, 1) for k in period]),
        (
            "kvcache_server_info",
            {**b, "block_size": "16", "kv_cache_memory_bytes": ""},
            [(k, 1) for k in b_minutes if not after(k)],
        ),
        (
            "kvcache_server_info",
            {**b, "block_size": "32", "kv_cache_memory_bytes": "1073741824"},
            [(k, 1) for k in b_minutes if after(k)],
        ),
        (
            "kvcache_model_info",
            {**a, "architecture": "LlamaForCausalLM", "attention": "gqa", "kv_dtype": "bfloat16", "tp": "1", "pp": "1"},
            [(k, 1) for k in period],
        ),
    ]
    for state in ("pending", "firing"):
        for name, severity in (("KVCacheAlmostFull", "warning"), ("KVCacheFullSoon", "critical")):
            ks = [k for k in period if firing(k) == (name, severity, state)]
            if ks:
                labels = {"alertname": name, "alertstate": state, "severity": severity, **b}
                series.append(("ALERTS", labels, [(k, 1) for k in ks]))
    other = {"alertname": "KVCachePreemptions", "alertstate": "firing", "severity": "warning", **b}
    series.append(("ALERTS", other, [(k, 1) for k in range(300, 400)]))
    lines = []
    for name, labels, points in series:
        lines += [f"{name}{_labels(labels)} {v} {T0 + 60 * k}" for k, v in points]
    return "\n".join(lines) + "\n# EOF\n"


# --- the expected figures, from the definitions -------------------------------------------------


def prom_quantile(phi: float, values: list[float]) -> float:
    """Prometheus' quantile (promql/quantile.go): rank phi x (n - 1), linear interpolation."""
    v = sorted(values)
    rank = phi * (len(v) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def figures(values: list[float]) -> dict[str, float]:
    return {
        "max": max(values),
        "p50": prom_quantile(0.5, values),
        "p95": prom_quantile(0.95, values),
        "p99": prom_quantile(0.99, values),
    }


def seconds_above(values: list[float]) -> dict[str, float]:
    """Each minute's sample holds for the minute: 60 s per sample above."""
    return {
        "warning": 60.0 * sum(v > TH.warning for v in values),
        "watermark": 60.0 * sum(v > TH.watermark for v in values),
    }


# --- a real Prometheus on the backfilled data --------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    """Prometheus serving the dataset and the recording rules evaluated over it."""
    work = tmp_path_factory.mktemp("prometheus-source")
    (work / "dataset.om").write_text(dataset(), encoding="utf-8")
    with backfilled_prometheus(work, work / "dataset.om", T0, T0 + 2 * DAY, TH) as url:
        yield url


@pytest.fixture(scope="module")
def loaded(prometheus):
    source = PrometheusSource(prometheus, pods_per_query=1, concurrency=2)
    started = time.monotonic()
    week = source.load(PERIOD, '{namespace="llm"}', compare_previous=True, thresholds=TH)
    elapsed = time.monotonic() - started
    print(f"\nPrometheus source: {source.queries} queries, {elapsed:.2f} s, warnings {source.warnings}")
    return week, source


def _pod(week, name):
    (pod,) = [p for p in week.pods if p.pod == name]
    return pod


def _steps(f: Callable[[int], float], up: Callable[[int], bool] = lambda k: True) -> list[float]:
    return [f(k) if up(k) else math.nan for k in range(MINUTES)]


def _same(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        (math.isnan(g) and math.isnan(w)) or math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.e2e
def test_pods_and_their_step_series(loaded):
    """Each minute's sample lands in the minute it starts; a restart gap is NaN; the selector applies."""
    week, _ = loaded
    assert [(p.model, p.pod, p.engine) for p in week.pods] == [(LLM_M, "vllm-a", "0"), (LLM_M, "vllm-b", "0")]
    a, b = _pod(week, "vllm-a"), _pod(week, "vllm-b")
    assert a.labels == {"namespace": "llm", "model_name": "m", "pod": "vllm-a", "engine": "0"}
    assert week.source == "Prometheus " + week.source.split(" ", 1)[1] and week.pages_known
    assert _same(a.usage_max, _steps(usage_a))
    # the means serve only for figures Prometheus did not reduce: here it reduced them all
    assert all(math.isnan(v) for v in a.usage_mean + b.usage_mean)
    assert _same(b.usage_max, _steps(usage_b, b_up))
    assert _same(a.demand_max, _steps(lambda k: round(usage_a(k) * 10_000)))
    assert _same(b.capacity_tokens, _steps(lambda k: 12_288 if k >= RESTART else 8_192, b_up))
    assert _same(a.theoretical_capacity_tokens, _steps(lambda k: 16_384))  # exact wins over estimated
    assert _same(b.theoretical_capacity_tokens, _steps(lambda k: 12_000, b_up))
    assert _same(b.waiting_max, _steps(waiting_b, b_up))
    assert all(math.isnan(v) for v in a.waiting_max)  # only reason="deferred": not waiting for KV
    assert (a.requests_running_peak, b.requests_running_peak) == (4.0, 2.0)  # one number, reduced on the server


@pytest.mark.e2e
def test_counter_increases_with_a_reset(loaded):
    """+1 a minute from the value before the period; vllm-b's restart counts the new value (5)."""
    week, _ = loaded
    a, b = _pod(week, "vllm-a"), _pod(week, "vllm-b")
    assert _same(a.preemptions, _steps(lambda k: 1.0))
    want_b = _steps(lambda k: 0.0 if k == 0 else (5.0 if k == RESTART + GAP else 2.0), b_up)
    assert _same(b.preemptions, want_b)
    assert math.fsum(v for v in b.preemptions if math.isfinite(v)) == 2 * (RESTART - 1) + 5 + 2 * (
        MINUTES - RESTART - GAP - 1
    )
    assert _same(a.prefix_queries, _steps(lambda k: 0.0 if k == 0 else 100.0))
    assert _same(a.prefix_hits, _steps(lambda k: 0.0 if k == 0 else 25.0))
    assert all(math.isnan(v) for v in b.prefix_queries)


@pytest.mark.e2e
def test_figures_reduced_from_raw_samples(loaded):
    """Peak and quantiles over raw samples, time above each threshold and waiting at 15 s resolution."""
    week, _ = loaded
    a, b = _pod(week, "vllm-a"), _pod(week, "vllm-b")
    ua = [usage_a(k) for k in range(MINUTES)]
    ub = [usage_b(k) for k in range(MINUTES) if b_up(k)]
    assert a.usage_quantiles == pytest.approx(figures(ua), abs=1e-12)
    assert b.usage_quantiles == pytest.approx(figures(ub), abs=1e-12)
    assert a.seconds_above == seconds_above(ua)
    assert a.seconds_above == {"warning": 532 * 60.0, "watermark": 252 * 60.0}  # 19 and 9 of every 100 minutes
    assert b.seconds_above == seconds_above(ub) == {"warning": 7200.0, "watermark": 7200.0}
    # 90 minutes with a request waiting in one series or the other (not 60 + 60: they overlap for 30)
    assert b.seconds_waiting == 5400.0 and a.seconds_waiting is None
    assert (a.gpu_memory_utilization, b.gpu_memory_utilization) == (0.9, 0.95)
    assert (a.bytes_per_token, b.bytes_per_token) == (131_072, None)
    assert (a.block_size, a.kv_cache_memory_bytes) == (16, None)
    assert (b.block_size, b.kv_cache_memory_bytes) == (32, 1073741824.0)  # the newest server_info
    assert a.model_info == {
        "architecture": "LlamaForCausalLM",
        "attention": "gqa",
        "kv_dtype": "bfloat16",
        "tp": "1",
        "pp": "1",
    }


@pytest.mark.e2e
def test_pages_from_alerts(loaded):
    """Firing steps become pages from the first step's start to the last one's end; pending is no page."""
    week, _ = loaded
    t = lambda k: float(T0 + 60 * k)  # noqa: E731
    assert week.pages == [
        Page("KVCacheAlmostFull", "warning", LLM_M, "vllm-b", t(305), t(420)),
        Page("KVCacheFullSoon", "critical", LLM_M, "vllm-b", t(1000), t(1003)),
    ]


@pytest.mark.e2e
def test_model_figures_from_the_recording_rules(loaded):
    """The hottest pod at each rule evaluation, as namespace_model:kvcache_usage_ratio:max recorded it."""
    week, _ = loaded
    hottest = [max(usage_a(k), usage_b(k)) if b_up(k) else usage_a(k) for k in range(MINUTES)]
    assert week.model_usage_quantiles[LLM_M] == pytest.approx(figures(hottest), abs=1e-12)
    assert week.model_seconds_above[LLM_M] == seconds_above(hottest)
    assert week.model_seconds_waiting[LLM_M] == 5400.0


@pytest.mark.e2e
def test_previous_periods(loaded):
    """The hour before the period holds only vllm-a (demand 3,000): of the 7 periods before, that one is the
    model's only weekly peak, seen for 60 of its 2,880 steps; the other six are empty (absent, not zero)."""
    week, _ = loaded
    assert PREVIOUS_FIELDS == ("demand_max",)
    assert week.history == [{LLM_M: WeeklyPeak(PERIOD.previous().start, 3_000.0, 60 / 2_880)}]
    report = compute(week, thresholds=TH, advice=AdviceSettings(0.75, 0.5, 0.95, 3600.0), generated_at=0.0)
    g = report.models[0].growth
    # seen for 2 % of its length: too little to count (it may have missed its busiest day)
    assert (g.verdict, g.weeks_fitted, g.weeks_skipped, g.previous_peak_demand_tokens) == (
        NOT_ENOUGH_HISTORY,
        1,
        1,
        None,
    )


@pytest.mark.e2e
def test_model_figures_need_the_rules_over_the_whole_period(prometheus):
    """A period starting before the rules were recorded (96% of the minutes): figures from the pods."""
    week = PrometheusSource(prometheus).load(Period(float(T0 - DAY), float(T0 + DAY)), '{namespace="llm"}')
    assert [p.pod for p in week.pods] == ["vllm-a", "vllm-b"]
    assert week.model_usage_quantiles == {} and week.model_seconds_above == {} and week.model_seconds_waiting == {}
    assert _pod(week, "vllm-a").usage_quantiles is not None


@pytest.mark.e2e
def test_without_selector_a_pod_named_by_instance(prometheus):
    """A pod without a ``pod`` label is its instance; a selector naming pod skips the model rules."""
    source = PrometheusSource(prometheus)
    week = source.load(PERIOD, "")
    assert [(str(p.model), p.pod) for p in week.pods] == [
        ("n", "10.0.0.9:9437"),
        ("llm/m", "vllm-a"),
        ("llm/m", "vllm-b"),
    ]
    c = week.pods[0]
    assert c.labels == {"model_name": "n", "instance": "10.0.0.9:9437", "engine": "0"}
    assert _same(c.usage_max, _steps(lambda k: 0.1))
    narrowed = source.load(PERIOD, '{pod="vllm-a"}')
    assert [p.pod for p in narrowed.pods] == ["vllm-a"] and narrowed.model_usage_quantiles == {}
    assert _same(narrowed.pods[0].usage_mean, _steps(usage_a))  # no model rules: the means are read
    assert source.queries < 100


@pytest.mark.e2e
def test_selector_matching_nothing_and_bad_queries(prometheus):
    source = PrometheusSource(prometheus)
    empty = source.load(PERIOD, '{namespace="nowhere"}')
    assert empty.pods == [] and empty.pages == [] and source.queries == 1
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD, '{namespace="llm"')
    assert e.value.exit_code == 2 and "selector" in str(e.value)
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD, '{namespace=~"("}')
    assert e.value.exit_code == 2


# --- faults, against a local stub --------------------------------------------------------------


class Stub(ThreadingHTTPServer):
    """Answers POSTs with ``self.answer(handler, form)``; records each request's path, headers and form."""

    daemon_threads = True

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, dict[str, str]], None]):
        self.answer = answer
        self.requests: list[tuple[str, dict[str, str], dict[str, str]]] = []
        super().__init__(("127.0.0.1", 0), _StubHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StubHandler(BaseHTTPRequestHandler):
    server: Stub

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
        self.server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, form))
        try:
            self.server.answer(self, form)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:  # /api/v1/label/<name>/values: its parameters in the URL
        path, _, query = self.path.partition("?")
        form = {k: v[0] for k, v in parse_qs(query).items()}
        self.server.requests.append((path, {k.lower(): v for k, v in self.headers.items()}, form))
        try:
            self.server.answer(self, form)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args) -> None:
        pass


def send(h: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


def quick(url: str, **kw) -> PrometheusSource:
    source = PrometheusSource(url, **kw)
    source.api.sleep = lambda s: None  # the backoff's waits, not its count, are skipped
    return source


def test_unreachable():
    source = quick(f"http://127.0.0.1:{free_port()}", retries=2)
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    assert e.value.exit_code == 1 and "cannot reach" in str(e.value) and "after 3 attempts" in str(e.value)
    assert "\n" not in str(e.value) and source.attempts == 3


def test_4xx_is_not_retried_and_says_what_prometheus_said(stub):
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'}).encode()
    s = stub(lambda h, form: send(h, 400, body))
    with pytest.raises(ReportSourceError) as e:
        quick(s.url).load(PERIOD)
    assert str(e.value) == f'{s.url}/api/v1/query: HTTP 400: bad_data: parse error: unexpected "}}"'
    assert len(s.requests) == 1


def test_5xx_then_success_is_retried_with_backoff(stub):
    calls = []

    def answer(h, form):
        calls.append(form["query"])
        send(h, 503, b"overloaded") if len(calls) <= 2 else send(h, 200, EMPTY)

    s = stub(answer)
    source = quick(s.url)
    waits: list[float] = []
    source.api.sleep = waits.append
    week = source.load(PERIOD)
    assert week.pods == [] and len(calls) == 3 and waits == [0.5, 1.0]
    assert (source.queries, source.attempts) == (1, 3)


def test_5xx_until_the_retries_run_out(stub):
    s = stub(lambda h, form: send(h, 502, b"bad gateway"))
    with pytest.raises(ReportSourceError) as e:
        quick(s.url, retries=1).load(PERIOD)
    assert "HTTP 502: bad gateway (after 2 attempts)" in str(e.value) and len(s.requests) == 2


def test_timeout(stub):
    s = stub(lambda h, form: (time.sleep(1.0), send(h, 200, EMPTY)))
    source = quick(s.url, timeout_s=0.2, retries=1)
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    assert "no whole answer within 0.2s (--timeout)" in str(e.value) and e.value.exit_code == 1
    assert source.attempts == 1  # its whole time spent: not sent again


@pytest.mark.parametrize(
    "body, says",
    [
        (b"<html>login</html>", "not JSON"),
        (b'{"hello": 1}', "not Prometheus' API JSON"),
        (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "expected a vector"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}', "malformed"),
        (b'{"status": "error", "errorType": "execution", "error": "query timed out"}', "execution: query timed out"),
    ],
)
def test_garbage_answers(stub, body, says):
    s = stub(lambda h, form: send(h, 200, body))
    with pytest.raises(ReportSourceError) as e:
        quick(s.url).load(PERIOD)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_headers_token_and_warnings(stub, tmp_path):
    token = tmp_path / "token"
    token.write_text("  s3cret-token\n", encoding="utf-8")
    warned = json.dumps(
        {"status": "success", "warnings": ["partial response"], "data": {"resultType": "vector", "result": []}}
    )
    s = stub(lambda h, form: send(h, 200, warned.encode()))
    source = quick(s.url + "/prometheus/", bearer_token_file=str(token), headers={"X-Scope-OrgID": "team-a"})
    week = source.load(PERIOD, '{namespace="prod"}')
    ((path, headers, form),) = s.requests
    assert path == "/prometheus/api/v1/query"
    assert headers["authorization"] == "Bearer s3cret-token" and headers["x-scope-orgid"] == "team-a"
    assert 'kvcache_usage_ratio{namespace="prod"}[172800s]' in form["query"]
    assert float(form["time"]) == PERIOD.end - 0.001
    assert source.warnings == ["partial response"] and "s3cret" not in week.source


def test_bad_arguments_exit_2(tmp_path):
    for make in (
        lambda: PrometheusSource("prometheus:9090"),
        lambda: PrometheusSource("http://p:9090", ca_file=str(tmp_path / "missing.pem")),
        lambda: PrometheusSource("http://p:9090", concurrency=0),
        lambda: PrometheusSource("http://p:9090", bearer_token_file=str(tmp_path / "missing")).load(PERIOD),
    ):
        with pytest.raises(ReportSourceError) as e:
            make()
        assert e.value.exit_code == 2, str(e.value)
    (tmp_path / "empty").write_text("\n", encoding="utf-8")
    with pytest.raises(ReportSourceError, match="is empty"):
        PrometheusSource("http://p:9090", bearer_token_file=str(tmp_path / "empty")).load(PERIOD)


def test_oversized_answer_is_refused(stub):
    s = stub(lambda h, form: send(h, 200, b'{"status": "success", "pad": "' + b"x" * 5000 + b'"}'))
    source = quick(s.url)
    source.api.max_body_bytes = 1000
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    assert str(e.value) == (
        f"{s.url}/api/v1/query: the answer is larger than 1,000 bytes; select fewer series per query (--pods-per-query)"
    )


def test_an_injected_client_is_used():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, content=EMPTY)

    source = PrometheusSource("http://prom.example", client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert source.load(PERIOD).pods == [] and seen == ["/api/v1/query"]


def test_credentials_in_the_url_are_never_shown():
    source = quick(f"http://user:s3cret@127.0.0.1:{free_port()}", retries=0)
    with pytest.raises(ReportSourceError) as e:
        source.load(PERIOD)
    assert "s3cret" not in str(e.value) and "cannot reach http://127.0.0.1:" in str(e.value)
