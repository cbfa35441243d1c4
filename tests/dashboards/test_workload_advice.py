"""The dashboards' per-workload advice is the weekly report's for the same history.

One history is backfilled into a real Prometheus (``tests/report/backfill.py``: ``promtool tsdb
create-blocks-from openmetrics``, then the recording rules of the generated rules file evaluated over it
every minute by ``promtool tsdb create-blocks-from rules``, as a Prometheus running them would have
recorded them). Then:

- the weekly report reads it through its Prometheus source and sizes each workload with
  :func:`sidecar.forecast.policy.advise_workload`;
- the "Advice per workload" tables of the committed dashboards (``dashboards/*.json``, read at test
  time) are queried as Grafana sends them: the variables "All", ``$__range`` the report's period, an
  instant query at the period's end;
- each figure is compared with the report's and with the figure worked out here from the history's
  definition (so a mistake shared by the dashboard and the report cannot pass).

Capacity planning reads only recording rules, whose one-minute windows end where Prometheus evaluates
the rule group (here 45.9 s past the minute), while the report's minutes start on the minute: its peak is
the definition's on the rules' minutes, within a thousandth of the report's here, with the same replicas
and the same "uneven" finding. The Fleet, whose panels have no fixed windows, sizes the last minute.

The history, six hours at one sample every 15 s (7 s past each quarter minute, so no sample sits on a
minute boundary, where Prometheus' range windows and the report's minutes are cut differently):

- workload ``vllm-m`` of model ``m`` in namespace ``llm``, cluster ``east``: three replicas whose
  demand peaks at different times (the sum at one time is well below the sum of their peaks), one
  of them hot (its peak is above 125% of the even share: "load is uneven"), one with a smaller pool,
  and more replicas needed than running;
- model ``n`` in the same namespace: one pod without ``workload`` and ``cluster`` labels (outside
  Kubernetes' owner labels), where the workload is the namespace and model alone.

Last, the PodMonitor's relabelling gives the ``workload`` label of a Deployment's, a StatefulSet's
(LeaderWorkerSet leader) and a KServe predictor's pods.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "report"))
from backfill import backfilled_prometheus
from stack import REPO

from sidecar.artifacts.dashboards import VAR_CLUSTER
from sidecar.artifacts.dashboards.workload import PEAK_RULE, WORKLOAD_NOW_TABLE_TITLE, WORKLOAD_TABLE_TITLE
from sidecar.artifacts.panels import ALL, PrometheusAPI, interpolate, walk_panels
from sidecar.artifacts.params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)
from sidecar.forecast.policy import UNEVEN_MARGIN, AdviceSettings
from sidecar.forecast.sizing import suggested_replicas
from sidecar.report.data import ModelKey, Period
from sidecar.report.figures import compute
from sidecar.report.prometheus import PrometheusSource
from sidecar.report.results import ModelReport
from sidecar.thresholds import Thresholds

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOUR = 3600
MINUTES = 6 * 60
#: six hours ending at a midnight three days ago (recent enough for any retention), on the minute
T0 = (int(time.time()) // 86_400 - 3) * 86_400
PERIOD = Period(float(T0), float(T0 + MINUTES * 60))
SAMPLE_S, OFFSET_S = 15, 7
TH = Thresholds()  # target_usage 0.75
SETTINGS = AdviceSettings(TH.target_usage, 0.5, 0.95, 3600.0)
BLOCK = 16

LLM_M, LLM_N = ModelKey("llm", "m"), ModelKey("llm", "n")


def _bump(minute: float, centre: float, width: float) -> float:
    """A smooth peak of height 1 at ``centre`` (minutes), 0 beyond ``width`` on each side."""
    x = (minute - centre) / width
    return max(0.0, 1.0 - x * x)


#: pod -> (labels beyond the common ones, usable tokens, demand at minute t)
PODS: dict[str, tuple[dict[str, str], int, Any]] = {
    # the hot replica: its peak (14,000) is far above the even share of the workload's peak
    "vllm-m-0": (
        {"model_name": "m", "cluster": "east", "workload": "vllm-m"},
        16_384,
        lambda t: 6_000 + 8_000 * _bump(t, 120, 20),
    ),
    "vllm-m-1": (
        {"model_name": "m", "cluster": "east", "workload": "vllm-m"},
        16_384,
        lambda t: 6_000 + 6_000 * _bump(t, 200, 20),
    ),
    # the smallest pool: the workload's advice is sized on it
    "vllm-m-2": (
        {"model_name": "m", "cluster": "east", "workload": "vllm-m"},
        12_288,
        lambda t: 5_000 + 4_000 * _bump(t, 128, 30),
    ),
    "vllm-n-0": ({"model_name": "n"}, 8_192, lambda t: 1_000 + 3_000 * _bump(t, 300, 40)),
}


def _samples(pod: str) -> list[tuple[int, float]]:
    """The pod's demand samples: (Unix seconds, tokens), whole tokens as the sidecar exports them."""
    _, _, demand = PODS[pod]
    times = range(T0 + OFFSET_S, T0 + MINUTES * 60, SAMPLE_S)
    return [(t, float(round(demand((t - T0) / 60)))) for t in times]


