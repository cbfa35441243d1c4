"""Dashboard lint as tests: the conventions of the committed dashboards, one test per rule.

The rules are grafana/dashboard-linter's and kubernetes-mixin's (one ``datasource`` variable used
everywhere, chained multi-value variables with "All", ``$__rate_interval``, no raw ``_total``, shared
crosshair, read-only, UTC, no ``__inputs`` placeholders), plus this project's: unique panel ids, uids
of at most 40 characters, no vLLM name vLLM removed unless as the fallback of its successor, JSON the
pinned SDK decodes without loss, every series read exists, and every alert's ``dashboard_url`` opens a
dashboard with its variables.

Each rule is a function returning its problems; each runs on the committed JSON of the three
dashboards (``tests/test_artifacts.py`` keeps them equal to the generator's), and
``test_each_rule_catches_its_violation`` breaks a copy of a dashboard the way the rule forbids and
checks that the rule says so.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from importlib.metadata import version
from urllib.parse import parse_qsl, urlsplit

import pytest
from fixtures import REPO

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra: pip install -e '.[dashboards]'")

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from sidecar.alert_params import RuleParams
from sidecar.artifacts.dashboards import (
    ANNOTATION_FALLBACK_KEYS,
    ROW_TITLES,
    VAR_CLUSTER,
    DashboardParams,
    build_dashboards,
)
from sidecar.artifacts.dashboards.workload import WORKLOAD_NOW_TABLE_TITLE
from sidecar.artifacts.panels import label_values_query, queries, walk_panels
from sidecar.artifacts.params import (
    DASHBOARD_CAPACITY_UID,
    DASHBOARD_OVERVIEW_UID,
    DASHBOARD_POD_UID,
    DASHBOARD_UIDS,
    VAR_DATASOURCE,
    VAR_MODEL_NAME,
    VAR_NAMESPACE,
    VAR_POD,
)
from sidecar.artifacts.rules import ALERT_NAMES, build_rule_groups
from sidecar.config import ForecastSettings
from sidecar.metrics import CATALOGUE
from sidecar.thresholds import Thresholds
from sidecar.units import format_duration

DASHBOARDS = {
    uid: json.loads((REPO / "dashboards" / f"{uid}.json").read_text(encoding="utf-8")) for uid in DASHBOARD_UIDS
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUNBOOKS = REPO / "docs" / "runbooks"
#: The pinned SDK (pyproject.toml's dashboards extra): the Grafana 11.6 line, dashboard schemaVersion 41.
SDK_VERSION = "1769699379!11.6.0"
SCHEMA_VERSION = 41

RATE_FUNCS = ("rate", "irate", "increase")
#: Range windows of the capacity-planning panels: per day, per week, or the whole range picked.
CAPACITY_WINDOWS = ("1d", "1w", "$__range")

#: vLLM names vLLM removed -> the name that replaced them (None: no successor), docs/vllm-metrics.md.
REMOVED_VLLM = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate": None,
    "vllm:cpu_prefix_cache_hit_rate": None,
    "vllm:cpu_cache_usage_perc": None,
    "vllm:num_requests_swapped": None,
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
#: vLLM's own series the dashboards may read (the latency histograms and the restart annotation).
VLLM_SERIES = {
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:num_requests_running",
    # the Fleet's "Are users hurting" row (every generation of sidecar/simulator/exposition.py renders them)
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    # ... and its 503s at admission: vLLM 0.32+ only (the simulator's v1-capacity-labels generation)
    "vllm:admission_rejections_total",
}
#: Series of Prometheus itself and of every scraped target.
PROMETHEUS_SERIES = {"ALERTS", "up", "process_start_time_seconds"}


# --------------------------------------------------------------------------- PromQL reading


def _blank_strings(expr: str) -> str:
    """The expression with the contents of string literals blanked (same length, so positions hold)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', expr)


def _enclosing_function(expr: str, pos: int) -> str:
    """The name of the innermost function call whose parentheses contain ``pos`` ("" at top level)."""
    depth = 0
    for i in range(pos - 1, -1, -1):
        if expr[i] == ")":
            depth += 1
        elif expr[i] == "(":
            if depth == 0:
                m = re.search(r"([a-zA-Z_][\w]*)\s*$", expr[:i])
                return m.group(1) if m else ""
            depth -= 1
    return ""


