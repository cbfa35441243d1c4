"""The alert and recording rules: generated == committed, promtool-valid, promtool-tested, and tests that bite.

The rule behaviour itself is specified by the promtool tests in ``alerts/*_test.yaml``
(exact labels and annotations for every alert, and the look-alike cases that must stay
quiet). This file runs them, checks their coverage, and shows that they fail when a rule
is weakened in the ways reviewers worry about (mutation checks).
"""

from __future__ import annotations

import argparse
import re
import shutil
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from alerttools import ALERTS, REPO, RUNBOOKS, run_tool

from sidecar.alert_params import FAST_VARIANT, RuleParams
from sidecar.artifacts import cli as rules_cli
from sidecar.artifacts import rules
from sidecar.artifacts.params import DASHBOARD_UIDS, DASHBOARD_VARIABLES, VAR_DATASOURCE
from sidecar.artifacts.rules import ALERT_NAMES, build_rule_groups, render
from sidecar.config import ConfigError, build_config, load_config
from sidecar.metrics import CATALOGUE
from sidecar.thresholds import Thresholds
from sidecar.units import prometheus_duration_seconds

RULE_FILES = sorted(ALERTS.glob("*.rules.yaml"))
TEST_FILES = sorted(ALERTS.glob("*_test.yaml"))
DEFAULT_RULES = ALERTS / rules.RULES_FILE_NAME


def _alerts(groups: dict) -> list[dict]:
    return [r for g in groups["groups"] for r in g["rules"] if "alert" in r]


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kv-sidecar")
    rules_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return args.func(args)


# ----------------------------------------------------------------- layout and sync


def test_alerts_directory_holds_only_rules_tests_and_one_alertmanager_config():
    stray = [
        p.name
        for p in ALERTS.iterdir()
        if not (p.name.endswith(".rules.yaml") or p.name.endswith("_test.yaml") or p.name == "alertmanager.yaml")
    ]
    assert stray == [], "alerts/ holds only *.rules.yaml, *_test.yaml and alertmanager.yaml"
    assert DEFAULT_RULES in RULE_FILES and TEST_FILES
    # committed == generated: tests/test_artifacts.py::test_committed_file_is_what_its_generator_gives


def test_the_page_uses_the_sidecars_thresholds():
    """One source: the committed rules page on Thresholds().watermark and ticket on .warning."""
    doc = yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))
    by_severity = {r["labels"]["severity"]: r["expr"] for r in _alerts(doc) if r["alert"] == "KVCacheAlmostFull"}
    p = RuleParams()
    assert by_severity == {
        "warning": f"max_over_time(kvcache_usage_ratio[{p.gap_window}]) > {Thresholds().warning:g}",
        "critical": f"quantile_over_time({p.critical_quantile:g}, kvcache_usage_ratio[{p.critical_window}]) "
        f"> {Thresholds().watermark:g}",
    }
    waiting = next(r for r in _alerts(doc) if r["alert"] == "KVCacheRequestsWaitingForKV")
    assert waiting["expr"].endswith(f"> {Thresholds().watermark:g}")


def test_config_file_thresholds_reach_both_the_sidecar_and_the_rules(tmp_path, capsys):
    """The sidecar's loader and `rules render` read the same thresholds: section."""

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "thresholds:\n  watermark: 0.85\n  warning: 0.7\n  target_usage: 0.6\n"
        "alerts:\n  critical_window: 3m\n  critical_quantile: 0.9\n  critical_keep_firing_for: 2m\n"
        "  sidecar_job: llm/kv-sidecar\n",
        encoding="utf-8",
    )
    sidecar_view = load_config(str(cfg), env={}).thresholds
    assert _cli("rules", "render", "--config.file", str(cfg), "--out", str(tmp_path)) == 0
    doc = yaml.safe_load((tmp_path / rules.RULES_FILE_NAME).read_text(encoding="utf-8"))
    critical = next(
        r for r in _alerts(doc) if r["labels"]["severity"] == "critical" and r["alert"] == "KVCacheAlmostFull"
    )
    warning = next(
        r for r in _alerts(doc) if r["labels"]["severity"] == "warning" and r["alert"] == "KVCacheAlmostFull"
    )
    assert critical["expr"].endswith(f"> {sidecar_view.watermark:g}") and sidecar_view.watermark == 0.85
    assert warning["expr"].endswith(f"> {sidecar_view.warning:g}") and sidecar_view.warning == 0.7
    assert critical["expr"].startswith("quantile_over_time(0.9, kvcache_usage_ratio[3m])")
    assert "for" not in critical and critical["keep_firing_for"] == "2m"
    assert "above the 85% watermark for more than 10% of the last 3m (p90:" in critical["annotations"]["description"]
    assert "85% paging watermark" in critical["annotations"]["summary"]
    # no rule compares with target_usage (the advice does), but the file records the thresholds it was made with
    header = (tmp_path / rules.RULES_FILE_NAME).read_text(encoding="utf-8").splitlines()[:6]
    assert any(f"target_usage={sidecar_view.target_usage:g}" in line for line in header)
    assert sidecar_view.target_usage == 0.6
    down = next(r for r in _alerts(doc) if r["alert"] == "KVCacheSidecarDown")
    assert 'up{job="llm/kv-sidecar"}' in down["expr"]


