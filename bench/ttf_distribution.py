"""How ``kvcache_time_until_full_seconds`` reads on real traffic: its +Inf / 0 / finite shares.

Usage::

    .venv/bin/python bench/ttf_distribution.py --trace conversation_trace.jsonl [--trace FILE ...] \\
        [--scales 0.95,1.05,1.2] [--processes 2]

Each trace (Azure CSV, Mooncake JSONL or plain, docs/simulator.md) is replayed at its own speed
through the simulator and the sidecar's pipeline at each pool size (named, as in
``bench/forecast.py --trace``, by the usage the trace's peaks reach on 5-second samples), with the
shipped forecast settings; the trace's first 10 minutes warm the server up and are not counted.
Per run it prints:

- the share of published samples at which the gauge is +Inf, 0, or finite and positive;
- ``0↔Inf``: samples at which the gauge jumps straight from 0 to +Inf or back (a flat saturated
  plateau should read 0 steadily, not alternate);
- the time from a load drop to the gauge leaving 0: for each run of consecutive 0s that ends (or the
  trace ends) while ``kvcache_usage_ratio`` is below 0.8 (the cache is clearly not full any more),
  from the first sample of that last stretch below 0.8 to the first sample that is not 0; the
  number of such runs, the median and the longest. A dip below 0.8 that comes back above it inside
  the run is part of the saturation (a preemption frees a request's blocks at once), not a drop.

A second table reads ``kvcache_burst_headroom_ratio`` on the same runs (docs/forecast.md,
"``kvcache_burst_*``"): the share of samples at which it is finite, its median, the share below 1;
and, per preemption episode (``preemption_episodes``: preemptions at most 2 minutes apart), its
value at the last sample before the episode's start. The question it answers: does "headroom < 1"
precede the preemption episodes more often than it occurs in the runs that never preempt?

The full traces are not in the repository (docs/simulator.md, "Replaying a trace", says where they
are). A run of the one-hour Mooncake conversation trace takes a few minutes of CPU. Mooncake's
``hash_ids`` are replayed (prefix hits from the trace's own reuse, shared blocks held once);
``--without-hash-ids`` replays every prompt as new content, as docs/forecast-validation.md's figures were measured.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sidecar.forecast_validation import (
    FORECAST_FLAGS,
    TRACE_SERVER,
    TTF,
    USAGE,
    Trace,
    collect_trace,
    preemption_episodes,
)
from sidecar.simulator.simulation import peak_used_blocks
from sidecar.simulator.trace import TraceError, TracePlay, load_trace

#: Below this usage the cache is clearly not full: a 0 after it is the estimator's memory, not the cache.
DROPPED_BELOW = 0.8
BURST_HEADROOM = "kvcache_burst_headroom_ratio"
#: The burst headroom levels counted: 1 (the HELP text's "would not fit now") and a quarter, a level read off
#: these same runs (the values before the episodes), not validated on traffic it was not read from.
BELOW = (1.0, 0.25)


@dataclass(frozen=True)
class Distribution:
    samples: int  # published samples
    inf: int
    zero: int
    finite: int
    flips: int  # 0 -> +Inf or +Inf -> 0 between consecutive samples
    drop_lags_s: tuple[float, ...]  # per 0-run that outlived the load: load drop -> gauge leaves 0

    def share(self, n: int) -> str:
        return f"{100 * n / self.samples:.1f} %" if self.samples else "—"


def distribution(tr: Trace) -> Distribution:
    """The shares, flips and drop-to-leave-0 lags of one recorded run."""
    ttf, usage, t = tr.g[TTF], tr.g[USAGE], tr.t
    vals = [v for v in ttf if v is not None]
    flips = sum(
        1 for a, b in zip(ttf, ttf[1:], strict=False) if a is not None and b is not None and {a, b} == {0.0, math.inf}
    )
    lags: list[float] = []
    dropped_at: float | None = None  # start of the current stretch of usage < DROPPED_BELOW inside a 0-run
    in_zero = False
    for i, v in enumerate(ttf):
        if v == 0.0:
            in_zero = True
            u = usage[i]
            if u is None or u >= DROPPED_BELOW:
                dropped_at = None  # still (or again) loaded: a dip that came back is not a drop
            elif dropped_at is None:
                dropped_at = t[i]
        else:
            if in_zero and dropped_at is not None:
                lags.append(t[i] - dropped_at)
            in_zero, dropped_at = False, None
    if in_zero and dropped_at is not None:  # still 0 at the end of the trace: as long as measured
        lags.append(t[-1] - dropped_at)
    return Distribution(
        samples=len(vals),
        inf=sum(1 for v in vals if v == math.inf),
        zero=sum(1 for v in vals if v == 0.0),
        finite=sum(1 for v in vals if 0.0 < v < math.inf),
        flips=flips,
        drop_lags_s=tuple(lags),
    )


@dataclass(frozen=True)
class BurstReading:
    samples: int  # samples after the warm-up
    finite: tuple[float, ...]  # the finite published values
    below: tuple[int, ...]  # published samples below each level of BELOW
    before_episodes: tuple[float | None, ...]  # at the last sample before each preemption episode's start

    def share(self, n: int) -> str:
        return f"{100 * n / self.samples:.1f} %" if self.samples else "—"


def burst_reading(tr: Trace) -> BurstReading:
    """The burst headroom of one recorded run, and its value just before each preemption episode."""
    vals = tr.g[BURST_HEADROOM]
    before: list[float | None] = []
    for start, _ in preemption_episodes(tr):
        i = max((j for j, t in enumerate(tr.t) if t < start), default=None)
        before.append(None if i is None else vals[i])
    return BurstReading(
        samples=len(tr.t),
        finite=tuple(v for v in vals if v is not None and math.isfinite(v)),
        below=tuple(sum(1 for v in vals if v is not None and v < x) for x in BELOW),
        before_episodes=tuple(before),
    )


def _quantiles(vals: Sequence[float]) -> str:
    if not vals:
        return "—"
    q = statistics.quantiles(vals, n=10, method="inclusive") if len(vals) > 1 else [vals[0]] * 9
    return f"{q[0]:.2f} / {statistics.median(vals):.2f} / {q[8]:.2f}"


def burst_table(runs: Sequence[tuple[str, float, Trace]]) -> str:
    levels = " / ".join(f"{x:g}" for x in BELOW)
    rows = [
        f"| trace | peaks at | preemptions | episodes | finite | p10 / median / p90 | below {levels} | "
        f"before each episode: below {levels} of those with a value; values |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, scale, tr in runs:
        b = burst_reading(tr)
        before = [v for v in b.before_episodes if v is not None]
        lows = " / ".join(str(sum(1 for v in before if v < x)) for x in BELOW)
        shown = ", ".join(f"{v:.2f}" for v in before[:12]) + (" ..." if len(before) > 12 else "")
        at_start = f"{lows} of {len(before)}: {shown}" if before else "—"
        shares = " / ".join(b.share(n) for n in b.below)
        rows.append(
            f"| {name} | {scale:g} | {tr.preemptions} | {len(b.before_episodes)} | {b.share(len(b.finite))} "
            f"| {_quantiles(b.finite)} | {shares} | {at_start} |"
        )
    return "\n".join(rows)


def _run(args: tuple[str, float, bool]) -> tuple[str, float, Trace]:
    path, scale, without_hash_ids = args
    trace = load_trace(path)
    play = TracePlay(trace.without_hash_ids() if without_hash_ids else trace)
    usable = max(2, math.ceil(peak_used_blocks(play, TRACE_SERVER) / scale))
    config = TRACE_SERVER.replace(
        num_gpu_blocks_override=usable + 1,
        max_model_len=min(TRACE_SERVER.max_model_len, usable * TRACE_SERVER.block_size),
    )
    (tr,) = collect_trace(play, config, [dict(FORECAST_FLAGS)], name=Path(path).name)
    return Path(path).name, scale, tr


def table(runs: Sequence[tuple[str, float, Trace]]) -> str:
    rows = [
        "| trace | peaks at | preemptions | samples | +Inf | 0 | finite | 0↔Inf flips | "
        "load drop → leaves 0: runs, median, longest (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, scale, tr in runs:
        d = distribution(tr)
        lags = d.drop_lags_s
        lag = f"{len(lags)}, {statistics.median(lags):.0f}, {max(lags):.0f}" if lags else "0, —, —"
        rows.append(
            f"| {name} | {scale:g} | {tr.preemptions} | {d.samples} | {d.share(d.inf)} | {d.share(d.zero)} "
            f"| {d.share(d.finite)} | {d.flips} | {lag} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", required=True, help="an arrival trace file (repeatable)")
    ap.add_argument("--scales", default="0.95,1.05,1.2", help="pool sizes, as the usage the peaks reach")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--without-hash-ids", action="store_true", help="no prefix sharing from the trace's hash_ids")
    a = ap.parse_args(argv)
    try:
        scales = [float(x) for x in a.scales.split(",")]
    except ValueError:
        print(f"--scales: comma-separated numbers, got {a.scales!r}", file=sys.stderr)
        return 2
    if any(s <= 0 for s in scales) or a.processes < 1:
        print("--scales must be positive and --processes at least 1", file=sys.stderr)
        return 2
    try:
        for path in a.trace:
            load_trace(path)  # a bad file fails here, with its line, before any run starts
    except (OSError, TraceError) as e:
        print(f"--trace: {e}", file=sys.stderr)
        return 2
    jobs = [(p, s, a.without_hash_ids) for p in a.trace for s in scales]
    if a.processes == 1:
        runs = [_run(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=a.processes) as pool:
            runs = list(pool.map(_run, jobs))
    print(table(runs))
    print()
    print(burst_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
