"""alerts/alertmanager.yaml: valid for amtool, routes as documented, one group and one page per
saturation, inhibition scoped to the pod's symptoms (checked on a real Alertmanager), secrets in files."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from alerttools import ALERTS, run_tool
from processes import Processes, free_port, http_get

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
    pytest.param(
        ["alertname=KVCacheFullSoon", "severity=critical", "namespace=llm", "model_name=m", "pod=vllm-0"],
        "pagerduty-critical,slack-warnings",
        id="forecast-pages",
    ),
    pytest.param(
        ["alertname=KVCacheModelConfigMissing", "severity=warning", "namespace=llm", "model_name=m"],
        "slack-warnings",
        id="model-config-missing-tickets",
    ),
    # another team's critical alert is not ours to page for in this example
    pytest.param(["alertname=KubePodCrashLooping", "severity=critical"], "null", id="not-a-kvcache-alert"),
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


def test_the_inhibit_rule_mutes_only_the_saturations_symptoms_on_the_same_pod():
    """Without `equal`, one page anywhere would silence every warning everywhere."""
    (rule,) = _config()["inhibit_rules"]
    # the new matcher syntax, not the deprecated source_match/target_match
    assert rule == {
        "source_matchers": ['alertname=~"KVCacheAlmostFull|KVCacheFullSoon"', 'severity="critical"'],
        "target_matchers": [
            'alertname=~"KVCacheAlmostFull|KVCachePreemptions|KVCacheRequestsWaitingForKV"',
            'severity="warning"',
        ],
        "equal": ["namespace", "pod", "instance", "target"],
    }


def test_kvcache_alerts_group_by_model_not_by_alert_name():
    """One saturation raises several alert names; grouped by name, PagerDuty opened one incident each."""
    cfg = _config()
    (kv,) = [r for r in cfg["route"]["routes"] if r.get("matchers") == ['alertname=~"KVCache.+"']]
    assert kv["group_by"] == ["namespace", "model_name"] and "alertname" not in kv["group_by"]
    assert cfg["route"]["receiver"] == "null"
    assert sorted(r["name"] for r in cfg["receivers"]) == ["null", "pagerduty-critical", "slack-warnings"]


# ---------------------------------------------------------------- a real Alertmanager


def _post_alerts(am: str, alerts: list[dict]) -> None:
    import urllib.request

    req = urllib.request.Request(
        f"{am}/api/v2/alerts", data=json.dumps(alerts).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def _alert(name: str, severity: str, pod: str, **extra: str) -> dict:
    labels = {
        "alertname": name,
        "severity": severity,
        "namespace": "llm",
        "pod": pod,
        "instance": f"{pod}:9437",
        "target": "vllm",
        "model_name": "m",
        "engine": "0",
        "job": "kv-cache-sidecar",
        **extra,
    }
    return {"labels": labels, "annotations": {"summary": name, "description": f"{name} on {pod}"}}


@pytest.fixture
def alertmanager(tmp_path, alertmanager_bin):
    """The committed configuration in a real Alertmanager (no notification leaves: group_wait 1h)."""
    cfg = _config()
    cfg["route"]["group_wait"] = "1h"
    for receiver in cfg["receivers"]:
        for key in [k for k in receiver if k.endswith("_configs")]:
            del receiver[key]
    (tmp_path / "am.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    port = free_port()
    procs = Processes(tmp_path)
    try:
        procs.start(
            "alertmanager",
            [
                alertmanager_bin,
                f"--config.file={tmp_path / 'am.yaml'}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
        )
        am = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while http_get(f"{am}/-/ready")[0] != 200:
            procs.check_alive()
            assert time.monotonic() < deadline, procs.logs()
            time.sleep(0.2)
        yield am
    finally:
        procs.stop()


def test_one_saturation_is_one_page_and_its_symptoms_are_inhibited(alertmanager, amtool):
    """vllm-0 saturates: two critical alerts and three symptoms. vllm-1 only preempts; vllm-0's config is wrong."""
    am = alertmanager
    _post_alerts(
        am,
        [
            _alert("KVCacheAlmostFull", "critical", "vllm-0"),
            _alert("KVCacheFullSoon", "critical", "vllm-0"),
            _alert("KVCacheAlmostFull", "warning", "vllm-0"),
            _alert("KVCachePreemptions", "warning", "vllm-0"),
            _alert("KVCacheRequestsWaitingForKV", "warning", "vllm-0", reason="capacity"),
            _alert("KVCacheCapacityMismatch", "warning", "vllm-0", budget="exact"),
            _alert("KVCachePreemptions", "warning", "vllm-1"),
        ],
    )
    deadline = time.monotonic() + 10
    while True:
        status, body = http_get(f"{am}/api/v2/alerts")
        alerts = json.loads(body)
        if len(alerts) == 7 and all(a["status"]["state"] != "unprocessed" for a in alerts):
            break
        assert time.monotonic() < deadline, alerts
        time.sleep(0.2)
    state = {(a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["pod"]): a["status"] for a in alerts}
    inhibited = sorted(k for k, v in state.items() if v["inhibitedBy"])
    assert inhibited == [
        ("KVCacheAlmostFull", "warning", "vllm-0"),
        ("KVCachePreemptions", "warning", "vllm-0"),
        ("KVCacheRequestsWaitingForKV", "warning", "vllm-0"),
    ]
    # amtool sees the same: the inhibited ones only with --inhibited
    res = run_tool(amtool, "alert", "query", f"--alertmanager.url={am}", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == 4  # 2 pages, the mismatch (maybe the cause), vllm-1's preemptions

    # One group on the paging receiver holds both pages: one PagerDuty incident (its dedup key is
    # the group's key).
    status, body = http_get(f"{am}/api/v2/alerts/groups")
    groups = [g for g in json.loads(body) if g["receiver"]["name"] == "pagerduty-critical"]
    assert len(groups) == 1, groups
    assert groups[0]["labels"] == {"namespace": "llm", "model_name": "m"}
    assert sorted(a["labels"]["alertname"] for a in groups[0]["alerts"]) == ["KVCacheAlmostFull", "KVCacheFullSoon"]


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
# each template string in the receivers is rendered with amtool against realistic notifications:
# one saturation's page (two alerts of one group), and the sidecar-down page (no model, no pod).
def _notified(labels: dict, description: str) -> dict:
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {
            "summary": f"{labels['alertname']} summary.",
            "description": description,
            "runbook_url": f"https://example.org/docs/runbooks/{labels['alertname']}.md",
        },
        "startsAt": "2026-11-30T00:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": "0123456789abcdef",
    }