def windows(expr: str) -> Iterator[tuple[str, str]]:
    """(range window, the function it is an argument of) for every ``[...]`` range selector."""
    text = _blank_strings(expr)
    for m in re.finditer(r"\[([^\]]+)\]", text):
        yield m.group(1), _enclosing_function(text, m.start())


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring"}


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects (not functions, keywords, labels or variables)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text):
        if m.group(1).lower() not in _KEYWORDS:
            names.add(m.group(1))
    return names


def _exprs(dashboard: dict, kind: str | None = None) -> list[tuple[str, str]]:
    """(where, PromQL) of the dashboard's queries of this kind (all kinds: None); a variable's
    ``label_values(selector, label)`` gives its selector."""
    out = []
    for q in queries(dashboard):
        if kind not in (None, q.kind):
            continue
        expr = (label_values_query(q.expr)[0] or "") if q.kind == "variable" else q.expr
        out.append((q.where(), expr))
    return out


# --------------------------------------------------------------------------- the rules


def datasource_variable(d: dict) -> list[str]:
    """One variable of type datasource, named ``datasource``, for Prometheus data sources."""
    found = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    if [(v["name"], v.get("query")) for v in found] != [(VAR_DATASOURCE, "prometheus")]:
        return [f"datasource variables: {[(v['name'], v.get('query')) for v in found]}"]
    return []


def datasource_everywhere(d: dict) -> list[str]:
    """Every panel, target, annotation and query variable reads ``${datasource}``."""
    out = []
    for panel in walk_panels(d):
        if panel.get("datasource") != DATASOURCE:
            out.append(f"panel {panel.get('title')!r}: datasource {panel.get('datasource')}")
        for t in panel.get("targets", []):
            if t.get("datasource") != DATASOURCE:
                out.append(f"panel {panel.get('title')!r} target {t.get('refId')}: datasource {t.get('datasource')}")
    for a in d["annotations"]["list"]:
        if a.get("datasource") != DATASOURCE:
            out.append(f"annotation {a['name']!r}: datasource {a.get('datasource')}")
    for v in d["templating"]["list"]:
        if v["type"] == "query" and v.get("datasource") != DATASOURCE:
            out.append(f"variable {v['name']!r}: datasource {v.get('datasource')}")
    return out


#: cluster -> namespace -> model_name -> pod, each a label_values on kvcache_usage_ratio filtered by the ones before.
CHAIN = (
    (VAR_CLUSTER, "label_values(kvcache_usage_ratio, cluster)"),
    (VAR_NAMESPACE, 'label_values(kvcache_usage_ratio{cluster=~"$cluster"}, namespace)'),
    (VAR_MODEL_NAME, 'label_values(kvcache_usage_ratio{cluster=~"$cluster", namespace=~"$namespace"}, model_name)'),
    (
        VAR_POD,
        'label_values(kvcache_usage_ratio{cluster=~"$cluster", namespace=~"$namespace", model_name=~"$model_name"}, '
        "pod)",
    ),
)


def chained_variables(d: dict) -> list[str]:
    """datasource, cluster, namespace, model_name, pod: multi, All = ``.*``, refreshed on time range change."""
    variables = d["templating"]["list"]
    out = []
    if [v["name"] for v in variables] != [VAR_DATASOURCE] + [name for name, _ in CHAIN]:
        out.append(f"variables: {[v['name'] for v in variables]}")
    by_name = {v["name"]: v for v in variables}
    for name, query in CHAIN:
        v = by_name.get(name, {})
        got = (v.get("type"), v.get("query"), v.get("multi"), v.get("includeAll"), v.get("allValue"), v.get("refresh"))
        if got != ("query", query, True, True, ".*", 2):
            out.append(f"variable {name}: {got}")
    return out


CLUSTER_MATCHER = f'cluster=~"${VAR_CLUSTER}"'


