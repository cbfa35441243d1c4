"""The Kubernetes objects of ``deploy/``: the sidecar's container, the patches that add it to a vLLM
Deployment, its ConfigMap, the weekly report's CronJob and the ``PrometheusRule``.

- **The sidecar** runs in every vLLM pod and is never in vLLM's way (docs/kubernetes.md, "Never gate
  vLLM"): by default a plain second container, so vLLM's container starts whatever happens to the
  sidecar's image (a native sidecar, an init container with ``restartPolicy: Always``, must be running
  before the kubelet starts the next container: an image that cannot be pulled would keep vLLM from
  starting at all; :func:`sidecar_patch` with ``native=True`` makes one for those who want its ordering).
  It has **no probe at all**: the kubelet counts every container's readiness in the pod's, so a
  readinessProbe that failed would take vLLM out of its Service, a startupProbe of a native sidecar
  would hold vLLM's start, and a livenessProbe restart leaves the pod not Ready while the sidecar
  comes back. The sidecar never exits on a bad configuration or a missing model (``kv-sidecar run``
  serves and waits for the fix), so it has nothing to be restarted for.
- **One ConfigMap per attached workload**, named after it (:func:`config_map_name`): two vLLM Deployments
  in one namespace, with different models or parallelism, each read their own.
- **Security**: every container here meets the "restricted" Pod Security Standard (non-root, no
  privilege escalation, every capability dropped, the runtime's default seccomp profile) and has a
  read-only root filesystem; the image's user is :data:`UID`.
- **Resources** (:data:`SIDECAR_RESOURCES`) are measured, see its comment.

Pure: mappings from parameters. :mod:`.deploy` chooses the parameters and writes ``deploy/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``metadata.labels`` every generated Kubernetes resource carries.
APP_NAME = "kv-cache-sidecar"

#: The images (the repository's Dockerfile: the daemon, its default target, and ``--target report``), tagged
#: with the package version: `make image` builds both; the release workflow pushes them on a tag.
IMAGE_REPOSITORY = "ghcr.io/kv-cache-sidecar/kv-cache-sidecar"
REPORT_IMAGE_REPOSITORY = f"{IMAGE_REPOSITORY}-report"
#: The image's non-root user and group (the Dockerfile's ``USER``).
UID = GID = 10001

CONTAINER_NAME = "kv-cache-sidecar"
#: The sidecar's port (``web.listen_address``) and its name, which the PodMonitor selects
#: (a port name has at most 15 characters).
METRICS_PORT = 9437
METRICS_PORT_NAME = "kv-metrics"
#: The label the patch puts on the pods it adds the sidecar to: the PodMonitor and the
#: NetworkPolicy select the pods by it, whatever labels their Deployment gives them.
POD_LABEL = "kv-cache-sidecar/enabled"

#: The sidecar's ConfigMap, mounted as a directory (not with ``subPath``) so that an edit of the
#: ConfigMap reaches the running pods (the kubelet refreshes mounted ConfigMaps; subPath mounts never).
CONFIG_VOLUME = "kv-cache-sidecar-config"
CONFIG_DIR = "/etc/kv-sidecar"
CONFIG_KEY = "config.yaml"
#: Where the sidecar sees the volume holding the model vLLM serves (read-only, the whole volume): a model
#: directory, or the Hugging Face cache vLLM downloads into (``HF_HOME``); ``model.config`` points here.
MODEL_MOUNT = "/model"
#: The example's values of what a user edits in the patch: the workload, the volume holding the model, and
#: the name of vLLM's container (what ``kubectl logs``/``exec`` pick without ``-c``).
EXAMPLE_WORKLOAD = "vllm"
EXAMPLE_MODEL_VOLUME = "model"
EXAMPLE_VLLM_CONTAINER = "vllm"
#: The workload kinds whose pod template the patch adds the sidecar to (the same strategic merge for each).
WORKLOAD_KINDS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1"}


def config_map_name(workload: str) -> str:
    """The ConfigMap of the sidecars of one workload: ``kv-cache-sidecar-<workload>`` (mounted as a
    directory, not with ``subPath``, so that an edit reaches the running pods: the kubelet refreshes
    mounted ConfigMaps, never subPath mounts)."""
    return f"{APP_NAME}-{workload}"


#: Requests and limits of the sidecar, measured: ``bench/memory.py`` (10,000 scrape -> export cycles,
#: 14 simulated hours with the capacity model and the forecast on) settles at 39.9 MiB resident, and a
#: real ``kv-sidecar run`` (HTTP server, scheduler, history on) peaked at 41.8 MiB over 150 scrapes. The
#: request is that plus 15 %. The limit adds room for one answer of vLLM at ``body_size_limit`` (4 MiB,
#: held as bytes, as text, as kept lines and as samples while it is read: about 5 x 4 MiB) and the
#: allocator's slack: 128Mi, three times the steady figure. ``bench/scrape_cycle.py``: 2.6 ms of CPU per
#: 5 s cycle, so 10m is twenty times what it uses; no CPU limit, so a scrape is never throttled by CFS
#: quotas. Native-sidecar requests add to the pod's, which is why they stay small.
SIDECAR_RESOURCES: dict[str, Any] = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}

REPORT_NAME = "kv-cache-sidecar-report"
REPORT_CONFIG_KEY = "report.yaml"
REPORT_URL_KEY = "prometheus_url"
REPORT_CONFIG_DIR = "/etc/kv-sidecar"
REPORT_OUT = "/reports"
#: The Secret a team creates with its chat webhook's URL (``kubectl create secret generic
#: kv-cache-sidecar-report-webhook --from-literal=url=https://hooks.slack.com/...``); optional: without it the
#: Job writes the report and posts nothing.
REPORT_WEBHOOK_SECRET = f"{REPORT_NAME}-webhook"
REPORT_WEBHOOK_KEY = "url"
REPORT_WEBHOOK_DIR = "/etc/kv-sidecar-webhook"
#: Weeks of reports the volume keeps (``--keep-weeks``): a quarter.
REPORT_KEEP_WEEKS = 13
#: The reports' volume: a week's Markdown, HTML (plots embedded), JSON and PNGs take a few MB for a handful
#: of models (about 25 MB of JSON for 64 pods), so 1 GiB holds a quarter of a large namespace's.
REPORT_STORAGE = "1Gi"
#: Mondays 06:00 UTC, as ``kv-sidecar reporter``'s default: last week's report before the week starts.
REPORT_SCHEDULE = "0 6 * * 1"
#: The report's: ``kv-sidecar report --compare-previous`` over two weeks of five pods (the report tests' known
#: week) peaked at 163 MiB, matplotlib's plots included; ``bench/report_prometheus.py`` (64 pods, a week at
#: 15 s, from Prometheus) peaked at 504 MB. The limit leaves twice that; a weekly job needs no CPU guarantee
#: beyond a tenth of a core.
REPORT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def image(tag: str, repository: str = IMAGE_REPOSITORY) -> str:
    return f"{repository}:{tag}"


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/component": component}


def container_security_context() -> dict[str, Any]:
    """The "restricted" Pod Security Standard's container fields, and a read-only root filesystem."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": GID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sidecar_container(
    tag: str,
    *,
    native: bool = False,
    model_volume: str = EXAMPLE_MODEL_VOLUME,
) -> dict[str, Any]:
    """The sidecar's container: a plain container, or a native sidecar (``restartPolicy: Always``)."""
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": image(tag), "imagePullPolicy": "IfNotPresent"}
    if native:
        container["restartPolicy"] = "Always"
    container.update(
        {
            "args": ["run", "--config.file", f"{CONFIG_DIR}/{CONFIG_KEY}"],
            "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
            # No probes (the module's docstring says why): Prometheus' `up` and KVCacheSidecarDown watch it.
            "resources": SIDECAR_RESOURCES,
            "securityContext": container_security_context(),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                {"name": model_volume, "mountPath": MODEL_MOUNT, "readOnly": True},
            ],
        }
    )
    return container


