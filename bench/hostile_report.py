"""The report, the reporter and ``dashboards push`` against a server that drips its answer one byte a second.

Prints one JSON line per case::

    {"surface": "report", "case": "report_drip", "timeout_s": 3, "seconds": 3.4, "exit": 1}

- ``report_drip``: ``kv-sidecar report --timeout 3s`` against the drip: wall time (target: at most the
  timeout + 2 s) and exit code;
- ``reporter_sigterm``: ``kv-sidecar reporter --run-now --timeout 120s`` against the drip, SIGTERM two
  seconds into its first request: the time from the signal to the exit (target: a few seconds);
- ``push_drip``: ``kv-sidecar dashboards push --timeout 3`` against the drip (skipped without the
  ``dashboards`` extra).

About 20 s.

    .venv/bin/python bench/hostile_report.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from rawserver import RawServer, respond
from rawserver import drip as answer_by_drip

KV = Path(sys.executable).with_name("kv-sidecar")


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    return time.monotonic() - started, proc.returncode, proc.stderr.strip().splitlines()[-1:][0] if proc.stderr else ""


def report_drip(url: str, out: Path) -> dict[str, object]:
    """The drip's wall time, and the same command's against a server that refuses at once (the start-up and
    imports of the process, which the deadline does not bound): the difference is the request's."""
    took, code, said = _run([str(KV), "report", "--prometheus-url", url, "--timeout", "3s", "--out", str(out)])
    refused = b'{"status":"error","errorType":"bad_data","error":"refused"}'
    refusing = RawServer(respond(b"HTTP/1.1 400 Bad Request", refused))  # a 400 is not retried
    try:
        base, _, _ = _run([str(KV), "report", "--prometheus-url", refusing.url, "--timeout", "3s", "--out", str(out)])
    finally:
        refusing.close()
    return {
        "surface": "report",
        "case": "report_drip",
        "timeout_s": 3,
        "seconds": round(took, 2),
        "process_baseline_s": round(base, 2),
        "over_baseline_s": round(took - base, 2),
        "exit": code,
    }


def reporter_sigterm(drip: RawServer, out: Path) -> dict[str, object]:
    argv = [str(KV), "reporter", "--run-now", "--prometheus-url", drip.url, "--timeout", "120s", "--out", str(out)]
    drip.accepted.clear()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    drip.accepted.wait(120)
    time.sleep(1.0)  # the first report's first request is dripping
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    took = time.monotonic() - signalled
    return {"surface": "report", "case": "reporter_sigterm", "seconds": round(took, 2), "exit": code}


def push_drip(url: str) -> dict[str, object]:
    if importlib.util.find_spec("grafana_client") is None:
        return {"surface": "report", "case": "push_drip", "skipped": "the dashboards extra is not installed"}
    env = {**os.environ, "GRAFANA_TOKEN": "bench-token"}
    took, code, said = _run([str(KV), "dashboards", "push", "--grafana-url", url, "--timeout", "3"], env)
    return {"surface": "report", "case": "push_drip", "timeout_s": 3, "seconds": round(took, 2), "exit": code}


def main() -> int:
    drip = RawServer(answer_by_drip(1.0))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for result in (
                report_drip(drip.url, Path(tmp) / "a"),
                reporter_sigterm(drip, Path(tmp) / "b"),
                push_drip(drip.url),
            ):
                print(json.dumps(result), flush=True)
    finally:
        drip.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
