"""Observations -> capacity gauges. Pure: time comes from the samples, never the wall clock.

Each function states its formula and where it comes from. The block arithmetic
follows vLLM's ``BlockPool`` (``vllm/v1/core/block_pool.py``): block 0 is a
permanent null block, so ``usage = 1 - free_blocks / (num_gpu_blocks - 1)``
and a partly filled block counts as used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .observation import Observation

#: Labels of vLLM's cache-config info that mark a hybrid KV layout, for which
#: ``num_gpu_blocks × block_size`` is not a token capacity (vllm issue #51163,
#: PR #42206). ``mamba_cache_dtype``/``mamba_ssm_cache_dtype``/``mamba_cache_mode``
#: are deliberately absent: they carry defaults on plain models (seen on vLLM 0.32).
HYBRID_SIGNS: tuple[tuple[str, str], ...] = (
    ("sliding_window", "None"),
    ("mamba_page_size_padded", "None"),
    ("mamba_block_size", "None"),
)


def _label_int(cache_config: Mapping[str, str], key: str) -> int | None:
    raw = cache_config.get(key)
    if raw is None or raw == "None":
        return None
    try:
        return int(float(raw))
    except (ValueError, OverflowError):  # the adapter refuses such pages; never a traceback here
        return None


def is_hybrid(cache_config: Mapping[str, str]) -> bool:
    """True when the cache config shows sliding-window, mamba or attention-free layers."""
    if cache_config.get("is_attention_free") == "True":
        return True
    return any(cache_config.get(key, absent) != absent for key, absent in HYBRID_SIGNS)


@dataclass(frozen=True)
class PoolSize:
    """The KV pool as vLLM reports it in ``vllm:cache_config_info``."""

    num_gpu_blocks: int | None
    block_size: int | None
    #: vLLM's own token capacity (null block included); None for hybrid models.
    capacity_tokens: int | None
    hybrid: bool

    @property
    def usable_blocks(self) -> int | None:
        return None if self.num_gpu_blocks is None else max(self.num_gpu_blocks - 1, 0)


def pool_size(cache_config: Mapping[str, str]) -> PoolSize:
    """Capacity from the info labels.

    ``kv_cache_size_tokens`` (vLLM PR #42206, group-aware) when present, else
    ``num_gpu_blocks × block_size`` (``vllm/v1/core/kv_cache_utils.py``
    ``_report_kv_cache_config``); neither for hybrid models, where
    ``block_size`` is the minimum over groups and the product is meaningless.
    """
    blocks = _label_int(cache_config, "num_gpu_blocks")
    block_size = _label_int(cache_config, "block_size")
    hybrid = is_hybrid(cache_config)
    capacity = None
    if not hybrid:
        capacity = _label_int(cache_config, "kv_cache_size_tokens")
        if capacity is None and blocks is not None and block_size is not None:
            capacity = blocks * block_size
    return PoolSize(blocks, block_size, capacity, hybrid)


#: Float slack around [0, 1]: vLLM computes usage as ``1 − free ÷ total`` (``BlockPool.get_usage``).
_USAGE_SLACK = 1e-9


def readable_usage(usage: float | None) -> float | None:
    """vLLM's usage fraction, or None when it cannot be one.

    ``BlockPool.get_usage()`` is ``1 − free ÷ total``, within [0, 1] up to float
    error, which is clamped. A value well outside (1.7, −0.3) is not a reading of
    the cache: it is dropped like NaN rather than clamped, since a clamped 1.7
    would read as a full cache and page.
    """
    if usage is None or not -_USAGE_SLACK <= usage <= 1 + _USAGE_SLACK:
        return None
    return min(max(usage, 0.0), 1.0)


def used_free_tokens(usage: float, pool: PoolSize) -> tuple[int, int] | None:
    """``used = round(usage × (blocks − 1)) × block_size``, ``free = (blocks − 1) × block_size − used``.

    Inverts ``BlockPool.get_usage()``; vLLM allocates whole blocks, so used is a
    multiple of the block size. None for hybrid pools or unknown sizes.
    """
    if pool.hybrid or pool.usable_blocks is None or pool.block_size is None or pool.usable_blocks == 0:
        return None
    used_blocks = min(max(round(usage * pool.usable_blocks), 0), pool.usable_blocks)
    used = used_blocks * pool.block_size
    return used, pool.usable_blocks * pool.block_size - used


def watermark_headroom_tokens(used_tokens: int, pool: PoolSize, watermark: float) -> int:
    """Tokens that can still be allocated without pushing usage above ``watermark``.

    ``max(0, ⌊watermark × (blocks − 1)⌋ × block_size − used)``: the largest whole
    number of blocks whose usage stays at or below the watermark, minus what is held.
    """
    assert pool.usable_blocks is not None and pool.block_size is not None
    allowed = math.floor(watermark * pool.usable_blocks + 1e-9) * pool.block_size
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
    if latest.cache_config.get("enable_prefix_caching") == "False":
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
    """Every gauge derived for one (model_name, engine) at one instant. None = not exported."""

    usage_ratio: float | None = None
    capacity_tokens: int | None = None
    used_tokens: int | None = None
    free_tokens: int | None = None
    watermark_headroom_tokens: int | None = None
    prefix_cache_hit_ratio: float | None = None
    preemptions_per_second: float | None = None
    requests_running: float | None = None
    requests_waiting: Mapping[str, float] = field(default_factory=dict)
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    preemptions: float | None = None
    engine_asleep: bool | None = None
    pool: PoolSize | None = None


def derive(history: Sequence[tuple[float, Observation]], now: float, *, window_s: float, watermark: float) -> Derived:
    """The gauges for one key from its history (oldest first; the last sample is current)."""
    t_last, obs = history[-1]
    pool = pool_size(obs.cache_config)
    in_window = window(history, now, window_s)
    used = free = headroom = None
    usage = readable_usage(obs.usage_ratio)
    if usage is not None:
        split = used_free_tokens(usage, pool)
        if split is not None:
            used, free = split
            headroom = watermark_headroom_tokens(used, pool, watermark)
    return Derived(
        usage_ratio=usage,
        capacity_tokens=pool.capacity_tokens,
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
        engine_asleep=None if obs.sleep_state is None else obs.asleep,
        pool=pool,
    )
