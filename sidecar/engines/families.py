"""What the engine adapters share: reading a sample's number, a histogram family, and the no-capacity rule.

Every adapter turns ``(name, labels, value)`` samples into the typed contract of
:mod:`sidecar.observation`; the pieces below are the ones that are the same whatever the engine:

* :func:`as_float` and :func:`usable_count`: a value as a float (the parser gives a Python int for an
  integer's text, of any length) and whether it can be a count;
* :func:`histograms`: a cumulative histogram family (``_bucket``/``_count``/``_sum``) per engine key,
  copies added up, a broken one dropped and counted;
* :func:`no_capacity`: the rule for a page that gives no KV capacity
  (docs/engines.md, "Detection"): the scrape SUCCEEDS with every gauge the page can give, each engine without a pool is
  counted once as the drop reason ``no_capacity``, and the capacity-based gauges are named absent
  with the reason. Only a page with the engine's signature and nothing usable fails the scrape
  (``ScrapeFailed("no_capacity")``, raised by the adapter itself, e.g. TensorRT-LLM without
  iteration statistics).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from ..observation import Histogram, Observation, Rejections

#: The largest count read (tokens, blocks, requests, counters): page.count in sidecar.limits.
MAX_COUNT = float(1 << 63)

#: The gauges of the forecast layer that stand on used tokens (demand, trend, concurrency, start time):
#: absent for an engine that exports no usage even when the operator gives the capacity.
FORECAST_GAUGES: tuple[str, ...] = (
    "kvcache_watermark_headroom_tokens",
    "kvcache_demand_tokens",
    "kvcache_fill_rate_tokens_per_second",
    "kvcache_time_until_full_seconds",
    "kvcache_time_until_watermark_seconds",
    "kvcache_max_concurrent_requests",
    "kvcache_engine_start_time_seconds",
    "kvcache_burst_tokens",
    "kvcache_burst_headroom_ratio",
)

#: The gauges that stand on a pool (capacity): without one the sidecar cannot derive them
#: (sidecar/derive.py ``usage_split``: used and free need the pool; sidecar/layers/forecast.py returns
#: no demand, trend or concurrency without it). ``kvcache_usage_ratio`` is among them unless the
#: engine exports its own fraction (:func:`no_capacity` leaves it out then).
CAPACITY_GAUGES: tuple[str, ...] = (
    "kvcache_usage_ratio",
    "kvcache_capacity_tokens",
    "kvcache_used_tokens",
    "kvcache_free_tokens",
    *FORECAST_GAUGES,
)

#: The capacity model's budget gauges (sidecar/layers/capacity.py): it estimates vLLM's KV budget only,
#: from ``--gpu-memory-utilization`` (a share of TOTAL memory) or ``--kv-cache-memory-bytes``.
BUDGET_GAUGES: tuple[str, ...] = (
    "kvcache_theoretical_capacity_tokens",
    "kvcache_capacity_efficiency_ratio",
    "kvcache_budget_dominant_overhead_info",
)

#: The advice's memory gauges beyond the utilization (sidecar/forecast/policy.py): the largest pool the
#: memory setting allows (shortfall, replicas, levers) needs that setting's value; the byte suggestion
#: is vLLM's ``--kv-cache-memory-bytes``.
MEMORY_ADVICE_GAUGES: tuple[str, ...] = (
    "kvcache_suggested_kv_cache_memory_bytes",
    "kvcache_capacity_shortfall_tokens",
    "kvcache_suggested_replicas",
    "kvcache_lever_capacity_tokens",
)

Key = TypeVar("Key")
ByName = Mapping[str, list[tuple[dict[str, str], float]]]


def as_float(value: float) -> float:
    """A sample's value as a float: the parser gives an int for an integer's text, of any length; one
    too long for a float is ``inf`` (then refused like any other infinity)."""
    if type(value) is float:
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf


def usable_count(value: float) -> bool:
    """Whether ``value`` can be a count: finite, 0 to :data:`MAX_COUNT`."""
    return math.isfinite(value) and 0 <= value <= MAX_COUNT


def histograms(
    by_name: ByName, family: str, rejections: Rejections, key: Callable[[Mapping[str, str]], Key]
) -> dict[Key, Histogram]:
    """Each engine's histogram of ``family`` (samples ``family_bucket``, ``_count``, ``_sum``), keyed by
    ``key(labels)``; copies of one key (per-process series) add up.

    A histogram that cannot be one is dropped for its key: a bound or a count that is not a number
    (``invalid_value``), buckets that fall with the bound, no ``+Inf`` bucket, or a ``_count`` other
    than the ``+Inf`` bucket (``histogram_mismatch``).
    """
    buckets: dict[Key, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    totals: dict[str, dict[Key, float]] = {"_count": defaultdict(float), "_sum": defaultdict(float)}
    broken: set[Key] = set()
    for labels, value in by_name.get(family + "_bucket", ()):
        k = key(labels)
        le = _bound(labels.get("le", ""))
        if math.isnan(le) or not usable_count(value):
            if k not in broken:
                rejections.add("invalid_value", family + "_bucket", f"le={labels.get('le', '')[:20]!r} {value!r}")
            broken.add(k)
            continue
        buckets[k][le] += value
    for suffix, into in totals.items():
        for labels, value in by_name.get(family + suffix, ()):
            k = key(labels)
            if not usable_count(value):
                if k not in broken:
                    rejections.add("invalid_value", family + suffix, repr(value))
                broken.add(k)
            into[k] += value
    out: dict[Key, Histogram] = {}
    for k, les in buckets.items():
        if k in broken:
            continue
        ordered = tuple(sorted(les.items()))
        rising = all(a[1] <= b[1] for a, b in zip(ordered, ordered[1:], strict=False))
        count = totals["_count"].get(k)
        if math.inf not in les or not rising or count is None or count != les[math.inf]:
            rejections.add(
                "histogram_mismatch", family, f"_count={count!r} +Inf bucket={les.get(math.inf)!r} rising={rising}"
            )
            continue
        out[k] = Histogram(buckets=ordered, count=count, sum=totals["_sum"].get(k, 0.0))
    return out


def _bound(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def no_capacity(
    observations: Iterable[Observation], rejections: Rejections, *, field: str, reason: str
) -> dict[str, str]:
    """Apply the no-capacity rule to one page's observations (module docstring).

    Counts ``no_capacity`` once for each observation without a pool (``field``: the family the capacity
    would come from, for the log line; ``reason``: where to find the number, with the fix) and returns
    the gauges that are absent because of it: :data:`CAPACITY_GAUGES`, less ``kvcache_usage_ratio`` when
    the engine exported its own fraction. ``{}`` when every observation has a pool.
    """
    seen = list(observations)
    missing = [o for o in seen if o.pool is None]
    for _ in missing:
        rejections.add("no_capacity", field, reason)
    if not seen or len(missing) < len(seen):
        return {}  # a gauge published for one engine is not absent for the page
    own_usage = any(o.usage_ratio is not None for o in missing)
    return {name: reason for name in CAPACITY_GAUGES if not (own_usage and name == "kvcache_usage_ratio")}