def test_flags_override_the_config_file(tmp_path, capsys):
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("thresholds:\n  watermark: 0.85\n", encoding="utf-8")
    assert _cli("rules", "render", "--config.file", str(cfg), "--thresholds.watermark", "0.95", "--out", "-") == 0
    out = capsys.readouterr().out
    assert "max_over_time(kvcache_usage_ratio[1m]) > 0.95" in out and "> 0.85" not in out


# ------------------------------------------------------------------- promtool


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool, path):
    res = run_tool(promtool, "check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        f"SUCCESS: {sum(len(g['rules']) for g in build_rule_groups(Thresholds(), RuleParams())['groups'])} "
        f"rules found" in res.stdout
    )


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(promtool, path):
    res = run_tool(promtool, "test", "rules", str(path), cwd=ALERTS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_firing_case_with_exact_annotations_and_a_quiet_case():
    firing: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                name = case["alertname"]
                exp = case.get("exp_alerts") or []
                if not exp:
                    quiet[name] = quiet.get(name, 0) + 1
                for alert in exp:
                    assert "severity" in alert["exp_labels"], (path.name, test["name"])
                    # no dashboard_url: the default rules have no Grafana to link
                    # (test_dashboard_links_render_in_promtool checks the links)
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, (
                        path.name,
                        test["name"],
                    )
                    firing[name] = firing.get(name, 0) + 1
    assert sorted(firing) == sorted(ALERT_NAMES)
    assert sorted(quiet) == sorted(ALERT_NAMES)


def test_both_severities_of_the_page_are_asserted():
    doc = yaml.safe_load((ALERTS / "almost_full_test.yaml").read_text(encoding="utf-8"))
    severities = {
        a["exp_labels"]["severity"]
        for t in doc["tests"]
        for c in t.get("alert_rule_test", [])
        for a in c.get("exp_alerts") or []
    }
    assert severities == {"warning", "critical"}


# Each mutation weakens one rule the way a reviewer might be tempted to, and names the
# promtool test case that must catch it. A test suite that passes these mutants would
# be one that cannot fail. (rule: alert name, "alert/severity", or a recording rule's name)
MUTATIONS = [
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "quantile_over_time(0.95,",
        "quantile_over_time(1,",
        "one scrape at 0.95 (a burst that recovers before 5% of the window) never pages",
        id="max-of-the-window-pages-on-a-single-scrape",
    ),
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "quantile_over_time(0.95,",
        "quantile_over_time(0.5,",
        "spikes to 0.93 every 2 minutes pages",
        id="median-misses-recurring-peaks",
    ),
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "[10m]",
        "[1m]",
        "spikes to 0.93 every 2 minutes pages",
        id="short-window-misses-recurring-peaks",
    ),
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "quantile_over_time(0.95, kvcache_usage_ratio[10m])",
        "kvcache_usage_ratio",
        "a sawtooth between 0.87 and 0.93",
        id="plain-comparison-pages-on-the-first-scrape-above",
    ),
    pytest.param(
        "capacity_test.yaml",
        "KVCacheRequestsWaitingForKV",
        "[1m]) > 0.9",
        "[1m]) > 0",
        "waiting for capacity at low usage",
        id="waiting-without-kv-pressure",
    ),
    pytest.param(
        "prefix_hit_ratio_test.yaml",
        "KVCachePrefixHitRatioLow",
        "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m <",
        "avg by (namespace, model_name) (rate(kvcache_prefix_cache_hits_tokens_total[5m])"
        " / rate(kvcache_prefix_cache_queries_tokens_total[5m])) <",
        "ratio of sums, not a mean of pod ratios",
        id="mean-of-pod-ratios",
    ),
    pytest.param(
        "prefix_hit_ratio_test.yaml",
        "KVCachePrefixHitRatioLow",
        "\nand\nquantile_over_time(0.5, namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m[1d])"
        " >= 0.5",
        "",
        "a workload without shared prefixes",
        id="prefix-hit-ratio-on-a-workload-without-shared-prefixes",
    ),
    pytest.param(
        "capacity_test.yaml",
        "KVCachePreemptions",
        "[5m]) > 1",
        "[5m]) > 0",
        "a steady trickle below the floor",
        id="preemptions-without-a-floor",
    ),
    pytest.param(
        "sidecar_test.yaml",
        "KVCacheModelConfigMissing",
        "max without (reason) (kvcache_model_config_loaded)",
        "kvcache_model_config_loaded",
        "never loads",
        id="model-config-missing-restarts-for-on-a-new-reason",
    ),
    pytest.param(
        "capacity_test.yaml",
        "KVCacheCapacityMismatch",
        '{budget="exact"}',
        "",
        "an estimated budget far off",
        id="mismatch-on-estimated-budgets",
    ),
    pytest.param(
        "sidecar_test.yaml",
        "KVCacheSidecarScrapeFailing",
        "\nand\nkvcache_sidecar_last_success_timestamp_seconds",
        "",
        "a model that takes 20 minutes to load",
        id="scrape-failing-during-model-load",
    ),
    pytest.param(
        "sidecar_test.yaml",
        "KVCacheSidecarDown",
        '\nor\nabsent(up{job="kv-cache-sidecar"})',
        "",
        "no sidecar target at all",
        id="sidecar-down-without-absent",
    ),
    pytest.param(
        "overprovisioned_test.yaml",
        "KVCacheOverProvisioned",
        "\nunless kvcache_engine_asleep == 1",
        "",
        "not for a young engine, an asleep one",
        id="over-provisioned-while-asleep",
    ),
    pytest.param(
        "overprovisioned_test.yaml",
        "KVCacheOverProvisioned",
        "\nand present_over_time(kvcache_usage_ratio[1h] offset 23h)",
        "",
        "not for a young engine, an asleep one",
        id="over-provisioned-on-a-young-engine",
    ),
    pytest.param(
        "recording_test.yaml",
        "engine:kvcache_usage_ratio:awake",
        " unless kvcache_engine_asleep == 1",
        "",
        'expr: "engine:kvcache_usage_ratio:awake", time: 8m',
        id="awake-usage-includes-sleep",
    ),
]


