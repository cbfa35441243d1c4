"""SGLang: the metric map (a table) and the adapter that applies it.

SGLang serves Prometheus text on its API port at ``/metrics`` when started with ``--enable-metrics``
(``sglang/srt/utils/common.py`` ``add_prometheus_middleware``: a fresh ``CollectorRegistry`` with only
``prometheus_client``'s ``MultiProcessCollector``, so no ``process_*`` series and no ``*_created``).
Every name, help text and label set below is SGLang 0.5.23's
(``sglang/srt/observability/metrics_collector.py``); what each one means and where it comes from is
``docs/engines/sglang.md``.

Two label sets share a page, and the adapter joins them on ``model_name`` only:

* the scheduler's families (KV pool, queues, retractions) carry ``model_name``, ``engine_type``,
  ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` with data parallelism (``priority`` with
  priority scheduling); one pool per DP rank, so ``dp_rank`` is the sidecar's ``engine`` ("0" when
  absent). By default only attention-TP rank 0 logs; with ``--enable-metrics-for-all-schedulers``
  every TP/PP rank repeats its rank's pool, and the copies fold (:data:`SCALARS`).
* the tokenizer's families (prompt, generation and cached-token counters) carry ``model_name``,
  ``engine_type``, ``is_streaming`` and ``cache_source``: one tokenizer serves every DP rank, so its
  counters describe the whole server and are put on the server's first rank (the lowest ``dp_rank``).

Traps handled here (each in docs/engines/sglang.md):

* ``sglang:token_usage`` is never read: it is rounded to 2 decimals (``round(..., 2)`` in
  ``pool_stats_observer.py``) and is the max over the KV, SWA and Mamba pools. Used tokens are
  ``sglang:kv_used_tokens`` (0.5.11+), else ``sglang:num_used_tokens``; both are ``max_total_num_tokens
  - (available + evictable)``: tokens held by running requests, the radix cache's evictable tokens
  not included.
* ``sglang:cache_hit_rate`` is a per-batch gauge: prefix hits come from the counters
  ``cached_tokens_total`` / ``prompt_tokens_total`` instead.
* ``sglang:num_retracted_reqs`` (the gauge of older versions) counts the retractions of the last log
  interval and is reset to 0 after each log (``metrics_reporter.py``): it is not a counter, so
  preemptions come only from ``sglang:num_retracted_requests_total``.
* With priority scheduling, ``num_running_reqs``/``num_queue_reqs`` carry the total under
  ``priority=""`` and a breakdown under ``priority="<n>"``: only the total is read.
* The radix cache's evictable tokens (``sglang:kv_evictable_tokens``) are already left out of both
  used counts, so they are not passed on as ``evictable_tokens`` (the contract's "of used_tokens"):
  free = capacity - used = available + evictable, the headroom SGLang itself can hand out.
* Capacity: ``sglang:max_total_num_tokens`` (per DP rank); else ``sglang:page_size`` x
  ``sglang:num_pages`` (0.5.11+); else the labels of ``sglang:cache_config_info`` (about 0.5.8-0.5.10);
  else ``targets[].capacity_tokens``. A page with none of them (the 2024 documentation example) and no
  setting is still read (running, waiting, used tokens, counters): the capacity gauges are absent,
  ``no_capacity`` is counted and logged with where to find the number; never a capacity guessed from
  the rounded usage.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..limits import OutOfRange, whole_number
from ..observation import EngineScrape, KVPool, Observation, Rejections
from .families import as_float, no_capacity, usable_count

KIND = "sglang"

Role = Literal["scheduler", "tokenizer"]
Fold = Literal["max", "min", "sum"]


@dataclass(frozen=True)
class Family:
    """One SGLang family as 0.5.23 registers it: its type, help text and which label set it carries."""

    type: Literal["gauge", "counter"]
    help: str
    role: Role
    #: prometheus_client's multiprocess mode of a gauge: "mostrecent" drops ``pid``; the default
    #: "all" keeps one series per process, with a ``pid`` label.
    multiprocess_mode: Literal["mostrecent", "all"] = "mostrecent"


#: Every family the adapter reads or explains, by exposed sample name (counters with ``_total``), in the
#: order SGLang 0.5.23 registers them. The simulator renders its SGLang page from this table.
FAMILIES: dict[str, Family] = {
    "sglang:num_running_reqs": Family("gauge", "The number of running requests.", "scheduler"),
    "sglang:num_queue_reqs": Family("gauge", "The number of requests in the waiting queue.", "scheduler"),
    "sglang:gen_throughput": Family("gauge", "The generation throughput (token/s).", "scheduler"),
    "sglang:cache_hit_rate": Family("gauge", "The prefix cache hit rate.", "scheduler"),
    "sglang:token_usage": Family("gauge", "The token usage.", "scheduler"),
    "sglang:num_used_tokens": Family("gauge", "The number of used tokens.", "scheduler"),
    "sglang:kv_available_tokens": Family("gauge", "Number of free token slots in the KV cache pool.", "scheduler"),
    "sglang:kv_evictable_tokens": Family(
        "gauge", "Number of evictable (radix-cached) token slots in the KV cache pool.", "scheduler"
    ),
    "sglang:kv_used_tokens": Family("gauge", "Number of actively used token slots in the KV cache pool.", "scheduler"),
    "sglang:num_retracted_reqs": Family("gauge", "The number of retracted requests.", "scheduler", "all"),
    "sglang:num_retracted_requests_total": Family("counter", "Total number of retracted requests.", "scheduler"),
    "sglang:max_total_num_tokens": Family("gauge", "Maximum total number of tokens in the KV cache pool.", "scheduler"),
    "sglang:kv_cache_memory_usage_gb": Family("gauge", "Memory used by the KV cache pools in GB.", "scheduler"),
    "sglang:page_size": Family("gauge", "KV cache page size in tokens.", "scheduler"),
    "sglang:num_pages": Family("gauge", "Number of KV cache pages.", "scheduler"),
    "sglang:context_len": Family("gauge", "Maximum context length.", "scheduler"),
    "sglang:prompt_tokens_total": Family("counter", "Number of prefill tokens processed.", "tokenizer"),
    "sglang:generation_tokens_total": Family("counter", "Number of generation tokens processed.", "tokenizer"),
    "sglang:cached_tokens_total": Family(
        "counter", "Number of cached prompt tokens by source (device/host/storage).", "tokenizer"
    ),
}

#: What each label of SGLang's families means to the adapter (``metrics_collector.py`` label sets):
#: ``model`` joins scheduler and tokenizer series; ``engine`` is the DP rank; ``copy`` repeats one
#: rank's figure (folded); ``split`` divides one count (added up); ``total`` marks the total ("")
#: against a per-priority breakdown; ``ignored`` changes nothing the sidecar reads.
LABEL_ROLES: dict[str, str] = {
    "model_name": "model",
    "dp_rank": "engine",
    "tp_rank": "copy",
    "pp_rank": "copy",
    "moe_ep_rank": "copy",
    "pid": "copy",
    "priority": "total",
    "is_streaming": "split",
    "cache_source": "split",
    "engine_type": "ignored",
}

#: About 0.5.8-0.5.10: the pool's shape as labels of an info gauge (``page_size``, ``num_pages``).
CACHE_CONFIG_INFO = "sglang:cache_config_info"

#: Numeric fields: field -> (fold over copies of one engine, sample names in order of preference).
#: Copies are the TP/PP ranks of one DP rank (and ``pid`` series): the same pool seen again, so
#: gauges take the max (the capacity the min: a pipeline stage with fewer slots bounds the rank),
#: counters the max (each copy counted the same retractions). Tokenizer counters add up over
#: ``is_streaming`` and ``cache_source``: those split one count, they do not repeat it.
SCALARS: dict[str, tuple[Fold, tuple[str, ...]]] = {
    "capacity_tokens": ("min", ("sglang:max_total_num_tokens",)),
    "page_size": ("max", ("sglang:page_size",)),
    "num_pages": ("min", ("sglang:num_pages",)),
    "used_tokens": ("max", ("sglang:kv_used_tokens", "sglang:num_used_tokens")),
    "max_model_len": ("max", ("sglang:context_len",)),
    "requests_running": ("max", ("sglang:num_running_reqs",)),
    "requests_waiting": ("max", ("sglang:num_queue_reqs",)),
    "preemptions": ("max", ("sglang:num_retracted_requests_total",)),
    "prompt_tokens": ("sum", ("sglang:prompt_tokens_total",)),
    "generation_tokens": ("sum", ("sglang:generation_tokens_total",)),
    "prefix_cache_hits_tokens": ("sum", ("sglang:cached_tokens_total",)),
}

#: Bytes in SGLang's "GB" (``GB = 1024 * 1024 * 1024`` in ``mem_cache/memory_pool.py``).
GIB = 1 << 30
#: Bounds of the pool's shape (the same rows as vLLM's ``cache_config_info`` numbers).
PAGE_SIZE_RANGE = (1, 1 << 20)
POOL_TOKENS_RANGE = (1, 1 << 40)

#: The memory setting that sizes the pool: (model weights + KV pool) as a share of TOTAL memory
#: (``arg_groups/memory_hook.py``); not on the page, so its value comes from the configuration.
MEMORY_LEVER = "mem_fraction_static"

#: Generations, from the names present (docs/engines/sglang.md, "Metric generations").
GEN_KV_TOKENS = "kv-token-counts"  # 0.5.11+: kv_used/evictable/available_tokens, page_size, num_pages
GEN_CACHE_CONFIG = "cache-config-info"  # ~0.5.8-0.5.10: sglang:cache_config_info{page_size,num_pages}
GEN_MAX_TOTAL = "max-total-tokens"  # sglang:max_total_num_tokens, used from num_used_tokens only
GEN_USAGE_ONLY = "usage-only"  # the 2024 documentation example: no capacity family at all


def needed_sample_names() -> frozenset[str]:
    """Every exposed sample name the adapter reads (the pre-filter keeps exactly these)."""
    names = {CACHE_CONFIG_INFO}
    for _, candidates in SCALARS.values():
        names.update(candidates)
    return frozenset(names)


NEEDED = needed_sample_names()

#: Names that prove a page is SGLang's (any one of them): its queue and pool families.
SIGNATURE = frozenset(
    {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens", "sglang:max_total_num_tokens"}
)

_Key = tuple[str, str]  # (model_name, engine = dp_rank)
_ByName = dict[str, list[tuple[dict[str, str], float]]]


def detect_generation(present: set[str]) -> str:
    """The metric generation, from which names are on the page."""
    if "sglang:kv_used_tokens" in present or "sglang:num_pages" in present:
        return GEN_KV_TOKENS
    if CACHE_CONFIG_INFO in present:
        return GEN_CACHE_CONFIG
    if "sglang:max_total_num_tokens" in present:
        return GEN_MAX_TOTAL
    return GEN_USAGE_ONLY


def engine_of(labels: Mapping[str, str]) -> str:
    """The sidecar's ``engine`` for a scheduler series: its DP rank ("0" without data parallelism)."""
    return labels.get("dp_rank", "0")


