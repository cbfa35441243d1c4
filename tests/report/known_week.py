"""A known week: two weeks of the sidecar's exported series whose figures are known in advance.

What: :func:`generate` writes ``week.om`` (OpenMetrics text for ``promtool tsdb
create-blocks-from openmetrics``) and ``history.sqlite`` (the sidecar's embedded history) for four
pods of two models over the previous and the current week, and returns :class:`Known`, the figures
a weekly report of the current week must show. :func:`cached_week` does the same once per version
of the code that produces the series (``.test-artifacts/known-week/<hash>/``).

Why: the report's figures (peaks, percentiles, hours above each threshold, preemptions, growth,
pages) can only be checked against numbers known beforehand. Those numbers come from an analytic
definition of each pod's engine state (:func:`pod_state`), never from the generated series.

How the series are made: at every scrape time each pod's engine state is set from the definition
on a real :class:`~sidecar.simulator.engine.Engine` (free blocks, counters, queue, request-length
histograms), rendered as vLLM 0.32's ``/metrics`` by the simulator's exposition
(:func:`sidecar.simulator.exposition.render`), and fed through :class:`sidecar.replay.Pipeline`:
the daemon's own parse, vLLM adapter, derivations and capacity/forecast layers at simulated time.
The exported samples are what that pipeline's registry collects (for ``week.om``) and what the
daemon's :meth:`~sidecar.daemon.Sidecar.record_history` appends (for ``history.sqlite``). One pod
is one sidecar with one target named after the pod; pods run in parallel processes, each with its
own history file, whose rows are then copied into one (:func:`_merge_histories`).

The definition (all times UTC; ``S`` = :data:`WEEK_START`, a Monday 00:00; week ``W`` = 7 days):

- diurnal shape ``d(t) = sin²(π (h − 6) / 16)`` for the hour of day ``h`` in (6, 22), else 0:
  0 at night, 1 at 14:00; day factor :data:`DAY_FACTOR` (Monday … Sunday);
- previous week, ``t`` in ``[S − W, S)``: ``u(t) = base + amp × day_factor × d(t)``;
  current week: ``u(t) = g × u(t − W)``, so every daily peak is ``g`` × the previous week's
  (``g`` = :attr:`ModelPlan.growth`: 1.10 for the Llama model, 1.00 — not growing — for Qwen);
- blocks held ``round(u × usable)``; vLLM's usage is ``1 − free / usable``
  (``BlockPool.get_usage``, ``vllm/v1/core/block_pool.py``), the exact expression used here;
- a preemption burst (:data:`BURST`): on one pod, during one clock hour of the current week's
  Saturday, usage is held at 0.97, 4 requests wait for capacity and each scrape sees 6 more
  preemptions (360 in the hour);
- outside the burst, every scrape with usage above 0.95 sees one preemption (no queue);
- requests: each scrape sees ``k = 1 + ⌊10 × usage⌋`` requests finish, each with
  :data:`PROMPT_TOKENS` prompt and :data:`GENERATION_TOKENS` generated tokens; prefix-cache
  queries are their prompt tokens, hits a fixed tenth share of them (:attr:`ModelPlan.hit_tenths`);
- the daemon's demand (``demand_tokens`` in ``sidecar/forecast/trend.py``) is then the used
  tokens, plus, while usage ≥ the watermark and requests wait, ``waiting × ⌈(P + G/2) / bs⌉ × bs``;
- one restart (:data:`RESTART`): one pod is absent (no samples at all: the pod and its sidecar are
  gone) for 10 minutes of the current week's Tuesday night and comes back with vLLM's counters at 0.

Known figures follow the report's definitions: percentiles are Prometheus' φ-quantile (rank
``φ (n − 1)``, linear between neighbours) of the week's sampled usage; hours above a threshold are
``samples above it × interval``; a model's usage at a scrape is its hottest pod's, its demand,
capacity and counters the sums over its pods present at that scrape; an hour's preemptions are the
increases seen by the scrapes in that clock hour.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import math
import os
import shutil
import signal
import sqlite3
import tempfile
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from prometheus_client.utils import floatToGoString

from sidecar.config import Config, load_config
from sidecar.generations import Generation
from sidecar.history import HistoryStore
from sidecar.replay import Pipeline
from sidecar.simulator.config import GIB, SimConfig
from sidecar.simulator.engine import Engine, Request, RequestSpec
from sidecar.simulator.exposition import render

#: the repository (this file is tests/report/known_week.py) and the model configs the sidecars read
REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIGS = REPO / "tests" / "fixtures" / "model-configs"
#: Where :func:`cached_week` keeps the generated weeks, one folder per :func:`source_hash` (gitignored).
CACHE = REPO / ".test-artifacts" / "known-week"
HOUR_S = 3600
DAY_S = 86400
WEEK_S = 7 * DAY_S
#: Monday 2026-11-23 00:00 UTC: the current week is [WEEK_START, WEEK_START + WEEK_S).
WEEK_START = 1_795_392_000
INTERVAL_S = 60
#: Monday … Sunday.
DAY_FACTOR = (0.92, 0.96, 1.00, 0.97, 0.94, 0.60, 0.55)
WARNING, WATERMARK = 0.8, 0.9
PROMPT_TOKENS, GENERATION_TOKENS = 1000, 200
#: Usage above which a scrape outside the burst sees one preemption.
PREEMPT_ABOVE = 0.95
GENERATION = Generation.V1_CAPACITY_LABELS
JOB = "kv-cache-sidecar"  # RuleParams.sidecar_job: the job the generated rules select
SIDECAR_PORT = 9437
#: Flags for ``promtool tsdb create-blocks-from openmetrics week.om DIR``: promtool reads the whole
#: file once per block it cuts, and its default of 2-hour blocks means 168 passes over the two weeks
#: (about 4 minutes for week.om); blocks of up to a week take 3 passes (about 8 seconds).
BACKFILL_FLAGS = ("--max-block-duration=168h",)
#: The alert of the rules file (alerts/kvcache.rules.yaml) whose firings are synthesised: per
#: severity the threshold and ``for:`` (RuleParams.warning_for, critical_for).
ALERT = "KVCacheAlmostFull"
ALERT_RULES = (("warning", WARNING, 15 * 60), ("critical", WATERMARK, 5 * 60))
#: The sidecar's series written to week.om: those the weekly report reads (sidecar/report/data.py)
#: and the used/free tokens of the recording rules' usable pool. The rest of what the daemon exports
#: would triple the file (about 350 MB as it is); the history keeps everything the daemon writes.
FAMILIES = frozenset(
    {
        "kvcache_usage_ratio",
        "kvcache_capacity_tokens",
        "kvcache_used_tokens",
        "kvcache_free_tokens",
        "kvcache_demand_tokens",
        "kvcache_theoretical_capacity_tokens",
        "kvcache_theoretical_bytes_per_token",
        "kvcache_preemptions_total",
        "kvcache_prefix_cache_queries_tokens_total",
        "kvcache_prefix_cache_hits_tokens_total",
        "kvcache_requests_running",
        "kvcache_requests_waiting",
        "kvcache_server_info",
        "kvcache_gpu_memory_utilization",
        "kvcache_model_info",
        # the sidecars' own sizing, which the report sizes with where it has no model.config
        "kvcache_suggested_gpu_memory_utilization",
        "kvcache_lever_capacity_tokens",
    }
)


# --- the plan: models, pods, the burst and the restart ----------------------------------------


@dataclass(frozen=True)
class ModelPlan:
    namespace: str
    model_name: str
    sim: SimConfig
    model_config: Path
    growth: float
    hit_tenths: int  # prefix-cache hits per 10 prompt tokens
    #: the sidecar's ``model.*`` flags besides model.config
    sidecar_model: tuple[tuple[str, str], ...] = ()

    @property
    def usable_blocks(self) -> int:
        return self.sim.usable_blocks

    @property
    def capacity_tokens(self) -> int:
        """vLLM's ``kv_cache_size_tokens``: ``num_gpu_blocks × block_size`` (null block included)."""
        return self.sim.kv_cache_size_tokens


