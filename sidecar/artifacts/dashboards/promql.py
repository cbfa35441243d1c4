"""PromQL pieces of the panels: selectors filtered by the template variables, grouping and legends.

Every panel selects its series through :class:`Selectors`, so the chain cluster -> namespace ->
model_name -> pod filters each query the same way, with the label names of Prometheus' discovery
(:class:`~sidecar.artifacts.dashboards.inputs.DashboardParams`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..params import VAR_MODEL_NAME, VAR_NAMESPACE, VAR_POD
from .display import TIME_UNTIL_GRAPH_CAP_S, TIME_UNTIL_GRAPH_FLOOR_S
from .inputs import VAR_CLUSTER


@dataclass(frozen=True)
class Selectors:
    """Series selectors filtered by the template variables, with the configured label names."""

    ns: str
    pod: str
    cluster: str = "cluster"

    def engine(self, *extra: str) -> str:
        """An engine series of the sidecar (or of vLLM): cluster, namespace, model and pod."""
        return self._matchers(self._ns(), f'model_name=~"${VAR_MODEL_NAME}"', self._pod(), *extra)

    def pod_only(self, *extra: str) -> str:
        """A series without ``model_name`` (the sidecar's own health, a process): cluster, namespace and pod."""
        return self._matchers(self._ns(), self._pod(), *extra)

    def model(self, *extra: str) -> str:
        """A namespace/model recording rule: cluster, namespace and model."""
        return self._matchers(self._ns(), f'model_name=~"${VAR_MODEL_NAME}"', *extra)

    def namespace(self, *extra: str) -> str:
        """Any series of the selected namespaces (an alert): cluster and namespace."""
        return self._matchers(self._ns(), *extra)

    def _ns(self) -> str:
        return f'{self.cluster}=~"${VAR_CLUSTER}", {self.ns}=~"${VAR_NAMESPACE}"'

    def _pod(self) -> str:
        return f'{self.pod}=~"${VAR_POD}"'

    @staticmethod
    def _matchers(*matchers: str) -> str:
        return "{" + ", ".join(matchers) + "}"


def by_labels(*labels: str) -> str:
    """``by (a, b)``: the grouping clause of an aggregation."""
    return f"by ({', '.join(labels)})"


def legend_format(*labels: str) -> str:
    """``{{a}}/{{b}}``: a legend naming each series by these labels."""
    return "/".join("{{" + label + "}}" for label in labels)


def clamped_time_until(expr: str) -> str:
    """A time until full/watermark for a log axis: at least a minute (0 = full now), at most the cap (not filling)."""
    return f"clamp({expr}, {TIME_UNTIL_GRAPH_FLOOR_S}, {TIME_UNTIL_GRAPH_CAP_S})"
