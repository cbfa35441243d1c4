"""End to end: a saturated (simulated) vLLM pages through the real Prometheus and Alertmanager.

    kv-sidecar simulate --scenario ramp      the vLLM stand-in, driven past saturation
      <- kv-sidecar run --scrape.interval 1s the sidecar under test
      <- prometheus                          Debian's binary, evaluating the *fast* variant of
                                             our rules (rendered by `kv-sidecar rules render`)
      -> prometheus-alertmanager             alerts/alertmanager.yaml with its receivers pointed
                                             at a webhook served by this test (routes and
                                             inhibition unchanged, group_wait 1s)
      -> webhook                             must receive the critical KVCacheAlmostFull page

and one saturation must be ONE page: every notification the paging receiver gets carries one
group key (PagerDuty's dedup key, so one incident) though two critical alerts fire (AlmostFull and
FullSoon), and Alertmanager's /api/v2/alerts must show the pod's warnings (the 80% ticket,
preemptions, requests waiting for KV) inhibited by the page.
Everything listens on 127.0.0.1 on free ports; every process is stopped in teardown, also
when the test fails. Bounded to 2 minutes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from alerttools import ALERTS, REPO
from processes import Processes, free_port, http_get, kv_sidecar, prometheus_argv
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

#: How long the saturation is watched after the first page, for later notifications to arrive.
WATCH_AFTER_PAGE_S = 20

#: The ramp scenario holds 120% of the saturating arrival rate once it gets there; at 30x
#: it saturates within about 10 s of wall time and stays at 0.94-1.0.
SCENARIO, SPEED = "ramp", "30"


class Webhook:
    """Alertmanager's webhook receiver: records every notification, by receiver path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def alerts(self, receiver: str) -> list[dict]:
        return [a for path, msg in list(self.received) if path == f"/{receiver}" for a in msg["alerts"]]


def test_alertmanager_config(webhook_port: int) -> dict:
    """alerts/alertmanager.yaml with every receiver except "null" sent to the test's webhook.

    Routes, grouping and inhibition stay as committed; only the timers shrink.
    """
    cfg = yaml.safe_load((ALERTS / "alertmanager.yaml").read_text(encoding="utf-8"))
    for receiver in cfg["receivers"]:
        if receiver["name"] != "null":
            for key in [k for k in receiver if k.endswith("_configs")]:
                del receiver[key]
            receiver["webhook_configs"] = [
                {"url": f"http://127.0.0.1:{webhook_port}/{receiver['name']}", "send_resolved": False}
            ]
    cfg["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    return cfg


test_alertmanager_config.__test__ = False  # a helper, not a test


@pytest.fixture
def stack(tmp_path, prometheus_bin, alertmanager_bin):
    """Simulator, sidecar, Prometheus and Alertmanager, wired together; always stopped."""
    prometheus, alertmanager = prometheus_bin, alertmanager_bin
    ports = {name: free_port() for name in ("sim", "sidecar", "prometheus", "alertmanager")}
    kv = kv_sidecar()

    rules_dir = tmp_path / "rules"
    res = subprocess.run(
        [*kv, "rules", "render", "--variant", "fast", "--out", str(rules_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    rule_file = rules_dir / "kvcache.rules.yaml"

    with Webhook() as webhook, contextlib.ExitStack() as stack:
        procs = Processes(tmp_path)
        stack.callback(procs.stop)

        am_config = tmp_path / "alertmanager.yaml"
        am_config.write_text(yaml.safe_dump(test_alertmanager_config(webhook.port), sort_keys=False))
        prom_config = tmp_path / "prometheus.yaml"
        prom_config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rule_file)],
                    "alerting": {
                        "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]
                    },
                    "scrape_configs": [
                        {
                            "job_name": "kv-cache-sidecar",  # the rules' default alerts.sidecar_job
                            "static_configs": [{"targets": [f"127.0.0.1:{ports['sidecar']}"]}],
                        }
                    ],
                },
                sort_keys=False,
            )
        )

        procs.start(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={am_config}",
                f"--storage.path={tmp_path / 'am-data'}",
                # an empty cluster address disables clustering (no gossip port)
                f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
                "--cluster.listen-address=",
            ],
        )
        procs.start("prometheus", prometheus_argv(prometheus, prom_config, tmp_path / "prom-data", ports["prometheus"]))
        procs.start(
            "simulator",
            [
                *kv,
                "simulate",
                "--host",
                "127.0.0.1",
                "--port",
                str(ports["sim"]),
                "--scenario",
                SCENARIO,
                "--speed",
                SPEED,
                "--seed",
                "1",
            ],
        )
        procs.start(
            "sidecar",
            [
                *kv,
                "run",
                "--target",
                f"http://127.0.0.1:{ports['sim']}/metrics",
                "--web.listen-address",
                f"127.0.0.1:{ports['sidecar']}",
                "--scrape.interval",
                "1s",
            ],
        )

        ready = {
            "alertmanager": f"http://127.0.0.1:{ports['alertmanager']}/-/ready",
            "prometheus": f"http://127.0.0.1:{ports['prometheus']}/-/ready",
            "simulator": f"http://127.0.0.1:{ports['sim']}/health",
            "sidecar": f"http://127.0.0.1:{ports['sidecar']}/readyz",
        }
        deadline = time.monotonic() + 40
        while ready and time.monotonic() < deadline:
            procs.check_alive()
            ready = {name: url for name, url in ready.items() if http_get(url)[0] != 200}
            time.sleep(0.3)
        assert not ready, f"not ready within 40 s: {sorted(ready)}\n{procs.logs(*ready)}"
        yield {"ports": ports, "webhook": webhook, "procs": procs, "started": time.monotonic()}


