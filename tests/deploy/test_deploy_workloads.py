"""The other ways vLLM runs (docs/kubernetes.md, "Other ways vLLM runs"), rendered and validated offline.

LeaderWorkerSet (multi-node vLLM, kubernetes-sigs/lws): ``examples/leaderworkerset/`` adds the sidecar to
the leader pod only, whose vLLM serves the API and ``/metrics`` for the whole group (vLLM's docs,
deployment/frameworks/lws.md); the workers run Ray workers and stay as they are. The rendered
LeaderWorkerSet validates against its CRD's published schema (deploy/schemas/, test_deploy_render.py).

KServe: ``examples/kserve/`` adds the sidecar to an InferenceService's predictor, beside the huggingface
runtime's model server (``model``), reading vLLM's ``/metrics`` on the model server's port; validated against
the InferenceService CRD's schema.
"""

from __future__ import annotations

import copy
import re
import subprocess

import yaml
from deploytools import config_map, crd_errors, one, rerooted, sidecar_of
from processes import kv_sidecar

from sidecar.artifacts.deploy import LWS_EXAMPLE
from sidecar.artifacts.kubernetes import CONFIG_VOLUME, CONTAINER_NAME, KSERVE_PORT, POD_LABEL, config_map_name

LWS = "examples/leaderworkerset"


def _templates(rendered) -> tuple[dict, dict, dict]:
    lws = one(rendered[LWS], "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    return lws, template["leaderTemplate"], template["workerTemplate"]


def _names(template: dict) -> list[str]:
    return [c["name"] for c in template["spec"]["containers"]]


def test_the_leader_pod_has_the_sidecar_and_the_workers_do_not(rendered):
    _, leader, worker = _templates(rendered)
    # The same container as the Deployment component's, after vLLM's (kubectl logs/exec still pick vLLM).
    assert _names(leader) == ["vllm", CONTAINER_NAME]
    assert leader["spec"]["containers"][1] == sidecar_of(rendered, "components/kv-cache-sidecar")
    assert leader["metadata"]["labels"][POD_LABEL] == "true"
    assert leader["metadata"]["labels"]["role"] == "leader"  # the leader's own labels are kept
    assert {v["name"] for v in leader["spec"]["volumes"]} == {"model", "dshm", CONFIG_VOLUME}
    # The workers: untouched, not selected by the PodMonitor (POD_LABEL), no ConfigMap mounted.
    assert _names(worker) == ["vllm-worker"]
    assert POD_LABEL not in (worker.get("metadata") or {}).get("labels", {})
    assert CONFIG_VOLUME not in {v["name"] for v in worker["spec"]["volumes"]}


def test_the_podmonitor_selects_the_leader_on_ports_it_has(rendered):
    _, leader, _ = _templates(rendered)
    pm = one(rendered["overlays/prod"], "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= leader["metadata"]["labels"].items()
    sidecar_endpoint, vllm_endpoint = pm["spec"]["podMetricsEndpoints"]
    ports = {p["containerPort"]: p["name"] for c in leader["spec"]["containers"] for p in c.get("ports", [])}
    assert sidecar_endpoint["port"] in ports.values() and vllm_endpoint["portNumber"] in ports


def test_the_leaders_config_map_is_its_own_with_its_parallelism(rendered, tmp_path):
    lws, leader, _ = _templates(rendered)
    assert lws["metadata"]["name"] == LWS_EXAMPLE[0]
    (volume,) = [v for v in leader["spec"]["volumes"] if v["name"] == CONFIG_VOLUME]
    assert volume["configMap"]["name"] == config_map_name(lws["metadata"]["name"])
    config = config_map(rendered, LWS, volume["configMap"]["name"])["data"]["config.yaml"]
    model = yaml.safe_load(config)["model"]
    command = " ".join(leader["spec"]["containers"][0]["args"])
    assert model["tensor_parallel_size"] == int(re.search(r"--tensor-parallel-size (\d+)", command)[1])
    assert model["pipeline_parallel_size"] == int(re.search(r"--pipeline-parallel-size (\d+)", command)[1])
    # The model the sidecar mounts is the volume vLLM serves from.
    (mount,) = [m for m in leader["spec"]["containers"][1]["volumeMounts"] if m["name"] != CONFIG_VOLUME]
    assert mount["name"] in {m["name"] for m in leader["spec"]["containers"][0]["volumeMounts"]}
    assert model["config"] == mount["mountPath"]
    in_pod = tmp_path / "config.yaml"
    in_pod.write_text(rerooted(config, tmp_path / "pod"), encoding="utf-8")
    res = subprocess.run([*kv_sidecar(), "check-config", str(in_pod)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_the_leaderworkerset_schema_rejects_what_the_api_server_would(rendered):
    lws, _, _ = _templates(rendered)
    assert crd_errors(lws) == []
    misspelt = copy.deepcopy(lws)
    misspelt["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][1]["volumeMount"] = []
    assert any("volumeMount" in e for e in crd_errors(misspelt))
    wrong_type = copy.deepcopy(lws)
    wrong_type["spec"]["leaderWorkerTemplate"]["size"] = "2"
    assert crd_errors(wrong_type)


# ----------------------------------------------------------------------------- KServe

KSERVE = "examples/kserve"


def _predictor(rendered) -> tuple[dict, dict]:
    isvc = one(rendered[KSERVE], "InferenceService")
    return isvc, isvc["spec"]["predictor"]


def test_the_predictor_runs_the_sidecar_beside_the_model_server(rendered):
    isvc, predictor = _predictor(rendered)
    # KServe runs `model` as kserve-container and every other predictor container beside it
    # (PredictorSpec.GetImplementations in pkg/apis/serving/v1beta1/predictor.go).
    assert predictor["model"]["modelFormat"]["name"] == "huggingface"
    assert [c["name"] for c in predictor["containers"]] == [CONTAINER_NAME]
    assert predictor["containers"][0] == sidecar_of(rendered, "components/kv-cache-sidecar")
    assert predictor["labels"][POD_LABEL] == "true" and predictor["labels"]["app.kubernetes.io/name"]
    # Knative (Serverless mode) allows a port on one container only: the example runs in Standard mode.
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    (mount,) = [m for m in predictor["containers"][0]["volumeMounts"] if m["name"] != CONFIG_VOLUME]
    assert mount["name"] in {m["name"] for m in predictor["model"]["volumeMounts"]}
    assert mount["name"] in {v["name"] for v in predictor["volumes"]}


def test_the_predictors_config_map_reads_the_model_servers_port(rendered, tmp_path):
    isvc, predictor = _predictor(rendered)
    (volume,) = [v for v in predictor["volumes"] if v["name"] == CONFIG_VOLUME]
    assert volume["configMap"]["name"] == config_map_name(isvc["metadata"]["name"])
    config = config_map(rendered, KSERVE, volume["configMap"]["name"])["data"]["config.yaml"]
    assert yaml.safe_load(config)["targets"] == [{"url": f"http://127.0.0.1:{KSERVE_PORT}/metrics"}]
    in_pod = tmp_path / "config.yaml"
    in_pod.write_text(rerooted(config, tmp_path / "pod"), encoding="utf-8")
    res = subprocess.run([*kv_sidecar(), "check-config", str(in_pod)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_the_inferenceservice_schema_rejects_what_the_api_server_would(rendered):
    isvc, _ = _predictor(rendered)
    assert crd_errors(isvc) == []
    misspelt = copy.deepcopy(isvc)
    misspelt["spec"]["predictor"]["containers"][0]["securityContex"] = {}
    assert any("securityContex" in e for e in crd_errors(misspelt))
