"""The generated files of ``deploy/`` (kustomize, rendered by ``kubectl kustomize``).

What is generated, so that it cannot drift from the package (``make generate`` writes it,
``tests/test_artifacts.py`` keeps it equal, ``tests/deploy/`` renders and validates the whole tree):

- ``components/<name>/`` from :data:`COMPONENTS`: the patch that adds the sidecar to a vLLM workload
  (:func:`sidecar.artifacts.kubernetes.sidecar_patch`, the image tagged with the package version) and
  that workload's own ConfigMap (:func:`sidecar_config_text`: vLLM on ``127.0.0.1:8000``, the volume
  holding the model, the thresholds); ``components/network-policy/``'s opt-in NetworkPolicy;
- ``examples/two-deployments/``: two vLLM Deployments in one namespace, each with its sidecar and its
  ConfigMap; ``examples/leaderworkerset/`` and ``examples/kserve/``: the JSON patch of the leader or predictor pod,
  its ConfigMap and kustomization;
- ``base/prometheusrule.yaml`` (``kv-sidecar rules render --format prometheusrule``) and
  ``base/report.yaml`` (the weekly report's CronJob and its ConfigMap);
- ``overlays/<name>/kustomization.yaml`` from :data:`OVERLAYS` (namespace, the kube-prometheus-stack
  ``release`` label, the image tag), its ``prometheusrule.yaml`` (the rules of its namespace only, with
  its thresholds) and, for an overlay whose thresholds are not the defaults, its ``thresholds/``
  patches: the sidecar's and the report's configuration and the dashboards, all rendered with the
  overlay's thresholds (the page, the headroom gauges, the report and the dashboards' bands read the
  same numbers).

The rest of ``deploy/`` is written by hand (the kustomizations of the base and the components, the
example vLLM Deployment in ``examples/vllm/``, the example LeaderWorkerSet and InferenceService, the
PodMonitor, the KEDA example). The base, which the
overlays apply, is the monitoring only: nothing in it runs vLLM or patches a workload. Pure: texts; the
dashboards need the ``dashboards`` extra, imported when their text is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import yaml

from .. import __version__
from ..alert_params import RuleParams
from ..settings import DEFAULT_TARGET, setting
from ..thresholds import Thresholds
from .files import dump_yaml
from .kubernetes import (
    CONFIG_DIR,
    CONFIG_KEY,
    EXAMPLE_MODEL_VOLUME,
    EXAMPLE_WORKLOAD,
    IMAGE_REPOSITORY,
    KSERVE_API_VERSION,
    KSERVE_PORT,
    LWS_API_VERSION,
    METRICS_PORT,
    MODEL_MOUNT,
    REPORT_IMAGE_REPOSITORY,
    config_map_name,
    leader_sidecar_patch,
    network_policy,
    predictor_sidecar_patch,
    report_config_map,
    report_cronjob,
    report_volume_claim,
    sidecar_config_map,
    sidecar_patch,
)
from .rules import render

DEPLOY = "deploy"
BASE = f"{DEPLOY}/base"


@dataclass(frozen=True)
class Component:
    """One ``components/<name>/``: the sidecar patch for one kind of workload, plain or native."""

    name: str
    kind: str
    native: bool
    about: str

    @property
    def path(self) -> str:
        return f"{DEPLOY}/components/{self.name}"


#: The sidecar's components. The default is a plain container of a Deployment (docs/kubernetes.md, "Never
#: gate vLLM", says why not a native sidecar); StatefulSets (and a LeaderWorkerSet's leader template, through
#: the patch in docs/kubernetes.md) take the same container.
COMPONENTS = (
    Component("kv-cache-sidecar", "Deployment", False, "as a plain second container of a vLLM Deployment"),
    Component("statefulset", "StatefulSet", False, "as a plain second container of a vLLM StatefulSet"),
    Component(
        "native-sidecar",
        "Deployment",
        True,
        "as a native sidecar of a vLLM Deployment (Kubernetes 1.29+; opt-in: vLLM waits for its image)",
    ),
)
NETWORK_POLICY = f"{DEPLOY}/components/network-policy/networkpolicy.yaml"
TWO_DEPLOYMENTS = f"{DEPLOY}/examples/two-deployments"
#: The two Deployments of examples/two-deployments: name -> (model directory, tensor-parallel size).
TWO = {"vllm-chat": 1, "vllm-code": 2}
LEADER_WORKER_SET = f"{DEPLOY}/examples/leaderworkerset"
#: The example LeaderWorkerSet (vLLM's docs, deployment/frameworks/lws.md): name, tensor- and pipeline-parallel size.
LWS_EXAMPLE = ("vllm-multinode", 8, 2)
KSERVE = f"{DEPLOY}/examples/kserve"
#: The example InferenceService's name; its model server answers on KSERVE_PORT.
KSERVE_EXAMPLE = "llama-3-1-8b"
#: The Prometheus of kube-prometheus-stack (and of any prometheus-operator install): the operator's
#: governing Service ``prometheus-operated``, whatever the Helm release is called.
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
#: The kube-prometheus-stack Helm release the overlays label for (``helm install kube-prometheus-stack
#: prometheus-community/kube-prometheus-stack``); its Prometheus selects PodMonitors and PrometheusRules
#: by ``release: <name>`` by default.
RELEASE = "kube-prometheus-stack"

_HEADER = "# Generated by `make generate` (sidecar/artifacts/deploy.py); do not edit by hand.\n"


@dataclass(frozen=True)
class Overlay:
    """One ``overlays/<name>/``: where it deploys, which Prometheus selects it, its thresholds."""

    name: str
    namespace: str
    about: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    release: str = RELEASE
    tag: str = __version__

    @property
    def path(self) -> str:
        return f"{DEPLOY}/overlays/{self.name}"

    @property
    def own_thresholds(self) -> bool:
        return self.thresholds != Thresholds()


#: The overlays of ``deploy/overlays/``. Production pages earlier than the defaults (when the peaks keep
#: reaching 85 % instead of 90 %): a page there has users behind it, and the on-call engineer gets more lead time.
OVERLAYS = (
    Overlay("dev", "llm-dev", "a development cluster: the default thresholds"),
    Overlay(
        "prod",
        "llm-prod",
        "production: pages at 85 % KV usage, tickets at 75 %, advice sized for 70 %",
        Thresholds(watermark=0.85, warning=0.75, target_usage=0.7),
    ),
)


# ----------------------------------------------------------------------------- configuration files


def _scalar(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


def _line(indent: str, key: str, value: Any, comment: str) -> str:
    entry = f"{indent}{key}: {_scalar(value)}"
    return f"{entry:<40} # {comment}"


def _thresholds_lines(th: Thresholds) -> list[str]:
    return [
        "thresholds:",
        *(
            _line("  ", k, getattr(th, k), setting(f"thresholds.{k}").help)
            for k in ("watermark", "warning", "target_usage")
        ),
    ]


def sidecar_config_text(th: Thresholds, tp: int = 1, pp: int = 1, target: str = DEFAULT_TARGET) -> str:
    """The configuration of the sidecar in each vLLM pod; every other setting keeps its default."""
    return "\n".join(
        [
            f"# kv-cache-sidecar in a vLLM pod: the file `kv-sidecar run --config.file {CONFIG_DIR}/{CONFIG_KEY}`",
            "# reads. Every setting not here keeps its default (deploy/examples/sidecar.yaml lists them all);",
            "# check a change with `kv-sidecar check-config FILE` before applying it.",
            "web:",
            _line("  ", "listen_address", f":{METRICS_PORT}", setting("web.listen_address").help),
            "targets:",
            f"{'  - url: ' + target:<40} # vLLM in the same pod (change the port if vLLM's --port is not 8000)",
            "model:",
            _line(
                "  ", "config", MODEL_MOUNT, "the volume holding the model (a model directory or HF_HOME), read-only"
            ),
            _line(
                "  ", "tensor_parallel_size", tp, "vLLM's --tensor-parallel-size (set it when vLLM shards the model)"
            ),
            _line("  ", "pipeline_parallel_size", pp, "vLLM's --pipeline-parallel-size"),
            *_thresholds_lines(th),
            "",
        ]
    )


def report_config_text(th: Thresholds) -> str:
    """The weekly report's configuration: the thresholds of the sidecars it reports on (no model: the
    report's pod does not mount it, and ``model.config`` must exist where it is read)."""
    return "\n".join(
        [
            "# `kv-sidecar report --config.file`: the thresholds of the sidecars it reports on (the same numbers",
            "# as theirs and the alert rules'); the forecast bounds keep their defaults.",
            *_thresholds_lines(th),
            "",
        ]
    )


