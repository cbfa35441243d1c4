"""Derivation layers on top of the base gauges: the capacity model (issue 4) and the forecast (issue 5).

Each layer is an :data:`~sidecar.state.Extender`, called per (target,
model_name, engine) after every good scrape with the key's history and the *sample* time,
returning extra gauges. They read no clock and do no I/O (the model's
config.json is read once, at start-up, by :func:`build_extenders`), so the
forecast benchmark replays simulated time through exactly this code.

Gauges are ``name -> value`` or ``name -> {extra label values: value}``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Mapping

from . import capacity as cap
from . import forecast as fc
from .config import Config, ConfigError
from .derive import Derived, PoolSize
from .observation import Histogram, Observation
from .state import Extender

log = logging.getLogger("kv_sidecar.layers")

Key = tuple[str, str, str]  # (target, model_name, engine)

#: cache_dtype label values that mean a 1-byte KV cache (vllm/config/cache.py CacheDType).
_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


def _label(cc: Mapping[str, str], key: str) -> str | None:
    v = cc.get(key)
    return None if v in (None, "None", "") else v


def _label_float(cc: Mapping[str, str], key: str) -> float | None:
    v = _label(cc, key)
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


@dataclass(frozen=True)
class Theory:
    """What the capacity model says about one engine, given vLLM's cache settings."""

    layout: cap.KVLayout
    exact_tokens: int | None  # from vLLM's kv_cache_memory_bytes
    estimated_tokens: int | None  # from the GPU-memory estimator
    budget: cap.Budget | None  # the estimated budget (weights, activation, ...)


#: The capacity model's errors name the calculator's flags; the sidecar's fields are these.
_FIELD_OF_FLAG = {"--model-config": "model.config", "--tensor-parallel-size": "model.tensor_parallel_size",
                  "--pipeline-parallel-size": "model.pipeline_parallel_size", "--dtype": "model.dtype",
                  "--gpu-memory": "model.gpu_memory"}


def _as_config_field(message: str) -> str:
    """A capacity-model error with the flag it starts with replaced by the sidecar's config field."""
    flag, sep, rest = message.partition(": ")
    if sep and flag in _FIELD_OF_FLAG:
        return f"{_FIELD_OF_FLAG[flag]}: {rest}"
    return f"model: {message}"


