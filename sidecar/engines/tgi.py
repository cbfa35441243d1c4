"""Hugging Face TGI: the metric map (a table) and the adapter that applies it.

TGI's router serves Prometheus text at ``/metrics`` (the Rust ``metrics`` crate's exporter: counters
without ``_total``, no ``model_name`` label, one server per page). Names, types and help texts are
text-generation-inference's (``router/src/server.rs`` ``describe_*``; ``docs/source/reference/
metrics.md``) @ db931fcf42da018a3657580c64bf2720f167f9ab; what each means, with sources, is
``docs/engines/tgi.md``.

What the page can and cannot say (each a row of :data:`ABSENT` when it cannot):

* **Reserved, not used.** ``tgi_batch_current_max_tokens`` is the running batch's ``max_tokens``:
  ``num_blocks × BLOCK_SIZE`` of the blocks the router allocated at admission, each request's
  ``ceil((input + max_new_tokens − 1 + speculate) / BLOCK_SIZE)`` blocks
  (``server/text_generation_server/models/flash_causal_lm.py``, ``FlashCausalLMBatch.from_pb`` and
  ``to_pb``; ``backends/v3/src/backend.rs`` sets the gauge). It is a reservation for tokens that may
  never be generated: it goes to ``Observation.reserved_tokens`` and NEVER to usage.
* **No capacity on the page.** ``max_batch_total_tokens`` (the KV pool in tokens) is computed at
  warmup and logged ("Setting max batch total tokens to N", ``backends/v3/src/lib.rs``); the
  ``tgi_batch_max_total_tokens`` gauge set there is written before the Prometheus recorder is
  installed, so it never reaches the page, and ``/info`` lost the field in 2.3 (commit 2b19d671). The
  capacity comes from the operator (``targets[].capacity_tokens``, passed here as ``capacity_tokens``);
  ``kv-sidecar capacity --engine tgi`` estimates it (``sidecar.capacity.engines.tgi_capacity``).
  Without it the scrape still succeeds with everything else and counts ``no_capacity``
  (:func:`sidecar.engines.families.no_capacity`).
* **No preemption.** TGI's scheduler admits a request only when its blocks fit and otherwise leaves it
  in the queue (``backends/v3/src/queue.rs`` ``next_batch``: "Over budget ... Add it back to the
  front"): waiting is ``tgi_queue_size``, preemptions do not exist.
* **No prefix-cache counters**, no KV dtype or block size on the page.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..observation import EngineScrape, KVPool, Observation, Rejections
from .families import (
    BUDGET_GAUGES,
    FORECAST_GAUGES,
    MEMORY_ADVICE_GAUGES,
    as_float,
    histograms,
    no_capacity,
    usable_count,
)

KIND = "tgi"
#: The only generation: the v3 router's families (TGI 2.x-3.x; the repository is archived since 2026-03).
GENERATION = "v3-router"


@dataclass(frozen=True)
class Family:
    """One TGI family as its router describes it: the type, the help text (``router/src/server.rs``)."""

    type: Literal["gauge", "counter", "histogram", "summary"]
    help: str


#: Every family the adapter reads or the simulator renders, in the order of DataDog's real capture
#: (tests/fixtures/metrics/tgi/). Counter names carry no ``_total``: the Rust exporter writes them so.
FAMILIES: dict[str, Family] = {
    "tgi_request_success": Family("counter", "Number of successful requests"),
    "tgi_request_count": Family("counter", "Total number of requests"),
    "tgi_queue_size": Family("gauge", "Current queue size"),
    "tgi_batch_current_max_tokens": Family("gauge", "Maximum tokens for the current batch"),
    "tgi_batch_current_size": Family("gauge", "Current batch size"),
    "tgi_request_input_length": Family("histogram", "Input token length per request"),
    "tgi_request_generated_tokens": Family("histogram", "Generated tokens per request"),
}

ScalarField = Literal["requests_running", "requests_waiting", "reserved_tokens", "prompt_tokens", "generation_tokens"]
HistogramField = Literal["prompt_length", "generation_length"]

#: Observation field -> exposed sample name. Prompt and generated tokens are the histograms' ``_sum``:
#: the tokens of every finished request (TGI has no token counters).
SCALARS: dict[ScalarField, str] = {
    "requests_running": "tgi_batch_current_size",
    "requests_waiting": "tgi_queue_size",
    "reserved_tokens": "tgi_batch_current_max_tokens",
    "prompt_tokens": "tgi_request_input_length_sum",
    "generation_tokens": "tgi_request_generated_tokens_sum",
}
#: Observation field -> histogram family (samples ``_bucket``, ``_count``, ``_sum``).
HISTOGRAMS: dict[HistogramField, str] = {
    "prompt_length": "tgi_request_input_length",
    "generation_length": "tgi_request_generated_tokens",
}

#: Names that prove a page is TGI's (any one): its queue and batch gauges.
SIGNATURE = frozenset({"tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens"})

#: Catalogue gauges TGI cannot light, and why (docs/engines/tgi.md).
NO_USAGE = (
    "TGI exports no KV usage: tgi_batch_current_max_tokens is an admission reservation "
    "(input + max_new_tokens per admitted request, rounded up to blocks), not tokens written"
)
ABSENT: dict[str, str] = {
    "kvcache_offload_usage_ratio": "TGI has no KV offload tier",
    "kvcache_admission_rejections_total": "not read: TGI counts refusals among tgi_request_failure by error "
    "type, not by admission reason",
    "kvcache_preemptions_by_reason_total": "TGI never preempts, it queues",
    "kvcache_usage_ratio": NO_USAGE,
    "kvcache_used_tokens": NO_USAGE,
    "kvcache_free_tokens": NO_USAGE,
    "kvcache_preemptions_total": "TGI never preempts: a request that does not fit waits in the queue (tgi_queue_size)",
    "kvcache_preemptions_per_second": "TGI never preempts: a request that does not fit waits in the queue",
    "kvcache_prefix_cache_hits_tokens_total": "TGI exports no prefix-cache counters",
    "kvcache_prefix_cache_queries_tokens_total": "TGI exports no prefix-cache counters",
    "kvcache_prefix_cache_hit_ratio": "TGI exports no prefix-cache counters",
    "kvcache_gpu_memory_utilization": "TGI's memory setting (CUDA_MEMORY_FRACTION) is not on its page",
    "kvcache_engine_asleep": "TGI's page exports no sleep state",
    "kvcache_suggested_gpu_memory_utilization": "TGI's memory setting is not on its page; the advice needs used tokens",
    **dict.fromkeys(
        FORECAST_GAUGES,
        "the headroom and the forecast stand on used tokens, which TGI does not export (only a reservation)",
    ),
    **dict.fromkeys(
        BUDGET_GAUGES,
        "TGI's memory setting (CUDA_MEMORY_FRACTION) is not on its page and its budget is not vLLM's "
        "(kv-sidecar capacity --engine tgi estimates it)",
    ),
    **dict.fromkeys(MEMORY_ADVICE_GAUGES, "the advice stands on used tokens, which TGI does not export"),
}
#: Why a TGI page has no capacity gauges (counted ``no_capacity``) when the operator did not give
#: ``targets[].capacity_tokens``.
NO_CAPACITY = (
    "TGI's capacity (max_batch_total_tokens) is on no scrapeable page: set targets[].capacity_tokens to the "
    "value TGI logs at start-up ('Setting max batch total tokens to N')"
)


def needed_sample_names() -> frozenset[str]:
    """Every exposed sample name the adapter reads (the pre-filter keeps exactly these)."""
    names = set(SCALARS.values()) | set(SIGNATURE)
    for fam in HISTOGRAMS.values():
        names.update((fam + "_bucket", fam + "_count", fam + "_sum"))
    return frozenset(names)


NEEDED = needed_sample_names()

_Sample = tuple[str, dict[str, str], float]
_ByName = dict[str, list[tuple[dict[str, str], float]]]
#: TGI's page has no model_name and no engine label: one server, one engine.
_KEY = ("", "0")


def pool(capacity_tokens: int) -> KVPool:
    """The pool as the operator stated it: ``capacity_tokens`` only (TGI's block size depends on its
    attention backend, which the page does not tell)."""
    return KVPool(capacity_tokens=capacity_tokens, null_blocks=0, memory_lever="CUDA_MEMORY_FRACTION")


def normalise(
    samples: Iterable[_Sample],
    *,
    label_values_limit: int = 0,
    capacity_tokens: int | None = None,
    model_name: str = "",
) -> EngineScrape | None:
    """One Observation from a TGI page; None when no TGI family is on it.

    ``capacity_tokens``: ``targets[].capacity_tokens`` (TGI's ``max_batch_total_tokens``), the only
    source of the capacity. Without it the scrape still succeeds: running, waiting, the reservation,
    the token counters and the histograms are read, the observation has no pool, ``no_capacity`` is
    counted once (its log line names the setting) and ``kvcache_capacity_tokens`` is absent with that
    reason. ``model_name``: the served model (TGI's page does not name it).
    ``label_values_limit`` is accepted for the common adapter signature: TGI exports no label read here.
    A value that cannot be a count (NaN, ±Inf, negative) is dropped and counted (``invalid_value``).
    """
    by_name: _ByName = defaultdict(list)
    for name, labels, value in samples:
        if name in NEEDED:
            by_name[name].append((labels, as_float(value)))
    if not by_name:
        return None
    rejections = Rejections()
    read = _scalars(by_name, rejections)
    hist = {field: histograms(by_name, fam, rejections, _one_server).get(_KEY) for field, fam in HISTOGRAMS.items()}
    observation = Observation(
        model_name=model_name,
        engine="0",
        requests_running=read.get("requests_running"),
        requests_waiting=read.get("requests_waiting"),
        reserved_tokens=read.get("reserved_tokens"),
        prompt_tokens=read.get("prompt_tokens"),
        generation_tokens=read.get("generation_tokens"),
        prompt_length=hist["prompt_length"],
        generation_length=hist["generation_length"],
        pool=None if capacity_tokens is None else pool(capacity_tokens),
    )
    # the engine's own reasons (no usage at all) win over the missing setting's
    absent = no_capacity((observation,), rejections, field="targets[].capacity_tokens", reason=NO_CAPACITY) | ABSENT
    return EngineScrape(KIND, GENERATION, (observation,), rejections.counts, rejections.examples, absent)


def _one_server(labels: Mapping[str, str]) -> tuple[str, str]:
    """The key of every TGI series: the page has no model or engine label (one server, one engine)."""
    return _KEY


def _scalars(by_name: _ByName, rejections: Rejections) -> Mapping[str, float]:
    """Each SCALARS row's value; a page with two series of one (it has no label to tell them apart)
    keeps the largest, and an unusable value drops the field."""
    out: dict[str, float] = {}
    for field, name in SCALARS.items():
        values = [v for _, v in by_name.get(name, ())]
        if not values:
            continue
        if all(usable_count(v) for v in values):
            out[field] = max(values)
        else:
            rejections.add("invalid_value", name, repr(next(v for v in values if not usable_count(v))))
    return out