# ----------------------------------------------------------------------------- the generated files


_PATCH_NOTE = """\
# The patch that adds kv-cache-sidecar to a vLLM {kind} {how}.
# Generated by `make generate` (sidecar/artifacts/kubernetes.py); in this repository change the generator.
# In your copy, edit the values marked (1), (2), (3):
#   (1) your vLLM {kind}'s name (metadata.name), and the ConfigMap named after it (configmap.yaml too);
#   (2) the volume of your pod that holds the model vLLM serves (a model directory, or HF_HOME for
#       `vllm serve org/name`: the sidecar finds the served model in the Hugging Face cache);
{third}"""

_THIRD_PLAIN = "#   (3) your vLLM container's name, which `kubectl logs`/`exec` then pick without -c.\n"
_THIRD_NATIVE = "#   (3) nothing else: a native sidecar is not what `kubectl logs`/`exec` pick.\n"


def _mark(text: str, marks: dict[str, str]) -> str:
    """Append ``# <mark>`` to the one line of ``text`` that reads each key (a ValueError otherwise)."""
    lines = text.splitlines()
    for needle, mark in marks.items():
        hits = [i for i, line in enumerate(lines) if line.strip() == needle]
        if len(hits) != 1:
            raise ValueError(f"{needle!r} is on {len(hits)} lines of the patch, not one")
        lines[hits[0]] += f"  # {mark}"
    return "\n".join(lines) + "\n"


