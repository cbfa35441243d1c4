"""TensorRT-LLM (trtllm-serve and the Triton backend): real pages -> the figures a person reads off them.

The pages are ``tests/fixtures/metrics/trtllm/`` (provenance in its README). Each figure below is
computed by hand from the page, in the comment beside it, and asserted through the real read pipeline
(:class:`sidecar.replay.Pipeline`: ``read_page`` -> ``Sidecar.record`` -> the ``kvcache_*`` registry).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
from fixtures import METRICS
from prometheus_client.parser import text_string_to_metric_families

from sidecar import engines
from sidecar.capacity import trtllm_fraction as tf
from sidecar.engines import trtllm
from sidecar.reasons import ScrapeFailed
from sidecar.replay import Pipeline, replay_config
from sidecar.simulator import Simulator
from sidecar.simulator.config import SimConfig
from sidecar.simulator.engines import trtllm as sim_trtllm

PAGES = METRICS / "trtllm"
SERVE_2026 = PAGES / "trtllm_serve_2026_from_issue3376_stats.txt"
TRITON_2025 = PAGES / "triton_backend_readme_2025.txt"
TRITON_2023 = PAGES / "triton_backend_readme_2023.txt"
NO_ITER_STATS = PAGES / "dynamo_trtllm_1.1.0rc5_doc_no_iteration_stats.txt"
JSON_METRICS = PAGES / "trtllm_serve_iteration_stats_issue3376.json"


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter in ADAPTERS for this test only (sidecar/engines/__init__.py is H-core-data's)."""
    monkeypatch.setitem(engines.ADAPTERS, trtllm.KIND, trtllm)


def pipeline(model_name: str) -> Pipeline:
    """A replay pipeline whose one target reads TRT-LLM (settings validate against the shipped adapters,
    so the target is built as vLLM's and switched)."""
    config = replay_config()
    target = dataclasses.replace(config.targets[0], engine=trtllm.KIND)
    return Pipeline(dataclasses.replace(config, targets=(target,)), model_name)


def through_pipeline(model_name: str, body: bytes, engine: str = "0") -> Pipeline:
    p = pipeline(model_name)
    p.labels["engine"] = engine
    p.ingest(100.0, p.read(body))
    return p


# --- trtllm-serve, 2026 families -----------------------------------------------------------------


@pytest.mark.usefixtures("registered")
def test_serve_page_gives_the_hand_computed_figures() -> None:
    p = through_pipeline("nemotron-nano-3", SERVE_2026.read_bytes())
    # 7240 max blocks x 64 tokens per block
    assert p.gauge("kvcache_capacity_tokens") == 463_360
    # 5495 used blocks x 64
    assert p.gauge("kvcache_used_tokens") == 351_680
    # 463,360 - 351,680 (= 1745 free blocks x 64: the page agrees with itself)
    assert p.gauge("kvcache_free_tokens") == 111_680
    # 351,680 / 463,360 = 5495 / 7240
    assert p.gauge("kvcache_usage_ratio") == pytest.approx(0.7589779005524862, abs=1e-12)
    # numActiveRequests 1, numQueuedRequests 7
    assert p.gauge("kvcache_requests_running") == 1
    assert p.gauge("kvcache_requests_waiting", reason="all") == 7
    # no preemption counter, no prefix counters on this page
    assert p.gauge("kvcache_preemptions_total") is None
    info = {k: v for (name, labels), v in p.page().items() if name == "kvcache_server_info" for k, v in labels}
    assert info["engine_kind"] == "trtllm"
    assert info["metrics_generation"] == "serve-blocks"
    assert (info["block_size"], info["num_gpu_blocks"]) == ("64", "7240")


def test_serve_page_observation() -> None:
    scrape = trtllm.normalise(samples(SERVE_2026.read_text()))
    assert scrape is not None
    (obs,) = scrape.observations
    assert obs.key == ("nemotron-nano-3", "0")
    assert obs.pool is not None
    assert (obs.pool.num_blocks, obs.pool.block_size, obs.pool.null_blocks) == (7240, 64, 0)
    assert obs.pool.capacity_tokens == 463_360
    assert obs.pool.memory_lever == "free_gpu_memory_fraction"
    assert obs.used_tokens == 351_680
    assert obs.usage_ratio is None  # used tokens are given: the usage is derived from them
    assert scrape.dropped == {}  # trtllm_kv_cache_utilization 0.75898 = 5495/7240: no contradiction
    assert "kvcache_preemptions_total" in scrape.absent


# --- the Triton backend ------------------------------------------------------------------------------


