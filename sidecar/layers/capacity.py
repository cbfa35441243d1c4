"""The capacity layer: the theoretical KV capacity from config.json next to the engine's own figure.

Gauges ``kvcache_theoretical_bytes_per_token``, ``kvcache_model_info``,
``kvcache_theoretical_capacity_tokens{budget}`` and
``kvcache_capacity_efficiency_ratio{budget}`` (docs/capacity.md). Pure: the model's
config.json is found, loaded and watched at the edge (:mod:`sidecar.model_source`, which the
daemon calls per scrape), which puts it in the layer's :class:`ModelSlot`; per scrape the layer only
reads the model it is handed and the block size, KV dtype and ``max_model_len`` of the engine's typed
:class:`~sidecar.observation.KVPool`.

While the model is not loaded the capacity gauges are absent (``kvcache_model_config_loaded`` says
why). A condition repeated on every scrape (engine settings the model cannot follow) is logged when
it starts and when it ends, with the number of scrapes it lasted.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from .. import capacity as cap
from .. import model_discovery as discovery
from ..capacity.blocks import parse_version
from ..capacity.vllm_rules import utilization_flag
from ..config import ModelSettings
from ..engine_cmdline import EngineArgs
from ..forecast.policy import ServedModel
from ..metrics import Gauge, MetricDoc, entry
from ..observation import KVPool
from ..state import Step, TargetModelEngine

log = logging.getLogger("kv_sidecar.layers")

#: KV dtype names that mean a 1-byte KV cache (vllm/config/cache.py CacheDType).
_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")

MODEL_CONFIG_LOADED = entry("kvcache_model_config_loaded")
BYTES_PER_TOKEN = entry("kvcache_theoretical_bytes_per_token")
MODEL_INFO = entry("kvcache_model_info")
THEORETICAL_CAPACITY = entry("kvcache_theoretical_capacity_tokens")
EFFICIENCY = entry("kvcache_capacity_efficiency_ratio")
DOMINANT_OVERHEAD = entry("kvcache_budget_dominant_overhead_info")
SETTING_INFO = entry("kvcache_model_setting_info")

#: kvcache_model_setting_info's sources
CMDLINE, METRICS, CONFIG, DEFAULT = "cmdline", "metrics", "config", "default"


@dataclass(frozen=True)
class Served:
    """The serving settings the capacity model uses for one engine, and where each came from
    (``sources``: setting -> (value as text, source); a setting nobody gave is not there).

    Precedence (docs/configuration.md, ``model.process_discovery``): vLLM's page for what it exports,
    then vLLM's command line (what runs), then the ``model:`` section, then vLLM's default."""

    tp: int = 1
    pp: int = 1
    dtype: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    sources: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False)


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _first(*candidates: tuple[object, str]) -> tuple[object, str] | None:
    """The first (value, source) whose value is not None."""
    return next((c for c in candidates if c[0] is not None), None)


def served_settings(settings: ModelSettings, pool: KVPool | None, learnt: EngineArgs | None) -> Served:
    """What one engine runs with, from its page (``pool``), its command line (``learnt``: None when
    not read) and the ``model:`` section, in that order (:class:`Served`). A command line read whole
    (its ``--config`` file too) also says what it leaves out: vLLM's default (TP 1, PP 1, dtype auto,
    CUDA graphs on)."""
    whole = learnt is not None and not any(p.startswith("--config") for p in learnt.problems)
    cmd = learnt or EngineArgs()
    implied = CMDLINE if whole else None
    util = pool.memory_fraction if pool is not None and pool.memory_lever == "gpu_memory_utilization" else None
    page = pool or KVPool()
    picks: dict[str, tuple[object, str] | None] = {
        "tensor_parallel_size": _first(
            (cmd.tensor_parallel_size, CMDLINE),
            (1 if implied else None, CMDLINE),
            (settings.tensor_parallel_size, CONFIG if settings.tensor_parallel_size != 1 else DEFAULT),
        ),
        "pipeline_parallel_size": _first(
            (cmd.pipeline_parallel_size, CMDLINE),
            (1 if implied else None, CMDLINE),
            (settings.pipeline_parallel_size, CONFIG if settings.pipeline_parallel_size != 1 else DEFAULT),
        ),
        "dtype": _first(
            (cmd.dtype, CMDLINE), ("auto" if implied else None, CMDLINE), (settings.dtype, CONFIG), ("auto", DEFAULT)
        ),
        "kv_cache_dtype": _first((page.kv_dtype, METRICS), (cmd.kv_cache_dtype, CMDLINE), ("auto", DEFAULT)),
        "max_model_len": _first((page.max_model_len, METRICS), (cmd.max_model_len, CMDLINE)),
        "kv_cache_memory_bytes": _first(
            (page.kv_cache_memory_bytes or None, METRICS), (cmd.kv_cache_memory_bytes, CMDLINE)
        ),
        "gpu_memory_utilization": _first((util, METRICS), (cmd.gpu_memory_utilization, CMDLINE)),
        "max_num_seqs": _first((cmd.max_num_seqs, CMDLINE)),
        "max_num_batched_tokens": _first((cmd.max_num_batched_tokens, CMDLINE)),
        "enforce_eager": _first((cmd.enforce_eager, CMDLINE), (False if implied else None, CMDLINE)),
    }
    got = {name: pick for name, pick in picks.items() if pick is not None}
    value = {name: pick[0] for name, pick in got.items()}
    dtype = value.get("dtype")
    return Served(
        tp=int(value["tensor_parallel_size"]),  # type: ignore[call-overload]
        pp=int(value["pipeline_parallel_size"]),  # type: ignore[call-overload]
        dtype=None if dtype in (None, "auto") else str(dtype),
        kv_cache_dtype=str(value["kv_cache_dtype"]),
        max_model_len=value.get("max_model_len"),  # type: ignore[arg-type]
        kv_cache_memory_bytes=value.get("kv_cache_memory_bytes"),  # type: ignore[arg-type]
        gpu_memory_utilization=value.get("gpu_memory_utilization"),  # type: ignore[arg-type]
        max_num_seqs=value.get("max_num_seqs"),  # type: ignore[arg-type]
        max_num_batched_tokens=value.get("max_num_batched_tokens"),  # type: ignore[arg-type]
        enforce_eager=bool(value.get("enforce_eager", False)),
        sources={name: (_text(v), src) for name, (v, src) in got.items()},
    )


@dataclass(frozen=True)
class Theory:
    """What the capacity model says about one engine, given its pool's settings."""

    layout: cap.KVLayout
    exact_tokens: int | None  # from the engine's kv_cache_memory_bytes
    estimated_tokens: int | None  # from the GPU-memory estimator
    budget: cap.Budget | None  # the estimated budget (weights, activation, ...)


