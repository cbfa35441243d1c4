"""Prefix-cache hits replayed from Mooncake's ``hash_ids``: the simulator against what the trace implies.

Usage::

    .venv/bin/python bench/prefix_replay.py                                   # the samples in tests/fixtures/traces
    .venv/bin/python bench/prefix_replay.py --trace conversation_trace.jsonl --trace synthetic_trace.jsonl
    .venv/bin/python bench/prefix_replay.py --scales 0.8,0.95,1.05,1.2

For each trace (a JSONL with ``hash_ids``: Mooncake's ``FAST25-release/traces/``, docs/simulator.md
says where) it prints:

- **implied**: what the trace's own ``hash_ids`` say with a cache that never evicts
  (:func:`sidecar.simulator.trace.prefix_reuse`): the share of prompt blocks whose id an earlier
  request held (the FAST'25 paper's Table 2 "cache ratio": conversation 40%, tool & agent 59%,
  synthetic 66%, over the whole hour), and the same in tokens;
- **simulated**: ``vllm:prefix_cache_hits_total ÷ vllm:prefix_cache_queries_total`` of the simulated
  vLLM replaying the trace at its own speed, first on a pool that never fills (only the scheduler and
  the ``num_tokens − 1`` rule stand between it and the implied figure), then on pools sized so that the
  trace's peaks reach each of ``--scales`` (``sidecar.simulator.simulation.pool_for_peak``): there the
  cached blocks referenced by no request are evicted, least recently used first, and the hits drop;
- the trace's peak blocks with and without prefix sharing (shared blocks held once).

The server is the forecast benchmark's (``sidecar.forecast_validation.TRACE_SERVER``: block 16,
max_model_len 131,072). On the full one-hour conversation trace the pool that never fills caches
about 1.4 million blocks: about 15 s of CPU and 0.6 GB per unbounded run (peak sizing is one too).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prometheus_client.parser import text_string_to_metric_families

from sidecar.forecast_validation import TRACE_SERVER
from sidecar.simulator import SimConfig, Simulator
from sidecar.simulator.simulation import peak_used_blocks
from sidecar.simulator.trace import ArrivalTrace, PrefixReuse, TraceError, TracePlay, load_trace, prefix_reuse

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "traces"
DEFAULT_TRACES = (
    SAMPLES / "mooncake-conversation-5min-hash-ids.jsonl",
    SAMPLES / "mooncake-synthetic-3min-hash-ids.jsonl",
)
#: Simulated seconds after the last arrival for the last requests to finish.
DRAIN_S = 900.0


@dataclass(frozen=True)
class Run:
    pool: str  # "never fills" or "peaks at 0.95"
    usable_blocks: int
    preemptions: int
    queries: float  # vllm:prefix_cache_queries_total, tokens
    hits: float  # vllm:prefix_cache_hits_total, tokens
    cpu_s: float

    @property
    def ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def prefix_counters(body: str) -> tuple[float, float]:
    """(queries, hits) summed over engines, read from a ``/metrics`` body as a scraper reads it."""
    values = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name in values:
                values[s.name] += s.value
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def simulate(trace: ArrivalTrace, config: SimConfig, pool: str) -> Run:
    """Replay ``trace`` once on ``config`` until every request has finished; the exported counters."""
    play = TracePlay(trace)
    start = time.process_time()
    sim = Simulator(config, play.scenario(config), 0, play)
    sim.advance_to(play.duration_s + DRAIN_S)
    queries, hits = prefix_counters(sim.render())
    return Run(pool, config.usable_blocks, sim.preemptions, queries, hits, time.process_time() - start)


def never_fills(trace: ArrivalTrace) -> SimConfig:
    """The trace's server with a pool that holds every request of the trace at once."""
    blocks = sum(-(-(r.prompt_tokens + r.output_tokens) // TRACE_SERVER.block_size) for r in trace.requests)
    return TRACE_SERVER.replace(num_gpu_blocks_override=blocks + 2)


def sized(peak: int, scale: float) -> SimConfig:
    """usable = ⌈peak ÷ scale⌉ plus the null block, as ``pool_for_peak`` (and bench/forecast.py) size it."""
    usable = max(2, math.ceil(peak / scale))
    return TRACE_SERVER.replace(
        num_gpu_blocks_override=usable + 1,
        max_model_len=min(TRACE_SERVER.max_model_len, usable * TRACE_SERVER.block_size),
    )


def measure(trace: ArrivalTrace, scales: Sequence[float]) -> tuple[PrefixReuse, int, int, list[Run]]:
    """(implied reuse, peak blocks with sharing, peak without, runs: never fills, then each scale)."""
    peak = peak_used_blocks(TracePlay(trace), TRACE_SERVER)
    peak_unshared = peak_used_blocks(TracePlay(trace.without_hash_ids()), TRACE_SERVER)
    runs = [simulate(trace, never_fills(trace), "never fills")]
    runs += [simulate(trace, sized(peak, s), f"peaks at {s:g}") for s in scales]
    return prefix_reuse(trace.requests), peak, peak_unshared, runs


def table(name: str, reuse: PrefixReuse, peak: int, peak_unshared: int, runs: Sequence[Run]) -> str:
    rows = [
        f"**{name}**: {reuse.requests:,} requests, {reuse.blocks:,} blocks of 512 tokens; implied hit ratio "
        f"{reuse.block_ratio:.1%} of blocks, {reuse.token_ratio:.1%} of prompt tokens; peak "
        f"{peak:,} blocks with prefix sharing, {peak_unshared:,} without",
        "",
        "| pool | usable blocks | preemptions | simulated hit ratio (tokens) | implied − simulated | CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        rows.append(
            f"| {r.pool} | {r.usable_blocks:,} | {r.preemptions} | {r.ratio:.1%} | "
            f"{reuse.token_ratio - r.ratio:+.1%} | {r.cpu_s:.1f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", help="a JSONL trace with hash_ids (repeatable; default: the samples)")
    ap.add_argument("--scales", default="0.95,1.05", help="pool sizes, as the usage the trace's peaks reach")
    a = ap.parse_args(argv)
    try:
        scales = [float(x) for x in a.scales.split(",")]
    except ValueError:
        print(f"--scales: comma-separated numbers, got {a.scales!r}", file=sys.stderr)
        return 2
    if any(not s > 0 for s in scales):
        print("--scales: every scale must be > 0", file=sys.stderr)
        return 2
    paths = a.trace or [str(p) for p in DEFAULT_TRACES]
    try:
        traces = [load_trace(p) for p in paths]  # a bad file fails here, with its line, before any run
    except TraceError as e:
        print(f"--trace: {e}", file=sys.stderr)
        return 2
    for path, trace in zip(paths, traces, strict=True):
        if not trace.has_hash_ids:
            print(f"--trace: {path}: no hash_ids (a Mooncake trace has them)", file=sys.stderr)
            return 2
    for path, trace in zip(paths, traces, strict=True):
        print(table(Path(path).name, *measure(trace, scales)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