def cluster_everywhere(d: dict) -> list[str]:
    """Every series selector of every panel and annotation query filters by ``cluster=~"$cluster"``."""
    out = []
    for where, expr in _exprs(d, "panel") + _exprs(d, "annotation"):
        for name in sorted(metric_names(expr)):
            for m in re.finditer(rf"(?<![\w:\"]){re.escape(name)}(?![\w:])(\s*\{{[^}}]*\}})?", expr):
                if CLUSTER_MATCHER not in (m.group(1) or ""):
                    out.append(f"{where}: {name} without {CLUSTER_MATCHER}")
    return out


def titles_descriptions_units(d: dict) -> list[str]:
    """Every panel has a title, a description of what it shows and what to do (unique), and a unit."""
    out = []
    seen: dict[str, str] = {}
    for panel in walk_panels(d):
        title, description = panel.get("title", ""), panel.get("description", "")
        if not title:
            out.append(f"panel {panel.get('id')}: no title")
        if len(description) < 80:
            out.append(f"panel {title!r}: description too short to say what it shows and what to do")
        elif description in seen:
            out.append(f"panel {title!r}: same description as {seen[description]!r}")
        seen[description] = title
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            out.append(f"panel {title!r}: no unit")
    return out


def rate_interval(d: dict) -> list[str]:
    """rate/irate/increase only over ``$__rate_interval``."""
    return [
        f"{where}: {func}(...[{window}])"
        for where, expr in _exprs(d)
        for window, func in windows(expr)
        if func in RATE_FUNCS and window != "$__rate_interval"
    ]


#: The Fleet's workload advice sizes on forecast.peak_window, the window the sidecar's own advice is sized on
#: (dashboards/README.md, "One recommendation per workload"): that window, and only in that table.
PEAK_WINDOW = format_duration(ForecastSettings().peak_window_s)


def fixed_windows(d: dict) -> list[str]:
    """Panels: ``$__rate_interval`` windows, except capacity planning's per-day/week/range windows and the
    Fleet's workload advice, sized on ``forecast.peak_window``."""
    allowed = CAPACITY_WINDOWS if d["uid"] == DASHBOARD_CAPACITY_UID else ("$__rate_interval",)
    advice = f'panel "{WORKLOAD_NOW_TABLE_TITLE}'
    out = [
        f"{where}: [{window}] in {func or 'a selector'}"
        for where, expr in _exprs(d, "panel")
        for window, func in windows(expr)
        if window not in allowed and not (advice in where and window == PEAK_WINDOW and func == "max_over_time")
    ]
    out += [
        f"{where}: [{window}]"
        for where, expr in _exprs(d, "annotation")
        for window, _ in windows(expr)
        if window != "$__rate_interval"
    ]
    return out


def total_only_in_rate(d: dict) -> list[str]:
    """A counter (``*_total``) only inside rate/irate/increase, never charted raw."""
    out = []
    for where, expr in _exprs(d):
        text = _blank_strings(expr)
        for m in re.finditer(r"(?<![\w:])[a-zA-Z_:][\w:]*_total(?![\w:])", text):
            func = _enclosing_function(text, m.start())
            if func not in RATE_FUNCS:
                out.append(f"{where}: {m.group(0)} in {func or 'no function'}")
    return out


def dashboard_settings(d: dict) -> list[str]:
    """Shared crosshair, read-only, UTC, no import placeholders, a uid of at most 40 characters."""
    out = []
    expected = {"graphTooltip": 1, "editable": False, "timezone": "utc", "schemaVersion": SCHEMA_VERSION}
    for key, value in expected.items():
        if d.get(key) != value:
            out.append(f"{key}: {d.get(key)!r}, want {value!r}")
    text = json.dumps(d)
    if "__inputs" in d or "__requires" in d or "${DS_" in text:
        out.append("import placeholders (__inputs/__requires/${DS_...}) break file and ConfigMap provisioning")
    if not 0 < len(d.get("uid", "")) <= 40:
        out.append(f"uid {d.get('uid')!r}: 1-40 characters")
    if not d.get("description"):
        out.append("no dashboard description")
    return out