@pytest.mark.usefixtures("registered")
def test_triton_readme_page_gives_the_hand_computed_figures() -> None:
    p = through_pipeline("tensorrt_llm", TRITON_2025.read_bytes(), engine="1")  # Triton's version -> engine
    # 6239 max blocks x 64 tokens per block
    assert p.gauge("kvcache_capacity_tokens") == 399_296
    # 1 used block x 64
    assert p.gauge("kvcache_used_tokens") == 64
    assert p.gauge("kvcache_free_tokens") == 399_232
    # 64 / 399,296: NOT the page's fraction 0.4875, which contradicts its own used/max
    assert p.gauge("kvcache_usage_ratio") == pytest.approx(1 / 6239)
    # request_type="scheduled" 1, "waiting" 1
    assert p.gauge("kvcache_requests_running") == 1
    assert p.gauge("kvcache_requests_waiting", reason="all") == 1


def test_triton_fraction_that_contradicts_used_blocks_is_dropped_and_counted() -> None:
    scrape = trtllm.normalise(samples(TRITON_2025.read_text()))
    assert scrape is not None
    assert scrape.generation == "triton-fraction"
    assert scrape.dropped == {"invalid_value": 1}
    ((reason, field), example), *_ = scrape.rejected.items()
    assert (reason, field) == ("invalid_value", "usage")
    assert "0.4875" in example and "1/6239" in example
    assert "kvcache_prefix_cache_hit_ratio" in scrape.absent  # Triton has no lookup count


def test_triton_2023_page_has_no_waiting_figure() -> None:
    scrape = trtllm.normalise(samples(TRITON_2023.read_text()))
    assert scrape is not None
    assert scrape.generation == "triton"
    (obs,) = scrape.observations
    assert obs.pool is not None and obs.pool.capacity_tokens == 399_296
    assert obs.requests_running == 1
    # The 2023 backend exports no "waiting"; active (0) - scheduled (1) would be -1: not computed.
    assert obs.requests_waiting is None


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("registered")
def test_page_without_iteration_stats_is_a_counted_failure_that_says_why() -> None:
    p = pipeline("Qwen/Qwen3-0.6B")
    with pytest.raises(ScrapeFailed) as failed:
        p.read(NO_ITER_STATS.read_bytes())
    assert failed.value.reason == "no_capacity"
    assert "enable_iter_perf_stats" in failed.value.detail
    assert "serve-request" in failed.value.detail


def test_unprefixed_1_0_page_is_recognised_only_with_engine_type() -> None:
    # TRT-LLM 1.0-1.1 wrote the same five families without the prefix Dynamo adds to the page above.
    unprefixed = NO_ITER_STATS.read_text().replace("trtllm_", "")
    with pytest.raises(ScrapeFailed, match="serve-unprefixed"):
        trtllm.normalise(samples(unprefixed))
    # The names alone are generic: without collector.py's engine_type label the page is not TRT-LLM's.
    anonymous = unprefixed.replace(',engine_type="trtllm"', "")
    assert trtllm.normalise(samples(anonymous)) is None


@pytest.mark.usefixtures("registered")
def test_plain_metrics_json_is_refused() -> None:
    """trtllm-serve's plain /metrics is a JSON array of iteration stats (TensorRT-LLM issue #3376's record)."""
    with pytest.raises(ScrapeFailed) as failed:
        pipeline("m").read(JSON_METRICS.read_bytes())
    # The pre-filter keeps no line of it (no TRT-LLM sample name), so no family is found.
    assert failed.value.reason == "no_engine_metrics"


def test_other_engines_page_is_not_trtllm() -> None:
    vllm_page = (METRICS / "vllm_v1_head40_engine_label.txt").read_text()
    assert trtllm.normalise(samples(vllm_page)) is None
    assert not trtllm.detect({name for name, _, _ in samples(vllm_page)})


def test_values_that_cannot_be_counts_are_dropped_not_used() -> None:
    page = SERVE_2026.read_text()
    worse = (
        page.replace(
            'trtllm_kv_cache_used_blocks{model_name="nemotron-nano-3",engine_type="trtllm"} 5495.0',
            'trtllm_kv_cache_used_blocks{model_name="nemotron-nano-3",engine_type="trtllm"} 9000.0',
        )
        .replace(
            'trtllm_kv_cache_tokens_per_block{model_name="nemotron-nano-3",engine_type="trtllm"} 64.0',
            'trtllm_kv_cache_tokens_per_block{model_name="nemotron-nano-3",engine_type="trtllm"} 0.0',
        )
        .replace(
            'trtllm_num_requests_waiting{model_name="nemotron-nano-3",engine_type="trtllm"} 7.0',
            'trtllm_num_requests_waiting{model_name="nemotron-nano-3",engine_type="trtllm"} NaN',
        )
    )
    scrape = trtllm.normalise(samples(worse))
    assert scrape is not None
    (obs,) = scrape.observations
    assert obs.pool is None  # 0 tokens per block: no capacity rather than a wrong one
    assert obs.used_tokens is None  # 9000 used of 7240 max: dropped
    assert obs.requests_waiting is None
    assert scrape.dropped["invalid_value"] == 3  # tokens per block, waiting, used > max
    # With the used blocks gone, the engine's own utilization (5495/7240) is the usage left.
    assert obs.usage_ratio == pytest.approx(5495 / 7240)
    assert obs.requests_running == 1


