"""llama.cpp's ``llama-server``: the metric map (a table) and the adapter that applies it.

``llama-server --metrics`` serves Prometheus text at ``/metrics`` on its API port (501 without the flag;
in router mode ``/metrics?model=<id>``). The handler writes ``# HELP``/``# TYPE``/one sample per metric,
``llamacpp:`` prefix, no labels at all (``tools/server/server-context.cpp``, the ``get_metrics``
handler's ``all_metrics_def`` table; the families and their types are listed in
``tools/server/README.md`` "Available metrics", updated by ggml-org/llama.cpp PR #22879, 2026-05-09).
What each one means, with sources, is ``docs/engines/llamacpp.md``.

What the page can and cannot say:

* **No KV metric since ≈May 2025.** ``llamacpp:kv_cache_usage_ratio`` (``used cells / n_ctx``) and
  ``llamacpp:kv_cache_tokens`` were removed by ggml-org/llama.cpp PR #13660. A page that still has the
  ratio (generation :data:`GEN_KV_USAGE`) gives ``usage_ratio``; a current page gives none, and the
  usage gauges are absent (:data:`ABSENT`).
* **Capacity is ``--ctx-size``**, on no ``/metrics`` page: ``/props`` has it as
  ``default_generation_settings.n_ctx`` — the context of ONE slot (``slots[0].n_ctx``) — and
  ``total_slots`` (``--parallel``). Without ``--kv-unified`` each slot owns ``n_ctx / n_parallel``
  cells, so the server's cells are ``n_ctx(slot) × total_slots``; with ``--kv-unified`` every slot
  may use the whole ``--ctx-size`` and the server's cells are ``n_ctx(slot)`` (see
  :func:`capacity_from_props`). The capacity reaches the adapter as ``capacity_tokens``
  (``targets[].capacity_tokens``); without it the scrape still succeeds with everything else and
  counts ``no_capacity`` (:func:`sidecar.engines.families.no_capacity`).
* **``llamacpp:n_tokens_max`` is a high-water mark**, typed ``counter`` by the server but computed
  with ``std::max`` over the slots' ``n_tokens`` ("Largest observed n_tokens."): the longest
  sequence seen since start, never a rate. It goes to ``Observation.longest_sequence_tokens``.
* **``requests_deferred``** counts tasks waiting because no slot was free: the queue.
* No preemption (a slot keeps its request; context shift trims it instead), no prefix-cache
  counter before ``llamacpp:prompt_tokens_cached_total``; ``llamacpp:prompt_tokens_total`` counts
  the prompt tokens processed, cached ones excluded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..observation import EngineScrape, KVPool, Observation, Rejections
from .families import BUDGET_GAUGES, FORECAST_GAUGES, MAX_COUNT, as_float, no_capacity

KIND = "llamacpp"

#: Generations, from the names present.
GEN_KV_USAGE = "kv-usage"  # before PR #13660 (≈May 2025): kv_cache_usage_ratio and kv_cache_tokens
GEN_NO_KV = "no-kv-metrics"  # since: requests, tokens and timings only


@dataclass(frozen=True)
class Family:
    """One llama-server metric as its handler declares it: the TYPE it writes and the help text."""

    type: Literal["gauge", "counter"]
    help: str


#: The families of the current handler, in its order (counters first, then gauges), as the
#: simulator renders them. ``n_tokens_max`` is declared in the counter list although it is a maximum.
FAMILIES: dict[str, Family] = {
    "llamacpp:prompt_tokens_total": Family("counter", "Number of prompt tokens processed."),
    "llamacpp:prompt_seconds_total": Family("counter", "Prompt process time"),
    "llamacpp:tokens_predicted_total": Family("counter", "Number of generation tokens processed."),
    "llamacpp:tokens_predicted_seconds_total": Family("counter", "Predict process time"),
    "llamacpp:n_decode_total": Family("counter", "Total number of llama_decode() calls"),
    "llamacpp:n_tokens_max": Family("counter", "Largest observed n_tokens."),
    "llamacpp:n_busy_slots_per_decode": Family("counter", "Average number of busy slots per llama_decode() call"),
    "llamacpp:prompt_tokens_seconds": Family("gauge", "Average prompt throughput in tokens/s."),
    "llamacpp:predicted_tokens_seconds": Family("gauge", "Average generation throughput in tokens/s."),
    "llamacpp:requests_processing": Family("gauge", "Number of requests processing."),
    "llamacpp:requests_deferred": Family("gauge", "Number of requests deferred."),
}

#: Reading field -> the exposed sample names it is read from, the first present wins (every family
#: is one unlabelled sample). ``n_tokens_max`` is declared a counter without ``_total``: a parser that
#: reads the ``# TYPE`` line (prometheus_client's) names its sample ``llamacpp:n_tokens_max_total``,
#: the sidecar's pre-filtered parse keeps the page's own name; both are read.
SCALARS: dict[str, tuple[str, ...]] = {
    "requests_running": ("llamacpp:requests_processing",),
    "requests_waiting": ("llamacpp:requests_deferred",),
    "prompt_tokens_processed": ("llamacpp:prompt_tokens_total",),
    "prompt_tokens_cached": ("llamacpp:prompt_tokens_cached_total",),
    "generation_tokens": ("llamacpp:tokens_predicted_total",),
    "longest_sequence_tokens": ("llamacpp:n_tokens_max", "llamacpp:n_tokens_max_total"),
    "usage_ratio": ("llamacpp:kv_cache_usage_ratio",),  # GEN_KV_USAGE only
}
#: Names that prove a page is llama-server's (any one).
SIGNATURE = frozenset({"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_decode_total"})
NEEDED = frozenset(name for names in SCALARS.values() for name in names) | SIGNATURE

NO_KV = "llama.cpp exports no KV metric since PR #13660 (≈May 2025): usage and used tokens cannot be read"
ABSENT_NO_KV: dict[str, str] = {
    "kvcache_usage_ratio": NO_KV,
    "kvcache_used_tokens": NO_KV,
    "kvcache_free_tokens": NO_KV,
    **dict.fromkeys(FORECAST_GAUGES, "the headroom and the forecast stand on used tokens: " + NO_KV),
}
ABSENT: dict[str, str] = {
    "kvcache_offload_usage_ratio": "llama.cpp exports no offload tier on the page",
    "kvcache_admission_rejections_total": "llama-server queues (requests_deferred); it counts no refusals",
    "kvcache_preemptions_by_reason_total": "llama.cpp does not preempt: a slot keeps its request",
    "kvcache_preemptions_total": "llama.cpp does not preempt: a slot keeps its request (context shift trims it)",
    "kvcache_preemptions_per_second": "llama.cpp does not preempt: a slot keeps its request",
    "kvcache_gpu_memory_utilization": "llama.cpp sizes the cache by --ctx-size, not by a memory fraction",
    "kvcache_engine_asleep": "llama-server's page exports no sleep state",
    "kvcache_suggested_gpu_memory_utilization": "llama.cpp sizes the cache by --ctx-size, not by a memory fraction",
    **dict.fromkeys(BUDGET_GAUGES, "llama.cpp sizes the cache by --ctx-size (cells), not by a memory budget"),
    "kvcache_suggested_kv_cache_memory_bytes": "llama.cpp has no KV-bytes flag: --ctx-size sets the cells",
    **dict.fromkeys(
        ("kvcache_capacity_shortfall_tokens", "kvcache_suggested_replicas", "kvcache_lever_capacity_tokens"),
        "the largest cache llama.cpp's memory allows is not modelled: its lever is --ctx-size",
    ),
}
NO_PREFIX = "llama.cpp before llamacpp:prompt_tokens_cached_total exports no prefix-cache counter"
PREFIX_GAUGES = (
    "kvcache_prefix_cache_hits_tokens_total",
    "kvcache_prefix_cache_queries_tokens_total",
    "kvcache_prefix_cache_hit_ratio",
)
#: Why a llama.cpp page has no capacity gauges (counted ``no_capacity``) without ``targets[].capacity_tokens``.
NO_CAPACITY = (
    "llama.cpp's capacity (--ctx-size) is not on /metrics: set targets[].capacity_tokens to --ctx-size "
    "(/props: default_generation_settings.n_ctx x total_slots, or n_ctx alone with --kv-unified)"
)

_Sample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class Reading:
    """What one llama-server page says, by :data:`SCALARS` field (absent = not on the page)."""

    generation: str
    values: Mapping[str, float]

    @property
    def longest_sequence_tokens(self) -> float | None:
        """``llamacpp:n_tokens_max``: the longest sequence (prompt + generated) seen since start."""
        return self.values.get("longest_sequence_tokens")


def detect_generation(present: set[str]) -> str:
    return GEN_KV_USAGE if "llamacpp:kv_cache_usage_ratio" in present else GEN_NO_KV


def read(samples: Iterable[_Sample], rejections: Rejections) -> Reading | None:
    """The page's values; None when no llama-server family is on it. An unusable value (NaN, ±Inf, a
    negative count, a usage outside 0..1) drops that field and is counted (``invalid_value``)."""
    by_name: dict[str, list[float]] = defaultdict(list)
    for name, _, value in samples:
        if name in NEEDED:
            by_name[name].append(as_float(value))
    if not by_name:
        return None
    values: dict[str, float] = {}
    for field, names in SCALARS.items():
        present = next((n for n in names if n in by_name), None)
        if present is None:
            continue
        found = by_name[present]
        high = 1.0 + 1e-9 if field == "usage_ratio" else MAX_COUNT
        bad = [v for v in found if not (math.isfinite(v) and 0 <= v <= high)]
        if bad:
            rejections.add("invalid_value", present, repr(bad[0]))
        else:
            values[field] = max(found)  # one unlabelled series; a repeat keeps the largest
    return Reading(detect_generation(set(by_name)), values)


def capacity_from_props(props: Mapping[str, object], *, kv_unified: bool) -> int:
    """The server's KV cells (tokens) from ``GET /props``.

    ``default_generation_settings.n_ctx`` is one slot's context (``slots[0].n_ctx``, the ``get_props``
    handler of ``tools/server/server-context.cpp``) and ``total_slots`` is ``--parallel``: without
    ``--kv-unified`` the slots split ``--ctx-size`` so the server holds ``n_ctx × total_slots``; with it
    every slot sees the whole cache, which is ``n_ctx``. Raises ValueError naming the missing field.
    """
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    slots = props.get("total_slots")
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"/props: default_generation_settings.n_ctx is {n_ctx!r}, not a context size")
    if kv_unified:
        return n_ctx
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"/props: total_slots is {slots!r}, not a slot count")
    return n_ctx * slots


def pool(capacity_tokens: int) -> KVPool:
    """The pool as the operator stated it: ``--ctx-size`` cells of one token each."""
    return KVPool(num_blocks=capacity_tokens, block_size=1, null_blocks=0, capacity_tokens=capacity_tokens)


def normalise(
    samples: Iterable[_Sample],
    *,
    label_values_limit: int = 0,
    capacity_tokens: int | None = None,
    model_name: str = "",
) -> EngineScrape | None:
    """One Observation from a llama-server page; None when no llama.cpp family is on it.

    ``capacity_tokens``: ``targets[].capacity_tokens`` (``--ctx-size``). Without it the scrape still
    succeeds: running, waiting, the token counters, the high-water mark and (older builds) the usage
    fraction are read, the observation has no pool, ``no_capacity`` is counted once (its log line names
    the setting) and the capacity gauges are absent with that reason. ``model_name``: the served model
    (the page does not name it). ``label_values_limit``: unused (the page has no labels).
    """
    rejections = Rejections()
    reading = read(samples, rejections)
    if reading is None:
        return None
    v = reading.values
    processed, cached = v.get("prompt_tokens_processed"), v.get("prompt_tokens_cached")
    observation = Observation(
        model_name=model_name,
        engine="0",
        usage_ratio=v.get("usage_ratio"),
        requests_running=v.get("requests_running"),
        requests_waiting=v.get("requests_waiting"),
        generation_tokens=v.get("generation_tokens"),
        # prompt_tokens_total leaves cached tokens out; the prompt total is processed + cached when both exist
        prompt_tokens=None if processed is None else processed + (cached or 0.0),
        prefix_cache_hits_tokens=cached,
        prefix_cache_queries_tokens=None if processed is None or cached is None else processed + cached,
        longest_sequence_tokens=reading.longest_sequence_tokens,
        pool=None if capacity_tokens is None else pool(capacity_tokens),
    )
    # the engine's own reasons (no KV metric since #13660) win over the missing setting's
    missing = no_capacity((observation,), rejections, field="targets[].capacity_tokens", reason=NO_CAPACITY)
    return EngineScrape(
        KIND,
        reading.generation,
        (observation,),
        rejections.counts,
        rejections.examples,
        missing | absent(reading),
    )


def absent(reading: Reading) -> dict[str, str]:
    """The catalogue gauges this page cannot light, with the reason."""
    out = dict(ABSENT)
    if "usage_ratio" not in reading.values:
        out.update(ABSENT_NO_KV)
    if "prompt_tokens_cached" not in reading.values:
        out.update(dict.fromkeys(PREFIX_GAUGES, NO_PREFIX))
    return out
