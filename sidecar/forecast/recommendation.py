"""The one top recommendation per engine: ``kvcache_recommendation_info{action, reason} = 1``.

Both label values come from the fixed tuples below, so the series' cardinality
is bounded (len(ACTIONS) × len(REASONS) at most, in practice one per engine)
and dashboards and alert rules can match on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sizing import min_capacity_tokens_for_max_model_len, required_capacity_tokens

#: Every value the ``action`` label can take.
ACTIONS: tuple[str, ...] = (
    "none",
    "raise_gpu_memory_utilization",
    "lower_gpu_memory_utilization",
    # vLLM ignores gpu_memory_utilization when kv_cache_memory_bytes is set, so the
    # advice then names the setting that does act (``Worker.determine_available_memory``).
    "raise_kv_cache_memory_bytes",
    "lower_kv_cache_memory_bytes",
    # the same advice for the other engines' memory levers (sidecar.forecast.policy.LEVERS): SGLang's
    # --mem-fraction-static (a share of TOTAL memory, as vLLM's) and TensorRT-LLM's
    # free_gpu_memory_fraction (a share of the memory FREE after the weights)
    "raise_mem_fraction_static",
    "lower_mem_fraction_static",
    "raise_free_gpu_memory_fraction",
    "lower_free_gpu_memory_fraction",
    "enable_fp8_kv_cache",
    "add_replicas",
    "lower_max_model_len",
)

#: Every value the ``reason`` label can take, with its meaning.
REASONS: dict[str, str] = {
    "engine_asleep": "vLLM is in sleep mode; forecasts and advice are suppressed",
    "insufficient_data": "no peak demand or capacity known yet (warming up, hybrid model, unknown pool)",
    "within_target": "the window's peak sits near target_usage; nothing to change",
    "peak_above_target": "the peak exceeds target_usage + raise_margin and a larger pool fits the upper bound",
    "peak_below_target": "the peak is below target_usage - lower_margin: memory can be given back",
    "shortfall_fp8_covers": "even the upper bound cannot hold the peak at target, but an fp8 KV cache there can",
    "shortfall_at_upper_bound": "even the upper bound (with fp8 if available) cannot hold the peak at target",
    "max_model_len_blocks_lowering": (
        "the peak would allow a smaller pool, but one max_model_len request must still fit"
    ),
    "no_memory_lever": (
        "the engine has no memory setting the sidecar can size (TGI, llama.cpp, or its value is not on the "
        "page): replicas are the only lever"
    ),
}

#: The setting that sizes the pool, as ``recommend`` names it in ``raise_<mode>``/``lower_<mode>``;
#: "none": no setting the sidecar can size (then only ``add_replicas`` can be advised).
MEMORY_MODES = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "mem_fraction_static",
    "free_gpu_memory_fraction",
    "none",
)

#: What each ``action`` says to a reader (dashboards' value mappings, the report): never the raw enum.
ACTION_TEXT: dict[str, str] = {
    "none": "nothing to change",
    "raise_gpu_memory_utilization": "raise --gpu-memory-utilization",
    "lower_gpu_memory_utilization": "lower --gpu-memory-utilization",
    "raise_kv_cache_memory_bytes": "raise --kv-cache-memory-bytes",
    "lower_kv_cache_memory_bytes": "lower --kv-cache-memory-bytes",
    "raise_mem_fraction_static": "raise --mem-fraction-static (SGLang)",
    "lower_mem_fraction_static": "lower --mem-fraction-static (SGLang)",
    "raise_free_gpu_memory_fraction": "raise free_gpu_memory_fraction (TensorRT-LLM; a share of FREE memory)",
    "lower_free_gpu_memory_fraction": "lower free_gpu_memory_fraction (TensorRT-LLM; a share of FREE memory)",
    "enable_fp8_kv_cache": "enable an fp8 KV cache (--kv-cache-dtype fp8)",
    "add_replicas": "add replicas",
    "lower_max_model_len": "lower --max-model-len",
}

#: What each ``reason`` says to a reader, short enough for a table cell.
REASON_TEXT: dict[str, str] = {
    "engine_asleep": "vLLM is asleep",
    "insufficient_data": "not enough data yet",
    "within_target": "the peak sits near the target",
    "peak_above_target": "the peak is above the target",
    "peak_below_target": "the peak is well below the target: memory can be given back",
    "shortfall_fp8_covers": "one GPU is too small even at the upper bound; an fp8 KV cache fits",
    "shortfall_at_upper_bound": "one GPU is too small even at the upper bound",
    "max_model_len_blocks_lowering": "one --max-model-len request must still fit",
    "no_memory_lever": "no memory setting to size: replicas are the lever",
}


@dataclass(frozen=True)
class Recommendation:
    action: str
    reason: str

    def __post_init__(self) -> None:
        # A typo here would create an undocumented series; fail loudly in tests instead.
        if self.action not in ACTIONS:
            raise ValueError(f"action: {self.action!r} is not one of ACTIONS {ACTIONS}")
        if self.reason not in REASONS:
            raise ValueError(f"reason: {self.reason!r} is not one of REASONS {tuple(REASONS)}")


def recommend(
    *,
    asleep: bool,
    peak_demand_tokens: float | None,
    capacity_tokens: float | None,
    block_size: int | None,
    target_usage: float,
    max_capacity_tokens: float | None = None,
    memory_mode: str = "gpu_memory_utilization",
    kv_dtype_bytes: float | None = None,
    max_model_len: int | None = None,
    raise_margin: float = 0.05,
    lower_margin: float = 0.15,
) -> Recommendation:
    """Pick the top recommendation from the window's peak demand and the pool.

    ``peak_usage = peak ÷ (capacity − block_size)`` (usable tokens; see
    sizing.py), ``C*`` = :func:`~sidecar.forecast.sizing.required_capacity_tokens`,
    ``C_max`` = ``max_capacity_tokens`` (the pool at the upper bound: at
    ``hi`` utilization, or the kv_cache_memory_bytes ceiling; ``None`` = unknown,
    treated as unbounded). In order:

    1. asleep → ``none/engine_asleep`` (advice is suppressed while asleep);
    2. no peak, capacity or block size → ``none/insufficient_data``;
    3. ``peak_usage > target + raise_margin``:
       ``C* ≤ C_max`` → ``raise_<memory setting>/peak_above_target``;
       else, with a KV dtype wider than 1 byte and ``C_max × kv_dtype_bytes ≥ C*``
       → ``enable_fp8_kv_cache/shortfall_fp8_covers``;
       else → ``add_replicas/shortfall_at_upper_bound``;
    4. ``peak_usage < target − lower_margin``: if the floor of one
       ``max_model_len`` request keeps the pool from shrinking (floor ≥ capacity)
       → ``lower_max_model_len/max_model_len_blocks_lowering``; otherwise
       ``lower_<memory setting>/peak_below_target``;
    5. otherwise ``none/within_target``.

    With ``memory_mode="none"`` (the engine has no setting the sidecar can size) step 3 is
    ``add_replicas/no_memory_lever`` and step 4 ``none/no_memory_lever``: nothing to raise or lower.

    The margins are a dead band, so a peak hovering at target does not flip the
    advice; they act on the peak over a long window (default 1 h), which is
    already stable. The defaults put "raise" at the 0.8 warning level for the
    default target 0.75.
    """
    if memory_mode not in MEMORY_MODES:
        raise ValueError(f"memory_mode: must be one of {MEMORY_MODES}, got {memory_mode!r}")
    if asleep:
        return Recommendation("none", "engine_asleep")
    if peak_demand_tokens is None or capacity_tokens is None or not block_size or capacity_tokens <= block_size:
        return Recommendation("none", "insufficient_data")
    setting = memory_mode
    peak_usage = peak_demand_tokens / (capacity_tokens - block_size)
    wanted = required_capacity_tokens(
        peak_demand_tokens=peak_demand_tokens, target_usage=target_usage, block_size=block_size
    )

    if setting == "none":
        if peak_usage > target_usage + raise_margin:
            return Recommendation("add_replicas", "no_memory_lever")
        if peak_usage < target_usage - lower_margin:
            return Recommendation("none", "no_memory_lever")
        return Recommendation("none", "within_target")

    if peak_usage > target_usage + raise_margin:
        if max_capacity_tokens is None or wanted <= max_capacity_tokens:
            return Recommendation(f"raise_{setting}", "peak_above_target")
        if kv_dtype_bytes and kv_dtype_bytes > 1 and max_capacity_tokens * kv_dtype_bytes >= wanted:
            return Recommendation("enable_fp8_kv_cache", "shortfall_fp8_covers")
        return Recommendation("add_replicas", "shortfall_at_upper_bound")

    if peak_usage < target_usage - lower_margin:
        if max_model_len:
            floor = min_capacity_tokens_for_max_model_len(max_model_len=max_model_len, block_size=block_size)
            if floor >= capacity_tokens:
                return Recommendation("lower_max_model_len", "max_model_len_blocks_lowering")
        return Recommendation(f"lower_{setting}", "peak_below_target")

    return Recommendation("none", "within_target")
