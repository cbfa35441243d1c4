"""The capacity layer: the theoretical KV capacity from config.json next to vLLM's own figure.

Gauges ``kvcache_theoretical_bytes_per_token``, ``kvcache_model_info``,
``kvcache_theoretical_capacity_tokens{budget}`` and
``kvcache_capacity_efficiency_ratio{budget}`` (docs/capacity.md). The model's
config.json is read once, at start-up; per scrape the layer only follows the
block size, KV dtype and ``max_model_len`` vLLM reports.

A ``model.config`` that is not there yet (a sidecar starts before vLLM, which may still
be downloading the model) is looked for again every ``retry_s`` of sample time: the
capacity gauges are absent until it appears, and the wait is logged once when it
starts and once when the file appears. A condition repeated on every scrape (vLLM's
settings the model cannot follow) is logged when it starts and when it ends, with the
number of scrapes it lasted.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .. import capacity as cap
from .. import model_discovery as discovery
from ..capacity.vllm_rules import served_version
from ..config import ModelSettings
from ..derive import Derived
from ..forecast.policy import ServedModel
from ..observation import Observation
from ..state import History, TargetModelEngine
from .cache_labels import actual_capacity, label, label_float, max_model_len

log = logging.getLogger("kv_sidecar.layers")

#: cache_dtype label values that mean a 1-byte KV cache (vllm/config/cache.py CacheDType).
_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


@dataclass(frozen=True)
class Theory:
    """What the capacity model says about one engine, given vLLM's cache settings."""

    layout: cap.KVLayout
    exact_tokens: int | None  # from vLLM's kv_cache_memory_bytes
    estimated_tokens: int | None  # from the GPU-memory estimator
    budget: cap.Budget | None  # the estimated budget (weights, activation, ...)