# --- the simulator speaks the same exposition ------------------------------------------------------


def _shape(text: str) -> dict[str, tuple[str, ...]]:
    """Family name -> its label keys (the roles the adapter reads), over every sample."""
    out: dict[str, set[str]] = {}
    for name, labels, _ in samples(text):
        out.setdefault(name, set()).update(labels)
    return {name: tuple(sorted(keys)) for name, keys in out.items()}


@pytest.fixture(scope="module")
def sim() -> Simulator:
    s = Simulator(SimConfig(), scenario="ramp-30m", seed=1)
    s.advance(900.0)
    return s


def test_simulated_serve_page_has_the_real_page_families_and_labels(sim: Simulator) -> None:
    real, simulated = _shape(SERVE_2026.read_text()), _shape(sim_trtllm.render(sim))
    read = {n for n in real if n in trtllm.NEEDED}
    assert read <= set(simulated)
    assert all(simulated[n] == real[n] == ("engine_type", "model_name") for n in read)
    assert sim_trtllm.PATH == "/prometheus/metrics"


def test_simulated_triton_page_has_the_real_page_families_and_labels(sim: Simulator) -> None:
    real, simulated = TRITON_2025.read_text(), sim_trtllm.render_triton(sim)
    real_shape, sim_shape = _shape(real), _shape(simulated)
    for family in (trtllm.TRITON_KV, trtllm.TRITON_REQ):
        assert sim_shape[family] == real_shape[family]

    def kinds(text: str) -> set[tuple[str, str]]:
        return {
            (n, lab.get(trtllm.TRITON_KV_LABEL) or lab.get(trtllm.TRITON_REQ_LABEL, ""))
            for n, lab, _ in samples(text)
            if n in (trtllm.TRITON_KV, trtllm.TRITON_REQ)
        }

    assert set(trtllm.TRITON) <= kinds(simulated) <= kinds(real)


def test_simulated_pages_read_back_as_the_simulated_state(sim: Simulator) -> None:
    e = sim.engines[0]
    bs = sim.config.block_size
    for text in (sim_trtllm.render(sim), sim_trtllm.render_triton(sim)):
        scrape = trtllm.normalise(samples(text))
        assert scrape is not None and scrape.dropped == {}
        (obs,) = scrape.observations
        assert obs.pool is not None
        assert obs.pool.capacity_tokens == e.pool.usable * bs
        assert obs.used_tokens == e.pool.used * bs
        assert obs.requests_running is not None and obs.requests_running >= e.num_running
    assert e.pool.used > 0  # the ramp has load at 15 min: the comparison is not 0 == 0


# --- the memory lever ----------------------------------------------------------------------------------


def test_suggested_free_fraction_by_hand() -> None:
    # The serve page at the default 0.9: peak 351,680 used tokens, target usage 0.8 ->
    # 351,680 / 0.8 / 64 = 6868.75 -> 6869 blocks wanted; 0.9 x 6869 / 7240 = 0.85388...
    f = tf.suggest_free_gpu_memory_fraction(
        f0=0.9, max_blocks=7240, tokens_per_block=64, peak_demand_tokens=351_680, target_usage=0.8
    )
    assert f == pytest.approx(0.9 * 6869 / 7240)
    assert tf.fraction_text(f) == "0.854"
    # Setting the printed value gives at least the 6869 blocks wanted: floor(7240 x 0.854 / 0.9) = 6869.
    assert tf.blocks_at_fraction(f=0.854, f0=0.9, blocks0=7240) == 6869