def is_total(labels: Mapping[str, str]) -> bool:
    """False for a per-priority breakdown series (``priority="<n>"``); the total has ``priority=""``."""
    return labels.get("priority", "") == ""


@dataclass(frozen=True)
class Reading:
    """What one (model_name, engine) got from one page, before it becomes an Observation.

    Every field is None when the page does not carry it; ``absent`` says why a capacity is missing.
    """

    model_name: str
    engine: str
    values: Mapping[str, float]
    #: ``page_size``/``num_pages`` of ``sglang:cache_config_info`` (about 0.5.8-0.5.10), when present.
    cache_config: Mapping[str, int]

    def get(self, field: str) -> float | None:
        return self.values.get(field)

    @property
    def capacity_tokens(self) -> int | None:
        """Token slots of this DP rank's KV pool, the engine's own figure first (docs/engines/sglang.md)."""
        own = self.get("capacity_tokens")
        if own is not None:
            return int(own)
        page_size, num_pages = self.block_size, self.num_blocks
        if page_size is not None and num_pages is not None:
            return page_size * num_pages
        return None

    @property
    def block_size(self) -> int | None:
        """Tokens per page (SGLang's ``--page-size``)."""
        value = self.get("page_size")
        return int(value) if value is not None else self.cache_config.get("page_size")

    @property
    def num_blocks(self) -> int | None:
        """Pages in the pool (``max_total_num_tokens // page_size``, ``scheduler.py`` ``emit_metrics_constants``)."""
        value = self.get("num_pages")
        return int(value) if value is not None else self.cache_config.get("num_pages")


