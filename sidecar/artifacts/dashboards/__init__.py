"""The Grafana dashboards, built as code with Grafana's typed builders (``grafana-foundation-sdk``).

Three dashboards answer the on-call questions in order, one row per question (:data:`ROW_TITLES`): is any
pod about to fill, how many tokens are left and how fast they go, is it preempting, what to change.
One module per dashboard, on a small kit:

- :mod:`.fleet`: **KV cache / Fleet** (``kvcache-overview``), the page most alerts open;
- :mod:`.pod`: **KV cache / Pod** (``kvcache-pod``), one pod's pool, trend, queues and latency;
- :mod:`.capacity`: **KV cache / Capacity planning** (``kvcache-capacity``), a week per model from the
  recording rules of :func:`sidecar.artifacts.rules.recording_rules`;
- the kit: :mod:`.inputs` (:class:`DashboardParams`, titles, rows), :mod:`.panel_kit` (Graph, Stat,
  Table), :mod:`.display` (units, value mappings, threshold colours), :mod:`.promql` (selectors,
  grouping, legends), :mod:`.frame` (variables, annotations, links) and :mod:`.assemble` (specs -> JSON).

The panels chart the sidecar's ``kvcache_*`` series (docs/metrics.md), which keep their names across
vLLM's metric renames; only the users' panels and the restart annotation read vLLM's own series.
Thresholds come from the same ``thresholds:`` section as the alerts and the sidecar's gauges, so the
lines drawn are the ones that page (numbers and percentages written by :mod:`sidecar.artifacts.formatting`,
as the rules write them). Label names of Prometheus' discovery are parameters (:class:`DashboardParams`,
kube-prometheus defaults).

Pure: :func:`build_dashboards` maps the parameters to the dashboards' JSON mappings and
:func:`render_dashboard_json` to stable text (``make generate`` commits ``dashboards/*.json``; a test
keeps them equal). The SDK (an optional dependency, the ``dashboards`` extra) is imported only in this
package, and only the ``kv-sidecar dashboards`` command and the generator import it.
"""

from __future__ import annotations

from .assemble import build_dashboards, render_dashboard_json
from .display import TIME_UNTIL_GRAPH_CAP_S, TIME_UNTIL_GRAPH_FLOOR_S, TIME_UNTIL_STAT_CAP_S, TOKENS_PER_S
from .fleet import INHIBIT_EQUAL_OTHER, INHIBIT_SOURCES, INHIBIT_TARGETS
from .frame import ANNOTATION_FALLBACK_KEYS
from .inputs import ROW_TITLES, TAG, TITLES, USERS_ROW_TITLE, VAR_CLUSTER, DashboardParams

__all__ = [
    "ANNOTATION_FALLBACK_KEYS",
    "INHIBIT_EQUAL_OTHER",
    "INHIBIT_SOURCES",
    "INHIBIT_TARGETS",
    "ROW_TITLES",
    "TAG",
    "TIME_UNTIL_GRAPH_CAP_S",
    "TIME_UNTIL_GRAPH_FLOOR_S",
    "TIME_UNTIL_STAT_CAP_S",
    "TITLES",
    "TOKENS_PER_S",
    "USERS_ROW_TITLE",
    "VAR_CLUSTER",
    "DashboardParams",
    "build_dashboards",
    "render_dashboard_json",
]
