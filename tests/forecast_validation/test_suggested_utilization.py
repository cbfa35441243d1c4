"""Apply the suggested ``gpu_memory_utilization`` and the same workload's peak sits at target_usage.

The simulator turns utilization into KV blocks as vLLM does (``SimConfig.num_blocks``:
``memory × u − weights − activation − non-torch``, floored to blocks). The daemon's layers, given
the served model's real ``config.json`` (Llama-3.1-8B: 32 layers × 8 KV heads × 128 × K,V × 2 bytes
= 131,072 bytes per token, exactly the simulator's ``kv_bytes_per_token``) and the GPU memory
(``model.gpu_memory``, so ``basis="configured"``), compute ``kvcache_suggested_gpu_memory_utilization``
from the peak ``kvcache_demand_tokens`` of the run. The same workload (scenario + seed = the same
requests, ``Simulator.with_gpu_memory_utilization``) is then run again at that utilization.

The server is an 80 GiB GPU at a low ``gpu_memory_utilization`` (0.43: 7,374 blocks), so that the
answer lies inside the suggestion's clamp range [0.5, 0.95]; on the library's 40 GiB server at 0.9
the range above 0.9 holds only 16k more tokens and every saturating scenario is clamped to 0.95.
"""

from __future__ import annotations

import logging

import pytest
from fixtures import MODEL_CONFIGS

from sidecar.replay import Replay, replay_config
from sidecar.simulator import LIBRARY, SimConfig, Simulator

GIB = 1 << 30
MODEL = MODEL_CONFIGS / "Llama-3.1-8B.json"
SERVER = SimConfig(gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.43)
TARGET, TOLERANCE = 0.75, 0.05

pytestmark = pytest.mark.timeout(120)


def _run(sim: Simulator, peak_window: str | None = None) -> tuple[Replay, list[tuple[float, float, float]]]:
    """Replay the whole scenario; (t, usage, demand) at every 5-s scrape."""
    replay = Replay(
        sim, replay_config(model_config=str(MODEL), gpu_memory="80GiB", target_usage=TARGET, peak_window=peak_window)
    )
    rows: list[tuple[float, float, float]] = []
    replay.run_until(
        LIBRARY[sim.scenario.name].duration_s,
        every=5.0,
        on_sample=lambda r: rows.append((r.now, r.gauge("kvcache_usage_ratio"), r.gauge("kvcache_demand_tokens"))),
    )
    return replay, rows


def _check_peak_at_target(label: str, rows_before, after: Replay, rows_after) -> None:
    """At the workload's peak (highest demand before the change), usage after it is target ± tolerance."""
    peak_t = max(rows_before, key=lambda r: r[2])[0]
    at_peak = dict((t, usage) for t, usage, _ in rows_after)[peak_t]
    top = max(x for _, x, _ in rows_after)
    print(
        f"\n{label} -> {after.sim.num_blocks} blocks: usage at the peak (t={peak_t:.0f}s) {at_peak:.3f}, "
        f"max {top:.3f}, {after.sim.preemptions} preemptions"
    )
    assert abs(at_peak - TARGET) <= TOLERANCE, at_peak
    assert top <= TARGET + TOLERANCE
    assert after.sim.preemptions == 0


@pytest.fixture(autouse=True)
def _quiet_capacity_warning():
    # The capacity layer rightly warns that the simulator's activation/non-torch memory differs
    # from its own estimate; irrelevant here (the configured basis does not use the estimate).
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def test_sizing_model_matches_the_simulator():
    """Premise: the bytes per token the sidecar derives from config.json are the simulator's."""
    replay = Replay(
        Simulator(SERVER, scenario="steady-high", seed=1), replay_config(model_config=str(MODEL), gpu_memory="80GiB")
    )
    replay.run_until(30.0)
    assert replay.gauge("kvcache_theoretical_bytes_per_token") == SERVER.kv_bytes_per_token == 131072
    assert replay.gauge("kvcache_capacity_tokens") == SERVER.num_blocks * SERVER.block_size == 7374 * 16


def test_applied_suggestion_puts_the_peak_at_target_usage():
    """steady-high on 7,374 blocks: peaks reach 1.0 and preempt; at u* the same peak sits at 0.75 ± 0.05."""
    first, rows = _run(Simulator(SERVER, scenario="steady-high", seed=1))
    assert first.sim.preemptions > 0 and max(u for _, u, _ in rows) > 0.99  # premise: it saturates
    u = first.gauge("kvcache_suggested_gpu_memory_utilization", basis="configured")
    assert u is not None and 0.5 < u < 0.95, u  # inside the clamp range: a real answer, not a bound
    assert (
        first.gauge("kvcache_recommendation_info", action="raise_gpu_memory_utilization", reason="peak_above_target")
        == 1.0
    )
    again, rows2 = _run(first.sim.with_gpu_memory_utilization(u))
    _check_peak_at_target(
        f"steady-high seed 1: {SERVER.num_blocks} blocks at u=0.43, {first.sim.preemptions} "
        f"preemptions; suggested u*={u:.4f}",
        rows,
        again,
        rows2,
    )


def test_heavy_saturation_overshoots_once_then_the_advice_converges_to_target_usage():
    """burst-3x-5m (hundreds of preemptions): two rounds of advice put its peak at 0.75 ± 0.05.

    Round 1, thrashing: the queue built while thrashing inflates the peak demand (waiting requests
    count at their mean size, and recomputing preempted requests makes the queue grow faster than
    the load), so u* is generous: measured 0.936, and at it the burst peaks at about 0.34. Following
    it still removes every preemption and keeps the peak under the warning.
    Round 2, not thrashing: the demand is just what is held, and once a whole ``forecast.peak_window``
    has been watched (30 simulated minutes here, so the 35-minute run holds one) the sidecar
    advises to lower; at that u* the same burst peaks at the target.
    """
    sim = Simulator(SERVER.replace(gpu_memory_utilization=0.42), scenario="burst-3x-5m", seed=1)
    first, rows = _run(sim, peak_window="30m")
    assert first.sim.preemptions > 100
    u1 = first.gauge("kvcache_suggested_gpu_memory_utilization", basis="configured")
    assert u1 is not None and u1 > 0.42
    second, rows2 = _run(first.sim.with_gpu_memory_utilization(u1), peak_window="30m")
    peak2 = max(x for _, x, _ in rows2)
    assert second.sim.preemptions == 0
    assert peak2 <= TARGET + TOLERANCE

    u2 = second.gauge("kvcache_suggested_gpu_memory_utilization", basis="configured")
    assert (
        second.gauge("kvcache_recommendation_info", action="lower_gpu_memory_utilization", reason="peak_below_target")
        == 1.0
    )
    assert u2 is not None and 0.5 < u2 < u1, (u1, u2)  # inside the clamp range: a real answer
    third, rows3 = _run(second.sim.with_gpu_memory_utilization(u2), peak_window="30m")
    _check_peak_at_target(
        f"burst-3x-5m seed 1: {first.sim.preemptions} preemptions at u=0.42; u1*={u1:.4f} -> "
        f"peak {peak2:.3f}, 0 preemptions; u2*={u2:.4f}",
        rows2,
        third,
        rows3,
    )
