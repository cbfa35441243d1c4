"""The simulated server: engines + workload + simulated clock (pure, no I/O).

    sim = Simulator(SimConfig(), scenario="ramp-30m", seed=1)
    sim.advance(15.0)                       # 15 simulated seconds, deterministic
    body = sim.render(Generation.V1_CAPACITY_LABELS)

Several engines (``SimConfig.engines``, data parallel) sit behind one endpoint;
each arrival goes to the engine with the lowest ``4 x waiting + running``, as
vLLM's internal DP load balancer scores them.
"""

from __future__ import annotations

import math

from ..generations import Generation
from .config import SimConfig
from .engine import Engine, RequestSpec
from .exposition import render
from .scenarios import SCENARIOS, Scenario, Workload
from .trace import TracePlay, TraceWorkload


class SimulatorConfigError(ValueError):
    """Bad configuration; ``problems`` lists every one, each naming the flag and the fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class Simulator:
    def __init__(
        self,
        config: SimConfig | None = None,
        scenario: str | Scenario = "steady",
        seed: int = 0,
        trace: TracePlay | None = None,
    ) -> None:
        """``trace``: the arrivals and lengths come from this trace instead of the scenario's generator
        (the scenario still gives the server and any restart; :meth:`TracePlay.scenario` makes one)."""
        if isinstance(scenario, str):
            if scenario not in SCENARIOS:
                raise SimulatorConfigError(
                    [f"--scenario: unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}"]
                )
            scenario = SCENARIOS[scenario]
        self.scenario = scenario
        self.config = config if config is not None else scenario.config
        problems = self.config.problems()
        if problems:
            raise SimulatorConfigError(problems)
        self.seed = seed
        self.trace = trace
        self.workload: Workload | TraceWorkload = (
            trace.workload(self.config.max_model_len)
            if trace is not None
            else Workload(scenario, seed, self.config.max_model_len)
        )
        self.now = 0.0
        #: Simulated time the (current) server process started; moves on a restart.
        self.started_at = 0.0
        self.down_until = -math.inf
        self.restarts = 0
        self.dropped_requests = 0  # arrivals while down, and in-flight work lost on restart
        self._next_rid = 0
        self._restart_pending = scenario.restart_at
        self.engines = [Engine(self.config, i, 0.0) for i in range(self.config.engines)]

    # -- replays ------------------------------------------------------------------
    def rerun(self, config: SimConfig) -> Simulator:
        """The same scenario and seed (hence the same requests) on another server config."""
        return Simulator(config, self.scenario, self.seed, self.trace)

    def with_gpu_memory_utilization(self, utilization: float) -> Simulator:
        """A fresh run of the same workload with ``--gpu-memory-utilization`` changed."""
        return self.rerun(self.config.with_gpu_memory_utilization(utilization))

    # -- time -------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        """False while a restart is in progress (a real server refuses connections then)."""
        return self.now >= self.down_until

    def advance(self, seconds: float) -> None:
        """Step simulated time forward by ``seconds`` (deterministic for a seed)."""
        if seconds < 0:
            raise ValueError("advance(seconds): seconds must be >= 0")
        self.advance_to(self.now + seconds)

    def advance_to(self, t: float) -> None:
        closed_loop = bool(self.scenario.clients)
        while True:
            nxt = self.workload.next_time()
            target = min(nxt, t)
            if self._restart_pending is not None:
                target = min(target, self._restart_pending)
            if closed_loop and not all(e.idle() for e in self.engines):
                # Finishes send new requests mid-run: go one engine step at a time.
                target = min(target, min(e.now for e in self.engines) + 1e-9)
            for e in self.engines:
                e.advance_to(target)
                if e.finished:
                    for when, r in e.finished:
                        self.workload.on_finish(when, r.spec.client)
                    e.finished.clear()
            if self._restart_pending is not None and target >= self._restart_pending:
                self._restart(self._restart_pending)
                continue
            if self.workload.next_time() <= target:
                self._dispatch(self.workload.pop())
                continue
            if target >= t:
                break
        self.now = max(self.now, t)

    def _dispatch(self, spec: RequestSpec) -> None:
        if spec.arrival < self.down_until:
            self.dropped_requests += 1
            return
        engine = min(self.engines, key=lambda e: (e.load(), e.index))
        self._next_rid += 1
        engine.add_request(spec, self._next_rid)

    def _restart(self, at: float) -> None:
        """Process restart: in-flight work is lost, counters restart at 0 after the downtime."""
        self._restart_pending = None
        self.restarts += 1
        back = at + self.scenario.restart_downtime_s
        for e in self.engines:
            self.dropped_requests += len(e.running) + len(e.waiting)
        self.down_until = back
        self.started_at = back
        self.engines = [Engine(self.config, i, back) for i in range(self.config.engines)]

    # -- ground truth (tests, benchmarks) ---------------------------------------------
    @property
    def num_blocks(self) -> int:
        """``num_gpu_blocks`` per engine (null block included)."""
        return self.config.num_blocks

    @property
    def used_blocks(self) -> int:
        return sum(e.used_blocks for e in self.engines)

    @property
    def running(self) -> int:
        return sum(e.num_running for e in self.engines)

    @property
    def waiting(self) -> int:
        return sum(len(e.waiting) for e in self.engines)

    def waiting_by_reason(self) -> dict[str, int]:
        out = {"capacity": 0, "deferred": 0}
        for e in self.engines:
            for k, v in e.waiting_by_reason().items():
                out[k] += v
        return out

    @property
    def preemptions(self) -> int:
        """Preemptions since the last restart (what ``num_preemptions_total`` shows)."""
        return sum(e.c.preemptions for e in self.engines)

    def usage(self, engine: int = 0) -> float:
        """``kv_cache_usage_perc`` of one engine: used / (num_blocks - 1)."""
        return self.engines[engine].usage()

    # -- exposition ---------------------------------------------------------------------
    def render(self, generation: Generation | str = Generation.V1_CAPACITY_LABELS) -> str:
        """The ``/metrics`` body a vLLM of that metric generation would serve now."""
        return render(self, Generation(generation))


#: How often :func:`peak_used_blocks` looks at the pool: the sidecar's default scrape interval, so that
#: "the peaks reach 0.95" means what a scrape of the sized server would show.
PEAK_SAMPLE_S = 5.0


def peak_used_blocks(play: TracePlay, config: SimConfig, *, sample_s: float = PEAK_SAMPLE_S) -> int:
    """The most KV blocks the trace holds at once on ``config``'s server with a pool that never fills.

    The trace is replayed once (no loop) with ``num_gpu_blocks_override`` large enough for every
    request of the trace at its full length at once, and the used blocks are read every ``sample_s``
    simulated seconds: the trace's peak demand on that scheduler (``max_num_seqs`` and
    ``max_num_batched_tokens`` still apply).
    """
    unbounded = sum(
        -(-min(r.prompt_tokens + r.output_tokens, config.max_model_len) // config.block_size)
        for r in play.trace.requests
    )
    big = config.replace(num_gpu_blocks_override=unbounded + 2, kv_cache_memory_bytes=None)
    sim = Simulator(big, play.scenario(big), 0, TracePlay(play.trace, play.speed, play.offset_s, loop=False))
    peak, t, end = 0, 0.0, play.duration_s
    while t < end:
        t += sample_s
        sim.advance_to(t)
        peak = max(peak, sim.used_blocks // max(1, big.engines))
    return peak


def pool_for_peak(play: TracePlay, config: SimConfig, peak_usage: float) -> SimConfig:
    """``config`` with ``num_gpu_blocks_override`` set so that the trace's peaks reach ``peak_usage``.

    usable blocks = ⌈peak used blocks ÷ peak_usage⌉, plus vLLM's null block (usage is
    used ÷ (num_gpu_blocks − 1), ``vllm/v1/core/block_pool.py`` ``get_usage``). Above 1 the pool
    is smaller than the peaks: the trace preempts at its busiest moments.
    """
    if not peak_usage > 0:
        raise ValueError(f"--trace-peak-usage: must be > 0, got {peak_usage:g}")
    peak = peak_used_blocks(play, config)
    return config.replace(num_gpu_blocks_override=max(2, math.ceil(peak / peak_usage)) + 1, kv_cache_memory_bytes=None)
