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
A query fails when:

- it errors, returns no series, or only NaN;
- ``or`` fallbacks: for every top-level ``A or B`` (``or`` outside parentheses, brackets, braces and
  strings; PromQL's ``or`` binds loosest, so these are the expression's alternatives), the first
  branch A must have had data over the stack's life on the current generation — a fallback such as
  ``or vector(0)`` must not hide a broken main query — and every branch must have had data on at
  least one generation (``test_every_or_branch_had_data_on_some_generation``, after all stacks ran);
- pods: when the result carries a ``pod`` label (the query keeps the pod: a plain selector or
  ``by (..., pod)``), every pod the variables select must have a series with a non-NaN value in it —
  the pods of the selected namespace(s) and model(s) (for the variables the query uses), e.g.
  ``all``: the 4 pods, ``one``: vllm-a-0, ``regex``: vllm-a-0 and vllm-a-1. Exempt are queries that
  legitimately show only some pods: those filtering by a comparison (``> 0``, not ``> bool``),
  ``topk``/``bottomk``/``limitk``, ``ALERTS``, and the panels of ``SOME_PODS_ONLY`` (each with its
  reason). A legend naming ``{{pod}}`` on series without a ``pod`` label fails too. The rule is
  deterministic on this stack: every pod's sidecar exports its gauges and counters from its first
  scrape, and ``wait_for_signals`` waits until every pod has its advice gauges.

Every failure of a dashboard and mode is listed in one assertion, each naming the dashboard, the
panel, the query, the mode and the generation. The dashboards are the same files for every
generation: an older vLLM must not blank a panel.

Then, for the current generation, each dashboard is drawn to a PNG (``sidecar.artifacts.snapshot``)
into ``$KV_SIDECAR_TEST_ARTIFACTS`` or ``.test-artifacts/dashboards/``: a PNG of the grid's size,
no panel in error, and only the panels of ``LEGITIMATELY_EMPTY`` may be drawn without data.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from stack import CURRENT, GENERATIONS, MODEL_A, MODEL_B, REPO, Stack

from sidecar.artifacts.dashboards import VAR_CLUSTER
from sidecar.artifacts.dashboards.workload import FLAG_COLUMN, WORKLOAD_NOW_TABLE_TITLE, WORKLOAD_TABLE_TITLE
from sidecar.artifacts.panels import (
    ALL,
    PrometheusError,
    Query,
    interpolate,
    label_values_query,
    queries,
    walk_panels,
)
from sidecar.artifacts.params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    DASHBOARD_POD_UID,
    VAR_DATASOURCE,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)
from sidecar.artifacts.snapshot import COLUMN_PX, FOOTER_PX, GRID_COLUMNS, HEADER_PX, ROW_PX, layout, render_dashboard

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DASHBOARDS = REPO / "dashboards"
#: The three dashboards, plus any other committed one (it must pass too).
UIDS = sorted(
    {DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID, DASHBOARD_CAPACITY_UID} | {p.stem for p in DASHBOARDS.glob("*.json")}
)

#: Variable values per substitution mode (the datasource variable is not part of any expression).
#: The stack has no cluster label (one Prometheus, no external labels): the cluster variable is "All"
#: in every mode, as Grafana leaves it when label_values finds no value.
MODES: dict[str, dict[str, str | list[str]]] = {
    "all": {VAR_CLUSTER: ALL, VAR_NAMESPACE: ALL, VAR_MODEL_NAME: ALL, VAR_POD: ALL},
    "one": {VAR_CLUSTER: ALL, VAR_NAMESPACE: "team-a", VAR_MODEL_NAME: MODEL_A, VAR_POD: "vllm-a-0"},
    "regex": {
        VAR_CLUSTER: ALL,
        VAR_NAMESPACE: ["team-a", "team-b"],
        VAR_MODEL_NAME: [MODEL_A, MODEL_B],
        VAR_POD: ["vllm-a-0", "vllm-a-1"],
    },
}
#: Grafana's macros for a 1 s scrape interval: $__interval (and the step), and $__rate_interval =
#: max($__interval + scrape interval, 4 x scrape interval).
INTERVAL_S, RATE_INTERVAL = 2, "4s"

