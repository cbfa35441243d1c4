"""deploy/ renders with plain ``kubectl kustomize`` and every object is valid for the Kubernetes versions
the deployment claims (1.29, the first with native sidecars on by default, to the newest
kubernetes-validate knows), the custom resources against their CRDs' published schemas.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploytools import (
    COMPONENTS,
    DEPLOY,
    KUSTOMIZATIONS,
    NETWORK_POLICY,
    Obj,
    builtin_errors,
    by_kind,
    crd_errors,
    is_custom,
    kubectl,
    kubernetes_versions,
    one,
    pod_spec,
)

#: What each kustomization renders: kind -> count. A changed count is a changed deployment: say so here.
EXPECTED_KINDS = {
    # The monitoring only: nothing that runs vLLM or patches a workload (no Deployment, no Service).
    "base": {
        "ConfigMap": 4,  # the report's and one per dashboard
        "CronJob": 1,
        "PersistentVolumeClaim": 1,  # the report's files, kept for --keep-weeks
        "PodMonitor": 1,
        "PrometheusRule": 1,
    },
    "examples/keda": {"ScaledObject": 1},
    "examples/vllm": {"ConfigMap": 1, "Deployment": 1, "Service": 1},
    "examples/two-deployments": {"ConfigMap": 2, "Deployment": 2},
    "examples/leaderworkerset": {"ConfigMap": 1, "LeaderWorkerSet": 1},
    "examples/kserve": {"ConfigMap": 1, "InferenceService": 1},
    "grafana": {"ConfigMap": 3},
    "components/kv-cache-sidecar": {"ConfigMap": 1, "Deployment": 1},
    "components/native-sidecar": {"ConfigMap": 1, "Deployment": 1},
    "components/statefulset": {"ConfigMap": 1, "StatefulSet": 1},
    "components/network-policy": {"ConfigMap": 1, "Deployment": 1, "NetworkPolicy": 1},
}
EXPECTED_KINDS["overlays/dev"] = EXPECTED_KINDS["overlays/prod"] = EXPECTED_KINDS["base"]


def _kinds(objs: list[Obj]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in objs:
        counts[o["kind"]] = counts.get(o["kind"], 0) + 1
    return counts


@pytest.mark.parametrize("path", (*KUSTOMIZATIONS, *COMPONENTS, NETWORK_POLICY))
def test_every_kustomization_and_component_renders_what_it_should(rendered, path):
    assert _kinds(rendered[path]) == EXPECTED_KINDS[path]


def test_kubectl_is_the_wheels_and_has_kustomize():
    path = kubectl()
    assert Path(path).parent == Path(sys.executable).parent
    out = subprocess.run([path, "version", "--client"], capture_output=True, text=True, timeout=30).stdout
    assert re.search(r"Kustomize Version: v5\.", out), out


def test_the_load_restrictor_holds_without_flags():
    """No kustomization reaches a file outside its own folder (only other kustomizations' folders),
    so plain ``kubectl kustomize`` / ``kubectl apply -k`` work; the renders above pass no flag."""
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text(encoding="utf-8"))
        for entry in [*k.get("resources", []), *(p["path"] for p in k.get("patches", []) if "path" in p)]:
            target = (kfile.parent / entry).resolve()
            inside = target.is_relative_to(kfile.parent.resolve())
            assert inside or (target / "kustomization.yaml").is_file(), f"{kfile}: {entry} is a file outside its folder"


def _write_rendered(rendered, tmp_path) -> dict[Path, list[Obj]]:
    files = {}
    for path, objs in rendered.items():
        f = tmp_path / (path.replace("/", "-") + ".yaml")
        f.write_text(yaml.safe_dump_all(objs), encoding="utf-8")
        files[f] = objs
    return files


@pytest.mark.parametrize("version", kubernetes_versions())
def test_kubernetes_validate_strict_passes_every_built_in_object(rendered, tmp_path, version):
    files = _write_rendered(rendered, tmp_path)
    validator = Path(sys.executable).with_name("kubernetes-validate")
    res = subprocess.run(
        [str(validator), "--strict", "-k", version, *map(str, files)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    passed = set(re.findall(r"^INFO (\S+) passed for resource (\S+) against", res.stdout, re.M))
    for f, objs in files.items():
        for o in objs:
            if not is_custom(o):
                assert (str(f), f"{o['kind'].lower()}/{o['metadata']['name']}") in passed, f"{f}: {o['kind']} unchecked"


@pytest.mark.parametrize("version", kubernetes_versions())
def test_strict_validation_catches_a_misspelt_field(rendered, version):
    deployment = copy.deepcopy(one(rendered["examples/vllm"], "Deployment"))
    assert builtin_errors(deployment, version) == []
    pod_spec(deployment)["containers"][0]["restartPolicyy"] = "Always"
    errors = builtin_errors(deployment, version)
    assert errors and "restartPolicyy" in errors[0]


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_custom_resources_match_their_crds_published_schemas(rendered, path):
    custom = [o for o in rendered[path] if is_custom(o)]
    for o in custom:
        assert crd_errors(o) == [], f"{path}: {o['kind']} {o['metadata']['name']}"
    # Every other object is one kubernetes-validate has a schema for (the test above fails otherwise).
    assert all(
        o["kind"] in ("PodMonitor", "PrometheusRule", "ScaledObject", "LeaderWorkerSet", "InferenceService")
        for o in custom
    )


def test_the_crd_schemas_reject_what_the_api_server_would(rendered):
    podmonitor = copy.deepcopy(one(rendered["overlays/prod"], "PodMonitor"))
    podmonitor["spec"]["podMetricsEndpoints"][0]["prot"] = "kv-metrics"
    assert any("prot" in e for e in crd_errors(podmonitor))
    rule = copy.deepcopy(one(rendered["overlays/prod"], "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expr"] = {"not": "a string"}
    assert crd_errors(rule)
    scaled = copy.deepcopy(one(rendered["examples/keda"], "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 0.7  # KEDA's metadata values are strings
    assert crd_errors(scaled)


def test_every_object_an_overlay_applies_is_labelled_as_ours(rendered):
    """The overlays apply ours only: no vLLM of an example can replace a workload of the namespace."""
    for o in rendered["overlays/prod"]:
        labels = o["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "kv-cache-sidecar", o["metadata"]["name"]
    assert {o["metadata"]["namespace"] for o in rendered["overlays/prod"]} == {"llm-prod"}
    assert by_kind(rendered["overlays/dev"], "PodMonitor")[0]["metadata"]["namespace"] == "llm-dev"
