"""llama.cpp: a real llama-server page and the simulator's page through the adapter and the read pipeline.

The figures asserted on the real page are the ones tests/fixtures/metrics/llamacpp/README.md reads off
it by hand (the ik_llama.cpp PR #695 capture, from before llama.cpp removed its KV metrics).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fixtures import METRICS

from sidecar import engines
from sidecar import page_parser as parse
from sidecar.engines import llamacpp, tgi, vllm
from sidecar.observation import EngineScrape, Rejections
from sidecar.replay import Pipeline
from sidecar.simulator import Simulator
from sidecar.simulator.engines import llamacpp as llamacpp_page

REAL = METRICS / "llamacpp" / "llamacpp_ik_llama_pr695_comment.txt"


#: The real page's context, read off it by hand (kv_cache_tokens / kv_cache_usage_ratio): --ctx-size.
CONTEXT = 64_000


def scrape(text: str, capacity_tokens: int | None = CONTEXT) -> EngineScrape:
    result = llamacpp.normalise(parse.FilteredParser(llamacpp.NEEDED).samples(text), capacity_tokens=capacity_tokens)
    assert result is not None
    return result


def test_real_page_gives_the_figures_read_by_hand() -> None:
    result = scrape(REAL.read_text())
    assert (result.engine_kind, result.generation, result.dropped) == ("llamacpp", llamacpp.GEN_KV_USAGE, {})
    (obs,) = result.observations
    assert (obs.requests_running, obs.requests_waiting) == (0, 0)
    assert obs.usage_ratio == 0.491063
    assert (obs.prompt_tokens, obs.generation_tokens) == (6886, 3469)
    assert obs.preemptions is None and obs.prefix_cache_hits_tokens is None
    # kv_cache_tokens / usage = the context: 31428 / 0.491063 = 64000.0 cells (to 6 significant digits)
    assert round(31428 / obs.usage_ratio, -1) == 64_000
    assert "does not preempt" in result.absent["kvcache_preemptions_total"]
    assert "kvcache_usage_ratio" not in result.absent  # this generation still exports it


def test_real_page_with_its_context_as_capacity_gives_the_used_tokens(pipeline_for: Callable[..., Pipeline]) -> None:
    pipeline = pipeline_for(llamacpp, "", capacity_tokens=CONTEXT)
    (obs,) = scrape(REAL.read_text()).observations
    assert obs.pool is not None and obs.pool.usable_tokens == 64_000  # cells of one token, no null block
    assert round(obs.usage_ratio * obs.pool.usable_tokens) == 31_428  # the page's kv_cache_tokens
    pipeline.ingest(10.0, pipeline.read(REAL.read_bytes()))
    assert pipeline.gauge("kvcache_usage_ratio") == pytest.approx(0.491063)
    assert pipeline.gauge("kvcache_capacity_tokens") == CONTEXT
    assert pipeline.gauge("kvcache_used_tokens") == pytest.approx(31_428, abs=1)
    assert pipeline.gauge("kvcache_free_tokens") == pytest.approx(64_000 - 31_428, abs=1)
    assert pipeline.gauge("kvcache_requests_running") == 0
    assert pipeline.gauge("kvcache_requests_waiting", reason="all") == 0


def test_a_current_page_has_no_kv_metric_and_says_why(busy_simulator: Simulator) -> None:
    result = scrape(llamacpp_page.render(busy_simulator))
    assert result.generation == llamacpp.GEN_NO_KV
    (obs,) = result.observations
    assert obs.usage_ratio is None and obs.used_tokens is None
    assert "#13660" in result.absent["kvcache_usage_ratio"]
    assert obs.longest_sequence_tokens is not None and obs.longest_sequence_tokens > 0


def test_without_the_operator_capacity_the_page_is_read_and_no_capacity_counted() -> None:
    result = scrape(REAL.read_text(), capacity_tokens=None)
    (obs,) = result.observations
    assert obs.pool is None  # no capacity made up
    assert (obs.requests_running, obs.requests_waiting) == (0, 0)
    assert obs.usage_ratio == 0.491063  # the engine's own fraction needs no capacity
    assert (obs.prompt_tokens, obs.generation_tokens) == (6886, 3469)
    assert result.dropped == {"no_capacity": 1}
    assert "--ctx-size" in result.rejected[("no_capacity", "targets[].capacity_tokens")]
    assert "--ctx-size" in result.absent["kvcache_capacity_tokens"]
    assert "kvcache_usage_ratio" not in result.absent and "kvcache_used_tokens" in result.absent


def test_without_the_operator_capacity_the_target_stays_up_and_each_scrape_counts_it(
    pipeline_for: Callable[..., Pipeline],
) -> None:
    pipe = pipeline_for(llamacpp, "")  # no targets[].capacity_tokens
    for t in (5.0, 10.0):
        pipe.ingest(t, pipe.read(REAL.read_bytes()))
    page = pipe.page()
    assert page[("kvcache_sidecar_target_up", (("target", "replay"),))] == 1  # a missing setting is no outage
    assert page[("kvcache_sidecar_series_dropped_total", (("reason", "no_capacity"), ("target", "replay")))] == 2
    assert pipe.gauge("kvcache_usage_ratio") == pytest.approx(0.491063)
    assert pipe.gauge("kvcache_requests_running") == 0
    assert pipe.gauge("kvcache_capacity_tokens") is None and pipe.gauge("kvcache_used_tokens") is None


def test_a_current_page_without_capacity_still_gives_running_and_waiting(
    pipeline_for: Callable[..., Pipeline], busy_simulator: Simulator
) -> None:
    sim = busy_simulator
    pipe = pipeline_for(llamacpp, "")
    result = pipe.read(llamacpp_page.render(sim).encode())
    assert result.dropped == {"no_capacity": 1}
    pipe.ingest(sim.now, result)
    assert pipe.gauge("kvcache_requests_running") == sim.running
    assert pipe.gauge("kvcache_requests_waiting", reason="all") == sim.waiting
    assert pipe.gauge("kvcache_usage_ratio") is None  # no KV metric since #13660, and no capacity


def test_busy_simulator_page_gives_running_waiting_and_the_high_water_mark(busy_simulator: Simulator) -> None:
    sim = busy_simulator
    rejections = Rejections()
    reading = llamacpp.read(parse.samples(llamacpp_page.render(sim)), rejections)
    assert reading is not None and not rejections.counts
    assert (reading.values["requests_running"], reading.values["requests_waiting"]) == (sim.running, sim.waiting)
    high = reading.longest_sequence_tokens
    assert high is not None and high >= max(r.prompt + r.out for r in sim.engines[0].running.values())
    sim.advance(120.0)  # load over, nothing running: a high-water mark does not come down
    later = llamacpp.read(parse.samples(llamacpp_page.render(sim)), Rejections())
    assert later is not None and later.longest_sequence_tokens is not None
    assert later.longest_sequence_tokens >= high


def test_n_tokens_max_is_typed_counter_by_the_server_but_read_as_a_maximum() -> None:
    assert llamacpp.FAMILIES["llamacpp:n_tokens_max"].type == "counter"  # as the handler declares it
    assert llamacpp.SCALARS["longest_sequence_tokens"][0] == "llamacpp:n_tokens_max"
    # prometheus_client's parser (it reads the TYPE line) appends _total to a counter's sample; still read
    typed = "# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 33631\n"
    assert [name for name, _, _ in parse.samples(typed)] == ["llamacpp:n_tokens_max_total"]
    reading = llamacpp.read(parse.samples(typed), Rejections())
    assert reading is not None and reading.longest_sequence_tokens == 33631


def _families_and_label_keys(text: str) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for name, labels, _ in parse.samples(text):
        out.setdefault(name, set()).update(labels)
    return {name: frozenset(keys) for name, keys in out.items()}


def test_simulator_page_and_real_page_share_families_and_label_roles(busy_simulator: Simulator) -> None:
    real = _families_and_label_keys(REAL.read_text())
    ours = _families_and_label_keys(llamacpp_page.render(busy_simulator))
    common = set(real) & set(ours)
    # every family both generations have (all but the removed kv_cache_* ones) is on both pages, unlabelled
    assert set(real) - common == {"llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens"}
    assert all(real[n] == ours[n] == frozenset() for n in common)
    assert {"llamacpp:requests_processing", "llamacpp:requests_deferred"} <= common


def test_simulator_numbers_are_written_like_std_stringstream() -> None:
    assert llamacpp_page.number(2903.63) == "2903.63" and llamacpp_page.number(0.9787642) == "0.978764"
    assert llamacpp_page.number(6886) == "6886"


def test_capacity_from_props_per_slot_context_times_slots() -> None:
    # llama.cpp issue #17384's command line: --ctx-size 393216 --parallel 2 -> 196608 per slot in /props
    props = {"default_generation_settings": {"n_ctx": 196_608}, "total_slots": 2}
    assert llamacpp.capacity_from_props(props, kv_unified=False) == 393_216
    unified = {"default_generation_settings": {"n_ctx": 393_216}, "total_slots": 2}  # each slot sees it all
    assert llamacpp.capacity_from_props(unified, kv_unified=True) == 393_216
    with pytest.raises(ValueError, match="total_slots"):
        llamacpp.capacity_from_props({"default_generation_settings": {"n_ctx": 4096}}, kv_unified=False)
    with pytest.raises(ValueError, match="n_ctx"):
        llamacpp.capacity_from_props({"total_slots": 1}, kv_unified=False)


def test_a_value_that_cannot_be_what_it_measures_is_dropped_and_counted() -> None:
    text = (
        REAL.read_text()
        .replace("llamacpp:requests_deferred 0", "llamacpp:requests_deferred -1")
        .replace("llamacpp:kv_cache_usage_ratio 0.491063", "llamacpp:kv_cache_usage_ratio 1.7")
    )
    result = scrape(text)
    (obs,) = result.observations
    assert obs.requests_waiting is None and obs.usage_ratio is None
    assert result.dropped == {"invalid_value": 2}
    assert obs.requests_running == 0


def scrape_or_none(text: str) -> EngineScrape | None:
    return llamacpp.normalise(parse.FilteredParser(llamacpp.NEEDED).samples(text), capacity_tokens=CONTEXT)


def test_llamacpp_reads_nothing_of_other_engines_pages() -> None:
    for other in (
        METRICS / "vllm_v1_head40_engine_label.txt",
        METRICS / "tgi" / "tgi_datadog_integrations_core_payload.txt",
    ):
        assert scrape_or_none(other.read_text()) is None
    assert not (llamacpp.NEEDED & (vllm.NEEDED | tgi.NEEDED))
    assert llamacpp.SIGNATURE <= llamacpp.NEEDED


def test_a_json_quoted_body_of_b7010_builds_has_no_sample_to_read() -> None:
    # llama.cpp issue #17384: /metrics answered with the exposition as one JSON string (fixed by PR #17386)
    quoted = '"' + REAL.read_text().replace("\n", "\\n") + '"'
    assert scrape_or_none(quoted) is None  # the pipeline counts it as no_engine_metrics


def test_a_page_mixing_llamacpp_and_tgi_is_detected_as_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines.ADAPTERS, llamacpp.KIND, llamacpp)
    monkeypatch.setitem(engines.ADAPTERS, tgi.KIND, tgi)
    ours = {name for name, _, _ in parse.samples(REAL.read_text())}
    theirs = {
        name
        for name, _, _ in parse.samples((METRICS / "tgi" / "tgi_datadog_integrations_core_payload.txt").read_text())
    }
    assert engines.detect(ours) == [llamacpp]
    assert set(engines.detect(ours | theirs)) == {llamacpp, tgi}  # the pipeline refuses it: mixed_engines