def read(samples: Iterable[tuple[str, dict[str, str], float]]) -> tuple[str, list[Reading], Rejections] | None:
    """The page's generation, a :class:`Reading` per (model_name, DP rank), and what was dropped.

    None when no SGLang family is on the page. A value that cannot be what it measures (NaN, ±Inf, a
    negative count) is dropped and counted (``invalid_value``); so is a pool shape out of range. A
    family holding the same series twice is dropped whole (``duplicate_series``).
    """
    by_name: _ByName = defaultdict(list)
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    duplicated: set[str] = set()
    for name, labels, value in samples:
        if name in NEEDED:
            series = (name, frozenset(labels.items()))
            if series in seen:
                duplicated.add(name)
            seen.add(series)
            by_name[name].append((labels, as_float(value)))
    if not by_name:
        return None
    present = set(by_name)
    rejections = Rejections()
    for name in sorted(duplicated):  # the page contradicts itself; summing the copies would double a counter
        dropped = by_name.pop(name)
        rejections.add("duplicate_series", name, repr(sorted(dropped[0][0].items()))[:80], len(dropped))
    values: defaultdict[_Key, dict[str, float]] = defaultdict(dict)
    _read_scheduler(by_name, values, rejections)
    _read_tokenizer(by_name, values, rejections)
    cache_configs = _cache_configs(by_name, rejections)
    readings = [
        Reading(model, engine, values[(model, engine)], cache_configs.get((model, engine), {}))
        for model, engine in sorted(values, key=lambda k: (k[0], _rank(k[1])))
    ]
    return detect_generation(present), readings, rejections


