"""TensorRT-LLM: the metric map (tables) and the adapter that applies it, for both ways it is served.

**trtllm-serve** (TensorRT-LLM's OpenAI server) serves Prometheus text at ``/prometheus/metrics``;
its plain ``/metrics`` is a JSON array of iteration stats, not exposition text. Its families come
from ``tensorrt_llm/metrics/collector.py`` (``MetricsCollector``; read at 050f80def8df) and carry
the labels ``model_name`` and ``engine_type``. By generation:

================  ==================================================================================
generation        what the page has
================  ==================================================================================
serve-unprefixed  1.0-1.1: five request families without a prefix (``request_success_total``, four
                  latency histograms); no iteration stats, so no KV family at all
serve-request     the same five with the ``trtllm_`` prefix (TRT-LLM 1.2/1.3 before the iteration
                  gauges, or 1.1 behind Dynamo, which adds the prefix): no KV family either
serve-utilization ``trtllm_kv_cache_utilization`` (used ÷ max blocks) and ``trtllm_kv_cache_hit_rate``
                  only (TensorRT-LLM PR #11243, Feb 2026): a usage, no capacity
serve-blocks      PR #12545 (Mar 2026) on: ``trtllm_kv_cache_{max,free,used}_blocks``,
                  ``trtllm_kv_cache_tokens_per_block``, ``trtllm_num_requests_{running,waiting}``,
                  ``trtllm_num_paused_requests``, token counters
================  ==================================================================================

Every iteration family exists only with ``enable_iter_perf_stats: true`` in the LLM API options
(collector.py ``log_iteration_stats``: "Needs `enable_iter_perf_stats: true`"). A page with only the
request families is therefore a TRT-LLM server whose capacity cannot be read: the scrape fails with a
clear reason (:func:`normalise` raises), never an empty success.

**The Triton backend** (triton-inference-server/tensorrtllm_backend, Triton 23.11+) puts the batch
manager's statistics on Triton's ``/metrics`` (port 8002) as two labelled gauges
(``inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``):
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|fraction}``
and ``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}``, with the
labels ``model`` and ``version``. ``fraction`` (used ÷ max) and ``waiting`` (active − scheduled) came
with the backend of April 2025 (tensorrtllm_backend 15cb989): generations ``triton`` and
``triton-fraction``.

The figures, for both (``model_instance_state.cc`` and collector.py compute them the same way):

* capacity = max blocks × tokens per block. TRT-LLM keeps one pool per attention-window size
  (TensorRT-LLM docs/source/features/kvcache.md): for a model with sliding-window layers the page's
  block count spans pools of different cost, and this product is not its capacity. The page cannot
  tell; ``docs/engines/trtllm.md`` says so.
* used = used blocks × tokens per block (``used_tokens``; the usage is derived from it). The engine's
  own fraction is read only when the used blocks are not on the page; when both are, a fraction that
  contradicts used ÷ max is dropped and counted (the Triton README's example page has ``fraction``
  0.4875 beside 1 used block of 6239).
* running / waiting: trtllm-serve's ``num_requests_running`` is ``numActiveRequests`` (every request
  in the executor, paused ones included) and ``num_requests_waiting`` is ``numQueuedRequests`` (not
  yet taken in); Triton's ``scheduled`` / ``waiting`` split the active requests instead.
* No preemption counter exists (``num_paused_requests`` is a gauge of requests paused now), no
  sleep state; the Triton backend has no prefix-cache lookup count (``reused`` is a bare block count).

Copies of one series (``pid`` labels of prometheus_client's multiprocess mode) fold like vLLM's:
gauges by max, counters by sum.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..observation import USAGE_SLACK, EngineScrape, KVPool, Observation, Rejections
from ..reasons import ScrapeFailed
from .families import BUDGET_GAUGES, MAX_COUNT, as_float, no_capacity

KIND = "trtllm"

#: What one series fills: the adapter's intermediate fields, turned into an Observation by _observe.
Field = Literal[
    "max_blocks",
    "free_blocks",
    "used_blocks",
    "tokens_per_block",
    "usage",
    "running",
    "waiting",
    "prompt_tokens",
    "generation_tokens",
    "prefix_hits_tokens",
]


@dataclass(frozen=True)
class Family:
    """One trtllm-serve family as collector.py registers it: type, help text, the field it fills."""

    type: Literal["gauge", "counter"]
    help: str
    field: Field | None = None  # None: read only to recognise the page


#: The 2026 prefix (collector.py ``self.metric_prefix = "trtllm_"``); 1.0-1.1 had none.
PREFIX = "trtllm_"

#: trtllm-serve's families the adapter reads, by exposed sample name, in collector.py's order.
#: The simulator renders its trtllm-serve page from this table.
SERVE: dict[str, Family] = {
    "trtllm_kv_cache_utilization": Family("gauge", "KV cache utilization", "usage"),
    "trtllm_num_requests_running": Family("gauge", "Number of active requests", "running"),
    "trtllm_num_requests_waiting": Family("gauge", "Number of queued requests", "waiting"),
    "trtllm_kv_cache_max_blocks": Family("gauge", "Maximum number of KV cache blocks", "max_blocks"),
    "trtllm_kv_cache_free_blocks": Family("gauge", "Number of free KV cache blocks", "free_blocks"),
    "trtllm_kv_cache_used_blocks": Family("gauge", "Number of used KV cache blocks", "used_blocks"),
    "trtllm_kv_cache_tokens_per_block": Family("gauge", "Number of tokens per KV cache block", "tokens_per_block"),
    "trtllm_num_paused_requests": Family("gauge", "Number of paused requests"),
    "trtllm_prompt_tokens_total": Family(
        "counter", "Cumulative number of prompt (input) tokens processed.", "prompt_tokens"
    ),
    "trtllm_generation_tokens_total": Family(
        "counter", "Cumulative number of generation (output) tokens produced.", "generation_tokens"
    ),
    "trtllm_prompt_cached_tokens_total": Family(
        "counter",
        "Process-lifetime total prompt tokens served from KV cache. Resets only when the serving process "
        "restarts, not when the KV cache is flushed or evicted.",
        "prefix_hits_tokens",
    ),
}

#: The request families every trtllm-serve page has (collector.py since 1.0), without the prefix:
#: they prove the page is TRT-LLM's even when no iteration family is there.
REQUEST_FAMILIES = (
    "request_success_total",
    "e2e_request_latency_seconds_count",
    "time_to_first_token_seconds_count",
    "time_per_output_token_seconds_count",
    "request_queue_time_seconds_count",
)
#: Unprefixed names are generic: a page is taken for TRT-LLM 1.0-1.1 only if they carry this label
#: (collector.py's labels were ``{"model_name": ..., "engine_type": ...}`` from the start).
UNPREFIXED_MARK = "engine_type"

#: The Triton backend's two families and the label that splits each.
TRITON_KV, TRITON_KV_LABEL = "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"
TRITON_REQ, TRITON_REQ_LABEL = "nv_trt_llm_request_metrics", "request_type"
#: (family, label value) -> field; the other label values (reused, active, max, context) are not read.
TRITON: dict[tuple[str, str], Field] = {
    (TRITON_KV, "max"): "max_blocks",
    (TRITON_KV, "free"): "free_blocks",
    (TRITON_KV, "used"): "used_blocks",
    (TRITON_KV, "tokens_per"): "tokens_per_block",
    (TRITON_KV, "fraction"): "usage",
    (TRITON_REQ, "scheduled"): "running",
    (TRITON_REQ, "waiting"): "waiting",
}

#: Gauges this engine cannot have, and why (EngineScrape.absent; shown in docs/engines/trtllm.md).
ABSENT: dict[str, str] = {
    "kvcache_offload_usage_ratio": "TRT-LLM's host offload (secondary memory pool) exports no usage on the page",
    "kvcache_admission_rejections_total": "TRT-LLM's page has no counter of requests refused at admission",
    "kvcache_preemptions_by_reason_total": "TRT-LLM counts no preemptions (as kvcache_preemptions_total)",
    "kvcache_preemptions_total": "TRT-LLM counts no preemptions: trtllm_num_paused_requests is a gauge of "
    "requests paused now, and the Triton backend exports none",
    "kvcache_preemptions_per_second": "no preemption counter (see kvcache_preemptions_total)",
    "kvcache_engine_asleep": "TRT-LLM has no sleep mode",
    "kvcache_gpu_memory_utilization": "the page does not carry free_gpu_memory_fraction (a share of FREE "
    "memory after weights, not vLLM's share of total)",
    "kvcache_suggested_gpu_memory_utilization": "TRT-LLM's lever is free_gpu_memory_fraction, a share of the memory "
    "FREE after the weights, not vLLM's share of total: a vLLM-named suggestion would be the wrong number "
    "(kv-sidecar capacity --engine trtllm computes the free fraction; docs/engines/trtllm.md)",
    "kvcache_max_concurrent_requests": "TRT-LLM's page has no maximum sequence length (max_seq_len) and no "
    "request-length histograms (its histograms are latencies): no request size to divide the pool by",
    **dict.fromkeys(
        BUDGET_GAUGES,
        "the capacity model estimates vLLM's budget (a share of TOTAL memory); TRT-LLM's free_gpu_memory_fraction "
        "is a share of the memory free after the weights, and its value is not on the page "
        "(kv-sidecar capacity --engine trtllm computes that budget)",
    ),
    "kvcache_suggested_kv_cache_memory_bytes": "TRT-LLM has no KV-bytes flag for the advice to name "
    "(free_gpu_memory_fraction sizes the pool, KvCacheConfig.max_tokens caps it in tokens)",
    **dict.fromkeys(
        ("kvcache_capacity_shortfall_tokens", "kvcache_suggested_replicas", "kvcache_lever_capacity_tokens"),
        "the largest pool free_gpu_memory_fraction allows needs its value, which is not on the page",
    ),
}
#: Why a page of generation ``serve-utilization`` (a usage, no block gauges) has no capacity gauges
#: when the operator did not give ``targets[].capacity_tokens`` (counted ``no_capacity``).
NO_CAPACITY = (
    "this TRT-LLM (Feb 2026, PR #11243) exports trtllm_kv_cache_utilization but no block gauges: upgrade "
    "TRT-LLM (PR #12545 adds trtllm_kv_cache_max_blocks/tokens_per_block), or set targets[].capacity_tokens "
    "to maxNumBlocks x tokensPerBlock of its iteration stats (trtllm-serve's JSON /metrics, kvCacheStats)"
)
#: Added for the Triton backend: it has no prefix-cache lookup count (``reused`` alone is no ratio).
ABSENT_TRITON: dict[str, str] = {
    "kvcache_prefix_cache_queries_tokens_total": "the Triton backend exports reused blocks only, no lookups",
    "kvcache_prefix_cache_hits_tokens_total": "the Triton backend exports reused blocks only, no lookups",
    "kvcache_prefix_cache_hit_ratio": "the Triton backend exports reused blocks only, no lookups",
}

#: How far the engine's own fraction may sit from used ÷ max before it is taken as contradicting it.
FRACTION_TOLERANCE = 0.01
#: Fields that count whole blocks or requests (a fraction of one cannot be read off a pool).
WHOLE: frozenset[Field] = frozenset({"max_blocks", "free_blocks", "used_blocks", "running", "waiting"})
#: Default of targets[].label_values_limit (unused here: no label is exported again).
LABEL_VALUES_LIMIT = 32


def needed_sample_names() -> frozenset[str]:
    """Every exposed sample name the adapter reads (the pre-filter keeps exactly these)."""
    names = set(SERVE) | {TRITON_KV, TRITON_REQ}
    names.update(REQUEST_FAMILIES)
    names.update(PREFIX + n for n in REQUEST_FAMILIES)
    return frozenset(names)


NEEDED = needed_sample_names()

_Sample = tuple[str, dict[str, str], float]
_Key = tuple[str, str]  # (model_name, engine)


#: Sample names that prove a TRT-LLM server (trtllm-serve or the Triton backend) when any is on a page.
#: The unprefixed 1.0-1.1 names are generic and not among them: :func:`normalise` recognises those by
#: their ``engine_type`` label.
SIGNATURE: frozenset[str] = frozenset(SERVE) | {TRITON_KV, TRITON_REQ} | {PREFIX + n for n in REQUEST_FAMILIES}


def detect(present: set[str]) -> bool:
    """Whether the sample names on a page prove a TRT-LLM server (any name of :data:`SIGNATURE`)."""
    return bool(present & SIGNATURE)


def detect_generation(present: set[str], triton_kv_types: set[str]) -> str:
    """The metric generation, from the names on the page (table in the module docstring)."""
    if TRITON_KV in present or TRITON_REQ in present:
        return "triton-fraction" if "fraction" in triton_kv_types else "triton"
    if "trtllm_kv_cache_max_blocks" in present:
        return "serve-blocks"
    if "trtllm_kv_cache_utilization" in present:
        return "serve-utilization"
    if any(PREFIX + n in present for n in REQUEST_FAMILIES):
        return "serve-request"
    return "serve-unprefixed"


def normalise(
    samples: Iterable[_Sample], *, label_values_limit: int = LABEL_VALUES_LIMIT, capacity_tokens: int | None = None
) -> EngineScrape | None:
    """Observations per (model_name, engine) from a scrape's samples; None when no TRT-LLM family is present.

    Raises :class:`~sidecar.reasons.ScrapeFailed` when the page is TRT-LLM's but carries no iteration
    statistics (trtllm-serve without ``enable_iter_perf_stats``): nothing on it can be used.
    ``capacity_tokens`` (targets[].capacity_tokens) stands in only where the page has no block gauges
    (generation ``serve-utilization``): an operator's figure never replaces the engine's own. Without
    either, the scrape succeeds with the usage, ``no_capacity`` is counted and the capacity gauges are
    absent (:func:`sidecar.engines.families.no_capacity`). ``label_values_limit`` is accepted for the
    adapters' common signature: no label is exported again.
    """
    serve: dict[_Key, dict[Field, list[float]]] = defaultdict(lambda: defaultdict(list))
    triton: dict[_Key, dict[Field, list[float]]] = defaultdict(lambda: defaultdict(list))
    present: set[str] = set()
    triton_kv_types: set[str] = set()
    unprefixed_mark = False
    rejections = Rejections()
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for name, labels, value in samples:
        if name not in NEEDED:
            continue
        value = as_float(value)
        present.add(name)
        series = (name, frozenset(labels.items()))
        duplicate = series in seen
        seen.add(series)
        if duplicate:  # the page contradicts itself: that field is dropped for that engine
            rejections.add("duplicate_series", name, _show(labels))
        if name in REQUEST_FAMILIES:
            unprefixed_mark = unprefixed_mark or UNPREFIXED_MARK in labels
        elif name in SERVE:
            field = SERVE[name].field
            if field is not None:
                _keep(serve, (labels.get("model_name", ""), "0"), field, name, value, rejections, duplicate)
        elif name in (TRITON_KV, TRITON_REQ):
            which = labels.get(TRITON_KV_LABEL if name == TRITON_KV else TRITON_REQ_LABEL, "")
            if name == TRITON_KV:
                triton_kv_types.add(which)
            field = TRITON.get((name, which))
            if field is not None:
                key = (labels.get("model", ""), labels.get("version", "0"))
                _keep(triton, key, field, f"{name}{{{which}}}", value, rejections, duplicate)
    if not present or (present <= set(REQUEST_FAMILIES) and not unprefixed_mark):
        return None
    generation = detect_generation(present, triton_kv_types)
    if not serve and not triton:
        raise ScrapeFailed(
            "no_capacity",
            f"trtllm ({generation}): only request families, no iteration statistics: start trtllm-serve "
            "with `enable_iter_perf_stats: true` (--extra_llm_api_options) so that trtllm_kv_cache_* exist",
            "trtllm_kv_cache_max_blocks",
        )
    operator = capacity_tokens if generation == "serve-utilization" else None  # never over the page's own
    observations = [
        _observe(key, _folded(fields, SERVE_FOLD), rejections, operator) for key, fields in sorted(serve.items())
    ]
    observations += [_observe(key, _folded(fields, {}), rejections) for key, fields in sorted(triton.items())]
    missing = no_capacity(observations, rejections, field="trtllm_kv_cache_max_blocks", reason=NO_CAPACITY)
    absent = missing | ABSENT | (ABSENT_TRITON if triton else {})
    return EngineScrape(KIND, generation, tuple(observations), rejections.counts, rejections.examples, absent)


#: Counters add up over copies (each process counted its own part); everything else folds by max.
SERVE_FOLD: dict[Field, Literal["sum"]] = {
    family.field: "sum" for family in SERVE.values() if family.type == "counter" and family.field is not None
}


def _usable(field: Field, value: float) -> bool:
    """Whether ``value`` can be what ``field`` measures: a fraction for the usage, a whole number for
    blocks and requests (tokens per block: at least 1), else a count."""
    if not math.isfinite(value):
        return False
    if field == "usage":
        return -USAGE_SLACK <= value <= 1 + USAGE_SLACK
    if field == "tokens_per_block":
        return 1 <= value <= 1 << 20 and value == int(value)
    if field in WHOLE:
        return 0 <= value <= MAX_COUNT and value == int(value)
    return 0 <= value <= MAX_COUNT


def _keep(
    into: dict[_Key, dict[Field, list[float]]],
    key: _Key,
    field: Field,
    where: str,
    value: float,
    rejections: Rejections,
    duplicate: bool = False,
) -> None:
    """Keep a usable value of ``field`` for ``key``; count an unusable one and poison the field (a fold
    without one of its copies could mislead), so that the field is absent for that engine. A duplicate
    series (counted by the caller) poisons it too: folding the copies would double a counter."""
    if _usable(field, value) and not duplicate:
        into[key][field].append(value)
        return
    if not duplicate:
        rejections.add("invalid_value", where, repr(value))
    into[key][field].append(math.nan)


def _show(labels: Mapping[str, str]) -> str:
    """A series' labels for a log line, cut short."""
    text = ",".join(f"{k}={v!r}" for k, v in sorted(labels.items()))
    return "{" + (text if len(text) <= 80 else text[:77] + "...") + "}"


