"""The weekly report works unchanged on every engine: it reads only ``kvcache_*`` series.

Each engine's simulated page (the ramp that fills past the watermark, as in test_every_engine.py) goes
through the real sidecar into its embedded history, then ``kv-sidecar report --history`` reads that file
as a user's CronJob would. Engines whose page gives the pool's fill (vLLM, SGLang, TensorRT-LLM) give the
model's peak usage and capacity, as the simulated pool had them. TGI and current llama.cpp give no usage
(their pages have none): the report says there is no KV-cache series to report on and exits 3, as for any
period without one (docs/report.md, exit codes): never a crash, never a made-up figure.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from engines.test_every_engine import ADAPTERS, MODEL_CONFIG, SCRAPE_S, capacity_for
from sidecar import engines
from sidecar.generations import Generation
from sidecar.history import HistoryStore
from sidecar.replay import Pipeline, replay_config
from sidecar.simulator import Simulator
from sidecar.simulator.engines import EXPOSITIONS

#: Simulated seconds: the ramp past the watermark, on a whole number of history minutes.
START, RUN_S = 1_800_000_000.0, 900.0
#: Engines whose page gives the pool's fill (used tokens or usage), so the report has a peak.
WITH_USAGE = ("vllm", "sglang", "trtllm")


def _history_of(kind: str, path) -> tuple[int, float]:
    """Replay ``kind``'s ramp into a history file at ``path``; (the pool's usable tokens, the true peak usage)."""
    saved = dict(engines.ADAPTERS)
    engines.ADAPTERS[kind] = ADAPTERS[kind]
    store = HistoryStore.open(path, now=START)
    try:
        sim = Simulator(scenario="ramp-10m", seed=1)
        usable = capacity_for(sim)
        config = replay_config(model_config=str(MODEL_CONFIG))
        target = dataclasses.replace(config.targets[0], engine=kind, capacity_tokens=usable)
        pipe = Pipeline(dataclasses.replace(config, targets=(target,)), model_name="", history=store)
        peak, t = 0.0, 0.0
        while t < RUN_S:
            t += SCRAPE_S
            sim.advance_to(t)
            pipe.ingest(START + t, pipe.read(EXPOSITIONS[kind].render(sim, Generation.V1_CAPACITY_LABELS).encode()))
            pipe.sidecar.record_history(pipe.state)
            peak = max(peak, sim.engines[0].pool.used / sim.engines[0].pool.usable)
        return usable, peak
    finally:
        store.close()
        engines.ADAPTERS.clear()
        engines.ADAPTERS.update(saved)


@pytest.mark.parametrize("kind", sorted(EXPOSITIONS))
def test_the_report_reads_every_engines_history(kind: str, tmp_path) -> None:
    usable, true_peak = _history_of(kind, tmp_path / "history.sqlite")
    out = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", "--history", str(tmp_path / "history.sqlite"),
         "--from", str(int(START)), "--to", str(int(START + RUN_S)), "--out", str(out), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if kind not in WITH_USAGE:
        assert run.returncode == 3 and "no KV-cache series" in run.stderr, (run.returncode, run.stderr)
        assert "Traceback" not in run.stderr and not out.exists()
        return
    assert run.returncode == 0, run.stderr
    (page,) = out.glob("*.json")
    report = json.loads(page.read_text())
    (model,) = report["models"]
    text = json.dumps(model)
    assert model["usage"]["peak_ratio"] == pytest.approx(true_peak, abs=0.02), text
    assert model["capacity"]["usable_tokens"] == pytest.approx(usable, rel=0.01), text