def _rank(engine: str) -> tuple[int, str]:
    """DP ranks in numeric order ("2" before "10"), anything else after them."""
    return (int(engine), "") if engine.isdigit() else (1 << 62, engine)


def _fold(values: list[float], how: Fold) -> float:
    if how == "sum":
        return math.fsum(values)
    return max(values) if how == "max" else min(values)


def _read_scheduler(by_name: _ByName, out: defaultdict[_Key, dict[str, float]], rejections: Rejections) -> None:
    """Each scheduler row of SCALARS: its first name present, folded over the copies of one DP rank.

    A rank's field is absent when one of its copies cannot be used (folding without it could mislead).
    """
    for field, (how, candidates) in SCALARS.items():
        name = next((n for n in candidates if n in by_name), None)
        if name is None or FAMILIES[name].role != "scheduler":
            continue
        grouped: dict[_Key, list[float]] = defaultdict(list)
        bad: set[_Key] = set()
        for labels, value in by_name[name]:
            if not is_total(labels):
                continue
            key = (labels.get("model_name", ""), engine_of(labels))
            if usable_count(value):
                grouped[key].append(value)
            else:
                bad.add(key)
                rejections.add("invalid_value", name, repr(value))
        for key, found in grouped.items():
            if key not in bad:
                out[key][field] = _fold(found, how)


def _read_tokenizer(by_name: _ByName, out: defaultdict[_Key, dict[str, float]], rejections: Rejections) -> None:
    """The tokenizer's counters, per model, put on that model's first DP rank (they count the server).

    A model with only tokenizer series (the scheduler not logging yet) gets rank "0".
    """
    first: dict[str, str] = {}
    for model, engine in sorted(out, key=lambda k: (k[0], _rank(k[1]))):
        first.setdefault(model, engine)
    for field, (how, candidates) in SCALARS.items():
        name = next((n for n in candidates if n in by_name), None)
        if name is None or FAMILIES[name].role != "tokenizer":
            continue
        grouped: dict[str, list[float]] = defaultdict(list)
        bad: set[str] = set()
        for labels, value in by_name[name]:
            if not is_total(labels):
                continue
            model = labels.get("model_name", "")
            if usable_count(value):
                grouped[model].append(value)
            else:
                bad.add(model)
                rejections.add("invalid_value", name, repr(value))
        for model, found in grouped.items():
            if model not in bad:
                out[(model, first.get(model, "0"))][field] = _fold(found, how)


def _cache_configs(by_name: _ByName, rejections: Rejections) -> dict[_Key, dict[str, int]]:
    """``page_size``/``num_pages`` of ``sglang:cache_config_info`` per (model_name, DP rank).

    A number that cannot be one drops that rank's shape (``invalid_value``), never the page: SGLang
    has its capacity in ``max_total_num_tokens`` as well.
    """
    shapes: dict[_Key, dict[str, int]] = {}
    bounds = {"page_size": PAGE_SIZE_RANGE, "num_pages": POOL_TOKENS_RANGE}
    for labels, _ in by_name.get(CACHE_CONFIG_INFO, ()):
        key = (labels.get("model_name", ""), engine_of(labels))
        shape: dict[str, int] = {}
        try:
            for label, (low, high) in bounds.items():
                if labels.get(label, "") not in ("", "None"):
                    shape[label] = whole_number(labels[label], f"cache_config_info.{label}", low=low, high=high)
        except OutOfRange as e:
            rejections.add("invalid_value", CACHE_CONFIG_INFO, str(e))
            continue
        shapes.setdefault(key, shape)
    return shapes


