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
from sidecar.artifacts.dashboards.workload import (
    FLAG_COLUMN,
    GPU_COLUMN,
    GPU_UNKNOWN,
    PEAK_RULE,
    WORKLOAD_NOW_TABLE_TITLE,
    WORKLOAD_TABLE_TITLE,
)
from sidecar.artifacts.panels import ALL, PrometheusAPI, interpolate, walk_panels
from sidecar.artifacts.params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)
from sidecar.capacity.budget import gpu_memory_bytes
from sidecar.forecast.policy import UNEVEN_MARGIN, AdviceSettings
from sidecar.forecast.sizing import suggest_gpu_memory_utilization, suggested_replicas
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

#: the report's workloads: namespace and model, and the workload and cluster labels where the series carry them
LLM_M, LLM_N, LLM_K = (
    ModelKey("llm", "m", "vllm-m", "east"),
    ModelKey("llm", "n"),
    ModelKey("llm", "k", "vllm-k", "east"),
)
OTHER_M, WEST_M = ModelKey("llm", "m", "other-m", "east"), ModelKey("llm", "m", "vllm-m", "west")


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
    # one pool on two replicas whose sidecars know the GPU (model.gpu_memory: H100-80GB): the dashboards size
    # its --gpu-memory-utilization; the peak is a plateau of 10 minutes, so the rules' minutes see the report's
    "vllm-k-0": (
        {"model_name": "k", "cluster": "east", "workload": "vllm-k"},
        16_384,
        lambda t: 4_000 + 11_000 * _plateau(t, 100, 110),
    ),
    "vllm-k-1": (
        {"model_name": "k", "cluster": "east", "workload": "vllm-k"},
        16_384,
        lambda t: 3_000 + 10_500 * _plateau(t, 100, 110),
    ),
    # model m again: a second Deployment in the same namespace and cluster, and the same Deployment in another
    # cluster: two more workloads, two more recommendations (never summed into vllm-m's)
    "other-m-0": (
        {"model_name": "m", "cluster": "east", "workload": "other-m"},
        16_384,
        lambda t: 2_000 + 9_000 * _bump(t, 250, 30),
    ),
    "vllm-m-w0": (
        {"model_name": "m", "cluster": "west", "workload": "vllm-m"},
        8_192,
        lambda t: 1_500 + 5_000 * _bump(t, 60, 30),
    ),
    # vLLM run with --kv-cache-memory-bytes (it ignores the utilization then): the dashboards give words
    "vllm-j-0": (
        {"model_name": "j", "cluster": "east", "workload": "vllm-j"},
        16_384,
        lambda t: 2_000 + 12_000 * _bump(t, 150, 30),
    ),
}
#: kvcache_server_info's kv_cache_memory_bytes label by pod (else ""): vllm-j-0 sized by --kv-cache-memory-bytes
#: ((usable + the null block) x bytes per token); vllm-n-0 as vLLM labels it when not set ("None": not a size)
KV_BYTES = {"vllm-j-0": (16_384 + 16) * 131_072, "vllm-n-0": "None"}

#: What the sidecars export of the GPU (kvcache_gpu_memory_bytes): model m's inferred M (no GPU name: its
#: replicas run two pools, so the dashboards give words), model k's configured H100-80GB; model n nothing.
BYTES_PER_TOKEN = 131_072.0  # Llama-3.1-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
H100 = float(gpu_memory_bytes("H100-80GB") or 0)
GPU_EXPORTS: dict[str, tuple[str, str, float]] = {
    **{f"vllm-m-{i}": ("inferred", "", 85.0e9) for i in range(3)},
    **{f"vllm-k-{i}": ("configured", "H100-80GB", H100) for i in range(2)},
    "vllm-j-0": ("configured", "H100-80GB", H100),
}


