"""Engine adapters: one module per inference-server family.

An adapter is a module with

* ``KIND``: the engine name used in ``targets[].engine`` and in labels;
* ``NEEDED``: the exposed sample names it reads (drives the pre-filter);
* ``normalise(samples) -> EngineScrape | None``: pure, over
  ``(name, labels, value)`` samples; ``None`` when none of its families is
  present (the scrape then counts as ``no_engine_metrics``).

Adding SGLang, TGI or TensorRT-LLM is a new module plus a row in
:data:`ADAPTERS`; nothing else changes.
"""

from __future__ import annotations

from types import ModuleType

from . import vllm

ADAPTERS: dict[str, ModuleType] = {vllm.KIND: vllm}


def adapter(kind: str) -> ModuleType:
    return ADAPTERS[kind]
