"""Engine adapters: one module per inference-server family, one row each in :data:`ADAPTERS`.

An adapter is a module with

* ``KIND``: the engine name used in ``targets[].engine`` and in labels;
* ``NEEDED``: the exposed sample names it reads (drives the pre-filter);
* ``SIGNATURE``: the sample names that prove a page is this engine's (:func:`detect`);
* ``normalise(samples, *, label_values_limit, capacity_tokens) -> EngineScrape | None``: pure, over
  ``(name, labels, value)`` samples; ``None`` when none of its families is present (the scrape then
  counts as ``no_engine_metrics``). It fills the typed contract of :mod:`sidecar.observation`, the
  only thing the derivations, the layers and the exporter read.

Adding an engine is a new module plus a row in :data:`ADAPTERS`; nothing else changes
(``tests/test_engine_contract.py`` proves it with a made-up engine).
"""

from __future__ import annotations

from collections.abc import Collection
from types import ModuleType

from . import llamacpp, sglang, tgi, trtllm, vllm

#: Every engine the sidecar reads, by ``targets[].engine`` name (docs/engines.md has one page each).
ADAPTERS: dict[str, ModuleType] = {
    vllm.KIND: vllm,
    sglang.KIND: sglang,
    trtllm.KIND: trtllm,
    tgi.KIND: tgi,
    llamacpp.KIND: llamacpp,
}


def adapter(kind: str) -> ModuleType:
    return ADAPTERS[kind]


def detect(names: Collection[str]) -> list[ModuleType]:
    """The adapters whose ``SIGNATURE`` names appear among a page's sample names, in :data:`ADAPTERS`
    order: none (no engine's page), one (that engine), or several (a page mixing engines: the pipeline
    refuses it as ``mixed_engines``). A Dynamo worker's page carries its engine's own names, so it is
    that engine's."""
    return [module for module in ADAPTERS.values() if any(name in names for name in module.SIGNATURE)]
