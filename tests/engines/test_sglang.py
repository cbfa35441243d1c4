"""SGLang: its documentation's real page and the simulator's SGLang page through the adapter and the pipeline.

The figures asserted on the real page are the ones read off it by hand (docs/engines/sglang.md, "Checked
on real pages"). The traps guarded here: the rounded ``token_usage`` never becomes the usage or a
capacity, the per-interval retraction gauge never becomes a counter, a priority breakdown is not added
to its total, and TP copies of one DP rank are one pool.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fixtures import METRICS
from prometheus_client.parser import text_string_to_metric_families

from sidecar import engines
from sidecar import page_parser as parse
from sidecar.engines import sglang, vllm
from sidecar.observation import EngineScrape
from sidecar.replay import Pipeline
from sidecar.simulator import Simulator
from sidecar.simulator.config import SimConfig
from sidecar.simulator.engines import sglang as sglang_page

DOC_PAGE = METRICS / "sglang_production_metrics_doc_example.txt"
DOC_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MODEL = SimConfig().model_name

SCHED = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'


def scrape(text: str, **kwargs: int) -> EngineScrape:
    result = sglang.normalise(parse.FilteredParser(sglang.NEEDED).samples(text), **kwargs)
    assert result is not None
    return result


def page(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def simulated(scenario: str, seconds: float, **config: int) -> Simulator:
    sim = Simulator(SimConfig().replace(**config) if config else None, scenario=scenario, seed=1)
    sim.advance(seconds)
    return sim


# -- the real page: SGLang's own documentation example (2024, no capacity family) -----------------


def test_doc_page_without_capacity_is_read_and_says_why_capacity_is_missing(
    pipeline_for: Callable[..., Pipeline],
) -> None:
    pipe = pipeline_for(sglang, DOC_MODEL)  # no targets[].capacity_tokens
    result = pipe.read(DOC_PAGE.read_bytes())
    (obs,) = result.observations
    assert obs.pool is None and (obs.used_tokens, obs.requests_running, obs.requests_waiting) == (123_859, 162, 2826)
    assert result.dropped == {"no_capacity": 1}
    reason = result.absent["kvcache_capacity_tokens"]
    assert "targets[].capacity_tokens" in reason and "max_total_num_tokens" in reason
    pipe.ingest(5.0, result)
    assert pipe.page()[("kvcache_sidecar_target_up", (("target", "replay"),))] == 1  # a missing setting is no outage
    assert pipe.gauge("kvcache_requests_running") == 162
    assert pipe.gauge("kvcache_requests_waiting", reason="all") == 2826
    assert pipe.gauge("kvcache_capacity_tokens") is None and pipe.gauge("kvcache_usage_ratio") is None
    dropped = pipe.page()[("kvcache_sidecar_series_dropped_total", (("reason", "no_capacity"), ("target", "replay")))]
    assert dropped == 1


def test_doc_page_gives_the_figures_read_by_hand() -> None:
    # The operator's capacity for this server; the page's own rounded token_usage (0.28) must agree with it.
    capacity = 442_368
    result = scrape(DOC_PAGE.read_text(), capacity_tokens=capacity)
    assert (result.engine_kind, result.generation, result.dropped) == ("sglang", "usage-only", {})
    (obs,) = result.observations
    assert (obs.model_name, obs.engine) == (DOC_MODEL, "0")
    assert obs.used_tokens == 123_859  # sglang:num_used_tokens, never token_usage x capacity
    assert abs(obs.used_tokens / capacity - 0.28) <= 0.005  # token_usage is round(used / capacity, 2)
    assert (obs.requests_running, obs.requests_waiting) == (162, 2826)
    assert (obs.prompt_tokens, obs.generation_tokens) == (8_128_902, 7_557_572)
    assert obs.usage_ratio is None and obs.evictable_tokens is None
    # No counter for retractions or cached tokens on this page: absent with the reason, never 0.
    assert obs.preemptions is None and obs.prefix_cache_hits_tokens is None
    assert {"kvcache_preemptions_total", "kvcache_prefix_cache_hit_ratio"} <= set(result.absent)
    assert obs.pool is not None
    assert (obs.pool.capacity_tokens, obs.pool.block_size, obs.pool.num_blocks) == (capacity, 1, capacity)
    assert obs.pool.memory_lever == "mem_fraction_static" and obs.pool.memory_fraction is None


def test_doc_page_through_the_sidecar(pipeline_for: Callable[..., Pipeline]) -> None:
    capacity = 442_368
    pipe = pipeline_for(sglang, DOC_MODEL, capacity_tokens=capacity)  # targets[].capacity_tokens
    pipe.ingest(5.0, pipe.read(DOC_PAGE.read_bytes()))
    assert pipe.gauge("kvcache_used_tokens") == 123_859
    assert pipe.gauge("kvcache_capacity_tokens") == capacity
    assert pipe.gauge("kvcache_free_tokens") == capacity - 123_859
    assert pipe.gauge("kvcache_usage_ratio") == pytest.approx(123_859 / capacity)
    assert pipe.gauge("kvcache_requests_running") == 162
    assert pipe.gauge("kvcache_requests_waiting", reason="all") == 2826
    assert pipe.gauge("kvcache_preemptions_total") is None


def test_the_vllm_adapter_does_not_read_an_sglang_page() -> None:
    assert vllm.normalise(parse.samples(DOC_PAGE.read_text())) is None


# -- the simulator's SGLang page: the same families and label roles as SGLang's ----------------------


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """family -> (type, label names) as prometheus_client's parser reads the page."""
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, {k for s in fam.samples for k in s.labels})
    return out


