"""deploy/, field by field: what a user applies does what docs/kubernetes.md says it does.

The sidecar is a plain container without any probe (never in vLLM's way: docs/kubernetes.md, "Never gate
vLLM") and meets the "restricted" profile; the PodMonitor's ports exist on the pod it selects and it carries
kube-prometheus-stack's release label; the opt-in NetworkPolicy keeps every port but the sidecar's open to
every peer; each workload's ConfigMap passes ``kv-sidecar check-config``; the PrometheusRule is the rules file (or
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
    NETWORK_POLICY,
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
#: Every rendering that holds a pod with the sidecar. The overlays hold none: they install the monitoring.
WITH_SIDECAR = ("examples/vllm", *COMPONENTS)
#: Where the sidecar is a plain container (the default) and where a native sidecar (opt-in).
PLAIN = ("examples/vllm", "components/kv-cache-sidecar", "components/statefulset")
NATIVE = ("components/native-sidecar",)


# ----------------------------------------------------------------------------- the sidecar


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_sidecar_meets_the_restricted_profile_on_its_own(rendered, path):
    """Checked without the pod's securityContext: the vLLM pod is someone else's and may set none."""
    assert restricted_container_problems(sidecar_of(rendered, path)) == []


def test_the_restricted_check_can_fail(rendered):
    sidecar = copy.deepcopy(sidecar_of(rendered, "examples/vllm"))
    del sidecar["securityContext"]["runAsNonRoot"]
    sidecar["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    sidecar["securityContext"]["readOnlyRootFilesystem"] = False
    problems = restricted_container_problems(sidecar)
    assert len(problems) == 4, problems  # runAsNonRoot, drop ALL, add NET_ADMIN, read-only root


#: Probes the kubelet acts on. Each would put the sidecar in vLLM's way: a readinessProbe's failure takes
#: the pod out of its Service, a native sidecar's startupProbe holds vLLM's start, a livenessProbe's
#: restart leaves the pod not Ready meanwhile (docs/kubernetes.md, "Never gate vLLM").
PROBES = ("readinessProbe", "startupProbe", "livenessProbe")


@pytest.mark.parametrize("path", PLAIN)
def test_by_default_the_sidecar_is_a_plain_container_without_any_probe(rendered, path):
    """vLLM's container starts whatever happens to the sidecar's image, configuration or process."""
    spec = pod_spec(deployment(rendered, path))
    sidecar = sidecar_of(rendered, path)
    assert sidecar in spec["containers"] and "restartPolicy" not in sidecar
    assert CONTAINER_NAME not in {c["name"] for c in spec.get("initContainers", [])}
    assert [p for p in PROBES if p in sidecar] == []


@pytest.mark.parametrize("path", NATIVE)
def test_the_opt_in_native_sidecar_has_no_probe_either(rendered, path):
    """The kubelet starts vLLM once the native sidecar runs: no startupProbe makes vLLM wait any longer."""
    spec = pod_spec(deployment(rendered, path))
    sidecar = sidecar_of(rendered, path)
    assert sidecar in spec["initContainers"] and sidecar["restartPolicy"] == "Always"
    assert [p for p in PROBES if p in sidecar] == []


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


def test_the_native_and_statefulset_components_run_the_same_container(rendered):
    plain = sidecar_of(rendered, "components/kv-cache-sidecar")
    native = sidecar_of(rendered, "components/native-sidecar")
    assert {k: v for k, v in native.items() if k != "restartPolicy"} == plain
    assert sidecar_of(rendered, "components/statefulset") == plain
    assert deployment(rendered, "components/statefulset")["kind"] == "StatefulSet"
    for path in PLAIN:  # the sidecar is listed first: kubectl logs/exec still pick vLLM without -c
        annotations = deployment(rendered, path)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["kubectl.kubernetes.io/default-container"] == "vllm"


def test_each_workload_reads_its_own_config_map_named_after_it(rendered):
    """Two Deployments in one namespace: two ConfigMaps, kv-cache-sidecar-<Deployment>, another TP each."""
    objs = rendered["examples/two-deployments"]
    seen = {}
    for d in by_kind(objs, "Deployment"):
        spec = pod_spec(d)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "kv-cache-sidecar-config"]
        cm = one(objs, "ConfigMap", volume["configMap"]["name"])
        assert cm["metadata"]["name"] == f"kv-cache-sidecar-{d['metadata']['name']}"
        config = yaml.safe_load(cm["data"]["config.yaml"])
        tp = next(a for a in container(spec, "vllm")["args"] if a.startswith("--tensor-parallel-size="))
        assert config["model"]["tensor_parallel_size"] == int(tp.split("=")[1])
        seen[d["metadata"]["name"]] = cm["metadata"]["name"]
    assert len(set(seen.values())) == len(seen) == 2


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
    resources = sidecar_of(rendered, "examples/vllm")["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"memory"}


# ----------------------------------------------------------------------------- its configuration


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kv_sidecar(), "check-config", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", WITH_SIDECAR)
def test_the_config_map_passes_check_config(rendered, path, tmp_path):
    _, config = config_of(rendered, path)
    data = yaml.safe_load(config)
    assert data["targets"] == [{"url": DEFAULT_TARGET}]  # vLLM in the same pod, on vLLM's port
    vllm_ports = {p["containerPort"] for p in container(pod_spec(deployment(rendered, path)), "vllm").get("ports", [])}
    assert int(DEFAULT_TARGET.rsplit(":", 1)[1].split("/")[0]) in vllm_ports
    verbatim = tmp_path / "verbatim.yaml"
    verbatim.write_text(config, encoding="utf-8")
    if not Path(data["model"]["config"]).exists():  # the mount exists in the pod, not here
        res = _check_config(verbatim)
        # valid as it stands; the model is waited for, as `run` does
        assert res.returncode == 0 and f"note: model.config: {data['model']['config']}" in res.stdout, res.stderr
    in_pod = tmp_path / "config.yaml"
    in_pod.write_text(rerooted(config, tmp_path / "pod"), encoding="utf-8")
    res = _check_config(in_pod)
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------- Prometheus


@pytest.mark.parametrize("path", ("base", *OVERLAY_PATHS))
@pytest.mark.parametrize("pod", WITH_SIDECAR)
def test_the_podmonitor_selects_the_pods_on_ports_they_have(rendered, path, pod):
    """The sidecar by its port's name; vLLM by number, whatever its port is named (or not)."""
    pm = one(rendered[path], "PodMonitor")
    template = deployment(rendered, pod)["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    sidecar_endpoint, vllm_endpoint = pm["spec"]["podMetricsEndpoints"]
    assert sidecar_endpoint["port"] == sidecar_of(rendered, pod)["ports"][0]["name"]
    assert len(sidecar_endpoint["port"]) <= 15
    assert "port" not in vllm_endpoint and vllm_endpoint["portNumber"] == int(
        DEFAULT_TARGET.split(":")[2].split("/")[0]
    )
    job = next(r for r in sidecar_endpoint["relabelings"] if r["targetLabel"] == "job")
    assert job["replacement"] == "kv-cache-sidecar"  # the rules' default alerts.sidecar_job


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_the_overlays_carry_the_release_label_kube_prometheus_stack_selects(rendered, overlay):
    for kind in ("PodMonitor", "PrometheusRule"):
        obj = one(rendered[f"overlays/{overlay.name}"], kind)
        assert obj["metadata"]["labels"]["release"] == overlay.release == RELEASE
        assert obj["metadata"]["namespace"] == overlay.namespace
        assert "release" not in one(rendered["base"], kind)["metadata"]["labels"]


PROMETHEUS = {"namespace": "monitoring", "labels": {"app.kubernetes.io/name": "prometheus"}}
ANYONE = {"namespace": "llm-prod", "labels": {"app": "chat-frontend"}}
#: Ports a vLLM pod may serve besides vLLM's API: Ray's GCS and dashboard, NIXL side channel, a mesh's.
OTHER_PORTS = [("TCP", 8000), ("TCP", 6379), ("TCP", 8265), ("TCP", 5600), ("TCP", 15090), ("UDP", 4791), ("TCP", 1)]


def _matches(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def _allowed(policy: dict, peer: dict, protocol: str, port: int) -> bool:
    """Whether the NetworkPolicy lets ``peer`` reach ``port`` of a pod it selects (Kubernetes docs, "Network
    Policies": a rule allows when one of its peers and one of its ports match; no ``from``: every peer)."""
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        peer_ok = peers is None or any(
            _matches(f.get("namespaceSelector", {}), {"kubernetes.io/metadata.name": peer["namespace"]})
            and _matches(f.get("podSelector", {}), peer["labels"])
            for f in peers
        )
        ports = rule.get("ports")
        port_ok = ports is None or any(
            p.get("protocol", "TCP") == protocol and p["port"] <= port <= p.get("endPort", p["port"]) for p in ports
        )
        if peer_ok and port_ok:
            return True
    return False


def test_the_network_policy_restricts_the_sidecars_port_and_takes_nothing_else_away(rendered):
    objs = rendered[NETWORK_POLICY]
    policy = one(objs, "NetworkPolicy")
    template = deployment(rendered, NETWORK_POLICY)["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    metrics_port = sidecar_of(rendered, NETWORK_POLICY)["ports"][0]["containerPort"]
    assert _allowed(policy, PROMETHEUS, "TCP", metrics_port)
    assert not _allowed(policy, ANYONE, "TCP", metrics_port)
    assert not _allowed(policy, {**PROMETHEUS, "namespace": "llm-prod"}, "TCP", metrics_port)  # not any "prometheus"
    for protocol, port in OTHER_PORTS + [
        ("TCP", p["containerPort"]) for p in container(template["spec"], "vllm")["ports"]
    ]:
        assert _allowed(policy, ANYONE, protocol, port), (protocol, port)
    # Every port of every protocol but the sidecar's, from anyone: the whole range, checked exhaustively.
    closed = [
        (proto, port)
        for proto in ("TCP", "UDP", "SCTP")
        for port in range(1, 65536)
        if not _allowed(policy, ANYONE, proto, port)
    ]
    assert closed == [("TCP", metrics_port)]


def test_the_network_policy_check_can_fail(rendered):
    """The old policy (Prometheus to 9437, anyone to 8000 only) fails the check above: it closed Ray's port."""
    policy = copy.deepcopy(one(rendered[NETWORK_POLICY], "NetworkPolicy"))
    policy["spec"]["ingress"][1]["ports"] = [{"protocol": "TCP", "port": 8000}]
    assert _allowed(policy, ANYONE, "TCP", 8000) and not _allowed(policy, ANYONE, "TCP", 6379)


def _rules_rendered_from(config_text: str, tmp_path: Path, *flags: str) -> dict:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_text, encoding="utf-8")
    res = subprocess.run(
        [*kv_sidecar(), "rules", "render", "--config.file", str(cfg), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    rules: dict = yaml.safe_load(res.stdout)
    return rules


def test_the_base_prometheus_rule_is_the_rules_file(rendered):
    committed = yaml.safe_load((REPO / "alerts" / "kvcache.rules.yaml").read_text(encoding="utf-8"))
    assert one(rendered["base"], "PrometheusRule")["spec"]["groups"] == committed["groups"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_each_overlays_rules_are_rendered_from_its_sidecars_own_thresholds(rendered, overlay, tmp_path):
    """The page fires at the watermark the sidecars' headroom gauges use in that overlay, on its namespace only."""
    path = f"overlays/{overlay.name}"
    config = one(rendered[path], "ConfigMap", "kv-cache-sidecar-report")["data"]["report.yaml"]
    assert yaml.safe_load(config)["thresholds"] == vars(overlay.thresholds)
    expected = _rules_rendered_from(config, tmp_path, "--alerts.namespace", overlay.namespace)
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
    config = one(rendered["overlays/prod"], "ConfigMap", "kv-cache-sidecar-report")["data"]["report.yaml"]
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
    assert report["image"].startswith("ghcr.io/kv-cache-sidecar/kv-cache-sidecar")
    cm = one(rendered[path], "ConfigMap", "kv-cache-sidecar-report")
    env = {"PROMETHEUS_URL": cm["data"]["prometheus_url"], "POD_NAMESPACE": job["metadata"].get("namespace", "default")}
    for e in report["env"]:
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["name"] == cm["metadata"]["name"] and ref["key"] in cm["data"]
    args = build_parser().parse_args(_expand(report["args"], env))
    assert args.command == "report" and args.prometheus_url.startswith("http://")
    assert args.selector == f'{{namespace="{env["POD_NAMESPACE"]}"}}'
    # Writable: the report's folder (its volume claim, tests/deploy/test_deploy_report.py) and /tmp (matplotlib,
    # an emptyDir); the root stays read-only.
    writable = {m["mountPath"]: m["name"] for m in report["volumeMounts"] if not m.get("readOnly")}
    assert set(writable) == {str(args.out), "/tmp"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "persistentVolumeClaim" in volumes[writable[str(args.out)]] and "emptyDir" in volumes[writable["/tmp"]]
    # Its configuration is in the mounted ConfigMap, valid, with the thresholds of the sidecars it reports on.
    config_mount = next(m for m in report["volumeMounts"] if str(args.config_file).startswith(m["mountPath"] + "/"))
    assert volumes[config_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    report_config = cm["data"][Path(args.config_file).name]
    (tmp_path / "report.yaml").write_text(report_config, encoding="utf-8")
    assert _check_config(tmp_path / "report.yaml").returncode == 0
    overlay = next((o for o in OVERLAYS if path == f"overlays/{o.name}"), None)
    expected = (
        vars(overlay.thresholds) if overlay else yaml.safe_load(config_of(rendered, "examples/vllm")[1])["thresholds"]
    )
    assert yaml.safe_load(report_config)["thresholds"] == expected


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_every_overlay_runs_the_image_of_this_version(rendered, overlay):
    images = {
        c["image"]
        for o in rendered[f"overlays/{overlay.name}"]
        if o["kind"] in ("Deployment", "CronJob")
        for c in pod_spec(o).get("initContainers", []) + pod_spec(o)["containers"]
        if c["name"] != "vllm"
    }
    assert images == {f"ghcr.io/kv-cache-sidecar/kv-cache-sidecar-report:{__version__}"}  # the report's own image
    for path in WITH_SIDECAR:
        assert sidecar_of(rendered, path)["image"] == f"ghcr.io/kv-cache-sidecar/kv-cache-sidecar:{__version__}"


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
    assert target == deployment(rendered, "examples/vllm")["metadata"]["name"]  # the example vLLM's