def sidecar_patch(
    tag: str,
    *,
    native: bool = False,
    kind: str = "Deployment",
    workload: str = EXAMPLE_WORKLOAD,
    model_volume: str = EXAMPLE_MODEL_VOLUME,
    vllm_container: str = EXAMPLE_VLLM_CONTAINER,
) -> dict[str, Any]:
    """The strategic-merge patch that adds the sidecar, its ConfigMap volume and :data:`POD_LABEL` to the
    ``kind`` (Deployment, StatefulSet) named ``workload`` (containers and volumes merge by name: the
    workload's own are kept). ``kubectl patch <kind> <workload> --patch-file`` applies it to a live one."""
    container = sidecar_container(tag, native=native, model_volume=model_volume)
    template_metadata: dict[str, Any] = {"labels": {POD_LABEL: "true"}}
    if not native:
        # The patch lists the sidecar first, which `kubectl logs`/`exec` would then pick without -c.
        template_metadata["annotations"] = {"kubectl.kubernetes.io/default-container": vllm_container}
    return {
        "apiVersion": WORKLOAD_KINDS[kind],
        "kind": kind,
        "metadata": {"name": workload},
        "spec": {
            "template": {
                "metadata": template_metadata,
                "spec": {
                    ("initContainers" if native else "containers"): [container],
                    "volumes": [{"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(workload)}}],
                },
            }
        },
    }


#: LeaderWorkerSet (github.com/kubernetes-sigs/lws, ``api/leaderworkerset/v1``): multi-node vLLM.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
#: The leader's pod template: the leader runs vLLM's API server and its ``/metrics`` for the whole group
#: (vLLM's docs, deployment/frameworks/lws.md); the workers run Ray workers with no API server.
LEADER_TEMPLATE = "/spec/leaderWorkerTemplate/leaderTemplate"
#: KServe's InferenceService (github.com/kserve/kserve, ``pkg/apis/serving/v1beta1``): the predictor is a
#: pod spec inlined next to ``model``; its ``containers`` other than ``kserve-container`` run beside the
#: model server (``PredictorSpec`` in predictor.go), its ``labels`` go on the pods (``ComponentExtensionSpec``).
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
PREDICTOR = "/spec/predictor"
#: The port of KServe's model server (the huggingface runtime's vLLM answers /metrics there:
#: ``prometheus.kserve.io/port: '8080'`` in config/runtimes/kserve-huggingfaceserver.yaml).
KSERVE_PORT = 8080


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # RFC 6901 escaping


def json_patch(
    tag: str,
    *,
    pod: str,
    labels: str,
    workload: str = EXAMPLE_WORKLOAD,
    model_volume: str = EXAMPLE_MODEL_VOLUME,
    first_container: bool = False,
) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that adds the sidecar, its ConfigMap volume and :data:`POD_LABEL` to the
    pod spec at ``pod`` of a custom resource, with the pod labels at ``labels``. A JSON patch, not a
    strategic merge: the API server takes no strategic merge for a custom resource (``kubectl patch
    --type json`` applies it to a live one). The labels and ``volumes`` must exist (the model's volume
    is one); the sidecar is appended to ``containers`` (vLLM's stays first, which ``kubectl logs``/``exec``
    pick), or makes the list when ``first_container`` (KServe: the model server is ``model``, not a
    container)."""
    container = sidecar_container(tag, model_volume=model_volume)
    volume = {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(workload)}}
    add = (
        {"op": "add", "path": f"{pod}/containers", "value": [container]}
        if first_container
        else {"op": "add", "path": f"{pod}/containers/-", "value": container}
    )
    return [
        {"op": "add", "path": f"{labels}/{_pointer(POD_LABEL)}", "value": "true"},
        add,
        {"op": "add", "path": f"{pod}/volumes/-", "value": volume},
    ]


def leader_sidecar_patch(tag: str, *, workload: str = EXAMPLE_WORKLOAD) -> list[dict[str, Any]]:
    """:func:`json_patch` for a LeaderWorkerSet's leader template only (the workers stay as they are)."""
    return json_patch(
        tag, pod=f"{LEADER_TEMPLATE}/spec", labels=f"{LEADER_TEMPLATE}/metadata/labels", workload=workload
    )


def predictor_sidecar_patch(tag: str, *, workload: str = EXAMPLE_WORKLOAD) -> list[dict[str, Any]]:
    """:func:`json_patch` for a KServe InferenceService's predictor, which lists no containers of its own."""
    return json_patch(tag, pod=PREDICTOR, labels=f"{PREDICTOR}/labels", workload=workload, first_container=True)


def config_map(name: str, component: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels(component)},
        "data": data,
    }


def sidecar_config_map(config_text: str, workload: str = EXAMPLE_WORKLOAD) -> dict[str, Any]:
    """The configuration file of ``workload``'s sidecars as its ConfigMap (:func:`config_map_name`, key
    :data:`CONFIG_KEY`)."""
    return config_map(config_map_name(workload), "sidecar", {CONFIG_KEY: config_text})


#: Who may scrape the sidecar when the NetworkPolicy is on: Prometheus as prometheus-operator labels its
#: pods, in the namespace kube-prometheus-stack is usually installed in (both are parameters).
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}