def test_simulator_page_has_the_real_pages_families_types_and_label_roles() -> None:
    sim = simulated("steady", 300.0)
    ours = families(sglang_page.render(sim))
    real = families(DOC_PAGE.read_text())
    read_by_adapter = {name.removesuffix("_total") for name in sglang.NEEDED}
    for name, (typ, labels) in real.items():
        if name not in read_by_adapter:
            continue
        assert name in ours, f"{name} is on SGLang's page, not on the simulator's"
        assert ours[name][0] == typ, name
        assert {sglang.LABEL_ROLES[k] for k in labels} <= {sglang.LABEL_ROLES[k] for k in ours[name][1]}, name
    # Every label the simulator writes has a role the adapter knows (joins on model_name only).
    assert {k for _, labels in ours.values() for k in labels} <= set(sglang.LABEL_ROLES)
    # Every family of SGLang 0.5.23 the adapter reads is on the simulated page (multiprocess: no _created).
    assert {name.removesuffix("_total") for name in sglang.FAMILIES} - {"sglang:cached_tokens"} <= set(ours)
    assert not any(name.endswith("_created") for name in ours)


def test_simulator_page_through_the_sidecar_gives_the_engine_state(pipeline_for: Callable[..., Pipeline]) -> None:
    sim = simulated("steady-0.92", 900.0)
    e = sim.engines[0]
    bs = sim.config.block_size
    pipe = pipeline_for(sglang, MODEL)
    result = pipe.read(sglang_page.render(sim).encode())
    assert (result.engine_kind, result.generation) == ("sglang", sglang.GEN_KV_TOKENS)
    pipe.ingest(sim.now, result)
    capacity = e.pool.usable * bs
    assert pipe.gauge("kvcache_capacity_tokens") == capacity
    assert pipe.gauge("kvcache_used_tokens") == e.pool.used * bs
    # Free = available + evictable (the radix cache's cached prefixes are free to SGLang).
    assert pipe.gauge("kvcache_free_tokens") == capacity - e.pool.used * bs
    assert pipe.gauge("kvcache_requests_running") == e.num_running
    assert pipe.gauge("kvcache_requests_waiting", reason="all") == len(e.waiting)
    assert e.c.preemptions > 0, "the scenario is meant to preempt"
    assert pipe.gauge("kvcache_preemptions_total") == e.c.preemptions


def test_evictable_prefix_blocks_count_as_free() -> None:
    sim = simulated("shared-prefix", 5.0)
    e = sim.engines[0]
    bs = sim.config.block_size
    assert sglang_page.evictable_blocks(e) > 0, "the shared prefixes are meant to stay cached"
    text = sglang_page.render(sim)
    on_page = {name: value for name, _, value in parse.samples(text)}
    (obs,) = scrape(text).observations
    assert obs.used_tokens == e.pool.used * bs
    assert obs.evictable_tokens is None  # already left out of SGLang's used count
    assert obs.pool is not None and obs.pool.capacity_tokens is not None
    free = obs.pool.capacity_tokens - obs.used_tokens
    assert free == on_page["sglang:kv_available_tokens"] + on_page["sglang:kv_evictable_tokens"]
    assert on_page["sglang:kv_evictable_tokens"] == sglang_page.evictable_blocks(e) * bs
    assert obs.prefix_cache_hits_tokens == e.c.prefix_hits > 0


def test_data_parallel_ranks_are_engines_and_the_tokenizer_counts_sit_on_the_first() -> None:
    sim = simulated("steady", 300.0, engines=2)
    result = scrape(sglang_page.render(sim))
    first, second = result.observations
    assert (first.engine, second.engine) == ("0", "1")
    assert (first.requests_running, second.requests_running) == tuple(e.num_running for e in sim.engines)
    assert first.prompt_tokens == sum(e.c.prompt_tokens for e in sim.engines)
    assert second.prompt_tokens is None and second.prefix_cache_hits_tokens is None


# -- pages written here: each trap and each bad input -------------------------------------------------


