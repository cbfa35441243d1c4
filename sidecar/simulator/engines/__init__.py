"""The simulated server's ``/metrics`` in each inference engine's own exposition.

One paged-KV engine model (``sidecar/simulator/engine.py``) drives every page; each engine's module
turns its state into that engine's text. An engine module gives

* ``render(sim) -> str``: the body, from the simulator's state (the
  :class:`~sidecar.simulator.exposition.Server` protocol);
* ``PATH``: the URL path the engine serves its metrics on (TensorRT-LLM's ``trtllm-serve``:
  ``/prometheus/metrics``; the others ``/metrics``);
* ``CONTENT_TYPE``: the Content-Type the engine answers with.

vLLM's page is :mod:`sidecar.simulator.exposition` (one renderer per vLLM metric generation); the
other engines render one generation each, their newest. ``kv-sidecar simulate --engine KIND`` picks
one (docs/simulator.md). Adding an engine: its module here and a row in :data:`EXPOSITIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...generations import Generation
from .. import exposition
from . import llamacpp, sglang, tgi, trtllm


@dataclass(frozen=True)
class Exposition:
    """How the simulator speaks one engine: what it serves, where, and as which Content-Type."""

    kind: str
    path: str
    content_type: str
    #: ``render(sim, generation)``; engines without metric generations ignore the second argument.
    render: Callable[[exposition.Server, Generation], str]


def _one_generation(render: Callable[[exposition.Server], str]) -> Callable[[exposition.Server, Generation], str]:
    return lambda sim, generation: render(sim)


#: Engine kind (``targets[].engine``, ``engine_kind``) -> its exposition, the default first.
EXPOSITIONS: dict[str, Exposition] = {
    "vllm": Exposition("vllm", "/metrics", exposition.CONTENT_TYPE, exposition.render),
    "sglang": Exposition("sglang", sglang.PATH, sglang.CONTENT_TYPE, _one_generation(sglang.render)),
    "trtllm": Exposition("trtllm", trtllm.PATH, trtllm.CONTENT_TYPE, _one_generation(trtllm.render)),
    "tgi": Exposition("tgi", tgi.PATH, tgi.CONTENT_TYPE, _one_generation(tgi.render)),
    "llamacpp": Exposition("llamacpp", llamacpp.PATH, llamacpp.CONTENT_TYPE, _one_generation(llamacpp.render)),
}

#: The choices of ``--engine``.
ENGINE_KINDS: tuple[str, ...] = tuple(EXPOSITIONS)
DEFAULT_ENGINE = "vllm"


def exposition_of(kind: str) -> Exposition:
    """The engine's exposition; a ``KeyError`` naming the choices for an unknown kind."""
    try:
        return EXPOSITIONS[kind]
    except KeyError:
        choices = ", ".join(EXPOSITIONS)
        raise KeyError(f"no simulated exposition for engine {kind!r}; choose one of: {choices}") from None
