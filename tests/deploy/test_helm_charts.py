"""The sidecar in the Deployments of two Helm charts that run vLLM (docs/kubernetes.md, "Other ways vLLM runs"):
vLLM production-stack's ``vllm-stack`` and llm-d's ``llm-d-modelservice``.

Each test runs the ``sh`` block docs/kubernetes.md gives the user, as written there, with four stated
substitutions: ``path/to/deploy`` is this repository's deploy/, the chart is the copy of its files in
tests/fixtures/charts/ (provenance in its README) instead of the Helm repository, the ``helm repo add`` line
is dropped (no network) and ``kubectl apply -k .`` is ``kubectl kustomize .``. So what the docs say is what
is tested: the user's ``helm template`` with our example values (deploy/examples/production-stack/,
deploy/examples/llm-d/), then our component as a post-render patch. On the result: the sidecar is in each vLLM
Deployment and changes nothing else, reads vLLM's real port (``--port`` of vLLM's command: 8000, or 8200 behind
llm-d's routing proxy), mounts the volume vLLM's ``HF_HOME`` is on (the served model's config.json is found
there as vLLM's download leaves it), asks for no GPU, runs non-root on a read-only root, and its ConfigMap
passes ``kv-sidecar check-config``; every object is valid for the Kubernetes versions the deployment claims.

helm is the binary ``scripts/install-helm.sh`` puts in ``.tools/bin`` (``make tools``), or one on PATH.
Missing helm skips these tests loudly, and fails them under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from deploytools import (
    DEPLOY,
    REPO,
    Obj,
    builtin_errors,
    container,
    crd_errors,
    is_custom,
    kubectl,
    kubernetes_versions,
    pod_spec,
    restricted_container_problems,
)
from processes import kv_sidecar

from sidecar.artifacts.kubernetes import CONTAINER_NAME, POD_LABEL
from sidecar.model_discovery import LOADED, locate, repo_folder

CHARTS = REPO / "tests" / "fixtures" / "charts"
DOCS = REPO / "docs" / "kubernetes.md"
TOOLS_HELM = REPO / ".tools" / "bin" / "helm"
INSTALL_HELM = REPO / "scripts" / "install-helm.sh"
BUNDLED_MODEL = REPO / "sidecar" / "data" / "llama-3.1-8b.config.json"
RENDERED = "rendered.yaml"


@dataclass(frozen=True)
class Chart:
    """A chart as docs/kubernetes.md uses it."""

    key: str
    bullet: str  # the start of its bullet in docs/kubernetes.md
    fixture: str  # its folder in tests/fixtures/charts/
    reference: str  # the chart as the docs name it (Helm repository/chart)
    version: str
    repo_add: str  # the docs' `helm repo add` line
    workdir: str  # the folder the docs' commands make and work in
    helm_output: str  # the file `helm template` writes
    #: Deployment -> vLLM's port in its pods (where the sidecar must read /metrics).
    sidecars: dict[str, int] = field(default_factory=dict)


CHART_LIST = (
    Chart(
        key="production-stack",
        bullet="- **vLLM production-stack**",
        fixture="vllm-stack",
        reference="vllm/vllm-stack",
        version="0.1.12",
        repo_add="helm repo add vllm https://vllm-project.github.io/production-stack",
        workdir="my-stack",
        helm_output="stack.yaml",
        sidecars={"vllm-llama3-deployment-vllm": 8000},
    ),
    Chart(
        key="llm-d",
        bullet="- **llm-d**",
        fixture="llm-d-modelservice",
        reference="llm-d-modelservice/llm-d-modelservice",
        version="v0.4.12",
        repo_add="helm repo add llm-d-modelservice https://llm-d-incubation.github.io/llm-d-modelservice/",
        workdir="my-llm-d",
        helm_output="ms.yaml",
        # The routing proxy takes 8000 in the decode pods and forwards to vLLM on routing.proxy.targetPort.
        sidecars={"ms-llm-d-modelservice-decode": 8200, "ms-llm-d-modelservice-prefill": 8000},
    ),
)
CHARTS_BY_KEY = {c.key: c for c in CHART_LIST}
SIDECARS = [(c.key, name) for c in CHART_LIST for name in c.sidecars]


# ----------------------------------------------------------------------------- helm and the docs' commands


def helm() -> str:
    """The pinned helm of ``make tools`` (.tools/bin), else one on PATH; CI=true fails without either."""
    if TOOLS_HELM.is_file() and os.access(TOOLS_HELM, os.X_OK):
        return str(TOOLS_HELM)
    found = shutil.which("helm")
    if found:
        return found
    reason = f"helm is not in {TOOLS_HELM.parent} nor on PATH; run `bash scripts/install-helm.sh` (or `make tools`)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(f"HELM MISSING, THE HELM CHART TESTS ARE SKIPPED: {reason}")


def docs_block(chart: Chart) -> str:
    """The first ``sh`` block of the chart's bullet in docs/kubernetes.md, unindented."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("\n" + chart.bullet) + 1
    match = re.compile(r"^( *)```sh\n(.*?)^\1```$", re.M | re.S).search(text, start)
    assert match, f"no sh block after {chart.bullet!r} in {DOCS}"
    next_bullet = re.compile(r"^- \*\*", re.M).search(text, start + 1)
    assert next_bullet is None or match.start() < next_bullet.start(), f"the sh block is not in {chart.bullet!r}"
    indent = len(match.group(1))
    return "".join(line[indent:] for line in match.group(2).splitlines(keepends=True))