def sidecar_patch_text(component: Component, tag: str = __version__, workload: str = EXAMPLE_WORKLOAD) -> str:
    """A component's patch, with the values to edit marked."""
    patch = sidecar_patch(tag, native=component.native, kind=component.kind, workload=workload)
    pod = patch["spec"]["template"]["spec"]
    mount = (pod["initContainers"] if component.native else pod["containers"])[0]["volumeMounts"][1]
    marks = {
        f"name: {patch['metadata']['name']}": f"(1) your vLLM {component.kind}",
        f"name: {pod['volumes'][0]['configMap']['name']}": "(1) kv-cache-sidecar-<your workload>",
        f"- name: {mount['name']}": "(2) the volume holding the model",
    }
    if not component.native:
        default = patch["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"]
        marks[f"kubectl.kubernetes.io/default-container: {default}"] = "(3) your vLLM container"
    how = "as a native sidecar (Kubernetes 1.29+)" if component.native else "as a plain second container"
    note = _PATCH_NOTE.format(kind=component.kind, how=how, third=_THIRD_NATIVE if component.native else _THIRD_PLAIN)
    return note + _mark(dump_yaml(patch), marks)


def sidecar_config_map_text(
    th: Thresholds | None = None,
    workload: str = EXAMPLE_WORKLOAD,
    tp: int = 1,
    pp: int = 1,
    target: str = DEFAULT_TARGET,
) -> str:
    """The ConfigMap of ``workload``'s sidecars: ``kv-cache-sidecar-<workload>`` (rename it with the workload)."""
    text = sidecar_config_text(th or Thresholds(), tp, pp, target)
    return _HEADER + dump_yaml(sidecar_config_map(text, workload))


def network_policy_text() -> str:
    return _HEADER + dump_yaml(network_policy())


