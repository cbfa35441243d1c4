"""`make run`'s demo: simulator + sidecar on free ports, gauges moving within a minute."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sidecar.demo import DEMO_HISTORY
from sidecar.history import HistoryStore

KV = str(Path(sys.executable).with_name("kv-sidecar"))


def gauges(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in fam.samples:
            if not s.labels.get("reason") and not s.labels.get("budget") and not s.labels.get("basis"):
                out[s.name] = s.value
    return out


def test_demo_prints_both_urls_and_the_gauges_move(tmp_path):
    # `make run` passes no flags: both servers take any free port and say which.
    proc = subprocess.Popen(
        [KV, "demo", "--speed", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path
    )
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("simulated vLLM (ramp-10m") and "/metrics" in lines[0]
        assert lines[1].startswith("kv-cache-sidecar:") and lines[1].rstrip().endswith("/metrics")
        url = lines[1].split()[-1]
        deadline = time.monotonic() + 60
        first = None
        while time.monotonic() < deadline:
            g = gauges(url)
            if "kvcache_usage_ratio" in g:
                first = first or g
                if g["kvcache_usage_ratio"] != first["kvcache_usage_ratio"] and "kvcache_time_until_full_seconds" in g:
                    break
            time.sleep(1)
        else:
            raise AssertionError(f"gauges did not move within a minute: {first}")
        assert g["kvcache_capacity_tokens"] == 8193 * 16  # the simulated 40 GiB GPU at utilization 0.9
        assert g["kvcache_theoretical_bytes_per_token"] == 131072  # the bundled Llama-3.1-8B config
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        # the demo keeps a history for `kv-sidecar report --history`, flushed on the way out
        store = HistoryStore.open(tmp_path / DEMO_HISTORY, read_only=True)
        ((sid, labels),) = store.series("kvcache_usage_ratio")
        assert labels["target"] == "simulated-vllm" and store.points(sid, 0, 2e9)
        store.close()
        # ... and the report command it prints works on it
        (printed,) = [line for line in lines[2:] if line.startswith("weekly report:")] or [proc.stdout.read()]
        argv = printed.split("after a few minutes, ", 1)[1].split()
        report = subprocess.run([KV, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert report.returncode == 0, report.stderr
        assert report.stdout.startswith("KV-cache report ") and "(history .demo/history.sqlite)" in report.stdout
        written = sorted(p.suffix for p in (tmp_path / ".demo" / "report").iterdir() if p.is_file())
        assert written == [".html", ".json", ".md"]
    finally:
        proc.kill()
        proc.wait()
