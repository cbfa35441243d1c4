"""Draw a Grafana dashboard as one PNG from a real Prometheus: ``kv-sidecar dashboards snapshot``.

No Grafana runs here (nor in CI), so this is how a person looks at what the dashboards show:
every panel is queried as Grafana would query it (:mod:`..panels`: the same variables, the same
``$__interval``/``$__rate_interval``/``$__range``) and drawn with matplotlib where Grafana would
put it on its 24-column grid, in a dark, Grafana-like look:

- ``row`` panels are section headers; the panels of a collapsed row are drawn expanded below it,
  and everything further down moves down to make room (what Grafana does when a row is opened);
- ``timeseries``: one line per series, the legend from the target's ``legendFormat``, stacked when
  the panel stacks, threshold lines when the panel draws them, the y axis in the panel's unit (a
  second one on the right for the series an ``axisPlacement: right`` override puts there), and
  the dashboard's annotations (restarts, configuration changes, alerts) as vertical marks;
- ``stat``: the last value, in the panel's unit, coloured by its thresholds;
- ``table``: the first rows of the instant results, one column per label and per query value
  (the ``merge``, ``convertFieldType``, ``filterFieldsByName`` and ``organize`` transformations);
- any other type: its title and "(type not rendered)".

A query that fails or returns nothing draws "no data" in its panel (with the reason), so the picture
shows the gap; :class:`Snapshot` also records each panel's outcome for tests. matplotlib is an
optional dependency (the ``dashboards`` extra): only making a :class:`~.canvas.Canvas` imports it.

One concern per module, in the order a picture is made:

==================  ==========================================================================
``cli``             the command: flags, their checks, one PNG per dashboard file
``dashboard``       one dashboard to one PNG: place, fetch, paint each panel, record outcomes
``layout``          Grafana's 24-column grid in pixels; collapsed rows drawn open
``data``            the panel's queries run as Grafana runs them; annotations as marks
``fields``          field config: defaults, thresholds, value mappings, overrides, colours
``table``           a table panel's rows through Grafana's transformations (pure)
``units``           values as Grafana shows them in a unit (``87.3%``, ``2 hours``, ``3 GiB``)
``colors``          Grafana's dark theme, named colours and series palette
``canvas``          the matplotlib figure in pixels from the top left; the atomic PNG write
``timeseries``      the time series painter (lines, stacks, thresholds, axes, legend)
``drawing``         the other painters: stat, table, row header, "No data", header and footer
==================  ==========================================================================

The names below are the package's public face (the ``dashboards`` command and the tests use them).
"""

from __future__ import annotations

from .cli import add_snapshot_arguments, snapshot_command
from .dashboard import PanelStatus, Snapshot, render_dashboard
from .layout import COLUMN_PX, FOOTER_PX, GRID_COLUMNS, HEADER_PX, ROW_PX, layout

__all__ = [
    "COLUMN_PX",
    "FOOTER_PX",
    "GRID_COLUMNS",
    "HEADER_PX",
    "ROW_PX",
    "PanelStatus",
    "Snapshot",
    "add_snapshot_arguments",
    "layout",
    "render_dashboard",
    "snapshot_command",
]