def _replace_once(script: str, old: str, new: str) -> str:
    assert script.count(old) == 1, f"{old!r} occurs {script.count(old)} times in the docs' commands, expected once"
    return script.replace(old, new)


def as_run(chart: Chart, block: str) -> str:
    """The docs' commands with the stated substitutions, each of which must apply."""
    assert "path/to/deploy/" in block
    script = block.replace("path/to/deploy/", f"{DEPLOY}/")
    script = _replace_once(script, chart.repo_add + "\n", "")
    helm_ref = f" {chart.reference} --version {chart.version} "
    script = _replace_once(script, helm_ref, f" {CHARTS / chart.fixture} --version {chart.version} ")
    return _replace_once(script, "kubectl apply -k .\n", f"kubectl kustomize . > {RENDERED}\n")


@dataclass(frozen=True)
class Rendering:
    chart: Chart
    helm_objects: list[Obj]  # what `helm template` wrote
    objects: list[Obj]  # what `kubectl kustomize` made of it with the sidecar


def _load(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


@pytest.fixture(scope="module")
def renderings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendering]:
    helm_bin = helm()
    out = {}
    for chart in CHART_LIST:
        root = tmp_path_factory.mktemp(chart.key)
        env = {
            **os.environ,
            "PATH": os.pathsep.join([str(Path(helm_bin).parent), str(Path(kubectl()).parent), os.environ["PATH"]]),
            # helm's own files (repositories, cache) in the test's folder, never the user's
            **{f"HELM_{k}_HOME": str(root / f"helm-{k.lower()}") for k in ("CACHE", "CONFIG", "DATA")},
        }
        script = as_run(chart, docs_block(chart))
        res = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, f"the docs' commands for {chart.key} failed:\n{script}\n{res.stderr}"
        work = root / chart.workdir
        out[chart.key] = Rendering(chart, _load(work / chart.helm_output), _load(work / RENDERED))
    return out


def _deployment(objs: list[Obj], name: str) -> Obj:
    found = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} Deployments {name}"
    return found[0]


def _sidecar(r: Rendering, name: str) -> Obj:
    return container(pod_spec(_deployment(r.objects, name)), CONTAINER_NAME)


def _config(r: Rendering, name: str) -> tuple[Obj, dict]:
    """The sidecar's ConfigMap (through the pod's volume) and the config file it reads."""
    sidecar = _sidecar(r, name)
    config_file = Path(sidecar["args"][sidecar["args"].index("--config.file") + 1])
    mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == str(config_file.parent))
    volume = next(v for v in pod_spec(_deployment(r.objects, name))["volumes"] if v["name"] == mount["name"])
    cms = [o for o in r.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
    assert len(cms) == 1, f"{name}: {len(cms)} ConfigMaps {volume['configMap']['name']}"
    return cms[0], yaml.safe_load(cms[0]["data"][config_file.name])


def _vllm_argv(r: Rendering, name: str) -> list[str]:
    vllm = container(pod_spec(_deployment(r.objects, name)), "vllm")
    return [str(a) for a in vllm.get("command", []) + vllm.get("args", [])]


def _flag(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag:
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


# ----------------------------------------------------------------------------- the tests


def test_the_vendored_charts_are_the_versions_the_docs_name():
    for chart in CHART_LIST:
        meta = yaml.safe_load((CHARTS / chart.fixture / "Chart.yaml").read_text(encoding="utf-8"))
        assert str(meta["version"]) == chart.version, chart.fixture
        assert (CHARTS / chart.fixture / "LICENSE").is_file()
        assert f"--version {chart.version} " in docs_block(chart)


def test_the_placeholder_subcharts_are_disabled_and_render_nothing():
    """vllm-stack's two dependencies are placeholders (a Chart.yaml, no templates): their conditions are off
    in the chart's values and in our example, so the real subcharts would render nothing either."""
    chart_dir = CHARTS / "vllm-stack"
    values = yaml.safe_load((chart_dir / "values.yaml").read_text(encoding="utf-8"))
    example = yaml.safe_load((DEPLOY / "examples" / "production-stack" / "values.yaml").read_text(encoding="utf-8"))
    deps = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))["dependencies"]
    assert {d["name"] for d in deps} == {p.name for p in (chart_dir / "charts").iterdir()}
    for dep in deps:
        assert dep["condition"] == f"{dep['name']}.enabled"
        assert values[dep["name"]]["enabled"] is False and dep["name"] not in example
        assert [p.name for p in (chart_dir / "charts" / dep["name"]).iterdir()] == ["Chart.yaml"]


