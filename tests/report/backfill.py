"""A real Prometheus on backfilled data: ``promtool tsdb create-blocks-from openmetrics``, then the recording
rules of the generated rules file evaluated over it with ``create-blocks-from rules``, as a Prometheus running
those rules would have recorded them. Shared by the Prometheus-source tests and the known-week report test."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from processes import Processes, free_port, http_status, prometheus_argv

from sidecar.alert_params import RuleParams
from sidecar.artifacts.rules import build_rule_groups
from sidecar.thresholds import Thresholds


def run(argv: list[str], cwd: Path, timeout: float = 600) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert res.returncode == 0, f"{argv[:4]} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"


def start(procs: Processes, workdir: Path, data: Path, port: int) -> str:
    (workdir / "prometheus.yaml").write_text("global:\n  scrape_interval: 1m\n", encoding="utf-8")
    binary = shutil.which("prometheus") or "prometheus"
    config = workdir / "prometheus.yaml"
    procs.start("prometheus", prometheus_argv(binary, config, data, port, "--storage.tsdb.retention.time=10y"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while http_status(f"{url}/-/ready") != 200:
        procs.check_alive()
        assert time.monotonic() < deadline, procs.logs("prometheus")
        time.sleep(0.2)
    return url


@contextmanager
def backfilled_prometheus(
    work: Path,
    openmetrics: Path,
    start_s: float,
    end_s: float,
    thresholds: Thresholds | None = None,
    records: Collection[str] | None = None,
) -> Iterator[str]:
    """The URL of a Prometheus serving ``openmetrics`` and the recording rules over ``[start_s, end_s)``.

    ``records``: the recording rules to evaluate, by the name they record (None: every one). promtool
    evaluates each rule as a range query over the whole period, so a test that reads two recorded series
    over two weeks names them rather than waiting for all thirty.
    """
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("needs Debian's prometheus and promtool (make test installs them)")
    data = work / "data"
    # One block per week: with promtool's default of 2 h blocks it reads the whole file once per block.
    run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=168h",
            str(openmetrics),
            str(data),
        ],
        work,
    )
    groups = build_rule_groups(thresholds or Thresholds(), RuleParams())["groups"]
    (group,) = (g for g in groups if g["name"] == "kvcache.rules")
    if records is not None:
        missing = set(records) - {r["record"] for r in group["rules"]}
        assert not missing, f"not recording rules of kvcache.rules: {sorted(missing)}"
        group = {**group, "rules": [r for r in group["rules"] if r["record"] in records]}
    recording = {"groups": [group]}
    (work / "recording.yaml").write_text(yaml.safe_dump(recording, sort_keys=False), encoding="utf-8")
    procs = Processes(work)
    port = free_port()
    try:
        url = start(procs, work, data, port)
        run(
            [
                *("promtool", "tsdb", "create-blocks-from", "rules", "--url", url),
                *("--start", str(int(start_s)), "--end", str(int(end_s)), "--eval-interval", "60s"),
                *("--output-dir", str(work / "rules-data"), "recording.yaml"),
            ],
            work,
        )
        procs.stop("prometheus")
        for block in (work / "rules-data").iterdir():
            shutil.move(str(block), data / block.name)
        yield start(procs, work, data, port)
    finally:
        procs.stop()