#: (dashboard uid, panel title) -> why the panel shows only some of the selected pods.
SOME_PODS_ONLY: dict[tuple[str, str], str] = {
    (DASHBOARD_POD_UID, "Sidecar scrape errors"): "an error counter exists only once that pod's scrapes failed",
    (DASHBOARD_POD_UID, "Burst headroom: free KV ÷ the last hour's largest one-minute rise"): (
        "absent for forecast.window and a minute after each engine start, restart or sidecar redeploy "
        "(docs/forecast.md): a pod that restarted within that time has none yet in the window"
    ),
}

#: (dashboard uid, panel title, ref id) -> (the generations whose stack exports what the target charts, why
#: the others have nothing to chart). On those generations the target must return data like any other; on
#: the others it may return no series, but an error still fails. vLLM without the family blanks the panel
#: honestly ("No data"), which its description says.
ONLY_WHERE_EXPORTED: dict[tuple[str, str, str], tuple[frozenset[str], str]] = {
    (DASHBOARD_POD_UID, "Admission rejections per second", "A"): (
        frozenset({CURRENT}),
        "vllm:admission_rejections_total is new in vLLM 0.32 (the simulator's v1-capacity-labels generation)",
    ),
    (DASHBOARD_OVERVIEW_UID, "Failed and rejected requests by model", "B"): (
        frozenset({CURRENT}),
        "vllm:admission_rejections_total is new in vLLM 0.32 (the simulator's v1-capacity-labels generation)",
    ),
    (DASHBOARD_POD_UID, "KV offload tier usage (CPU)", "A"): (
        frozenset(),
        "the stack's vLLM has no offload tier (no --kv-offloading-size: no vllm:kv_offload_* family); "
        "test_offload_and_rejection_panels.py proves the query on the sidecar's series",
    ),
    (DASHBOARD_POD_UID, "Preemptions per second by reason", "A"): (
        frozenset(),
        "no released vLLM exports vllm:num_preemptions_by_reason (vLLM PR #58037); "
        "test_preemptions_by_reason_panel.py proves the query on the sidecar's series",
    ),
}

#: (dashboard uid, panel title prefix, column) -> why the target's top-level ``or`` branches are outcomes, not
#: fallbacks: the memory setting of the workload advice is a value where it can be computed and otherwise a
#: code its value mapping reads as words (no GPU memory exported, replicas on different pools,
#: --kv-cache-memory-bytes, no null block). The stack runs one pool per workload, so only some outcomes
#: occur on it; tests/dashboards/test_workload_advice.py gives each workload of its history its outcome on a
#: real Prometheus (the value to the report's digit, and the words). The whole expression must still return data.
OR_OUTCOMES: dict[tuple[str, str, str], str] = {
    (uid, title, FLAG_COLUMN): "a value, or the words saying why there is none (dashboards/README.md)"
    for uid, title in (
        (DASHBOARD_OVERVIEW_UID, WORKLOAD_NOW_TABLE_TITLE),
        (DASHBOARD_CAPACITY_UID, WORKLOAD_TABLE_TITLE),
    )
}


def _or_outcomes(q: Query, dashboard: Mapping[str, Any]) -> bool:
    """Whether the target's ``or`` branches are :data:`OR_OUTCOMES` (its column named by the table's organize)."""
    for panel in walk_panels(dashboard):
        if panel.get("title") != q.title:
            continue
        renames = next(
            (t["options"].get("renameByName", {}) for t in panel.get("transformations", []) if t["id"] == "organize"),
            {},
        )
        column = renames.get(f"Value #{q.ref_id}", "")
        return any(q.title.startswith(t) and column == c for u, t, c in OR_OUTCOMES if u == q.dashboard_uid)
    return False


