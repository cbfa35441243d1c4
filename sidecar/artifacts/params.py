"""The names the generated artifacts share: dashboard uids, the folder, template variables.

The dashboard uids and template-variable names are fixed here because alerts link to them
(``dashboard_url``): dashboards must reuse them so that links in pages never break.

The parameters the artifacts are made from live in the core, where the sidecar reads them too:
:class:`sidecar.thresholds.Thresholds` (the ``thresholds:`` section) and
:class:`sidecar.alert_params.RuleParams` (the ``alerts:`` section). They are re-exported here so
that ``from sidecar.artifacts.params import Thresholds`` keeps working.

Pure: no I/O.
"""

from __future__ import annotations

# The parameters that moved to the core, re-exported so that the old import path keeps working.
from ..alert_params import FAST_VARIANT as FAST_VARIANT
from ..alert_params import RuleParams as RuleParams
from ..thresholds import Thresholds as Thresholds

#: Grafana dashboard uids (dashboards/README.md). Each alert's ``dashboard_url`` opens the one that shows
#: its cause: the Fleet for usage, forecast, preemptions and queueing; the Pod view for the prefix cache,
#: capacity drift and the sidecar's own health; Capacity planning for over-provisioning.
DASHBOARD_OVERVIEW_UID = "kvcache-overview"
DASHBOARD_CAPACITY_UID = "kvcache-capacity"
DASHBOARD_POD_UID = "kvcache-pod"
DASHBOARD_UIDS = (DASHBOARD_OVERVIEW_UID, DASHBOARD_CAPACITY_UID, DASHBOARD_POD_UID)

#: The Grafana folder the dashboards live in: the file provisioning's provider (``folderUid``) and
#: ``dashboards push`` (default ``--folder-uid``) both use this uid, so a Grafana served both ways has one
#: folder, not two. A push does not update file-provisioned dashboards (Grafana refuses API saves of
#: them; the push keeps them and says so). The ConfigMaps cannot set it: the Helm chart's dashboard
#: sidecar takes a folder annotation that names a directory, not a folder uid.
DASHBOARD_FOLDER_UID = "kvcache"
DASHBOARD_FOLDER_TITLE = "KV cache"

#: Template variables the alerts fill in ``dashboard_url`` (``var-<name>=<the alert's label <name>>``);
#: each is named after the label it filters on.
VAR_NAMESPACE = "namespace"
VAR_MODEL_NAME = "model_name"
VAR_POD = "pod"
DASHBOARD_VARIABLES = (VAR_NAMESPACE, VAR_MODEL_NAME, VAR_POD)
#: The Prometheus data-source variable every dashboard has (dashboards/README.md); no alert sets it.
VAR_DATASOURCE = "datasource"


#: ``kv-sidecar rules render --variant``.
VARIANTS = ("default", "fast")