def network_policy(
    prometheus_namespace: str = PROMETHEUS_NAMESPACE, prometheus_labels: Mapping[str, str] = PROMETHEUS_POD_LABELS
) -> dict[str, Any]:
    """The NetworkPolicy that restricts the sidecar's port to Prometheus and takes nothing else away.

    A policy that selects a pod for Ingress closes every port it does not allow (Kubernetes docs,
    "Network Policies": isolated pods). So besides Prometheus -> :data:`METRICS_PORT`, every other port of
    the pod stays open to every peer: TCP as the two ranges around the sidecar's port (``endPort``, stable
    since Kubernetes 1.25), UDP and SCTP whole. vLLM, Ray, NIXL/KV transfer and a mesh's ports keep working
    as without the policy; a policy of the user's own that restricts them still applies (policies add up).
    """
    every = [
        {"protocol": "TCP", "port": 1, "endPort": METRICS_PORT - 1},
        {"protocol": "TCP", "port": METRICS_PORT + 1, "endPort": 65535},
        {"protocol": "UDP", "port": 1, "endPort": 65535},
        {"protocol": "SCTP", "port": 1, "endPort": 65535},
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{APP_NAME}-metrics", "labels": labels("monitoring")},
        "spec": {
            "podSelector": {"matchLabels": {POD_LABEL: "true"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": prometheus_namespace}},
                            "podSelector": {"matchLabels": dict(prometheus_labels)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                },
                {"ports": every},
            ],
        },
    }


def report_config_map(config_text: str, prometheus_url: str) -> dict[str, Any]:
    """What the report's CronJob reads: its configuration file and the Prometheus it queries."""
    return config_map(REPORT_NAME, "report", {REPORT_URL_KEY: prometheus_url, REPORT_CONFIG_KEY: config_text})


def report_volume_claim(storage: str = REPORT_STORAGE) -> dict[str, Any]:
    """The reports' volume (:func:`report_cronjob`), of the cluster's default storage class."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": REPORT_NAME, "labels": labels("report")},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
    }


def report_cronjob(tag: str, keep_weeks: int = REPORT_KEEP_WEEKS) -> dict[str, Any]:
    """The weekly report (``kv-sidecar report`` from Prometheus), once per cluster namespace, never in a
    sidecar (one per pod would write it N times). Its Prometheus URL comes from :func:`report_config_map`;
    the report covers the pods of the CronJob's own namespace. Files go to :func:`report_volume_claim`,
    ``keep_weeks`` weeks of them; the summary to the Job's log and, when the optional Secret
    :data:`REPORT_WEBHOOK_SECRET` exists, to its chat webhook (exit 4 when that fails: the week waits on
    the volume and is sent by the next run)."""
    pod_security = {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": GID,
        "fsGroup": GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "name": "report",
        "image": image(tag, REPORT_IMAGE_REPOSITORY),  # matplotlib's plots: not in the daemon's image
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "report",
            *("--prometheus-url", "$(PROMETHEUS_URL)"),
            *("--selector", '{namespace="$(POD_NAMESPACE)"}'),
            "--compare-previous",
            *("--config.file", f"{REPORT_CONFIG_DIR}/{REPORT_CONFIG_KEY}"),
            *("--out", REPORT_OUT),
            *("--keep-weeks", str(keep_weeks)),
            *("--webhook-url-file", f"{REPORT_WEBHOOK_DIR}/{REPORT_WEBHOOK_KEY}"),
            *("--webhook-format", "slack"),
        ],
        "env": [
            {"name": "PROMETHEUS_URL", "valueFrom": {"configMapKeyRef": {"name": REPORT_NAME, "key": REPORT_URL_KEY}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
            # glibc keeps the report's per-pod arrays (about 80 KB each, under its default 128 KB mmap
            # threshold) in its heap and does not hand their holes to the plots: at 1,000 pods with
            # --compare-previous the peak is 1,073 MiB without this, 950 MiB with it (bench/report_memory.py).
            {"name": "GLIBC_TUNABLES", "value": "glibc.malloc.mmap_threshold=65536"},
        ],
        "resources": REPORT_RESOURCES,
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "config", "mountPath": REPORT_CONFIG_DIR, "readOnly": True},
            {"name": "reports", "mountPath": REPORT_OUT},
            {"name": "webhook", "mountPath": REPORT_WEBHOOK_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": REPORT_NAME, "labels": labels("report")},
        "spec": {
            "schedule": REPORT_SCHEDULE,
            "timeZone": "Etc/UTC",
            # A report still running when the next is due (a slow Prometheus) is not doubled.
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 4,
            "failedJobsHistoryLimit": 4,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": 1800,
                    "template": {
                        "metadata": {"labels": labels("report")},
                        "spec": {
                            "restartPolicy": "Never",
                            "automountServiceAccountToken": False,
                            "securityContext": pod_security,
                            "containers": [container],
                            "volumes": [
                                {"name": "config", "configMap": {"name": REPORT_NAME}},
                                {"name": "reports", "persistentVolumeClaim": {"claimName": REPORT_NAME}},
                                {
                                    "name": "webhook",
                                    "secret": {
                                        "secretName": REPORT_WEBHOOK_SECRET,
                                        "optional": True,  # no Secret: the report is written, nothing posted
                                        "defaultMode": 0o440,
                                    },
                                },
                                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                            ],
                        },
                    },
                }
            },
        },
    }


def prometheus_rule(groups: Mapping[str, Any], name: str = APP_NAME) -> dict[str, Any]:
    """The ``PrometheusRule`` (prometheus-operator, ``monitoring.coreos.com/v1``) whose ``spec.groups`` are
    ``groups["groups"]``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": labels("alerting")},
        "spec": {"groups": groups["groups"]},
    }