def test_advice_says_free_memory_not_total() -> None:
    text = tf.advice_text(0.8538812154696132)
    assert text.startswith("--kv_cache_free_gpu_memory_fraction 0.854 ")
    assert "FREE after the weights" in text and "not of the GPU's total memory" in text
    assert tf.advice_text(0.7, triton=True).startswith("model parameter kv_cache_free_gpu_mem_fraction 0.700")
    # A pool that must more than double at 0.9 cannot be had from the free memory.
    over = tf.suggest_free_gpu_memory_fraction(
        f0=0.9, max_blocks=100, tokens_per_block=64, peak_demand_tokens=20_000, target_usage=0.8
    )
    assert over > 1 and "no value is enough" in tf.advice_text(over)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"f0": 0.0},
        {"f0": 1.5},
        {"max_blocks": 0},
        {"tokens_per_block": 0},
        {"target_usage": 0.0},
        {"peak_demand_tokens": math.nan},
    ],
)
def test_suggestion_refuses_numbers_that_cannot_be(kwargs: dict[str, float]) -> None:
    args = {"f0": 0.9, "max_blocks": 7240, "tokens_per_block": 64, "peak_demand_tokens": 1000.0, "target_usage": 0.8}
    with pytest.raises(ValueError):
        tf.suggest_free_gpu_memory_fraction(**(args | kwargs))  # type: ignore[arg-type]


def test_utilization_only_page_gives_a_usage_and_no_capacity() -> None:
    """TRT-LLM of Feb 2026 (PR #11243): utilization and hit rate, no block gauges yet."""
    kept = ("trtllm_kv_cache_utilization", "trtllm_kv_cache_hit_rate")
    page = "".join(line + "\n" for line in SERVE_2026.read_text().splitlines() if any(k in line for k in kept))
    scrape = trtllm.normalise(samples(page))
    assert scrape is not None and scrape.generation == "serve-utilization"
    (obs,) = scrape.observations
    assert obs.usage_ratio == pytest.approx(5495 / 7240)
    assert obs.pool is None and obs.used_tokens is None  # no capacity rather than a guessed one
    # a successful scrape: the usage is kept, the missing capacity counted once and named absent
    assert scrape.dropped == {"no_capacity": 1}
    assert "PR #12545" in scrape.absent["kvcache_capacity_tokens"]
    assert "kvcache_usage_ratio" not in scrape.absent


def test_utilization_only_page_takes_the_operator_capacity_and_never_over_the_pages_own() -> None:
    kept = ("trtllm_kv_cache_utilization", "trtllm_kv_cache_hit_rate")
    page = "".join(line + "\n" for line in SERVE_2026.read_text().splitlines() if any(k in line for k in kept))
    scrape = trtllm.normalise(samples(page), capacity_tokens=463_360)  # 7240 blocks x 64, as the record says
    assert scrape is not None and scrape.dropped == {}
    (obs,) = scrape.observations
    assert obs.pool is not None and obs.pool.capacity_tokens == 463_360 and obs.pool.block_size == 1
    full = trtllm.normalise(samples(SERVE_2026.read_text()), capacity_tokens=1_000)
    assert full is not None and full.observations[0].pool is not None
    assert full.observations[0].pool.capacity_tokens == 463_360  # the page's blocks win


def test_the_vllm_named_suggestion_and_the_concurrency_are_absent_with_the_reason() -> None:
    scrape = trtllm.normalise(samples(SERVE_2026.read_text()))
    assert scrape is not None
    assert "free_gpu_memory_fraction" in scrape.absent["kvcache_suggested_gpu_memory_utilization"]
    assert "max_seq_len" in scrape.absent["kvcache_max_concurrent_requests"]


def test_a_series_given_twice_is_dropped_not_added_up() -> None:
    line = 'trtllm_kv_cache_used_blocks{model_name="nemotron-nano-3",engine_type="trtllm"} 5495.0\n'
    page = SERVE_2026.read_text() + line
    scrape = trtllm.normalise(samples(page.replace("# TYPE trtllm_kv_cache_used_blocks gauge\n", "")))
    assert scrape is not None
    (obs,) = scrape.observations
    assert scrape.dropped == {"duplicate_series": 1}
    assert obs.used_tokens is None  # not 2 x 5495 blocks
    assert obs.usage_ratio == pytest.approx(5495 / 7240)  # the engine's own figure is left


@pytest.mark.usefixtures("registered")
def test_simulated_serve_page_through_the_pipeline(sim: Simulator) -> None:
    e, bs = sim.engines[0], sim.config.block_size
    p = through_pipeline(sim.config.model_name, sim_trtllm.render(sim).encode())
    assert p.gauge("kvcache_capacity_tokens") == e.pool.usable * bs
    assert p.gauge("kvcache_used_tokens") == e.pool.used * bs
    assert p.gauge("kvcache_usage_ratio") == pytest.approx(e.pool.used / e.pool.usable)
    # The cached-token counter exists from the start (collector.py creates its child in __init__).
    assert p.gauge("kvcache_prefix_cache_queries_tokens_total") == e.c.prompt_tokens
