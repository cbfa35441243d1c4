"""deploy/components/process-discovery: shareProcessNamespace on the pod template, nothing else.

Rendered with ``kubectl kustomize`` next to the sidecar's components on a vLLM workload that is not ours
(tests/deploy/conftest.py), a Deployment and a StatefulSet, and checked offline by kubernetes-validate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import _on_their_workload
from deploytools import COMPONENTS, DEPLOY, kubernetes_versions, pod_spec

PROCESS_DISCOVERY = "components/process-discovery"


@pytest.mark.parametrize("sidecar", COMPONENTS)
def test_the_component_shares_the_pid_namespace_and_changes_nothing_else(tmp_path, sidecar):
    kind = "StatefulSet" if sidecar.endswith("statefulset") else "Deployment"
    (tmp_path / "plain").mkdir()
    (tmp_path / "shared").mkdir()
    plain = _on_their_workload(tmp_path / "plain", kind, [sidecar])
    shared = _on_their_workload(tmp_path / "shared", kind, [sidecar, PROCESS_DISCOVERY])
    [workload] = [o for o in shared if o["kind"] == kind]
    assert pod_spec(workload)["shareProcessNamespace"] is True
    del pod_spec(workload)["shareProcessNamespace"]
    assert shared == plain  # the sidecar, its ConfigMap and their workload as without the component


@pytest.mark.parametrize("version", kubernetes_versions())
def test_the_rendering_is_valid_kubernetes(tmp_path, version):
    objs = _on_their_workload(tmp_path, "Deployment", [COMPONENTS[0], PROCESS_DISCOVERY])
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(objs), encoding="utf-8")
    validator = Path(sys.executable).with_name("kubernetes-validate")
    res = subprocess.run(
        [str(validator), "--strict", "-k", version, str(rendered)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_component_is_opt_in():
    """No kustomization of deploy/ turns it on by itself: a shared PID namespace is the user's choice."""
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        if kfile.parent.name != "process-discovery":
            assert "process-discovery" not in kfile.read_text(encoding="utf-8"), kfile