def check_shape(reading: Reading, rejections: Rejections) -> Reading:
    """The reading without a pool shape that cannot be one (page size 0, a capacity of 0 tokens)."""
    values = dict(reading.values)
    for field, (low, high) in (
        ("capacity_tokens", POOL_TOKENS_RANGE),
        ("page_size", PAGE_SIZE_RANGE),
        ("num_pages", POOL_TOKENS_RANGE),
    ):
        value = values.get(field)
        if value is not None and not (low <= value <= high and value == int(value)):
            rejections.add("invalid_value", SCALARS[field][1][0], repr(value))
            del values[field]
    return Reading(reading.model_name, reading.engine, values, reading.cache_config)


#: Why a rank has no capacity (counted as ``no_capacity`` in ``dropped``, and the absent gauges' reason), and the fix.
NO_CAPACITY = (
    "SGLang's page has no capacity (no sglang:max_total_num_tokens, page_size/num_pages or "
    "cache_config_info: an SGLang from 2024); upgrade SGLang, or set targets[].capacity_tokens to the "
    "max_total_num_tokens SGLang logs at start-up"
)

#: Per-engine gauges SGLang cannot have, and why (EngineScrape.absent; docs/engines/sglang.md).
NO_FRACTION = "SGLang's lever is --mem-fraction-static and its value is not on the page"
ABSENT: dict[str, str] = {
    "kvcache_offload_usage_ratio": "not read from SGLang's page: its hierarchical cache (HiCache) has no "
    "usage gauge the adapter maps",
    "kvcache_admission_rejections_total": "not read from SGLang's page: it has no counter of requests "
    "refused at admission",
    "kvcache_preemptions_by_reason_total": "SGLang's retractions (num_retracted_requests_total) carry no reason",
    "kvcache_gpu_memory_utilization": NO_FRACTION,
    "kvcache_suggested_gpu_memory_utilization": NO_FRACTION + ": the suggestion needs it",
    "kvcache_capacity_shortfall_tokens": NO_FRACTION + ": the largest pool it allows is unknown",
    "kvcache_suggested_replicas": NO_FRACTION + ": the largest pool it allows is unknown",
    "kvcache_lever_capacity_tokens": NO_FRACTION + ": the largest pool it allows is unknown",
    "kvcache_theoretical_capacity_tokens": NO_FRACTION + ": the KV budget it gives is unknown",
    "kvcache_capacity_efficiency_ratio": NO_FRACTION + ": the KV budget it gives is unknown",
    "kvcache_budget_dominant_overhead_info": NO_FRACTION + ": the KV budget it gives is unknown",
    "kvcache_suggested_kv_cache_memory_bytes": "SGLang has no flag that sets the KV pool in bytes "
    "(--max-total-tokens caps it in tokens)",
    "kvcache_engine_asleep": "SGLang exports no sleep state (release_memory_occupation has no metric)",
}
#: Before ``sglang:num_retracted_requests_total``: the retraction gauge counts one log interval only.
NO_PREEMPTION_COUNTER = (
    "this SGLang has no retraction counter (sglang:num_retracted_requests_total); its sglang:num_retracted_reqs "
    "gauge, where present, counts the last log interval only (reset after each log)"
)
PREEMPTION_GAUGES = ("kvcache_preemptions_total", "kvcache_preemptions_per_second")
#: Before ``sglang:cached_tokens_total``: only the per-batch ``cache_hit_rate`` gauge.
NO_PREFIX_COUNTERS = "this SGLang has no cached-token counter (sglang:cached_tokens_total): only a per-batch hit rate"
PREFIX_GAUGES = (
    "kvcache_prefix_cache_hits_tokens_total",
    "kvcache_prefix_cache_queries_tokens_total",
    "kvcache_prefix_cache_hit_ratio",
)
#: Default of targets[].label_values_limit (no label of SGLang's is exported again).
LABEL_VALUES_LIMIT = 32


