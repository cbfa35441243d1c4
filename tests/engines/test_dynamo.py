"""Dynamo pass-through pages: the engine underneath is read, Dynamo's own families never are.

A Dynamo worker serves the engine's families (``sglang:*``, ``vllm:*``, ...) beside ``dynamo_*`` on
its system port; the frontend serves ``dynamo_frontend_*`` only (docs/engines/dynamo.md). The pages
are ``tests/fixtures/metrics/dynamo/`` (provenance, and what is composite, in its README).
"""

from __future__ import annotations

from types import ModuleType

import pytest
from fixtures import METRICS

from sidecar import engines
from sidecar import page_parser as parse
from sidecar.engines import llamacpp, sglang, tgi, trtllm, vllm

WORKER = METRICS / "dynamo" / "sglang_dynamo_worker_composite.txt"
FRONTEND = METRICS / "dynamo" / "sglang_dynamo_frontend_page.txt"
SGLANG_DOC = METRICS / "sglang_production_metrics_doc_example.txt"
#: Every engine adapter in the tree (registered in sidecar.engines.ADAPTERS or not yet).
ADAPTERS: tuple[ModuleType, ...] = (vllm, sglang, trtllm, tgi, llamacpp)
#: Dynamo's figures on the worker page that no engine figure may take: the router's block count.
DYNAMO_TOTAL_BLOCKS = 12894


def names_on(text: str) -> set[str]:
    return {name for name, _, _ in parse.samples(text)}


def test_no_adapter_reads_a_dynamo_family() -> None:
    for adapter in ADAPTERS:
        assert not [n for n in adapter.NEEDED if n.startswith("dynamo_")], adapter.KIND


def test_the_worker_page_is_sglangs_page_with_dynamos_lines_beside_it() -> None:
    capacity = 442_368  # the operator's (this SGLang exports none); Dynamo's blocks are never taken for it
    worker = sglang.normalise(parse.samples(WORKER.read_text()), capacity_tokens=capacity)
    alone = sglang.normalise(parse.samples(SGLANG_DOC.read_text()), capacity_tokens=capacity)
    assert worker is not None and alone is not None
    assert worker.observations == alone.observations
    (obs,) = worker.observations
    assert (obs.used_tokens, obs.requests_running, obs.requests_waiting) == (123_859, 162, 2826)
    assert obs.pool is not None and DYNAMO_TOTAL_BLOCKS not in (obs.pool.num_blocks, obs.pool.capacity_tokens)


@pytest.fixture
def every_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    for adapter in ADAPTERS:
        monkeypatch.setitem(engines.ADAPTERS, adapter.KIND, adapter)


def test_only_the_engine_underneath_recognises_the_worker_page(every_adapter: None) -> None:
    assert engines.detect(names_on(WORKER.read_text())) == [sglang]
    for adapter in (vllm, trtllm, tgi, llamacpp):
        assert adapter.normalise(parse.samples(WORKER.read_text())) is None, adapter.KIND


def test_without_a_capacity_the_worker_page_has_none_not_dynamos_blocks() -> None:
    result = sglang.normalise(parse.samples(WORKER.read_text()))
    assert result is not None
    (obs,) = result.observations
    assert obs.pool is None and result.dropped == {"no_capacity": 1}


def test_the_frontend_page_has_no_engine_family(every_adapter: None) -> None:
    text = FRONTEND.read_text()
    assert "dynamo_frontend_model_kv_cache_block_size" in names_on(text)  # the router's block size (64)
    assert engines.detect(names_on(text)) == []  # no_engine_metrics
    for adapter in ADAPTERS:
        assert adapter.normalise(parse.samples(text)) is None, adapter.KIND
