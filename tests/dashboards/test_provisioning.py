"""Provisioning: Grafana's provisioning files, the ConfigMaps, and ``kv-sidecar dashboards render``.

No Grafana can run here, so the files are checked against what Grafana's file provisioning and the
Grafana Helm chart's dashboard sidecar read (Grafana docs, "Provision Grafana"; the chart's
``sidecar.dashboards.label``/``folderAnnotation``), and the ConfigMaps against the limit ``kubectl
apply`` puts on them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import yaml
from fixtures import REPO

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra: pip install -e '.[dashboards]'")

from sidecar.artifacts import dashboards_cli, provisioning
from sidecar.artifacts.params import DASHBOARD_UIDS, VAR_DATASOURCE
from sidecar.artifacts.provisioning import (
    CONFIGMAP_LIMIT_BYTES,
    CONFIGMAPS_FILE,
    DASHBOARDS_PATH,
    DATASOURCE_FILE,
    FOLDER_TITLE,
    FOLDER_UID,
    PROVIDER_FILE,
)

DASHBOARD_FILES = {uid: REPO / "dashboards" / f"{uid}.json" for uid in DASHBOARD_UIDS}


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kv-sidecar")
    dashboards_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return args.func(args)


def _configmaps(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


# --------------------------------------------------------------------------- provisioning files


def test_the_provisioning_directory_is_grafanas_layout_as_is():
    """``dashboards/provisioning`` mounts as ``/etc/grafana/provisioning``: one YAML per kind."""
    root = REPO / "dashboards" / "provisioning"
    files = sorted(str(p.relative_to(REPO)) for p in root.rglob("*") if p.is_file())
    assert files == sorted([PROVIDER_FILE, DATASOURCE_FILE])


def test_the_dashboard_provider_loads_the_json_files_read_only_into_one_folder():
    doc = yaml.safe_load((REPO / PROVIDER_FILE).read_text(encoding="utf-8"))
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    assert (provider["folder"], provider["folderUid"]) == (FOLDER_TITLE, FOLDER_UID) == ("KV cache", "kvcache")
    assert provider["allowUiUpdates"] is False  # the repository is the source of truth
    assert provider["options"]["path"] == DASHBOARDS_PATH == "/var/lib/grafana/dashboards/kvcache"


def test_the_datasource_has_the_fixed_uid_and_is_what_the_variable_selects():
    doc = yaml.safe_load((REPO / DATASOURCE_FILE).read_text(encoding="utf-8"))
    (ds,) = doc["datasources"]
    assert (ds["uid"], ds["type"], ds["url"]) == ("prometheus", "prometheus", "http://prometheus:9090")
    assert ds["isDefault"] is True  # what the datasource variable picks on first load
    for path in DASHBOARD_FILES.values():
        variable = json.loads(path.read_text(encoding="utf-8"))["templating"]["list"][0]
        assert (variable["name"], variable["query"]) == (VAR_DATASOURCE, ds["type"])


def test_a_push_onto_a_grafana_provisioned_from_these_files_changes_nothing(monkeypatch, capsys):
    """Grafana loads the committed files as the provider says; a push with its defaults then finds its
    folder (no second one) and every dashboard unchanged, and sends no write at all."""
    pytest.importorskip("grafana_client", reason="the dashboards extra: pip install -e '.[dashboards]'")
    from grafana_stub import GrafanaStub

    (provider,) = yaml.safe_load((REPO / PROVIDER_FILE).read_text(encoding="utf-8"))["providers"]
    stub = GrafanaStub(token="glsa_test")
    try:
        stub.add_folder(provider["folderUid"], provider["folder"])
        for path in DASHBOARD_FILES.values():
            doc = json.loads(path.read_text(encoding="utf-8"))
            stub.add_dashboard(
                doc, provider["folderUid"], provisioned_from=path.name, allow_ui_updates=provider["allowUiUpdates"]
            )
        monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test")
        capsys.readouterr()
        code = _cli("dashboards", "push", "--grafana-url", stub.url, "--dashboards", str(REPO / "dashboards"))
        out, err = capsys.readouterr()
    finally:
        stub.stop()
    assert code == 0, err
    assert out.splitlines() == [f"folder {provider['folderUid']}: exists"] + [
        f"{uid}: unchanged" for uid in sorted(DASHBOARD_UIDS)
    ]
    assert stub.writes() == []


# --------------------------------------------------------------------------- ConfigMaps


def test_one_configmap_per_dashboard_for_the_helm_charts_sidecar():
    docs = _configmaps((REPO / CONFIGMAPS_FILE).read_text(encoding="utf-8"))
    by_uid = {doc["metadata"]["name"].removesuffix("-dashboard"): doc for doc in docs}
    assert len(docs) == len(by_uid) and sorted(by_uid) == sorted(DASHBOARD_UIDS)
    for uid, doc in by_uid.items():
        assert (doc["apiVersion"], doc["kind"]) == ("v1", "ConfigMap")
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"  # a string: label values are strings
        assert doc["metadata"]["annotations"] == {"grafana_folder": FOLDER_TITLE}
        assert list(doc["data"]) == [f"{uid}.json"]
        assert doc["data"][f"{uid}.json"] == DASHBOARD_FILES[uid].read_text(encoding="utf-8")


def test_every_configmap_fits_kubectl_applys_annotation_limit():
    for doc in _configmaps((REPO / CONFIGMAPS_FILE).read_text(encoding="utf-8")):
        size = provisioning.last_applied_size(doc)
        assert size < CONFIGMAP_LIMIT_BYTES == 262144, (doc["metadata"]["name"], size)


def test_an_oversized_dashboard_is_refused_with_the_way_out():
    huge = json.dumps({"uid": "big", "panels": ["x" * CONFIGMAP_LIMIT_BYTES]})
    with pytest.raises(ValueError, match=r"big-dashboard is \d+ bytes.*--server-side"):
        provisioning.configmaps_yaml({"big": huge})


# --------------------------------------------------------------------------- kv-sidecar dashboards render


def test_render_writes_the_committed_dashboards(tmp_path, capsys):
    assert _cli("dashboards", "render", "--out", str(tmp_path)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{uid}.json" for uid in DASHBOARD_UIDS)
    for uid, path in DASHBOARD_FILES.items():
        assert (tmp_path / f"{uid}.json").read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
    assert "wrote" in capsys.readouterr().err


def test_render_configmaps_to_stdout_is_the_committed_stream_but_its_header(capsys):
    assert _cli("dashboards", "render", "--format", "configmap") == 0
    out = capsys.readouterr().out
    assert out.startswith("# Generated by `kv-sidecar dashboards render --format configmap`")
    committed = (REPO / CONFIGMAPS_FILE).read_text(encoding="utf-8")
    assert out.split("\n", 1)[1] == committed.split("\n", 1)[1]


def test_render_json_to_stdout_is_one_object_by_uid(capsys):
    assert _cli("dashboards", "render") == 0
    by_uid = json.loads(capsys.readouterr().out)
    assert by_uid == {uid: json.loads(p.read_text(encoding="utf-8")) for uid, p in DASHBOARD_FILES.items()}


def test_render_reads_the_thresholds_and_labels_it_is_given(tmp_path):
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "thresholds:\n  watermark: 0.85\n  warning: 0.7\n  target_usage: 0.6\n"
        "alerts:\n  runbook_base_url: https://runbooks.test/kv\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    argv = ["--config.file", str(cfg), "--pod-label", "kubernetes_pod_name", "--out", str(out)]
    assert _cli("dashboards", "render", *argv) == 0
    pod = json.loads((out / "kvcache-pod.json").read_text(encoding="utf-8"))
    usage = next(p for p in pod["panels"] if p["title"] == "KV usage")
    steps = [s["value"] for s in usage["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 0.7, 0.85]
    assert 'kubernetes_pod_name=~"$pod"' in usage["targets"][0]["expr"]
    assert "https://runbooks.test/kv" in [link["url"] for link in pod["links"]]


def test_render_sizes_the_workload_advice_with_the_files_forecast_section(tmp_path, capsys):
    """The Fleet's workload advice uses the sidecars' peak window and utilization bounds, not the defaults."""
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("forecast:\n  peak_window: 6h\n  utilization_max: 0.97\n", encoding="utf-8")
    assert _cli("dashboards", "render", "--config.file", str(cfg), "--out", str(tmp_path / "out")) == 0
    fleet = (tmp_path / "out" / "kvcache-overview.json").read_text(encoding="utf-8")
    default = (REPO / "dashboards" / "kvcache-overview.json").read_text(encoding="utf-8")
    assert "[6h]" in fleet and "[6h]" not in default
    assert "0.97" in fleet and "[24h]" in default
    cfg.write_text("forecast:\n  utilization_min: 0.9\n  utilization_max: 0.8\n", encoding="utf-8")
    assert _cli("dashboards", "render", "--config.file", str(cfg)) == 2
    assert "forecast.utilization_min/utilization_max" in capsys.readouterr().err


def test_render_refuses_a_bad_configuration_and_a_file_as_out_dir(tmp_path, capsys):
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("thresholds:\n  warning: 0.95\n", encoding="utf-8")
    assert _cli("dashboards", "render", "--config.file", str(cfg)) == 2
    assert "thresholds.warning: must be below thresholds.watermark" in capsys.readouterr().err
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("", encoding="utf-8")
    assert _cli("dashboards", "render", "--out", str(not_a_dir)) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_render_refuses_a_label_name_prometheus_would_not_accept(capsys):
    with pytest.raises(SystemExit) as e:
        _cli("dashboards", "render", "--namespace-label", "kubernetes-namespace")
    assert e.value.code == 2
    assert "not a Prometheus label name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("action", "module", "argv"),
    [
        ("render", "grafana_foundation_sdk", ["render"]),
        ("push", "grafana_client", ["push", "--grafana-url", "http://127.0.0.1:9"]),
        ("snapshot", "matplotlib", ["snapshot", "--prometheus-url", "http://127.0.0.1:9"]),
    ],
)
def test_without_the_dashboards_extra_the_command_says_how_to_install_it(tmp_path, action, module, argv):
    """A fresh process where the extra's module cannot be imported (``sys.modules[name] = None``)."""
    code = (
        "import sys; sys.modules[sys.argv[1]] = None; from sidecar.cli import main; "
        "sys.exit(main(['dashboards', *sys.argv[2:]]))"
    )
    env = {**os.environ, "GRAFANA_TOKEN": "t0ken"}
    done = subprocess.run(
        [sys.executable, "-c", code, module, *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"kv-sidecar dashboards {action}: {module} is not installed; it comes with the dashboards extra: "
        "pip install 'kv-cache-sidecar[dashboards]'"
    ]
