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

from sidecar.artifacts import cli as rules_cli
from sidecar.artifacts import rules
from sidecar.artifacts.params import (
    DASHBOARD_UIDS,
    DASHBOARD_VARIABLES,
    FAST_VARIANT,
    VAR_DATASOURCE,
    RuleParams,
    Thresholds,
)
from sidecar.artifacts.rules import ALERT_NAMES, build_rule_groups, render
from sidecar.config import ConfigError, build_config, load_config
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
    gap = RuleParams().gap_window
    assert by_severity == {
        "warning": f"max_over_time(kvcache_usage_ratio[{gap}]) > {Thresholds().warning:g}",
        "critical": f"max_over_time(kvcache_usage_ratio[{gap}]) > {Thresholds().watermark:g}",
    }
    waiting = next(r for r in _alerts(doc) if r["alert"] == "KVCacheRequestsWaitingForKV")
    assert waiting["expr"].endswith(f"> {Thresholds().watermark:g}")


def test_config_file_thresholds_reach_both_the_sidecar_and_the_rules(tmp_path, capsys):
    """The sidecar's loader and `rules render` read the same thresholds: section."""

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "thresholds:\n  watermark: 0.85\n  warning: 0.7\n  target_usage: 0.6\n"
        "alerts:\n  critical_for: 3m\n  sidecar_job: llm/kv-sidecar\n",
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
    assert critical["for"] == "3m"
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
                    assert set(alert["exp_annotations"]) == {
                        "summary",
                        "description",
                        "runbook_url",
                        "dashboard_url",
                    }, (path.name, test["name"])
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
        "[1m]",
        "[2m]",
        "0.95 for 4 minutes does not page",
        id="2m-gap-window-stretches-a-4m-spike-into-a-page",
    ),
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "max_over_time(kvcache_usage_ratio[1m])",
        "kvcache_usage_ratio",
        "saturation with missed scrapes and a dropped series",
        id="plain-comparison-resets-on-a-gap",
    ),
    pytest.param(
        "almost_full_test.yaml",
        "KVCacheAlmostFull/critical",
        "max_over_time",
        "last_over_time",
        "a sawtooth between 0.87 and 0.93",
        id="last-value-misses-a-saturated-sawtooth",
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
        "capacity_test.yaml",
        "KVCachePrefixHitRatioLow",
        "namespace_model:kvcache_prefix_cache_hits_per_queries_tokens:ratio_rate5m",
        "avg by (namespace, model_name) (rate(kvcache_prefix_cache_hits_tokens_total[5m])"
        " / rate(kvcache_prefix_cache_queries_tokens_total[5m]))",
        "ratio of sums, not a mean of pod ratios",
        id="mean-of-pod-ratios",
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
    assert page["for"] == "40s" and page["expr"] == "max_over_time(kvcache_usage_ratio[5s]) > 0.9"
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
    for rule in _alerts(build_rule_groups(Thresholds(), RuleParams())):
        ann = rule["annotations"]
        assert ann["runbook_url"] == f"{RuleParams().runbook_base_url}/{rule['alert']}.md"
        uid = re.search(r"/d/([^?]+)\?", ann["dashboard_url"]).group(1)
        assert uid in DASHBOARD_UIDS
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["alert"].startswith("KVCache") and ann["summary"].endswith(".")


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
        ({"critical_for": "5 min"}, "alerts.critical_for: not a Prometheus duration: '5 min'"),
        ({"gap_window": "1.5m"}, "alerts.gap_window: not a Prometheus duration"),
        ({"warning_for": "0s"}, "alerts.warning_for: must be greater than 0s, got '0s'"),
        ({"critcal_for": "5m"}, "alerts.critcal_for: unknown field (did you mean 'critical_for'?)"),
        ({"prefix_hit_ratio_low": 1.5}, "alerts.prefix_hit_ratio_low: must be a fraction between 0 and 1"),
        ({"capacity_mismatch_tolerance": "lots"}, "alerts.capacity_mismatch_tolerance: must be a finite number"),
        ({"preemptions_per_second": -1}, "alerts.preemptions_per_second: must be at least 0"),
        ({"sidecar_job": 'kv"x'}, "alerts.sidecar_job: must be a non-empty job label value"),
        ({"runbook_base_url": "docs/runbooks"}, "alerts.runbook_base_url: must be an http(s) URL"),
        ({"dashboard_base_url": "https://grafana.example.com/"}, "without a trailing slash"),
        ({"evaluation_interval": "fast"}, "alerts.evaluation_interval: not a Prometheus duration"),
    ],
)
def test_bad_alert_params_name_the_field_and_the_fix(mapping, field_fragment):
    problems = _alert_problems(mapping)
    assert len(problems) == 1 and field_fragment in problems[0], problems