def test_the_pinned_helm_is_the_one_install_helm_installs():
    path = helm()
    if Path(path) != TOOLS_HELM:
        pytest.skip(f"helm from PATH ({path}), not the pinned one of scripts/install-helm.sh")
    pinned = re.search(r"^HELM_VERSION=(\S+)$", INSTALL_HELM.read_text(encoding="utf-8"), re.M)
    assert pinned
    out = subprocess.run([path, "version", "--short"], capture_output=True, text=True, timeout=30).stdout
    assert out.startswith(f"v{pinned.group(1)}+"), out


@pytest.mark.parametrize("key", CHARTS_BY_KEY)
def test_the_patch_adds_the_sidecar_and_its_config_maps_and_changes_nothing_else(renderings, key):
    r = renderings[key]
    before = {_key(o): o for o in r.helm_objects}
    after = {_key(o): o for o in r.objects}
    added = set(after) - set(before)
    assert set(before) <= set(after)
    assert added == {("ConfigMap", f"kv-cache-sidecar-{name}") for name in r.chart.sidecars}
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("Deployment", name) for name in r.chart.sidecars}
    for name in r.chart.sidecars:
        spec = pod_spec(_deployment(r.objects, name))
        assert [c["name"] for c in spec["containers"]].count(CONTAINER_NAME) == 1
        assert container(spec, "vllm") == container(pod_spec(before[("Deployment", name)]), "vllm")
        template = _deployment(r.objects, name)["spec"]["template"]["metadata"]
        assert template["labels"][POD_LABEL] == "true"
        assert template["annotations"]["kubectl.kubernetes.io/default-container"] == "vllm"
    others = [o for o in r.objects if o["kind"] == "Deployment" and o["metadata"]["name"] not in r.chart.sidecars]
    assert all(CONTAINER_NAME not in [c["name"] for c in pod_spec(o)["containers"]] for o in others)


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_sidecar_reads_vllms_real_port(renderings, key, name):
    r = renderings[key]
    _, config = _config(r, name)
    [target] = config["targets"]
    url = urlsplit(target["url"])
    assert (url.hostname, url.path) == ("127.0.0.1", "/metrics")
    argv = _vllm_argv(r, name)
    assert argv[:2] == ["vllm", "serve"], argv
    port = _flag(argv, "--port")
    assert url.port == int(port or 0) == r.chart.sidecars[name]
    vllm = container(pod_spec(_deployment(r.objects, name)), "vllm")
    assert url.port in {p["containerPort"] for p in vllm["ports"]}
    proxies = [
        c for c in pod_spec(_deployment(r.objects, name)).get("initContainers", []) if c["name"] == "routing-proxy"
    ]
    if r.chart.sidecars[name] == 8200:  # behind llm-d's routing proxy, which listens on 8000
        [proxy] = proxies
        assert _flag(proxy["args"], "--vllm-port") == str(url.port) and _flag(proxy["args"], "--port") == "8000"
    else:
        assert proxies == []


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_sidecar_finds_the_served_model_where_vllm_downloads_it(renderings, key, name, tmp_path):
    """Each volume of the pod is a folder; the served model is put in vLLM's HF_HOME as vLLM's download
    leaves it (Hugging Face's hub cache); the sidecar, reading model.config through its own mount, finds it."""
    r = renderings[key]
    spec = pod_spec(_deployment(r.objects, name))
    vllm, sidecar = container(spec, "vllm"), _sidecar(r, name)
    volumes = {v["name"] for v in spec["volumes"]}
    hf_home = next(e["value"] for e in vllm["env"] if e["name"] == "HF_HOME")
    vllm_mount = next(m for m in vllm["volumeMounts"] if Path(hf_home).is_relative_to(m["mountPath"]))
    argv = _vllm_argv(r, name)
    served = _flag(argv, "--served-model-name") or argv[2]
    snapshot = tmp_path / vllm_mount["name"] / Path(hf_home).relative_to(vllm_mount["mountPath"]) / "hub"
    snapshot = snapshot / repo_folder(argv[2]) / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    shutil.copy(BUNDLED_MODEL, snapshot / "config.json")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd", encoding="ascii")

    _, config = _config(r, name)
    model = config["model"]["config"]
    mount = next(m for m in sidecar["volumeMounts"] if Path(model).is_relative_to(m["mountPath"]))
    assert mount["name"] in volumes and mount.get("readOnly") is True
    seen = tmp_path / mount["name"] / Path(model).relative_to(mount["mountPath"])
    found = locate(str(seen), served)
    assert found.reason == LOADED and found.path == str(snapshot / "config.json"), found


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_sidecar_asks_for_no_gpu(renderings, key, name):
    resources = _sidecar(renderings[key], name)["resources"]
    asked = {k for part in ("requests", "limits", "claims") for k in resources.get(part, {})}
    assert asked <= {"cpu", "memory"}, asked  # no nvidia.com/gpu, no other accelerator
    # the vLLM container of the same pod does ask for the GPUs: the chart's own, untouched
    vllm = container(pod_spec(_deployment(renderings[key].objects, name)), "vllm")
    assert any("gpu" in k for k in vllm["resources"].get("limits", {})), vllm["resources"]


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_sidecar_runs_non_root_on_a_read_only_root(renderings, key, name):
    sidecar = _sidecar(renderings[key], name)
    assert restricted_container_problems(sidecar) == []
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_config_map_passes_check_config(renderings, key, name, tmp_path):
    cm, config = _config(renderings[key], name)
    assert cm["metadata"]["name"] == f"kv-cache-sidecar-{name}"
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"], encoding="utf-8")
    res = subprocess.run([*kv_sidecar(), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{path}: ok (1 target)" in res.stdout
    # the model volume is not here: valid as it stands, the model waited for as `run` does
    assert f"note: model.config: {config['model']['config']}" in res.stdout, res.stdout


@pytest.mark.parametrize(("key", "name"), SIDECARS)
def test_the_config_map_has_vllms_tensor_parallel_size(renderings, key, name):
    """vllm-stack passes ``--tensor-parallel-size`` (vllmConfig.tensorParallelSize); llm-d's chart sets
    ``TP_SIZE`` to parallelism.tensor, and passes the flag only above 1 (``vllmServeModelCommand`` in its
    templates/_helpers.tpl)."""
    r = renderings[key]
    vllm = container(pod_spec(_deployment(r.objects, name)), "vllm")
    env = {e["name"]: e.get("value") for e in vllm.get("env", [])}
    tp = _flag(_vllm_argv(r, name), "--tensor-parallel-size") or env.get("TP_SIZE")
    assert tp is not None, f"{name}: no tensor-parallel size in vLLM's command or env"
    assert _config(r, name)[1]["model"]["tensor_parallel_size"] == int(tp)


@pytest.mark.parametrize("key", CHARTS_BY_KEY)
@pytest.mark.parametrize("version", kubernetes_versions())
def test_every_rendered_object_is_valid(renderings, key, version):
    """Strict validation, as tests/deploy/test_deploy_render.py does for deploy/: the chart's objects and ours."""
    for o in renderings[key].objects:
        errors = crd_errors(o) if is_custom(o) else builtin_errors(o, version)
        assert errors == [], f"{key}: {o['kind']} {o['metadata']['name']}"


def test_a_container_in_llm_ds_decode_containers_would_get_the_gpus(tmp_path):
    """Why docs/kubernetes.md patches llm-d's Deployment instead of listing the sidecar in
    ``decode.containers``: the chart gives every container listed there the accelerators of
    ``decode.parallelism`` when it does not name them itself."""
    values = yaml.safe_load((DEPLOY / "examples" / "llm-d" / "values.yaml").read_text(encoding="utf-8"))
    sidecar = yaml.safe_load((DEPLOY / "components" / "kv-cache-sidecar" / "sidecar.yaml").read_text(encoding="utf-8"))
    ours = pod_spec(sidecar)["containers"][0]
    # the chart requires a command of a container without modelCommand: the image's entrypoint
    values["decode"]["containers"].append({**ours, "command": ["kv-sidecar"]})
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
    res = subprocess.run(
        [helm(), "template", "ms", str(CHARTS / "llm-d-modelservice"), "-f", str(tmp_path / "values.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **{f"HELM_{k}_HOME": str(tmp_path / k) for k in ("CACHE", "CONFIG", "DATA")}},
    )
    assert res.returncode == 0, res.stderr
    decode = next(d for d in yaml.safe_load_all(res.stdout) if d and d["metadata"]["name"].endswith("-decode"))
    listed = container(pod_spec(decode), CONTAINER_NAME)
    assert ours["resources"] == {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}
    assert listed["resources"]["limits"].get("nvidia.com/gpu") == "1", listed["resources"]