#: (dashboard uid, panel title) -> why the picture may show the panel without data.
LEGITIMATELY_EMPTY: dict[tuple[str, str], str] = {
    (DASHBOARD_POD_UID, "KV offload tier usage (CPU)"): ONLY_WHERE_EXPORTED[
        (DASHBOARD_POD_UID, "KV offload tier usage (CPU)", "A")
    ][1],
    (DASHBOARD_POD_UID, "Preemptions per second by reason"): ONLY_WHERE_EXPORTED[
        (DASHBOARD_POD_UID, "Preemptions per second by reason", "A")
    ][1],
}


def test_every_exemption_names_a_target_of_the_dashboards() -> None:
    """A renamed panel must not leave its exemption behind (nor exempt a panel it no longer names)."""
    targets = {(q.dashboard_uid, q.title, q.ref_id) for uid in UIDS for q in queries(load(uid)) if q.kind == "panel"}
    assert set(ONLY_WHERE_EXPORTED) <= targets, sorted(set(ONLY_WHERE_EXPORTED) - targets)
    panels = {(uid, title) for uid, title, _ in targets}
    assert set(LEGITIMATELY_EMPTY) | set(SOME_PODS_ONLY) <= panels


def not_exported_here(q: Query, generation: str) -> str | None:
    """Why the target has nothing to chart on this generation's stack (None: it must return data)."""
    exported, why = ONLY_WHERE_EXPORTED.get((q.dashboard_uid, q.title, q.ref_id), (None, ""))
    return why if exported is not None and generation not in exported else None


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


def _has_number(series: dict[str, Any]) -> bool:
    return any(v.lower() != "nan" for v in _values(series))


def run(stack: Stack, expr: str, window: Window, *, instant: bool) -> list[dict[str, Any]]:
    """The result of ``expr``: instant at the window's end, or a range query over the window."""
    if instant:
        return stack.api.query(expr, at=window.end)
    return stack.api.query_range(expr, window.start, window.end, INTERVAL_S)


def problem(stack: Stack, expr: str, window: Window, *, instant: bool) -> str | None:
    """Why ``expr`` shows nothing (None when it returns data): an error, no series, or NaN only."""
    try:
        result = run(stack, expr, window, instant=instant)
    except PrometheusError as e:
        return f"error: {e}"
    if not result:
        return "no data"
    if not any(_has_number(s) for s in result):
        return "only NaN"
    return None


# --- top-level `or` --------------------------------------------------------------------------------

_OPENING, _CLOSING = "([{", ")]}"
#: the keyword, not part of a metric or label name (`_` and `:` are name characters)
_OR = re.compile(r"(?<![\w:])or(?![\w:])")
#: the vector-matching modifier that may follow `or`: `or on (pod) B`, `or ignoring (reason) B`
_MATCHING = re.compile(r"^\s*(?:on|ignoring)\s*\([^)]*\)")


def top_level(expr: str) -> str:
    """``expr`` with everything inside brackets, string literals and comments blanked out (same length),
    so what is left is the expression's top level."""
    out, depth, quote, i = [], 0, "", 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\" and quote != "`":  # an escape: skip the escaped character too
                out.append(" " * len(expr[i : i + 2]))
                i += 2
                continue
            quote = "" if c == quote else quote
        elif c in "\"'`":
            quote = c
        elif c == "#":  # a comment runs to the end of the line
            end = expr.find("\n", i)
            end = len(expr) if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        elif c in _OPENING:
            depth += 1
        elif c in _CLOSING:
            depth -= 1
        out.append(c if depth == 0 and not quote and c not in _CLOSING + "\"'`" else " ")
        i += 1
    return "".join(out)


def or_branches(expr: str) -> list[str]:
    """The alternatives of a top-level ``A or B or ...`` (matching modifiers dropped); [expr] without one."""
    cuts = [m.span() for m in _OR.finditer(top_level(expr))]
    starts = [0] + [end for _, end in cuts]
    ends = [start for start, _ in cuts] + [len(expr)]
    branches = [expr[a:b] for a, b in zip(starts, ends, strict=True)]
    return [branches[0].strip()] + [_MATCHING.sub("", b).strip() for b in branches[1:]]


