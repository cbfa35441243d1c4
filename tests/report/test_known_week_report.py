"""The weekly report end to end on a known week: backfilled into a real Prometheus (with the recording rules
evaluated over it), and the same week from the embedded history; every figure is asserted against the one the
week's definition gives (``tests/report/known_week.py``), through ``kv-sidecar report``'s JSON.

The picture in docs/report.md is this week's HTML report from Prometheus, as headless Chromium shows it::

    PYTHONPATH=tests:tests/report .venv/bin/python tests/report/test_known_week_report.py \
        --screenshot docs/images/kvcache-report.png

Resolution: the known week has one sample a minute, so a minute of the embedded history holds one sample and
the two sources must agree with the definition exactly; the Prometheus source counts time above a threshold
with a 15 s subquery, exact for values held a minute each (the tolerance below is one minute per page).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from backfill import backfilled_prometheus
from known_week import PODS, Known, cached_week, known
from processes import kv_sidecar

from sidecar.forecast.recommendation import recommend
from sidecar.report.prometheus import MODEL_USAGE_RULE, MODEL_WAITING_RULE

#: The recorded series the report reads (sidecar/report/prometheus.py): the only rules evaluated over the weeks.
REPORT_RECORDS = (MODEL_USAGE_RULE, MODEL_WAITING_RULE)

# Generating the known week (4 pods, 2 weeks, a scrape a minute through the daemon's code) takes
# minutes on a fresh clone; later runs reuse it (.test-artifacts/known-week/).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MINUTE_H = 1 / 60


@pytest.fixture(scope="module")
def week() -> Known:
    return cached_week()


@pytest.fixture(scope="module")
def prometheus(week, tmp_path_factory):
    work = tmp_path_factory.mktemp("known-week-prometheus")
    with backfilled_prometheus(
        work, week.files["om"], week.previous_start - 3600, week.end, records=REPORT_RECORDS
    ) as url:
        yield url


def _report(tmp: Path, week: Known, *source: str, formats: str = "json,md") -> dict:
    out = tmp / "out"
    proc = subprocess.run(
        [
            *kv_sidecar(),
            "report",
            *source,
            "--from",
            str(week.start),
            "--to",
            str(week.end),
            "--compare-previous",
            "--out",
            str(out),
            "--format",
            formats,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("*.json")
    report = json.loads(path.read_text())
    report["_markdown"] = "".join(p.read_text() for p in out.glob("*.md"))  # the tests' own key, not the report's
    return report


@pytest.fixture(scope="module")
def from_prometheus(prometheus, week, tmp_path_factory) -> dict:
    return _report(tmp_path_factory.mktemp("report-prometheus"), week, "--prometheus-url", prometheus)


@pytest.fixture(scope="module")
def from_history(week, tmp_path_factory) -> dict:
    return _report(tmp_path_factory.mktemp("report-history"), week, "--history", str(week.files["history"]))


def _models(report: dict, week: Known) -> dict[tuple[str, str], dict]:
    """The report's models by (namespace, model_name); the history has no namespace: taken from the week."""
    namespace = {name: ns for ns, name in week.models}
    return {
        (m["model"]["namespace"] or namespace[m["model"]["model_name"]], m["model"]["model_name"]): m
        for m in report["models"]
    }


def _check_figures(got: dict, want, *, pages_tolerance_h: float) -> None:
    usage, capacity, pressure = got["usage"], got["capacity"], got["pressure"]
    assert usage["peak_ratio"] == pytest.approx(want.usage.peak, abs=1e-12)
    for q in ("p50", "p95", "p99"):
        assert usage[f"{q}_ratio"] == pytest.approx(getattr(want.usage, q), abs=1e-9), q
    assert usage["hours_above_warning"] == pytest.approx(want.usage.hours_above_warning, abs=pages_tolerance_h)
    assert usage["hours_above_watermark"] == pytest.approx(want.usage.hours_above_watermark, abs=pages_tolerance_h)
    assert capacity["capacity_tokens"] == want.capacity_tokens
    assert capacity["usable_tokens"] == want.usable_tokens
    assert capacity["theoretical_tokens"] == want.theoretical_capacity_tokens
    assert capacity["peak_demand_tokens"] == want.peak_demand_tokens
    assert capacity["idle_ratio"] == pytest.approx(want.idle_share, abs=1e-12)
    assert pressure["preemptions"] == want.preemptions_total
    assert pressure["worst_hour_start"] == want.worst_hour_start
    assert pressure["worst_hour_preemptions"] == want.worst_hour_preemptions
    assert pressure["hours_waiting"] == pytest.approx(want.hours_waiting, abs=pages_tolerance_h)
    assert pressure["prefix_hit_ratio"] == pytest.approx(want.prefix_hit_ratio, abs=1e-12)


