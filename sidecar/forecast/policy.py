"""The advice policy: from the window's peak demand and the pool, what to suggest and what to withhold.

One pure function, :func:`advise`, over plain numbers: the pool vLLM runs with now
(:class:`Pool`), what the capacity model knows about the served model
(:class:`ServedModel`, absent without ``model.config``) and the policy's settings
(:class:`AdviceSettings`). It decides

- the *memory mode*: vLLM takes its KV budget from ``kv_cache_memory_bytes`` when
  that is set and ignores ``gpu_memory_utilization`` then (``CacheConfig`` in
  ``vllm/config/cache.py``; ``Worker.determine_available_memory`` in
  ``vllm/v1/worker/gpu_worker.py``), so the suggestion names the setting that acts;
- the suggested setting, the largest pool the GPU allows (``C_max``), the
  shortfall and replicas when even that pool is too small, and the cheaper
  *levers* (fp8 KV cache, fewer KV heads, a shorter ``max_model_len``);
- the top :class:`~sidecar.forecast.recommendation.Recommendation`;
- the *warm-up gate*: a peak above target is evidence at once, but the absence
  of peaks is evidence only after a whole ``forecast.peak_window`` has been
  watched. Until then nothing that lowers memory is returned: neither a
  ``lower_*`` recommendation nor a suggested setting below the current one (a
  restarted sidecar next to a quiet vLLM must not advise cutting its cache).

:class:`Advice` holds only what the policy allows; a field is ``None`` (or the
levers empty) when there is nothing to say. Formulas: docs/forecast.md
("Suggested memory", "Shortfall and levers", ``kvcache_recommendation_info``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..capacity.budget import NonKVBytes
from .recommendation import Recommendation, recommend
from .sizing import (
    capacity_at_utilization,
    capacity_shortfall_tokens,
    capacity_with_kv_dtype,
    capacity_with_kv_heads,
    infer_gpu_memory,
    max_model_len_for_concurrency,
    suggest_gpu_memory_utilization,
    suggest_kv_cache_memory_bytes,
    suggested_replicas,
)


@dataclass(frozen=True)
class Pool:
    """The KV pool vLLM runs with now, from its gauges and ``cache_config_info`` labels."""

    #: vLLM's own capacity figure, null block included (unknown for hybrid models: then there is no advice)
    capacity_tokens: float
    block_size: int
    #: the ``kv_cache_memory_bytes`` label when set (then it, not the utilization, sizes the pool)
    kv_cache_memory_bytes: float | None = None
    #: the ``gpu_memory_utilization`` label
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    #: requests in the running batch (for the ``max_model_len`` lever)
    requests_running: float | None = None


@dataclass(frozen=True)
class ServedModel:
    """What the capacity model (``model.config``) says about the served model on one rank."""

    bytes_per_token: float
    kv_dtype_bytes: float
    kv_heads: int
    attention: str  # "mla" has a single latent "head": no fewer-heads lever
    tensor_parallel: int
    #: ``model.gpu_memory`` when configured (bytes)
    gpu_memory_bytes: float | None
    #: The non-KV bytes on one rank, evaluated only when the advice needs them (an estimate can fail
    #: for a model the capacity model cannot size; that must not matter when nothing reads it).
    non_kv_bytes: Callable[[], NonKVBytes]


@dataclass(frozen=True)
class AdviceSettings:
    """The settings the policy reads (``thresholds:`` and ``forecast:`` sections)."""

    target_usage: float  # thresholds.target_usage
    utilization_min: float  # forecast.utilization_min
    utilization_max: float  # forecast.utilization_max
    peak_window_s: float  # forecast.peak_window


@dataclass(frozen=True)
class Advice:
    """What the policy allows to be said; None = withheld or not computable."""

    recommendation: Recommendation
    #: (basis, value): basis "configured" or "inferred" GPU memory
    suggested_gpu_memory_utilization: tuple[str, float] | None = None
    suggested_kv_cache_memory_bytes: int | None = None
    capacity_shortfall_tokens: int | None = None
    suggested_replicas: int | None = None
    #: lever -> capacity it gives, in a fixed order: fp8_kv_cache, half_kv_heads, max_model_len
    lever_capacity_tokens: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Memory:
    """The suggested memory setting and the largest pool the GPU allows (``C_max``), before the gate."""

    utilization: tuple[str, float] | None = None
    kv_cache_memory_bytes: int | None = None
    max_capacity_tokens: float | None = None


_NO_MEMORY = _Memory()  # nothing to suggest: the inputs for the memory setting are missing


def advise(
    *, peak_demand_tokens: float, watched_s: float, pool: Pool, model: ServedModel | None, settings: AdviceSettings
) -> Advice:
    """Suggested memory setting, shortfall, replicas, levers and the top recommendation.

    ``peak_demand_tokens`` is the largest demand of the peak window; ``watched_s`` how long
    this engine has been watched (the warm-up gate). Without a pool size or a peak there is
    nothing to advise: the caller says ``none/insufficient_data`` then.
    """
    c0, bs, peak = pool.capacity_tokens, pool.block_size, peak_demand_tokens
    bpt: float | None = model.bytes_per_token if model is not None else None
    if bpt is None and pool.kv_cache_memory_bytes:
        bpt = pool.kv_cache_memory_bytes / c0  # vLLM's own pool: budget ÷ tokens (exact up to the floor to blocks)
    memory = _memory(peak, c0, bs, bpt, pool, model, settings)

    shortfall = replicas = None
    levers: dict[str, float] = {}
    c_max = memory.max_capacity_tokens
    if c_max is not None:
        missing = capacity_shortfall_tokens(
            peak_demand_tokens=peak, target_usage=settings.target_usage, max_capacity_tokens=c_max, block_size=bs
        )
        if missing > 0 and c_max > bs:
            shortfall = missing
            replicas = suggested_replicas(
                peak_demand_tokens=peak,
                target_usage=settings.target_usage,
                capacity_per_replica_tokens=c_max,
                block_size=bs,
            )
            levers = _levers(c_max, bs, pool, model)

    rec = recommend(
        asleep=False,
        peak_demand_tokens=peak,
        capacity_tokens=c0,
        block_size=bs,
        target_usage=settings.target_usage,
        max_capacity_tokens=c_max,
        memory_mode="kv_cache_memory_bytes" if pool.kv_cache_memory_bytes else "gpu_memory_utilization",
        kv_dtype_bytes=model.kv_dtype_bytes if model is not None else None,
        max_model_len=pool.max_model_len,
    )
    utilization, kv_bytes = memory.utilization, memory.kv_cache_memory_bytes
    if watched_s < settings.peak_window_s:  # warming up: nothing that lowers memory yet
        if rec.action.startswith("lower_"):
            rec = Recommendation("none", "insufficient_data")
        u0 = pool.gpu_memory_utilization
        if utilization is not None and u0 and utilization[1] < u0:
            utilization = None
        if kv_bytes is not None and pool.kv_cache_memory_bytes and kv_bytes < pool.kv_cache_memory_bytes:
            kv_bytes = None
    return Advice(
        rec,
        suggested_gpu_memory_utilization=utilization,
        suggested_kv_cache_memory_bytes=kv_bytes,
        capacity_shortfall_tokens=shortfall,
        suggested_replicas=replicas,
        lever_capacity_tokens=levers,
    )


def _memory(
    peak: float, c0: float, bs: int, bpt: float | None, pool: Pool, model: ServedModel | None, settings: AdviceSettings
) -> _Memory:
    """The setting that sizes vLLM's pool, at which the peak would sit at target, and ``C_max``."""
    target, hi = settings.target_usage, settings.utilization_max
    kv_bytes, u0, max_len = pool.kv_cache_memory_bytes, pool.gpu_memory_utilization, pool.max_model_len
    if kv_bytes and bpt:
        # The most KV the GPU can give: its share at the upper bound minus weights, activation,
        # non-torch and CUDA graphs, which stay on the GPU when vLLM takes its KV budget from
        # kv_cache_memory_bytes (docs/capacity.md, "The budget"). Unknown without the GPU's memory
        # and the model: then the suggestion is not capped. The budget vLLM runs with now evidently
        # fits, whatever the estimates of the other terms say.
        max_bytes = None
        if model is not None and model.gpu_memory_bytes:
            max_bytes = max(kv_bytes, model.gpu_memory_bytes * hi - model.non_kv_bytes().total)
        suggested = suggest_kv_cache_memory_bytes(
            peak_demand_tokens=peak,
            target_usage=target,
            bytes_per_token=bpt,
            block_size=bs,
            max_model_len=max_len,
            max_bytes=max_bytes,
        )
        # whole blocks, as vLLM sizes the pool (num_blocks = ⌊bytes ÷ page⌋, get_num_blocks in
        # vllm/v1/core/kv_cache_utils.py)
        c_max = None if max_bytes is None else math.floor(max_bytes / (bs * bpt)) * bs
        return _Memory(kv_cache_memory_bytes=suggested, max_capacity_tokens=c_max)
    if kv_bytes or not (u0 and bpt and model is not None):
        return _NO_MEMORY
    memory, basis = gpu_memory_of(model, c0, bpt, u0)
    if not memory:
        return _NO_MEMORY
    u = suggest_gpu_memory_utilization(
        u0=u0,
        capacity_tokens=c0,
        peak_demand_tokens=peak,
        target_usage=target,
        bytes_per_token=bpt,
        gpu_memory_bytes=memory,
        block_size=bs,
        max_model_len=max_len,
        lo=settings.utilization_min,
        hi=hi,
    )
    c_max = capacity_at_utilization(
        u=hi, u0=u0, capacity_tokens=c0, bytes_per_token=bpt, gpu_memory_bytes=memory, block_size=bs
    )
    return _Memory(utilization=(basis, u), max_capacity_tokens=c_max)


