"""Assembly: each dashboard's :class:`~.panel_kit.DashboardSpec` plus the shared frame -> its JSON.

:func:`build_dashboards` maps the parameters to the dashboards' JSON mappings (classic Grafana 11.6
schema), in the order of :data:`DASHBOARDS`; :func:`render_dashboard_json` makes stable text of one
(``make generate`` commits ``dashboards/*.json``; a test keeps them equal).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from . import capacity, fleet, pod
from .frame import annotation_queries, dashboard_links, template_variables
from .inputs import TAG, TITLES, DashboardParams
from .panel_kit import DashboardSpec
from .promql import Selectors

#: Every dashboard, in the order they are built and written: each module's ``spec``.
DASHBOARDS: tuple[Callable[[DashboardParams, Selectors], DashboardSpec], ...] = (fleet.spec, pod.spec, capacity.spec)


def _build(spec: DashboardSpec, p: DashboardParams, s: Selectors) -> dict[str, Any]:
    """One dashboard's JSON mapping: its rows and panels in the shared frame, panel ids numbered in order."""
    d = (
        db.Dashboard(TITLES[spec.uid])
        .uid(spec.uid)
        .description(spec.description)
        .tags([TAG])
        .readonly()
        .timezone("utc")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time(spec.time_from, "now")
        .refresh(spec.refresh)
        .variables(template_variables(p))
        .links(dashboard_links(spec.uid, p))
    )
    annotations = annotation_queries(p, s)
    for annotation, _ in annotations:
        d = d.annotation(annotation)
    for title, panels in spec.rows:
        d = d.with_row(db.Row(title))
        for panel in panels:
            d = d.with_panel(panel.build())
    model = d.build()
    for i, built in enumerate(model.panels or [], start=1):
        built.id_val = i
    doc: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    # Fallback: Prometheus annotation keys the SDK's AnnotationQuery has no field for.
    for encoded, (_, extra) in zip(doc["annotations"]["list"], annotations, strict=True):
        encoded.update(extra)
    return doc


def build_dashboards(params: DashboardParams | None = None) -> dict[str, dict[str, Any]]:
    """uid -> the dashboard's JSON mapping (classic Grafana 11.6 schema), for these parameters."""
    p = params or DashboardParams()
    s = Selectors(p.namespace_label, p.pod_label, p.cluster_label)
    specs = [spec(p, s) for spec in DASHBOARDS]
    return {spec.uid: _build(spec, p, s) for spec in specs}


def render_dashboard_json(dashboard: dict[str, Any]) -> str:
    """Stable text: sorted keys, two-space indent, a trailing newline."""
    return JSONEncoder(sort_keys=True, indent=2, ensure_ascii=False).encode(dashboard) + "\n"
