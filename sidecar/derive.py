"""Observations -> capacity gauges. Pure: time comes from the samples, never the wall clock.

Reads only the typed fields of :class:`~sidecar.observation.Observation` and its
:class:`~sidecar.observation.KVPool`, whatever the engine. Each function states its formula and
where it comes from. For an engine that exports a usage fraction only (vLLM), the block arithmetic
follows vLLM's ``BlockPool`` (``vllm/v1/core/block_pool.py``): block 0 is a permanent null block,
so ``usage = 1 - free_blocks / (num_gpu_blocks - 1)`` and a partly filled block counts as used. An
engine that counts its used tokens (SGLang, TRT-LLM) gets used/free from them directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from .metrics import CACHE_SETTINGS, Gauge, MetricDoc, entry
from .observation import USAGE_SLACK, KVPool, Observation


def readable_usage(usage: float | None) -> float | None:
    """The engine's usage fraction, or None when it cannot be one.

    vLLM's ``BlockPool.get_usage()`` is ``1 − free ÷ total``, within [0, 1] up to float
    error (:data:`~sidecar.observation.USAGE_SLACK`), which is clamped. A value well outside
    (1.7, −0.3) is not a reading of the cache: it is dropped like NaN rather than clamped, since a
    clamped 1.7 would read as a full cache and page.
    """
    if usage is None or not -USAGE_SLACK <= usage <= 1 + USAGE_SLACK:
        return None
    return min(max(usage, 0.0), 1.0)


def used_free_tokens(usage: float, pool: KVPool) -> tuple[int, int] | None:
    """``used = round(usage × (blocks − 1)) × block_size``, ``free = (blocks − 1) × block_size − used``.

    Inverts ``BlockPool.get_usage()``; vLLM allocates whole blocks, so used is a
    multiple of the block size. None for hybrid pools or unknown sizes.
    """
    if pool.hybrid or pool.usable_blocks is None or pool.block_size is None or pool.usable_blocks == 0:
        return None
    used_blocks = min(max(round(usage * pool.usable_blocks), 0), pool.usable_blocks)
    used = used_blocks * pool.block_size
    return used, pool.usable_blocks * pool.block_size - used


def held_free_tokens(used: float, evictable: float | None, pool: KVPool) -> tuple[float, float] | None:
    """For an engine that counts its used tokens (SGLang, TRT-LLM): ``held = used − evictable``,
    ``free = usable − held``, held clamped into ``[0, usable]``.

    Tokens the engine can evict without preempting a request are room a new request can take, so
    they count as free (SGLang's radix cache: ``available_size() + evictable_size()`` is what its
    scheduler admits against, ``python/sglang/srt/managers/scheduler.py``). ``usable`` is
    ``(num_blocks − null_blocks) × block_size``, else the engine's capacity figure. None for hybrid
    pools or unknown sizes.
    """
    usable = pool.usable_tokens
    if usable is None and not pool.hybrid:
        usable = pool.capacity_tokens
    if usable is None or usable <= 0:
        return None
    held = min(max(used - (evictable or 0.0), 0.0), float(usable))
    return held, usable - held


def watermark_headroom_tokens(used_tokens: float, pool: KVPool, watermark: float) -> float:
    """Tokens that can still be allocated without pushing usage above ``watermark``.

    ``max(0, ⌊watermark × (blocks − 1)⌋ × block_size − used)``: the largest whole
    number of blocks whose usage stays at or below the watermark, minus what is held.
    A pool known only by its token capacity: ``max(0, ⌊watermark × capacity⌋ − used)``.
    """
    if pool.usable_blocks is not None and pool.block_size is not None:
        allowed = math.floor(watermark * pool.usable_blocks + 1e-9) * pool.block_size
    else:
        assert pool.capacity_tokens is not None
        allowed = math.floor(watermark * pool.capacity_tokens + 1e-9)
    return max(0, allowed - used_tokens)


def counter_increase(points: Sequence[tuple[float, float]]) -> float:
    """Reset-safe increase of a counter over ``(t, value)`` points, as PromQL's ``increase`` counts it.

    A drop is a restart: the new value is what was counted since (Prometheus
    ``rate()`` semantics), so a vLLM restart never yields a negative or huge value.
    """
    total = 0.0
    for (_, prev), (_, cur) in zip(points, points[1:], strict=False):
        total += cur - prev if cur >= prev else cur
    return total


def window(history: Sequence[tuple[float, Observation]], now: float, seconds: float) -> list[tuple[float, Observation]]:
    """The samples with ``now − seconds ≤ t ≤ now``."""
    return [(t, o) for t, o in history if now - seconds <= t <= now]


def _series(samples: Sequence[tuple[float, Observation]], attr: str) -> list[tuple[float, float]]:
    return [(t, v) for t, o in samples if (v := getattr(o, attr)) is not None]


def prefix_cache_hit_ratio(samples: Sequence[tuple[float, Observation]]) -> float | None:
    """``increase(hits) / increase(queries)`` over the window (tokens; vLLM V1 counters).

    V0 exports only ``vllm:gpu_prefix_cache_hit_rate`` (a block hit rate, −1 when
    prefix caching is off): used as is when it is all there is. None when prefix
    caching is disabled (``enable_prefix_caching="False"``) or nothing was queried.
    Source: vLLM's ``docs/usage/metrics.md``; docs/vllm-metrics.md ("Prefix-cache counters").
    """
    if not samples:
        return None
    latest = samples[-1][1]
    if latest.pool is not None and latest.pool.prefix_caching is False:
        return None
    queries = _series(samples, "prefix_cache_queries_tokens")
    hits = _series(samples, "prefix_cache_hits_tokens")
    if len(queries) >= 2 and len(hits) >= 2:
        dq = counter_increase(queries)
        if dq <= 0:
            return None
        return min(max(counter_increase(hits) / dq, 0.0), 1.0)
    gauge = latest.prefix_cache_hit_rate_gauge
    if gauge is not None and gauge >= 0:
        return min(gauge, 1.0)
    return None


def preemptions_per_second(samples: Sequence[tuple[float, Observation]]) -> float | None:
    """``increase(vllm:num_preemptions_total) / span`` over the window (reset-safe)."""
    points = _series(samples, "preemptions")
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return counter_increase(points) / (points[-1][0] - points[0][0])


def waiting_by_reason(obs: Observation) -> dict[str, float]:
    """vLLM's reasons when exported (``capacity``/``deferred``), else ``{"all": total}``."""
    if obs.requests_waiting_by_reason:
        return dict(obs.requests_waiting_by_reason)
    if obs.requests_waiting is not None:
        return {"all": obs.requests_waiting}
    return {}


