"""Kubernetes wrappers of the generated artifacts (prometheus-operator resources)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``metadata.labels`` every generated Kubernetes resource carries.
APP_NAME = "kv-cache-sidecar"


def prometheus_rule(groups: Mapping[str, Any], name: str = APP_NAME) -> dict[str, Any]:
    """The ``PrometheusRule`` (prometheus-operator, ``monitoring.coreos.com/v1``) whose ``spec.groups`` are
    ``groups["groups"]``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/component": "alerting"},
        },
        "spec": {"groups": groups["groups"]},
    }