def _mutate(doc: dict, rule: str, original: str, mutant: str) -> None:
    name, _, severity = rule.partition("/")
    hits = [
        r
        for g in doc["groups"]
        for r in g["rules"]
        if r.get("alert", r.get("record")) == name and (not severity or r["labels"]["severity"] == severity)
    ]
    assert len(hits) == 1 and original in hits[0]["expr"], (
        f"the mutation of {rule} no longer applies: update it with the rule"
    )
    hits[0]["expr"] = hits[0]["expr"].replace(original, mutant)


def test_promtool_tests_catch_a_page_without_keep_firing_for(promtool, tmp_path):
    """Without keep_firing_for the page resolves as soon as the peaks leave the window: the case that
    holds it 5 more minutes fails."""
    doc = yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))
    (page,) = [
        r
        for g in doc["groups"]
        for r in g["rules"]
        if r.get("alert") == "KVCacheAlmostFull" and r["labels"]["severity"] == "critical"
    ]
    del page["keep_firing_for"]
    (tmp_path / rules.RULES_FILE_NAME).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    shutil.copy(ALERTS / "almost_full_test.yaml", tmp_path / "almost_full_test.yaml")
    res = run_tool(promtool, "test", "rules", "almost_full_test.yaml", cwd=tmp_path)
    assert res.returncode != 0
    assert "the page resolves 10m (the window) + 5m (keep_firing_for)" in res.stdout + res.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_mutation_harness_control(promtool, tmp_path, path):
    """Unmutated, the harness's re-dumped rule file passes: the mutants fail for their change alone."""
    doc = yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))
    (tmp_path / rules.RULES_FILE_NAME).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    shutil.copy(path, tmp_path / path.name)
    res = run_tool(promtool, "test", "rules", path.name, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("test_file, rule, original, mutant, failing_case", MUTATIONS)
def test_promtool_tests_catch_weakened_rules(promtool, tmp_path, test_file, rule, original, mutant, failing_case):
    doc = yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))
    _mutate(doc, rule, original, mutant)
    (tmp_path / rules.RULES_FILE_NAME).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    shutil.copy(ALERTS / test_file, tmp_path / test_file)
    res = run_tool(promtool, "test", "rules", test_file, cwd=tmp_path)
    assert res.returncode != 0, f"{test_file} still passes with {rule} weakened ({original!r} -> {mutant!r})"
    assert failing_case in res.stdout + res.stderr, res.stdout + res.stderr


# ------------------------------------------------------------------ generator