def test_or_branches_split_only_at_the_top_level() -> None:
    assert or_branches("count(x > 0.9) or vector(0)") == ["count(x > 0.9)", "vector(0)"]
    assert or_branches('a{reason="or"} / b\nor on (pod)\nlabel_replace(c, "x", "or", "", "")') == [
        'a{reason="or"} / b',
        'label_replace(c, "x", "or", "", "")',
    ]
    assert or_branches("sum by (le) (rate(a[1m]) or rate(b[1m]))") == ["sum by (le) (rate(a[1m]) or rate(b[1m]))"]
    assert or_branches("kvcache_or_total or ignoring(reason) vllm:or # or not\n or c") == [
        "kvcache_or_total",
        "vllm:or # or not",
        "c",
    ]


#: (dashboard uid, where in it, mode, branch index)
BranchKey = tuple[str, str, str, int]


@dataclass
class OrBranches:
    """What each top-level ``or`` branch showed, per generation: its PromQL and why it had no data (None:
    it had), and the generations on whose stack the panel queries ran."""

    shown: dict[BranchKey, dict[str, tuple[str, str | None]]] = field(default_factory=dict)
    generations: set[str] = field(default_factory=set)

    def record(self, key: BranchKey, generation: str, branch: str, why: str | None) -> None:
        self.shown.setdefault(key, {})[generation] = (branch, why)

    def dead(self) -> list[str]:
        """The branches that had no data on any generation, each with its PromQL."""
        out = []
        for (_uid, where, mode, i), per_generation in sorted(self.shown.items()):
            whys = {why for _, why in per_generation.values()}
            if None not in whys:
                branch = next(iter(per_generation.values()))[0]
                out.append(
                    f"{where} [{mode}] branch {i + 1}: no data on any generation ({', '.join(sorted(whys))})\n"
                    f"      {' '.join(branch.split())}"
                )
        return out


@pytest.fixture(scope="session")
def or_branches_seen() -> OrBranches:
    return OrBranches()


def fallback_problem(stack: Stack, q: Query, mode: str, expr: str, window: Window, seen: OrBranches) -> str | None:
    """Records whether each branch of a top-level ``or`` had data over the stack's life; on the current
    generation, why the first branch had none (None when it had, or there is no ``or``)."""
    branches = or_branches(expr)
    if len(branches) < 2:
        return None
    whys = [problem(stack, branch, window, instant=False) for branch in branches]
    for i, (branch, why) in enumerate(zip(branches, whys, strict=True)):
        seen.record((q.dashboard_uid, q.where(), mode, i), stack.generation, branch, why)
    if stack.generation == CURRENT and (first := whys[0]):
        return f"only its `or` fallback: the first branch had {first} over the stack's life\n      A: {branches[0]}"
    return None


# --- every selected pod ------------------------------------------------------------------------------

_FILTERS = re.compile(r"\b(?:topk|bottomk|limitk|limit_ratio)\s*\(|\bALERTS\b")
#: a comparison that drops series (`> 0`), not one returning 0/1 (`> bool 0`); label matchers are in braces
_COMPARISON = re.compile(r"(?:==|!=|>=|<=|>|<)(?!\s*bool\b)")


def _outside_braces_and_strings(expr: str) -> str:
    out, depth, quote = [], 0, ""
    for c in expr:
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def shows_some_pods_only(q: Query) -> str | None:
    """Why the query legitimately shows only some of the selected pods (None: it must show them all)."""
    if reason := SOME_PODS_ONLY.get((q.dashboard_uid, q.title)):
        return reason
    if _FILTERS.search(q.expr):
        return "filtered (topk/ALERTS)"
    if _COMPARISON.search(_outside_braces_and_strings(q.expr)):
        return "filtered by a comparison"
    return None


