"""Reading vLLM's ``vllm:cache_config_info`` labels, which are ``str()`` of every ``CacheConfig`` field.

``"None"`` and ``""`` mean absent; numbers come as their ``str()`` (``"128"``, ``"0.9"``).
Label sets differ between vLLM versions (``CacheConfig.metrics_info()`` in
``vllm/config/cache.py``), so every reader here tolerates a missing key. See
docs/vllm-metrics.md (``vllm:cache_config_info``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..derive import PoolSize


def label(cc: Mapping[str, str], key: str) -> str | None:
    """The label's value, None when absent or ``"None"``."""
    v = cc.get(key)
    return None if v in (None, "None", "") else v


def label_float(cc: Mapping[str, str], key: str) -> float | None:
    """The label as a number, None when absent or not a number."""
    v = label(cc, key)
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


def max_model_len(cc: Mapping[str, str]) -> int | None:
    """``max_model_len`` recovered from vLLM 0.21+'s labels: ``kv_cache_size_tokens ÷ kv_cache_max_concurrency``.

    vLLM sets ``kv_cache_size_tokens = int(max_concurrency × max_model_len)``
    (``get_kv_cache_capacity`` in ``vllm/v1/core/kv_cache_utils.py``; docs/capacity.md,
    "The tokens line across versions"), so the ratio is ``max_model_len`` up to the
    int() truncation; rounded to a whole token.
    """
    tokens, conc = label_float(cc, "kv_cache_size_tokens"), label_float(cc, "kv_cache_max_concurrency")
    if not tokens or not conc:
        return None
    return int(round(tokens / conc))


def actual_capacity(cc: Mapping[str, str], pool: PoolSize | None) -> float | None:
    """vLLM's capacity: the base gauge, or for hybrids the group-aware kv_cache_size_tokens label."""
    if pool is not None and pool.capacity_tokens is not None:
        return float(pool.capacity_tokens)
    return label_float(cc, "kv_cache_size_tokens")