def test_fast_variant_is_valid_and_on_a_seconds_scale(promtool, tmp_path):
    text = render(Thresholds(), RuleParams(), variant="fast")
    path = tmp_path / rules.RULES_FILE_NAME
    path.write_text(text, encoding="utf-8")
    res = run_tool(promtool, "check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(text)
    assert {g["interval"] for g in doc["groups"]} == {"1s"}
    page = next(r for r in _alerts(doc) if r["alert"] == "KVCacheAlmostFull" and r["labels"]["severity"] == "critical")
    # the page's window and keep_firing_for shrink 10x: still "above 90% for 5% of the window" (3 s of
    # 60 one-second samples, not a single scrape), still no for:
    assert page["expr"] == "quantile_over_time(0.95, kvcache_usage_ratio[60s]) > 0.9"
    assert "for" not in page and page["keep_firing_for"] == "30s"
    default_page = next(
        r
        for r in _alerts(build_rule_groups(Thresholds(), RuleParams()))
        if r["alert"] == "KVCacheAlmostFull" and r["labels"]["severity"] == "critical"
    )
    assert prometheus_duration_seconds(default_page["keep_firing_for"]) == 10 * prometheus_duration_seconds(
        page["keep_firing_for"]
    )
    # only timings differ from the default variant
    default = build_rule_groups(Thresholds(), RuleParams())
    assert [r.get("alert", r.get("record")) for r in _alerts(doc)] == [
        r.get("alert", r.get("record")) for r in _alerts(default)
    ]
    assert all(prometheus_duration_seconds(v) <= 60 for v in FAST_VARIANT.values())


def test_prometheusrule_carries_the_same_groups(tmp_path):
    assert _cli("rules", "render", "--format", "prometheusrule", "--out", str(tmp_path)) == 0
    doc = yaml.safe_load((tmp_path / rules.PROMETHEUSRULE_FILE_NAME).read_text(encoding="utf-8"))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "kv-cache-sidecar"
    assert doc["spec"]["groups"] == yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))["groups"]


def test_out_directory_is_written_atomically_and_stdout_works(tmp_path, capsys):
    out = tmp_path / "rendered"
    assert _cli("rules", "render", "--out", str(out), "--variant", "fast") == 0
    assert [p.name for p in out.iterdir()] == [rules.RULES_FILE_NAME]  # no temp files left behind
    assert _cli("rules", "render") == 0
    assert capsys.readouterr().out == DEFAULT_RULES.read_text(encoding="utf-8")


def test_alert_names_constant_lists_exactly_the_generated_alerts():
    generated = [r["alert"] for r in _alerts(build_rule_groups(Thresholds(), RuleParams()))]
    assert list(dict.fromkeys(generated)) == list(ALERT_NAMES)


def test_every_alert_links_its_runbook_and_a_fixed_dashboard():
    for rule in _alerts(build_rule_groups(Thresholds(), RuleParams(dashboard_base_url="https://grafana.test"))):
        ann = rule["annotations"]
        assert ann["runbook_url"] == f"{RuleParams().runbook_base_url}/{rule['alert']}.md"
        uid = re.search(r"/d/([^?]+)\?", ann["dashboard_url"]).group(1)
        assert uid in DASHBOARD_UIDS
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["alert"].startswith("KVCache") and ann["summary"].endswith(".")


def test_no_dashboard_url_without_a_grafana_and_no_example_com_anywhere():
    """What a user applies links nothing that leads nowhere: no Grafana configured, no dashboard_url."""
    for rule in _alerts(build_rule_groups(Thresholds(), RuleParams())):
        assert "dashboard_url" not in rule["annotations"], rule["alert"]
    for path in [*RULE_FILES, *sorted((REPO / "deploy").rglob("prometheusrule.yaml"))]:
        assert "example.com" not in path.read_text(encoding="utf-8"), path