def test_only_filtering_queries_may_show_some_pods() -> None:
    def some_only(expr: str, title: str = "t") -> bool:
        return shows_some_pods_only(Query(DASHBOARD_POD_UID, "panel", title, 1, "A", expr)) is not None

    assert not some_only('kvcache_usage_ratio{pod=~"$pod", reason!="none"}')
    assert not some_only('sum by (pod) (a{x=">"}) * ignoring (reason) (b > bool 0.9)')
    assert some_only("count(max by (namespace, pod) (kvcache_usage_ratio) > 0.9) or vector(0)")
    assert some_only('ALERTS{alertname=~"KVCache.*"}')
    assert some_only("topk(3, kvcache_usage_ratio)")
    assert some_only("kvcache_usage_ratio", title="Sidecar scrape errors")


def pod_problem(stack: Stack, q: Query, mode: str, expr: str, window: Window) -> str | None:
    """Why the result lacks a pod the variables select (None when it has them all, or needs not)."""
    if q.kind != "panel" or shows_some_pods_only(q):
        return None
    result = run(stack, expr, window, instant=q.instant)
    per_pod = [s for s in result if "pod" in s["metric"]]
    if not per_pod:
        return "the legend names {{pod}} but no series has a pod label" if "{{pod}}" in q.legend else None
    shown = {s["metric"]["pod"] for s in per_pod if _has_number(s)}
    missing = expected_values(stack, q.expr, VAR_POD, MODES[mode]) - shown
    return f"no data for the selected pods {sorted(missing)} (shown: {sorted(shown)})" if missing else None


def failure(q: Query, mode: str, generation: str, expr: str, why: str) -> str:
    kind = "instant" if q.instant else "range"
    return f"{q.where()} [{mode}, {kind}, {generation}]: {why}\n      {' '.join(expr.split())}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("uid", UIDS, ids=dashboard_id)
def test_every_panel_and_annotation_returns_data(
    stack: Stack, uid: str, mode: str, or_branches_seen: OrBranches
) -> None:
    dashboard = load(uid)
    window = Window.of(stack)
    values = {**MODES[mode], VAR_DATASOURCE: "prometheus"}
    checked, failures = 0, []
    for q in queries(dashboard):
        if q.kind == "variable":
            continue  # label_values(...) is no PromQL: test_variable_queries_return_the_stacks_values
        expr = interpolate(q.expr, values, dashboard=dashboard, **window.macros())
        checked += 1
        why = problem(stack, expr, window, instant=q.instant)
        if why == "no data" and not_exported_here(q, stack.generation):
            continue
        seen = or_branches_seen
        why = (
            why
            or (None if _or_outcomes(q, dashboard) else fallback_problem(stack, q, mode, expr, window, seen))
            or pod_problem(stack, q, mode, expr, window)
        )
        if why:
            failures.append(failure(q, mode, stack.generation, expr, why))
    or_branches_seen.generations.add(stack.generation)
    assert checked, f"{uid} has no panel or annotation query"
    assert not failures, (
        f"{len(failures)} of {checked} queries of {uid} failed on the {stack.generation} stack "
        f"(variables {mode}: {MODES[mode]}):\n" + "\n".join(failures)
    )


def _pod_values(stack: Stack) -> list[dict[str, str]]:
    """Each pod's value of every variable (the variables are named like the labels they select)."""
    return [{VAR_NAMESPACE: p.namespace, VAR_MODEL_NAME: p.model_name, VAR_POD: p.name} for p in stack.pods]


def _selects(value: str | Sequence[str], actual: str | None) -> bool:
    chosen = [value] if isinstance(value, str) else list(value)
    return ALL in chosen or actual in chosen


