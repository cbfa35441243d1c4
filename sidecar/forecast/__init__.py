"""Forecasts and capacity advice: pure functions over plain numbers (no clock, no I/O).

- ``trend``: KV demand, its fill rate (Theil–Sen slope of the upper envelope) over several windows,
  time until full (the earliest window wins).
- ``histogram``: window mean/quantile of Prometheus cumulative histograms (reset-safe).
- ``sizing``: requests that fit, suggested gpu_memory_utilization / kv_cache_memory_bytes,
  shortfall, replicas and the cheaper levers (fp8 KV, fewer KV heads, max_model_len).
- ``recommendation``: the one top recommendation: the fixed ACTIONS/REASONS and ``recommend``.
- ``policy``: the advice policy, ``advise``: memory mode, suggestions, levers, and the warm-up gate
  that withholds advice to lower memory (only what it allows is returned).

Formulas and the estimator choice: docs/forecast.md.
"""

from .histogram import HistogramSnapshot, window_delta, window_mean, window_quantile
from .recommendation import ACTIONS, MEMORY_MODES, REASONS, Recommendation, recommend
from .sizing import (
    capacity_at_utilization,
    capacity_shortfall_tokens,
    capacity_with_kv_dtype,
    capacity_with_kv_heads,
    infer_gpu_memory,
    max_concurrent_requests,
    max_model_len_for_concurrency,
    min_capacity_tokens_for_max_model_len,
    required_capacity_tokens,
    suggest_gpu_memory_utilization,
    suggest_kv_cache_memory_bytes,
    suggested_replicas,
)
from .trend import (
    Trend,
    cdiv,
    demand_tokens,
    detect_counter_resets,
    earliest_full,
    envelope_level,
    fill_rate,
    mean_request_kv_tokens,
    recent_peak,
    theil_sen_slope,
    time_until,
    trend_over,
    upper_envelope,
)

__all__ = [
    "ACTIONS",
    "MEMORY_MODES",
    "REASONS",
    "Recommendation",
    "recommend",
    "HistogramSnapshot",
    "window_delta",
    "window_mean",
    "window_quantile",
    "capacity_at_utilization",
    "capacity_shortfall_tokens",
    "capacity_with_kv_dtype",
    "capacity_with_kv_heads",
    "infer_gpu_memory",
    "max_concurrent_requests",
    "max_model_len_for_concurrency",
    "min_capacity_tokens_for_max_model_len",
    "required_capacity_tokens",
    "suggest_gpu_memory_utilization",
    "suggest_kv_cache_memory_bytes",
    "suggested_replicas",
    "Trend",
    "cdiv",
    "demand_tokens",
    "detect_counter_resets",
    "earliest_full",
    "envelope_level",
    "fill_rate",
    "mean_request_kv_tokens",
    "recent_peak",
    "theil_sen_slope",
    "time_until",
    "trend_over",
    "upper_envelope",
]