def links(d: dict) -> list[str]:
    """Links to the runbooks and to the two other dashboards, keeping variables and time range."""
    out = []
    urls = {link.get("url"): link for link in d.get("links", [])}
    if RuleParams().runbook_base_url not in urls:
        out.append("no link to the runbooks")
    for uid in DASHBOARD_UIDS:
        if uid == d["uid"]:
            continue
        link = urls.get(f"/d/{uid}")
        if not link or not (link.get("includeVars") and link.get("keepTime")):
            out.append(f"no link to {uid} keeping the variables and the time range")
    return out


def runbook_links(d: dict) -> list[str]:
    """Panel and data links into the runbooks open runbooks that exist (``docs/runbooks/<alert>.md``;
    a data link may name the row's alert)."""
    base = RuleParams().runbook_base_url + "/"
    out = []
    for panel in walk_panels(d):
        for link in panel.get("links", []) + panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            name = link.get("url", "").removeprefix(base)
            if name == link.get("url") or name == "${__data.fields.alertname}.md":
                continue
            if name.removesuffix(".md") not in ALERT_NAMES or not (RUNBOOKS / name).is_file():
                out.append(f"panel {panel['title']!r}: {base}{name} is not the runbook of an alert")
    return out


def unique_panel_ids(d: dict) -> list[str]:
    """Panel ids (rows and the panels of collapsed rows included) are unique."""
    ids = []
    for panel in d["panels"]:
        ids.append(panel.get("id"))
        ids += [p.get("id") for p in panel.get("panels", [])]
    dupes = sorted({i for i in ids if ids.count(i) > 1 or i is None}, key=str)
    return [f"panel ids not unique or missing: {dupes}"] if dupes else []


def _removed_problem(where: str, expr: str, name: str) -> str | None:
    base = re.sub(r"_(bucket|sum|count|total)$", "", name)
    if base not in REMOVED_VLLM:
        return None
    successor = REMOVED_VLLM[base]
    new = successor and name.replace(base, successor)
    if not new or new not in expr:
        return f"{where}: {name} was removed by vLLM and {new or 'has no successor'} is not beside it"
    if not re.search(re.escape(new) + r".*\bor\b.*" + re.escape(name), expr, re.S):
        return f"{where}: {name} only as the `or` fallback after {new}"
    return None


def no_removed_vllm_names(d: dict) -> list[str]:
    """A name vLLM removed appears only after its successor, as the `or` fallback of the same expression."""
    out = []
    for where, expr in _exprs(d):
        for name in metric_names(expr):
            problem = _removed_problem(where, expr, name)
            if problem:
                out.append(problem)
    return out


def known_series(d: dict) -> list[str]:
    """Every series read exists: the sidecar's, the recording rules', ALERTS/up, or the listed vLLM ones."""
    records = {
        r["record"]
        for g in build_rule_groups(Thresholds(), RuleParams())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    known = {m.name for m in CATALOGUE} | records | PROMETHEUS_SERIES | VLLM_SERIES
    return [
        f"{where}: {name} is not a series anything exports or records"
        for where, expr in _exprs(d)
        for name in sorted(metric_names(expr) - known)
    ]


def grid(d: dict) -> list[str]:
    """Panels on the 24-column grid without overlaps; the rows in on-call order."""
    out = []
    taken: dict[tuple[int, int], str] = {}
    for panel in d["panels"]:
        g = panel["gridPos"]
        if g["w"] <= 0 or g["h"] <= 0 or g["x"] < 0 or g["x"] + g["w"] > 24:
            out.append(f"panel {panel.get('title')!r}: off the 24-column grid {g}")
        for cell in ((x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])):
            if cell in taken:
                out.append(f"panel {panel.get('title')!r} overlaps {taken[cell]!r}")
                break
            taken[cell] = panel.get("title", "")
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    if tuple(rows[: len(ROW_TITLES)]) != ROW_TITLES:
        out.append(f"rows {rows}, want {list(ROW_TITLES)} first")
    if d["panels"] and d["panels"][0]["type"] != "row":
        out.append("the first panel is not a row")
    return out


def pinned_schema(d: dict) -> list[str]:
    """The pinned SDK's Dashboard model decodes the JSON and encodes it back unchanged (but for the
    annotation keys it has no field for): no key Grafana 11.6's schema does not know."""
    expected = copy.deepcopy(d)
    for a in expected["annotations"]["list"]:
        for key in ANNOTATION_FALLBACK_KEYS:
            a.pop(key, None)
    back = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(d)))
    if back == expected:
        return []
    lost = sorted(
        set(json.dumps(expected, sort_keys=True).split(",")) - set(json.dumps(back, sort_keys=True).split(","))
    )
    return [f"not preserved by the SDK's model: {lost[:5]}"]