@dataclass(frozen=True)
class Derived:
    """Every base gauge derived for one (model_name, engine) at one instant. None = not exported."""

    usage_ratio: float | None = None
    #: the engine's capacity figure (not for hybrid pools)
    capacity_tokens: int | None = None
    used_tokens: float | None = None
    free_tokens: float | None = None
    watermark_headroom_tokens: float | None = None
    prefix_cache_hit_ratio: float | None = None
    preemptions_per_second: float | None = None
    requests_running: float | None = None
    requests_waiting: Mapping[str, float] = field(default_factory=dict)
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    preemptions: float | None = None
    #: requests refused at admission, by reason (counters)
    admission_rejections: Mapping[str, float] = field(default_factory=dict)
    #: requests preempted, by the engine's reason (counters; only "kv_full" is KV capacity pressure)
    preemptions_by_reason: Mapping[str, float] = field(default_factory=dict)
    #: the offload tiers' usage fraction by tier (vLLM: "cpu")
    offload_usage: Mapping[str, float] = field(default_factory=dict)
    engine_asleep: bool | None = None
    #: the pool the figures stand on: the latest observation's, or for a hybrid vLLM pool with a
    #: group-aware capacity its token view (:func:`hybrid_token_view`), which the forecast sizes on
    pool: KVPool | None = None
    #: the engine's pool is hybrid (``pool`` is then its token view, whose own flag is off)
    hybrid: bool = False


