"""TGI: DataDog's real page and the simulator's TGI page through the adapter and the read pipeline.

The figures asserted on the real page are the ones tests/fixtures/metrics/tgi/README.md reads off it
by hand. The trap this file guards: ``tgi_batch_current_max_tokens`` is a reservation and must never
become usage.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from fixtures import METRICS

from sidecar import engines
from sidecar import page_parser as parse
from sidecar.engines import tgi, vllm
from sidecar.observation import EngineScrape
from sidecar.replay import Pipeline
from sidecar.simulator import Simulator
from sidecar.simulator.engines import tgi as tgi_page

REAL = METRICS / "tgi" / "tgi_datadog_integrations_core_payload.txt"


#: TGI 2.4.0's logged max_batch_total_tokens in huggingface/text-generation-inference issue #2748
#: ("KV-cache blocks: 123449, size: 1"): what an operator sets as targets[].capacity_tokens.
CAPACITY = 123_449


def scrape(text: str, capacity_tokens: int | None = CAPACITY) -> EngineScrape:
    result = tgi.normalise(parse.FilteredParser(tgi.NEEDED).samples(text), capacity_tokens=capacity_tokens)
    assert result is not None
    return result


def test_real_page_gives_the_figures_read_by_hand() -> None:
    result = scrape(REAL.read_text())
    assert (result.engine_kind, result.generation, result.dropped) == ("tgi", "v3-router", {})
    (obs,) = result.observations
    assert (obs.model_name, obs.engine) == ("", "0")
    assert (obs.requests_running, obs.requests_waiting, obs.reserved_tokens) == (0, 0, 0)
    assert (obs.prompt_tokens, obs.generation_tokens) == (662, 3423)
    assert obs.prompt_length is not None and obs.prompt_length.count == 109
    assert obs.prompt_length.buckets[0] == (5.11, 0) and obs.prompt_length.buckets[-1] == (math.inf, 109)
    assert obs.generation_length is not None and obs.generation_length.sum == 3423


def test_usage_and_preemptions_are_absent_with_their_reason() -> None:
    result = scrape(REAL.read_text())
    (obs,) = result.observations
    assert obs.usage_ratio is None and obs.used_tokens is None and obs.preemptions is None
    assert "reservation" in result.absent["kvcache_usage_ratio"]
    assert "never preempts" in result.absent["kvcache_preemptions_total"]
    assert "kvcache_capacity_tokens" not in result.absent


def test_the_operator_capacity_is_the_pool() -> None:
    (obs,) = scrape(REAL.read_text()).observations
    assert obs.pool is not None and obs.pool.capacity_tokens == CAPACITY
    assert obs.pool.usable_tokens is None  # TGI's block size is not on the page: no blocks are made up


def test_without_the_operator_capacity_the_page_is_read_and_no_capacity_counted() -> None:
    result = scrape(REAL.read_text(), capacity_tokens=None)
    (obs,) = result.observations
    assert obs.pool is None  # no capacity made up
    assert (obs.requests_running, obs.requests_waiting, obs.reserved_tokens) == (0, 0, 0)
    assert (obs.prompt_tokens, obs.generation_tokens) == (662, 3423)
    assert obs.prompt_length is not None and obs.prompt_length.count == 109
    assert result.dropped == {"no_capacity": 1}
    assert "Setting max batch total tokens to N" in result.rejected[("no_capacity", "targets[].capacity_tokens")]
    assert "targets[].capacity_tokens" in result.absent["kvcache_capacity_tokens"]
    assert "reservation" in result.absent["kvcache_usage_ratio"]  # the engine's own reason stays


def test_without_the_operator_capacity_the_target_stays_up_and_each_scrape_counts_it(
    pipeline_for: Callable[..., Pipeline],
) -> None:
    pipe = pipeline_for(tgi, "")  # no targets[].capacity_tokens
    for t in (5.0, 10.0):
        pipe.ingest(t, pipe.read(REAL.read_bytes()))
    page = pipe.page()
    assert page[("kvcache_sidecar_target_up", (("target", "replay"),))] == 1  # a missing setting is no outage
    assert page[("kvcache_sidecar_series_dropped_total", (("reason", "no_capacity"), ("target", "replay")))] == 2
    assert pipe.gauge("kvcache_requests_running") == 0
    assert pipe.gauge("kvcache_requests_waiting", reason="all") == 0
    assert pipe.gauge("kvcache_capacity_tokens") is None and pipe.gauge("kvcache_usage_ratio") is None


def test_real_page_through_the_read_pipeline_and_exporter(pipeline_for: Callable[..., Pipeline]) -> None:
    pipeline = pipeline_for(tgi, "", capacity_tokens=CAPACITY)
    pipeline.ingest(10.0, pipeline.read(REAL.read_bytes()))
    assert pipeline.gauge("kvcache_requests_running") == 0
    assert pipeline.gauge("kvcache_requests_waiting", reason="all") == 0
    assert pipeline.gauge("kvcache_capacity_tokens") == CAPACITY
    assert pipeline.gauge("kvcache_usage_ratio") is None
    assert pipeline.gauge("kvcache_used_tokens") is None
    info = [labels for (name, labels), _ in pipeline.page().items() if name == "kvcache_server_info"]
    assert [dict(labels)["engine_kind"] for labels in info] == ["tgi"]
    assert dict(info[0])["metrics_generation"] == "v3-router"


def test_reservation_of_a_busy_simulator_is_tgis_block_arithmetic_and_never_usage(
    pipeline_for: Callable[..., Pipeline], busy_simulator: Simulator
) -> None:
    pipeline = pipeline_for(tgi, "", capacity_tokens=CAPACITY)
    sim = busy_simulator
    result = scrape(tgi_page.render(sim))
    (obs,) = result.observations
    (e,) = sim.engines
    block, mml = sim.config.block_size, sim.config.max_model_len
    # ceil((input + max_new_tokens - 1) / BLOCK_SIZE) blocks per running request (FlashCausalLMBatch.from_pb)
    expected = sum(
        -(-(r.prompt + min(r.spec.max_tokens, mml - r.prompt) - 1) // block) * block for r in e.running.values()
    )
    assert obs.reserved_tokens == expected > 0
    assert (obs.requests_running, obs.requests_waiting) == (sim.running, sim.waiting)
    assert obs.usage_ratio is None and obs.used_tokens is None
    pipeline.ingest(sim.now, pipeline.read(tgi_page.render(sim).encode()))
    assert pipeline.gauge("kvcache_requests_running") == sim.running
    assert pipeline.gauge("kvcache_usage_ratio") is None  # the reservation never shows as usage


def _families_and_label_keys(text: str) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for name, labels, _ in parse.samples(text):
        out.setdefault(name, set()).update(labels)
    return {name: frozenset(keys) for name, keys in out.items()}


def test_simulator_page_and_real_page_have_the_same_families_and_label_roles(busy_simulator: Simulator) -> None:
    real = _families_and_label_keys(REAL.read_text())
    ours = _families_and_label_keys(tgi_page.render(busy_simulator))
    read = {name: keys for name, keys in real.items() if name in tgi.NEEDED}
    assert {name: keys for name, keys in ours.items() if name in tgi.NEEDED} == read
    assert set(read) == set(tgi.NEEDED)  # the real page carries every family the adapter reads
    assert read["tgi_request_input_length_bucket"] == {"le"} and read["tgi_queue_size"] == frozenset()


def test_simulator_numbers_are_written_like_tgis_rust_exporter(busy_simulator: Simulator) -> None:
    text = tgi_page.render(busy_simulator)
    assert "tgi_request_success " in text and ".0\n" not in text  # integers without .0
    assert tgi_page.number(5.11 * 3) == "15.330000000000002"  # the real page's second bucket bound


def test_a_value_that_cannot_be_a_count_is_dropped_and_counted() -> None:
    text = (
        REAL.read_text()
        .replace("tgi_queue_size 0", "tgi_queue_size NaN")
        .replace("tgi_batch_current_size 0", "tgi_batch_current_size -3")
    )
    result = scrape(text)
    (obs,) = result.observations
    assert obs.requests_waiting is None and obs.requests_running is None
    assert result.dropped == {"invalid_value": 2}
    assert obs.reserved_tokens == 0  # the rest of the page stays


def test_tgi_reads_nothing_of_a_vllm_page_and_the_signatures_do_not_overlap() -> None:
    vllm_page = (METRICS / "vllm_v1_head40_engine_label.txt").read_text()
    assert tgi.normalise(parse.FilteredParser(tgi.NEEDED).samples(vllm_page), capacity_tokens=CAPACITY) is None
    assert not (tgi.NEEDED & vllm.NEEDED)
    assert tgi.SIGNATURE <= tgi.NEEDED


def test_a_page_mixing_tgi_and_vllm_is_detected_as_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines.ADAPTERS, tgi.KIND, tgi)
    vllm_page = (METRICS / "vllm_v1_head40_engine_label.txt").read_text()
    tgi_names = {name for name, _, _ in parse.samples(REAL.read_text())}
    vllm_names = {name for name, _, _ in parse.samples(vllm_page)}
    assert engines.detect(tgi_names) == [tgi]
    assert engines.detect(tgi_names | vllm_names) == [vllm, tgi]  # the pipeline refuses it: mixed_engines
