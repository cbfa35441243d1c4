"""Simulated time: a scenario gives the same gauges at ``--speed 1`` and ``--speed 20``.

Two real ``kv-sidecar simulate`` processes serve the same scenario and seed, one at 1 simulated
second per wall second, one at 20. In-process daemons (:class:`sidecar.daemon.Sidecar` with the
capacity and forecast layers, targets ``clock: simulated`` from a YAML file; one daemon per
target, as deployed) scrapes them with its own ``scrape_once`` — real HTTP, real ``X-Simulated-Time``
header — every 5 simulated seconds: every 5 s of wall time at speed 1, every 250 ms at speed 20, for
50 simulated seconds.

Two checks:

1. **Exact.** Each run's gauges equal, to float precision, those of an in-process replay
   (:mod:`sidecar.replay`) of the same scenario scraped at exactly the simulated times the header
   reported. So the gauges are a function of simulated time alone: wall speed and the HTTP hop
   change nothing. (The simulator's state at time t does not depend on the steps taken to reach
   t, which this also relies on.) A daemon stamping samples with its wall clock would fail here:
   at speed 20 its fill rate would be 20× the replay's.
2. **Across speeds.** The two runs cannot be scraped at identical simulated instants (scrape
   jitter of 50 ms is 1 simulated second at speed 20), so they are compared at the nearest samples
   (at most 2.5 simulated seconds apart; a slow sample without such a partner is skipped): usage and
   demand within 0.05 of the pool (a few requests' worth of KV over 2.5 s of this ramp), fill rate and
   time until full within a factor of 2 —
   versus the factor 20 that wall-clock stamps would give.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from processes import free_port

from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.generations import Generation
from sidecar.layers import build_extenders
from sidecar.replay import Pipeline, replay_config
from sidecar.simulator import SimConfig, Simulator

pytestmark = pytest.mark.timeout(120)

SCENARIO, SEED = "ramp-10m", 1
SIM_STEP_S = 5.0  # simulated seconds between scrapes
SIM_SPAN_S = 50.0  # simulated seconds scraped
SPEEDS = {"slow": 1.0, "fast": 20.0}
#: The gauges compared (the forecast's, and the base ones they rest on).
GAUGES = (
    "kvcache_usage_ratio",
    "kvcache_used_tokens",
    "kvcache_demand_tokens",
    "kvcache_fill_rate_tokens_per_second",
    "kvcache_time_until_full_seconds",
    "kvcache_time_until_watermark_seconds",
)
FORECAST = {"window": "10m"}
MODEL = SimConfig().model_name


@contextlib.contextmanager
def _simulator(speed: float, log: Path):
    port = free_port()
    exe = Path(sys.executable).parent / "kv-sidecar"
    argv = [
        str(exe),
        "simulate",
        "--port",
        str(port),
        "--scenario",
        SCENARIO,
        "--seed",
        str(SEED),
        "--speed",
        f"{speed:g}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"kv-sidecar simulate exited {proc.returncode}: {log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"simulator not up in 20 s: {log.read_text()}"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


async def _drive(sidecar: Sidecar, name: str, period_wall: float, n: int) -> list[tuple[float, dict]]:
    """``scrape_once`` every ``period_wall`` seconds on a fixed cadence; (simulated time, gauges) each."""
    state = next(s for s in sidecar.states if s.target.name == name)
    labels = {"target": name, "model_name": MODEL, "engine": "0"}
    out = []
    t0 = time.monotonic()
    for k in range(n):
        await asyncio.sleep(max(0.0, t0 + k * period_wall - time.monotonic()))
        await sidecar.scrape_once(state)
        assert state.snapshot.up, f"scrape of {name} failed: {state.errors}"
        sim_time = state.history[(MODEL, "0")][-1][0]
        out.append((sim_time, {g: sidecar.registry.get_sample_value(g, labels) for g in GAUGES}))
    return out


def _reference(times: list[float]) -> list[dict]:
    """The same scenario replayed in-process, scraped at exactly ``times`` (simulated)."""
    sim = Simulator(SimConfig(), scenario=SCENARIO, seed=SEED)
    pipe = Pipeline(replay_config(**FORECAST), MODEL)
    out = []
    for t in times:
        sim.advance_to(t)
        pipe.ingest(t, pipe.read(sim.render(Generation.V1_CAPACITY_LABELS).encode()))
        out.append({g: pipe.gauge(g) for g in GAUGES})
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_same_gauges_at_speed_1_and_20(tmp_path: Path):
    n = int(SIM_SPAN_S / SIM_STEP_S) + 1
    with (
        _simulator(SPEEDS["slow"], tmp_path / "sim-slow.log") as slow_url,
        _simulator(SPEEDS["fast"], tmp_path / "sim-fast.log") as fast_url,
    ):
        cfg = tmp_path / "sidecar.yaml"
        cfg.write_text(
            "scrape: {interval: 5s}\n"  # scrapes are driven below; 5 s keeps the default 4 s timeout
            f"forecast: {{window: {FORECAST['window']}}}\n"
            "targets:\n"
            f"  - {{name: slow, url: '{slow_url}', clock: simulated}}\n"
            f"  - {{name: fast, url: '{fast_url}', clock: simulated}}\n"
        )
        config = load_config(str(cfg), env={})
        # One daemon per target, as deployed (one sidecar per vLLM pod).
        sidecars = {t.name: Sidecar(replace(config, targets=(t,)), build_extenders(config)) for t in config.targets}

        async def both():
            try:
                return await asyncio.gather(
                    _drive(sidecars["slow"], "slow", SIM_STEP_S / SPEEDS["slow"], n),
                    _drive(sidecars["fast"], "fast", SIM_STEP_S / SPEEDS["fast"], n),
                )
            finally:
                for s in sidecars.values():
                    await s.aclose()

        runs = dict(zip(("slow", "fast"), asyncio.run(both()), strict=False))

    # 1. Exact: each run equals the in-process replay at its own simulated sample times.
    for name, run in runs.items():
        times = [t for t, _ in run]
        assert times == sorted(times) and times[-1] - times[0] >= SIM_SPAN_S - 2 * SIM_STEP_S, (name, times)
        for (t, got), want in zip(run, _reference(times), strict=False):
            for g in GAUGES:
                assert _same(got[g], want[g]), (
                    f"{name} (speed {SPEEDS[name]:g}) at t={t:.3f}: {g} {got[g]} != {want[g]}"
                )
        rates = [v["kvcache_fill_rate_tokens_per_second"] for _, v in run]
        assert any(r is not None and r > 0 for r in rates), f"{name}: the fill rate was never published: {rates}"

    # 2. Across speeds, at the nearest samples.
    capacity = SimConfig().usable_blocks * SimConfig().block_size
    compared = pairs = 0
    for t, slow in runs["slow"]:
        tf, fast = min(runs["fast"], key=lambda s: abs(s[0] - t))
        if abs(tf - t) > SIM_STEP_S / 2:  # a late fast scrape left a gap: no partner for this one
            continue
        pairs += 1
        assert abs(slow["kvcache_usage_ratio"] - fast["kvcache_usage_ratio"]) <= 0.05, (t, tf, slow, fast)
        assert abs(slow["kvcache_demand_tokens"] - fast["kvcache_demand_tokens"]) <= 0.05 * capacity, (t, slow, fast)
        for g in ("kvcache_fill_rate_tokens_per_second", "kvcache_time_until_full_seconds"):
            a, b = slow[g], fast[g]
            if a is None or b is None or not (a > 0 and b > 0) or math.isinf(a) or math.isinf(b):
                continue
            assert 1 / 2 <= a / b <= 2, f"{g} at t={t:.1f}/{tf:.1f}: speed 1 {a}, speed 20 {b}"
            compared += 1
    assert pairs >= 5 and compared >= 3, f"too few pairs ({pairs}) or forecasts ({compared}) compared: {runs}"
    print(
        f"\nspeed 1 vs 20 ({SCENARIO}, seed {SEED}): {len(runs['slow'])} + {len(runs['fast'])} scrapes, "
        f"{compared} forecast pairs compared; last: "
        f"{ {k: (runs['slow'][-1][1][k], runs['fast'][-1][1][k]) for k in GAUGES} }"
    )