def test_dashboard_links_render_in_promtool(promtool, tmp_path):
    """With a Grafana configured, promtool expands the link with the alert's labels (url-encoded, All when absent)."""
    params = RuleParams(dashboard_base_url="https://grafana.test")
    (tmp_path / rules.RULES_FILE_NAME).write_text(render(Thresholds(), params), encoding="utf-8")
    labels = (
        'namespace="llm", pod="vllm-0", job="kv-cache-sidecar", instance="10.0.0.7:9437", target="vllm", engine="0"'
    )
    case = {
        "rule_files": [rules.RULES_FILE_NAME],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {
                        "series": f'kvcache_usage_ratio{{{labels}, model_name="meta-llama/Llama-3.1-8B"}}',
                        "values": "0.95x20",
                    },
                    {
                        "series": 'kvcache_usage_ratio{instance="127.0.0.1:9437", model_name="q", engine="0"}',
                        "values": "0.95x20",
                    },
                ],
                "alert_rule_test": [],
                "promql_expr_test": [],
            }
        ],
    }
    doc = build_rule_groups(Thresholds(), params)
    page = next(r for r in _alerts(doc) if r["alert"] == "KVCacheAlmostFull" and r["labels"]["severity"] == "critical")
    # ask promtool for the expanded annotation by expecting a wrong one and reading its report
    case["tests"][0]["alert_rule_test"] = [{"eval_time": "6m", "alertname": "KVCacheAlmostFull", "exp_alerts": []}]
    (tmp_path / "links_test.yaml").write_text(yaml.safe_dump(case), encoding="utf-8")
    res = run_tool(promtool, "test", "rules", "links_test.yaml", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and page["annotations"]["summary"] in out
    assert (
        'dashboard_url="https://grafana.test/d/kvcache-overview?var-namespace=llm'
        '&var-model_name=meta-llama%2FLlama-3.1-8B&var-pod=vllm-0"' in out
    ), out
    assert (
        'dashboard_url="https://grafana.test/d/kvcache-overview?var-namespace=%24__all&var-model_name=q&var-pod=%24__all"'
        in out
    )


def test_dashboard_urls_name_only_the_fixed_uids_and_variables():
    """Dashboards reuse DASHBOARD_UIDS and DASHBOARD_VARIABLES, so a link in a page never breaks."""
    params = RuleParams(dashboard_base_url="https://grafana.test")
    seen_uids, seen_variables = set(), set()
    for rule in _alerts(build_rule_groups(Thresholds(), params)):
        url = urlsplit(rule["annotations"]["dashboard_url"])
        assert f"{url.scheme}://{url.netloc}" == params.dashboard_base_url, rule["alert"]
        uid = url.path.removeprefix("/d/")
        assert url.path == f"/d/{uid}" and uid in DASHBOARD_UIDS, (rule["alert"], url.path)
        query = parse_qsl(url.query, keep_blank_values=True)
        assert query, rule["alert"]
        for key, value in query:
            name = key.removeprefix("var-")
            assert key == f"var-{name}" and name in DASHBOARD_VARIABLES, (rule["alert"], key)
            # the label of its name, or All when the alert does not carry it (never an empty value)
            assert value == f'{{{{ or $labels.{name} "$__all" | urlquery }}}}', (rule["alert"], key, value)
            seen_variables.add(name)
        seen_uids.add(uid)
    assert seen_uids == set(DASHBOARD_UIDS)
    assert seen_variables == set(DASHBOARD_VARIABLES) and VAR_DATASOURCE not in DASHBOARD_VARIABLES


def _alert_problems(mapping) -> list[str]:
    """The problems the configuration's loader finds in an ``alerts:`` section (none: [])."""
    try:
        build_config({"alerts": mapping})
    except ConfigError as e:
        return e.problems
    return []


@pytest.mark.parametrize(
    "mapping, field_fragment",
    [
        ({"critical_window": "5 min"}, "alerts.critical_window: not a Prometheus duration: '5 min'"),
        ({"critical_quantile": 1.5}, "alerts.critical_quantile: must be a fraction between 0 and 1"),
        ({"critical_keep_firing_for": "0s"}, "alerts.critical_keep_firing_for: must be greater than 0s"),
        ({"gap_window": "1.5m"}, "alerts.gap_window: not a Prometheus duration"),
        ({"warning_for": "0s"}, "alerts.warning_for: must be greater than 0s, got '0s'"),
        ({"critcal_window": "5m"}, "alerts.critcal_window: unknown field (did you mean 'critical_window'?)"),
        ({"prefix_hit_ratio_low": 1.5}, "alerts.prefix_hit_ratio_low: must be a fraction between 0 and 1"),
        ({"capacity_mismatch_tolerance": "lots"}, "alerts.capacity_mismatch_tolerance: must be a finite number"),
        ({"preemptions_per_second": -1}, "alerts.preemptions_per_second: must be at least 0"),
        ({"sidecar_job": 'kv"x'}, "alerts.sidecar_job: must be a non-empty job label value"),
        ({"runbook_base_url": "docs/runbooks"}, "alerts.runbook_base_url: must be an http(s) URL"),
        ({"dashboard_base_url": "https://grafana.example.com/"}, "without a trailing slash"),
        ({"namespace": "LLM Prod"}, "alerts.namespace: must be a Kubernetes namespace name"),
        ({"model_config_missing_for": "0s"}, "alerts.model_config_missing_for: must be greater than 0s"),
        ({"prefix_hit_ratio_usual": 2}, "alerts.prefix_hit_ratio_usual: must be a fraction between 0 and 1"),
        ({"evaluation_interval": "fast"}, "alerts.evaluation_interval: not a Prometheus duration"),
    ],
)
def test_bad_alert_params_name_the_field_and_the_fix(mapping, field_fragment):
    problems = _alert_problems(mapping)
    assert len(problems) == 1 and field_fragment in problems[0], problems


def test_good_alert_params_and_every_problem_at_once():
    params = build_config(
        {"alerts": {"critical_window": "2m", "prefix_hit_ratio_low": "0.3", "evaluation_interval": None}}
    ).alerts
    assert params == RuleParams(critical_window="2m", prefix_hit_ratio_low=0.3, evaluation_interval=None)
    assert [p.split(":")[0] for p in _alert_problems({"critical_window": "x", "warning_for": "y", "nope": 1})] == [
        "alerts.nope",
        "alerts.warning_for",
        "alerts.critical_window",
    ]
    assert _alert_problems([1, 2]) == ["alerts: must be a mapping, got list"]


def test_thresholds_are_read_by_the_sidecars_own_loader():
    """One reading of thresholds: the configuration's, which the rules render from."""
    th = build_config({"thresholds": {"watermark": 0.95, "warning": 0.85}}).thresholds
    assert th == Thresholds(watermark=0.95, warning=0.85)
    with pytest.raises(ConfigError) as e:
        build_config({"thresholds": {"watermark": 0.7}})
    assert any("thresholds.warning: must be below thresholds.watermark" in p for p in e.value.problems)
    with pytest.raises(ConfigError) as e:
        build_config({"thresholds": {"watermak": 0.9, "warning": "high"}})
    assert any(p.startswith("thresholds.watermak: unknown field") for p in e.value.problems)
    assert any(p.startswith("thresholds.warning: must be a finite number") for p in e.value.problems)


def test_the_alerts_section_is_held_parsed_by_the_configuration():
    params = build_config({"alerts": {"critical_window": "2m", "prefix_hit_ratio_low": "0.3"}}).alerts
    assert params == RuleParams(critical_window="2m", prefix_hit_ratio_low=0.3)
    with pytest.raises(ConfigError) as e:
        build_config({"alerts": {"critical_window": "soon"}})
    assert e.value.problems == [
        "alerts.critical_window: not a Prometheus duration: 'soon' (use e.g. 30s, 5m, 1h30m, 1d)"
    ]


def test_the_old_critical_for_still_loads_with_a_deprecation_message(tmp_path, caplog, capsys):
    """A config written for the "above the watermark for 5m" page (critical_for) loads and renders the
    peak-based page; the log says critical_for is ignored and what replaced it."""
    cfg = tmp_path / "old.yaml"
    cfg.write_text("alerts:\n  critical_for: 3m\n  warning_for: 20m\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="kv_sidecar.config"):
        params = load_config(str(cfg), env={}).alerts
    assert params == RuleParams(warning_for="20m")  # nothing else lost, critical_for not applied
    (message,) = [r.getMessage() for r in caplog.records if r.name == "kv_sidecar.config"]
    assert message.startswith("alerts.critical_for: deprecated and ignored")
    assert "critical_window" in message and "critical_quantile" in message
    caplog.clear()
    with caplog.at_level("WARNING", logger="kv_sidecar.config"):
        assert _cli("rules", "render", "--config.file", str(cfg)) == 0
    assert any("alerts.critical_for: deprecated" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr().out == render(Thresholds(), RuleParams(warning_for="20m"))


def test_bad_config_exits_2_with_the_field_named_and_no_traceback(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("thresholds:\n  watermark: 0.7\nalerts:\n  critical_window: soon\n", encoding="utf-8")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 2
    err = capsys.readouterr().err
    assert "thresholds.warning: must be below thresholds.watermark" in err
    assert "Traceback" not in err
    cfg.write_text("alerts:\n  critical_window: soon\n", encoding="utf-8")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 2
    assert "alerts.critical_window: not a Prometheus duration: 'soon'" in capsys.readouterr().err
    assert _cli("rules", "render", "--config.file", str(tmp_path / "missing.yaml")) == 2
    assert "cannot read the file" in capsys.readouterr().err


def test_render_reads_the_file_alone_whatever_the_environment(tmp_path, capsys, monkeypatch):
    """The rules in git must not depend on the shell that rendered them."""
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("thresholds:\n  watermark: 0.85\n", encoding="utf-8")
    monkeypatch.setenv("KV_SIDECAR_THRESHOLDS_WATERMARK", "0.95")
    monkeypatch.setenv("KV_SIDECAR_SCRAPE_INTERVAL", "not a duration")
    monkeypatch.setenv("KV_SIDECAR_TARGET", "localhost")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 0
    out = capsys.readouterr().out
    assert "max_over_time(kvcache_usage_ratio[1m]) > 0.85" in out and "> 0.95" not in out
    assert _cli("rules", "render") == 0  # no file: the defaults, not the environment's watermark
    assert capsys.readouterr().out == DEFAULT_RULES.read_text(encoding="utf-8")


def test_render_does_not_need_the_production_machines_model_files(tmp_path, capsys):
    """Rendering reads thresholds: and alerts:; a model.config path of the serving pod need not exist in CI."""
    cfg = tmp_path / "production.yaml"
    cfg.write_text(
        "targets: [http://vllm.llm.svc:8000/metrics]\n"
        "model: {config: /models/does-not-exist-here, tensor_parallel_size: 8}\n"
        "thresholds: {watermark: 0.92}\n"
        "alerts: {critical_window: 3m}\n",
        encoding="utf-8",
    )
    assert _cli("rules", "render", "--config.file", str(cfg)) == 0
    out = capsys.readouterr().out
    assert "> 0.92" in out and "kvcache_usage_ratio[3m]" in out
    with pytest.raises(ConfigError, match="model.config"):
        load_config(str(cfg), env={})  # the sidecar itself still refuses it
    cfg.write_text("model: {config: /nope}\nthresholds: {watermark: 1.5}\nalert: {critical_window: 3m}\n")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 2
    err = capsys.readouterr().err
    assert (
        "thresholds.watermark: must be a fraction" in err and "alert: unknown section (did you mean 'alerts'?)" in err
    )
    assert "model.config" not in err


def test_a_bad_render_flag_exits_2_naming_the_flag(capsys):
    assert _cli("rules", "render", "--thresholds.watermark", "high") == 2
    assert "thresholds.watermark (from --thresholds.watermark): must be a finite number, got 'high'" in (
        capsys.readouterr().err
    )


def test_out_pointing_at_a_file_exits_2(tmp_path, capsys):
    f = tmp_path / "file.yaml"
    f.write_text("x", encoding="utf-8")
    assert _cli("rules", "render", "--out", str(f)) == 2
    assert "--out:" in capsys.readouterr().err and f.read_text() == "x"


# -------------------------------------------------------------------- runbooks

SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_every_alert_has_a_runbook_with_the_four_sections(name):
    path = RUNBOOKS / f"{name}.md"
    assert path.is_file(), f"missing runbook {path.relative_to(REPO)}"
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# {name}\n")
    positions = [text.find(s) for s in SECTIONS]
    assert all(p > 0 for p in positions) and positions == sorted(positions), f"{name}: sections {SECTIONS} in order"


def test_every_runbook_names_the_dashboard_its_alert_links():
    """The runbook's **Dashboard:** line and the alert's dashboard_url open the same dashboard."""
    linked: dict[str, set[str]] = {}
    for rule in _alerts(build_rule_groups(Thresholds(), RuleParams(dashboard_base_url="https://grafana.test"))):
        linked.setdefault(rule["alert"], set()).add(re.search(r"/d/([^?]+)\?", rule["annotations"]["dashboard_url"])[1])
    for name, uids in linked.items():
        text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
        named = re.findall(r"^\*\*Dashboard:\*\* .*\(uid `([a-z-]+)`\)", text, flags=re.M)
        assert named == sorted(uids), f"{name}: the runbook names {named}, the alert links {sorted(uids)}"
        # and the Diagnosis sends on-call to that dashboard, not another
        diagnosis = text[text.index("## Diagnosis") : text.index("## Mitigation")]
        for opened in re.findall(r"`(" + "|".join(DASHBOARD_UIDS) + r")`", diagnosis):
            assert opened in uids, f"{name}: its Diagnosis opens {opened}, the alert links {sorted(uids)}"


def test_every_runbook_belongs_to_an_alert():
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == sorted(ALERT_NAMES)


def test_almost_full_runbook_says_a_steady_092_pages_by_design():
    text = (RUNBOOKS / "KVCacheAlmostFull.md").read_text(encoding="utf-8")
    assert "0.92" in text and "by design" in text
    for knob in ("--gpu-memory-utilization", "--kv-cache-dtype fp8", "--max-model-len", "replicas"):
        assert knob in text, knob


def test_runbooks_query_only_metrics_the_sidecar_exports_or_the_rules_record():
    # the catalogue every exported series is documented from (docs/metrics.md)
    exported = {m.name for m in CATALOGUE}
    recorded = {
        r["record"]
        for g in build_rule_groups(Thresholds(), RuleParams())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    for path in sorted(RUNBOOKS.glob("*.md")):
        names = set(re.findall(r"\b(?:[a-z_]+:)?kvcache_[a-z_]+(?::[a-z0-9_]+)?", path.read_text(encoding="utf-8")))
        unknown = {n for n in names if n not in exported and n not in recorded}
        assert not unknown, f"{path.name} mentions metrics nobody exports: {sorted(unknown)}"


# ------------------------------------------------------------- two overlays, one Prometheus


def _overlay_groups(name: str) -> list[dict]:
    """The rule groups the overlay applies (its generated PrometheusRule)."""
    doc = yaml.safe_load((REPO / "deploy" / "overlays" / name / "prometheusrule.yaml").read_text(encoding="utf-8"))
    return doc["spec"]["groups"]


def _two_overlays_in_one_prometheus(promtool, tmp_path, dev: list[dict], prod: list[dict]):
    """promtool with both overlays' rules loaded: pods at 0.87 in llm-dev (pages at 90%) and llm-prod (85%)."""
    (tmp_path / "dev.rules.yaml").write_text(yaml.safe_dump({"groups": dev}), encoding="utf-8")
    (tmp_path / "prod.rules.yaml").write_text(yaml.safe_dump({"groups": prod}), encoding="utf-8")
    pod = 'job="kv-cache-sidecar", target="vllm", model_name="m", engine="0"'
    case = {
        "rule_files": ["dev.rules.yaml", "prod.rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "name": "each namespace alerts and records once, at its own watermark",
                "interval": "30s",
                "input_series": [
                    {"series": f'kvcache_usage_ratio{{namespace="{ns}", pod="vllm-0", {pod}}}', "values": "0.87x20"}
                    for ns in ("llm-dev", "llm-prod")
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "KVCacheAlmostFull",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", "namespace": "llm-prod", "pod": "vllm-0"}
                                | dict(kv.split("=") for kv in pod.replace('"', "").split(", ")),
                                "exp_annotations": {
                                    "summary": "KV cache usage keeps reaching the 85% paging watermark.",
                                    "description": "KV cache of m (engine 0) on llm-prod/vllm-0 was above the "
                                    "85% watermark for more than 5% of the last 10m (p95: 87%). New requests queue "
                                    "and running ones are preempted once it is full.",
                                    "runbook_url": f"{RuleParams().runbook_base_url}/KVCacheAlmostFull.md",
                                },
                            }
                        ],
                    }
                ],
                "promql_expr_test": [
                    {
                        "expr": "namespace_model:kvcache_usage_above_watermark:bool",
                        "eval_time": "6m",
                        "exp_samples": [
                            {
                                "labels": 'namespace_model:kvcache_usage_above_watermark:bool{namespace="llm-dev", '
                                'model_name="m"}',
                                "value": 0,
                            },
                            {
                                "labels": 'namespace_model:kvcache_usage_above_watermark:bool{namespace="llm-prod", '
                                'model_name="m"}',
                                "value": 1,
                            },
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "overlays_test.yaml").write_text(yaml.safe_dump(case, sort_keys=False), encoding="utf-8")
    return run_tool(promtool, "test", "rules", "overlays_test.yaml", cwd=tmp_path)


def test_two_overlays_in_one_prometheus_never_alert_or_record_twice(promtool, tmp_path):
    """The dev (90%) and prod (85%) overlays' rules side by side: one page (prod's), one series per namespace."""
    res = _two_overlays_in_one_prometheus(promtool, tmp_path, _overlay_groups("dev"), _overlay_groups("prod"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_unscoped_overlays_would_alert_and_record_twice(promtool, tmp_path):
    """The same check bites: without alerts.namespace both files record every namespace's series."""
    unscoped = [
        build_rule_groups(th, RuleParams())["groups"]
        for th in (Thresholds(), Thresholds(watermark=0.85, warning=0.75, target_usage=0.7))
    ]
    res = _two_overlays_in_one_prometheus(promtool, tmp_path, *unscoped)
    assert res.returncode != 0
    # the two files write the same recorded series with different values
    assert "duplicate sample for timestamp" in res.stdout + res.stderr, res.stdout + res.stderr


def test_every_series_a_namespaced_rule_reads_carries_the_namespace():
    """alerts.namespace reaches every selector of every rule, alerting and recording (the default has none)."""
    for rule in (
        r for g in build_rule_groups(Thresholds(), RuleParams(namespace="llm-prod"))["groups"] for r in g["rules"]
    ):
        selectors = re.findall(r"\b((?:[a-z_]+:)?kvcache_[a-z_]+(?::[a-z0-9_]+)?|up)\b(\{[^}]*\})?(?!\()", rule["expr"])
        assert selectors, rule
        for name, matchers in selectors:
            assert 'namespace="llm-prod"' in matchers, (rule.get("alert", rule.get("record")), name, rule["expr"])
    for rule in (r for g in build_rule_groups(Thresholds(), RuleParams())["groups"] for r in g["rules"]):
        assert "namespace=" not in rule["expr"], rule