def test_saturation_pages_through_prometheus_and_alertmanager(stack):
    ports, webhook, procs, started = stack["ports"], stack["webhook"], stack["procs"], stack["started"]
    am = f"http://127.0.0.1:{ports['alertmanager']}"

    # The page: the critical KVCacheAlmostFull must reach the paging receiver (the fast
    # variant: above 0.9 for 5% of the last 60 s, evaluated every second; Alertmanager waits 1 s).
    deadline = time.monotonic() + 100
    page = None
    while page is None and time.monotonic() < deadline:
        procs.check_alive()
        page = next(
            (a for a in webhook.alerts("pagerduty-critical") if a["labels"].get("alertname") == "KVCacheAlmostFull"),
            None,
        )
        time.sleep(0.5)
    assert page is not None, (
        "no KVCacheAlmostFull page reached the webhook; received: "
        f"{[(p, [a['labels'] for a in m['alerts']]) for p, m in webhook.received]}\n"
        f"{procs.logs()}"
    )
    print(f"page reached the webhook {time.monotonic() - started:.1f} s after the stack was ready")

    # Right labels: the sidecar's own series labels, plus what Prometheus and the rule add.
    status, body = http_get(f"http://127.0.0.1:{ports['sidecar']}/metrics")
    assert status == 200
    usage = next(
        s for f in text_string_to_metric_families(body.decode()) for s in f.samples if s.name == "kvcache_usage_ratio"
    )
    assert page["status"] == "firing"
    assert page["labels"] == {
        **usage.labels,
        "alertname": "KVCacheAlmostFull",
        "severity": "critical",
        "job": "kv-cache-sidecar",
        "instance": f"127.0.0.1:{ports['sidecar']}",
    }
    assert usage.labels["target"] == f"127.0.0.1:{ports['sim']}" and usage.labels["engine"] == "0"
    ann = page["annotations"]
    assert ann["summary"] == "KV cache usage keeps reaching the 90% paging watermark."
    assert ann["description"].startswith(
        f"KV cache of {usage.labels['model_name']} (engine 0) on 127.0.0.1:{ports['sidecar']} was above "
        f"the 90% watermark for more than 5% of the last 60s (p95: "
    )
    assert ann["runbook_url"].endswith("/docs/runbooks/KVCacheAlmostFull.md")
    assert "dashboard_url" not in ann  # no Grafana configured: no link that leads nowhere
    # critical also posts to Slack (continue: true)
    assert any(a["labels"].get("severity") == "critical" for a in webhook.alerts("slack-warnings"))

    # One saturation, one page: watch it a while longer, then count.
    time.sleep(WATCH_AFTER_PAGE_S)
    procs.check_alive()
    pages = [m for path, m in list(webhook.received) if path == "/pagerduty-critical"]
    paged = sorted({a["labels"]["alertname"] for m in pages for a in m["alerts"]})
    print(
        f"{len(pages)} notifications to the paging receiver, {len({m['groupKey'] for m in pages})} group key(s) "
        f"(PagerDuty incidents), alerts in them: {paged}"
    )
    assert len({m["groupKey"] for m in pages}) == 1, [(m["groupKey"], m["alerts"]) for m in pages]
    assert pages[0]["groupLabels"] == {"model_name": usage.labels["model_name"]}  # no namespace outside Kubernetes
    assert set(paged) <= {"KVCacheAlmostFull", "KVCacheFullSoon"}

    # The pod's warnings exist in Alertmanager and are inhibited by the page.
    status, body = http_get(f"{am}/api/v2/alerts")
    assert status == 200, body
    alerts = json.loads(body)
    critical = {a["fingerprint"] for a in alerts if a["labels"].get("severity") == "critical"}
    warnings = [a for a in alerts if a["labels"].get("severity") == "warning"]
    assert {a["labels"]["alertname"] for a in warnings} >= {"KVCacheAlmostFull"}, alerts
    for warning in warnings:
        assert warning["status"]["state"] == "suppressed", warning
        assert set(warning["status"]["inhibitedBy"]) <= critical and warning["status"]["inhibitedBy"], warning
        assert {k: v for k, v in warning["labels"].items() if k not in ("severity", "alertname", "reason")} == {
            k: v for k, v in page["labels"].items() if k not in ("severity", "alertname")
        }
