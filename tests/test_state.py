"""Per-target state: a failing layer costs only its own gauges; pools, engines and changes are tracked."""

from __future__ import annotations

import logging
from dataclasses import replace

from fixtures import CPU_032

from sidecar import page_parser as parse
from sidecar.config import load_config
from sidecar.derive import base_values
from sidecar.engines import vllm
from sidecar.metrics import CATALOGUE
from sidecar.state import Step, TargetState, forget_engine, ingest_success

KEY = ("models/tiny-llama-gqa-bf16", "0")


class Broken:
    def __call__(self, step: Step):
        raise RuntimeError("a bug in a layer")


def _scrape(name: str = "gqa-6mib_full-a.txt"):
    return vllm.normalise(parse.samples((CPU_032 / name).read_text()))


def _state() -> TargetState:
    return TargetState(target=load_config(None, env={}).targets[0], history_s=300)


def _ingest(state, scrape, t, extenders=()):
    ingest_success(
        state, scrape, sample_time=t, wall_time=t, duration_s=0.0, window_s=300, watermark=0.9, extenders=extenders
    )


def test_a_broken_layer_keeps_the_base_gauges_and_is_logged_once(caplog):
    scrape = _scrape()
    state = _state()
    with caplog.at_level(logging.ERROR, logger="kv_sidecar.state"):
        for t in range(3):
            _ingest(state, scrape, t, extenders=(Broken(),))
    assert state.snapshot.up and state.snapshot.derived[KEY].free_tokens == 384
    # only the base rows: the broken layer added nothing
    d = state.snapshot.derived[KEY]
    assert state.snapshot.values[KEY] == base_values(d, "vllm", scrape.generation)
    assert set(state.snapshot.values[KEY]) <= set(CATALOGUE)
    assert sum("derivation layer Broken failed" in r.getMessage() for r in caplog.records) == 1


def test_a_new_pool_is_a_configuration_change_and_an_equal_one_is_shared(caplog):
    """The same page twice: one pool kept, no change. The pool of another num_gpu_blocks: one change,
    logged with the label as vLLM shows it."""
    a = _scrape()
    state = _state()
    _ingest(state, a, 0)
    _ingest(state, _scrape(), 1)  # a new but equal pool object
    assert state.config_changes == 0
    first, second = (obs.pool for _, obs in state.history[KEY])
    assert first is second  # interned: a long history holds one pool
    (obs,) = a.observations
    bigger = replace(obs, pool=vllm.kv_pool({**obs.pool.info, "num_gpu_blocks": "96"}))
    with caplog.at_level(logging.WARNING, logger="kv_sidecar.state"):
        _ingest(state, replace(a, observations=(bigger,)), 2)
    assert state.config_changes == 1
    assert state.last_cache_config[KEY].num_blocks == 96
    assert "num_gpu_blocks:48->96" in caplog.text


def test_a_pool_without_display_strings_still_counts_a_change_by_its_typed_fields(caplog):
    """An engine that fills only typed fields (no info strings): the log names the typed field."""
    a = _scrape()
    (obs,) = a.observations
    typed = replace(obs.pool, info={})
    state = _state()
    _ingest(state, replace(a, observations=(replace(obs, pool=typed),)), 0)
    with caplog.at_level(logging.WARNING, logger="kv_sidecar.state"):
        _ingest(state, replace(a, observations=(replace(obs, pool=replace(typed, block_size=64)),)), 1)
    assert state.config_changes == 1
    assert "block_size:128->64" in caplog.text


class Remembers:
    def __init__(self) -> None:
        self.forgotten: list[tuple[str, str, str]] = []

    def __call__(self, step: Step):
        return {}

    def forget(self, key):
        self.forgotten.append(key)


def test_an_engine_that_leaves_is_forgotten_by_every_layer_through_one_function():
    layer = Remembers()
    state = _state()
    scrape = _scrape()
    _ingest(state, scrape, 0, extenders=(layer, Broken()))  # a layer without forget() is skipped
    _ingest(state, replace(scrape, observations=()), 1, extenders=(layer,))
    assert layer.forgotten == [(state.target.name, *KEY)]
    forget_engine((layer, object()), ("t", "m", "1"))  # what the daemon calls for a removed target
    assert layer.forgotten[-1] == ("t", "m", "1")


def test_another_engine_on_the_same_target_is_a_configuration_change_and_forgets_the_old_one(caplog):
    """An ``engine: auto`` target whose vLLM is replaced by SGLang on the same port, serving the same model
    name as engine "0": one configuration change, the vLLM history and the layers' series of the key are
    dropped (before, the two engines' samples shared one history and one trend)."""
    from fixtures import METRICS

    from sidecar.engines import sglang

    page = (METRICS / "sglang_production_metrics_doc_example.txt").read_text()
    sglang_scrape = sglang.normalise(parse.samples(page.replace("meta-llama/Llama-3.1-8B-Instruct", KEY[0])))
    assert KEY in {o.key for o in sglang_scrape.observations}
    forgotten: list[tuple[str, str, str]] = []

    class Layer:
        def __call__(self, step: Step):
            return {}

        def forget(self, key):
            forgotten.append(key)

    state = _state()
    for t in range(3):
        _ingest(state, _scrape(), t, extenders=(Layer(),))
    assert state.config_changes == 0 and len(state.history[KEY]) == 3
    with caplog.at_level(logging.WARNING, logger="kv_sidecar.state"):
        _ingest(state, sglang_scrape, 3, extenders=(Layer(),))
    assert state.config_changes == 1  # once, not again for the pool that differs
    assert [o.pool for _, o in state.history[KEY]] == [sglang_scrape.observations[0].pool]
    assert forgotten == [(state.target.name, *KEY)]
    assert state.snapshot.engine_kind == "sglang"
    assert any("engine_kind:vllm->sglang" in r.getMessage() for r in caplog.records)
    _ingest(state, sglang_scrape, 4, extenders=(Layer(),))
    assert state.config_changes == 1 and len(state.history[KEY]) == 2


def test_two_models_under_one_engine_index_keep_their_own_pools():
    """One Triton server with two TensorRT-LLM models (both ``version="1"``, the sidecar's engine "1"),
    each with its own pool: no configuration change, scrape after scrape (before, the last
    pool was kept per engine index, so the two pools read as a change at every scrape)."""
    from fixtures import METRICS

    from sidecar.engines import trtllm

    page = (METRICS / "trtllm" / "triton_backend_readme_2025.txt").read_text()
    second = "".join(
        line.replace('model="tensorrt_llm"', 'model="tensorrt_llm_b"').replace("} 6239", "} 3000") + "\n"
        for line in page.splitlines()
        if line.startswith("nv_")
    )
    scrape = trtllm.normalise(parse.samples(page + "\n" + second))
    assert [(o.key, o.pool.num_blocks) for o in scrape.observations] == [
        (("tensorrt_llm", "1"), 6239),
        (("tensorrt_llm_b", "1"), 3000),
    ]
    state = _state()
    for t in range(4):
        _ingest(state, scrape, t)
    assert state.config_changes == 0
    assert set(state.last_cache_config) == {("tensorrt_llm", "1"), ("tensorrt_llm_b", "1")}