class CapacityLayer:
    """Theoretical capacity from config.json (``model.*`` settings) next to vLLM's own figure."""

    #: relative disagreement above which the likely causes are logged (once per engine and budget)
    TOLERANCE = 0.05

    def __init__(self, settings: ModelSettings, *, retry_s: float = 15.0):
        """``settings`` as :func:`sidecar.config.build_config` validated them. The model is loaded now;
        when its file is not there yet (``run`` allows that) or cannot be used, the layer publishes
        nothing and looks again every ``retry_s`` seconds of sample time (the scrape interval)."""
        if settings.config is None:
            raise ValueError("CapacityLayer needs model.config")
        self.settings = settings
        self.retry_s = retry_s
        self.gpu_memory = None if settings.gpu_memory is None else cap.parse_memory(settings.gpu_memory)
        self._spec: cap.ModelSpec | None = None
        self._layouts: dict[tuple[int | None, str, int | None], cap.KVLayout] = {}
        #: warnings already logged: ("estimate", engine) and (engine key, budget)
        self._warned: set[tuple[object, str]] = set()
        #: engines whose vLLM settings the model cannot follow: the problem and the scrapes since it began
        self._failing: dict[TargetModelEngine, tuple[str, int]] = {}
        #: the last observation :meth:`theory` answered for, and its answer (the forecast asks again)
        self._last: tuple[Observation | None, Theory | str | None] = (None, None)
        self._next_try = -math.inf
        self._problem: str | None = None  # why the model is not loaded, as last logged
        self._identity: tuple[int, int, int] | None = None  # the file that problem was about
        self._path: str | None = None  # the config.json the loaded model was read from
        #: where loading stands (kvcache_model_config_loaded's reason: sidecar.model_discovery.REASONS)
        self.reason = discovery.WAITING
        self._tries = 0
        self._load(None)

    @property
    def spec(self) -> cap.ModelSpec:
        """The loaded model; :class:`~sidecar.capacity.CapacityError` while it is not (see :meth:`ready`)."""
        if self._spec is None:
            raise cap.CapacityError(f"--model-config: {self._problem or 'not loaded'}")
        return self._spec

    @property
    def ready(self) -> bool:
        """Whether the model is loaded (the capacity gauges are published)."""
        return self._spec is not None

    @staticmethod
    def _file_identity(path: str | None) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path or "")
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self, now: float | None, model_name: str | None = None) -> None:
        """Find and load the served model's config.json (:func:`sidecar.model_discovery.locate`): at most
        once per ``retry_s`` of sample time, a file that could not be used only once it changed, and again
        when the file found changes (a new revision or model in a hub cache). Logs when a wait starts and
        when it ends; :attr:`reason` says where it stands (``kvcache_model_config_loaded``)."""
        if now is not None and now < self._next_try:
            return
        self._next_try = -math.inf if now is None else now + self.retry_s
        found = discovery.locate(self.settings.config or "", model_name)
        if found.path is not None and found.path == self._path and self._spec is not None:
            return
        if found.path is None:
            self._drop(found.reason)
            if self._problem != found.reason:
                log.warning(
                    "model.config: %s; the capacity gauges are absent until it is there "
                    "(looked for every %gs; logged again when it is)",
                    found.detail,
                    self.retry_s,
                )
            self._problem, self._identity = found.reason, None
            return
        identity = self._file_identity(found.path)
        if self._problem is not None and identity is not None and identity == self._identity:
            return  # the same unusable file: nothing new to read
        self._tries += 1
        m = self.settings
        try:
            spec = cap.load_model(found.path)
            cap.kv_layout(spec, tp=m.tensor_parallel_size, pp=m.pipeline_parallel_size, dtype=m.dtype)
        except cap.CapacityError as e:  # ModelFileMissing too: removed between locate() and the read
            problem = "; ".join(e.problems)
            if problem != self._problem:
                log.error(
                    "model.config %s cannot be used: %s; the capacity gauges are absent until the file is fixed "
                    "(kv-sidecar check-config names every problem)",
                    found.path,
                    problem,
                )
            self._drop(discovery.INVALID)
            self._problem, self._identity = problem, identity
            return
        if self._problem is not None or self._path is not None:
            log.info(
                "model.config %s: loaded after %d attempt%s (%s); the capacity gauges are published",
                found.path,
                self._tries,
                "" if self._tries == 1 else "s",
                spec.architecture,
            )
        self._spec, self._path, self._problem, self._identity = spec, found.path, None, None
        self._layouts.clear()
        self._last = (None, None)
        self.reason = discovery.LOADED

    def _drop(self, reason: str) -> None:
        """Forget the loaded model (its file is gone, or another one is due): no gauge from a stale model."""
        self._spec, self._path, self.reason = None, None, reason
        self._layouts.clear()
        self._last = (None, None)

    def layout_for(self, cc: Mapping[str, str]) -> cap.KVLayout:
        """The layout vLLM built: block size and KV dtype as vLLM reports them in cache_config_info."""
        block = label_float(cc, "block_size")
        block_size = None if block is None else int(block)
        kv_dtype = (label(cc, "cache_dtype") or "auto").lower()
        max_len = max_model_len(cc)
        key = (block_size, kv_dtype, max_len)
        if key not in self._layouts:
            self._layouts[key] = cap.kv_layout(
                self.spec,
                tp=self.settings.tensor_parallel_size,
                pp=self.settings.pipeline_parallel_size,
                dtype=self.settings.dtype,
                kv_cache_dtype=kv_dtype if kv_dtype in _FP8 + ("auto",) else "auto",
                block_size=block_size,
                max_model_len=max_len,
            )
        return self._layouts[key]

    def theory(self, obs: Observation) -> Theory | None:
        """The model's figures for this engine's settings; None without cache_config_info, while the
        model is not loaded, or when the model cannot follow vLLM's settings."""
        answer = self._theory(obs)
        return answer if isinstance(answer, Theory) else None

    def _theory(self, obs: Observation) -> Theory | str | None:
        """:meth:`theory`, or the problem (text) when the model cannot follow vLLM's settings."""
        if self._last[0] is obs:
            return self._last[1]
        answer = self._compute(obs)
        self._last = (obs, answer)
        return answer

    def _compute(self, obs: Observation) -> Theory | str | None:
        cc = obs.cache_config
        if not cc or self._spec is None:
            return None
        try:
            layout = self.layout_for(cc)
        except cap.CapacityError as e:
            return str(e)
        exact = estimated = None
        budget = None
        kv_bytes = label_float(cc, "kv_cache_memory_bytes")
        max_len = max_model_len(cc)
        if kv_bytes:
            exact = self._tokens(layout, int(kv_bytes), max_len)
        util = label_float(cc, "gpu_memory_utilization")
        if self.gpu_memory and util and not kv_bytes:
            try:
                m = self.settings
                budget = cap.estimate_budget(
                    self.spec,
                    layout,
                    gpu_memory_bytes=self.gpu_memory,
                    gpu_memory_utilization=util,
                    flags=cap.ServingFlags(
                        vllm_version=served_version(cc, m.vllm_version),
                        gpu_name=cap.gpu_name(m.gpu_memory) if m.gpu_memory else None,
                        max_num_batched_tokens=layout.max_num_batched_tokens,
                    ),
                    weights=m.weights_memory,
                    activation_bytes=m.activation_memory,
                    non_torch_bytes=m.non_torch_memory,
                    cudagraph_bytes=m.cudagraph_memory,
                )
                estimated = self._tokens(layout, budget.kv_budget_bytes, max_len)
            except cap.CapacityError as e:  # e.g. the weights alone exceed the budget: no estimate, said once
                estimated = None  # the budget's terms stay: they say what took the memory
                if ("estimate", obs.engine) not in self._warned:
                    self._warned.add(("estimate", obs.engine))
                    log.warning(
                        "no estimated capacity engine=%s: %s (check model.gpu_memory and the model.*_memory overrides)",
                        obs.engine,
                        e,
                    )
        return Theory(layout, exact, estimated, budget)

    def served_model(self, layout: cap.KVLayout) -> ServedModel:
        """What the advice policy needs of the model for this layout (the daemon's and the report's)."""
        return ServedModel(
            bytes_per_token=layout.bytes_per_token,
            kv_dtype_bytes=layout.kv_dtype_bytes,
            kv_heads=layout.kv_heads,
            attention=layout.attention,
            tensor_parallel=layout.tp,
            gpu_memory_bytes=self.gpu_memory,
            non_kv_bytes=functools.partial(self.non_kv_bytes, layout),
        )

    def non_kv_bytes(self, layout: cap.KVLayout) -> cap.NonKVBytes:
        """Weights, activation peak, non-torch and CUDA-graph bytes on one rank: the model.*_memory
        overrides, else the capacity model's estimates (docs/capacity.md, "The budget"; CUDA graphs
        only when given)."""
        m = self.settings
        return cap.non_kv_bytes(
            self.spec,
            layout,
            max_num_batched_tokens=layout.max_num_batched_tokens,
            weights=m.weights_memory,
            activation_bytes=m.activation_memory,
            non_torch_bytes=m.non_torch_memory,
            cudagraph_bytes=m.cudagraph_memory or 0,
        )

    @staticmethod
    def _tokens(layout: cap.KVLayout, budget_bytes: int, max_model_len: int | None) -> int:
        """vLLM's capacity figure for a budget, by the rule of the version that exported the labels.

        With ``kv_cache_size_tokens``/``kv_cache_max_concurrency`` present (vLLM 0.21+,
        PR #42206) vLLM reports ``int(max_concurrency × max_model_len)``
        (``get_kv_cache_capacity`` in ``vllm/v1/core/kv_cache_utils.py``); before,
        ``num_blocks × block_size`` (docs/capacity.md, "The tokens line across versions").
        They agree for full attention when ``max_model_len`` is a multiple of the block size.
        """
        if max_model_len:
            return cap.logged_capacity_tokens(layout, cap.num_blocks(layout, budget_bytes), max_model_len=max_model_len)
        return cap.capacity_tokens(layout, budget_bytes)

    def __call__(self, key: TargetModelEngine, history: History, now: float, d: Derived) -> dict[str, object]:
        self._load(now, key[1])
        obs = history[-1][1]
        th = self._theory(obs)
        self._follow(key, th)
        loaded = {(self.reason,): 1.0 if self.reason == discovery.LOADED else 0.0}
        if not isinstance(th, Theory):
            return {"kvcache_model_config_loaded": loaded}
        layout = th.layout
        out: dict[str, object] = {
            "kvcache_model_config_loaded": loaded,
            "kvcache_theoretical_bytes_per_token": layout.bytes_per_token,
            "kvcache_model_info": {
                (layout.architecture, layout.attention, layout.kv_dtype, str(layout.tp), str(layout.pp)): 1.0
            },
        }
        theoretical: dict[tuple[str, ...], float] = {}
        efficiency: dict[tuple[str, ...], float] = {}
        actual = actual_capacity(obs.cache_config, d.pool)
        for budget, tokens in (("exact", th.exact_tokens), ("estimated", th.estimated_tokens)):
            if tokens is None:
                continue
            theoretical[(budget,)] = tokens
            if actual is not None and tokens > 0:
                efficiency[(budget,)] = actual / tokens
                self._explain(key, budget, actual, tokens)
        if th.budget is not None:
            out["kvcache_budget_dominant_overhead_info"] = {(th.budget.dominant_overhead,): 1.0}
        if theoretical:
            out["kvcache_theoretical_capacity_tokens"] = theoretical
        if efficiency:
            out["kvcache_capacity_efficiency_ratio"] = efficiency
        return out

    def _follow(self, key: TargetModelEngine, answer: Theory | str | None) -> None:
        """Log that the model cannot follow this engine's settings when it starts (or its reason changes)
        and when it ends, with the number of scrapes it lasted; never on every scrape."""
        failing = self._failing.get(key)
        if isinstance(answer, str):
            if failing is None or failing[0] != answer:
                log.warning(
                    "capacity model cannot follow vLLM's settings target=%s model=%s engine=%s: %s "
                    "(the capacity gauges of this engine are absent; logged again when it ends)",
                    key[0],
                    key[1],
                    key[2],
                    answer,
                )
                failing = (answer, 0)
            self._failing[key] = (answer, failing[1] + 1)
        elif failing is not None and answer is not None:
            del self._failing[key]
            log.info(
                "capacity model follows vLLM's settings again target=%s model=%s engine=%s after %d scrape%s",
                key[0],
                key[1],
                key[2],
                failing[1],
                "" if failing[1] == 1 else "s",
            )

    def forget(self, key: TargetModelEngine) -> None:
        """The model/engine left its target: drop what was kept about it."""
        self._failing.pop(key, None)
        self._warned = {w for w in self._warned if w[0] != key}

    def _explain(self, key: TargetModelEngine, budget: str, actual: float, theoretical: float) -> None:
        if abs(actual / theoretical - 1) <= self.TOLERANCE or (key, budget) in self._warned:
            return
        self._warned.add((key, budget))
        log.warning(
            "vLLM's KV capacity differs from the model's theoretical one model=%s engine=%s budget=%s "
            "actual=%d theoretical=%d ratio=%.3f likely causes: served dtype differs from model.dtype "
            "(float32 downcast to bfloat16), tensor/pipeline parallel sizes differ from model.*, hybrid "
            "(sliding-window or mamba) layers, CUDA-graph memory (vLLM >= 0.21 budgets it), speculative-decoding "
            "draft layers sharing the pool, or --num-gpu-blocks-override",
            key[1],
            key[2],
            budget,
            actual,
            theoretical,
            actual / theoretical,
        )
