"""deploy/, field by field: what a user applies does what docs/kubernetes.md says it does.

The sidecar is a native sidecar without a readinessProbe and meets the "restricted" profile; the
PodMonitor's port exists on the pod it selects and carries kube-prometheus-stack's release label; the
ConfigMap's configuration passes ``kv-sidecar check-config``; the PrometheusRule is the rules file (or
the rules rendered from the overlay's own configuration); the dashboards' ConfigMaps are dashboards/;
the report's CronJob runs the same image with arguments ``kv-sidecar`` accepts.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deploytools import (
    COMPONENTS,
    REPO,
    by_kind,
    config_of,
    container,
    deployment,
    one,
    pod_spec,
    rerooted,
    restricted_container_problems,
    restricted_pod_problems,
    sidecar_of,
)
from processes import kv_sidecar

from sidecar import __version__
from sidecar.artifacts.deploy import OVERLAYS, RELEASE
from sidecar.artifacts.kubernetes import CONTAINER_NAME, POD_LABEL
from sidecar.cli import build_parser
from sidecar.settings import DEFAULT_TARGET

OVERLAY_PATHS = tuple(f"overlays/{o.name}" for o in OVERLAYS)
#: Every rendering that holds a pod with the sidecar.
WITH_SIDECAR = ("base", *OVERLAY_PATHS, *COMPONENTS)


# ----------------------------------------------------------------------------- the sidecar


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_sidecar_meets_the_restricted_profile_on_its_own(rendered, path):
    """Checked without the pod's securityContext: the vLLM pod is someone else's and may set none."""
    assert restricted_container_problems(sidecar_of(rendered, path)) == []


def test_the_restricted_check_can_fail(rendered):
    sidecar = copy.deepcopy(sidecar_of(rendered, "base"))
    del sidecar["securityContext"]["runAsNonRoot"]
    sidecar["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    sidecar["securityContext"]["readOnlyRootFilesystem"] = False
    problems = restricted_container_problems(sidecar)
    assert len(problems) == 4, problems  # runAsNonRoot, drop ALL, add NET_ADMIN, read-only root


@pytest.mark.parametrize("path", ("base", *OVERLAY_PATHS, "components/kv-cache-sidecar"))
def test_the_sidecar_is_a_native_sidecar_without_a_readiness_probe(rendered, path):
    spec = pod_spec(deployment(rendered, path))
    sidecar = sidecar_of(rendered, path)
    assert sidecar in spec["initContainers"] and sidecar["restartPolicy"] == "Always"
    assert CONTAINER_NAME not in {c["name"] for c in spec["containers"]}
    # A native sidecar's readiness is the pod's: a probe failing under load would take vLLM out of its Service.
    assert "readinessProbe" not in sidecar
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"] for p in sidecar["ports"]}
    assert {sidecar["startupProbe"]["httpGet"]["port"], sidecar["livenessProbe"]["httpGet"]["port"]} <= ports


def test_the_component_keeps_the_deployment_it_patches(rendered):
    """On someone else's Deployment: their containers, init container, volumes and labels stay."""
    for path in COMPONENTS:
        d = deployment(rendered, path)
        spec = pod_spec(d)
        names = {c["name"] for c in spec.get("initContainers", []) + spec["containers"]}
        assert names == {"warm-cache", "vllm", CONTAINER_NAME}
        assert {v["name"] for v in spec["volumes"]} == {"model", "kv-cache-sidecar-config"}
        assert d["spec"]["selector"] == {"matchLabels": {"app": "chat"}}
        assert d["spec"]["template"]["metadata"]["labels"] == {"app": "chat", POD_LABEL: "true"}


