"""Every engine the simulator speaks, through the real Sidecar: the gauges light, and the shipped alert
rules and dashboards ask only for what that engine exports or is documented not to have.

For each engine with a renderer (``sidecar.simulator.engines.EXPOSITIONS``) a ramp is replayed through
the engine's adapter, the read pipeline, the derivations, the forecast and the exporter, one scrape
every 5 simulated seconds. Then:

* the gauges every engine can have (the engine's state: running, waiting, capacity, usage, ...)
  are published, unless the adapter names them in ``EngineScrape.absent`` with a reason;
* every plain ``kvcache_*`` series that ``alerts/kvcache.rules.yaml`` or ``dashboards/*.json`` query
  (recording-rule outputs, with a ``:`` in their name, are not series of the sidecar) was published
  during the run, or is one the adapter documents as absent, or depends on state a ramp never reaches
  (:data:`NOT_IN_A_RAMP`, with the reason).

The alert rules and dashboards are only read here.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
from functools import cache
from types import ModuleType

import httpx
import pytest
from fixtures import MODEL_CONFIGS, REPO

from sidecar import engines
from sidecar import page_parser as parse
from sidecar.engines import llamacpp, sglang, tgi, trtllm, vllm
from sidecar.generations import Generation
from sidecar.replay import Pipeline, replay_config
from sidecar.simulator import Simulator
from sidecar.simulator.engines import EXPOSITIONS, Exposition
from sidecar.simulator.server import SimServer

#: Each engine's adapter (the lead registers them in sidecar.engines.ADAPTERS; the test does it itself).
ADAPTERS: dict[str, ModuleType] = {m.KIND: m for m in (vllm, sglang, trtllm, tgi, llamacpp)}
#: The simulated server's model: 32 layers x 8 KV heads x 128 x K,V x bf16 = 131072 bytes per token.
MODEL_CONFIG = MODEL_CONFIGS / "Llama-3.1-8B.json"
#: One scrape every SCRAPE_S simulated seconds, over the ramp's first RUN_S (it fills past the watermark).
SCRAPE_S, RUN_S = 5.0, 720.0
#: Gauges that every engine's state gives (running and waiting requests, and the pool's fill).
ENGINE_STATE = (
    "kvcache_requests_running",
    "kvcache_requests_waiting",
    "kvcache_capacity_tokens",
    "kvcache_used_tokens",
    "kvcache_free_tokens",
    "kvcache_usage_ratio",
    "kvcache_watermark_headroom_tokens",
    "kvcache_server_info",
)
#: Series the dashboards or rules query that only some states publish, whichever the engine.
NOT_IN_A_RAMP = {
    "kvcache_engine_asleep": "vLLM publishes it while its engine_sleep_state is exported; a ramp never sleeps",
    "kvcache_suggested_replicas": "only when the largest pool the memory setting allows cannot hold the peak",
    "kvcache_capacity_efficiency_ratio": "needs the engine's KV budget (model.gpu_memory or the pool's bytes)",
    "kvcache_theoretical_capacity_tokens": "needs the engine's KV budget (model.gpu_memory or the pool's bytes)",
    "kvcache_gpu_memory_bytes": "needs model.gpu_memory, or a vLLM pool sized by gpu_memory_utilization and a "
    "model.config to infer it from (tests/test_forecast_gauges.py)",
    "kvcache_sidecar_config_changes_total": "published from the first change of the engine's settings",
    "kvcache_offload_usage_ratio": "the simulator has no offload tier (tests/test_vllm_new_signals.py reads one)",
    "kvcache_admission_rejections_total": "the simulated vLLM refuses nothing at admission (the real 0.32 capture "
    "carries the counter: tests/test_vllm_new_signals.py)",
    "kvcache_preemptions_by_reason_total": "no released vLLM exports vllm:num_preemptions_by_reason (PR #58037); "
    "tests/test_vllm_new_signals.py reads it from a page built as the PR describes",
}
#: ``kv-sidecar simulate`` as a process, without the rest of the CLI's start-up.
CLI = (
    "import argparse,sys; from sidecar.simulator.cli import add_parser; "
    "p=argparse.ArgumentParser(prog='kv-sidecar'); s=p.add_subparsers(); add_parser(s); "
    "a=p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
)
#: A plain metric name in PromQL: not part of a longer name, not a recording rule's (which holds ':').
PLAIN_NAME = re.compile(r"(?<![\w:])(kvcache_\w+)(?![\w:])")


def queried_series() -> set[str]:
    """The plain ``kvcache_*`` names the shipped alert rules and dashboards query."""
    texts = [(REPO / "alerts" / "kvcache.rules.yaml").read_text()]
    texts += [p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))]
    return {name for text in texts for name in PLAIN_NAME.findall(text)}


def capacity_for(sim: Simulator) -> int:
    """What an operator sets as targets[].capacity_tokens for an engine whose page has none (TGI,
    llama.cpp): the simulated pool's usable tokens."""
    return sim.engines[0].pool.usable * sim.config.block_size