@dataclass(frozen=True)
class PodPlan:
    name: str
    model: ModelPlan
    base: float
    amp: float
    instance: str

    @property
    def labels(self) -> dict[str, str]:
        """What a Kubernetes PodMonitor scrape adds to the sidecar's own labels."""
        return {"namespace": self.model.namespace, "pod": self.name, "job": JOB, "instance": self.instance}


@dataclass(frozen=True)
class Burst:
    pod: str
    start: int
    seconds: int
    usage: float
    waiting: int
    per_scrape: int

    def holds(self, t: float) -> bool:
        return self.start <= t < self.start + self.seconds


@dataclass(frozen=True)
class Restart:
    pod: str
    down_from: int
    down_s: int

    def absent(self, t: float) -> bool:
        return self.down_from <= t < self.down_from + self.down_s

    @property
    def back(self) -> int:
        return self.down_from + self.down_s


LLAMA = ModelPlan(
    namespace="prod",
    model_name="meta-llama/Llama-3.1-8B-Instruct",
    # 40 GiB at 0.9: 8193 blocks of 16 tokens (SimConfig's docstring); 131,088 tokens.
    sim=SimConfig(model_name="meta-llama/Llama-3.1-8B-Instruct", epoch=0.0),
    model_config=MODEL_CONFIGS / "Llama-3.1-8B.json",
    growth=1.10,
    hit_tenths=4,
    # The sidecar is told the real weights and non-torch bytes but 3 GiB of activation (vLLM used
    # 4 GiB): its theoretical capacity is then 512 blocks above vLLM's, a known ratio.
    sidecar_model=(
        ("gpu_memory", "40GiB"),
        ("weights_memory", str(SimConfig().weights_bytes)),
        ("activation_memory", "3GiB"),
        ("non_torch_memory", str(SimConfig().non_torch_bytes)),
        ("cudagraph_memory", "0"),
    ),
)
QWEN = ModelPlan(
    namespace="batch",
    model_name="Qwen/Qwen2.5-7B-Instruct",
    # 28 layers × 4 KV heads × 128 × K,V × 2 bytes = 57,344 bytes per token; --kv-cache-memory-bytes 4 GiB:
    # 4 GiB // (16 × 57,344) = 4681 blocks, 74,896 tokens.
    sim=SimConfig(
        model_name="Qwen/Qwen2.5-7B-Instruct",
        kv_bytes_per_token=57344,
        kv_cache_memory_bytes=4 * GIB,
        weights_bytes=15_231_233_024,
        epoch=0.0,
    ),
    model_config=MODEL_CONFIGS / "Qwen2.5-7B-Instruct.json",
    growth=1.00,
    hit_tenths=1,
)
#: Two per model, so that a model's figures are sums and maxima over pods; four, not more, because each pod
#: costs about 12 minutes of CPU and the pods run one per CPU: four take two rounds on CI's two cores.
PODS: tuple[PodPlan, ...] = (
    PodPlan("llama-0", LLAMA, 0.10, 0.77, "10.0.1.10:9437"),
    PodPlan("llama-1", LLAMA, 0.10, 0.72, "10.0.1.11:9437"),
    PodPlan("qwen-0", QWEN, 0.05, 0.55, "10.0.2.20:9437"),
    PodPlan("qwen-1", QWEN, 0.05, 0.50, "10.0.2.21:9437"),
)
MODELS: tuple[ModelPlan, ...] = (LLAMA, QWEN)
#: Saturday 10:00-11:00 of the current week, on llama-1.
BURST = Burst("llama-1", WEEK_START + 5 * DAY_S + 10 * HOUR_S, HOUR_S, usage=0.97, waiting=4, per_scrape=6)
#: Tuesday 03:00-03:10 of the current week, qwen-1.
RESTART = Restart("qwen-1", WEEK_START + 1 * DAY_S + 3 * HOUR_S, 600)