def usage_split(obs: Observation, pool: KVPool | None) -> tuple[float | None, float | None, float | None]:
    """``(usage, used, free)`` of one observation.

    An engine that counts its used tokens (``obs.used_tokens``) gets used and free from them
    (:func:`held_free_tokens`) and, when it exports no usage fraction, ``usage = held ÷ usable``;
    else vLLM's BlockPool arithmetic on its usage fraction (:func:`used_free_tokens`).
    """
    usage = readable_usage(obs.usage_ratio)
    if pool is None:
        return usage, None, None
    if obs.used_tokens is not None:
        split = held_free_tokens(obs.used_tokens, obs.evictable_tokens, pool)
        if split is None:
            return usage, None, None
        held, free = split
        if usage is None:
            usage = held / (held + free)
        return usage, held, free
    if usage is None:
        return None, None, None
    blocks = used_free_tokens(usage, pool)
    return (usage, None, None) if blocks is None else (usage, *blocks)


def hybrid_token_view(pool: KVPool) -> KVPool | None:
    """A hybrid pool seen in tokens: ``capacity_tokens`` (vLLM's group-aware ``kv_cache_size_tokens``)
    one-token blocks, of which ``⌊capacity × (B − 1) ÷ B⌋`` are usable. None without that figure.

    On a hybrid model (sliding-window, mamba) ``block_size`` is the minimum over the KV-cache groups
    (vllm issue #51163), so ``num_gpu_blocks × block_size`` is no capacity; ``kv_cache_size_tokens``
    is (PR #42206: ``get_kv_cache_capacity`` in ``vllm/v1/core/kv_cache_utils.py``, the figure of the
    start-up log line "GPU KV cache size: N tokens"). It grows in proportion to the ``B =
    num_gpu_blocks`` blocks the groups share, and usage is ``held blocks ÷ (B − 1)``
    (``BlockPool.get_usage``), so ``usage × usable`` is the capacity the running requests hold, in
    the tokens the capacity is counted in. The view is token-granular (``block_size`` 1, no null
    block): the forecast and the advice then size in tokens, to within one of vLLM's blocks.
    """
    capacity = pool.capacity_tokens
    if not pool.hybrid or capacity is None or capacity <= 0:
        return None
    blocks = pool.num_blocks
    usable = capacity * (blocks - 1) // blocks if blocks and blocks > 1 else capacity
    return replace(pool, num_blocks=usable, block_size=1, null_blocks=0, hybrid=False)


def derive(history: Sequence[tuple[float, Observation]], now: float, *, window_s: float, watermark: float) -> Derived:
    """The gauges for one key from its history (oldest first; the last sample is current).

    A hybrid vLLM pool that gives its group-aware capacity is derived on its token view
    (:func:`hybrid_token_view`): capacity, used, free, headroom and the advice then exist for it.
    """
    t_last, obs = history[-1]
    pool = obs.pool
    view = hybrid_token_view(pool) if pool is not None and obs.used_tokens is None else None
    if view is not None:
        pool = view
    in_window = window(history, now, window_s)
    usage, used, free = usage_split(obs, pool)
    headroom = None if used is None or pool is None else watermark_headroom_tokens(used, pool, watermark)
    return Derived(
        usage_ratio=usage,
        capacity_tokens=None if pool is None or pool.hybrid else pool.capacity_tokens,
        used_tokens=used,
        free_tokens=free,
        watermark_headroom_tokens=headroom,
        prefix_cache_hit_ratio=prefix_cache_hit_ratio(in_window),
        preemptions_per_second=preemptions_per_second(in_window),
        requests_running=obs.requests_running,
        requests_waiting=waiting_by_reason(obs),
        prefix_cache_queries_tokens=obs.prefix_cache_queries_tokens,
        prefix_cache_hits_tokens=obs.prefix_cache_hits_tokens,
        preemptions=obs.preemptions,
        admission_rejections=dict(obs.admission_rejections_by_reason),
        preemptions_by_reason=dict(obs.preemptions_by_reason),
        offload_usage={tier: min(max(u, 0.0), 1.0) for tier, u in obs.offload_usage_by_tier.items()},
        engine_asleep=None if obs.sleep_state is None else obs.asleep,
        pool=pool,
        hybrid=obs.pool is not None and obs.pool.hybrid,
    )