def annotations(d: dict) -> list[str]:
    """vLLM restarts (the vLLM target's process only), configuration changes and KVCacheAlmostFull."""
    exprs = {a["name"]: a.get("expr", "") for a in d["annotations"]["list"]}
    out = []
    restart = exprs.get("vLLM restarts", "")
    if not re.search(
        r"changes\(process_start_time_seconds\{.*\}.*\band on \(.*\) vllm:num_requests_running", restart, re.S
    ):
        out.append(f"vLLM restarts: {restart!r}")
    if "increase(kvcache_sidecar_config_changes_total" not in exprs.get("Configuration changes", ""):
        out.append(f"configuration changes: {exprs.get('Configuration changes')!r}")
    if 'ALERTS{alertname="KVCacheAlmostFull", alertstate="firing"' not in exprs.get("KVCacheAlmostFull", ""):
        out.append(f"KVCacheAlmostFull: {exprs.get('KVCacheAlmostFull')!r}")
    for a in d["annotations"]["list"]:
        if not a.get("titleFormat") or not a.get("enable"):
            out.append(f"annotation {a['name']!r}: not enabled or no title")
    return out


RULES: dict[str, Callable[[dict], list[str]]] = {
    f.__name__: f
    for f in (
        datasource_variable,
        datasource_everywhere,
        chained_variables,
        cluster_everywhere,
        titles_descriptions_units,
        rate_interval,
        fixed_windows,
        total_only_in_rate,
        dashboard_settings,
        links,
        runbook_links,
        unique_panel_ids,
        no_removed_vllm_names,
        known_series,
        grid,
        pinned_schema,
        annotations,
    )
}


@pytest.mark.parametrize("uid", DASHBOARD_UIDS)
@pytest.mark.parametrize("rule", list(RULES))
def test_committed_dashboard_follows_the_rule(rule, uid):
    assert RULES[rule](DASHBOARDS[uid]) == [], RULES[rule].__doc__


# --------------------------------------------------------------------------- the rules can fail


def _first_panel(d: dict) -> dict:
    return next(walk_panels(d))


def _first_target(d: dict) -> dict:
    return next(p for p in walk_panels(d) if p.get("targets"))["targets"][0]


def _set_expr(expr: str) -> Callable[[dict], None]:
    return lambda d: _first_target(d).update(expr=expr)


BREAKAGES: list[tuple[str, Callable[[dict], None]]] = [
    ("datasource_variable", lambda d: d["templating"]["list"][0].update(name="DS")),
    ("datasource_everywhere", lambda d: _first_panel(d).update(datasource={"type": "prometheus", "uid": "abc123"})),
    ("datasource_everywhere", lambda d: d["annotations"]["list"][0].update(datasource={"uid": "grafana"})),
    ("chained_variables", lambda d: d["templating"]["list"][3].update(query="label_values(kvcache_usage_ratio, pod)")),
    ("chained_variables", lambda d: d["templating"]["list"][1].update(allValue=None)),
    ("cluster_everywhere", _set_expr('kvcache_usage_ratio{namespace=~"$namespace"}')),
    ("cluster_everywhere", _set_expr("sum(kvcache_usage_ratio)")),
    ("titles_descriptions_units", lambda d: _first_panel(d).update(description="")),
    ("titles_descriptions_units", lambda d: _first_panel(d)["fieldConfig"]["defaults"].pop("unit")),
    ("rate_interval", _set_expr("sum(rate(kvcache_preemptions_total[5m]))")),
    ("fixed_windows", _set_expr("max_over_time(kvcache_usage_ratio[1h])")),
    ("total_only_in_rate", _set_expr("sum(kvcache_preemptions_total)")),
    ("dashboard_settings", lambda d: d.update(editable=True)),
    ("dashboard_settings", lambda d: d.update(__inputs=[{"name": "DS_PROMETHEUS"}])),
    ("dashboard_settings", lambda d: d.update(uid="kvcache-" + "x" * 40)),
    ("links", lambda d: d["links"].pop(0)),
    (
        "runbook_links",
        lambda d: _first_panel(d).update(links=[{"url": RuleParams().runbook_base_url + "/KVCacheFull.md"}]),
    ),
    ("unique_panel_ids", lambda d: _first_panel(d).update(id=d["panels"][0]["id"])),
    ("no_removed_vllm_names", _set_expr("vllm:gpu_cache_usage_perc")),
    (
        "no_removed_vllm_names",
        _set_expr("rate(vllm:time_per_output_token_seconds_bucket[$__rate_interval])"),
    ),
    ("known_series", _set_expr("kvcache_usage_ratoi")),
    ("grid", lambda d: _first_panel(d)["gridPos"].update(x=20, w=12)),
    ("grid", lambda d: d["panels"].reverse()),
    ("pinned_schema", lambda d: _first_panel(d).update(fieldConfig={**_first_panel(d)["fieldConfig"], "bogus": 1})),
    ("annotations", lambda d: d["annotations"]["list"].pop(0)),
]