def expected_values(stack: Stack, match: str | None, label: str, mode: Mapping[str, str | Sequence[str]]) -> set[str]:
    """The stack's values of ``label`` on the pods selected by the variables ``match`` refers to."""
    used = [name for name in mode if match and re.search(rf"\$\{{?{name}\b", match)]
    pods = [pod for pod in _pod_values(stack) if all(_selects(mode[name], pod.get(name)) for name in used)]
    return {pod[label] for pod in pods if label in pod}  # no pod has a cluster label: no cluster value


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


@pytest.mark.parametrize("stack", [CURRENT], indirect=True)
def test_all_clusters_matches_series_without_a_cluster_label(stack: Stack) -> None:
    """The cluster variable's "All" (``.*``) selects the series of a Prometheus that has no cluster label:
    a matcher that matches the empty string also selects series without the label (Prometheus docs,
    "Querying basics", time series selectors), while a value (``.+``) selects none of them."""
    plain = stack.api.query("kvcache_usage_ratio")
    assert plain and not any(VAR_CLUSTER in s["metric"] for s in plain), "the stack has a cluster label"
    every = stack.api.query(f'kvcache_usage_ratio{{{VAR_CLUSTER}=~".*"}}')
    assert sorted(map(str, (s["metric"] for s in every))) == sorted(map(str, (s["metric"] for s in plain)))
    assert stack.api.query(f'kvcache_usage_ratio{{{VAR_CLUSTER}=~".+"}}') == []


#: The values each picture is drawn with: the fleet and capacity views of everything, the pod view
#: of the pod that has it all.
PICTURE_VALUES = {DASHBOARD_POD_UID: MODES["one"]}


def expected_png_size(dashboard: dict[str, Any]) -> tuple[int, int]:
    """The picture of the whole grid: 24 columns, the rows of the lowest panel, header and footer."""
    rows = max(p.y + p.h for p in layout(dashboard))
    return GRID_COLUMNS * COLUMN_PX, HEADER_PX + rows * ROW_PX + FOOTER_PX


@pytest.mark.parametrize("stack", [CURRENT], indirect=True)
def test_dashboards_are_drawn_to_png(stack: Stack, artifact_dir: Path) -> None:
    failures, written = [], []
    for uid in UIDS:
        dashboard = load(uid)
        values = PICTURE_VALUES.get(uid, MODES["all"])
        snap = render_dashboard(dashboard, stack.api, values, stack.started, time.time(), artifact_dir / f"{uid}.png")
        written.append(f"{snap.path}: {snap.summary()}")
        with Image.open(snap.path) as im:
            assert (im.format, im.size) == ("PNG", expected_png_size(dashboard)), f"{uid}: {snap.path}"
        assert snap.path.stat().st_size > 20_000, f"{uid}: {snap.path} is too small to show the panels"
        assert len(snap.panels) == sum(1 for _ in walk_panels(dashboard)), f"{uid}: not every panel drawn"
        for p in snap.panels:
            if p.status == "error" or (p.status == "no data" and (uid, p.title) not in LEGITIMATELY_EMPTY):
                failures.append(f'{uid} panel "{p.title}" [{values}]: drawn as {p.status}: {p.detail}')
    print("\ndashboard pictures:\n  " + "\n  ".join(written))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("stack", [GENERATIONS[-1]], indirect=True)
def test_every_or_branch_had_data_on_some_generation(stack: Stack, or_branches_seen: OrBranches) -> None:
    """A branch of a top-level ``or`` empty on every generation is dead code that only looks like a fallback.

    Reads what ``test_every_panel_and_annotation_returns_data`` recorded on each generation's stack: it
    is defined after that test and runs on the last generation's stack, so after every stack has run."""
    if or_branches_seen.generations != set(GENERATIONS):
        ran = sorted(or_branches_seen.generations)
        pytest.skip(f"needs the panel queries run on every generation {GENERATIONS}; they ran on {ran}")
    assert or_branches_seen.shown, "no top-level `or` in the dashboards: this test has nothing to check"
    dead = or_branches_seen.dead()
    assert not dead, f"{len(dead)} `or` branches never had data:\n" + "\n".join(dead)
