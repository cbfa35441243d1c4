"""What every dashboard has around its panels: template variables, annotations and links.

- the variables: the data source, then cluster -> namespace -> model_name -> pod, each filtered by
  the ones before (kubernetes-mixin's chain; alerts link to them by name);
- the annotations: vLLM restarts, cache configuration changes and KVCacheAlmostFull firing;
- the links: the two other dashboards (keeping variables and time range) and the runbooks.

Where the SDK cannot express a field Grafana reads, the encoded JSON is completed for that piece only
(:data:`ANNOTATION_FALLBACK_KEYS`): the SDK's ``AnnotationQuery`` has ``expr`` but not the Prometheus
annotation's ``titleFormat``/``textFormat``/``tagKeys``; :func:`annotation_queries` returns them beside
each query and :mod:`.assemble` adds them.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from ...metrics import CACHE_SETTINGS
from ..params import VAR_DATASOURCE, VAR_MODEL_NAME, VAR_NAMESPACE, VAR_POD
from .inputs import TITLES, VAR_CLUSTER, DashboardParams
from .panel_kit import datasource_ref
from .promql import Selectors, legend_format

#: Keys added to each encoded annotation because the SDK's AnnotationQuery has no field for them.
ANNOTATION_FALLBACK_KEYS = ("tagKeys", "textFormat", "titleFormat")


def template_variables(p: DashboardParams) -> list[Any]:
    """The data source, then cluster -> namespace -> model_name -> pod, each filtered by the ones before.

    Where no series has a cluster label the cluster variable has no value but "All" (``.*``), which
    matches series without the label: every dashboard works as if it had no such variable."""
    cluster = f'{p.cluster_label}=~"${VAR_CLUSTER}"'
    namespace = f'{cluster}, {p.namespace_label}=~"${VAR_NAMESPACE}"'
    chain = [
        (VAR_CLUSTER, "Cluster", p.cluster_label, "kvcache_usage_ratio"),
        (VAR_NAMESPACE, "Namespace", p.namespace_label, f"kvcache_usage_ratio{{{cluster}}}"),
        (VAR_MODEL_NAME, "Model", "model_name", f"kvcache_usage_ratio{{{namespace}}}"),
        (VAR_POD, "Pod", p.pod_label, f'kvcache_usage_ratio{{{namespace}, model_name=~"${VAR_MODEL_NAME}"}}'),
    ]
    out: list[Any] = [db.DatasourceVariable(VAR_DATASOURCE).label("Data source").type("prometheus")]
    for name, label, source_label, series in chain:
        out.append(
            db.QueryVariable(name)
            .label(label)
            .datasource(datasource_ref())
            .query(f"label_values({series}, {source_label})")
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )
    return out


def annotation_queries(p: DashboardParams, s: Selectors) -> list[tuple[db.AnnotationQuery, dict[str, str]]]:
    """(annotation, the keys the SDK cannot set) for restarts, configuration changes and KVCacheAlmostFull."""
    ns, pod = p.namespace_label, p.pod_label
    where = f"{legend_format(ns)}/{legend_format(pod)}"
    started = f"process_start_time_seconds{s.pod_only()}"
    settings = (ns, "model_name", *CACHE_SETTINGS)

    def query(name: str, color: str, expr: str) -> db.AnnotationQuery:
        return db.AnnotationQuery().name(name).datasource(datasource_ref()).enable(True).icon_color(color).expr(expr)

    return [
        (
            # A new process start time of a vLLM target: a restart in place (the value changes) or a
            # new pod (a rollout: the series is new, absent a rate interval ago; also true once where
            # Prometheus' data begins). The `and` drops the sidecar's own process (same pod, other
            # instance). Over $__rate_interval, which overlaps the previous step by a scrape, so a
            # change between two steps is not missed.
            query(
                "vLLM restarts",
                "purple",
                f"(\n  changes({started}[$__rate_interval]) > 0\n  or\n"
                f"  ({started} unless {started} offset $__rate_interval)\n)\n"
                f"and on ({ns}, {pod}, instance) vllm:num_requests_running{s.pod_only()}",
            ),
            {"titleFormat": "vLLM restarted", "textFormat": where, "tagKeys": f"{ns},{pod}"},
        ),
        (
            # A change the sidecar saw in place (its counter), or cache settings the model did not run with
            # a rate interval ago anywhere in the namespace (a rollout with new flags replaces the pods,
            # and their sidecars with them; a rollout with the same flags is not a change).
            query(
                "Configuration changes",
                "blue",
                f"increase(kvcache_sidecar_config_changes_total{s.pod_only()}[$__rate_interval]) > 0\n"
                f"or\n(\n  kvcache_server_info{s.engine()}\n"
                f"  unless on ({', '.join(settings)})\n"
                f"  kvcache_server_info{s.engine()} offset $__rate_interval\n)",
            ),
            {"titleFormat": "vLLM cache configuration changed", "textFormat": where, "tagKeys": f"{ns},{pod}"},
        ),
        (
            query(
                "KVCacheAlmostFull",
                "red",
                f'ALERTS{{alertname="KVCacheAlmostFull", alertstate="firing", {s.engine()[1:-1]}}}',
            ),
            {
                "titleFormat": "KVCacheAlmostFull ({{severity}})",
                "textFormat": f"{{{{model_name}}}} on {where}",
                "tagKeys": "severity",
            },
        ),
    ]


def dashboard_links(uid: str, p: DashboardParams) -> list[cogbuilder.Builder[dm.DashboardLink]]:
    """The two other dashboards (keeping the variables and the time range), then the runbooks."""
    out: list[cogbuilder.Builder[dm.DashboardLink]] = [
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/{other}")
        .icon("dashboard")
        .tooltip(f"Open {title} with the same variables and time range")
        .include_vars(True)
        .keep_time(True)
        for other, title in TITLES.items()
        if other != uid
    ]
    out.append(
        db.DashboardLink("Runbooks")
        .type(dm.DashboardLinkType.LINK)
        .url(p.runbook_base_url)
        .icon("doc")
        .tooltip("What to do for each KVCache* alert")
        .target_blank(True)
    )
    return out