_POD = {"severity": "critical", "namespace": "llm", "model_name": "m", "pod": "vllm-0", "instance": "10.0.0.7:9437"}
PAGE = {
    "receiver": "pagerduty-critical",
    "status": "firing",
    "externalURL": "http://alertmanager:9093",
    "groupLabels": {"namespace": "llm", "model_name": "m"},
    "commonLabels": _POD,
    "commonAnnotations": {},
    "alerts": [
        _notified({"alertname": "KVCacheAlmostFull", **_POD}, "KV cache of m (engine 0) on llm/vllm-0 is above 90%."),
        _notified({"alertname": "KVCacheFullSoon", **_POD}, "The KV cache of m on llm/vllm-0 is full in 4m."),
    ],
}
_DOWN = {"alertname": "KVCacheSidecarDown", "severity": "critical", "job": "kv-cache-sidecar"}
SIDECAR_DOWN = {
    **PAGE,
    "groupLabels": {},
    "commonLabels": _DOWN,
    "alerts": [_notified(_DOWN, "No target of job kv-cache-sidecar is known to Prometheus for 5m.")],
}


def _templates(cfg: dict):
    for receiver in cfg["receivers"]:
        for kind, configs in receiver.items():
            if kind.endswith("_configs"):
                for conf in configs:
                    for path, _, value in _walk(conf, f"{receiver['name']}.{kind}"):
                        if isinstance(value, str) and "{{" in value:
                            yield path, value


def _render(amtool: str, tmp_path, template: str, data: dict):
    (tmp_path / "empty.tmpl").write_text("", encoding="utf-8")
    (tmp_path / "data.json").write_text(json.dumps(data), encoding="utf-8")
    return run_tool(
        amtool,
        "template",
        "render",
        f"--template.glob={tmp_path / 'empty.tmpl'}",
        f"--template.data={tmp_path / 'data.json'}",
        f"--template.text={template}",
    )


@pytest.mark.parametrize("data", [PAGE, SIDECAR_DOWN], ids=["saturation", "sidecar-down"])
@pytest.mark.parametrize("path, template", [pytest.param(p, t, id=p) for p, t in _templates(_config())])
def test_receiver_templates_render(amtool, tmp_path, path, template, data):
    res = _render(amtool, tmp_path, template, data)
    assert res.returncode == 0, f"{path}: {res.stderr}"
    assert "<no value>" not in res.stdout, f"{path} renders a missing field: {res.stdout}"


def test_the_page_names_every_alert_of_the_saturation(amtool, tmp_path):
    slack = next(r for r in _config()["receivers"] if r["name"] == "slack-warnings")["slack_configs"][0]
    res = _render(amtool, tmp_path, slack["title"], PAGE)
    assert res.stdout == "[FIRING:2] m in llm: KVCacheAlmostFull on vllm-0, KVCacheFullSoon on vllm-0"
    pagerduty = next(r for r in _config()["receivers"] if r["name"] == "pagerduty-critical")["pagerduty_configs"][0]
    res = _render(amtool, tmp_path, pagerduty["description"], SIDECAR_DOWN)
    assert res.stdout == "KV-cache sidecar: KVCacheSidecarDown"
