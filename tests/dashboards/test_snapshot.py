"""The PNG renderer, the package ``sidecar.artifacts.snapshot`` (``kv-sidecar dashboards snapshot``), on its own.

No Grafana can run here, so the renderer draws each dashboard's panels with matplotlib from the same
queries Grafana would send. The committed dashboards are drawn, and their pictures checked, on the
full stack by ``test_panels_prometheus.py::test_dashboards_are_drawn_to_png``; this module tests the
renderer itself: a probe dashboard whose every panel's outcome is known (data, no data, a broken
query, a collapsed row, a text panel), the command's files and its errors, units and value mappings.

The probe and the command need a Prometheus holding data: ``running_stack`` of ``stack.py`` with one
steady pod only (vllm-a-1), waited on until that pod's usage and recommendation are in Prometheus.
The PNGs go to ``$KV_SIDECAR_TEST_ARTIFACTS/dashboard-snapshots`` when it is set (CI uploads it), else
to the test's temporary directory.
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import free_port
from stack import CURRENT, PODS, Stack, running_stack, wait_for_signals

from sidecar.artifacts.snapshot import add_snapshot_arguments, render_dashboard, snapshot_command
from sidecar.artifacts.snapshot.canvas import Canvas
from sidecar.artifacts.snapshot.colors import PALETTE
from sidecar.artifacts.snapshot.data import PanelData, Series, TimeRange
from sidecar.artifacts.snapshot.fields import mapped_text
from sidecar.artifacts.snapshot.layout import COLUMN_PX, FOOTER_PX, HEADER_PX, ROW_PX, Box
from sidecar.artifacts.snapshot.table import table_rows
from sidecar.artifacts.snapshot.timeseries import draw_timeseries
from sidecar.artifacts.snapshot.units import format_value

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"

#: The one pod of the small stack: steady, so it has usage from its first scrape and a recommendation soon.
POD = next(p for p in PODS if p.name == "vllm-a-1")
#: The tests that start the stack (about 20 s until it holds what they draw) are marked e2e,
#: with this timeout.
E2E_TIMEOUT_S = 180

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk; AssertionError when the file is no PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def small_stack(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One steady pod, its sidecar and Prometheus, once Prometheus has 15 s of the pod's usage and its advice."""
    with running_stack(tmp_path_factory.mktemp("snapshot-stack"), prometheus_bin, CURRENT, pods=(POD,)) as s:
        pod = {POD.name}
        wait_for_signals(
            s,
            timeout=60,
            signals=[
                # 15 s of usage: a line long enough to find in the picture's pixels
                ("15 s of usage", "count_over_time(kvcache_usage_ratio[1m]) >= 15", pod),
                ("the recommendation", "kvcache_recommendation_info", pod),
            ],
        )
        yield s


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = os.environ.get("KV_SIDECAR_TEST_ARTIFACTS")
    path = Path(out) / "dashboard-snapshots" if out else tmp_path_factory.mktemp("dashboard-snapshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


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


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_panels_without_data_are_drawn_as_no_data(small_stack: Stack, artifacts: Path) -> None:
    api, started = small_stack.api, small_stack.started
    out = artifacts / "snapshot-probe.png"
    snap = render_dashboard(PROBE, api, {"pod": POD.name}, started, time.time(), out)
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
    assert render_dashboard(PROBE, api, {}, started, time.time(), out, step=2).path == out
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


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_snapshot_command_writes_one_png_per_dashboard(
    small_stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "png"
    args = _args(
        "--prometheus-url", small_stack.api.url, "--dashboards", str(DASHBOARDS), "--out", str(out), "--from", "1m"
    )
    assert snapshot_command(args) == 0
    committed = sorted(p.stem for p in DASHBOARDS.glob("*.json"))
    assert committed, f"no dashboards in {DASHBOARDS}"
    assert sorted(p.name for p in out.iterdir()) == [f"{uid}.png" for uid in committed]
    assert capsys.readouterr().err.count("wrote ") == len(committed)


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


def test_time_until_full_reads_in_three_states_on_a_log_axis(tmp_path):
    """The Fleet's "Time until full by pod" as the snapshot draws it: a log axis from 1 min to 6 h, so a pod not
    filling (at the cap), one filling hours away and one full within 15 minutes sit far apart, the last in the
    red band; on the linear 0-6 h axis it had, the 15-minute band was 4% of the height."""
    from sidecar.artifacts.dashboards import TIME_UNTIL_GRAPH_CAP_S, TIME_UNTIL_GRAPH_FLOOR_S, build_dashboards
    from sidecar.artifacts.params import DASHBOARD_OVERVIEW_UID

    panels = build_dashboards()[DASHBOARD_OVERVIEW_UID]["panels"]
    (panel,) = [
        p for row in panels for p in [row, *row.get("panels", [])] if p.get("title") == "Time until full by pod"
    ]
    times = [0.0, 60.0, 120.0]
    states = {"not filling": TIME_UNTIL_GRAPH_CAP_S, "hours away": 2 * 3600.0, "full soon": 300.0}
    data = PanelData([Series(name, {}, "A", times, [v] * 3) for name, v in states.items()])
    canvas = Canvas(600, 300)
    draw_timeseries(canvas, Box(0, 0, 600, 300), panel, data, TimeRange.of(0, 120, 60), [])
    (ax,) = canvas.fig.axes
    assert ax.get_yscale() == "log" and ax.get_ylim() == (TIME_UNTIL_GRAPH_FLOOR_S, TIME_UNTIL_GRAPH_CAP_S)
    ticks = [ax.yaxis.get_major_formatter()(t, i) for i, t in enumerate(ax.get_yticks())]
    assert ticks == ["1 min", "5 min", "15 min", "1 hour", "6 hours"], ticks
    # where each state sits, as a share of the axis' height: apart by at least a fifth of it
    to_axes = ax.transAxes.inverted()
    height = {name: to_axes.transform(ax.transData.transform((0, v)))[1] for name, v in states.items()}
    assert height["full soon"] < 0.4 < height["hours away"] < 0.9 < height["not filling"] + 1e-9
    canvas.save(tmp_path / "until.png")


def _panel(uid: str, title: str) -> dict:
    from sidecar.artifacts.dashboards import build_dashboards

    panels = build_dashboards()[uid]["panels"]
    (panel,) = [p for row in panels for p in [row, *row.get("panels", [])] if p.get("title") == title]
    return panel


def test_ttft_and_itl_are_drawn_on_axes_of_their_own(tmp_path):
    """The Pod's latency panel puts the inter-token latency on a right-hand axis (Grafana's axisPlacement
    override); drawn on the time to first token's axis, a 10 ms ITL under a 1.5 s TTFT is a flat line at
    the bottom (under 1% of the height). On its own axis it spans most of the height."""
    from sidecar.artifacts.params import DASHBOARD_POD_UID

    panel = _panel(DASHBOARD_POD_UID, "Latency p95 (vLLM)")
    times = [0.0, 60.0, 120.0]
    ttft = Series("time to first token p95", {}, "A", times, [0.5, 1.0, 1.5])
    itl = Series("inter-token latency p95", {}, "B", times, [0.008, 0.010, 0.012])
    canvas = Canvas(600, 300)
    draw_timeseries(canvas, Box(0, 0, 600, 300), panel, PanelData([ttft, itl]), TimeRange.of(0, 120, 60), [])
    (left, right) = canvas.fig.axes
    assert [line.get_label() for line in left.get_lines()] != [] and len(right.get_lines()) == 1
    assert list(right.get_lines()[0].get_ydata()) == itl.values
    assert left.get_ylim()[1] >= 1.5 and right.get_ylim()[1] < 0.1

    def share(ax, v: float) -> float:
        return float(ax.transAxes.inverted().transform(ax.transData.transform((0, v)))[1])

    assert share(right, 0.012) - share(right, 0.008) > 0.25  # ITL's changes read
    assert share(left, 1.5) > 0.8
    legend = [t.get_text() for t in canvas.fig.legends[0].get_texts()]
    assert legend == ["time to first token p95", "inter-token latency p95"]
    canvas.save(tmp_path / "latency.png")


def test_the_server_tables_utilization_reads_as_percent():
    """vLLM's gpu_memory_utilization is a label ("0.9"); the table converts it to a number so that its
    column reads in percent like every chart, and kv_cache_memory_bytes in bytes (empty when unset)."""
    from sidecar.artifacts.params import DASHBOARD_POD_UID

    panel = _panel(DASHBOARD_POD_UID, "Server")
    labels = {
        "pod": "vllm-a-0",
        "model_name": "m",
        "engine": "0",
        "gpu_memory_utilization": "0.9",
        "kv_cache_memory_bytes": "",
        "block_size": "16",
    }
    headers, rows = table_rows(panel, PanelData([Series("", labels, "A", [0.0], [1.0])]))
    row = dict(zip(headers, rows[0], strict=True))
    assert row["GPU memory util."] == "90%" and row["KV cache memory"] == ""
    labels["kv_cache_memory_bytes"] = str(8 * 2**30)
    headers, rows = table_rows(panel, PanelData([Series("", labels, "A", [0.0], [1.0])]))
    assert dict(zip(headers, rows[0], strict=True))["KV cache memory"] == "8 GiB"


def test_the_recommendation_reads_as_text_in_the_picture():
    """The action and reason are labels; the table's value mappings turn them into the human text in the
    picture as in Grafana, not ``add_replicas`` / ``shortfall_at_upper_bound``."""
    from sidecar.artifacts.params import DASHBOARD_POD_UID
    from sidecar.forecast.recommendation import ACTION_TEXT, REASON_TEXT

    panel = _panel(DASHBOARD_POD_UID, "Recommendation")
    labels = {
        "pod": "p",
        "model_name": "m",
        "engine": "0",
        "action": "add_replicas",
        "reason": "shortfall_at_upper_bound",
    }
    headers, rows = table_rows(panel, PanelData([Series("", labels, "A", [0.0], [1.0])]))
    row = dict(zip(headers, rows[0], strict=True))
    assert (row["Action"], row["Reason"]) == (ACTION_TEXT["add_replicas"], REASON_TEXT["shortfall_at_upper_bound"])


def test_a_collapsed_rows_panels_are_placed_open_below_it_and_the_rest_moves_down():
    """Grafana opens a collapsed row in place: its panels (saved at y=30) start right under the row (y=9),
    and the text panel that sat under the closed row (y=9) moves down by their height (6) to y=15."""
    from sidecar.artifacts.snapshot.layout import GAP_PX, layout, panel_box

    placed = {p.panel["title"]: p for p in layout(PROBE)}
    assert [(placed[t].y, placed[t].h) for t in ("closed", "recommendation", "notes")] == [(8, 1), (9, 6), (15, 3)]
    box = panel_box(placed["notes"])
    assert (box.left, box.top, box.width) == (GAP_PX, HEADER_PX + 15 * ROW_PX + GAP_PX, 24 * COLUMN_PX - 2 * GAP_PX)