class CapacityLayer:
    """Issue 4 §3: theoretical capacity from config.json next to vLLM's own figure."""

    #: relative disagreement above which the likely causes are logged (once per engine and budget)
    TOLERANCE = 0.05

    def __init__(self, config: Config):
        m = config.model
        self.settings = m
        try:
            self.spec = cap.load_model(m.config)
            # Validate TP/PP/dtype now, so a bad combination exits 2 before serving (vLLM refuses it too).
            cap.kv_layout(self.spec, tp=m.tensor_parallel_size, pp=m.pipeline_parallel_size, dtype=m.dtype)
            self.gpu_memory = None if m.gpu_memory is None else cap.parse_memory(m.gpu_memory)
        except cap.CapacityError as e:
            raise ConfigError([_as_config_field(str(e))]) from None
        self._layouts: dict[tuple[int | None, str, int | None], cap.KVLayout] = {}
        self._warned: set[tuple] = set()

    def layout_for(self, cc: Mapping[str, str]) -> cap.KVLayout:
        """The layout vLLM built: block size and KV dtype as vLLM reports them in cache_config_info."""
        block = _label_float(cc, "block_size")
        block_size = None if block is None else int(block)
        kv_dtype = (_label(cc, "cache_dtype") or "auto").lower()
        max_len = _max_model_len(cc)
        key = (block_size, kv_dtype, max_len)
        if key not in self._layouts:
            self._layouts[key] = cap.kv_layout(
                self.spec, tp=self.settings.tensor_parallel_size, pp=self.settings.pipeline_parallel_size,
                dtype=self.settings.dtype, kv_cache_dtype=kv_dtype if kv_dtype in _FP8 + ("auto",) else "auto",
                block_size=block_size, max_model_len=max_len)
        return self._layouts[key]

    def theory(self, obs: Observation) -> Theory | None:
        cc = obs.cache_config
        if not cc:
            return None
        try:
            layout = self.layout_for(cc)
        except cap.CapacityError as e:
            log.warning("capacity model cannot follow vLLM's settings engine=%s: %s", obs.engine, e)
            return None
        exact = estimated = None
        budget = None
        kv_bytes = _label_float(cc, "kv_cache_memory_bytes")
        max_len = _max_model_len(cc)
        if kv_bytes:
            exact = self._tokens(layout, int(kv_bytes), max_len)
        util = _label_float(cc, "gpu_memory_utilization")
        if self.gpu_memory and util and not kv_bytes:
            try:
                m = self.settings
                budget = cap.estimate_budget(self.spec, layout, gpu_memory_bytes=self.gpu_memory,
                                             gpu_memory_utilization=util, weights=m.weights_memory,
                                             activation_bytes=m.activation_memory,
                                             non_torch_bytes=m.non_torch_memory, cudagraph_bytes=m.cudagraph_memory)
                estimated = self._tokens(layout, budget.kv_budget_bytes, max_len)
            except cap.CapacityError as e:  # e.g. the weights alone exceed the budget: no estimate, said once
                budget, estimated = None, None
                if ("estimate", obs.engine) not in self._warned:
                    self._warned.add(("estimate", obs.engine))
                    log.warning("no estimated capacity engine=%s: %s (check model.gpu_memory and the "
                                "model.*_memory overrides)", obs.engine, e)
        return Theory(layout, exact, estimated, budget)

    @staticmethod
    def _tokens(layout: cap.KVLayout, budget_bytes: int, max_model_len: int | None) -> int:
        """vLLM's capacity figure for a budget, by the rule of the version that exported the labels.

        With ``kv_cache_size_tokens``/``kv_cache_max_concurrency`` present (vLLM 0.21+,
        PR #42206) vLLM reports ``int(max_concurrency × max_model_len)``
        (``get_kv_cache_capacity``); before, ``num_blocks × block_size``
        (reference kv-capacity.md §A4). They agree for full attention when
        ``max_model_len`` is a multiple of the block size.
        """
        if max_model_len:
            return cap.logged_capacity_tokens(layout, cap.num_blocks(layout, budget_bytes), max_model_len=max_model_len)
        return cap.capacity_tokens(layout, budget_bytes)

    def __call__(self, key: Key, history, now: float, d: Derived) -> dict[str, object]:
        obs = history[-1][1]
        th = self.theory(obs)
        if th is None:
            return {}
        layout = th.layout
        out: dict[str, object] = {
            "kvcache_theoretical_bytes_per_token": layout.bytes_per_token,
            "kvcache_model_info": {(layout.architecture, layout.attention, layout.kv_dtype, str(layout.tp),
                                    str(layout.pp)): 1.0},
        }
        theoretical: dict[tuple[str, ...], float] = {}
        efficiency: dict[tuple[str, ...], float] = {}
        actual = _actual_capacity(obs.cache_config, d.pool)
        for budget, tokens in (("exact", th.exact_tokens), ("estimated", th.estimated_tokens)):
            if tokens is None:
                continue
            theoretical[(budget,)] = tokens
            if actual is not None and tokens > 0:
                efficiency[(budget,)] = actual / tokens
                self._explain(key, budget, actual, tokens)
        if theoretical:
            out["kvcache_theoretical_capacity_tokens"] = theoretical
        if efficiency:
            out["kvcache_capacity_efficiency_ratio"] = efficiency
        return out

    def _explain(self, key: Key, budget: str, actual: float, theoretical: float) -> None:
        if abs(actual / theoretical - 1) <= self.TOLERANCE or (key, budget) in self._warned:
            return
        self._warned.add((key, budget))
        log.warning(
            "vLLM's KV capacity differs from the model's theoretical one model=%s engine=%s budget=%s "
            "actual=%d theoretical=%d ratio=%.3f likely causes: served dtype differs from model.dtype "
            "(float32 downcast to bfloat16), tensor/pipeline parallel sizes differ from model.*, hybrid "
            "(sliding-window or mamba) layers, CUDA-graph memory (vLLM >= 0.21 budgets it), speculative-decoding "
            "draft layers sharing the pool, or --num-gpu-blocks-override", key[1], key[2], budget, actual,
            theoretical, actual / theoretical)


