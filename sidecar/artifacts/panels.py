"""Read a Grafana dashboard's queries and run them as Grafana would, against Prometheus' HTTP API.

Used by ``kv-sidecar dashboards snapshot`` (which draws the panels) and by the tests that run every
panel of the committed dashboards on a real Prometheus. Nothing here needs Grafana:

- :func:`walk_panels` and :func:`queries` list what a dashboard asks Prometheus: each panel target,
  each annotation query and each template-variable query.
- :func:`interpolate` substitutes template variables and the ``$__`` interval macros the way Grafana's
  Prometheus data source does (``public/app/plugins/datasource/prometheus/datasource.ts``,
  ``interpolateQueryExpr``, Grafana 11): a variable that is neither multi-value nor ``includeAll`` is
  inserted as is; otherwise each value is regex-escaped and several values become ``(a|b)``; "All" is
  the variable's ``allValue`` verbatim (ours: ``.*``).
- :class:`PrometheusAPI` is :class:`sidecar.prometheus_api.PrometheusClient` (the report's client: one
  deadline, retry and error rule) answering as Grafana receives it: the JSON ``result`` lists of
  ``/api/v1/query`` and ``/api/v1/query_range``, and ``/api/v1/label/<name>/values``. Its errors are
  :class:`PrometheusError` (re-exported from there).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..prometheus_api import PrometheusClient, range_form
from ..prometheus_api import PrometheusError as PrometheusError  # the snapshot and tests catch it from here

#: Grafana's value for "All" in a URL (``var-pod=$__all``) and in the variable's current value.
ALL = "$__all"


@dataclass(frozen=True)
class Query:
    """One PromQL expression a dashboard sends, and where it comes from."""

    dashboard_uid: str
    kind: str  # "panel", "annotation" or "variable"
    title: str  # panel title, annotation name or variable name
    panel_id: int | None
    ref_id: str
    expr: str
    instant: bool = False
    legend: str = ""

    def where(self) -> str:
        """Human-readable origin for error messages: ``kvcache-pod panel "Usage" (A)``."""
        ref = f" ({self.ref_id})" if self.ref_id else ""
        return f'{self.dashboard_uid} {self.kind} "{self.title}"{ref}'


def walk_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, including the panels inside collapsed rows, in file order."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every Prometheus query of the dashboard: panel targets, annotations, then variables."""
    uid = dashboard.get("uid", "")
    for panel in walk_panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield Query(
                    uid,
                    "panel",
                    panel.get("title", ""),
                    panel.get("id"),
                    target.get("refId", ""),
                    target["expr"],
                    instant=bool(target.get("instant")) and not target.get("range"),
                    legend=target.get("legendFormat", ""),
                )
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield Query(uid, "annotation", annotation.get("name", ""), None, "", annotation["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            expr = query.get("query", "") if isinstance(query, dict) else (query or "")
            if expr:
                yield Query(uid, "variable", variable.get("name", ""), None, "", expr)


def variables(dashboard: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The dashboard's template variables by name."""
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", []) if "name" in v}


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def label_values_query(expr: str) -> tuple[str | None, str]:
    """``label_values(metric{...}, label)`` -> (series selector or None, label); ValueError otherwise.

    Grafana's Prometheus variable query syntax ("Query variable", Prometheus data source docs).
    """
    m = _LABEL_VALUES.match(expr)
    if not m:
        raise ValueError(f"not a label_values(...) query: {expr!r}")
    return m.group("match"), m.group("label")


_REGEX_SPECIALS = re.compile(r"[$^*{}\[\]'+?.()|]")


def regex_escape(value: str) -> str:
    """Grafana's ``prometheusSpecialRegexEscape``: escape for a regex inside a PromQL string literal."""
    return _REGEX_SPECIALS.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def _format(value: str | Sequence[str], variable: Mapping[str, Any]) -> str:
    values = [value] if isinstance(value, str) else list(value)
    if ALL in values:
        return str(variable.get("allValue") or ".*")
    if not variable.get("multi") and not variable.get("includeAll"):
        return values[0] if values else ""
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate(
    expr: str,
    values: Mapping[str, str | Sequence[str]],
    *,
    interval: str = "1m",
    rate_interval: str = "1m",
    range_: str = "1h",
    dashboard: Mapping[str, Any] | None = None,
) -> str:
    """``expr`` with ``$var``/``${var}``/``[[var]]`` and the ``$__interval``/``$__rate_interval``/``$__range``
    macros substituted. ``dashboard`` gives each variable's multi/includeAll/allValue; without it every
    variable is treated as ours are (multi, includeAll, allValue ``.*``). Unknown variables stay as written."""
    declared = variables(dashboard) if dashboard else {}
    macros = {"__rate_interval": rate_interval, "__interval": interval, "__range": range_}

    def sub(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bracket") or m.group("plain")
        if name in macros:
            return macros[name]
        if name not in values:
            return m.group(0)
        variable = declared.get(name, {"multi": True, "includeAll": True, "allValue": ".*"})
        return _format(values[name], variable)

    pattern = r"\$\{(?P<braced>\w+)\}|\[\[(?P<bracket>\w+)\]\]|\$(?P<plain>\w+)"
    return re.sub(pattern, sub, expr)


class PrometheusAPI(PrometheusClient):
    """The dashboards' view of :class:`sidecar.prometheus_api.PrometheusClient`: answers as Grafana's
    Prometheus data source receives them (the JSON ``result`` lists), for the snapshot and the panel tests.

    Defaults fit a local Prometheus: 10 s a request, and no retry (a caller polling for a series asks again).
    """

    def __init__(self, url: str, timeout: float = 10.0, *, retries: int = 0) -> None:
        super().__init__(url, timeout_s=timeout, retries=retries)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's ``result`` (vector: ``[{"metric": {...}, "value": [t, "v"]}]``); a scalar
        comes back as one series without labels. ``at`` None: the server's now."""
        form = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.data("/api/v1/query", form)
        result = data["result"]
        if data.get("resultType") == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's ``result`` (matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}]``)."""
        return list(self.data("/api/v1/query_range", range_form(expr, start, end, step))["result"])
