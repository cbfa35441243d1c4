"""The simulated server's state as TGI's ``/metrics`` (the v3 router's exposition).

Names, types and help texts come from the adapter's table (:data:`sidecar.engines.tgi.FAMILIES`), so
the page served and the page read cannot drift apart. The layout is what TGI's Rust exporter
(``metrics-exporter-prometheus``) writes, as in DataDog's real capture
(``tests/fixtures/metrics/tgi/``): no labels, counters without ``_total``, integers without ``.0``,
histogram bounds ``max_input_tokens / 100 × i`` (input length) and ``max_total_tokens / 100 × i``
(generated tokens), ``i`` = 1..100 (``router/src/server.rs``).

The same paged-KV engine model as vLLM's page stands for TGI's block allocator; one TGI server is one
engine, so with several simulated engines every figure is their sum:

================================  ================================================================
``tgi_queue_size``                waiting requests
``tgi_batch_current_size``        running requests
``tgi_batch_current_max_tokens``  the running requests' reservation: each one's
                                  ``ceil((prompt + max_new_tokens − 1) / block) × block``, with
                                  ``max_new_tokens`` = its ``max_tokens`` capped by
                                  ``max_model_len − prompt`` (``FlashCausalLMBatch.from_pb``)
``tgi_request_count``             requests received (finished + running + waiting)
``tgi_request_success``           finished requests
``tgi_request_input_length``      the prompt-length histogram, re-bucketed onto TGI's bounds
``tgi_request_generated_tokens``  the generation-length histogram, likewise
================================  ================================================================

The simulated scheduler is vLLM's (it can preempt); TGI's page has no family to show a preemption.
"""

from __future__ import annotations

import math

from ...engines.tgi import FAMILIES
from ..engine import Engine, Histogram
from ..exposition import Server, rebucket

#: TGI's router serves Prometheus text on its API port.
PATH = "/metrics"
#: axum's Content-Type for a ``String`` body (the router returns ``PrometheusHandle::render()``).
CONTENT_TYPE = "text/plain; charset=utf-8"


def number(value: float) -> str:
    """A number as the Rust exporter writes it: shortest round-trip digits, no ``.0`` on integers."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def reserved_tokens(e: Engine) -> int:
    """Tokens TGI would have reserved for ``e``'s running requests (see the module docstring)."""
    block, mml = e.config.block_size, e.config.max_model_len
    total = 0
    for r in e.running.values():
        new_tokens = max(1, min(r.spec.max_tokens, mml - r.prompt))
        total += math.ceil((r.prompt + new_tokens - 1) / block) * block
    return total


def _bounds(top: int) -> list[float]:
    """TGI's 100 linear buckets up to ``top``: ``top / 100 × i`` (``router/src/server.rs``)."""
    return [(top / 100.0) * i for i in range(1, 101)]


def _merged(sim: Server, key: str, bounds: list[float]) -> Histogram:
    out = Histogram(bounds)
    for e in sim.engines:
        h = rebucket(e.h[key], bounds)
        out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
        out.count += h.count
        out.sum += h.sum
    return out


def render(sim: Server) -> str:
    """The body of TGI's ``/metrics`` for the simulator's state."""
    engines = sim.engines
    finished = sum(e.c.success_stop + e.c.success_length for e in engines)
    in_flight = sum(e.num_running + len(e.waiting) for e in engines)
    values = {
        "tgi_request_success": finished,
        # the router counts a request when it arrives (router/src/server.rs), success when it ends
        "tgi_request_count": finished + in_flight,
        "tgi_queue_size": sum(len(e.waiting) for e in engines),
        "tgi_batch_current_max_tokens": sum(reserved_tokens(e) for e in engines),
        "tgi_batch_current_size": sum(e.num_running for e in engines),
    }
    mml = sim.config.max_model_len
    histograms = {
        "tgi_request_input_length": _merged(sim, "request_prompt_tokens", _bounds(mml - 1)),
        "tgi_request_generated_tokens": _merged(sim, "request_generation_tokens", _bounds(mml)),
    }
    blocks: list[str] = []
    for name, fam in FAMILIES.items():
        lines = [f"# HELP {name} {fam.help}", f"# TYPE {name} {fam.type}"]
        if fam.type == "histogram":
            h = histograms[name]
            lines += [f'{name}_bucket{{le="{_le(b)}"}} {c}' for b, c in h.cumulative()]
            lines += [f"{name}_sum {number(h.sum)}", f"{name}_count {h.count}"]
        else:
            lines.append(f"{name} {number(values[name])}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else number(bound)
