"""The report's Prometheus source on VictoriaMetrics: the same known dataset, the same figures.

VictoriaMetrics (Debian's ``victoria-metrics`` package, scripts/install-prometheus-tools.sh) refuses a
query whose series would hold more than ``-search.maxPointsPerTimeseries`` points (30,000 by default,
HTTP 422): a week-long subquery at 15 s holds 40,320. The dataset here spans two days, so the limit
is lowered to 10,000 (a day at 15 s is 5,761 points, two days 11,521): a source that asks for the
whole period in one subquery fails here as it fails on a week with the defaults.

The dataset is tests/report/test_prometheus_source.py's (``dataset``), imported with VictoriaMetrics'
``/api/v1/import/prometheus`` (the text format, timestamps in milliseconds). The recording rules are
not evaluated here: the per-model figures come from the pods' steps, as for a Prometheus without them.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from processes import free_port
from test_prometheus_source import (
    MINUTES,
    PERIOD,
    TH,
    _same,
    _steps,
    b_up,
    dataset,
    figures,
    seconds_above,
    usage_a,
    usage_b,
)

from sidecar.report.prometheus import PrometheusSource

BINARY = shutil.which("victoria-metrics")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def victoria(tmp_path_factory) -> Iterator[str]:
    if BINARY is None:
        if os.environ.get("CI") == "true":
            pytest.fail("victoria-metrics is not installed (scripts/install-prometheus-tools.sh)")
        pytest.skip("victoria-metrics is not installed (apt-get install victoria-metrics)")
    port = free_port()
    proc = subprocess.Popen(
        [
            BINARY,
            f"-storageDataPath={tmp_path_factory.mktemp('victoria')}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.maxPointsPerTimeseries=10000",
            "-search.latencyOffset=0s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "victoria-metrics did not start"
            time.sleep(0.1)
        lines = []
        for line in dataset().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            head, value, ts = line.rsplit(" ", 2)
            lines.append(f"{head} {value} {round(float(ts) * 1000)}")
        r = httpx.post(url + "/api/v1/import/prometheus", content="\n".join(lines) + "\n", timeout=120)
        assert r.status_code == 204, r.text
        httpx.get(url + "/internal/force_flush", timeout=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_report_reads_victoria_metrics_with_its_default_limits_and_the_same_figures(victoria):
    source = PrometheusSource(victoria, pods_per_query=1, concurrency=2)
    week = source.load(PERIOD, '{namespace="llm"}', compare_previous=True, thresholds=TH)
    a, b = (next(p for p in week.pods if p.pod == name) for name in ("vllm-a", "vllm-b"))
    ua = [usage_a(k) for k in range(MINUTES)]
    ub = [usage_b(k) for k in range(MINUTES) if b_up(k)]
    assert _same(a.usage_max, _steps(usage_a)) and _same(b.usage_max, _steps(usage_b, b_up))
    assert a.seconds_above == seconds_above(ua) == {"warning": 532 * 60.0, "watermark": 252 * 60.0}
    assert b.seconds_above == seconds_above(ub)
    assert b.seconds_waiting == 5400.0 and a.seconds_waiting is None
    assert a.usage_quantiles is not None and a.usage_quantiles["max"] == figures(ua)["max"]
    assert (a.requests_running_peak, b.requests_running_peak) == (4.0, 2.0)
    assert all(math.isfinite(v) for v in a.usage_max)


def test_victoria_metrics_refuses_the_whole_period_in_one_subquery(victoria):
    """What the day pieces avoid (so the test above would fail without them)."""
    q = "count_over_time((kvcache_usage_ratio > 0.8)[172800s:15s])"
    r = httpx.post(victoria + "/api/v1/query", data={"query": q, "time": str(PERIOD.end - 0.001)})
    assert r.status_code == 422 and "maxPointsPerTimeseries" in r.text
