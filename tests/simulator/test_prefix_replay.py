"""Mooncake's ``hash_ids`` replayed: prefix-cache hits come from the trace's own reuse.

Real values: the two sample requests of Mooncake's ``FAST25-release/README.md`` ("share the first 12
hash IDs, so they can share prefix caching for the first 12 * 512 = 6144 tokens"), and the first
minutes of the conversation and synthetic traces (``tests/fixtures/traces/README.md`` gives their
provenance and the seen-before block counts an independent ``jq`` command finds in them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.simulator import SimConfig, Simulator
from sidecar.simulator.engine import RequestSpec
from sidecar.simulator.trace import TracePlay, load_trace, parse_trace, prefix_reuse, shared_prefixes

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
CONVERSATION = TRACES / "mooncake-conversation-5min-hash-ids.jsonl"
SYNTHETIC = TRACES / "mooncake-synthetic-3min-hash-ids.jsonl"
#: The server of the forecast's trace runs (sidecar.forecast_validation.TRACE_SERVER): long prompts fit.
SERVER = SimConfig(max_model_len=131072, max_num_batched_tokens=16384, step_seconds_per_token=2e-6)
#: A pool no 5-minute sample fills: nothing is ever evicted.
UNBOUNDED = SERVER.replace(num_gpu_blocks_override=2_000_000)

README_SAMPLES = (
    '{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
    '"hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}\n'
    '{"timestamp": 30535, "input_length": 6472, "output_length": 26, '
    '"hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}\n'
)


def prefix_counters(sim: Simulator) -> tuple[float, float]:
    """(queries, hits) in tokens, as the simulated vLLM exports them on /metrics."""
    values = {}
    for family in text_string_to_metric_families(sim.render()):
        for s in family.samples:
            if s.name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                values[s.name] = values.get(s.name, 0.0) + s.value
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def replay(trace_text: str, config: SimConfig = UNBOUNDED, *, loop: bool = False, seconds: float = 0.0) -> Simulator:
    play = TracePlay(parse_trace(trace_text, "t"), loop=loop)
    sim = Simulator(config, play.scenario(config), 0, play)
    sim.advance_to(seconds or play.duration_s + 120)
    return sim


def plain(*requests: tuple[float, int, list[int]]) -> str:
    """A plain JSONL trace: (arrival s, prompt tokens, hash ids) per request, 8 output tokens each."""
    return "".join(
        f'{{"arrival_s": {t}, "prompt_tokens": {p}, "output_tokens": 8, "hash_ids": {h}}}\n' for t, p, h in requests
    )


def test_the_readme_samples_share_6144_tokens():
    trace = parse_trace(README_SAMPLES, "t")
    assert trace.has_hash_ids
    reuse = prefix_reuse(trace.requests)
    assert (reuse.seen_blocks, reuse.seen_tokens) == (12, 6144)
    sim = replay(README_SAMPLES)
    # 12 trace blocks x 32 engine blocks of 16 tokens: the second request computes only its last 328 tokens
    assert prefix_counters(sim) == (6955 + 6472, 6144)


def test_each_trace_block_is_512_over_block_size_engine_blocks():
    spec = RequestSpec(0.0, 1000, 1, 1, block_hashes=(7, 8), hash_block_tokens=512)
    keys = spec.block_keys(16)
    assert len(keys) == 1000 // 16 == 62  # full blocks only: the last 8 tokens are never cached
    assert keys[0] == (0, 7, 0) and keys[31] == (0, 7, 31) and keys[32] == (0, 8, 32)
    # A block size that does not divide 512: block 10 holds tokens 480-527, keyed by the second hash.
    keys48 = spec.block_keys(48)
    assert len(keys48) == 20 and keys48[9][1] == 7 and keys48[10][1] == 8
    # The next lap of a looped trace is other content.
    lap1 = RequestSpec(0.0, 1000, 1, 1, block_hashes=(7, 8), hash_block_tokens=512, hash_lap=1)
    assert not set(lap1.block_keys(16)) & set(keys)
    # A scenario's prefix group keeps its keys.
    assert RequestSpec(0.0, 100, 1, 1, prefix_group=2, prefix_tokens=40).block_keys(16) == [(2, 0), (2, 1)]


def test_a_hit_is_the_longest_run_of_leading_cached_blocks_and_leaves_one_token():
    trace = plain(
        (0, 1536, [1, 2, 3]),
        (20, 1536, [9, 2, 3]),  # its first block is new: no hit, though blocks 2 and 3 are cached
        (40, 1536, [1, 2, 4]),  # two leading blocks: 1024 tokens
        (60, 1536, [1, 2, 3]),  # the same prompt again: all but the last engine block, 1520 tokens
    )
    assert prefix_reuse(parse_trace(trace, "t").requests).seen_tokens == 0 + 0 + 1024 + 1536
    assert prefix_counters(replay(trace)) == (4 * 1536, 1024 + 1520)


def test_shared_prefixes_keep_only_blocks_another_request_holds():
    trace = parse_trace(plain((0, 1536, [1, 2, 3]), (5, 1536, [1, 2, 4]), (9, 600, [5, 6])), "t")
    assert shared_prefixes(trace.requests) == [(1, 2), (1, 2), ()]


def test_each_lap_of_a_looped_trace_is_new_content():
    trace = plain((0, 1024, [1, 2]), (10, 1500, [1, 2, 5]))
    # laps start 20 s apart: each lap's second request hits its first one's 1024 tokens, never the lap before
    sim = replay(trace, loop=True, seconds=35.0)
    assert sim.workload.sent == 4
    assert prefix_counters(sim) == (2 * (1024 + 1500), 2 * 1024)


@pytest.mark.parametrize(
    ("path", "blocks", "seen"),
    [(CONVERSATION, 24752, 5034), (SYNTHETIC, 15567, 1694)],  # the jq counts of tests/fixtures/traces/README.md
)
def test_on_an_unbounded_pool_the_hits_are_what_the_trace_implies(path, blocks, seen):
    trace = load_trace(str(path))
    reuse = prefix_reuse(trace.requests)
    assert (reuse.blocks, reuse.seen_blocks) == (blocks, seen)
    play = TracePlay(trace)
    sim = Simulator(UNBOUNDED, play.scenario(UNBOUNDED), 0, play)
    sim.advance_to(play.duration_s + 600)
    assert sim.preemptions == 0 and sim.waiting == 0 and sim.running == 0
    queries, hits = prefix_counters(sim)
    truncated = sum(r.prompt_tokens - min(r.prompt_tokens, SERVER.max_model_len - 1) for r in trace.requests)
    assert queries == reuse.prompt_tokens - truncated
    # A hit ends where the trace's reuse ends (a 512-token boundary) or one token before the prompt's end.
    assert 0.99 * reuse.seen_tokens <= hits <= reuse.seen_tokens
    assert hits / queries == pytest.approx(reuse.token_ratio, abs=0.001)


def test_a_bounded_pool_evicts_and_hits_less_without_leaking_a_block():
    trace = load_trace(str(CONVERSATION))
    play = TracePlay(trace)
    # usable blocks: the sample's peak (76,924 blocks with sharing, 5 s samples) / 1.05: it preempts at its peaks
    tight = SERVER.replace(num_gpu_blocks_override=73_261 + 1)
    sim = Simulator(tight, play.scenario(tight), 0, play)
    problems, steps = [], []

    def check(e) -> None:  # every 10th step: the sums walk the whole pool
        steps.append(e.now)
        if len(steps) % 10 == 0 and (
            e.pool.used != e.held_blocks_by_requests() or e.pool.free != sum(x.n for x in e.pool.queue)
        ):
            problems.append(e.now)

    sim.engines[0].step_hook = check
    sim.advance_to(play.duration_s + 600)
    assert problems == [] and len(steps) > 1000 and sim.preemptions > 0
    _, hits = prefix_counters(sim)
    assert 0 < hits < 0.9 * prefix_reuse(trace.requests).seen_tokens  # evicted before they were asked for again


def test_a_trace_without_hash_ids_replays_as_before():
    old = load_trace(str(TRACES / "mooncake-conversation-5min.jsonl"))  # the same requests, hash_ids dropped
    new = load_trace(str(CONVERSATION)).without_hash_ids()
    assert not new.has_hash_ids and new.requests == old.requests
    config = SERVER.replace(num_gpu_blocks_override=60_000)  # preempts
    runs = []
    for trace in (old, new):
        play = TracePlay(trace)
        sim = Simulator(config, play.scenario(config), 0, play)
        sim.advance_to(120.0)
        runs.append(sim.render())
    assert runs[0] == runs[1]
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="simulated/llama-3-8b"} 0.0' in runs[0]


def test_a_window_of_the_trace_keeps_its_hash_ids():
    trace = load_trace(str(CONVERSATION))
    first = next(r for r in trace.requests if r.arrival_s >= 60.0)
    window = trace.window(60.0, 120.0)
    assert window.requests[0].arrival_s == first.arrival_s - 60.0
    assert window.requests[0].hash_ids == first.hash_ids and len(first.hash_ids) > 1