def rules_version(floor: str | None, configured: str | None) -> str | None:
    """The vLLM version whose profile rules apply: the configured one (``model.vllm_version``) unless
    the page proves a later one (the pool's ``version_floor``), else that floor, else None (the
    newest rules); :func:`sidecar.capacity.vllm_rules.served_version` on typed input."""
    if configured is None or floor is None:
        return configured or floor
    return floor if parse_version(configured) < parse_version(floor) else configured  # type: ignore[operator]


@dataclass
class ModelSlot:
    """The served model's config.json as the edge last loaded it, and where loading stands: what the
    capacity layer reads. Pure data: :class:`sidecar.model_source.ModelSource` (the edge) finds, loads
    and watches the file and writes here; the layer never touches a file."""

    settings: ModelSettings
    #: how often, in seconds of sample time, a missing or changed file is looked for
    retry_s: float
    #: the loaded model; None while it is not (then :attr:`problem` says why)
    model: cap.ModelSpec | None = None
    #: kvcache_model_config_loaded's reason (sidecar.model_discovery.REASONS)
    reason: str = discovery.WAITING
    #: why the model is not loaded, as last logged
    problem: str | None = None
    #: the edge's watcher filling this slot (a ModelSource), made at the first refresh
    watcher: object | None = None
    #: what each target's vLLM runs, read from its command line (sidecar.process_discovery): target -> args
    learnt: dict[str, EngineArgs] = field(default_factory=dict)
    #: the edge's process watchers, one per target (ProcessDiscovery), made at the first refresh
    finders: dict[str, object] = field(default_factory=dict)


