"""alerts/alertmanager.yaml: valid for amtool, routes as documented, inhibition scoped, secrets in files."""

from __future__ import annotations

import json

import pytest
import yaml
from alerttools import ALERTS, run_tool

CONFIG = ALERTS / "alertmanager.yaml"


def _config() -> dict:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def test_amtool_check_config(amtool):
    res = run_tool(amtool, "check-config", str(CONFIG))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout and "1 inhibit rules" in res.stdout and "3 receivers" in res.stdout


# (labels of the alert, receivers it must reach, in Alertmanager's order)
ROUTES = [
    pytest.param(
        ["alertname=KVCacheAlmostFull", "severity=critical", "namespace=llm", "model_name=m", "pod=vllm-0"],
        "pagerduty-critical,slack-warnings",
        id="critical-pages-and-posts",
    ),
    pytest.param(
        ["alertname=KVCacheSidecarDown", "severity=critical", "job=kv-cache-sidecar"],
        "pagerduty-critical,slack-warnings",
        id="sidecar-down-pages",
    ),
    pytest.param(
        ["alertname=KVCacheAlmostFull", "severity=warning", "namespace=llm", "model_name=m"],
        "slack-warnings",
        id="warning-tickets",
    ),
    pytest.param(
        ["alertname=KVCacheOverProvisioned", "severity=info", "namespace=llm"], "null", id="info-is-recorded-only"
    ),
    pytest.param(["alertname=Watchdog", "severity=none"], "null", id="watchdog"),
    # a Watchdog is never a page, even if someone labels it critical
    pytest.param(["alertname=Watchdog", "severity=critical"], "null", id="watchdog-labelled-critical"),
    pytest.param(["alertname=SomethingElse"], "null", id="unlabelled-alert"),
    pytest.param(["alertname=KVCacheAlmostFull", "severity=page"], "null", id="unknown-severity"),
]


@pytest.mark.parametrize("labels, receivers", ROUTES)
def test_routes(amtool, labels, receivers):
    res = run_tool(
        amtool, "config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receivers}", *labels
    )
    assert res.returncode == 0, f"{labels}: expected {receivers}, got {res.stdout.strip()} {res.stderr.strip()}"
    assert res.stdout.strip() == receivers


def test_route_table_can_fail(amtool):
    """amtool exits 1 on a wrong expectation, so the table above really checks something."""
    res = run_tool(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        "--verify.receivers=null",
        "alertname=KVCacheAlmostFull",
        "severity=critical",
    )
    assert res.returncode == 1 and "Expected receivers did not match" in res.stdout + res.stderr


def test_every_inhibit_rule_is_scoped_by_alertname():
    """Without `equal`, one critical alert anywhere would silence every warning everywhere."""
    rules = _config()["inhibit_rules"]
    assert rules
    for rule in rules:
        assert "alertname" in rule.get("equal", []), rule
        # the new matcher syntax, not the deprecated source_match/target_match
        assert "source_matchers" in rule and "target_matchers" in rule, rule
    assert {
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["alertname", "namespace", "pod"],
    } in rules


def test_grouping_and_receiver_names():
    cfg = _config()
    assert cfg["route"]["group_by"] == ["alertname", "namespace", "model_name"]
    assert cfg["route"]["receiver"] == "null"
    assert sorted(r["name"] for r in cfg["receivers"]) == ["null", "pagerduty-critical", "slack-warnings"]


SECRET_KEYS = {
    "routing_key",
    "service_key",
    "api_url",
    "api_key",
    "webhook_url",
    "url",
    "auth_password",
    "password",
    "bearer_token",
    "token",
    "credentials",
    "client_secret",
}


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{path}.{k}", k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_secrets_only_as_files():
    cfg = _config()
    inline = [p for p, k, _ in _walk(cfg) if k in SECRET_KEYS]
    assert inline == [], f"secrets must be *_file: {inline}"
    files = {k: v for _, k, v in _walk(cfg) if k.endswith("_file")}
    assert set(files) == {"routing_key_file", "api_url_file"}
    assert all(v.startswith("/etc/alertmanager/secrets/") for v in files.values())
    pagerduty = next(r for r in cfg["receivers"] if r["name"] == "pagerduty-critical")["pagerduty_configs"][0]
    assert pagerduty["send_resolved"] is True
    slack = next(r for r in cfg["receivers"] if r["name"] == "slack-warnings")["slack_configs"][0]
    assert slack["send_resolved"] is True


# A notification template that fails to execute makes Alertmanager drop the notification, so
# each template string in the receivers is rendered with amtool against a realistic page.
PAGE = {
    "receiver": "pagerduty-critical",
    "status": "firing",
    "externalURL": "http://alertmanager:9093",
    "groupLabels": {"alertname": "KVCacheAlmostFull", "namespace": "llm", "model_name": "m"},
    "commonLabels": {
        "alertname": "KVCacheAlmostFull",
        "severity": "critical",
        "namespace": "llm",
        "model_name": "m",
        "pod": "vllm-0",
    },
    "commonAnnotations": {
        "summary": "KV cache usage is above the 90% paging watermark.",
        "runbook_url": "https://example.org/docs/runbooks/KVCacheAlmostFull.md",
    },
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "KVCacheAlmostFull",
                "severity": "critical",
                "namespace": "llm",
                "model_name": "m",
                "pod": "vllm-0",
            },
            "annotations": {
                "summary": "KV cache usage is above the 90% paging watermark.",
                "description": "KV cache of m (engine 0) on llm/vllm-0 has been above the 90% watermark.",
                "runbook_url": "https://example.org/docs/runbooks/KVCacheAlmostFull.md",
                "dashboard_url": "https://grafana.example.com/d/kvcache-overview?var-namespace=llm",
            },
            "startsAt": "2026-11-30T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": "0123456789abcdef",
        }
    ],
}


def _templates(cfg: dict):
    for receiver in cfg["receivers"]:
        for kind, configs in receiver.items():
            if kind.endswith("_configs"):
                for conf in configs:
                    for path, _, value in _walk(conf, f"{receiver['name']}.{kind}"):
                        if isinstance(value, str) and "{{" in value:
                            yield path, value


@pytest.mark.parametrize("path, template", [pytest.param(p, t, id=p) for p, t in _templates(_config())])
def test_receiver_templates_render(amtool, tmp_path, path, template):
    (tmp_path / "empty.tmpl").write_text("", encoding="utf-8")
    data = tmp_path / "page.json"
    data.write_text(json.dumps(PAGE), encoding="utf-8")
    res = run_tool(
        amtool,
        "template",
        "render",
        f"--template.glob={tmp_path / 'empty.tmpl'}",
        f"--template.data={data}",
        f"--template.text={template}",
    )
    assert res.returncode == 0, f"{path}: {res.stderr}"
    assert "<no value>" not in res.stdout, f"{path} renders a missing field: {res.stdout}"


def test_slack_title_of_a_page(amtool, tmp_path):
    slack = next(r for r in _config()["receivers"] if r["name"] == "slack-warnings")["slack_configs"][0]
    (tmp_path / "empty.tmpl").write_text("", encoding="utf-8")
    (tmp_path / "page.json").write_text(json.dumps(PAGE), encoding="utf-8")
    res = run_tool(
        amtool,
        "template",
        "render",
        f"--template.glob={tmp_path / 'empty.tmpl'}",
        f"--template.data={tmp_path / 'page.json'}",
        f"--template.text={slack['title']}",
    )
    assert res.stdout == "[FIRING:1] KVCacheAlmostFull (critical) llm m"
