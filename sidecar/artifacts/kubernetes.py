"""The Kubernetes objects of ``deploy/``: the sidecar's container, the patches that add it to a vLLM
Deployment, its ConfigMap, the weekly report's CronJob and the ``PrometheusRule``.

- **The sidecar** runs in every vLLM pod. On Kubernetes 1.29+ it is a *native sidecar*: an entry of
  ``initContainers`` with ``restartPolicy: Always`` (KEP-753; beta and on by default in 1.29, stable in
  1.33), started before vLLM and stopped after it. Before 1.29 it is a plain second container
  (:func:`sidecar_patch` with ``native=False``). Its probes check only the sidecar itself (daemon.py:
  ``/readyz`` = configuration loaded and HTTP up, ``/healthz`` = every scrape loop ticked within three
  intervals), never vLLM, and there is **no readinessProbe**: a native sidecar's readiness is part of the
  pod's (kubelet's ``GenerateContainersReadyCondition`` counts restartable init containers), so a
  probe that failed under load would take vLLM out of its Service. Without one the sidecar counts as
  ready while it runs.
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

#: The image (the repository's Dockerfile); tagged with the package version.
IMAGE_REPOSITORY = "ghcr.io/kv-cache-sidecar/kv-cache-sidecar"
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
CONFIG_MAP = "kv-cache-sidecar-config"
CONFIG_VOLUME = "kv-cache-sidecar-config"
CONFIG_DIR = "/etc/kv-sidecar"
CONFIG_KEY = "config.yaml"
#: Where the sidecar sees the model directory vLLM serves (read-only); ``model.config`` points here.
MODEL_MOUNT = "/model"
#: The example's values of what a user edits in the patch: the Deployment, the volume holding the
#: model and the model's directory inside that volume.
EXAMPLE_DEPLOYMENT = "vllm"
EXAMPLE_MODEL_VOLUME = "model"
EXAMPLE_MODEL_SUBPATH = "llama-3.1-8b"
#: The container kubectl logs and exec default to when the sidecar is a plain container (legacy).
EXAMPLE_VLLM_CONTAINER = "vllm"

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
#: Mondays 06:00 UTC, as ``kv-sidecar reporter``'s default: last week's report before the week starts.
REPORT_SCHEDULE = "0 6 * * 1"
#: The report's: ``kv-sidecar report --compare-previous`` over two weeks of five pods (the report tests' known
#: week) peaked at 163 MiB, matplotlib's plots included; ``bench/report_prometheus.py`` (64 pods, a week at
#: 15 s, from Prometheus) peaked at 504 MB. The limit leaves twice that; a weekly job needs no CPU guarantee
#: beyond a tenth of a core.
REPORT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def image(tag: str) -> str:
    return f"{IMAGE_REPOSITORY}:{tag}"


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


def _probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": METRICS_PORT_NAME}, **timing}


def sidecar_container(
    tag: str,
    *,
    native: bool = True,
    model_volume: str = EXAMPLE_MODEL_VOLUME,
    model_subpath: str = EXAMPLE_MODEL_SUBPATH,
) -> dict[str, Any]:
    """The sidecar's container: a native sidecar (``restartPolicy: Always``) or a plain container."""
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": image(tag), "imagePullPolicy": "IfNotPresent"}
    if native:
        container["restartPolicy"] = "Always"
    container.update(
        {
            "args": ["run", "--config.file", f"{CONFIG_DIR}/{CONFIG_KEY}"],
            "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
            # The kubelet starts vLLM once this passes (a native sidecar's startup gates the next
            # container): polled every second, so vLLM waits about as long as the sidecar takes to serve.
            "startupProbe": _probe("/readyz", periodSeconds=1, timeoutSeconds=2, failureThreshold=30),
            # A wedged scrape loop (no tick for three intervals) is restarted; vLLM being down is not
            # the sidecar's fault and shows in kvcache_sidecar_target_up instead.
            "livenessProbe": _probe("/healthz", periodSeconds=10, timeoutSeconds=3, failureThreshold=3),
            "resources": SIDECAR_RESOURCES,
            "securityContext": container_security_context(),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                {"name": model_volume, "mountPath": MODEL_MOUNT, "subPath": model_subpath, "readOnly": True},
            ],
        }
    )
    return container


def sidecar_patch(
    tag: str,
    *,
    native: bool = True,
    deployment: str = EXAMPLE_DEPLOYMENT,
    model_volume: str = EXAMPLE_MODEL_VOLUME,
    model_subpath: str = EXAMPLE_MODEL_SUBPATH,
) -> dict[str, Any]:
    """The strategic-merge patch that adds the sidecar, its ConfigMap volume and :data:`POD_LABEL` to the
    Deployment ``deployment`` (containers and volumes merge by name: the Deployment's own are kept)."""
    container = sidecar_container(tag, native=native, model_volume=model_volume, model_subpath=model_subpath)
    template_metadata: dict[str, Any] = {"labels": {POD_LABEL: "true"}}
    if not native:
        # A plain container listed first would become what `kubectl logs`/`exec` pick without -c.
        template_metadata["annotations"] = {"kubectl.kubernetes.io/default-container": EXAMPLE_VLLM_CONTAINER}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment},
        "spec": {
            "template": {
                "metadata": template_metadata,
                "spec": {
                    ("initContainers" if native else "containers"): [container],
                    "volumes": [{"name": CONFIG_VOLUME, "configMap": {"name": CONFIG_MAP}}],
                },
            }
        },
    }


def config_map(name: str, component: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels(component)},
        "data": data,
    }


def sidecar_config_map(config_text: str) -> dict[str, Any]:
    """The sidecar's configuration file as the ConfigMap :data:`CONFIG_MAP` (key :data:`CONFIG_KEY`)."""
    return config_map(CONFIG_MAP, "sidecar", {CONFIG_KEY: config_text})


def report_config_map(config_text: str, prometheus_url: str) -> dict[str, Any]:
    """What the report's CronJob reads: its configuration file and the Prometheus it queries."""
    return config_map(REPORT_NAME, "report", {REPORT_URL_KEY: prometheus_url, REPORT_CONFIG_KEY: config_text})


def report_cronjob(tag: str) -> dict[str, Any]:
    """The weekly report (``kv-sidecar report`` from Prometheus), once per cluster namespace, never in a
    sidecar (one per pod would write it N times). Its Prometheus URL comes from :func:`report_config_map`;
    the report covers the pods of the CronJob's own namespace; files go to an ``emptyDir`` (replace it with
    a volume that outlives the Job to keep them) and the summary to the Job's log."""
    pod_security = {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": GID,
        "fsGroup": GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "name": "report",
        "image": image(tag),
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "report",
            *("--prometheus-url", "$(PROMETHEUS_URL)"),
            *("--selector", '{namespace="$(POD_NAMESPACE)"}'),
            "--compare-previous",
            *("--config.file", f"{REPORT_CONFIG_DIR}/{REPORT_CONFIG_KEY}"),
            *("--out", REPORT_OUT),
        ],
        "env": [
            {"name": "PROMETHEUS_URL", "valueFrom": {"configMapKeyRef": {"name": REPORT_NAME, "key": REPORT_URL_KEY}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
        ],
        "resources": REPORT_RESOURCES,
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "config", "mountPath": REPORT_CONFIG_DIR, "readOnly": True},
            {"name": "reports", "mountPath": REPORT_OUT},
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
                                {"name": "reports", "emptyDir": {"sizeLimit": "256Mi"}},
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
