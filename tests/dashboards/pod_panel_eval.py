"""One pod's panels evaluated by Prometheus' own engine on what the sidecar exports from a page.

For panels the shared stack of ``test_panels_prometheus.py`` cannot light (a family no simulated vLLM
exports): a test gives vLLM's page at each step; the sidecar reads it, and its /metrics after each step,
with the ``namespace`` and ``pod`` labels a PodMonitor adds, becomes ``promtool test rules``' input series.
The panel's query comes from the committed ``dashboards/kvcache-pod.json`` with the variables set to that
pod as Grafana sends them, and is evaluated at the last step.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from alerttools import require_tool, run_tool
from fixtures import REPO
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.artifacts.dashboards import VAR_CLUSTER
from sidecar.artifacts.panels import ALL, interpolate, queries
from sidecar.artifacts.params import DASHBOARD_POD_UID, VAR_MODEL_NAME, VAR_NAMESPACE, VAR_POD
from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

# (powers of two: promtool 2.42 compares figures exactly, and 3 / 5 s comes out as 0.6000000000000001)
STEP_S, STEPS = 4, 8
MODEL = "models/tiny-llama-gqa-bf16"
NAMESPACE, POD = "team-a", "vllm-a-0"
#: Grafana's $__rate_interval for a 4 s scrape interval: 4 x the scrape interval.
RATE_INTERVAL = "16s"


def sidecar_series(
    page_at: Callable[[int], str], families: tuple[str, ...], flags: Mapping[tuple[str, str], str] | None = None
) -> dict[str, list[float]]:
    """promtool series (``name{labels}``) of ``families`` -> the sidecar's value after each step."""
    config = load_config(
        None,
        env={},
        flags={("scrape", "interval"): f"{STEP_S}s", **(flags or {})},
        flag_targets=["http://127.0.0.1:9/metrics"],
    )
    clock = [1_800_000_000.0]
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    state = sidecar.states[0]
    out: dict[str, list[float]] = defaultdict(list)
    for i in range(STEPS):
        clock[0] += STEP_S
        scrape = sidecar.read_body(state, page_at(i).encode())
        sidecar.record(state, scrape, sample_time=clock[0], wall_time=clock[0], duration_s=0.01)
        for family in text_string_to_metric_families(generate_latest(sidecar.registry).decode()):
            for s in family.samples:
                if s.name in families:
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


def promtool_checks(
    tmp_path: Path, series: Mapping[str, list[float]], checks: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of these ``promql_expr_test`` checks over ``series``, at the last step."""
    test = {
        "rule_files": [],
        # promtool 2.42 samples the input series at the evaluation interval, whatever the group's `interval`
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": [
                    {"series": name, "values": " ".join(repr(v) for v in values)} for name, values in series.items()
                ],
                "promql_expr_test": [{**check, "eval_time": f"{(STEPS - 1) * STEP_S}s"} for check in checks],
            }
        ],
    }
    path = tmp_path / "panels_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return run_tool(require_tool("promtool"), "test", "rules", str(path))
