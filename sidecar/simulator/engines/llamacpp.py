"""The simulated server's state as ``llama-server --metrics``'s ``/metrics`` (the current handler).

Names, types and help texts come from the adapter's table (:data:`sidecar.engines.llamacpp.FAMILIES`),
in the handler's order: its counter list, then its gauge list, each metric written as ``# HELP``,
``# TYPE`` and one unlabelled sample (``tools/server/server-context.cpp``, the ``get_metrics``
handler). Numbers are written by ``std::stringstream`` with its default 6 significant digits
(``2903.63``, ``0.978764``), which :func:`number` reproduces.

The same paged-KV engine model as vLLM's page stands for llama-server's slots; one llama-server is
one engine, so with several simulated engines every figure is their sum (``n_tokens_max`` their max):

===================================  ==============================================================
``requests_processing``              running requests (busy slots)
``requests_deferred``                waiting requests (no free slot)
``prompt_tokens_total``              prompt tokens computed (the prefix-cache hits left out, as
                                     llama-server counts them)
``tokens_predicted_total``           generated tokens
``n_tokens_max``                     the longest request seen (prompt + generated), a maximum:
                                     :func:`longest_sequence`
``n_decode_total``                   engine steps
===================================  ==============================================================

The throughput gauges and the seconds counters are not modelled (0).
"""

from __future__ import annotations

from ...engines.llamacpp import FAMILIES
from ..engine import Engine, Histogram
from ..exposition import Server

#: llama-server serves the metrics on its API port (with ``--metrics``; 501 without).
PATH = "/metrics"
#: ``res->content_type = "text/plain; version=0.0.4"`` in the ``get_metrics`` handler.
CONTENT_TYPE = "text/plain; version=0.0.4"


def number(value: float) -> str:
    """``value`` as ``std::stringstream << double`` writes it: ``%g`` with 6 significant digits."""
    return f"{float(value):g}"


def _top(h: Histogram) -> float:
    """The upper bound of ``h``'s highest non-empty finite bucket (0 when empty)."""
    top = 0.0
    for bound, count in zip(h.bounds, h.counts, strict=False):
        if count:
            top = bound
    return top


def longest_sequence(e: Engine) -> int:
    """``n_tokens_max`` for ``e``: a high-water mark that never decreases.

    The engine model keeps no per-request history, so this is the longest running request (prompt +
    generated) or, when larger, the sum of the highest non-empty prompt and generation length buckets
    capped at ``max_model_len``: an upper bound that, like llama-server's maximum, only grows.
    """
    running = max((r.prompt + r.out for r in e.running.values()), default=0)
    finished = _top(e.h["request_prompt_tokens"]) + _top(e.h["request_generation_tokens"])
    return max(running, min(int(finished), e.config.max_model_len))


def render(sim: Server) -> str:
    """The body of llama-server's ``/metrics`` for the simulator's state."""
    engines = sim.engines
    values = {
        "llamacpp:prompt_tokens_total": sum(e.c.prompt_local_compute for e in engines),
        "llamacpp:tokens_predicted_total": sum(e.c.generation_tokens for e in engines),
        "llamacpp:n_decode_total": sum(e.step_index for e in engines),
        "llamacpp:n_tokens_max": max(longest_sequence(e) for e in engines),
        "llamacpp:n_busy_slots_per_decode": 0.0,
        "llamacpp:requests_processing": sum(e.num_running for e in engines),
        "llamacpp:requests_deferred": sum(len(e.waiting) for e in engines),
    }
    lines: list[str] = []
    for name, fam in FAMILIES.items():
        lines += [f"# HELP {name} {fam.help}", f"# TYPE {name} {fam.type}", f"{name} {number(values.get(name, 0))}"]
    return "\n".join(lines) + "\n"
