"""The committed dashboards drawn from a real Prometheus, as PNGs a person can look at.

No Grafana can run here, so ``sidecar.artifacts.snapshot`` draws each dashboard's panels with
matplotlib from the same queries Grafana would send. The stack is small and short (about 25 s):

    kv-sidecar simulate  x 2   vllm-a-0 ramps past saturation (preempting), vllm-b-0 restarts
      <- kv-sidecar run  x 2   one sidecar per pod, scraping every second
      <- prometheus            Debian's binary, scraping sidecars and simulators every second with
                               PodMonitor-like namespace/pod labels, evaluating the fast rules

The PNGs go to ``$KV_SIDECAR_TEST_ARTIFACTS`` when it is set (CI uploads it), else to the test's
temporary directory; their paths are printed. Besides the picture being a valid PNG of the grid's
size, every query must run (no panel in "error": a bad interpolation or PromQL shows up here), and the
panels an on-call engineer reads first must have been drawn from data.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from stack import Pod, Processes, free_port, kv_sidecar, render_fast_rules, sidecar_config

from sidecar.artifacts.files import dump_yaml
from sidecar.artifacts.panels import PrometheusAPI
from sidecar.artifacts.params import DASHBOARD_CAPACITY_UID, DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID
from sidecar.artifacts.snapshot import (
    COLUMN_PX,
    FOOTER_PX,
    GRID_COLUMNS,
    HEADER_PX,
    PALETTE,
    ROW_PX,
    add_snapshot_arguments,
    format_value,
    layout,
    mapped_text,
    render_dashboard,
    render_dashboard_png,
    snapshot_command,
)

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"

PODS = (
    Pod("team-a", "vllm-a-0", "llama-3.1-8b-chat", "ramp", 30, seed=1, saturates=True),
    Pod("team-b", "vllm-b-0", "llama-3.1-8b-batch", "restart", 30, seed=3),
)
#: Wall time of data before drawing: the ramp saturates after about 10 s, the restart is at 10 s.
SETTLE_S = 25.0

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk; AssertionError when the file is no PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def expected_size(dashboard: dict) -> tuple[int, int]:
    rows = max(p.y + p.h for p in layout(dashboard))
    return GRID_COLUMNS * COLUMN_PX, HEADER_PX + rows * ROW_PX + FOOTER_PX


def prometheus_config(rule_file: Path, ports: dict[str, tuple[int, int]]) -> dict:
    def job(name: str, which: int) -> dict:
        return {
            "job_name": name,
            "static_configs": [
                {"targets": [f"127.0.0.1:{ports[p.name][which]}"], "labels": {"namespace": p.namespace, "pod": p.name}}
                for p in PODS
            ],
        }

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [job("kv-cache-sidecar", 1), job("vllm", 0)],
    }


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:  # URLError, HTTPError, refused, timeout
        return False


@pytest.fixture(scope="module")
def prometheus(prometheus_bin, tmp_path_factory) -> Iterator[tuple[PrometheusAPI, float]]:
    """A Prometheus holding about 25 s of both pods; (its API, the time it became ready)."""
    workdir = tmp_path_factory.mktemp("snapshot-stack")
    rule_file = render_fast_rules(workdir / "rules")
    ports = {p.name: (free_port(), free_port()) for p in PODS}
    prom_port = free_port()
    (workdir / "prometheus.yaml").write_text(dump_yaml(prometheus_config(rule_file, ports)), encoding="utf-8")
    procs = Processes(workdir)
    api = PrometheusAPI(f"http://127.0.0.1:{prom_port}")
    kv = kv_sidecar()
    try:
        for pod in PODS:
            sim_port, port = ports[pod.name]
            procs.start(
                f"simulator-{pod.name}",
                [
                    *kv,
                    "simulate",
                    *("--host", "127.0.0.1", "--port", str(sim_port), "--model-name", pod.model_name),
                    *("--scenario", pod.scenario, "--speed", str(pod.speed), "--seed", str(pod.seed)),
                ],
            )
            config = workdir / f"sidecar-{pod.name}.yaml"
            config.write_text(dump_yaml(sidecar_config(pod, sim_port, port)), encoding="utf-8")
            procs.start(f"sidecar-{pod.name}", [*kv, "run", "--config.file", str(config)])
        procs.start(
            "prometheus",
            [
                prometheus_bin,
                f"--config.file={workdir / 'prometheus.yaml'}",
                f"--storage.tsdb.path={workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
        )
        ready = {"prometheus": f"{api.url}/-/ready"}
        ready.update({f"sidecar-{p.name}": f"http://127.0.0.1:{ports[p.name][1]}/readyz" for p in PODS})
        deadline = time.monotonic() + 30
        while ready and time.monotonic() < deadline:
            procs.check_alive()
            ready = {name: url for name, url in ready.items() if not _answers(url)}
            time.sleep(0.2)
        assert not ready, f"not ready within 30 s: {sorted(ready)}\n{procs.logs(*ready)}"
        started = time.time()
        while time.time() - started < SETTLE_S:
            procs.check_alive()
            time.sleep(0.5)
        yield api, started
    finally:
        procs.stop()
        api.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = os.environ.get("KV_SIDECAR_TEST_ARTIFACTS")
    path = Path(out) / "dashboard-snapshots" if out else tmp_path_factory.mktemp("dashboard-snapshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def committed() -> dict[str, dict]:
    return {d["uid"]: d for d in (json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json")))}


def usage_panels(dashboard: dict) -> list[str]:
    """Titles of the time series drawn from ``kvcache_usage_ratio`` or its recording rules: the first
    thing an on-call engineer reads on each dashboard."""
    from sidecar.artifacts.panels import walk_panels

    return [
        p["title"]
        for p in walk_panels(dashboard)
        if p.get("type") == "timeseries" and any("kvcache_usage_ratio" in t.get("expr", "") for t in p["targets"])
    ]


def test_every_committed_dashboard_is_drawn_from_data(prometheus, artifacts):
    api, started = prometheus
    dashboards = committed()
    assert set(dashboards) == {DASHBOARD_OVERVIEW_UID, DASHBOARD_POD_UID, DASHBOARD_CAPACITY_UID}
    end = time.time()
    for uid, dashboard in dashboards.items():
        snap = render_dashboard(dashboard, api, {}, started, end, artifacts / f"{uid}.png", step=1)
        print(f"{snap.path}: {snap.summary()}, annotations {snap.annotations}, drawn in {snap.seconds:.2f} s")
        for p in snap.panels:
            print(f"  [{p.status}] {p.title}" + (f" -- {p.detail}" if p.detail and p.status != "data" else ""))
        width, height = png_size(snap.path)
        assert (width, height) == expected_size(dashboard)
        assert snap.path.stat().st_size > 20_000, "too small to show the panels"
        assert len(snap.panels) == sum(1 for _ in _non_rows(dashboard))
        failed = [f"{p.title}: {p.detail}" for p in snap.panels if p.status == "error"]
        assert not failed, f"{uid}: queries failed:\n" + "\n".join(failed)
        main = usage_panels(dashboard)
        assert main, f"{uid}: no usage panel"
        assert all(snap.status(t) == "data" for t in main), f"{uid}: usage panels without data: {main}"
        assert sum(p.status == "data" for p in snap.panels) >= len(snap.panels) // 2


def _non_rows(dashboard: dict) -> Iterator[dict]:
    from sidecar.artifacts.panels import walk_panels

    return walk_panels(dashboard)


#: Panels whose data is known: one that has data, one whose metric does not exist, one whose query is
#: not PromQL; and a collapsed row holding a table, which must be drawn open below the row.
PROBE = {
    "uid": "snapshot-probe",
    "title": "Snapshot probe",
    "templating": {"list": [{"name": "pod", "type": "query", "multi": True, "includeAll": True, "allValue": ".*"}]},
    "panels": [
        {
            "id": 1,
            "type": "timeseries",
            "title": "usage",
            "gridPos": {"x": 0, "y": 0, "w": 8, "h": 8},
            "fieldConfig": {"defaults": {"unit": "percentunit"}},
            "targets": [{"refId": "A", "expr": 'kvcache_usage_ratio{pod=~"$pod"}', "legendFormat": "{{pod}}"}],
        },
        {
            "id": 2,
            "type": "stat",
            "title": "missing",
            "gridPos": {"x": 8, "y": 0, "w": 8, "h": 8},
            "targets": [{"refId": "A", "expr": "no_such_metric_anywhere"}],
        },
        {
            "id": 3,
            "type": "timeseries",
            "title": "broken",
            "gridPos": {"x": 16, "y": 0, "w": 8, "h": 8},
            "targets": [{"refId": "A", "expr": "sum(("}],
        },
        {
            "id": 4,
            "type": "row",
            "title": "closed",
            "collapsed": True,
            "gridPos": {"x": 0, "y": 8, "w": 24, "h": 1},
            "panels": [
                {
                    "id": 5,
                    "type": "table",
                    "title": "recommendation",
                    "gridPos": {"x": 0, "y": 30, "w": 24, "h": 6},
                    "targets": [{"refId": "A", "expr": "kvcache_recommendation_info", "instant": True}],
                }
            ],
        },
        {"id": 6, "type": "text", "title": "notes", "gridPos": {"x": 0, "y": 9, "w": 24, "h": 3}},
    ],
}


def test_panels_without_data_are_drawn_as_no_data(prometheus, artifacts):
    api, started = prometheus
    out = artifacts / "snapshot-probe.png"
    snap = render_dashboard(PROBE, api, {"pod": "vllm-a-0"}, started, time.time(), out)
    print(f"{out}: {snap.summary()}")
    assert {p.title: p.status for p in snap.panels} == {
        "usage": "data",
        "missing": "no data",
        "broken": "error",
        "recommendation": "data",
        "notes": "not rendered",
    }
    assert "parse error" in next(p.detail for p in snap.panels if p.title == "broken")
    # the line is in the usage panel's pixels, and nowhere in the panels without data
    assert _pixels_like(out, PROBE["panels"][0], PALETTE[0]) > 200
    assert _pixels_like(out, PROBE["panels"][1], PALETTE[0]) == 0
    assert _pixels_like(out, PROBE["panels"][2], PALETTE[0]) == 0
    # the collapsed row's table is drawn open under the row, the text panel moves below it
    assert png_size(out) == (1800, HEADER_PX + (9 + 6 + 3) * ROW_PX + FOOTER_PX)
    assert render_dashboard_png(PROBE, api, {}, started, time.time(), out, step=2) == out
    assert not list(artifacts.glob(".snapshot-probe.png.*")), "temporary files left behind"


def _pixels_like(png: Path, panel: dict, color: str, tolerance: int = 20) -> int:
    """How many pixels inside ``panel``'s grid cell are within ``tolerance`` of ``color`` in each channel."""
    import numpy as np
    from PIL import Image

    gp = panel["gridPos"]
    box = (
        gp["x"] * COLUMN_PX,
        HEADER_PX + gp["y"] * ROW_PX,
        (gp["x"] + gp["w"]) * COLUMN_PX,
        HEADER_PX + (gp["y"] + gp["h"]) * ROW_PX,
    )
    want = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
    with Image.open(png) as im:
        pixels = np.asarray(im.convert("RGB").crop(box), dtype=int)
    return int(np.all(np.abs(pixels - want) <= tolerance, axis=-1).sum())


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_snapshot_arguments(parser)
    return parser.parse_args(list(argv))


