"""What every dashboard is made from: :class:`DashboardParams`, the titles, and the rows' questions.

The dashboards answer the on-call questions in order, one row per question (:data:`ROW_TITLES`); the
links between them list :data:`TITLES` in order. Label names of Prometheus' discovery are parameters
(kube-prometheus defaults), and the thresholds and alert parameters are the ones the alert rules are
rendered from (:func:`DashboardParams.from_rules`), so the lines drawn are the ones that page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...alert_params import RuleParams
from ...config import ForecastSettings
from ...thresholds import Thresholds
from ..params import DASHBOARD_CAPACITY_UID, DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID

#: Titles, in the order the links list them.
TITLES = {
    DASHBOARD_OVERVIEW_UID: "KV cache / Fleet",
    DASHBOARD_POD_UID: "KV cache / Pod",
    DASHBOARD_CAPACITY_UID: "KV cache / Capacity planning",
}

#: The rows of every dashboard, in on-call order (the pod view adds one for model, server and sidecar).
ROW_TITLES = (
    "Is any pod about to fill",
    "How many tokens are left and how fast",
    "Is it preempting",
    "What to change",
)

#: The Fleet dashboard's last row: what users feel, from vLLM's own series (the KV rows say why).
USERS_ROW_TITLE = "Are users hurting"

#: The template variable of the cluster, first of the chain. Its "All" is ``.*``, and ``cluster=~".*"`` also
#: matches a series without the label (Prometheus: a matcher that matches the empty string selects series
#: without the label too, "Querying basics"): harmless where Prometheus holds one cluster and no such label.
VAR_CLUSTER = "cluster"

#: Tag of the three dashboards (Grafana's search and tag links).
TAG = "kvcache"


@dataclass(frozen=True)
class DashboardParams:
    """What the dashboards are made from: label names of Prometheus' discovery and the shared thresholds.

    ``namespace_label``/``pod_label`` are the labels Prometheus' service discovery puts on the sidecar's
    and vLLM's series (kube-prometheus PodMonitor: ``namespace``, ``pod``); the template variables keep
    their names (``namespace``, ``pod``) whatever the labels are, because alerts link to them.
    """

    namespace_label: str = "namespace"
    pod_label: str = "pod"
    #: the label a multi-cluster setup puts on every series (an external label or relabelling); may be absent
    cluster_label: str = "cluster"
    thresholds: Thresholds = field(default_factory=Thresholds)
    runbook_base_url: str = RuleParams().runbook_base_url
    sidecar_job: str = RuleParams().sidecar_job
    #: KVCacheFullSoon's window: the worst time until full turns red below it.
    full_soon_within: str = RuleParams().full_soon_within
    #: KVCacheCapacityMismatch's tolerance: the efficiency panel's band.
    capacity_mismatch_tolerance: float = RuleParams().capacity_mismatch_tolerance
    #: the ``forecast:`` section: the peak window the Fleet's workload advice sizes on and the bounds of
    #: the suggested utilization (the weekly report's and the daemon's)
    forecast: ForecastSettings = field(default_factory=ForecastSettings)

    @classmethod
    def from_rules(
        cls,
        thresholds: Thresholds,
        rules: RuleParams,
        *,
        namespace_label: str = "namespace",
        pod_label: str = "pod",
        cluster_label: str = "cluster",
        forecast: ForecastSettings | None = None,
    ) -> DashboardParams:
        """The parameters of the alert rules rendered from the same configuration, plus label names and
        its ``forecast:`` section (None: the defaults)."""
        return cls(
            forecast=forecast or ForecastSettings(),
            thresholds=thresholds,
            runbook_base_url=rules.runbook_base_url,
            sidecar_job=rules.sidecar_job,
            full_soon_within=rules.full_soon_within,
            capacity_mismatch_tolerance=rules.capacity_mismatch_tolerance,
            namespace_label=namespace_label,
            pod_label=pod_label,
            cluster_label=cluster_label,
        )


def runbook_url(p: DashboardParams, alert: str) -> str:
    """The runbook of one alert (``docs/runbooks/<alert>.md`` under ``alerts.runbook_base_url``)."""
    return f"{p.runbook_base_url}/{alert}.md"