def test_the_legacy_component_is_a_plain_container_with_the_same_settings(rendered):
    legacy = sidecar_of(rendered, "components/legacy-sidecar")
    native = sidecar_of(rendered, "components/kv-cache-sidecar")
    spec = pod_spec(deployment(rendered, "components/legacy-sidecar"))
    assert legacy in spec["containers"] and "restartPolicy" not in legacy
    assert "readinessProbe" not in legacy
    assert {k: v for k, v in native.items() if k != "restartPolicy"} == legacy
    annotations = deployment(rendered, "components/legacy-sidecar")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "vllm"


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_model_is_mounted_read_only_from_a_volume_of_the_pod(rendered, path):
    spec = pod_spec(deployment(rendered, path))
    sidecar = sidecar_of(rendered, path)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = [m for m in sidecar["volumeMounts"] if m["name"] not in ("kv-cache-sidecar-config",)]
    assert len(mounts) == 1 and mounts[0]["readOnly"] is True and mounts[0]["name"] in volumes
    # vLLM mounts the same volume: the sidecar reads the model vLLM serves.
    vllm = container(spec, "vllm")
    assert mounts[0]["name"] in {m["name"] for m in vllm["volumeMounts"]}
    _, config = config_of(rendered, path)
    assert yaml.safe_load(config)["model"]["config"] == mounts[0]["mountPath"]


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_config_is_a_directory_mount_of_its_config_map_so_edits_reach_the_pod(rendered, path):
    sidecar = sidecar_of(rendered, path)
    config_mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "kv-cache-sidecar-config")
    assert "subPath" not in config_mount and config_mount["readOnly"] is True
    cm, _ = config_of(rendered, path)
    assert not re.search(r"-[a-z0-9]{10}$", cm["metadata"]["name"]), "a name-suffix hash would roll vLLM on every edit"


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_sidecar_arguments_are_kv_sidecar_run_flags(rendered, path):
    args = build_parser().parse_args(sidecar_of(rendered, path)["args"])
    assert args.command == "run" and args.config_file == "/etc/kv-sidecar/config.yaml"