def two_deployments_text() -> str:
    """``examples/two-deployments/kustomization.yaml``: each Deployment its patch and its ConfigMap."""
    lines = [
        "# Two vLLM Deployments in one namespace, each with its sidecar and its own ConfigMap",
        "# (kv-cache-sidecar-<Deployment>: another model, another tensor-parallel size).",
        "# Generated by `make generate` (TWO in sidecar/artifacts/deploy.py); do not edit by hand.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        "  - deployments.yaml",
        *(f"  - configmap-{name}.yaml" for name in TWO),
        "patches:",
        *(f"  - path: sidecar-{name}.yaml" for name in TWO),
    ]
    return "\n".join(lines) + "\n"


_JSON_PATCH_NOTE = """\
# The JSON patch (RFC 6902) that adds kv-cache-sidecar to {where}.
# Generated by `make generate` (sidecar/artifacts/kubernetes.py); in this repository change the generator.
# In your copy, edit the values marked (1), (2), and the target's name in kustomization.yaml:
#   (1) the ConfigMap named after your {kind} (configmap.yaml too);
#   (2) the volume of {pod} that holds the model vLLM serves (a model directory, or HF_HOME).
# {requires} Without kustomize:
#   kubectl patch {resource} NAME --type json --patch-file sidecar.yaml
"""


def _json_patch_text(ops: list[dict[str, Any]], workload: str, **note: str) -> str:
    marks = {
        f"name: {config_map_name(workload)}": f"(1) kv-cache-sidecar-<your {note['kind']}>",
        f"- name: {EXAMPLE_MODEL_VOLUME}": "(2) the volume holding the model",
    }
    return _JSON_PATCH_NOTE.format(**note) + _mark(dump_yaml(ops), marks)


def leader_patch_text(tag: str = __version__) -> str:
    """``examples/leaderworkerset/sidecar.yaml``: the sidecar in the leader template, values to edit marked."""
    return _json_patch_text(
        leader_sidecar_patch(tag, workload=LWS_EXAMPLE[0]),
        LWS_EXAMPLE[0],
        where="the leader pod of a vLLM LeaderWorkerSet only:\n"
        "# the leader serves vLLM's API and /metrics for the group, the workers have none",
        kind="LeaderWorkerSet",
        pod="your leader pod",
        requires="The leader template must have metadata.labels and spec.volumes.",
        resource="leaderworkerset",
    )


def predictor_patch_text(tag: str = __version__) -> str:
    """``examples/kserve/sidecar.yaml``: the sidecar in a KServe InferenceService's predictor pod."""
    return _json_patch_text(
        predictor_sidecar_patch(tag, workload=KSERVE_EXAMPLE),
        KSERVE_EXAMPLE,
        where="the predictor pod of a KServe InferenceService\n"
        "# (serving.kserve.io/v1beta1) whose model server is `model:` (the huggingface runtime's vLLM)",
        kind="InferenceService",
        pod="your predictor",
        requires="The predictor must have labels and volumes, and no containers of its own.",
        resource="inferenceservice",
    )


def _custom_kustomization(intro: list[str], resource: str, api_version: str, kind: str, name: str) -> str:
    group, version = api_version.split("/")
    lines = [
        *intro,
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        f"  - {resource}",
        "  - configmap.yaml",
        "patches:",
        "  - path: sidecar.yaml",
        "    target:",
        f"      group: {group}",
        f"      version: {version}",
        f"      kind: {kind}",
        f"      name: {name}  # your {kind}",
    ]
    return "\n".join(lines) + "\n"


def leader_kustomization_text() -> str:
    """``examples/leaderworkerset/kustomization.yaml``: the example, its ConfigMap, the leader's patch."""
    intro = [
        "# An example multi-node vLLM LeaderWorkerSet (lws.yaml; needs the LeaderWorkerSet controller) with",
        "# kv-cache-sidecar in its leader pod and the leader's own ConfigMap. An example only: nothing the",
        "# README applies includes it. Generated by `make generate` (sidecar/artifacts/deploy.py).",
    ]
    return _custom_kustomization(intro, "lws.yaml", LWS_API_VERSION, "LeaderWorkerSet", LWS_EXAMPLE[0])


