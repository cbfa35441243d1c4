"""Soak: 100,000 scrape cycles in-process against the simulator, with engines and labels that come and go.

Each cycle is what the daemon does with a fetched page (``Sidecar.read_body`` then ``Sidecar.record``,
the forecast and advice layers on, as ``kv-sidecar run`` builds them), on simulated time (5 s a
cycle). The pages come from the built-in simulator (:mod:`sidecar.simulator`) in phases of
``--phase`` cycles; each phase serves another model name, another number of data-parallel engines
(1-4) and, every other phase, another ``num_gpu_blocks`` (a restart with new settings), so
engines, their series and their state keep appearing and vanishing. Every third phase also carries
what must be dropped and logged once: 40 waiting reasons of its own (past the cap of 32) and a NaN
usage on one engine.

It prints the process's RSS after the warm-up and at the end (target: growth <= 1 MiB), its
open file descriptors and threads at the start and the end, the number of log lines (each
condition is logged when it starts and when it ends, not per cycle) and the wall time.

    .venv/bin/python bench/soak.py [--cycles 100000] [--phase 1000] [--warmup 10000]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sidecar.config import build_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders
from sidecar.simulator import SimConfig, Simulator

PAGES_PER_PHASE = 24  # pages rendered per phase configuration, served in turn
CONFIGS = 8  # distinct phase configurations, used in turn


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def threads() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def phase_pages(k: int) -> list[bytes]:
    """The pages of phase configuration ``k``: its own model, engine count and pool; every third one hostile."""
    config = SimConfig(
        model_name=f"soak/model-{k}",
        engines=1 + k % 4,
        num_gpu_blocks_override=None if k % 2 else 4096 + 512 * k,
    )
    sim = Simulator(config, scenario="ramp", seed=k)
    sim.advance(300.0 * (1 + k))  # each phase at another point of its ramp
    pages = []
    for i in range(PAGES_PER_PHASE):
        sim.advance(5.0)
        text = sim.render()
        if k % 3 == 0:
            extra = "".join(
                f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="{config.model_name}",'
                f'reason="soak-{k}-{i}-{j}"}} 1.0\n'
                for j in range(40)
            )
            usage = f'vllm:kv_cache_usage_perc{{engine="0",model_name="{config.model_name}"}}'
            head, sep, tail = text.partition(usage + " ")
            if sep:
                text = head + usage + " NaN" + tail[tail.index("\n") :]
            text += extra
        pages.append(text.encode())
    return pages


class Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=100_000)
    ap.add_argument("--phase", type=int, default=1000, help="cycles per phase (one engine set and model name)")
    ap.add_argument("--warmup", type=int, default=10_000, help="cycles before the RSS baseline is taken")
    args = ap.parse_args()

    counted = Counting()
    root = logging.getLogger("kv_sidecar")
    root.addHandler(counted)
    root.propagate = False
    root.setLevel(logging.INFO)

    start_fds, start_threads = fds(), threads()
    wall0 = time.perf_counter()
    phases = [phase_pages(k) for k in range(CONFIGS)]
    config = build_config({"targets": [{"url": "http://127.0.0.1:8000/metrics", "clock": "simulated"}]})
    sidecar = Sidecar(config, build_extenders(config))
    state = sidecar.states[0]
    t = 1_800_000_000.0
    baseline = None
    failed = 0
    for cycle in range(args.cycles):
        if cycle == args.warmup:
            gc.collect()
            baseline = rss_kib()
            lines_at_warmup = counted.lines
        pages = phases[(cycle // args.phase) % CONFIGS]
        t += 5.0
        try:
            scrape = sidecar.read_body(state, pages[cycle % len(pages)])
        except Exception:
            failed += 1
            continue
        sidecar.record(state, scrape, sample_time=t, wall_time=t, duration_s=0.01)
    gc.collect()
    end = rss_kib()
    wall = time.perf_counter() - wall0
    growth = None if baseline is None else end - baseline
    print(f"cycles: {args.cycles} ({args.phase} per phase, {CONFIGS} phase configurations), failed scrapes: {failed}")
    print(f"wall time: {wall:.1f} s ({wall / args.cycles * 1e3:.3f} ms per cycle)")
    print(f"RSS after {args.warmup} warm-up cycles: {baseline} KiB; at the end: {end} KiB; growth: {growth} KiB")
    print(
        f"open fds: {start_fds} at start, {fds()} at the end; threads: {start_threads} at start, {threads()} at the end"
    )
    print(f"python threads at the end: {threading.active_count()}")
    print(
        f"log lines: {counted.lines} ({counted.lines - lines_at_warmup} after the warm-up); "
        f"series dropped: {dict(state.dropped)}; engines now: {len(state.history)}; "
        f"cache configs kept: {len(state.last_cache_config)}"
    )
    ok = growth is not None and growth <= 1024 and fds() == start_fds and threads() == start_threads
    print(f"RSS growth <= 1 MiB, fds and threads flat -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