@dataclasses.dataclass
class Run:
    published: set[str]
    absent: dict[str, str]


@cache
def replay(kind: str) -> Run:
    """The ramp through the real Sidecar with ``kind``'s page and adapter; what it published."""
    exposition: Exposition = EXPOSITIONS[kind]
    adapter = ADAPTERS[kind]
    saved = dict(engines.ADAPTERS)
    engines.ADAPTERS[kind] = adapter
    try:
        sim = Simulator(scenario="ramp-10m", seed=1)
        config = replay_config(model_config=str(MODEL_CONFIG))
        target = dataclasses.replace(config.targets[0], engine=kind, capacity_tokens=capacity_for(sim))
        pipe = Pipeline(dataclasses.replace(config, targets=(target,)), model_name="")
        run = Run(set(), {})
        t = 0.0
        while t < RUN_S:
            t += SCRAPE_S
            sim.advance_to(t)
            result = pipe.read(exposition.render(sim, Generation.V1_CAPACITY_LABELS).encode())
            run.absent.update(result.absent)
            pipe.ingest(t, result)
            run.published |= {name for name, _ in pipe.page()}
        return run
    finally:
        engines.ADAPTERS.clear()
        engines.ADAPTERS.update(saved)


ENGINES = sorted(EXPOSITIONS)


def test_every_engine_with_a_renderer_has_an_adapter() -> None:
    assert set(EXPOSITIONS) <= set(ADAPTERS)
    assert {"vllm", "sglang"} <= set(EXPOSITIONS)


@pytest.mark.parametrize("kind", ENGINES)
def test_the_engine_state_gauges_light_or_say_why_not(kind: str) -> None:
    run = replay(kind)
    for name in ENGINE_STATE:
        assert name in run.published or name in run.absent, f"{kind}: {name} neither published nor absent"


@pytest.mark.parametrize("kind", ENGINES)
def test_absent_gauges_are_never_published(kind: str) -> None:
    run = replay(kind)
    assert all(reason for reason in run.absent.values()), "every absent gauge says why"
    assert not (set(run.absent) & run.published), f"{kind} publishes gauges it calls absent"


@pytest.mark.parametrize("kind", ENGINES)
def test_rules_and_dashboards_query_only_what_the_engine_exports_or_documents_absent(kind: str) -> None:
    run = replay(kind)
    missing = {
        name
        for name in queried_series()
        if name not in run.published and name not in run.absent and name not in NOT_IN_A_RAMP
    }
    assert not missing, f"{kind}: the rules or dashboards query {sorted(missing)}, neither exported nor absent"


def test_the_query_extraction_reads_plain_names_only() -> None:
    names = queried_series()
    assert {"kvcache_usage_ratio", "kvcache_time_until_full_seconds", "kvcache_sidecar_target_up"} <= names
    assert not any(":" in n for n in names)
    # only a part of the recording rule namespace_model:kvcache_usable_tokens:sum
    assert "kvcache_usable_tokens" not in names


# -- the HTTP edge: each engine's path, Content-Type and body -------------------------------------


@pytest.mark.parametrize("kind", ENGINES)
def test_the_simulator_serves_each_engine_on_its_own_path(kind: str) -> None:
    exposition = EXPOSITIONS[kind]
    server = SimServer(Simulator(scenario="steady", seed=1), port=0, speed=60.0, engine=kind).start()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            metrics = client.get(exposition.path)
            other = client.get("/prometheus/metrics" if exposition.path == "/metrics" else "/metrics")
            health = client.get("/health")
        assert server.metrics_url == server.url + exposition.path
        assert metrics.status_code == 200 and metrics.headers["content-type"] == exposition.content_type
        assert other.status_code == 404 and health.status_code == 200
        names = {name for name, _, _ in parse.samples(metrics.text)}
        assert names & ADAPTERS[kind].SIGNATURE, f"{kind}'s page lacks its signature families"
    finally:
        server.stop()


def test_simulate_engine_sglang_serves_sglangs_page() -> None:
    """``kv-sidecar simulate --engine sglang``, as a process: its start-up line and its page."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "simulate", "--port", "0", "--engine", "sglang", "--speed", "20", "--engines", "2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("simulated SGLang (steady,") and "sglang metrics" in line, line
        url = line.split("serving ", 1)[1].strip()
        result = sglang.normalise(parse.samples(httpx.get(url, timeout=5).text))
        assert result is not None and [o.engine for o in result.observations] == ["0", "1"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_simulate_refuses_an_unknown_engine() -> None:
    r = subprocess.run(
        [sys.executable, "-c", CLI, "simulate", "--engine", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "--engine" in r.stderr and "sglang" in r.stderr
