"""Every panel of the committed dashboards returns data on a real Prometheus.

The stack of ``stack.py`` (simulated vLLM pods, their sidecars, Prometheus with the fast rules) runs
once per vLLM metric generation (``conftest.py``). For each committed ``dashboards/*.json`` — read
at test time, so a regenerated file is what is tested — every panel target, every annotation query
and every variable query goes through Prometheus' HTTP API as Grafana would send it, with the
template variables substituted three ways:

- ``all``:   every variable "All" (its allValue ``.*``);
- ``one``:   one namespace, model and pod of the stack (vllm-a-0: redeployed, restarted, saturated);
- ``regex``: several values of each, which Grafana sends as ``(a|b)``.

Range targets run as range queries over the stack's lifetime, instant ones as instant queries.
An empty result, a result of NaN only, or an error fails the test; every failure of a dashboard
and mode is listed in one assertion, each naming the dashboard, the panel, the query and the mode.
The dashboards are the same files for every generation: an older vLLM must not blank a panel.

Then, for the current generation, each dashboard is drawn to a PNG (``sidecar.artifacts.snapshot``)
into ``$KV_SIDECAR_TEST_ARTIFACTS`` or ``.test-artifacts/dashboards/``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from stack import CURRENT, MODEL_A, MODEL_B, REPO, Stack

from sidecar.artifacts.panels import ALL, PrometheusError, Query, interpolate, label_values_query, queries
from sidecar.artifacts.params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    DASHBOARD_POD_UID,
    VAR_DATASOURCE,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)
from sidecar.artifacts.snapshot import render_dashboard_png

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DASHBOARDS = REPO / "dashboards"
#: The three dashboards, plus any other committed one (it must pass too).
UIDS = sorted(
    {DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID, DASHBOARD_CAPACITY_UID} | {p.stem for p in DASHBOARDS.glob("*.json")}
)

#: Variable values per substitution mode (the datasource variable is not part of any expression).
MODES: dict[str, dict[str, str | list[str]]] = {
    "all": {VAR_NAMESPACE: ALL, VAR_MODEL_NAME: ALL, VAR_POD: ALL},
    "one": {VAR_NAMESPACE: "team-a", VAR_MODEL_NAME: MODEL_A, VAR_POD: "vllm-a-0"},
    "regex": {
        VAR_NAMESPACE: ["team-a", "team-b"],
        VAR_MODEL_NAME: [MODEL_A, MODEL_B],
        VAR_POD: ["vllm-a-0", "vllm-a-1"],
    },
}
#: Grafana's macros for a 1 s scrape interval: $__interval (and the step), and $__rate_interval =
#: max($__interval + scrape interval, 4 x scrape interval).
INTERVAL_S, RATE_INTERVAL = 2, "4s"


def dashboard_id(uid: str) -> str:
    return uid.removeprefix("kvcache-")


def load(uid: str) -> dict[str, Any]:
    path = DASHBOARDS / f"{uid}.json"
    assert path.is_file(), f"{path} is missing: run `make generate`"
    dashboard: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return dashboard


@dataclass(frozen=True)
class Window:
    """The time range the queries cover: the stack's whole life so far."""

    start: float
    end: float

    @classmethod
    def of(cls, stack: Stack) -> Window:
        return cls(stack.started, time.time())

    def macros(self) -> dict[str, str]:
        return {
            "interval": f"{INTERVAL_S}s",
            "rate_interval": RATE_INTERVAL,
            "range_": f"{math.ceil(self.end - self.start)}s",
        }


def _values(series: dict[str, Any]) -> list[str]:
    return [series["value"][1]] if "value" in series else [v for _, v in series.get("values", [])]


def problem(stack: Stack, expr: str, window: Window, *, instant: bool) -> str | None:
    """Why ``expr`` shows nothing (None when it returns data): an error, no series, or NaN only."""
    try:
        if instant:
            result = stack.api.query(expr, at=window.end)
        else:
            result = stack.api.query_range(expr, window.start, window.end, INTERVAL_S)
    except PrometheusError as e:
        return f"error: {e}"
    if not result:
        return "no data"
    if all(v.lower() == "nan" for s in result for v in _values(s)):
        return "only NaN"
    return None


#: ``... or vector(0)``: a stat that reads 0 rather than "No data". It always returns data, so the
#: expression before it must have had data at some time of the stack's life too.
ZERO_FALLBACK = re.compile(r"\s*\bor\s+vector\s*\(\s*0\s*\)\s*$")