def test_tp_copies_of_one_rank_are_one_pool_and_priority_breakdowns_are_not_added() -> None:
    result = scrape(
        page(
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="0"}} 100000.0',
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="1"}} 99968.0',
            f'sglang:num_used_tokens{{{SCHED},tp_rank="0"}} 4000.0',
            f'sglang:num_used_tokens{{{SCHED},tp_rank="1"}} 4000.0',
            f'sglang:num_queue_reqs{{{SCHED},priority="",tp_rank="0"}} 7.0',
            f'sglang:num_queue_reqs{{{SCHED},priority="1",tp_rank="0"}} 5.0',
            f'sglang:num_queue_reqs{{{SCHED},priority="2",tp_rank="0"}} 2.0',
            f'sglang:token_usage{{{SCHED},tp_rank="0"}} 0.04',
        )
    )
    (obs,) = result.observations
    assert obs.pool is not None and obs.pool.capacity_tokens == 99_968  # the smaller stage bounds the rank
    assert (obs.used_tokens, obs.requests_waiting) == (4000, 7)
    assert result.generation == sglang.GEN_MAX_TOTAL


def test_cache_config_info_labels_give_the_pool_shape() -> None:
    result = scrape(
        page(
            f'sglang:cache_config_info{{{SCHED},num_pages="2048",page_size="64",tp_rank="0"}} 1.0',
            f'sglang:num_used_tokens{{{SCHED},tp_rank="0"}} 640.0',
        )
    )
    (obs,) = result.observations
    assert result.generation == sglang.GEN_CACHE_CONFIG
    assert obs.pool is not None
    assert (obs.pool.capacity_tokens, obs.pool.block_size, obs.pool.num_blocks) == (131_072, 64, 2048)


def test_the_retraction_gauge_is_never_a_counter() -> None:
    result = scrape(
        page(
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="0"}} 1000.0',
            f'sglang:num_retracted_reqs{{{SCHED},tp_rank="0",pid="12"}} 3.0',
        )
    )
    (obs,) = result.observations
    assert obs.preemptions is None
    assert "kvcache_preemptions_total" in result.absent


@pytest.mark.parametrize("bad", ["NaN", "-5.0", "+Inf"])
def test_a_used_count_that_cannot_be_one_is_dropped_and_counted(bad: str) -> None:
    result = scrape(
        page(
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="0"}} 1000.0',
            f'sglang:num_used_tokens{{{SCHED},tp_rank="0"}} {bad}',
        )
    )
    (obs,) = result.observations
    assert obs.used_tokens is None
    assert result.dropped == {"invalid_value": 1}


def test_a_capacity_of_zero_is_dropped_and_the_rank_has_no_pool() -> None:
    result = scrape(
        page(
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="0"}} 0.0',
            f'sglang:num_used_tokens{{{SCHED},tp_rank="0"}} 0.0',
        )
    )
    (obs,) = result.observations
    assert obs.pool is None and obs.used_tokens == 0
    assert result.dropped == {"invalid_value": 1, "no_capacity": 1}


def test_a_page_without_sglang_families_is_none() -> None:
    assert sglang.normalise(parse.samples(page('vllm:num_requests_running{engine="0",model_name="m"} 1.0'))) is None


def test_a_page_mixing_engines_is_detected_as_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """Detection finds both engines on such a page; the pipeline refuses it as ``mixed_engines``."""
    monkeypatch.setitem(engines.ADAPTERS, sglang.KIND, sglang)
    mixed = page(
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        f'sglang:num_running_reqs{{{SCHED},tp_rank="0"}} 1.0',
    )
    found = engines.detect({name for name, _, _ in parse.samples(mixed)})
    assert [m.KIND for m in found] == ["vllm", "sglang"]


def test_an_sglang_page_is_detected_as_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines.ADAPTERS, sglang.KIND, sglang)
    names = {name for name, _, _ in parse.samples(sglang_page.render(simulated("steady", 60.0)))}
    assert engines.detect(names) == [sglang]
    assert engines.detect({name for name, _, _ in parse.samples(DOC_PAGE.read_text())}) == [sglang]


def test_a_family_with_the_same_series_twice_is_dropped_whole() -> None:
    result = scrape(
        page(
            f'sglang:max_total_num_tokens{{{SCHED},tp_rank="0"}} 1000.0',
            'sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 10.0',
            'sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 10.0',
        )
    )
    (obs,) = result.observations
    assert obs.prompt_tokens is None  # never 20: the page contradicts itself
    assert result.dropped == {"duplicate_series": 2}


@pytest.mark.parametrize("name", ["doc", "dynamo-worker", "simulated"])
def test_the_pre_filter_changes_nothing_the_adapter_reads(name: str) -> None:
    text = {
        "doc": DOC_PAGE.read_text(),
        "dynamo-worker": (METRICS / "dynamo" / "sglang_dynamo_worker_composite.txt").read_text(),
        "simulated": sglang_page.render(simulated("shared-prefix", 60.0, engines=2)),
    }[name]
    filtered = sglang.normalise(parse.FilteredParser(sglang.NEEDED).samples(text), capacity_tokens=1000)
    assert filtered == sglang.normalise(parse.samples(text), capacity_tokens=1000)