def _actual_capacity(cc: Mapping[str, str], pool: PoolSize | None) -> float | None:
    """vLLM's capacity: the base gauge, or for hybrids the group-aware kv_cache_size_tokens label."""
    if pool is not None and pool.capacity_tokens is not None:
        return float(pool.capacity_tokens)
    return _label_float(cc, "kv_cache_size_tokens")


def _max_model_len(cc: Mapping[str, str]) -> int | None:
    """``max_model_len`` recovered from vLLM 0.21+'s labels: ``kv_cache_size_tokens ÷ kv_cache_max_concurrency``.

    vLLM sets ``kv_cache_size_tokens = int(max_concurrency × max_model_len)``
    (``get_kv_cache_capacity``, reference kv-capacity.md §A4), so the ratio is
    ``max_model_len`` up to the int() truncation; rounded to a whole token.
    """
    tokens, conc = _label_float(cc, "kv_cache_size_tokens"), _label_float(cc, "kv_cache_max_concurrency")
    if not tokens or not conc:
        return None
    return int(round(tokens / conc))


def _hist(h: Histogram | None) -> fc.HistogramSnapshot | None:
    if h is None or not h.buckets or h.buckets[-1][0] != math.inf:
        return None
    return fc.HistogramSnapshot.of(h.buckets, h.sum, h.count)