def _plateau(minute: float, start: float, end: float) -> float:
    """1 from ``start`` to ``end`` (minutes), 0 elsewhere."""
    return 1.0 if start <= minute < end else 0.0


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
        if pod in GPU_EXPORTS:
            basis, gpu, memory = GPU_EXPORTS[pod]
            gpu_labels = {**labels, "basis": basis, "gpu": gpu}
            families.setdefault("kvcache_gpu_memory_bytes", []).extend(
                _om("kvcache_gpu_memory_bytes", gpu_labels, [(t, memory) for t, _ in demand])
            )
            families.setdefault("kvcache_theoretical_bytes_per_token", []).extend(
                _om("kvcache_theoretical_bytes_per_token", labels, [(t, BYTES_PER_TOKEN) for t, _ in demand])
            )
        info = {**labels, "block_size": str(BLOCK), "kv_cache_memory_bytes": str(KV_BYTES.get(pod, ""))}
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


def dashboard_panel(uid: str, title: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(dashboard, the panel whose title starts with ``title``) of the committed JSON."""
    dashboard = json.loads((REPO / "dashboards" / f"{uid}.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in walk_panels(dashboard) if str(p.get("title", "")).startswith(title)]
    return dashboard, panel


def dashboard_table(prometheus: str, uid: str, title: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The committed table as Grafana fills it: {(model, workload, cluster): {column title: value}}; a column that
    shows a label (the GPU's name) holds that label's value, a value column's words (value mappings) its text."""
    dashboard, panel = dashboard_panel(uid, title)
    (organize,) = [t for t in panel["transformations"] if t["id"] == "organize"]
    titles = organize["options"]["renameByName"]
    every = {VAR_CLUSTER: ALL, VAR_NAMESPACE: ALL, VAR_MODEL_NAME: ALL, VAR_POD: ALL}
    api = PrometheusAPI(prometheus)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for target in panel["targets"]:
        expr = interpolate(target["expr"], every, range_=f"{int(PERIOD.seconds)}s", dashboard=dashboard)
        assert "$" not in expr, expr
        for series in api.query(expr, at=PERIOD.end):
            labels = series["metric"]
            key = (labels["model_name"], labels.get("workload", ""), labels.get("cluster", ""))
            value = f"Value #{target['refId']}"
            if value in titles:
                rows.setdefault(key, {})[titles[value]] = float(series["value"][1])
            for label, column in titles.items():  # a label column (only the GPU query has labels beyond the key)
                if not label.startswith("Value") and label in labels and label not in ("namespace", "model_name"):
                    if label not in ("workload", "cluster"):
                        assert column not in rows.get(key, {}), (key, column)  # one GPU name per workload
                        rows.setdefault(key, {})[column] = labels[label]
    return rows


def flag_words(uid: str, title: str) -> dict[str, str]:
    """The words the memory setting's column shows for a negative code (its value mapping)."""
    _, panel = dashboard_panel(uid, title)
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"]["options"] == FLAG_COLUMN:
            for prop in o["properties"]:
                if prop["id"] == "mappings":
                    return {k: v["text"] for m in prop["value"] for k, v in m["options"].items()}
    raise AssertionError(f"no value mapping on {FLAG_COLUMN}")


def _rule_grid_s(prometheus: str) -> float:
    """Seconds past the minute at which the backfilled recording rules were evaluated (promtool picks them)."""
    query = f'{PEAK_RULE}{{model_name="m", workload="vllm-m", cluster="east"}}[{int(PERIOD.seconds)}s]'
    (series,) = PrometheusAPI(prometheus).query(query, at=PERIOD.end)
    (offset,) = {round((float(t) - T0) % 60, 3) for t, _ in series["values"]}
    return offset or 60.0


WORKLOADS = (
    (("m", "vllm-m", "east"), LLM_M, ("vllm-m-0", "vllm-m-1", "vllm-m-2")),
    (("n", "", ""), LLM_N, ("vllm-n-0",)),
    (("k", "vllm-k", "east"), LLM_K, ("vllm-k-0", "vllm-k-1")),
    (("m", "other-m", "east"), OTHER_M, ("other-m-0",)),
    (("m", "vllm-m", "west"), WEST_M, ("vllm-m-w0",)),
    (("j", "vllm-j", "east"), ModelKey("llm", "j", "vllm-j", "east"), ("vllm-j-0",)),
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
        if not GPU_EXPORTS.get(
            pods[0]
        ):  # without a memory suggestion (no model config, no exported sizing): today's replicas
            assert a.suggested_gpu_memory_utilization is None
            assert a.suggested_replicas == a.replicas_needed_now
        elif pods[0] == "vllm-j-0":  # vLLM ignores the utilization: the report sizes the KV bytes
            assert a.suggested_gpu_memory_utilization is None and a.suggested_kv_cache_memory_bytes is not None
        else:  # sized with the GPU memory the sidecars exported, on the smallest pool
            assert a.suggested_gpu_memory_utilization == utilization(peak / len(pods), usable, GPU_EXPORTS[pods[0]][2])
        assert a.gpu == GPU_EXPORTS.get(pods[0], ("", "", 0.0))[1]
        assert bool(a.uneven) == (max(pod_peak(p) for p in pods) > (1 + UNEVEN_MARGIN) * peak / len(pods))
    assert report_models[LLM_M].advice.uneven and not report_models[LLM_N].advice.uneven
    assert report_models[LLM_K].advice.gpu == "H100-80GB"
    assert set(report_models) == {model for _, model, _ in WORKLOADS}


def test_the_report_gives_each_workload_and_cluster_its_own_recommendation(report_models):
    """Model m in namespace llm is three workloads: two Deployments in cluster east, one of them also in
    cluster west; each is sized on its own pods. Series without the labels group as before (llm/n)."""
    m = [key for key in report_models if (key.namespace, key.model_name) == ("llm", "m")]
    assert sorted(m) == sorted([LLM_M, OTHER_M, WEST_M])
    for key, pods in ((OTHER_M, ["other-m-0"]), (WEST_M, ["vllm-m-w0"]), (LLM_M, ["vllm-m-0", "vllm-m-1", "vllm-m-2"])):
        report = report_models[key]
        assert sorted(p.pod for p in report.pods) == pods
        assert report.capacity.peak_demand_tokens == workload_peak(pods)
        assert report.advice.replicas_now == len(pods)
    assert str(LLM_M) == "llm/m (workload vllm-m, cluster east)" and str(LLM_N) == "llm/n"
    assert (
        report_models[WEST_M].summary.startswith("llm/m (workload vllm-m, cluster west)")
        or not report_models[WEST_M].needs_action
    )
    assert "H100-80GB × 2 replicas" in report_models[LLM_K].advice.sentence, report_models[LLM_K].advice.sentence


def utilization(share: float, usable: float, memory: float) -> float:
    """The definition: suggest_gpu_memory_utilization of the even share on a pool of ``usable`` tokens at 0.9."""
    return suggest_gpu_memory_utilization(
        u0=0.9,
        capacity_tokens=usable + BLOCK,
        peak_demand_tokens=share,
        target_usage=TH.target_usage,
        bytes_per_token=BYTES_PER_TOKEN,
        gpu_memory_bytes=memory,
        block_size=BLOCK,
        lo=SETTINGS.utilization_min,
        hi=SETTINGS.utilization_max,
    )


#: The memory setting's column where no value can be computed: the code the query gives, by workload.
FLAG_CODES = {
    ("m", "vllm-m", "east"): -2.0,
    ("n", "", ""): -1.0,
    ("m", "other-m", "east"): -1.0,
    ("m", "vllm-m", "west"): -1.0,
    ("j", "vllm-j", "east"): -3.0,
}


def expected_flag(key: tuple[str, str], pods: tuple[str, ...], peak: float) -> float:
    """The memory setting a workload's row shows: the definition, or the code of the words saying why not."""
    if key in FLAG_CODES:
        return FLAG_CODES[key]
    return utilization(peak / len(pods), min(PODS[p][1] for p in pods), GPU_EXPORTS[pods[0]][2])


def test_the_memory_setting_says_why_where_it_cannot_be_computed():
    """No number where the value cannot be computed: the codes read as words naming the cause."""
    for uid, title in (
        (DASHBOARD_CAPACITY_UID, WORKLOAD_TABLE_TITLE),
        (DASHBOARD_OVERVIEW_UID, WORKLOAD_NOW_TABLE_TITLE),
    ):
        words = flag_words(uid, title)
        assert "different pools" in words["-2"] and "model.gpu_memory" in words["-1"], words
        assert "--kv-cache-memory-bytes" in words["-3"], words


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
            FLAG_COLUMN: (
                expected_flag(key, pods, peak),
                a.suggested_gpu_memory_utilization if key not in FLAG_CODES else None,
            ),
        }
        assert row.pop(GPU_COLUMN) == (a.gpu or GPU_UNKNOWN), (key, a.gpu)
        assert set(row) == set(expected), (key, row)
        for column, (defined, reported) in expected.items():
            assert math.isclose(row[column], defined, rel_tol=1e-12), (model, column, row[column], defined)
            if reported is not None:
                assert math.isclose(row[column], reported, rel_tol=1e-3), (model, column, row[column], reported)
        assert row["Replicas needed at today's setting"] == a.replicas_needed_now
        assert bool(a.uneven) == (row["Hottest replica vs even share"] > 1 + UNEVEN_MARGIN), (model, a.uneven)


def test_the_fleet_sizes_the_peak_window_with_the_reports_function(prometheus, report_models):
    """The Fleet sizes each workload on the peak of the last forecast.peak_window (a day, longer than this
    history), the window the sidecar's per-pod advice is sized on: hours after the peak, at the history's
    end, it still sizes for it (the last minute's demand is far below it here), with the report's function."""
    table = dashboard_table(prometheus, DASHBOARD_OVERVIEW_UID, WORKLOAD_NOW_TABLE_TITLE)
    assert set(table) == {key for key, _, _ in WORKLOADS}, table
    grid_s = _rule_grid_s(prometheus)
    last = math.floor((PERIOD.end - T0 - grid_s) / 60)  # the last evaluation before the query's instant
    for key, model, pods in WORKLOADS:
        row, a = table[key], report_models[model].advice
        assert a.capacity_now_tokens is not None
        usable = a.capacity_now_tokens - BLOCK
        peak = workload_peak(list(pods), grid_s)  # every rule evaluation is within the last day
        assert peak > 1.5 * workload_sums(list(pods), grid_s)[last]  # the last minute alone would size far less
        expected = {
            "Replicas running": len(pods),
            "Peak demand, last 24h (tokens)": peak,
            "Usable tokens per replica": usable,
            "Even share per replica": peak / len(pods) / usable,
            "Replicas needed at today's setting": suggested_replicas(
                peak_demand_tokens=peak,
                target_usage=TH.target_usage,
                capacity_per_replica_tokens=a.capacity_now_tokens,
                block_size=BLOCK,
            ),
            "Hottest replica vs even share": max(pod_peak(p) for p in pods) / (peak / len(pods)),
            FLAG_COLUMN: expected_flag(key, pods, peak),
        }
        assert row.pop(GPU_COLUMN) == (a.gpu or GPU_UNKNOWN), (key, a.gpu)
        assert set(row) == set(expected), (key, row)
        for column, value in expected.items():
            assert math.isclose(row[column], value, rel_tol=1e-12), (model, column, row[column], value)
        if key not in FLAG_CODES:  # the report's value, to the digit
            assert math.isclose(row[FLAG_COLUMN], a.suggested_gpu_memory_utilization or -1.0, rel_tol=1e-12)


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
