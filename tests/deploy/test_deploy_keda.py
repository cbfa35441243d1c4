"""The KEDA example's query on a real Prometheus: exactly one series per Deployment, the KV pressure of its
pods and of no other Deployment's.

Two Deployments in the example's namespace, as the PodMonitor makes Prometheus see them: ``vllm`` (the
ScaledObject's target, two pods) and ``vllm-batch`` (one pod, a name that starts like the other's). Each pod
is a simulated vLLM and a sidecar started with the sidecar ConfigMap's own configuration (the model
directory under a temporary root). Prometheus scrapes the sidecars with the PodMonitor's own relabelings,
after the ones prometheus-operator puts before them, applied to the discovery labels Kubernetes gives a
Deployment's pod (its ReplicaSet is ``<deployment>-<pod-template-hash>``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploytools import config_of, container, one, pod_spec, rerooted
from processes import Processes, free_port, http_status, kv_sidecar, prometheus_argv

from sidecar.artifacts.files import dump_yaml
from sidecar.artifacts.panels import PrometheusAPI

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

#: (deployment, its ReplicaSet's pod-template-hash, pod suffix, simulator scenario)
PODS = (
    ("vllm", "7c9d8f6b5d", "x2k4q", "steady"),
    ("vllm", "7c9d8f6b5d", "m8z7w", "steady-high"),
    ("vllm-batch", "6b7f9c8d4", "p5n2c", "ramp"),
)


def _pod_name(deployment: str, hash_: str, suffix: str) -> str:
    return f"{deployment}-{hash_}-{suffix}"


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A prometheus-operator RelabelConfig as Prometheus' relabel_config."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in rule.items()}


def _prometheus_config(podmonitor: dict[str, Any], namespace: str, ports: dict[str, int]) -> dict[str, Any]:
    endpoint = podmonitor["spec"]["podMetricsEndpoints"][0]
    # What prometheus-operator writes before the PodMonitor's own relabelings (pkg/prometheus/promcfg.go,
    # generatePodMonitorConfig): namespace, container and pod from discovery, job and endpoint.
    prelude = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{namespace}/{podmonitor['metadata']['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    targets = [
        {
            "targets": [f"127.0.0.1:{ports[_pod_name(d, h, s)]}"],
            "labels": {
                "__meta_kubernetes_namespace": namespace,
                "__meta_kubernetes_pod_name": _pod_name(d, h, s),
                "__meta_kubernetes_pod_container_name": "kv-cache-sidecar",
                "__meta_kubernetes_pod_controller_kind": "ReplicaSet",
                "__meta_kubernetes_pod_controller_name": f"{d}-{h}",
            },
        }
        for d, h, s, _ in PODS
    ]
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "podmonitor",
                "metrics_path": endpoint["path"],
                "static_configs": targets,
                "relabel_configs": prelude + [_relabel(r) for r in endpoint["relabelings"]],
            }
        ],
    }


def _start(procs: Processes, workdir: Path, config: str, namespace: str, podmonitor: dict, prometheus: str) -> int:
    in_pod = workdir / "config.yaml"
    in_pod.write_text(rerooted(config, workdir / "pod"), encoding="utf-8")
    ports: dict[str, int] = {}
    ready = []
    for i, (d, h, s, scenario) in enumerate(PODS):
        pod = _pod_name(d, h, s)
        sim, port = free_port(), free_port()
        ports[pod] = port
        procs.start(
            f"simulator-{pod}",
            [*kv_sidecar(), "simulate", "--host", "127.0.0.1", "--port", str(sim), "--scenario", scenario]
            + ["--speed", "30", "--seed", str(i + 1), "--model-name", f"llama-{d}"],
        )
        # The ConfigMap's file as it is, the address and target moved to this machine's free ports.
        procs.start(
            f"sidecar-{pod}",
            [*kv_sidecar(), "run", "--config.file", str(in_pod), "--web.listen-address", f"127.0.0.1:{port}"]
            + ["--target", f"http://127.0.0.1:{sim}/metrics", "--scrape.interval", "1s"],
        )
        ready.append(f"http://127.0.0.1:{port}/readyz")
    prom_port = free_port()
    prom_config = workdir / "prometheus.yaml"
    prom_config.write_text(dump_yaml(_prometheus_config(podmonitor, namespace, ports)), encoding="utf-8")
    procs.start("prometheus", prometheus_argv(prometheus, prom_config, workdir / "prom-data", prom_port))
    deadline = time.monotonic() + 40
    while ready and time.monotonic() < deadline:
        procs.check_alive()
        ready = [url for url in ready if http_status(url) != 200]
        time.sleep(0.2)
    assert not ready, f"sidecars not ready: {ready}\n{procs.logs()}"
    return prom_port


def _wait_for_series(api: PrometheusAPI, namespace: str, procs: Processes, timeout: float = 60) -> float:
    """Until every pod's demand, used and free tokens are in Prometheus; the time they all were."""
    want = {"vllm": 2, "vllm-batch": 1}
    metrics = ("kvcache_demand_tokens", "kvcache_used_tokens", "kvcache_free_tokens")
    deadline = time.monotonic() + timeout
    seen: dict[str, dict[str, int]] = {}
    while time.monotonic() < deadline:
        procs.check_alive()
        at = time.time()
        try:
            for m in metrics:
                expr = f'count by (deployment) ({m}{{job="kv-cache-sidecar", namespace="{namespace}"}})'
                seen[m] = {s["metric"].get("deployment", ""): int(float(s["value"][1])) for s in api.query(expr, at=at)}
        except Exception:  # Prometheus still starting
            seen = {}
        if all(seen.get(m) == want for m in metrics):
            return at
        time.sleep(0.5)
    raise AssertionError(f"series by deployment: {seen}, expected {want} each\n{procs.logs(tail=15)}")


