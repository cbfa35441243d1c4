"""The forecast layer: demand, fill rate, time until full, concurrency at real lengths, and advice.

Gauges ``kvcache_demand_tokens``, ``kvcache_max_concurrent_requests{basis}``,
``kvcache_fill_rate_tokens_per_second``, ``kvcache_time_until_{full,watermark}_seconds``,
``kvcache_burst_tokens``, ``kvcache_burst_headroom_ratio`` and the advice (``kvcache_suggested_*``,
shortfall, replicas, levers, ``kvcache_recommendation_info``); formulas in docs/forecast.md. The numbers are
the pure functions of :mod:`sidecar.forecast`; what to suggest and what to
withhold is :func:`sidecar.forecast.policy.advise`. This layer keeps, per engine,
the demand series the trend, the peak and the largest one-minute rise are read from, and when the engine started
(``kvcache_engine_start_time_seconds``: the sample time the sidecar first saw it, moved to
the scrape at which ``vllm:prompt_tokens_total`` went down, i.e. vLLM restarted; Prometheus'
counter-reset rule, docs "Counter"), which ``KVCacheFullSoon`` is guarded on: a server that
starts under load fills from empty in a minute, which is not a capacity problem.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import forecast as fc
from ..config import ForecastSettings
from ..derive import Derived
from ..forecast.burst import BurstWindow, burst_headroom_ratio
from ..forecast.policy import Advice, AdviceSettings, Pool, advise, sizing_gpu_memory
from ..forecast.trend import DEFAULT_SEGMENTS
from ..metrics import Gauge, MetricDoc, entry
from ..observation import Histogram, KVPool, Observation
from ..state import History, Step, TargetModelEngine

#: A window statistic of a histogram: (snapshot at the window's start or None, snapshot now) -> value.
WindowStat = Callable[[fc.HistogramSnapshot | None, fc.HistogramSnapshot], float | None]


DEMAND = entry("kvcache_demand_tokens")
START_TIME = entry("kvcache_engine_start_time_seconds")
MAX_CONCURRENT = entry("kvcache_max_concurrent_requests")
RECOMMENDATION = entry("kvcache_recommendation_info")
FILL_RATE = entry("kvcache_fill_rate_tokens_per_second")
UNTIL_FULL = entry("kvcache_time_until_full_seconds")
UNTIL_WATERMARK = entry("kvcache_time_until_watermark_seconds")
SUGGESTED_KV_BYTES = entry("kvcache_suggested_kv_cache_memory_bytes")
SUGGESTED_UTILIZATION = entry("kvcache_suggested_gpu_memory_utilization")
SHORTFALL = entry("kvcache_capacity_shortfall_tokens")
SUGGESTED_REPLICAS = entry("kvcache_suggested_replicas")
LEVER_CAPACITY = entry("kvcache_lever_capacity_tokens")
GPU_MEMORY = entry("kvcache_gpu_memory_bytes")
BURST = entry("kvcache_burst_tokens")
BURST_HEADROOM = entry("kvcache_burst_headroom_ratio")
_Out = dict[MetricDoc, Gauge]


def _p95(old: fc.HistogramSnapshot | None, new: fc.HistogramSnapshot) -> float | None:
    return fc.window_quantile(0.95, old, new)


class ForecastLayer:
    """Demand, fill rate, time until full, concurrency at real lengths, advice (docs/forecast.md)."""

    def __init__(
        self,
        settings: ForecastSettings,
        *,
        watermark: float,
        target_usage: float,
        derive_window_s: float,
    ):
        """``watermark``, ``target_usage``: the ``thresholds:`` section; ``derive_window_s``: ``derive.window``
        (the request lengths are read over it). What the capacity model knows of the served model (with
        ``model.config``) comes per step from the capacity layer (:attr:`Step.served_model`)."""
        self.settings = settings
        self.watermark = watermark
        self.derive_window_s = derive_window_s
        self.advice_settings = AdviceSettings(
            target_usage=target_usage,
            utilization_min=settings.utilization_min,
            utilization_max=settings.utilization_max,
            peak_window_s=settings.peak_window_s,
        )
        #: per engine: (t, demand tokens) over the longest trend window (forecast.long_windows), the trend's samples
        self._demand: dict[TargetModelEngine, deque[tuple[float, float]]] = {}
        #: per engine: the running maximum of demand over forecast.peak_window, as a monotonic queue
        #: (values decreasing from the left): the peak in O(1) per scrape instead of a scan of an hour.
        self._peaks: dict[TargetModelEngine, deque[tuple[float, float]]] = {}
        #: per engine: the largest one-minute rise of demand over forecast.burst_window (two monotonic queues,
        #: sidecar.forecast.burst), started again at a vLLM restart as the trend is
        self._bursts: dict[TargetModelEngine, BurstWindow] = {}
        #: per engine: since when it has been awake (its first sample, or the first after vLLM's sleep mode):
        #: the burst counts from forecast.window after the later of this and its start
        self._awake_since: dict[TargetModelEngine, float] = {}
        #: per engine: the sample time the layer first saw it (advice to lower needs a whole peak window)
        self._first_seen: dict[TargetModelEngine, float] = {}
        #: per engine: when its current process started as far as the sidecar can tell (first seen, or the
        #: latest restart): kvcache_engine_start_time_seconds
        self._started: dict[TargetModelEngine, float] = {}
        #: per engine: sample times at which vLLM restarted (prompt_tokens counter went down)
        self._resets: dict[TargetModelEngine, list[float]] = {}
        self._last_counter: dict[TargetModelEngine, float] = {}
        #: per engine: the latest mean KV tokens per request (prompt + generation/2) seen over derive.window
        self._per_request: dict[TargetModelEngine, float] = {}

    def __call__(self, step: Step) -> _Out:
        key, history, now, d = step.key, step.history, step.now, step.derived
        obs = step.observation
        pool = d.pool
        if pool is None or pool.block_size is None or pool.usable_blocks is None or d.used_tokens is None:
            # e.g. a hybrid model or a generation without cache_config_info: no pool, no advice (recommendation.py)
            return {RECOMMENDATION: {("none", "insufficient_data"): 1.0}}
        bs = pool.block_size
        out: _Out = {}

        # Mean KV per request over the derive window, from vLLM's request-length histograms.
        start = _first_in_window(history, now, self.derive_window_s)
        mean_prompt = _window(fc.window_mean, start, obs, "prompt_length")
        mean_gen = _window(fc.window_mean, start, obs, "generation_length")
        if mean_prompt is not None and mean_gen is not None:
            self._per_request[key] = fc.mean_request_kv_tokens(mean_prompt, mean_gen)
        # No request finished within derive.window (a saturated cache can stall them): the last known
        # length still prices the waiting requests, so the demand does not drop while the queue stands.
        waiting_capacity = d.requests_waiting.get("capacity", d.requests_waiting.get("all", 0.0))
        demand = fc.demand_tokens(
            used_tokens=d.used_tokens,
            usage_ratio=d.usage_ratio or 0.0,
            watermark=self.watermark,
            waiting_capacity_requests=waiting_capacity,
            mean_request_tokens=self._per_request.get(key),
            block_size=bs,
        )
        out[DEMAND] = demand
        series = self._record(key, now, demand, obs, asleep=bool(d.engine_asleep))
        out[START_TIME] = self._started[key]

        concurrency = self._concurrency(pool, obs, start, mean_prompt, mean_gen)
        if concurrency:
            out[MAX_CONCURRENT] = concurrency

        if d.engine_asleep:
            out[RECOMMENDATION] = {("none", "engine_asleep"): 1.0}
            return out

        out.update(self._until_full(key, series, now, demand, d, bs))
        out.update(self._burst(key, now, demand, d))
        peaks = self._peaks[key]
        if d.capacity_tokens is None or not peaks:  # no capacity figure (a hybrid model) or no demand yet
            out[RECOMMENDATION] = {("none", "insufficient_data"): 1.0}
            return out
        advice_pool = _advice_pool(pool, d.capacity_tokens, obs)
        advice = advise(
            peak_demand_tokens=peaks[0][1],  # the largest demand of the peak window
            watched_s=now - self._first_seen.get(key, now),
            pool=advice_pool,
            model=step.served_model,
            settings=self.advice_settings,
        )
        out.update(_advice_gauges(advice))
        memory = sizing_gpu_memory(advice_pool, step.served_model)
        if memory is not None and step.served_model is not None:
            gpu = step.served_model.gpu_name if memory[1] == "configured" else ""
            out[GPU_MEMORY] = {(memory[1], gpu): memory[0]}
        return out

    def _concurrency(
        self,
        pool: KVPool,
        obs: Observation,
        start: Observation | None,
        mean_prompt: float | None,
        mean_gen: float | None,
    ) -> dict[tuple[str, ...], float]:
        """Requests that fit at real lengths (vLLM's log line assumes max_model_len for every request)."""
        concurrency: dict[tuple[str, ...], float] = {}
        usable_blocks, bs, max_len = pool.usable_blocks, pool.block_size, pool.max_model_len
        assert usable_blocks is not None and bs is not None
        if max_len:
            concurrency[("max_model_len",)] = fc.max_concurrent_requests(
                usable_blocks=usable_blocks, request_tokens=max_len, block_size=bs
            )
        if mean_prompt is not None and mean_gen is not None and mean_prompt + mean_gen > 0:
            concurrency[("observed_mean",)] = fc.max_concurrent_requests(
                usable_blocks=usable_blocks, request_tokens=mean_prompt + mean_gen, block_size=bs
            )
        p95_prompt = _window(_p95, start, obs, "prompt_length")
        p95_gen = _window(_p95, start, obs, "generation_length")
        if p95_prompt is not None and p95_gen is not None and p95_prompt + p95_gen > 0:
            concurrency[("observed_p95",)] = fc.max_concurrent_requests(
                usable_blocks=usable_blocks, request_tokens=p95_prompt + p95_gen, block_size=bs
            )
        return concurrency

    def _until_full(
        self, key: TargetModelEngine, series: deque[tuple[float, float]], now: float, demand: float, d: Derived, bs: int
    ) -> _Out:
        """The trend over each window; the one that runs the cache out first wins (docs/forecast.md)."""
        fs = self.settings
        trend_points = self._trend_points(key, series, now)
        trends = [
            fc.trend_over(
                trend_points,
                now,
                w,
                min_samples=fs.min_samples,
                min_span_s=fs.min_span_s,
                segment_s=fs.segment_s or None,
            )
            for w in fs.windows_s
        ]
        # the level now: the peak of about one tooth of the sawtooth, the shortest window's slice (docs/forecast.md)
        recent_s = max(fs.windows_s[0] / DEFAULT_SEGMENTS, fs.segment_s or 0.0)
        best, until_full, until_mark = fc.earliest_full(
            trends,
            demand=demand,
            free_tokens=d.free_tokens if d.free_tokens is not None else 0,
            headroom_tokens=d.watermark_headroom_tokens or 0,
            block_size=bs,
            used_tokens=d.used_tokens,
            peak_now=fc.recent_peak(trend_points, now, recent_s),
            recent_s=recent_s,
        )
        out: _Out = {}
        if best is not None:
            out[FILL_RATE] = best.rate
        if until_full is not None:
            out[UNTIL_FULL] = until_full
        if until_mark is not None:
            out[UNTIL_WATERMARK] = until_mark
        return out

    def _burst(self, key: TargetModelEngine, now: float, demand: float, d: Derived) -> _Out:
        """The largest one-minute rise of the window and the free tokens now against it (docs/forecast.md)."""
        burst = self._bursts[key].largest_rise(now, window_s=self.settings.burst_window_s)
        if burst is None:
            return {}
        out: _Out = {BURST: burst}
        if d.free_tokens is not None and d.used_tokens is not None and math.isfinite(demand):
            # usable capacity (used + free) minus the demand now: the waiting requests' KV is not free
            free_now = d.used_tokens + d.free_tokens - demand
            out[BURST_HEADROOM] = burst_headroom_ratio(free_tokens=free_now, burst_tokens=burst)
        return out

    def _trend_points(
        self, key: TargetModelEngine, series: deque[tuple[float, float]], now: float
    ) -> list[tuple[float, float]]:
        """The demand samples of the longest trend window since the last vLLM restart."""
        since = max([t for t in self._resets.get(key, ()) if t <= now], default=-math.inf)
        return [(t, v) for t, v in series if t >= since]

    def _stores(self) -> tuple[dict[TargetModelEngine, Any], ...]:
        return (
            self._demand,
            self._peaks,
            self._bursts,
            self._awake_since,
            self._resets,
            self._last_counter,
            self._first_seen,
            self._per_request,
            self._started,
        )

    def forget(self, key: TargetModelEngine) -> None:
        """The model/engine left its target: drop its series."""
        for store in self._stores():
            store.pop(key, None)

    def adopt(self, previous: ForecastLayer, keep: Callable[[TargetModelEngine], bool]) -> None:
        """Take over ``previous``'s series of the engines ``keep`` selects (the daemon calls it when a reload
        rebuilt the layers): the settings changed (thresholds, windows), not the servers, so the trend and
        the peak go on instead of starting again."""
        for mine, theirs in zip(self._stores(), previous._stores(), strict=True):
            mine.update((key, value) for key, value in theirs.items() if keep(key))

    def _record(
        self, key: TargetModelEngine, now: float, demand: float, obs: Observation, *, asleep: bool = False
    ) -> deque[tuple[float, float]]:
        previous = self._demand.get(key)
        if previous and now < previous[-1][0]:  # a replay restarted: start afresh
            self.forget(key)
        series = self._demand.setdefault(key, deque())
        peaks = self._peaks.setdefault(key, deque())
        bursts = self._bursts.setdefault(key, BurstWindow())
        self._first_seen.setdefault(key, now)
        self._started.setdefault(key, now)
        if (not series or now > series[-1][0]) and math.isfinite(demand):
            series.append((now, demand))
            while peaks and peaks[-1][1] <= demand:
                peaks.pop()
            peaks.append((now, demand))
        while series and series[0][0] < now - self.settings.windows_s[-1]:
            series.popleft()
        while peaks and peaks[0][0] < now - self.settings.peak_window_s:
            peaks.popleft()
        keep = max(self.settings.windows_s[-1], self.settings.peak_window_s)
        counter = obs.prompt_tokens
        if counter is not None:
            last = self._last_counter.get(key)
            if last is not None and counter < last:  # vLLM restarted: the trend starts again
                self._resets.setdefault(key, []).append(now)
                self._started[key] = now
                self._resets[key] = [t for t in self._resets[key] if t >= now - keep]
                bursts.clear()  # and so does the burst: no rise spans two processes
            self._last_counter[key] = counter
        # The burst counts from forecast.window after the start, as KVCacheFullSoon waits (its guard on
        # kvcache_engine_start_time_seconds): a server filling from empty after a start, a restart or a
        # scale-out under load is not a burst of the traffic, and it would stand in the window for an hour.
        # Waking from vLLM's sleep mode is the same fill from empty: the burst starts again after it too.
        if asleep:
            bursts.clear()
            self._awake_since.pop(key, None)
            return series
        awake = self._awake_since.setdefault(key, now)
        if now - max(self._started[key], awake) >= self.settings.window_s:
            bursts.add(now, demand, window_s=self.settings.burst_window_s)
        return series


def _advice_pool(pool: KVPool, capacity_tokens: int, obs: Observation) -> Pool:
    """The pool as the advice policy reads it: the engine's capacity, its memory lever and that lever's value.

    The lever follows ``KVPool.memory_lever`` (vLLM's utilization, SGLang's ``--mem-fraction-static``,
    TensorRT-LLM's ``free_gpu_memory_fraction``; anything else: replicas only), so one
    ``kvcache_suggested_gpu_memory_utilization`` gauge carries each engine's own fraction, as
    ``kvcache_gpu_memory_utilization`` carries its current value (docs/forecast.md, "Per lever").
    """
    assert pool.block_size is not None
    return Pool(
        capacity_tokens=capacity_tokens,
        block_size=pool.block_size,
        kv_cache_memory_bytes=None if pool.kv_cache_memory_bytes is None else float(pool.kv_cache_memory_bytes),
        gpu_memory_utilization=pool.memory_fraction,
        max_model_len=pool.max_model_len,
        requests_running=obs.requests_running,
        memory_lever=pool.memory_lever,
        null_blocks=pool.null_blocks,
    )


def _advice_gauges(advice: Advice) -> _Out:
    """The advice as gauges: only what the policy returned."""
    out: _Out = {}
    if advice.suggested_kv_cache_memory_bytes is not None:
        out[SUGGESTED_KV_BYTES] = advice.suggested_kv_cache_memory_bytes
    if advice.suggested_gpu_memory_utilization is not None:
        basis, value = advice.suggested_gpu_memory_utilization
        out[SUGGESTED_UTILIZATION] = {(basis,): value}
    if advice.capacity_shortfall_tokens is not None:
        out[SHORTFALL] = advice.capacity_shortfall_tokens
    if advice.suggested_replicas is not None:
        out[SUGGESTED_REPLICAS] = advice.suggested_replicas
    if advice.lever_capacity_tokens:
        out[LEVER_CAPACITY] = {(lever,): v for lever, v in advice.lever_capacity_tokens.items()}
    rec = advice.recommendation
    out[RECOMMENDATION] = {(rec.action, rec.reason): 1.0}
    return out


def _first_in_window(history: History, now: float, seconds: float) -> Observation | None:
    for t, o in history:
        if t >= now - seconds:
            return o
    return None


def _hist(h: Histogram | None) -> fc.HistogramSnapshot | None:
    if h is None or not h.buckets or h.buckets[-1][0] != math.inf:
        return None
    return fc.HistogramSnapshot.of(h.buckets, h.sum, h.count)


def _window(stat: WindowStat, start: Observation | None, obs: Observation, attr: str) -> float | None:
    """``stat`` of the histogram ``attr`` over the window from ``start`` to ``obs``; None if nothing was observed."""
    new = _hist(getattr(obs, attr))
    if new is None:
        return None
    old = _hist(getattr(start, attr)) if start is not None and start is not obs else None
    delta = fc.window_delta(old, new)
    if delta.count <= 0:
        return None
    return stat(old, new)