def test_snapshot_command_writes_one_png_per_dashboard(prometheus, tmp_path, capsys):
    api, _ = prometheus
    out = tmp_path / "png"
    args = _args("--prometheus-url", api.url, "--dashboards", str(DASHBOARDS), "--out", str(out), "--from", "1m")
    assert snapshot_command(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{uid}.png" for uid in committed())
    assert capsys.readouterr().err.count("wrote ") == len(committed())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--var", "pod"], "--var: expected NAME=VALUE"),
        (["--from", "yesterday"], "--from: not a duration"),
        (["--dashboards", "/nonexistent"], "--dashboards: /nonexistent is not a directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    args = _args("--prometheus-url", "http://127.0.0.1:1", "--dashboards", str(DASHBOARDS), *argv)
    assert snapshot_command(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_unreachable_prometheus_exits_1(tmp_path, capsys):
    args = _args("--prometheus-url", f"http://127.0.0.1:{free_port()}", "--dashboards", str(DASHBOARDS))
    assert snapshot_command(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("kv-sidecar dashboards snapshot: Prometheus not usable:") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (0.873, "percentunit", "87.3%"),
        (1.0, "percentunit", "100%"),
        (90, "s", "1.5 min"),
        (7200, "s", "2 hours"),
        (0.25, "s", "250 ms"),
        (float("inf"), "s", "∞"),
        (131072, "short", "131 K"),
        (3 * 2**30, "bytes", "3 GiB"),
        (2.5, "reqps", "2.5 req/s"),
        (12, "suffix: tokens", "12 tokens"),
        (131072, "si:B", "131 KB"),
    ],
)
def test_units_are_shown_as_grafana_shows_them(value, unit, shown):
    assert format_value(value, unit) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(604800.0, "not filling"), (1e9, "not filling"), (3.0, None), (0.0, "idle")],
)
def test_value_mappings_are_shown_as_grafana_shows_them(value, shown):
    mappings = [
        {"type": "range", "options": {"from": 604800, "to": 1e12, "result": {"text": "not filling"}}},
        {"type": "value", "options": {"0": {"text": "idle"}}},
    ]
    assert mapped_text(mappings, value) == shown