def kserve_kustomization_text() -> str:
    """``examples/kserve/kustomization.yaml``: the example, its ConfigMap, the predictor's patch."""
    intro = [
        "# An example KServe InferenceService (inferenceservice.yaml; needs KServe) with kv-cache-sidecar in its",
        "# predictor pod and its own ConfigMap. An example only: nothing the README applies includes it.",
        "# Generated by `make generate` (sidecar/artifacts/deploy.py).",
    ]
    return _custom_kustomization(intro, "inferenceservice.yaml", KSERVE_API_VERSION, "InferenceService", KSERVE_EXAMPLE)


def report_text(tag: str = __version__) -> str:
    """``base/report.yaml``: the report's ConfigMap, its volume and its CronJob."""
    docs = [
        report_config_map(report_config_text(Thresholds()), PROMETHEUS_URL),
        report_volume_claim(),
        report_cronjob(tag),
    ]
    return _HEADER + "---\n".join(dump_yaml(d) for d in docs)


def report_config_map_text(th: Thresholds) -> str:
    return _HEADER + dump_yaml(report_config_map(report_config_text(th), PROMETHEUS_URL))


def prometheus_rule_text(th: Thresholds | None = None, namespace: str | None = None) -> str:
    """What ``kv-sidecar rules render --format prometheusrule [--alerts.namespace NS]`` writes for these
    thresholds: with a namespace, every rule reads that namespace only, so that two overlays in one
    Prometheus never alert or record twice."""
    return render(th or Thresholds(), RuleParams(namespace=namespace), fmt="prometheusrule")


def dashboards_text(th: Thresholds) -> str:
    """The dashboards' ConfigMaps rendered with these thresholds (needs the ``dashboards`` extra)."""
    from .dashboards import DashboardParams, build_dashboards, render_dashboard_json
    from .provisioning import configmaps_yaml

    built = build_dashboards(DashboardParams.from_rules(th, RuleParams()))
    return configmaps_yaml({uid: render_dashboard_json(d) for uid, d in built.items()})


#: An overlay's threshold patches: file name under ``thresholds/`` -> its text for the thresholds.
THRESHOLD_PATCHES: dict[str, Callable[[Thresholds], str]] = {
    "report-config.yaml": report_config_map_text,
    "dashboards.yaml": dashboards_text,
}


def _release_patch(kind: str, release: str) -> list[str]:
    return [
        f"  - target: {{group: monitoring.coreos.com, kind: {kind}, name: kv-cache-sidecar}}",
        "    patch: |-",
        "      - op: add",
        "        path: /metadata/labels/release",
        f"        value: {release}",
    ]


def overlay_kustomization(overlay: Overlay) -> str:
    """``overlays/<name>/kustomization.yaml``."""
    th = overlay.thresholds
    lines = [
        f"# The {overlay.name} overlay: {overlay.about}.",
        "# Generated by `make generate` from OVERLAYS in sidecar/artifacts/deploy.py; do not edit by hand.",
        "# For your own cluster, copy this folder and edit the copy (docs/kubernetes.md).",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "# Every object goes to this namespace (create it first); the PodMonitor selects the pods of its",
        "# own namespace and the report covers it.",
        f"namespace: {overlay.namespace}",
        "resources:",
        "  - ../../base",
        "images:",
        "  # The report's image (and the sidecar's, for the components you add). In production, pin digests",
        "  # too (digest: sha256:...).",
        f"  - name: {IMAGE_REPOSITORY}",
        f"    newTag: {_scalar(overlay.tag)}",
        f"  - name: {REPORT_IMAGE_REPOSITORY}",
        f"    newTag: {_scalar(overlay.tag)}",
        "patches:",
        "  # kube-prometheus-stack's Prometheus selects PodMonitors and PrometheusRules by the label",
        "  # release: <its Helm release> (podMonitorSelectorNilUsesHelmValues, ruleSelectorNilUsesHelmValues);",
        "  # without it both are applied and silently never used. Set your release's name (helm list -A).",
        *_release_patch("PodMonitor", overlay.release),
        *_release_patch("PrometheusRule", overlay.release),
        "  # The alert and recording rules of this namespace only (alerts.namespace), with its thresholds: two",
        "  # overlays in one Prometheus never alert or record twice (`make generate`; for yours: kv-sidecar",
        f"  # rules render --format prometheusrule --alerts.namespace {overlay.namespace} --config.file ...).",
        "  - path: prometheusrule.yaml",
    ]
    if overlay.own_thresholds:
        lines += [
            f"  # Its own thresholds (watermark {th.watermark}, warning {th.warning}, target_usage {th.target_usage}):",
            "  # the report's configuration, the alert rules and the dashboards, each rendered with them (`make",
            "  # generate`; for yours: kv-sidecar rules render / dashboards render --config.file). Give your",
            "  # sidecars' ConfigMaps the same thresholds (docs/kubernetes.md).",
            *(f"  - path: thresholds/{name}" for name in THRESHOLD_PATCHES),
        ]
    return "\n".join(lines) + "\n"