class CapacityLayer:
    """Theoretical capacity from config.json (``model.*`` settings) next to vLLM's own figure."""

    #: relative disagreement above which the likely causes are logged (once per engine and budget)
    TOLERANCE = 0.05

    def __init__(self, settings: ModelSettings, *, retry_s: float = 15.0):
        """``settings`` as :func:`sidecar.config.build_config` validated them. The layer reads its model
        from :attr:`slot`, which the edge fills (:func:`sidecar.model_source.refresh_models`, every
        ``retry_s`` seconds of sample time while the file is not there or not usable)."""
        if settings.config is None:
            raise ValueError("CapacityLayer needs model.config")
        self.settings = settings
        self.gpu_memory = None if settings.gpu_memory is None else cap.parse_memory(settings.gpu_memory)
        #: the served model as the edge last loaded it; the layer only reads it
        self.slot = ModelSlot(settings, retry_s)
        #: the model the caches below were computed for (a new one empties them)
        self._model: cap.ModelSpec | None = None
        self._layouts: dict[tuple[object, ...], cap.KVLayout] = {}
        #: warnings already logged: ("estimate", engine) and (engine key, budget)
        self._warned: set[tuple[object, str]] = set()
        #: engines whose settings the model cannot follow: the problem and the scrapes since it began
        self._failing: dict[TargetModelEngine, tuple[str, int]] = {}

    @property
    def spec(self) -> cap.ModelSpec:
        """The loaded model; :class:`~sidecar.capacity.CapacityError` while it is not (see :attr:`ready`)."""
        model = self.slot.model
        if model is None:
            raise cap.CapacityError(f"--model-config: {self.slot.problem or 'not loaded'}")
        if model is not self._model:  # a new model (or revision): the layouts were another model's
            self._model = model
            self._layouts.clear()
        return model

    @property
    def ready(self) -> bool:
        """Whether the model is loaded (the capacity gauges are published)."""
        return self.slot.model is not None

    @property
    def reason(self) -> str:
        """Where loading stands (kvcache_model_config_loaded's reason)."""
        return self.slot.reason

    def served(self, target: str, pool: KVPool | None) -> Served:
        """What the engines of ``target`` run with (:func:`served_settings` on what the edge learnt)."""
        return served_settings(self.settings, pool, self.slot.learnt.get(target))

    def layout(
        self, *, block_size: int | None, kv_dtype: str | None, max_model_len: int | None, served: Served | None = None
    ) -> cap.KVLayout:
        """The layout the engine built: its block size, KV dtype and ``max_model_len`` on the loaded model
        (``kv_dtype`` other than fp8 or auto reads as the model's dtype), with the parallel sizes and
        dtype of ``served`` (None: the ``model:`` section's)."""
        dtype = (kv_dtype or "auto").lower()
        run = served or served_settings(self.settings, None, None)
        key = (block_size, dtype, max_model_len, run.tp, run.pp, run.dtype, run.max_num_batched_tokens)
        spec = self.spec
        if key not in self._layouts:
            extra = {} if run.max_num_batched_tokens is None else {"max_num_batched_tokens": run.max_num_batched_tokens}
            self._layouts[key] = cap.kv_layout(
                spec,
                tp=run.tp,
                pp=run.pp,
                dtype=run.dtype,
                kv_cache_dtype=dtype if dtype in _FP8 + ("auto",) else "auto",
                block_size=block_size,
                max_model_len=max_model_len,
                **extra,  # type: ignore[arg-type]
            )
        return self._layouts[key]

    def theory(self, pool: KVPool | None, engine: str = "0", served: Served | None = None) -> Theory | None:
        """The model's figures for this pool's settings; None without a pool, while the model is not
        loaded, or when the model cannot follow the engine's settings. ``served``: what the engine runs
        with (:meth:`served`; None: the page and the ``model:`` section)."""
        answer = self._compute(pool, engine, served)
        return answer if isinstance(answer, Theory) else None

    def _compute(self, pool: KVPool | None, engine: str, served: Served | None = None) -> Theory | str | None:
        """:meth:`theory`, or the problem (text) when the model cannot follow the engine's settings."""
        if pool is None or not self.ready:
            return None
        run = served or served_settings(self.settings, pool, None)
        try:
            layout = self.layout(
                block_size=pool.block_size, kv_dtype=run.kv_cache_dtype, max_model_len=run.max_model_len, served=run
            )
        except cap.CapacityError as e:
            return str(e)
        exact = estimated = None
        budget = None
        kv_bytes = run.kv_cache_memory_bytes
        if kv_bytes:
            exact = self._tokens(layout, kv_bytes, run.max_model_len)
        util = run.gpu_memory_utilization
        if self.gpu_memory and util and not kv_bytes:
            budget, estimated = self._estimate(layout, util, pool, engine, run)
        return Theory(layout, exact, estimated, budget)

    def _estimate(
        self, layout: cap.KVLayout, util: float, pool: KVPool, engine: str, run: Served
    ) -> tuple[cap.Budget | None, int | None]:
        """The estimated budget at ``util`` of the GPU's memory and the capacity it gives. When the
        capacity cannot be had (e.g. the weights alone exceed the budget) the budget's terms stay (they
        say what took the memory) and the reason is logged once per engine."""
        m = self.settings
        assert self.gpu_memory is not None
        budget = None
        try:
            budget = cap.estimate_budget(
                self.spec,
                layout,
                gpu_memory_bytes=self.gpu_memory,
                gpu_memory_utilization=util,
                flags=cap.ServingFlags(
                    vllm_version=rules_version(pool.version_floor, m.vllm_version),
                    gpu_name=cap.gpu_name(m.gpu_memory) if m.gpu_memory else None,
                    max_num_batched_tokens=layout.max_num_batched_tokens,
                    max_num_seqs=run.max_num_seqs,
                    enforce_eager=run.enforce_eager,
                ),
                weights=m.weights_memory,
                activation_bytes=m.activation_memory,
                non_torch_bytes=m.non_torch_memory,
                cudagraph_bytes=m.cudagraph_memory,
            )
            return budget, self._tokens(layout, budget.kv_budget_bytes, run.max_model_len)
        except cap.CapacityError as e:
            if ("estimate", engine) not in self._warned:
                self._warned.add(("estimate", engine))
                log.warning(
                    "no estimated capacity engine=%s: %s (check model.gpu_memory and the model.*_memory overrides)",
                    engine,
                    e,
                )
            return budget, None

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
            gpu_name=(cap.gpu_name(self.settings.gpu_memory) or "") if self.settings.gpu_memory else "",
            utilization_flag=utilization_flag(v) if (v := self.settings.vllm_version) else None,
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

    def __call__(self, step: Step) -> dict[MetricDoc, Gauge]:
        """The capacity gauges of one engine; hands the served model on to the next layer (the forecast's
        advice) as :attr:`Step.served_model`."""
        key, pool = step.key, step.observation.pool
        run = self.served(key[0], pool)
        th = self._compute(pool, key[2], run)
        self._follow(key, th)
        reason = self.reason
        out: dict[MetricDoc, Gauge] = {MODEL_CONFIG_LOADED: {(reason,): 1.0 if reason == discovery.LOADED else 0.0}}
        out[SETTING_INFO] = {(name, value, source): 1.0 for name, (value, source) in run.sources.items()}
        if not isinstance(th, Theory) or pool is None:
            return out
        layout = th.layout
        step.served_model = self.served_model(layout)
        out[BYTES_PER_TOKEN] = layout.bytes_per_token
        labels = (layout.architecture, layout.attention, layout.kv_dtype, str(layout.tp), str(layout.pp))
        out[MODEL_INFO] = {labels: 1.0}
        theoretical: dict[tuple[str, ...], float] = {}
        efficiency: dict[tuple[str, ...], float] = {}
        actual = pool.capacity_tokens  # the engine's own figure (for a hybrid pool: its group-aware one)
        for budget, tokens in (("exact", th.exact_tokens), ("estimated", th.estimated_tokens)):
            if tokens is None:
                continue
            theoretical[(budget,)] = tokens
            if actual is not None and tokens > 0:
                efficiency[(budget,)] = actual / tokens
                self._explain(key, budget, actual, tokens)
        if th.budget is not None:
            out[DOMINANT_OVERHEAD] = {(th.budget.dominant_overhead,): 1.0}
        if theoretical:
            out[THEORETICAL_CAPACITY] = theoretical
        if efficiency:
            out[EFFICIENCY] = efficiency
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