def _check_report(report: dict, week: Known, *, pages_tolerance_h: float) -> None:
    models = _models(report, week)
    assert set(models) == set(week.models)
    for key, want in week.models.items():
        got = models[key]
        _check_figures(got, want, pages_tolerance_h=pages_tolerance_h)
        growth = got["growth"]
        assert growth["previous_peak_demand_tokens"] == want.previous_peak_demand_tokens
        full = [
            n
            for n, m in week.pod_models.items()
            if m == key and week.pods[n].peak_demand_tokens >= week.pods[n].usable_tokens
        ]
        if full:  # a pod already full: the model is "at capacity", never weeks away
            assert (growth["verdict"], growth["weeks_until_full"]) == ("at capacity", 0.0), key
            assert "full in" not in got["summary"] and f"already full on {full[0]}" in got["summary"], key
        elif want.growth_ratio - 1 > 0.01:
            # two weeks: the straight line through both peaks, no fit and no interval
            usable, peak, prev = want.usable_tokens, want.peak_demand_tokens, want.previous_peak_demand_tokens
            assert (growth["verdict"], growth["method"]) == ("not enough history", "two points")
            assert growth["change_ratio"] == pytest.approx(want.growth_ratio - 1, abs=1e-12)
            assert growth["weeks_until_full"] == pytest.approx((usable - peak) / (peak - prev), rel=1e-9)
            assert growth["weeks_until_full_low"] is None and "(two weeks only: no uncertainty)" in got["summary"]
        else:
            assert growth["verdict"] == "not enough history" and growth["weeks_until_full"] is None
        pods = {p["pod"]: p for p in got["pods"]}
        assert set(pods) == {name for name, model in week.pod_models.items() if model == key}
        for name, pod in pods.items():
            _check_figures(pod, week.pods[name], pages_tolerance_h=pages_tolerance_h)
            # the advice: the daemon's recommend() over the known peak and pool gives the same direction
            want_pod = week.pods[name]
            (plan,) = [p for p in PODS if p.name == name]
            expected = recommend(
                memory_mode=(
                    "kv_cache_memory_bytes" if plan.model.sim.kv_cache_memory_bytes else "gpu_memory_utilization"
                ),
                asleep=False,
                peak_demand_tokens=want_pod.peak_demand_tokens,
                capacity_tokens=want_pod.capacity_tokens,
                block_size=16,
                target_usage=report["target_usage"],
            )
            if expected.action.startswith(("lower_", "none")):
                assert pod["advice"]["action"] in (expected.action, "lower_max_model_len"), name
            else:
                assert pod["advice"]["action"] in (expected.action, "enable_fp8_kv_cache", "add_replicas"), name
    assert [m["needs_action"] for m in report["models"]] == sorted(
        (m["needs_action"] for m in report["models"]), reverse=True
    )


def test_the_week_from_prometheus(from_prometheus, week):
    _check_report(from_prometheus, week, pages_tolerance_h=MINUTE_H * (1 + len(week.pages)))
    pages = sorted(
        (p["alertname"], p["model"]["namespace"], p["model"]["model_name"], p["pod"], p["start"], p["end"])
        for m in from_prometheus["models"]
        for p in m["pages"]
    )
    want = sorted((p.alertname, p.namespace, p.model_name, p.pod, p.start, p.end) for p in week.pages)
    assert pages == want
    assert from_prometheus["pages_known"] is True