def _labels(pod: str, i: int) -> dict[str, str]:
    extra, _, _ = PODS[pod]
    return {
        "job": "kv-cache-sidecar",
        "namespace": "llm",
        "pod": pod,
        "instance": f"10.0.0.{i + 1}:9437",
        "target": "vllm",
        "engine": "0",
        **extra,
    }


def _om(name: str, labels: dict[str, str], points: list[tuple[int, float]]) -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{text}}} {v} {t}" for t, v in points]


def history() -> str:
    """The OpenMetrics text: the sidecar's series the report and the recording rules read."""
    families: dict[str, list[str]] = {}
    for i, pod in enumerate(PODS):
        labels, usable = _labels(pod, i), PODS[pod][1]
        demand = _samples(pod)
        used = [(t, float(min(d, usable))) for t, d in demand]
        rows = {
            "kvcache_usage_ratio": [(t, u / usable) for t, u in used],
            "kvcache_demand_tokens": demand,
            "kvcache_used_tokens": used,
            "kvcache_free_tokens": [(t, usable - u) for t, u in used],
            "kvcache_capacity_tokens": [(t, float(usable + BLOCK)) for t, _ in demand],
            "kvcache_gpu_memory_utilization": [(t, 0.9) for t, _ in demand],
        }
        for name, points in rows.items():
            families.setdefault(name, []).extend(_om(name, labels, points))
        info = {**labels, "block_size": str(BLOCK), "kv_cache_memory_bytes": ""}
        families.setdefault("kvcache_server_info", []).extend(
            _om("kvcache_server_info", info, [(t, 1.0) for t, _ in demand])
        )
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"


# --- the figures from the definition --------------------------------------------------------------------


def minute_maxima(pod: str, grid_s: float = 0.0) -> dict[int, float]:
    """The pod's largest sample per minute.

    ``grid_s`` 0: the report's minutes, minute ``k`` is ``[T0 + 60 k, T0 + 60 (k + 1))``; else minutes ending
    ``grid_s`` past each minute, ``k`` is ``(T0 + 60 k + grid_s - 60, T0 + 60 k + grid_s]``: a recording
    rule's ``max_over_time(...[1m])`` evaluated there.
    """
    out: dict[int, float] = {}
    for t, v in _samples(pod):
        k = (t - T0) // 60 if not grid_s else math.ceil((t - T0 - grid_s) / 60)
        out[k] = max(out.get(k, v), v)
    return out


def workload_sums(pods: list[str], grid_s: float = 0.0) -> dict[int, float]:
    """Per minute, the sum over the pods of each one's largest sample in it."""
    sums: dict[int, float] = {}
    for pod in pods:
        for k, v in minute_maxima(pod, grid_s).items():
            sums[k] = sums.get(k, 0.0) + v
    return sums


def workload_peak(pods: list[str], grid_s: float = 0.0) -> float:
    """The workload's peak: the largest of :func:`workload_sums`."""
    return max(workload_sums(pods, grid_s).values())


def pod_peak(pod: str) -> float:
    return max(v for _, v in _samples(pod))


# --- the two readers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("workload-advice")
    (work / "history.om").write_text(history(), encoding="utf-8")
    with backfilled_prometheus(work, work / "history.om", PERIOD.start, PERIOD.end, TH) as url:
        yield url


@pytest.fixture(scope="module")
def report_models(prometheus: str) -> dict[ModelKey, ModelReport]:
    """The weekly report's models over the period, read through its Prometheus source."""
    week = PrometheusSource(prometheus).load(PERIOD, '{namespace="llm"}', thresholds=TH)
    report = compute(week, thresholds=TH, advice=SETTINGS, generated_at=0.0)
    return {m.model: m for m in report.models}