class ForecastLayer:
    """Issue 5 §1: demand, fill rate, time until full, concurrency at real lengths, advice."""

    def __init__(self, config: Config, capacity: CapacityLayer | None):
        self.config = config
        self.capacity = capacity
        self.th = config.thresholds
        self.fcfg = config.forecast
        #: per key: (t, demand tokens) over the longest trend window (forecast.long_windows), the trend's samples
        self._demand: dict[Key, deque[tuple[float, float]]] = {}
        #: per key: the running maximum of demand over forecast.peak_window, as a monotonic queue
        #: (values decreasing from the left): the peak in O(1) per scrape instead of a scan of an hour.
        self._peaks: dict[Key, deque[tuple[float, float]]] = {}
        #: per key: the sample time the layer first saw it (advice to lower needs a whole peak window)
        self._first_seen: dict[Key, float] = {}
        #: per key: sample times at which vLLM restarted (prompt_tokens counter went down)
        self._resets: dict[Key, list[float]] = {}
        self._last_counter: dict[Key, float] = {}
        #: per key: the latest mean KV tokens per request (prompt + generation/2) seen over derive.window
        self._per_request: dict[Key, float] = {}

    def __call__(self, key: Key, history, now: float, d: Derived) -> dict[str, object]:
        obs = history[-1][1]
        pool = d.pool
        if pool is None or pool.block_size is None or pool.usable_blocks is None or d.used_tokens is None:
            # e.g. a hybrid model or a generation without cache_config_info: no pool, no advice (advice.py)
            return {"kvcache_recommendation_info": {("none", "insufficient_data"): 1.0}}
        bs = pool.block_size
        out: dict[str, object] = {}

        # Mean KV per request over the derive window, from vLLM's request-length histograms.
        start = _first_in_window(history, now, self.config.derive_window_s)
        mean_prompt = _window(fc.window_mean, start, obs, "prompt_length")
        mean_gen = _window(fc.window_mean, start, obs, "generation_length")
        if mean_prompt is not None and mean_gen is not None:
            self._per_request[key] = fc.mean_request_kv_tokens(mean_prompt, mean_gen)
        # No request finished within derive.window (a saturated cache can stall them): the last known
        # length still prices the waiting requests, so the demand does not drop while the queue stands.
        per_request = self._per_request.get(key)
        waiting_capacity = d.requests_waiting.get("capacity", d.requests_waiting.get("all", 0.0))
        demand = fc.demand_tokens(used_tokens=d.used_tokens, usage_ratio=d.usage_ratio or 0.0,
                                  watermark=self.th.watermark, waiting_capacity_requests=waiting_capacity,
                                  mean_request_tokens=per_request, block_size=bs)
        out["kvcache_demand_tokens"] = demand
        series = self._record(key, now, demand, obs)

        # Requests that fit at real lengths (vLLM's log line assumes max_model_len for every request).
        concurrency: dict[tuple[str, ...], float] = {}
        max_len = _max_model_len(obs.cache_config)
        if max_len:
            concurrency[("max_model_len",)] = fc.max_concurrent_requests(
                usable_blocks=pool.usable_blocks, request_tokens=max_len, block_size=bs)
        if mean_prompt is not None and mean_gen is not None and mean_prompt + mean_gen > 0:
            concurrency[("observed_mean",)] = fc.max_concurrent_requests(
                usable_blocks=pool.usable_blocks, request_tokens=mean_prompt + mean_gen, block_size=bs)
        p95_prompt = _window(lambda o, n: fc.window_quantile(0.95, o, n), start, obs, "prompt_length")
        p95_gen = _window(lambda o, n: fc.window_quantile(0.95, o, n), start, obs, "generation_length")
        if p95_prompt is not None and p95_gen is not None and p95_prompt + p95_gen > 0:
            concurrency[("observed_p95",)] = fc.max_concurrent_requests(
                usable_blocks=pool.usable_blocks, request_tokens=p95_prompt + p95_gen, block_size=bs)
        if concurrency:
            out["kvcache_max_concurrent_requests"] = concurrency

        asleep = bool(d.engine_asleep)
        if asleep:
            out["kvcache_recommendation_info"] = {("none", "engine_asleep"): 1.0}
            return out

        # The trend over each window; the one that runs the cache out first wins (docs/forecast.md).
        trend_points = self._trend_points(key, series, now)
        trends = [fc.trend_over(trend_points, now, w, min_samples=self.fcfg.min_samples,
                                min_span_s=self.fcfg.min_span_s, segment_s=self.fcfg.segment_s or None)
                  for w in self.fcfg.windows_s]
        best, until_full, until_mark = fc.earliest_full(
            trends, demand=demand, free_tokens=d.free_tokens if d.free_tokens is not None else 0,
            headroom_tokens=d.watermark_headroom_tokens or 0, block_size=bs)
        if best is not None:
            out["kvcache_fill_rate_tokens_per_second"] = best.rate
        if until_full is not None:
            out["kvcache_time_until_full_seconds"] = until_full
        if until_mark is not None:
            out["kvcache_time_until_watermark_seconds"] = until_mark

        watched_s = now - self._first_seen.get(key, now)
        out.update(self._advice(obs, pool, self._peaks[key], now, watched_s))
        return out

    def _trend_points(self, key: Key, series, now: float) -> list[tuple[float, float]]:
        """The demand samples of the longest trend window since the last vLLM restart."""
        since = max([t for t in self._resets.get(key, ()) if t <= now], default=-math.inf)
        return [(t, v) for t, v in series if t >= since]

    def forget(self, key: Key) -> None:
        """The model/engine left its target: drop its series."""
        for store in (self._demand, self._peaks, self._resets, self._last_counter, self._first_seen,
                      self._per_request):
            store.pop(key, None)

    def _record(self, key: Key, now: float, demand: float, obs: Observation) -> deque[tuple[float, float]]:
        series = self._demand.setdefault(key, deque())
        peaks = self._peaks.setdefault(key, deque())
        if series and now < series[-1][0]:  # a replay restarted: start afresh
            series.clear()
            peaks.clear()
            self._first_seen.pop(key, None)
            self._resets.pop(key, None)
            self._last_counter.pop(key, None)
            self._per_request.pop(key, None)
        self._first_seen.setdefault(key, now)
        if (not series or now > series[-1][0]) and math.isfinite(demand):
            series.append((now, demand))
            while peaks and peaks[-1][1] <= demand:
                peaks.pop()
            peaks.append((now, demand))
        while series and series[0][0] < now - self.fcfg.windows_s[-1]:
            series.popleft()
        while peaks and peaks[0][0] < now - self.fcfg.peak_window_s:
            peaks.popleft()
        keep = max(self.fcfg.windows_s[-1], self.fcfg.peak_window_s)
        counter = obs.prompt_tokens
        if counter is not None:
            last = self._last_counter.get(key)
            if last is not None and counter < last:  # vLLM restarted: the trend starts again
                self._resets.setdefault(key, []).append(now)
                self._resets[key] = [t for t in self._resets[key] if t >= now - keep]
            self._last_counter[key] = counter
        return series

    def _advice(self, obs: Observation, pool: PoolSize, peaks, now: float, watched_s: float) -> dict[str, object]:
        """Suggested memory setting, shortfall, replicas, levers and the top recommendation.

        A peak above target is evidence at once; the absence of peaks is evidence only after a whole
        ``forecast.peak_window`` has been watched. Until then no advice lowers memory (a restarted
        sidecar next to a quiet vLLM must not advise cutting its cache).
        """
        out: dict[str, object] = {}
        bs = pool.block_size
        cc = obs.cache_config
        c0 = pool.capacity_tokens
        if c0 is None or not peaks or bs is None:
            out["kvcache_recommendation_info"] = {("none", "insufficient_data"): 1.0}
            return out
        peak = peaks[0][1]  # the largest demand of the peak window
        target = self.th.target_usage
        lo, hi = self.fcfg.utilization_min, self.fcfg.utilization_max
        kv_bytes = _label_float(cc, "kv_cache_memory_bytes")
        u0 = _label_float(cc, "gpu_memory_utilization")
        max_len = _max_model_len(cc)
        theory = self.capacity.theory(obs) if self.capacity else None
        bpt: float | None = theory.layout.bytes_per_token if theory else None
        kv_dtype_bytes = theory.layout.kv_dtype_bytes if theory else None
        if bpt is None and kv_bytes:
            bpt = kv_bytes / c0  # vLLM's own pool: budget ÷ tokens (exact up to the floor to whole blocks)

        max_capacity: float | None = None
        mode = "kv_cache_memory_bytes" if kv_bytes else "gpu_memory_utilization"
        if kv_bytes and bpt:
            # The most KV the GPU can give: its share at the upper bound minus weights, activation,
            # non-torch and CUDA graphs, which stay on the GPU when vLLM takes its KV budget from
            # kv_cache_memory_bytes (kv-capacity.md A2 "Override paths", A8). Unknown without the
            # GPU's memory and the model: then the suggestion is not capped. The budget vLLM runs with
            # now evidently fits, whatever the estimates of the other terms say.
            max_bytes = None
            if self.capacity and self.capacity.gpu_memory and theory is not None:
                max_bytes = max(kv_bytes, self.capacity.gpu_memory * hi - sum(self._non_kv_bytes(theory)))
            out["kvcache_suggested_kv_cache_memory_bytes"] = fc.suggest_kv_cache_memory_bytes(
                peak_demand_tokens=peak, target_usage=target, bytes_per_token=bpt, block_size=bs,
                max_model_len=max_len, max_bytes=max_bytes)
            if max_bytes is not None:
                # whole blocks, as vLLM sizes the pool (num_blocks = ⌊bytes ÷ page⌋, kv-capacity.md A3)
                max_capacity = math.floor(max_bytes / (bs * bpt)) * bs
        elif u0 and bpt and theory is not None:
            memory, basis = self._gpu_memory(theory, c0, bpt, u0)
            if memory:
                out["kvcache_suggested_gpu_memory_utilization"] = {(basis,): fc.suggest_gpu_memory_utilization(
                    u0=u0, capacity_tokens=c0, peak_demand_tokens=peak, target_usage=target, bytes_per_token=bpt,
                    gpu_memory_bytes=memory, block_size=bs, max_model_len=max_len, lo=lo, hi=hi)}
                max_capacity = fc.capacity_at_utilization(u=hi, u0=u0, capacity_tokens=c0, bytes_per_token=bpt,
                                                          gpu_memory_bytes=memory, block_size=bs)

        if max_capacity is not None:
            shortfall = fc.capacity_shortfall_tokens(peak_demand_tokens=peak, target_usage=target,
                                                     max_capacity_tokens=max_capacity, block_size=bs)
            if shortfall > 0 and max_capacity > bs:
                out["kvcache_capacity_shortfall_tokens"] = shortfall
                out["kvcache_suggested_replicas"] = fc.suggested_replicas(
                    peak_demand_tokens=peak, target_usage=target, capacity_per_replica_tokens=max_capacity,
                    block_size=bs)
                levers: dict[tuple[str, ...], float] = {}
                if kv_dtype_bytes and kv_dtype_bytes > 1:
                    levers[("fp8_kv_cache",)] = fc.capacity_with_kv_dtype(
                        capacity_tokens=max_capacity, kv_dtype_bytes=kv_dtype_bytes, block_size=bs)
                if theory is not None and theory.layout.kv_heads > 1 and theory.layout.attention != "mla":
                    levers[("half_kv_heads",)] = fc.capacity_with_kv_heads(
                        capacity_tokens=max_capacity, kv_heads=theory.layout.kv_heads,
                        new_kv_heads=max(1, theory.layout.kv_heads // 2), tensor_parallel=theory.layout.tp,
                        block_size=bs)
                running = obs.requests_running
                if running and running >= 1:
                    # the longest max_model_len at which today's running requests all fit at full length;
                    # a lever only when it is below the current one (lowering is the lever)
                    shorter = fc.max_model_len_for_concurrency(
                        usable_blocks=max(0, int(max_capacity // bs) - 1), block_size=bs, concurrency=int(running))
                    if max_len is None or shorter < max_len:
                        levers[("max_model_len",)] = shorter
                if levers:
                    out["kvcache_lever_capacity_tokens"] = levers

        rec = fc.recommend(asleep=False, peak_demand_tokens=peak, capacity_tokens=c0, block_size=bs,
                           target_usage=target, max_capacity_tokens=max_capacity, memory_mode=mode,
                           kv_dtype_bytes=kv_dtype_bytes, max_model_len=max_len)
        if watched_s < self.fcfg.peak_window_s:
            if rec.action.startswith("lower_"):
                rec = fc.Recommendation("none", "insufficient_data")
            suggested_u = out.get("kvcache_suggested_gpu_memory_utilization")
            if isinstance(suggested_u, dict) and u0 and all(v < u0 for v in suggested_u.values()):
                del out["kvcache_suggested_gpu_memory_utilization"]
            suggested_b = out.get("kvcache_suggested_kv_cache_memory_bytes")
            if suggested_b is not None and kv_bytes and suggested_b < kv_bytes:
                del out["kvcache_suggested_kv_cache_memory_bytes"]
        out["kvcache_recommendation_info"] = {(rec.action, rec.reason): 1.0}
        return out

    def _gpu_memory(self, theory: Theory, c0: float, bpt: float, u0: float) -> tuple[float | None, str]:
        """M: the configured GPU memory, else inferred from the pool (issue 5 §1)."""
        if self.capacity and self.capacity.gpu_memory:
            return float(self.capacity.gpu_memory), "configured"
        weights, activation, non_torch, cudagraph = self._non_kv_bytes(theory)
        return fc.infer_gpu_memory(capacity_tokens=c0, bytes_per_token=bpt, weights_bytes=weights,
                                   activation_bytes=activation, non_torch_bytes=non_torch, u0=u0,
                                   cudagraph_bytes=cudagraph), "inferred"

    def _non_kv_bytes(self, theory: Theory) -> tuple[float, float, float, float]:
        """Weights, activation peak, non-torch and CUDA-graph bytes on one rank: the model.*_memory
        overrides, else the capacity model's estimates (kv-capacity.md A8; CUDA graphs only when given)."""
        layout, spec, m = theory.layout, self.capacity.spec, self.capacity.settings  # type: ignore[union-attr]
        weights = m.weights_memory if m.weights_memory is not None else cap.weights_bytes(
            spec, tp=layout.tp, pp=layout.pp, dtype=layout.served_dtype)
        activation = m.activation_memory if m.activation_memory is not None else cap.activation_estimate_bytes(
            spec, layout, layout.max_num_batched_tokens)
        non_torch = m.non_torch_memory if m.non_torch_memory is not None else cap.non_torch_estimate_bytes(layout)
        return float(weights), float(activation), float(non_torch), float(m.cudagraph_memory or 0)


def _first_in_window(history, now: float, seconds: float) -> Observation | None:
    for t, o in history:
        if t >= now - seconds:
            return o
    return None


def _window(fn, start: Observation | None, obs: Observation, attr: str) -> float | None:
    new = _hist(getattr(obs, attr))
    if new is None:
        return None
    old = _hist(getattr(start, attr)) if start is not None and start is not obs else None
    delta = fc.window_delta(old, new)
    if delta.count <= 0:
        return None
    return fn(old, new)


def build_extenders(config: Config) -> tuple[Extender, ...]:
    """The layers this configuration enables; raises ConfigError for an unusable model section."""
    capacity = CapacityLayer(config) if config.model.config else None
    forecast = ForecastLayer(config, capacity)
    return tuple(x for x in (capacity, forecast) if x is not None)