def gpu_memory_of(model: ServedModel, c0: float, bpt: float, u0: float) -> tuple[float, str]:
    """M: the configured GPU memory, else inferred from the pool (:func:`~sidecar.forecast.sizing.infer_gpu_memory`)."""
    if model.gpu_memory_bytes:
        return float(model.gpu_memory_bytes), "configured"
    non_kv = model.non_kv_bytes()
    return infer_gpu_memory(
        capacity_tokens=c0,
        bytes_per_token=bpt,
        weights_bytes=non_kv.weights,
        activation_bytes=non_kv.activation,
        non_torch_bytes=non_kv.non_torch,
        u0=u0,
        cudagraph_bytes=non_kv.cudagraph,
    ), "inferred"


def _levers(c_max: float, bs: int, pool: Pool, model: ServedModel | None) -> dict[str, float]:
    """Capacity each cheaper lever would give the largest pool, when it applies."""
    levers: dict[str, float] = {}
    if model is not None and model.kv_dtype_bytes > 1:
        levers["fp8_kv_cache"] = capacity_with_kv_dtype(
            capacity_tokens=c_max, kv_dtype_bytes=model.kv_dtype_bytes, block_size=bs
        )
    if model is not None and model.kv_heads > 1 and model.attention != "mla":
        levers["half_kv_heads"] = capacity_with_kv_heads(
            capacity_tokens=c_max,
            kv_heads=model.kv_heads,
            new_kv_heads=max(1, model.kv_heads // 2),
            tensor_parallel=model.tensor_parallel,
            block_size=bs,
        )
    running = pool.requests_running
    if running and running >= 1:
        # the longest max_model_len at which today's running requests all fit at full length;
        # a lever only when it is below the current one (lowering is the lever)
        shorter = max_model_len_for_concurrency(
            usable_blocks=max(0, int(c_max // bs) - 1), block_size=bs, concurrency=int(running)
        )
        if pool.max_model_len is None or shorter < pool.max_model_len:
            levers["max_model_len"] = shorter
    return levers