def generated() -> Iterator[tuple[str, Callable[[], str], str]]:
    """(path, function giving its text, what it is generated from) for every generated file of deploy/."""
    kube = "sidecar/artifacts/kubernetes.py"
    for component in COMPONENTS:
        yield f"{component.path}/sidecar.yaml", partial(sidecar_patch_text, component), kube
        yield f"{component.path}/configmap.yaml", sidecar_config_map_text, "sidecar/artifacts/deploy.py"
    yield NETWORK_POLICY, network_policy_text, kube
    yield f"{TWO_DEPLOYMENTS}/kustomization.yaml", two_deployments_text, "TWO in sidecar/artifacts/deploy.py"
    for name, tp in TWO.items():
        yield (
            f"{TWO_DEPLOYMENTS}/sidecar-{name}.yaml",
            partial(sidecar_patch_text, COMPONENTS[0], workload=name),
            kube,
        )
        yield (
            f"{TWO_DEPLOYMENTS}/configmap-{name}.yaml",
            partial(sidecar_config_map_text, None, name, tp),
            "TWO in sidecar/artifacts/deploy.py",
        )
    yield (
        f"{LEADER_WORKER_SET}/kustomization.yaml",
        leader_kustomization_text,
        "LWS_EXAMPLE in sidecar/artifacts/deploy.py",
    )
    yield f"{LEADER_WORKER_SET}/sidecar.yaml", leader_patch_text, kube
    yield (
        f"{LEADER_WORKER_SET}/configmap.yaml",
        partial(sidecar_config_map_text, None, LWS_EXAMPLE[0], LWS_EXAMPLE[1], LWS_EXAMPLE[2]),
        "LWS_EXAMPLE in sidecar/artifacts/deploy.py",
    )
    yield f"{KSERVE}/kustomization.yaml", kserve_kustomization_text, "KSERVE_EXAMPLE in sidecar/artifacts/deploy.py"
    yield f"{KSERVE}/sidecar.yaml", predictor_patch_text, kube
    yield (
        f"{KSERVE}/configmap.yaml",
        partial(sidecar_config_map_text, None, KSERVE_EXAMPLE, target=f"http://127.0.0.1:{KSERVE_PORT}/metrics"),
        "KSERVE_EXAMPLE in sidecar/artifacts/deploy.py",
    )
    yield f"{BASE}/prometheusrule.yaml", prometheus_rule_text, "sidecar/artifacts/rules.py with the default thresholds"
    yield f"{BASE}/report.yaml", report_text, kube
    for overlay in OVERLAYS:
        yield f"{overlay.path}/kustomization.yaml", partial(overlay_kustomization, overlay), "OVERLAYS"
        yield (
            f"{overlay.path}/prometheusrule.yaml",
            partial(prometheus_rule_text, overlay.thresholds, overlay.namespace),
            f"the {overlay.name} overlay's namespace and thresholds (OVERLAYS in sidecar/artifacts/deploy.py)",
        )
        if overlay.own_thresholds:
            for name, make in THRESHOLD_PATCHES.items():
                source = f"the {overlay.name} overlay's thresholds (OVERLAYS in sidecar/artifacts/deploy.py)"
                yield f"{overlay.path}/thresholds/{name}", partial(make, overlay.thresholds), source