def normalise(
    samples: Iterable[tuple[str, dict[str, str], float]],
    *,
    label_values_limit: int = LABEL_VALUES_LIMIT,
    capacity_tokens: int | None = None,
) -> EngineScrape | None:
    """Observations per (model_name, DP rank) from a scrape's samples; None when no SGLang family is present.

    ``capacity_tokens`` (``targets[].capacity_tokens``) stands in for a page that has no capacity of
    its own. When neither gives one, the scrape still succeeds: every gauge the page gives is read,
    the rank has no pool, ``no_capacity`` is counted once per rank (``dropped``) and the capacity
    gauges are named in ``absent`` with the fix. ``label_values_limit`` is accepted for the common
    signature; SGLang has no label exported again.
    """
    got = read(samples)
    if got is None:
        return None
    generation, readings, rejections = got
    readings = [check_shape(r, rejections) for r in readings]
    observations = tuple(observation(r, generation, capacity_tokens) for r in readings)
    missing = no_capacity(observations, rejections, field="sglang:max_total_num_tokens", reason=NO_CAPACITY)
    return EngineScrape(
        KIND,
        generation,
        observations,
        rejections.counts,
        rejections.examples,
        absent(generation, observations) | missing,
    )


def observation(reading: Reading, generation: str, capacity_tokens: int | None = None) -> Observation:
    """One rank's :class:`Observation`: the page's figures, its pool, and the prefix counters.

    Prefix queries are the prompt tokens (every prompt is matched against the radix cache); hits are
    every ``cache_source`` of ``cached_tokens_total``. On a page of the generation that has that
    counter, its absence means no hit yet (SGLang writes the series at the first hit): 0.
    """
    prompt = reading.get("prompt_tokens")
    hits = reading.get("prefix_cache_hits_tokens")
    if hits is None and prompt is not None and generation == GEN_KV_TOKENS:
        hits = 0.0
    return Observation(
        model_name=reading.model_name,
        engine=reading.engine,
        used_tokens=reading.get("used_tokens"),
        requests_running=reading.get("requests_running"),
        requests_waiting=reading.get("requests_waiting"),
        preemptions=reading.get("preemptions"),
        prompt_tokens=prompt,
        generation_tokens=reading.get("generation_tokens"),
        prefix_cache_queries_tokens=prompt if hits is not None else None,
        prefix_cache_hits_tokens=hits,
        pool=pool(reading, capacity_tokens),
    )


def pool(reading: Reading, capacity_tokens: int | None = None) -> KVPool | None:
    """The rank's pool: the page's capacity and page shape, else the operator's capacity; None without either.

    With ``page_size``/``num_pages`` the pool is ``num_pages`` pages of ``page_size`` tokens; without
    them it is counted token by token (``block_size=1``: SGLang's default ``--page-size``).

    ``sglang:kv_cache_memory_usage_gb`` is not passed as ``kv_cache_memory_bytes``: the advice reads
    that field as vLLM's ``--kv-cache-memory-bytes`` and would suggest a flag SGLang does not have.
    """
    capacity = reading.capacity_tokens if reading.capacity_tokens is not None else capacity_tokens
    if capacity is None:
        return None
    page_size, num_pages = reading.block_size, reading.num_blocks
    if page_size is None or num_pages is None:
        page_size, num_pages = 1, capacity
    max_model_len = reading.get("max_model_len")
    return KVPool(
        num_blocks=num_pages,
        block_size=page_size,
        null_blocks=0,
        capacity_tokens=capacity,
        max_model_len=int(max_model_len) if max_model_len is not None else None,
        memory_lever=MEMORY_LEVER,
        info={"block_size": str(page_size), "num_gpu_blocks": str(num_pages)},
    )


def absent(generation: str, observations: Iterable[Observation]) -> dict[str, str]:
    """The per-engine gauges this page cannot light, with the reason."""
    out = dict(ABSENT)
    seen = list(observations)
    if not any(o.preemptions is not None for o in seen):
        out.update(dict.fromkeys(PREEMPTION_GAUGES, NO_PREEMPTION_COUNTER))
    if not any(o.prefix_cache_hits_tokens is not None for o in seen):
        out.update(dict.fromkeys(PREFIX_GAUGES, NO_PREFIX_COUNTERS))
    return out
