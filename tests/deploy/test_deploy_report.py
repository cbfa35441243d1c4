"""The report's CronJob, rendered by ``kubectl kustomize``: its files on a volume claim that outlives the Job,
kept ``--keep-weeks`` weeks, and its summary to the chat webhook whose URL an optional Secret holds as a file."""

from __future__ import annotations

import pytest
from deploytools import KUSTOMIZATIONS, one, pod_spec

from sidecar.cli import build_parser

PATHS = [p for p in KUSTOMIZATIONS if p == "base" or p.startswith("overlays/")]


def _report(rendered, path):
    job = one(rendered[path], "CronJob")
    spec = pod_spec(job)
    (container,) = spec["containers"]
    args = build_parser().parse_args(
        [
            a.replace("$(PROMETHEUS_URL)", "http://prometheus:9090").replace("$(POD_NAMESPACE)", "ns")
            for a in container["args"]
        ]
    )
    return spec, container, args


@pytest.mark.parametrize("path", PATHS)
def test_the_reports_live_on_the_claim_rendered_beside_the_cronjob(rendered, path):
    spec, container, args = _report(rendered, path)
    claim = one(rendered[path], "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in spec["volumes"]}
    out_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(args.out))
    assert volumes[out_mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert claim["metadata"].get("namespace") == one(rendered[path], "CronJob")["metadata"].get("namespace")
    assert args.keep_weeks == 13


@pytest.mark.parametrize("path", PATHS)
def test_the_webhook_url_is_a_file_of_an_optional_secret_never_an_argument(rendered, path):
    spec, container, args = _report(rendered, path)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in container["volumeMounts"] if args.webhook_url_file.startswith(m["mountPath"] + "/"))
    secret = volumes[mount["name"]]["secret"]
    assert mount["readOnly"] is True
    assert secret["optional"] is True  # the Job runs, and writes its report, without it
    assert secret["secretName"] == "kv-cache-sidecar-report-webhook"
    assert args.webhook_url_file == f"{mount['mountPath']}/url"
    assert args.webhook_format == "slack" and not args.dry_run
    # never in the environment (kubectl describe shows it) nor in the arguments (ps shows them)
    assert all("secretKeyRef" not in e.get("valueFrom", {}) for e in container["env"])


def test_the_claims_size_is_a_parameter():
    from sidecar.artifacts.kubernetes import report_volume_claim

    assert report_volume_claim("5Gi")["spec"]["resources"]["requests"]["storage"] == "5Gi"