#: The base rows, looked up once (a misspelt name fails at import).
USAGE_RATIO = entry("kvcache_usage_ratio")
CAPACITY_TOKENS = entry("kvcache_capacity_tokens")
USED_TOKENS = entry("kvcache_used_tokens")
FREE_TOKENS = entry("kvcache_free_tokens")
HEADROOM_TOKENS = entry("kvcache_watermark_headroom_tokens")
PREFIX_QUERIES = entry("kvcache_prefix_cache_queries_tokens_total")
PREFIX_HITS = entry("kvcache_prefix_cache_hits_tokens_total")
PREEMPTIONS = entry("kvcache_preemptions_total")
ADMISSION_REJECTIONS = entry("kvcache_admission_rejections_total")
PREEMPTIONS_BY_REASON = entry("kvcache_preemptions_by_reason_total")
OFFLOAD_USAGE = entry("kvcache_offload_usage_ratio")
PREFIX_HIT_RATIO = entry("kvcache_prefix_cache_hit_ratio")
PREEMPTIONS_PER_SECOND = entry("kvcache_preemptions_per_second")
REQUESTS_RUNNING = entry("kvcache_requests_running")
REQUESTS_WAITING = entry("kvcache_requests_waiting")
ENGINE_ASLEEP = entry("kvcache_engine_asleep")
SERVER_INFO = entry("kvcache_server_info")
GPU_MEMORY_UTILIZATION = entry("kvcache_gpu_memory_utilization")


def base_values(d: Derived, engine_kind: str | None, generation: str | None) -> dict[MetricDoc, Gauge]:
    """The base gauges of one engine, keyed by their catalogue rows, in the page's order.

    ``kvcache_server_info`` shows the engine's kind, the metric generation and the pool's
    :data:`~sidecar.metrics.CACHE_SETTINGS` as the engine reported them ("" when it did not).
    """
    pool = d.pool
    info = {} if pool is None else pool.info
    settings = tuple(info.get(name, "") for name in CACHE_SETTINGS)
    hybrid = "true" if pool is not None and (pool.hybrid or d.hybrid) else "false"
    return {
        USAGE_RATIO: d.usage_ratio,
        CAPACITY_TOKENS: d.capacity_tokens,
        USED_TOKENS: d.used_tokens,
        FREE_TOKENS: d.free_tokens,
        HEADROOM_TOKENS: d.watermark_headroom_tokens,
        PREFIX_QUERIES: d.prefix_cache_queries_tokens,
        PREFIX_HITS: d.prefix_cache_hits_tokens,
        PREEMPTIONS: d.preemptions,
        PREEMPTIONS_BY_REASON: {(reason,): n for reason, n in sorted(d.preemptions_by_reason.items())} or None,
        OFFLOAD_USAGE: {(tier,): u for tier, u in sorted(d.offload_usage.items())} or None,
        ADMISSION_REJECTIONS: {(reason,): n for reason, n in sorted(d.admission_rejections.items())} or None,
        PREFIX_HIT_RATIO: d.prefix_cache_hit_ratio,
        PREEMPTIONS_PER_SECOND: d.preemptions_per_second,
        REQUESTS_RUNNING: d.requests_running,
        REQUESTS_WAITING: {(reason,): n for reason, n in sorted(d.requests_waiting.items())},
        ENGINE_ASLEEP: None if d.engine_asleep is None else 1.0 if d.engine_asleep else 0.0,
        SERVER_INFO: {(engine_kind or "", generation or "", *settings, hybrid): 1.0},
        GPU_MEMORY_UTILIZATION: None if pool is None else pool.memory_fraction,
    }