def _keda_value(result: list[dict[str, Any]]) -> float:
    """What KEDA's Prometheus scaler makes of an answer (pkg/scalers/prometheus_scaler.go): one element
    with a finite value, else an error."""
    assert len(result) == 1, f"KEDA: 'returned multiple elements' or empty: {result}"
    value = float(result[0]["value"][1])
    assert math.isfinite(value)
    return value


def _by_pod(api: PrometheusAPI, metric: str, selector: str, at: float) -> dict[str, float]:
    return {s["metric"]["pod"]: float(s["value"][1]) for s in api.query(f"{metric}{{{selector}}}", at=at)}


def test_the_keda_query_returns_one_series_per_deployment_on_a_real_prometheus(rendered, prometheus_bin, tmp_path):
    scaled = one(rendered["examples/keda"], "ScaledObject")
    namespace = scaled["metadata"]["namespace"]
    target = scaled["spec"]["scaleTargetRef"]["name"]
    overlay = next(
        p
        for p in rendered
        if p.startswith("overlays/") and one(rendered[p], "PodMonitor")["metadata"]["namespace"] == namespace
    )
    podmonitor = one(rendered[overlay], "PodMonitor")
    # The pods: the example vLLM with its sidecar, as the component patches it (the overlay applies no workload).
    assert container(pod_spec(one(rendered["examples/vllm"], "Deployment")), "kv-cache-sidecar")
    _, config = config_of(rendered, "examples/vllm")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]

    procs = Processes(tmp_path)
    try:
        api = PrometheusAPI(
            f"http://127.0.0.1:{_start(procs, tmp_path, config, namespace, podmonitor, prometheus_bin)}"
        )
        at = _wait_for_series(api, namespace, procs)
        pressure = _keda_value(api.query(query, at=at))
        assert api.query(query, at=at)[0]["metric"] == {}

        # The value is the Deployment's demand over its usable KV, from its two pods and no other.
        selector = f'job="kv-cache-sidecar", namespace="{namespace}", deployment="{target}"'
        demand = _by_pod(api, "kvcache_demand_tokens", selector, at)
        used = _by_pod(api, "kvcache_used_tokens", selector, at)
        free = _by_pod(api, "kvcache_free_tokens", selector, at)
        pods = {_pod_name(d, h, s) for d, h, s, _ in PODS if d == target}
        assert set(demand) == set(used) == set(free) == pods
        expected = sum(demand.values()) / (sum(used.values()) + sum(free.values()))
        assert pressure == pytest.approx(expected, rel=1e-9) and pressure > 0

        # The other Deployment (a name that starts like this one's) has its own single series.
        other = _keda_value(api.query(query.replace(f'deployment="{target}"', 'deployment="vllm-batch"'), at=at))
        assert other != pressure
        print(f"KV pressure of {target}: {pressure:.3f} ({len(pods)} pods), of vllm-batch: {other:.3f}")
        # Why the sums: per pod, KEDA would get two series and fail; by pod name, it would count vllm-batch too.
        assert len(api.query(f'kvcache_usage_ratio{{job="kv-cache-sidecar", deployment="{target}"}}', at=at)) == 2
        assert len(api.query(f'kvcache_usage_ratio{{pod=~"{target}-.*"}}', at=at)) == 3
        api.close()
    finally:
        procs.stop()
    assert yaml.safe_load(config)["model"]["config"]  # the sidecars ran the ConfigMap's model path, rerooted
