"""/readyz and /healthz never depend on vLLM; /healthz tells the truth about the scrape loop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from processes import free_port

from sidecar.config import load_config
from sidecar.endpoint import start_http
from sidecar.scrape_loop import Sidecar

KV = str(Path(sys.executable).with_name("kv-sidecar"))


def wait_http(url: str, seconds: float = 20.0) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_probes_while_the_target_is_down_and_clean_sigterm():
    port, dead = free_port(), free_port()
    proc = subprocess.Popen(
        [
            KV,
            "run",
            "--target",
            f"http://127.0.0.1:{dead}/metrics",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--scrape.interval",
            "1s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_http(base + "/readyz").status_code == 200
        time.sleep(2.5)  # a few failed scrapes
        assert httpx.get(base + "/readyz").status_code == 200
        assert httpx.get(base + "/healthz").status_code == 200  # the loop ticks, vLLM's state does not matter
        metrics = httpx.get(base + "/metrics").text
        assert f'kvcache_sidecar_target_up{{target="127.0.0.1:{dead}"}} 0.0' in metrics
        assert 'reason="refused"' in metrics
        assert httpx.get(base + "/nope").status_code == 404
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - start < 2.0
    finally:
        proc.kill()
        proc.wait()


def test_healthz_fails_when_the_scrape_loop_stops():
    port = free_port()
    cfg = load_config(
        None, env={}, flags={("scrape", "interval"): "1s", ("web", "listen_address"): f"127.0.0.1:{port}"}
    )
    sidecar = Sidecar(cfg)
    server = start_http(sidecar, ready=lambda: True)  # HTTP up, but no scheduler: a wedged loop
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/healthz").status_code == 200  # just started: within three intervals
        time.sleep(3.3)
        r = httpx.get(url + "/healthz")
        assert r.status_code == 503 and "last ticked" in r.text
        assert httpx.get(url + "/readyz").status_code == 200  # readiness is not liveness
    finally:
        server.shutdown()
        server.server_close()