def test_the_same_week_from_the_embedded_history(from_history, week):
    _check_report(from_history, week, pages_tolerance_h=1e-9)
    assert from_history["pages_known"] is False


def _check_workload_advice(report: dict, week: Known) -> None:
    """One recommendation per workload: current → recommended flags, replicas now and needed at the target."""
    target = report["target_usage"]
    for key, got in _models(report, week).items():
        a, want = got["advice"], week.models[key]
        names = [n for n, m in week.pod_models.items() if m == key]
        (plan,) = {p.model for p in PODS if p.name in names}
        assert a["replicas_now"] == len(names), key
        kv = plan.sim.kv_cache_memory_bytes
        current = (
            f"--kv-cache-memory-bytes {kv}" if kv else f"--gpu-memory-utilization {plan.sim.gpu_memory_utilization:.2f}"
        )
        assert a["current_flags"] == [current], key
        # replicas the peak needs at the target with today's pool: ⌈peak ÷ (target × usable per replica)⌉
        per_replica = week.pods[names[0]].usable_tokens
        assert a["replicas_needed_now"] == math.ceil(want.peak_demand_tokens / (target * per_replica) - 1e-9), key
        assert a["suggested_replicas"] >= 1 and a["capacity_now_tokens"] == week.pods[names[0]].capacity_tokens
        if a["action"] != "none":
            # an action names the exact values to set, current → recommended, and never a raw enum
            assert a["set_flags"] and " → " in a["sentence"], (key, a["sentence"])
        assert "_" not in a["sentence"].split(":")[0], a["sentence"]
        # the pods' own advice may disagree; the model's sentence never picks one pod's
        assert not a["sentence"].startswith("On "), a["sentence"]


def test_one_recommendation_per_workload(from_prometheus, from_history, week):
    _check_workload_advice(from_prometheus, week)
    _check_workload_advice(from_history, week)


def test_pages_are_split_by_severity_and_figures_carry_units(from_prometheus, week):
    report, md = from_prometheus, from_prometheus["_markdown"]
    for key, m in _models(report, week).items():
        pages = [p for p in week.pages if (p.namespace, p.model_name) == key]
        critical = sum(1 for p in pages if p.severity == "critical")
        if pages:
            assert f"{critical} critical page" in m["summary"], m["summary"]
            assert f" {len(pages) - critical} warning" in m["summary"], m["summary"]
    assert "Pages (critical / warning)" in md
    worst = [line for line in md.splitlines() if line.startswith("| Worst hour")]
    assert worst and all("preemptions in the hour" in line or "—" in line for line in worst), worst


def test_both_sources_give_the_same_advice_and_ranking(from_prometheus, from_history, week):
    history = _models(from_history, week)
    for key, got in _models(from_prometheus, week).items():
        assert got["advice"] == history[key]["advice"], key
        assert got["needs_action"] == history[key]["needs_action"], key
    assert [m["model"]["model_name"] for m in from_prometheus["models"]] == [
        m["model"]["model_name"] for m in from_history["models"]
    ]


def main(argv: list[str]) -> int:
    """``--screenshot PATH [HEIGHT]``: the docs' picture of the known week's HTML report from Prometheus."""
    from test_render import screenshot

    if len(argv) < 2 or argv[0] != "--screenshot":
        print(
            "usage: python tests/report/test_known_week_report.py --screenshot docs/images/kvcache-report.png "
            "[height] [known-week folder, e.g. .test-artifacts/known-week/<hash>: used even if the code changed]"
        )
        return 2
    target, height = Path(argv[1]), int(argv[2]) if len(argv) > 2 else 2400
    if len(argv) > 3:
        folder = Path(argv[3]).resolve()
        week = Known(**{**known().__dict__, "files": {"om": folder / "week.om", "history": folder / "history.sqlite"}})
    else:
        week = cached_week()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "prometheus").mkdir()
        with backfilled_prometheus(
            work / "prometheus", week.files["om"], week.previous_start - 3600, week.end, records=REPORT_RECORDS
        ) as url:
            _report(work, week, "--prometheus-url", url, formats="json,html")
        (page,) = (work / "out").glob("*.html")
        screenshot(page, target, height)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
