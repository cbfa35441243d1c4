"""Fixtures of the deploy/ tests: every kustomization rendered once per session, the components
rendered on a Deployment that is not ours, and Prometheus for the KEDA query (tests/alerts/alerttools.py
says when a missing Prometheus skips and when it fails)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "alerts"))
from alerttools import require_tool  # noqa: E402
from deploytools import COMPONENTS, DEPLOY, KUSTOMIZATIONS, NETWORK_POLICY, Obj, kustomize  # noqa: E402

#: A vLLM Deployment written by someone else: its own labels, an init container of its own, the
#: model on a volume named "model" at another path, and no volumes or init containers named like ours.
THEIR_DEPLOYMENT: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "vllm", "labels": {"team": "inference"}},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "chat"}},
        "template": {
            "metadata": {"labels": {"app": "chat"}},
            "spec": {
                "initContainers": [
                    {"name": "warm-cache", "image": "busybox:1.36", "command": ["true"]},
                ],
                "containers": [
                    {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.32.0",
                        "command": ["vllm", "serve"],
                        "args": ["/weights/llama-3.1-8b", "--gpu-memory-utilization=0.92"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "volumeMounts": [{"name": "model", "mountPath": "/weights", "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "weights"}}],
            },
        },
    },
}


def their_workload(kind: str) -> Obj:
    """THEIR_DEPLOYMENT, or the same pod template in a StatefulSet of theirs."""
    if kind == "Deployment":
        return THEIR_DEPLOYMENT
    spec = {k: v for k, v in THEIR_DEPLOYMENT["spec"].items()}
    return {**THEIR_DEPLOYMENT, "kind": kind, "spec": {**spec, "serviceName": "vllm"}}


def _on_their_workload(root, kind: str, components: list[str]) -> list[Obj]:
    (root / "workload.yaml").write_text(yaml.safe_dump(their_workload(kind)), encoding="utf-8")
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {"resources": ["workload.yaml"], "components": [os.path.relpath(DEPLOY / c, root) for c in components]}
        ),
        encoding="utf-8",
    )
    return kustomize(root)


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    """deploy/ path -> its rendered objects: every kustomization, each component on a workload of theirs."""
    out = {path: kustomize(DEPLOY / path) for path in KUSTOMIZATIONS}
    for path in COMPONENTS:
        kind = "StatefulSet" if path.endswith("statefulset") else "Deployment"
        out[path] = _on_their_workload(tmp_path_factory.mktemp(path.replace("/", "-")), kind, [path])
    root = tmp_path_factory.mktemp("network-policy")
    out[NETWORK_POLICY] = _on_their_workload(root, "Deployment", [COMPONENTS[0], NETWORK_POLICY])
    return out


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return require_tool("prometheus")