def test_good_alert_params_and_every_problem_at_once():
    params = build_config(
        {"alerts": {"critical_for": "2m", "prefix_hit_ratio_low": "0.3", "evaluation_interval": None}}
    ).alerts
    assert params == RuleParams(critical_for="2m", prefix_hit_ratio_low=0.3, evaluation_interval=None)
    assert [p.split(":")[0] for p in _alert_problems({"critical_for": "x", "warning_for": "y", "nope": 1})] == [
        "alerts.nope",
        "alerts.warning_for",
        "alerts.critical_for",
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
    params = build_config({"alerts": {"critical_for": "2m", "prefix_hit_ratio_low": "0.3"}}).alerts
    assert params == RuleParams(critical_for="2m", prefix_hit_ratio_low=0.3)
    with pytest.raises(ConfigError) as e:
        build_config({"alerts": {"critical_for": "soon"}})
    assert e.value.problems == ["alerts.critical_for: not a Prometheus duration: 'soon' (use e.g. 30s, 5m, 1h30m, 1d)"]


def test_bad_config_exits_2_with_the_field_named_and_no_traceback(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("thresholds:\n  watermark: 0.7\nalerts:\n  critical_for: soon\n", encoding="utf-8")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 2
    err = capsys.readouterr().err
    assert "thresholds.warning: must be below thresholds.watermark" in err
    assert "Traceback" not in err
    cfg.write_text("alerts:\n  critical_for: soon\n", encoding="utf-8")
    assert _cli("rules", "render", "--config.file", str(cfg)) == 2
    assert "alerts.critical_for: not a Prometheus duration: 'soon'" in capsys.readouterr().err
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
        "alerts: {critical_for: 3m}\n",
        encoding="utf-8",
    )
    assert _cli("rules", "render", "--config.file", str(cfg)) == 0
    out = capsys.readouterr().out
    assert "> 0.92" in out and "for: 3m" in out
    with pytest.raises(ConfigError, match="model.config"):
        load_config(str(cfg), env={})  # the sidecar itself still refuses it
    cfg.write_text("model: {config: /nope}\nthresholds: {watermark: 1.5}\nalert: {critical_for: 3m}\n")
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


def test_every_runbook_belongs_to_an_alert():
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == sorted(ALERT_NAMES)


def test_almost_full_runbook_says_a_steady_092_pages_by_design():
    text = (RUNBOOKS / "KVCacheAlmostFull.md").read_text(encoding="utf-8")
    assert "0.92" in text and "by design" in text
    for knob in ("--gpu-memory-utilization", "--kv-cache-dtype fp8", "--max-model-len", "replicas"):
        assert knob in text, knob


def test_runbooks_query_only_metrics_the_sidecar_exports_or_the_rules_record():
    exported = {
        "kvcache_usage_ratio",
        "kvcache_capacity_tokens",
        "kvcache_used_tokens",
        "kvcache_free_tokens",
        "kvcache_watermark_headroom_tokens",
        "kvcache_prefix_cache_queries_tokens_total",
        "kvcache_prefix_cache_hits_tokens_total",
        "kvcache_preemptions_total",
        "kvcache_prefix_cache_hit_ratio",
        "kvcache_preemptions_per_second",
        "kvcache_requests_running",
        "kvcache_requests_waiting",
        "kvcache_server_info",
        "kvcache_engine_asleep",
        "kvcache_theoretical_capacity_tokens",
        "kvcache_capacity_efficiency_ratio",
        "kvcache_time_until_full_seconds",
        "kvcache_time_until_watermark_seconds",
        "kvcache_demand_tokens",
        "kvcache_fill_rate_tokens_per_second",
        "kvcache_recommendation_info",
        "kvcache_suggested_gpu_memory_utilization",
        "kvcache_suggested_kv_cache_memory_bytes",
        "kvcache_max_concurrent_requests",
        "kvcache_capacity_shortfall_tokens",
        "kvcache_suggested_replicas",
        "kvcache_theoretical_bytes_per_token",
        "kvcache_model_info",
        "kvcache_sidecar_target_up",
        "kvcache_sidecar_scrape_errors_total",
        "kvcache_sidecar_last_success_timestamp_seconds",
        "kvcache_sidecar_build_info",
        "kvcache_sidecar_scrape_duration_seconds",
        "kvcache_sidecar_config_changes_total",
    }
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
