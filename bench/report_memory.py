"""Peak RSS of ``kv-sidecar report --compare-previous`` for many pods: does a week of 1,000 pods fit the
report CronJob's 1 Gi memory limit (``deploy/base/report.yaml``)?

A multi-GB backfill into a real Prometheus (``bench/report_prometheus.py``, 64 pods) does not scale to
1,000 pods on a laptop, and the report's memory does not depend on what the server does: every query
is reduced on the server and comes back as one point per pod and minute whatever the scrape interval
(15 s here), or as one number per pod. So a stand-in answers the Prometheus HTTP API instead
(``/api/v1/query`` and ``/api/v1/query_range``, compact JSON as Prometheus writes it): every pod the
discovery query finds (10 namespaces x 5 models, 20 pods each) has every series at every minute of
both weeks (the report's worst case: no gap leaves an array unallocated), values varying by pod and
minute; the recording rules and ``ALERTS`` are absent, so the report also reads every pod's mean
usage (the worst case again). The info series carry ``block_size``.

The report runs as a child process (the real CLI, writing Markdown, HTML and JSON); its own peak RSS
is read with ``os.wait4`` (``ru_maxrss``), so the stand-in's memory is not counted in it.

    .venv/bin/python bench/report_memory.py [--pods 100 500 1000] [--target-mb 1024]

The child inherits the environment: ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536`` in front of the
command measures the report with its per-step arrays (80 KB a week) mapped one by one, so that the
memory of the series the figures no longer need goes back to the system before the plots are drawn
(glibc's default threshold, 128 KB, keeps them in the heap, where the holes they leave are not reused).

Exit status 1 when a run fails or exceeds the target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[1]
WEEK_S = 7 * 86_400
END = 1_800_000_000 - 1_800_000_000 % WEEK_S  # a period boundary (a multiple of the step)
NAMESPACES, MODELS = 10, 5
TARGET_MB = 1024.0  # the CronJob's memory limit (1 Gi)
_POD = re.compile(r"vllm\\*-(\d{4})")


def _pod_labels(i: int) -> dict[str, str]:
    return {
        "namespace": f"ns-{i % NAMESPACES}",
        "model_name": f"model-{i % MODELS}",
        "pod": f"vllm-{i:04d}",
        "instance": f"10.0.{i // 256}.{i % 256}:9437",
        "engine": "0",
    }


def _kind(query: str) -> str:
    """Which series a query reads (the first metric name it names)."""
    for name in (
        "kvcache_theoretical_capacity_tokens",
        "kvcache_capacity_tokens",
        "kvcache_demand_tokens",
        "kvcache_requests_waiting",
        "kvcache_preemptions_total",
        "kvcache_prefix_cache_queries_tokens_total",
        "kvcache_prefix_cache_hits_tokens_total",
        "kvcache_server_info",
        "kvcache_model_info",
        "kvcache_usage_ratio",
    ):
        if name in query:
            return name
    return "other"


@lru_cache(maxsize=4096)
def _points(kind: str, variant: int, start: float, end: float, step: float) -> bytes:
    """One series' points over ``[start, end]`` at ``step``: a realistic shape, the same for pods of a variant."""
    n = int(round((end - start) / step)) + 1
    out = []
    for k in range(n):
        t = start + k * step
        minute = int(t // 60)
        wave = ((minute + 37 * variant) % 1_440) / 1_440  # a daily cycle, shifted per variant
        if kind == "kvcache_usage_ratio":
            v = f"{0.2 + 0.7 * wave:.6g}"
        elif kind == "kvcache_demand_tokens":
            v = str(int(20_000 + 90_000 * wave))
        elif kind in ("kvcache_capacity_tokens", "kvcache_theoretical_capacity_tokens"):
            v = "131072"
        elif kind == "kvcache_requests_waiting":
            v = "2" if wave > 0.85 else "0"
        elif kind.endswith("_total"):
            v = str(minute * (3 + variant))  # a counter: a rise every minute
        else:
            v = "1"
        out.append(f'[{t:.3f},"{v}"]')
    return ",".join(out).encode()


class StandIn(BaseHTTPRequestHandler):
    """The Prometheus HTTP API for ``server.pods`` pods, every series present at every minute."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length", 0))
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(size).decode()).items()}
        query = form.get("query", "")
        pods = self.server.pods  # type: ignore[attr-defined]
        named = sorted({int(n) for n in _POD.findall(query)}) or list(range(pods))
        kind = _kind(query)
        absent = "ALERTS" in query or "namespace_model:" in query
        if self.path.endswith("/query_range"):
            body = self._matrix(form, kind, [] if absent else named)
        else:
            body = self._vector(form, kind, [] if absent else named)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @staticmethod
    def _extra(kind: str) -> dict[str, str]:
        if kind == "kvcache_server_info":
            return {"block_size": "16", "kv_cache_memory_bytes": ""}
        if kind == "kvcache_model_info":
            return {"architecture": "LlamaForCausalLM", "kv_dtype": "bfloat16"}
        if kind == "kvcache_theoretical_capacity_tokens":
            return {"budget": "estimated"}
        return {}

    def _matrix(self, form: dict[str, str], kind: str, named: list[int]) -> bytes:
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        parts = []
        for i in named:
            metric = json.dumps({**_pod_labels(i), **self._extra(kind)}, separators=(",", ":")).encode()
            parts.append(b'{"metric":' + metric + b',"values":[' + _points(kind, i % 10, start, end, step) + b"]}")
        return b'{"status":"success","data":{"resultType":"matrix","result":[' + b",".join(parts) + b"]}}"

    def _vector(self, form: dict[str, str], kind: str, named: list[int]) -> bytes:
        at = float(form.get("time", END))
        result = [
            {"metric": {**_pod_labels(i), **self._extra(kind)}, "value": [at, "0.5" if "ratio" in kind else "600"]}
            for i in named
        ]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def run(pods: int) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one report over ``pods`` pods, and its output."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.pods = pods  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile() as log:
            cmd = [str(Path(sys.executable).with_name("kv-sidecar")), "report", "--prometheus-url", url]
            cmd += ["--from", str(END - WEEK_S), "--to", str(END), "--out", out, "--compare-previous"]
            cmd += ["--max-pods", str(max(pods, 1000)), "--timeout", "300s"]
            started = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            took = time.monotonic() - started
            log.seek(0)
            text = log.read().decode(errors="replace")
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"report for {pods} pods failed: {text[-2000:]}")
            return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text
    finally:
        server.shutdown()
        server.server_close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--target-mb", type=float, default=TARGET_MB)
    args = parser.parse_args()
    worst = 0.0
    print(f"{'pods':>6} {'wall s':>8} {'cpu s':>8} {'peak RSS MB':>12} {'MB/pod':>8}")
    for pods in args.pods:
        took, cpu, rss, _ = run(pods)
        worst = max(worst, rss)
        print(f"{pods:>6} {took:>8.1f} {cpu:>8.1f} {rss:>12.0f} {rss / pods:>8.2f}", flush=True)
    ok = worst <= args.target_mb
    print(f"peak RSS {worst:.0f} MB, target {args.target_mb:.0f} MB: {'ok' if ok else 'OVER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