def dashboard_table(prometheus: str, uid: str, title: str) -> dict[tuple[str, str], dict[str, float]]:
    """The committed table as Grafana fills it: {(model, workload): {column title: value}}."""
    dashboard = json.loads((REPO / "dashboards" / f"{uid}.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in walk_panels(dashboard) if p.get("title") == title]
    (organize,) = [t for t in panel["transformations"] if t["id"] == "organize"]
    titles = organize["options"]["renameByName"]
    every = {VAR_CLUSTER: ALL, VAR_NAMESPACE: ALL, VAR_MODEL_NAME: ALL, VAR_POD: ALL}
    api = PrometheusAPI(prometheus)
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for target in panel["targets"]:
        expr = interpolate(target["expr"], every, range_=f"{int(PERIOD.seconds)}s", dashboard=dashboard)
        assert "$" not in expr, expr
        for series in api.query(expr, at=PERIOD.end):
            labels = series["metric"]
            key = (labels["model_name"], labels.get("workload", ""))
            rows.setdefault(key, {})[titles[f"Value #{target['refId']}"]] = float(series["value"][1])
    return rows


def _rule_grid_s(prometheus: str) -> float:
    """Seconds past the minute at which the backfilled recording rules were evaluated (promtool picks them)."""
    query = f'{PEAK_RULE}{{model_name="m"}}[{int(PERIOD.seconds)}s]'
    (series,) = PrometheusAPI(prometheus).query(query, at=PERIOD.end)
    (offset,) = {round((float(t) - T0) % 60, 3) for t, _ in series["values"]}
    return offset or 60.0


WORKLOADS = (
    (("m", "vllm-m"), LLM_M, ("vllm-m-0", "vllm-m-1", "vllm-m-2")),
    (("n", ""), LLM_N, ("vllm-n-0",)),
)


# --- the proof ---------------------------------------------------------------------------------------


def test_the_reports_workload_advice_is_the_definitions(report_models):
    """The report (its Prometheus source, then advise_workload) against the history's definition."""
    for _, model, pods in WORKLOADS:
        m = report_models[model]
        a = m.advice
        assert a.capacity_now_tokens is not None and a.even_share_tokens is not None
        peak, usable = workload_peak(list(pods)), min(PODS[p][1] for p in pods)
        assert m.capacity.peak_demand_tokens == peak
        assert (a.replicas_now, a.capacity_now_tokens - BLOCK, a.even_share_tokens) == (
            len(pods),
            usable,
            peak / len(pods),
        )
        assert a.replicas_needed_now == max(1, math.ceil(peak / (TH.target_usage * usable) - 1e-9))
        # without a memory suggestion (no model config, no exported sizing) the replicas are today's
        assert a.suggested_replicas == a.replicas_needed_now
        assert bool(a.uneven) == (max(pod_peak(p) for p in pods) > (1 + UNEVEN_MARGIN) * peak / len(pods))
    assert report_models[LLM_M].advice.uneven and not report_models[LLM_N].advice.uneven


def test_capacity_planning_shows_the_reports_workload_advice(prometheus, report_models):
    """Capacity planning over the report's period: every column is the report's figure, the peak taken
    over the recording rules' minutes (here ending 45.9 s past the minute, where promtool evaluated them):
    equal to the definition on those minutes, within a thousandth of the report's, and the same replicas
    and the same "uneven" finding."""
    table = dashboard_table(prometheus, DASHBOARD_CAPACITY_UID, WORKLOAD_TABLE_TITLE)
    assert set(table) == {key for key, _, _ in WORKLOADS}, table
    grid_s = _rule_grid_s(prometheus)
    assert grid_s != 60.0  # the rules' minutes are not the report's: the comparison below is not trivial
    for key, model, pods in WORKLOADS:
        row, a = table[key], report_models[model].advice
        assert a.capacity_now_tokens is not None and a.even_share_tokens is not None
        usable = a.capacity_now_tokens - BLOCK
        peak = workload_peak(list(pods), grid_s)
        share = peak / len(pods)
        expected = {  # column: (on the rules' minutes, the report's)
            "Replicas running": (len(pods), a.replicas_now),
            "Peak demand (tokens)": (peak, report_models[model].capacity.peak_demand_tokens),
            "Usable tokens per replica": (usable, usable),
            "Even share per replica": (share / usable, a.even_share_tokens / usable),
            "Replicas needed at today's setting": (
                suggested_replicas(
                    peak_demand_tokens=peak,
                    target_usage=TH.target_usage,
                    capacity_per_replica_tokens=a.capacity_now_tokens,
                    block_size=BLOCK,
                ),
                a.replicas_needed_now,
            ),
            "Hottest replica vs even share": (max(pod_peak(p) for p in pods) / share, None),
        }
        assert set(row) == set(expected), (key, row)
        for column, (defined, reported) in expected.items():
            assert math.isclose(row[column], defined, rel_tol=1e-12), (model, column, row[column], defined)
            if reported is not None:
                assert math.isclose(row[column], reported, rel_tol=1e-3), (model, column, row[column], reported)
        assert row["Replicas needed at today's setting"] == a.replicas_needed_now
        assert bool(a.uneven) == (row["Hottest replica vs even share"] > 1 + UNEVEN_MARGIN), (model, a.uneven)


def test_the_fleet_sizes_the_last_minute_with_the_reports_function(prometheus, report_models):
    """The Fleet (no fixed windows) applies the same sizing to the last recorded minute's demand."""
    table = dashboard_table(prometheus, DASHBOARD_OVERVIEW_UID, WORKLOAD_NOW_TABLE_TITLE)
    assert set(table) == {key for key, _, _ in WORKLOADS}, table
    grid_s = _rule_grid_s(prometheus)
    last = math.floor((PERIOD.end - T0 - grid_s) / 60)  # the last evaluation before the query's instant
    for key, model, pods in WORKLOADS:
        row, a = table[key], report_models[model].advice
        assert a.capacity_now_tokens is not None
        usable = a.capacity_now_tokens - BLOCK
        now = workload_sums(list(pods), grid_s)[last]
        hottest = max(minute_maxima(p, grid_s)[last] for p in pods)
        expected = {
            "Replicas running": len(pods),
            "Demand in the last minute (tokens)": now,
            "Usable tokens per replica": usable,
            "Even share per replica": now / len(pods) / usable,
            "Replicas needed at today's setting": suggested_replicas(
                peak_demand_tokens=now,
                target_usage=TH.target_usage,
                capacity_per_replica_tokens=a.capacity_now_tokens,
                block_size=BLOCK,
            ),
            "Hottest replica vs even share": hottest / (now / len(pods)),
        }
        assert set(row) == set(expected), (key, row)
        for column, value in expected.items():
            assert math.isclose(row[column], value, rel_tol=1e-12), (model, column, row[column], value)


def test_the_history_exercises_what_makes_the_workload_differ_from_its_pods():
    """The workload peak is a sum at one time, not the sum of the pods' peaks; one pod is hot; one pool is
    smaller; and the replicas needed exceed those running: a dashboard summing per-pod figures would differ."""
    pods = ["vllm-m-0", "vllm-m-1", "vllm-m-2"]
    peak = workload_peak(pods)
    assert peak < sum(pod_peak(p) for p in pods) - 5_000
    assert pod_peak("vllm-m-0") > (1 + UNEVEN_MARGIN) * peak / 3
    usable = min(PODS[p][1] for p in pods)
    assert math.ceil(peak / (TH.target_usage * usable)) > len(pods)


# --- the workload label of the PodMonitor -----------------------------------------------------------------


def _relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus' ``replace`` relabelling (docs "relabel_config"): the source labels joined with ``;``,
    fully matched by the regex, the replacement's ``$1`` expanded, written to the target label."""
    out = dict(labels)
    for rule in rules:
        assert rule["action"] == "replace", rule
        value = ";".join(out.get(s, "") for s in rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if match:
            out[rule["targetLabel"]] = match.expand(re.sub(r"\$(\d+)", r"\\\1", rule["replacement"]))
    return out


@pytest.mark.parametrize(
    ("kind", "controller", "deployment", "workload"),
    [
        ("ReplicaSet", "vllm-llama-7d9f8b6c5d", "vllm-llama", "vllm-llama"),  # a Deployment's pod
        ("StatefulSet", "vllm-lws", None, "vllm-lws"),  # a LeaderWorkerSet's leader
        ("ReplicaSet", "isvc-predictor-5c6b7f", "isvc-predictor", "isvc-predictor"),  # a KServe predictor
        (None, None, None, None),  # a bare pod: namespace and model alone
    ],
)
def test_the_podmonitor_names_the_owner_workload(kind, controller, deployment, workload):
    podmonitor = yaml.safe_load((REPO / "deploy" / "base" / "podmonitor.yaml").read_text(encoding="utf-8"))
    discovered = {}
    if kind:
        discovered = {
            "__meta_kubernetes_pod_controller_kind": kind,
            "__meta_kubernetes_pod_controller_name": controller,
        }
    for endpoint in podmonitor["spec"]["podMetricsEndpoints"]:
        labels = _relabel(endpoint["relabelings"], discovered)
        assert labels.get("workload") == workload, (endpoint.get("port") or endpoint.get("portNumber"), labels)
        assert labels.get("deployment") == deployment, labels