@pytest.mark.parametrize("rule, breakage", BREAKAGES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BREAKAGES)])
def test_each_rule_catches_its_violation(rule, breakage):
    broken = copy.deepcopy(DASHBOARDS[DASHBOARD_POD_UID])
    breakage(broken)
    assert RULES[rule](broken), f"{rule} did not notice"


def test_every_rule_has_a_breakage():
    assert {rule for rule, _ in BREAKAGES} == set(RULES)


def test_the_promql_reader():
    """The helpers the rules rest on, on expressions whose answers are known."""
    expr = 'sum by (pod) (rate(a_total{x="[5m]"}[$__rate_interval])) / max_over_time(b[1d]) or vector(0)'
    assert list(windows(expr)) == [("$__rate_interval", "rate"), ("1d", "max_over_time")]
    assert metric_names(expr) == {"a_total", "b"}
    assert metric_names('x{le="0.5"} and on (pod) y > bool 0.9') == {"x", "y"}


# --------------------------------------------------------------------------- the content


def test_the_pinned_sdk_is_installed():
    """The 11.6 line (an unpinned install resolves to the Grafana 10.1 schema)."""
    assert version("grafana-foundation-sdk") == SDK_VERSION
    assert SDK_VERSION in (REPO / "pyproject.toml").read_text(encoding="utf-8")


def test_every_alert_opens_an_existing_dashboard_with_its_variables():
    """With a Grafana base URL set (the shipped rules have none, so they carry no dashboard_url)."""
    doc = build_rule_groups(Thresholds(), RuleParams(dashboard_base_url="https://grafana.test"))
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = urlsplit(rule["annotations"]["dashboard_url"])
        uid = url.path.removeprefix("/d/")
        assert uid in DASHBOARDS, (rule["alert"], uid)
        defined = {v["name"] for v in DASHBOARDS[uid]["templating"]["list"]}
        for key, _ in parse_qsl(url.query):
            assert key.startswith("var-") and key.removeprefix("var-") in defined, (rule["alert"], key)


def _panel(uid: str, title: str, dashboards: dict | None = None) -> dict:
    return next(p for p in walk_panels((dashboards or DASHBOARDS)[uid]) if p["title"] == title)


def _steps(panel: dict) -> list[float]:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def test_usage_panels_draw_the_thresholds_that_page():
    th = Thresholds()
    for uid, title in (
        (DASHBOARD_OVERVIEW_UID, "KV usage by pod"),
        (DASHBOARD_POD_UID, "KV usage"),
        (DASHBOARD_CAPACITY_UID, "Peak and p95 usage per day"),
    ):
        panel = _panel(uid, title)
        assert _steps(panel) == [th.warning, th.watermark], (uid, title)
        assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"


def test_thresholds_follow_the_configuration():
    built = build_dashboards(DashboardParams(thresholds=Thresholds(watermark=0.85, warning=0.7, target_usage=0.6)))
    assert _steps(_panel(DASHBOARD_POD_UID, "KV usage", built)) == [0.7, 0.85]
    pods_above = _panel(DASHBOARD_OVERVIEW_UID, "Pods above the watermark", built)["targets"][0]["expr"]
    assert "> 0.85)" in pods_above and "0.9" not in pods_above