def _folded(fields: Mapping[Field, list[float]], how: Mapping[Field, str]) -> dict[Field, float]:
    """Each field over its copies (max, or sum for counters); a field with an unusable copy is left out."""
    out: dict[Field, float] = {}
    for field, values in fields.items():
        if any(math.isnan(v) for v in values):
            continue
        out[field] = math.fsum(values) if how.get(field) == "sum" else max(values)
    return out


def _observe(
    key: _Key, f: Mapping[Field, float], rejections: Rejections, capacity_tokens: int | None = None
) -> Observation:
    """One engine's Observation from its folded fields: the pool, used tokens, requests, counters.

    ``capacity_tokens``: the operator's capacity, given only for a page without block gauges
    (``serve-utilization``); it makes the pool token by token."""
    tpb, max_blocks, used = f.get("tokens_per_block"), f.get("max_blocks"), f.get("used_blocks")
    pool = _pool(int(max_blocks), int(tpb)) if tpb is not None and max_blocks else None
    if pool is None and capacity_tokens is not None:
        pool = _pool(capacity_tokens, 1)
    if used is not None and max_blocks is not None and used > max_blocks:
        rejections.add("invalid_value", "used_blocks", f"{used:g} used > {max_blocks:g} max blocks")
        used = None
    used_tokens = used * tpb if used is not None and tpb is not None else None
    usage = f.get("usage")
    if usage is not None and used is not None and max_blocks:
        if abs(usage - used / max_blocks) > FRACTION_TOLERANCE:
            rejections.add("invalid_value", "usage", f"engine fraction {usage:g} != used/max {used:g}/{max_blocks:g}")
        usage = None  # used blocks win: the usage is derived from used_tokens
    elif usage is not None:
        usage = min(max(usage, 0.0), 1.0)
    prompt = f.get("prompt_tokens")
    hits = f.get("prefix_hits_tokens")
    return Observation(
        model_name=key[0],
        engine=key[1],
        usage_ratio=usage,
        used_tokens=used_tokens,
        prefix_cache_queries_tokens=prompt if hits is not None else None,
        prefix_cache_hits_tokens=hits,
        requests_running=f.get("running"),
        requests_waiting=f.get("waiting"),
        prompt_tokens=prompt,
        generation_tokens=f.get("generation_tokens"),
        pool=pool,
    )


def _pool(max_blocks: int, tokens_per_block: int) -> KVPool:
    """The pool as the page gives it: max blocks of tokens_per_block tokens, no null block.

    ``hybrid`` stays False: the page cannot tell a model with several window pools (module docstring).
    """
    return KVPool(
        num_blocks=max_blocks,
        block_size=tokens_per_block,
        null_blocks=0,
        capacity_tokens=max_blocks * tokens_per_block,
        memory_lever="free_gpu_memory_fraction",
        info={"block_size": str(tokens_per_block), "num_gpu_blocks": str(max_blocks)},
    )