def test_resources_are_small_requests_and_a_memory_limit_without_a_cpu_limit(rendered):
    resources = sidecar_of(rendered, "base")["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"memory"}


# ----------------------------------------------------------------------------- its configuration


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kv_sidecar(), "check-config", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", ("base", *OVERLAY_PATHS))
def test_the_config_map_passes_check_config(rendered, path, tmp_path):
    _, config = config_of(rendered, path)
    data = yaml.safe_load(config)
    assert data["targets"] == [{"url": DEFAULT_TARGET}]  # vLLM in the same pod, on vLLM's port
    vllm_ports = {p["containerPort"] for p in container(pod_spec(deployment(rendered, path)), "vllm")["ports"]}
    assert int(DEFAULT_TARGET.rsplit(":", 1)[1].split("/")[0]) in vllm_ports
    verbatim = tmp_path / "verbatim.yaml"
    verbatim.write_text(config, encoding="utf-8")
    if not Path(data["model"]["config"]).exists():  # the mount exists in the pod, not here
        res = _check_config(verbatim)
        # one problem only, and it is that path: everything else of the file is valid as it stands
        assert (
            res.returncode == 2
            and "(1 problem)" in res.stderr
            and f"model.config: '{data['model']['config']}'" in res.stderr
        ), res.stderr
    in_pod = tmp_path / "config.yaml"
    in_pod.write_text(rerooted(config, tmp_path / "pod"), encoding="utf-8")
    res = _check_config(in_pod)
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------- Prometheus


@pytest.mark.parametrize("path", ("base", *OVERLAY_PATHS))
def test_the_podmonitor_selects_the_pods_on_a_port_they_have(rendered, path):
    pm = one(rendered[path], "PodMonitor")
    template = deployment(rendered, path)["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    port_names = {p["name"] for c in spec.get("initContainers", []) + spec["containers"] for p in c.get("ports", [])}
    endpoints = [e["port"] for e in pm["spec"]["podMetricsEndpoints"]]
    assert set(endpoints) <= port_names and all(len(p) <= 15 for p in endpoints)
    sidecar_port = sidecar_of(rendered, path)["ports"][0]["name"]
    assert endpoints[0] == sidecar_port
    job = next(r for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"] if r["targetLabel"] == "job")
    assert job["replacement"] == "kv-cache-sidecar"  # the rules' default alerts.sidecar_job


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_the_overlays_carry_the_release_label_kube_prometheus_stack_selects(rendered, overlay):
    for kind in ("PodMonitor", "PrometheusRule"):
        obj = one(rendered[f"overlays/{overlay.name}"], kind)
        assert obj["metadata"]["labels"]["release"] == overlay.release == RELEASE
        assert obj["metadata"]["namespace"] == overlay.namespace
        assert "release" not in one(rendered["base"], kind)["metadata"]["labels"]


def test_the_network_policy_lets_only_prometheus_reach_the_metrics_port(rendered):
    for path in ("base", *OVERLAY_PATHS):
        policy = one(rendered[path], "NetworkPolicy")
        template = deployment(rendered, path)["spec"]["template"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        rules = policy["spec"]["ingress"]
        metrics_port = sidecar_of(rendered, path)["ports"][0]["containerPort"]
        to_metrics = [r for r in rules if any(p["port"] == metrics_port for p in r["ports"])]
        assert len(to_metrics) == 1 and to_metrics[0]["from"] == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ]
        # vLLM's own ports stay open (a policy that selects a pod closes what it does not list).
        open_ports = {p["port"] for r in rules if "from" not in r for p in r["ports"]}
        assert {p["containerPort"] for p in container(template["spec"], "vllm")["ports"]} <= open_ports


def _rules_rendered_from(config_text: str, tmp_path: Path) -> dict:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_text, encoding="utf-8")
    res = subprocess.run(
        [*kv_sidecar(), "rules", "render", "--config.file", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    rules: dict = yaml.safe_load(res.stdout)
    return rules


def test_the_base_prometheus_rule_is_the_rules_file(rendered):
    committed = yaml.safe_load((REPO / "alerts" / "kvcache.rules.yaml").read_text(encoding="utf-8"))
    for path in ("base", "overlays/dev"):
        assert one(rendered[path], "PrometheusRule")["spec"]["groups"] == committed["groups"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_each_overlays_rules_are_rendered_from_its_sidecars_own_thresholds(rendered, overlay, tmp_path):
    """The page fires at the watermark the sidecars' headroom gauges use in that overlay."""
    path = f"overlays/{overlay.name}"
    _, config = config_of(rendered, path)
    assert yaml.safe_load(config)["thresholds"] == vars(overlay.thresholds)
    expected = _rules_rendered_from(config, tmp_path)
    assert one(rendered[path], "PrometheusRule")["spec"]["groups"] == expected["groups"]


def test_prod_pages_at_its_own_watermark(rendered):
    prod = next(o for o in OVERLAYS if o.name == "prod")
    assert prod.own_thresholds
    rule = one(rendered["overlays/prod"], "PrometheusRule")
    exprs = [r.get("expr", "") for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any(f"> {prod.thresholds.watermark}" in e for e in exprs)
    assert not any("> 0.9\n" in e or e.endswith("> 0.9") for e in exprs)


# ----------------------------------------------------------------------------- Grafana


@pytest.mark.parametrize("path", ("base", "overlays/dev", "grafana"))
def test_the_dashboard_config_maps_are_the_dashboards(rendered, path):
    maps = [cm for cm in by_kind(rendered[path], "ConfigMap") if cm["metadata"]["labels"].get("grafana_dashboard")]
    committed = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in (REPO / "dashboards").glob("*.json")}
    assert len(maps) == len(committed) == 3
    for cm in maps:
        ((key, text),) = cm["data"].items()
        uid = key.removesuffix(".json")
        assert cm["metadata"]["name"] == f"{uid}-dashboard"  # no name-suffix hash
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "KV cache"
        assert json.loads(text) == committed[uid]


def test_prods_dashboards_are_rendered_with_its_thresholds(rendered, tmp_path):
    _, config = config_of(rendered, "overlays/prod")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config, encoding="utf-8")
    out = tmp_path / "dashboards"
    argv = [*kv_sidecar(), "dashboards", "render", "--config.file", str(cfg), "--out", str(out)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    maps = [
        cm for cm in by_kind(rendered["overlays/prod"], "ConfigMap") if "grafana_dashboard" in cm["metadata"]["labels"]
    ]
    assert len(maps) == 3
    for cm in maps:
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((out / key).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the weekly report


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container arguments."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


@pytest.mark.parametrize("path", ("base", *OVERLAY_PATHS))
def test_the_report_cronjob(rendered, path, tmp_path):
    job = one(rendered[path], "CronJob")
    spec = pod_spec(job)
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert restricted_pod_problems(spec) == []
    (report,) = spec["containers"]
    assert report["image"] == sidecar_of(rendered, path)["image"]
    cm = one(rendered[path], "ConfigMap", "kv-cache-sidecar-report")
    env = {"PROMETHEUS_URL": cm["data"]["prometheus_url"], "POD_NAMESPACE": job["metadata"].get("namespace", "default")}
    for e in report["env"]:
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["name"] == cm["metadata"]["name"] and ref["key"] in cm["data"]
    args = build_parser().parse_args(_expand(report["args"], env))
    assert args.command == "report" and args.prometheus_url.startswith("http://")
    assert args.selector == f'{{namespace="{env["POD_NAMESPACE"]}"}}'
    # Writable: the report's folder and /tmp (matplotlib), each an emptyDir; the root stays read-only.
    writable = {m["mountPath"] for m in report["volumeMounts"] if not m.get("readOnly")}
    assert writable == {str(args.out), "/tmp"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all("emptyDir" in volumes[m["name"]] for m in report["volumeMounts"] if not m.get("readOnly"))
    # Its configuration is in the mounted ConfigMap, valid, with the thresholds of the sidecars it reports on.
    config_mount = next(m for m in report["volumeMounts"] if str(args.config_file).startswith(m["mountPath"] + "/"))
    assert volumes[config_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    report_config = cm["data"][Path(args.config_file).name]
    (tmp_path / "report.yaml").write_text(report_config, encoding="utf-8")
    assert _check_config(tmp_path / "report.yaml").returncode == 0
    _, sidecar_config = config_of(rendered, path)
    assert yaml.safe_load(report_config)["thresholds"] == yaml.safe_load(sidecar_config)["thresholds"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_every_overlay_runs_the_image_of_this_version(rendered, overlay):
    images = {
        c["image"]
        for o in rendered[f"overlays/{overlay.name}"]
        if o["kind"] in ("Deployment", "CronJob")
        for c in pod_spec(o).get("initContainers", []) + pod_spec(o)["containers"]
        if c["name"] != "vllm"
    }
    assert images == {f"ghcr.io/kv-cache-sidecar/kv-cache-sidecar:{__version__}"}


# ----------------------------------------------------------------------------- KEDA


def test_the_keda_example_scales_the_deployment_its_query_reads(rendered):
    scaled = one(rendered["examples/keda"], "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    namespace = scaled["metadata"]["namespace"]
    target = scaled["spec"]["scaleTargetRef"]["name"]
    selectors = re.findall(r"\{([^}]*)\}", query)
    assert selectors and all(
        f'namespace="{namespace}"' in s and f'deployment="{target}"' in s and 'job="kv-cache-sidecar"' in s
        for s in selectors
    )
    assert trigger["metricType"] == "Value"  # a ratio of the whole Deployment, not a per-pod average
    assert trigger["metadata"]["ignoreNullValues"] == "false" and scaled["spec"]["fallback"]["replicas"] >= 1
    overlay = next(o for o in OVERLAYS if o.namespace == namespace)
    assert float(trigger["metadata"]["threshold"]) == overlay.thresholds.target_usage
    assert target in {d["metadata"]["name"] for d in by_kind(rendered[f"overlays/{overlay.name}"], "Deployment")}