def test_label_names_are_configurable_and_the_variables_keep_their_names():
    built = build_dashboards(DashboardParams(namespace_label="kubernetes_namespace", pod_label="kubernetes_pod_name"))
    for d in built.values():
        text = "\n".join(q.expr for q in queries(d))
        assert 'kubernetes_namespace=~"$namespace"' in text and 'kubernetes_pod_name=~"$pod"' in text
        assert not re.search(r'(?<![\w])(namespace|pod)=~"', text), d["uid"]
        assert [v["name"] for v in d["templating"]["list"]] == [
            VAR_DATASOURCE,
            VAR_CLUSTER,
            VAR_NAMESPACE,
            VAR_MODEL_NAME,
            VAR_POD,
        ]
        assert d["templating"]["list"][4]["query"].endswith(", kubernetes_pod_name)")


def test_the_pod_table_drills_down_with_the_rows_labels():
    panel = _panel(DASHBOARD_OVERVIEW_UID, "Pods")
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    url = urlsplit(link["url"])
    assert url.path == f"/d/{DASHBOARD_POD_UID}"
    given = {"${cluster:queryparam}": "c=1", "${datasource:queryparam}": "ds=1", "${__url_time_range}": "t=1"}
    query = dict(parse_qsl(re.sub(r"\$\{[^}]*queryparam\}|\$\{__url_time_range\}", lambda m: given[m[0]], url.query)))
    assert query == {
        "c": "1",
        "var-namespace": "${__data.fields.namespace}",
        "var-model_name": "${__data.fields.model_name}",
        "var-pod": "${__data.fields.pod}",
        "ds": "1",
        "t": "1",
    }
    included = next(t for t in panel["transformations"] if t["id"] == "filterFieldsByName")["options"]["include"]
    assert {"namespace", "model_name", "pod"} <= set(included["names"])  # the fields the link reads


def test_latency_is_p95_of_vllms_histograms_across_both_generations():
    exprs = {t["legendFormat"]: t["expr"] for t in _panel(DASHBOARD_POD_UID, "Latency p95 (vLLM)")["targets"]}
    itl = exprs["inter-token latency p95"]
    assert itl.startswith("histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket")
    assert " or rate(vllm:time_per_output_token_seconds_bucket" in itl
    assert exprs["time to first token p95"].startswith(
        "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
    )


def test_capacity_planning_reads_only_recording_rules():
    records = {
        r["record"]
        for g in build_rule_groups(Thresholds(), RuleParams())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    for where, expr in _exprs(DASHBOARDS[DASHBOARD_CAPACITY_UID], "panel"):
        assert metric_names(expr) <= records, where


def test_the_panels_that_explain_an_alert_link_its_runbook():
    base = RuleParams().runbook_base_url
    for uid, title, alert in (
        (DASHBOARD_OVERVIEW_UID, "KV usage by pod", "KVCacheAlmostFull"),
        (DASHBOARD_OVERVIEW_UID, "Worst time until full", "KVCacheFullSoon"),
        (DASHBOARD_POD_UID, "Preemptions per second", "KVCachePreemptions"),
        (DASHBOARD_POD_UID, "Sidecar scrape errors", "KVCacheSidecarScrapeFailing"),
    ):
        assert [link["url"] for link in _panel(uid, title)["links"]] == [f"{base}/{alert}.md"], (uid, title)
    (alert_link,) = _panel(DASHBOARD_OVERVIEW_UID, "Firing alerts")["fieldConfig"]["defaults"]["links"]
    assert alert_link["url"] == f"{base}/${{__data.fields.alertname}}.md"


def test_the_fleet_answers_with_a_number_even_when_all_is_well():
    """The stat panels count with `or vector(0)`: 0 alerts is an answer, "No data" is not."""
    for title in ("Pages firing (critical)", "Pods above the watermark"):
        assert _panel(DASHBOARD_OVERVIEW_UID, title)["targets"][0]["expr"].endswith(" or vector(0)")