# --- the analytic definition -----------------------------------------------------------------


def diurnal(t: float) -> float:
    """``sin²(π (h − 6) / 16)`` for the hour of day ``h`` in (6, 22), else 0."""
    x = ((t % DAY_S) / HOUR_S - 6.0) / 16.0
    return math.sin(math.pi * x) ** 2 if 0.0 < x < 1.0 else 0.0


def day_factor(t: float) -> float:
    """:data:`DAY_FACTOR` of ``t``'s weekday (1970-01-01 was a Thursday)."""
    return DAY_FACTOR[(int(t // DAY_S) + 3) % 7]


def curve(pod: PodPlan, t: float, week_start: int = WEEK_START) -> float:
    """The usage the pod's load asks for at ``t`` (before rounding to blocks)."""
    weeks_after_previous = math.floor((t - (week_start - WEEK_S)) / WEEK_S)
    u = pod.base + pod.amp * day_factor(t) * diurnal(t)
    return min(1.0, u * pod.model.growth**weeks_after_previous)


def per_request_tokens(block_size: int) -> int:
    """KV one waiting request is priced at: ``⌈(P + G/2) / bs⌉ × bs`` (``demand_tokens``,
    ``mean_request_kv_tokens`` in ``sidecar/forecast/trend.py``)."""
    return math.ceil((PROMPT_TOKENS + GENERATION_TOKENS / 2) / block_size) * block_size


@dataclass(frozen=True)
class PodState:
    """One pod at one scrape: the engine state and what the counters rose by since the last scrape."""

    t: int
    used_blocks: int
    usage: float
    waiting: int
    running: int
    finished: int  # requests finished since the last scrape
    preemptions: int
    prefix_queries: int
    prefix_hits: int
    used_tokens: int
    demand_tokens: int


def pod_state(pod: PodPlan, t: int, week_start: int = WEEK_START, burst: Burst = BURST) -> PodState:
    """The definition of the module docstring at one scrape time."""
    m = pod.model
    usable, bs = m.usable_blocks, m.sim.block_size
    in_burst = burst.pod == pod.name and burst.holds(t)
    target = burst.usage if in_burst else curve(pod, t, week_start)
    used = max(0, min(usable, round(target * usable)))
    usage = 1.0 - (usable - used) / usable
    waiting = burst.waiting if in_burst else 0
    if in_burst:
        preemptions = burst.per_scrape
    else:
        preemptions = 1 if usage > PREEMPT_ABOVE else 0
    finished = 1 + math.floor(10 * usage)
    queries = finished * PROMPT_TOKENS
    used_tokens = used * bs
    demand = used_tokens
    if usage >= WATERMARK and waiting > 0:
        demand += waiting * per_request_tokens(bs)
    running = min(m.sim.max_num_seqs, used_tokens // per_request_tokens(bs))
    return PodState(
        t=t,
        used_blocks=used,
        usage=usage,
        waiting=waiting,
        running=running,
        finished=finished,
        preemptions=preemptions,
        prefix_queries=queries,
        prefix_hits=queries * m.hit_tenths // 10,
        used_tokens=used_tokens,
        demand_tokens=demand,
    )


def scrape_times(start: int, end: int, interval: int = INTERVAL_S) -> range:
    return range(start, end, interval)


def present(pod: PodPlan, t: int, restart: Restart = RESTART) -> bool:
    return not (restart.pod == pod.name and restart.absent(t))


# --- known figures ---------------------------------------------------------------------------


def quantile(phi: float, values: Sequence[float]) -> float:
    """Prometheus' φ-quantile (``promql/quantile.go``): rank ``φ (n − 1)``, linear between neighbours."""
    ordered = sorted(values)
    rank = phi * (len(ordered) - 1)
    lower = math.floor(rank)
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - lower
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


@dataclass(frozen=True)
class Usage:
    peak: float
    p50: float
    p95: float
    p99: float
    hours_above_warning: float
    hours_above_watermark: float

    @classmethod
    def of(cls, values: Sequence[float], interval: int) -> Usage:
        def hours_above(threshold: float) -> float:
            return sum(1 for v in values if v > threshold) * interval / HOUR_S

        return cls(
            peak=max(values),
            p50=quantile(0.50, values),
            p95=quantile(0.95, values),
            p99=quantile(0.99, values),
            hours_above_warning=hours_above(WARNING),
            hours_above_watermark=hours_above(WATERMARK),
        )


@dataclass(frozen=True)
class Figures:
    """One pod's (or one model's) figures over the current week."""

    usage: Usage
    peak_demand_tokens: int
    peak_demand_at: int  # the first scrape with the peak demand
    previous_peak_demand_tokens: int
    #: peak demand ÷ the previous week's
    growth_ratio: float
    capacity_tokens: int  # vLLM's (null block included); a model's: the sum over its pods
    usable_tokens: int  # capacity without the null block
    theoretical_capacity_tokens: int  # what the sidecar's capacity model computes (see ModelPlan)
    preemptions_total: int
    worst_hour_start: int | None  # the clock hour with the most preemptions (None: none)
    worst_hour_preemptions: int
    hours_waiting: float  # scrapes with requests waiting for capacity × interval
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    samples: int  # scrapes in the week (a model: scrapes with any pod present)

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_hits_tokens / self.prefix_queries_tokens

    @property
    def idle_share(self) -> float:
        """Usable capacity never used at the week's peak demand: ``1 − peak demand / usable``."""
        return max(0.0, 1.0 - self.peak_demand_tokens / self.usable_tokens)


@dataclass(frozen=True)
class KnownPage:
    """One firing of :data:`ALERT`: ``[start, end)``, ``end`` = the last firing evaluation + interval."""

    alertname: str
    severity: str
    namespace: str
    model_name: str
    pod: str
    start: int
    end: int


@dataclass(frozen=True)
class Known:
    """The figures a report of the current week must show, from the definition alone."""

    start: int  # the current week: [start, end)
    end: int
    interval_s: int
    pods: dict[str, Figures]
    models: dict[tuple[str, str], Figures]  # (namespace, model_name)
    #: the model's growth as defined (current peaks = growth × previous peaks, before rounding to blocks)
    defined_growth: dict[tuple[str, str], float]
    pages: list[KnownPage]  # firings that start in the current week
    previous_pages: list[KnownPage]
    burst: Burst
    restart: Restart
    pod_models: dict[str, tuple[str, str]] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def previous_start(self) -> int:
        return self.start - WEEK_S


def theoretical_capacity_tokens(model: ModelPlan) -> int:
    """The sidecar's theoretical capacity for the plan's inputs (docs/capacity.md, "The budget").

    Qwen: vLLM's ``kv_cache_memory_bytes`` ÷ page bytes, in whole blocks (``budget="exact"``).
    Llama: ``int(40 GiB × 0.9) − weights − 3 GiB activation − non-torch`` (the overrides given to
    the sidecar, CUDA graphs 0) ÷ page bytes, in whole blocks (``budget="estimated"``).
    """
    sim = model.sim
    page = sim.block_size * sim.kv_bytes_per_token
    if sim.kv_cache_memory_bytes is not None:
        return sim.kv_cache_memory_bytes // page * sim.block_size
    assert sim.gpu_memory_bytes is not None
    budget = int(sim.gpu_memory_bytes * sim.gpu_memory_utilization) - sim.weights_bytes - 3 * GIB - sim.non_torch_bytes
    return budget // page * sim.block_size


def _hourly(states: Iterable[PodState]) -> dict[int, int]:
    hours: dict[int, int] = {}
    for s in states:
        hours[s.t - s.t % HOUR_S] = hours.get(s.t - s.t % HOUR_S, 0) + s.preemptions
    return hours


def _figures(
    current: list[list[PodState]],
    previous: list[list[PodState]],
    models: list[ModelPlan],
    interval: int,
) -> Figures:
    """Figures of one or more pods: per scrape the hottest usage, sums of the rest (pods present)."""

    def by_time(weeks: list[list[PodState]]) -> dict[int, list[PodState]]:
        out: dict[int, list[PodState]] = {}
        for states in weeks:
            for s in states:
                out.setdefault(s.t, []).append(s)
        return dict(sorted(out.items()))

    now, before = by_time(current), by_time(previous)
    usage = [max(s.usage for s in group) for group in now.values()]
    demand = {t: sum(s.demand_tokens for s in group) for t, group in now.items()}
    peak_t = max(demand, key=lambda t: (demand[t], -t))
    previous_peak = max(sum(s.demand_tokens for s in group) for group in before.values())
    hours = _hourly(s for states in current for s in states)
    worst = max(hours, key=lambda h: (hours[h], -h))
    flat = [s for states in current for s in states]
    return Figures(
        usage=Usage.of(usage, interval),
        peak_demand_tokens=demand[peak_t],
        peak_demand_at=peak_t,
        previous_peak_demand_tokens=previous_peak,
        growth_ratio=demand[peak_t] / previous_peak,
        capacity_tokens=sum(m.capacity_tokens for m in models),
        usable_tokens=sum(m.usable_blocks * m.sim.block_size for m in models),
        theoretical_capacity_tokens=sum(theoretical_capacity_tokens(m) for m in models),
        preemptions_total=sum(s.preemptions for s in flat),
        worst_hour_start=worst if hours[worst] else None,
        worst_hour_preemptions=hours[worst],
        hours_waiting=sum(1 for group in now.values() if any(s.waiting > 0 for s in group)) * interval / HOUR_S,
        prefix_queries_tokens=sum(s.prefix_queries for s in flat),
        prefix_hits_tokens=sum(s.prefix_hits for s in flat),
        samples=len(now),
    )


def _pages(pod: PodPlan, states: list[PodState], interval: int) -> list[KnownPage]:
    """Firings of :data:`ALERT` per severity: ``max_over_time(usage[1m]) > threshold`` held ``for:``.

    Evaluated at the scrape times: with one scrape a minute the 1m window holds one sample, and an
    absent pod ends a run (no sample, no alert). An alert fires at the first evaluation at least
    ``for:`` after the run's first (Prometheus' ``ActiveAt``, ``rules/alerting.go``).
    """
    pages = []
    for severity, threshold, hold in ALERT_RULES:
        for run in _runs(states, threshold, interval):
            firing = [s.t for s in run if s.t - run[0].t >= hold]
            if firing:
                m = pod.model
                pages.append(
                    KnownPage(ALERT, severity, m.namespace, m.model_name, pod.name, firing[0], firing[-1] + interval)
                )
    return pages


def _runs(states: list[PodState], threshold: float, interval: int) -> Iterator[list[PodState]]:
    """Maximal runs of consecutive scrapes above ``threshold``."""
    run: list[PodState] = []
    for s in states:
        if s.usage > threshold and (not run or s.t - run[-1].t == interval):
            run.append(s)
            continue
        if run:
            yield run
        run = [s] if s.usage > threshold else []
    if run:
        yield run


def pod_states(pod: PodPlan, start: int, end: int, interval: int = INTERVAL_S) -> list[PodState]:
    """The pod's states at every scrape of ``[start, end)`` where it is present."""
    return [pod_state(pod, t) for t in scrape_times(start, end, interval) if present(pod, t)]


def known(interval: int = INTERVAL_S) -> Known:
    """The known figures of the current week, computed from the definition alone (about a second)."""
    start, end, prev = WEEK_START, WEEK_START + WEEK_S, WEEK_START - WEEK_S
    cur = {p.name: pod_states(p, start, end, interval) for p in PODS}
    old = {p.name: pod_states(p, prev, start, interval) for p in PODS}
    pods = {p.name: _figures([cur[p.name]], [old[p.name]], [p.model], interval) for p in PODS}
    models = {}
    for m in MODELS:
        members = [p for p in PODS if p.model is m]
        models[(m.namespace, m.model_name)] = _figures(
            [cur[p.name] for p in members], [old[p.name] for p in members], [p.model for p in members], interval
        )
    pages: list[KnownPage] = []
    for p in PODS:
        pages.extend(_pages(p, old[p.name] + cur[p.name], interval))
    return Known(
        start=start,
        end=end,
        interval_s=interval,
        pods=pods,
        models=models,
        defined_growth={(m.namespace, m.model_name): m.growth for m in MODELS},
        pages=sorted((pg for pg in pages if pg.start >= start), key=lambda pg: (pg.start, pg.pod, pg.severity)),
        previous_pages=sorted((pg for pg in pages if pg.start < start), key=lambda pg: (pg.start, pg.pod, pg.severity)),
        burst=BURST,
        restart=RESTART,
        pod_models={p.name: (p.model.namespace, p.model.model_name) for p in PODS},
    )


# --- the series, through the daemon's code ---------------------------------------------------


class KnownServer:
    """What :func:`~sidecar.simulator.exposition.render` reads (its ``Server`` protocol): one engine."""

    def __init__(self, config: SimConfig, started_at: float) -> None:
        self.config = config
        self.started_at = started_at
        self.engines = [Engine(config, 0, started_at)]
        spec = RequestSpec(arrival=0.0, prompt_tokens=PROMPT_TOKENS, output_tokens=GENERATION_TOKENS, max_tokens=1024)
        #: placeholder requests: the exposition counts running and waiting ones (never deferred: arrival 0)
        self._requests = [Request(i, spec, config.max_model_len) for i in range(config.max_num_seqs + 16)]

    def apply(self, s: PodState) -> None:
        """Set the engine to the state ``s`` and advance its counters and histograms."""
        e = self.engines[0]
        e.now = float(s.t)
        e.pool.free = e.pool.usable - s.used_blocks
        e.running = {r.rid: r for r in self._requests[: s.running]}
        e.waiting = deque(self._requests[s.running : s.running + s.waiting])
        c = e.c
        c.preemptions += s.preemptions
        c.prefix_queries += s.prefix_queries
        c.prefix_hits += s.prefix_hits
        c.prompt_tokens += s.finished * PROMPT_TOKENS
        c.prompt_local_cache_hit += s.prefix_hits
        c.prompt_local_compute += s.finished * PROMPT_TOKENS - s.prefix_hits
        c.generation_tokens += s.finished * GENERATION_TOKENS
        c.success_stop += s.finished
        e.h["request_prompt_tokens"].observe(PROMPT_TOKENS, s.finished)
        e.h["request_generation_tokens"].observe(GENERATION_TOKENS, s.finished)
        e.h["request_max_num_generation_tokens"].observe(1024, s.finished)
        e.h["request_params_max_tokens"].observe(1024, s.finished)
        e.h["request_params_n"].observe(1, s.finished)


def sidecar_config(pod: PodPlan, interval: int = INTERVAL_S) -> Config:
    """The pod's sidecar: one target named after the pod, the model's ``model.*`` settings, simulated clock."""
    flags: dict[tuple[str, str], object] = {
        ("scrape", "interval"): f"{interval}s",
        ("model", "config"): str(pod.model.model_config),
        # the pages come from KnownServer in-process: no vLLM process to find in /proc (one listening on
        # 8000 on this machine would otherwise lend its flags to the week)
        ("model", "process_discovery"): False,
    }
    for key, value in pod.model.sidecar_model:
        flags[("model", key)] = value
    target = {"name": pod.name, "url": "http://127.0.0.1:8000/metrics", "clock": "simulated"}
    return load_config(None, env={}, flags=flags, flag_targets=[target])


class _PodRun:
    """One pod: its simulated vLLM and its sidecar (both replaced on a restart)."""

    def __init__(self, pod: PodPlan, started_at: int, history: HistoryStore | None, interval: int) -> None:
        self.pod = pod
        self.interval = interval
        self.history = history
        self.up = False
        self._start(started_at)

    def _start(self, at: int) -> None:
        self.server = KnownServer(self.pod.model.sim, float(at))
        self.pipeline = Pipeline(
            sidecar_config(self.pod, self.interval), self.pod.model.model_name, history=self.history
        )
        self.up = True

    def scrape(self, t: int, restart: Restart = RESTART) -> list[tuple[str, str, dict[str, str], float]] | None:
        """The pod at ``t``: None while absent, else the sidecar's samples (family, type, labels, value)."""
        if not present(self.pod, t, restart):
            self.up = False
            return None
        if not self.up:
            self._start(t - self.interval)  # back: a new vLLM process and a new sidecar, counters at 0
        self.server.apply(pod_state(self.pod, t))
        p = self.pipeline
        p.ingest(t, p.read(render(self.server, GENERATION).encode()))
        if self.history is not None:
            p.sidecar.record_history(p.state)  # the daemon's own history write, at the sidecar's clock t
        out = []
        for family in p.sidecar.registry.collect():
            for s in family.samples:
                if s.name in FAMILIES:
                    out.append((family.name, family.type, s.labels, s.value))
        return out


class _OpenMetrics:
    """Samples per series, written family by family (OpenMetrics needs each family contiguous)."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}
        self.series: dict[str, dict[str, tuple[array[float], array[float]]]] = {}

    def add(self, family: str, kind: str, sample: str, labels: dict[str, str], t: int, value: float) -> None:
        self.types[family] = kind
        text = sample + "{" + ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels)) + "}"
        ts, vs = self.series.setdefault(family, {}).setdefault(text, (array("d"), array("d")))
        ts.append(t)
        vs.append(value)

    def write_samples(self, family: str, f: TextIO) -> None:
        """The family's sample lines, series by series, each in time order."""
        for text, (ts, vs) in sorted(self.series.get(family, {}).items()):
            f.writelines(f"{text} {floatToGoString(v)} {int(t)}\n" for t, v in zip(ts, vs, strict=True))

    def write_fragments(self, folder: Path) -> None:
        """One file of sample lines per family (``<family>.om``), to be joined by :func:`_join`."""
        folder.mkdir(parents=True, exist_ok=True)
        for family in self.series:
            with (folder / f"{family}.om").open("w", encoding="utf-8") as f:
                self.write_samples(family, f)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _alerts(om: _OpenMetrics, pod_labels: dict[str, dict[str, str]], interval: int) -> None:
    """The ``ALERTS`` series of :data:`ALERT`, synthesised from the known curve.

    Prometheus writes ``ALERTS`` only while it evaluates rules, so a backfill cannot produce them
    (``promtool tsdb create-blocks-from rules`` does not write ``ALERTS`` either): they are derived
    here from the definition, as the rule would have evaluated at each scrape time, with the
    labels of the rule's result (the series' own labels minus ``__name__``, plus ``alertname``,
    ``alertstate`` and the rule's ``severity``): ``pending`` from a run's first evaluation until it
    fires, ``firing`` while it fires.
    """
    for pod in PODS:
        states = pod_states(pod, WEEK_START - WEEK_S, WEEK_START + WEEK_S, interval)
        for severity, threshold, hold in ALERT_RULES:
            for run in _runs(states, threshold, interval):
                for s in run:
                    state = "firing" if s.t - run[0].t >= hold else "pending"
                    labels = {**pod_labels[pod.name], "alertname": ALERT, "alertstate": state, "severity": severity}
                    om.add("ALERTS", "gauge", "ALERTS", labels, s.t, 1.0)


def _generate_pod(name: str, work: Path, interval: int) -> tuple[dict[str, str], dict[str, str]]:
    """One pod's two weeks, in a process of its own: its history file ``work/<pod>.sqlite`` (written by
    the daemon's ``record_history``) and its ``week.om`` lines per family in ``work/<pod>/``.

    Returns the labels of its usage series (for ``ALERTS``) and the type of each family.
    """
    pod = next(p for p in PODS if p.name == name)
    start, end = WEEK_START - WEEK_S, WEEK_START + WEEK_S
    # The Llama sidecars log, once each, that vLLM's capacity differs from their theoretical one: it
    # does, by design (ModelPlan LLAMA), so that warning is kept out of the test output.
    logging.getLogger("kv_sidecar.layers").setLevel(logging.ERROR)
    store = HistoryStore.open(work / f"{name}.sqlite", retention_s=3 * WEEK_S, max_bytes=2**40, now=start)
    om = _OpenMetrics()
    usage_labels: dict[str, str] = {}
    try:
        run = _PodRun(pod, start - interval, store, interval)
        for t in scrape_times(start, end, interval):
            for family, kind, labels, value in run.scrape(t) or ():
                full = {**labels, **pod.labels}
                if family == "kvcache_usage_ratio":
                    usage_labels = full
                om.add(family, kind, _sample_name(family, kind), full, t, value)
    finally:
        store.close()
    om.write_fragments(work / name)
    return usage_labels, om.types


def _merge_histories(parts: list[Path], path: Path, now: int) -> None:
    """The pods' history files as one: every series and row copied as the daemon wrote it.

    Each pod's sidecar keeps its own history (one target each, so no two series collide); the report
    reads one file, so the rows of all four are copied into one made by :class:`HistoryStore`.
    """
    HistoryStore.open(path, retention_s=3 * WEEK_S, max_bytes=2**40, now=now).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for part in parts:
            conn.execute("ATTACH DATABASE ? AS part", (str(part),))
            conn.execute("BEGIN")
            rows = conn.execute("SELECT id, name, labels, kind FROM part.series ORDER BY id").fetchall()
            for sid, name, labels, kind in rows:
                new = conn.execute("INSERT INTO series (name, labels, kind) VALUES (?, ?, ?)", (name, labels, kind))
                conn.execute(
                    "INSERT INTO points SELECT ?, minute, min, max, sum, count, last FROM part.points"
                    " WHERE series_id = ?",
                    (new.lastrowid, sid),
                )
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE part")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


def _join(work: Path, path: Path, types: dict[str, str], alerts: _OpenMetrics) -> None:
    """``week.om``: per family its ``# TYPE`` line and every pod's lines, then ``# EOF``."""
    with path.open("w", encoding="utf-8") as out:
        for family in sorted({*types, *alerts.types}):
            out.write(f"# TYPE {family} {types.get(family) or alerts.types[family]}\n")
            for pod in PODS:
                fragment = work / pod.name / f"{family}.om"
                if fragment.exists():
                    with fragment.open(encoding="utf-8") as f:
                        shutil.copyfileobj(f, out)
            alerts.write_samples(family, out)
        out.write("# EOF\n")


def workers() -> int:
    """Processes for :func:`generate`: one per CPU this process may use, at most one per pod."""
    return max(1, min(len(PODS), len(os.sched_getaffinity(0))))


def generate(out_dir: Path, interval: int = INTERVAL_S, processes: int | None = None) -> Known:
    """Write ``week.om`` and ``history.sqlite`` for the previous and the current week into ``out_dir``.

    The pods are independent (one sidecar each), so they run in parallel, ``processes`` at a time
    (default :func:`workers`); each scrape costs about 5 ms of CPU (render, parse, derive, history).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    history_path = out_dir / "history.sqlite"
    for stale in (history_path, out_dir / "history.sqlite-wal", out_dir / "history.sqlite-shm"):
        stale.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="pods-", dir=out_dir) as tmp:
        work = Path(tmp)
        with ProcessPoolExecutor(max_workers=processes or workers(), initializer=_die_with_parent) as pool:
            futures = [pool.submit(_generate_pod, p.name, work, interval) for p in PODS]
            results = [f.result() for f in futures]
        types: dict[str, str] = {}
        for _, pod_types in results:
            types.update(pod_types)
        alerts = _OpenMetrics()
        _alerts(alerts, {p.name: labels for p, (labels, _) in zip(PODS, results, strict=True)}, interval)
        _merge_histories([work / f"{p.name}.sqlite" for p in PODS], history_path, WEEK_START - WEEK_S)
        _join(work, out_dir / "week.om", types, alerts)
    k = known(interval)
    return Known(**{**k.__dict__, "files": {"om": out_dir / "week.om", "history": history_path}})


def _sample_name(family: str, kind: str) -> str:
    return family + "_total" if kind == "counter" else family


# --- the cache -------------------------------------------------------------------------------


def source_hash() -> str:
    """What the series depend on: this file, the sidecar's code outside the report, the model configs."""
    h = hashlib.sha256()
    files = [Path(__file__)]
    files += sorted(p for p in (REPO / "sidecar").rglob("*.py") if "report" not in p.relative_to(REPO).parts)
    files += sorted((REPO / "sidecar" / "data").glob("*"))
    files += [LLAMA.model_config, QWEN.model_config]
    for p in files:
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cached_week(root: Path | None = None) -> Known:
    """:func:`generate` once per :func:`source_hash` into ``root/<hash>/`` (default :data:`CACHE`); later
    calls only compute :func:`known`. One process generates at a time, holding ``<hash>.lock``: another
    caller (a test, while ``tests/conftest.py`` generates it in the background) waits for it, then finds
    the week written, so the week is never made twice at once. It is written into a temporary folder and
    renamed, so no one reads a half-written week; the folder of a generation that died (killed with the test
    run) is removed by the next one, which holds the lock."""
    root = root or CACHE
    final = root / source_hash()
    if not (final / "week.om").exists():
        root.mkdir(parents=True, exist_ok=True)
        with (root / f"{final.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
            if not (final / "week.om").exists():
                _prune(root, keep=final)
                tmp = Path(tempfile.mkdtemp(prefix=f"tmp-{final.name}-", dir=root))
                try:
                    generate(tmp)
                    _checkpoint(tmp / "history.sqlite")
                    os.rename(tmp, final)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    k = known()
    return Known(**{**k.__dict__, "files": {"om": final / "week.om", "history": final / "history.sqlite"}})


def _prune(root: Path, keep: Path) -> None:
    """Remove what no generation needs any more: the weeks of other versions of the code (about 450 MB each, so
    that a checkout that changes often does not fill its disk), and the temporary folders of generations that
    died (``tmp-<hash>-*`` whose ``<hash>.lock`` nobody holds). The caller holds ``keep``'s lock."""
    for old in root.iterdir():
        if old.name.startswith("tmp-") and old.is_dir():
            version = old.name.split("-")[1]
            if version == keep.name or _unlocked(root / f"{version}.lock"):
                shutil.rmtree(old, ignore_errors=True)
        elif old != keep and old.is_dir() and (old / "week.om").exists():
            shutil.rmtree(old, ignore_errors=True)
            (root / f"{old.name}.lock").unlink(missing_ok=True)


def _unlocked(path: Path) -> bool:
    """True when no process holds the lock ``path`` (or it does not exist)."""
    try:
        with path.open("r") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except FileNotFoundError:
        return True
    except BlockingIOError:
        return False


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): the background
    generation and its workers never outlive the test run that started them, whatever ended it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
    except (OSError, AttributeError):  # not Linux: the session's own clean-up still stops it
        pass


def _checkpoint(path: Path) -> None:
    """Fold the WAL into the main file, so that the folder can be renamed and read without it."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


if __name__ == "__main__":
    # python tests/report/known_week.py OUT_DIR: generate into OUT_DIR and time it;
    # python tests/report/known_week.py --cache: cached_week() (what tests/conftest.py runs in the background)
    import sys
    import time

    began = time.perf_counter()
    if sys.argv[1] == "--cache":
        _die_with_parent()
        if len(sys.argv) > 2 and os.getppid() != int(sys.argv[2]):  # the test run ended before we got here
            sys.exit(1)
        result = cached_week()
    else:
        result = generate(Path(sys.argv[1]))
    print(f"ready in {time.perf_counter() - began:.1f}s: {result.files}")