def fallback_problem(stack: Stack, expr: str, window: Window) -> str | None:
    """For ``X or vector(0)``: why X had no data over the whole window (None when it had, or no fallback)."""
    inner = ZERO_FALLBACK.sub("", expr)
    if inner == expr:
        return None
    why = problem(stack, inner, window, instant=False)
    return f"only its `or vector(0)` fallback: {inner} had {why} over the stack's life" if why else None


def failure(q: Query, mode: str, expr: str, why: str) -> str:
    kind = "instant" if q.instant else "range"
    return f"{q.where()} [{mode}, {kind}]: {why}\n      {' '.join(expr.split())}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("uid", UIDS, ids=dashboard_id)
def test_every_panel_and_annotation_returns_data(stack: Stack, uid: str, mode: str) -> None:
    dashboard = load(uid)
    window = Window.of(stack)
    values = {**MODES[mode], VAR_DATASOURCE: "prometheus"}
    checked, failures = 0, []
    for q in queries(dashboard):
        if q.kind == "variable":
            continue  # label_values(...) is no PromQL: test_variable_queries_return_the_stacks_values
        expr = interpolate(q.expr, values, dashboard=dashboard, **window.macros())
        checked += 1
        why = problem(stack, expr, window, instant=q.instant) or fallback_problem(stack, expr, window)
        if why:
            failures.append(failure(q, mode, expr, why))
    assert checked, f"{uid} has no panel or annotation query"
    assert not failures, (
        f"{len(failures)} of {checked} queries of {uid} returned nothing on the {stack.generation} stack "
        f"(variables {mode}: {MODES[mode]}):\n" + "\n".join(failures)
    )


def _pod_values(stack: Stack) -> list[dict[str, str]]:
    """Each pod's value of every variable (the variables are named like the labels they select)."""
    return [{VAR_NAMESPACE: p.namespace, VAR_MODEL_NAME: p.model_name, VAR_POD: p.name} for p in stack.pods]


def _selects(value: str | Sequence[str], actual: str) -> bool:
    chosen = [value] if isinstance(value, str) else list(value)
    return ALL in chosen or actual in chosen


def expected_values(stack: Stack, match: str | None, label: str, mode: Mapping[str, str | Sequence[str]]) -> set[str]:
    """The stack's values of ``label`` on the pods selected by the variables ``match`` refers to."""
    used = [name for name in mode if match and re.search(rf"\$\{{?{name}\b", match)]
    pods = [pod for pod in _pod_values(stack) if all(_selects(mode[name], pod[name]) for name in used)]
    return {pod[label] for pod in pods}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("uid", UIDS, ids=dashboard_id)
def test_variable_queries_return_the_stacks_values(stack: Stack, uid: str, mode: str) -> None:
    """Each ``label_values(selector, label)`` through /api/v1/label/<label>/values?match[]=selector."""
    dashboard = load(uid)
    variables = [q for q in queries(dashboard) if q.kind == "variable"]
    assert {q.title for q in variables} >= {VAR_NAMESPACE, VAR_MODEL_NAME, VAR_POD}, f"{uid}: chained variables"
    failures = []
    for q in variables:
        match, label = label_values_query(q.expr)
        selector = interpolate(match, MODES[mode], dashboard=dashboard) if match else None
        want = expected_values(stack, match, label, MODES[mode])
        try:
            got = set(stack.api.label_values(label, match=selector))
        except PrometheusError as e:
            failures.append(f"{q.where()} [{mode}]: error: {e}\n      label_values({selector}, {label})")
            continue
        if got != want:
            failures.append(
                f"{q.where()} [{mode}]: {sorted(got)}, expected {sorted(want)}\n      label_values({selector}, {label})"
            )
    assert not failures, f"variable queries of {uid} on the {stack.generation} stack:\n" + "\n".join(failures)


#: The values each picture is drawn with: the fleet and capacity views of everything, the pod view
#: of the pod that has it all.
PICTURE_VALUES = {DASHBOARD_POD_UID: MODES["one"]}


@pytest.mark.parametrize("stack", [CURRENT], indirect=True)
def test_dashboards_are_drawn_to_png(stack: Stack, artifact_dir: Path) -> None:
    written = []
    for uid in UIDS:
        values = PICTURE_VALUES.get(uid, MODES["all"])
        path = render_dashboard_png(
            load(uid), stack.api, values, stack.started, time.time(), artifact_dir / f"{uid}.png"
        )
        assert path.is_file() and path.stat().st_size > 0, f"{uid}: no PNG at {path}"
        written.append(str(path))
    print("\ndashboard pictures:\n  " + "\n  ".join(written))
