"""The HTTP edge and the `simulate` subcommand, as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
from fixtures import REPO
from prometheus_client.parser import text_string_to_metric_families

from sidecar.generations import Generation
from sidecar.simulator import Simulator
from sidecar.simulator.server import SimServer

HARNESS = (
    "import argparse,sys; from sidecar.simulator.cli import add_parser; "
    "p=argparse.ArgumentParser(prog='kv-sidecar'); s=p.add_subparsers(); add_parser(s); "
    "a=p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
)


def test_metrics_health_and_simulated_time_header():
    server = SimServer(Simulator(scenario="ramp", seed=1), port=0, speed=60.0).start()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as c:
            r1 = c.get("/metrics", headers={"Accept": "application/openmetrics-text"})
            time.sleep(0.3)
            r2 = c.get("/metrics")
            h = c.get("/health")
            missing = c.get("/nope")
        assert r1.status_code == 200
        assert r1.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
        t1, t2 = float(r1.headers["x-simulated-time"]), float(r2.headers["x-simulated-time"])
        assert t2 - t1 >= 0.3 * 60 * 0.9  # speed 60: 0.3 s of wall time = 18 simulated s
        names = {f.name for f in text_string_to_metric_families(r2.text)}
        assert "vllm:kv_cache_usage_perc" in names
        assert h.status_code == 200 and "x-simulated-time" in h.headers
        assert missing.status_code == 404
    finally:
        server.stop()


def test_other_generation_served():
    server = SimServer(Simulator(scenario="steady"), port=0, speed=10.0, generation=Generation.V0).start()
    try:
        body = httpx.get(server.url + "/metrics", timeout=5).text
        assert "vllm:gpu_cache_usage_perc{model_name=" in body and 'engine="' not in body
    finally:
        server.stop()


def test_cli_serves_prints_url_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HARNESS,
            "simulate",
            "--port",
            "0",
            "--scenario",
            "burst",
            "--seed",
            "3",
            "--speed",
            "20",
            "--engines",
            "2",
            "--max-num-seqs",
            "64",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.split("serving ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        body = httpx.get(url, timeout=5).text
        assert 'engine="1"' in body
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - t0 < 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_bad_input_exits_2_naming_every_field():
    r = subprocess.run(
        [sys.executable, "-c", HARNESS, "simulate", "--scenario", "nope", "--block-size", "0", "--speed", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "--scenario: unknown scenario 'nope'" in r.stderr
    assert "--block-size" in r.stderr and "--speed" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-c", HARNESS, "simulate", "--kv-cache-memory-bytes", "1000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--kv-cache-memory-bytes" in r.stderr


def test_cli_port_in_use_exits_2():
    server = SimServer(Simulator(scenario="steady"), port=0).start()
    try:
        port = server.url.rsplit(":", 1)[1]
        r = subprocess.run(
            [sys.executable, "-c", HARNESS, "simulate", "--port", port],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ},
        )
        assert r.returncode == 2 and "--port" in r.stderr
    finally:
        server.stop()
