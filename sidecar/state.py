"""Per-target state between scrapes: history, self-monitoring counters, the latest derived gauges.

:func:`ingest_success` and :func:`ingest_failure` are the only writers; both
take the time from their caller (sample time and the sidecar's wall time), so
replays at any speed run through exactly the code the daemon runs. The
exporter reads a finished :class:`Snapshot` that is replaced, never mutated,
after each scrape: ``collect()`` on the HTTP thread never sees a half-update.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

from .config import TargetConfig
from .derive import Derived, base_values, derive
from .forecast.policy import ServedModel
from .metrics import Gauge, MetricDoc, Values
from .observation import DROP_REASONS, EngineScrape, KVPool, Observation
from .reasons import REASONS

log = logging.getLogger("kv_sidecar.state")

#: One engine of a target's server, as its series are labelled within that target: (model_name, engine).
ModelEngine = tuple[str, str]
#: The same engine across targets, what a derivation layer is called with: (target, model_name, engine).
TargetModelEngine = tuple[str, str, str]
#: One engine's recent scrapes, (sample time, observation), oldest first.
History = deque[tuple[float, Observation]]


@dataclass(frozen=True)
class Snapshot:
    """What the exporter shows for one target."""

    up: bool = False
    last_success_wall: float | None = None
    last_duration_s: float | None = None
    engine_kind: str | None = None
    generation: str | None = None
    derived: Mapping[ModelEngine, Derived] = field(default_factory=dict)
    #: every gauge of each engine, base and layers', keyed by catalogue row: what the exporter shows
    values: Mapping[ModelEngine, Values] = field(default_factory=dict)


@dataclass
class TargetState:
    target: TargetConfig
    #: Seconds of history kept per key (the longest window any derivation reads).
    history_s: float
    errors: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REASONS})
    #: series the adapter dropped, by reason (observation.DROP_REASONS), all at 0 from the start
    dropped: dict[str, int] = field(default_factory=lambda: {r: 0 for r in DROP_REASONS})
    #: (reason, field) of the series being dropped now -> scrapes in a row: logged when it starts and ends
    rejecting: dict[tuple[str, str], int] = field(default_factory=dict)
    config_changes: int = 0
    history: dict[ModelEngine, History] = field(default_factory=dict)
    #: per (model_name, engine): the last pool seen (a different one is a configuration change). Keyed by
    #: model too: one Triton server serves several TensorRT-LLM models under the same engine index
    #: (``version="1"``), each with its own pool; keyed by engine alone they read as a change every scrape.
    last_cache_config: dict[ModelEngine, KVPool] = field(default_factory=dict)
    snapshot: Snapshot = field(default_factory=Snapshot)
    #: monotonic time of the last tick of the scrape loop (successful or not), for /healthz
    last_tick_monotonic: float | None = None
    #: reason of the current run of failures (None after a success): logs say a failure once, not every scrape
    failing_reason: str | None = None
    #: the field at fault in the current run of failures (a change of field is logged again)
    failing_field: str | None = None
    #: failed scrapes in the current run (the recovery's log line says how many)
    failing_count: int = 0
    #: (layer, key) whose exception was already logged: once each, not at every scrape
    reported_layer_failures: set[tuple[str, ModelEngine]] = field(default_factory=set)


@dataclass
class Step:
    """One engine's derivation at one sample time, handed from layer to layer.

    The layers run in order (capacity, then forecast); a layer writes what a later one needs here as
    data (the capacity layer: :attr:`served_model`), so no layer calls another.
    """

    key: TargetModelEngine
    #: the engine's recent scrapes, oldest first; the last is this step's
    history: History
    #: the sample time
    now: float
    derived: Derived
    #: what the capacity model knows of the served model for this engine's pool (set by the capacity
    #: layer when ``model.config`` is loaded; read by the forecast's advice)
    served_model: ServedModel | None = None

    @property
    def observation(self) -> Observation:
        return self.history[-1][1]


#: Extension point for the derivation layers (capacity model, forecast; ``sidecar.layers``): called per
#: engine after the base derivation with the :class:`Step` -> extra gauges keyed by catalogue row. Pure:
#: no clock, no file (the model's config.json comes from :mod:`sidecar.model_source`). A layer may define
#: ``forget(engine: TargetModelEngine)``, called when that model/engine disappears from its target
#: (:func:`forget_engine`), to drop its own state.
Extender = Callable[[Step], Values]


def forget_engine(extenders: Iterable[object], key: TargetModelEngine) -> None:
    """Tell every layer that has state per engine that ``key`` is gone (it left its target, or its
    target was removed): the one place an engine is forgotten."""
    for extend in extenders:
        forget = getattr(extend, "forget", None)
        if forget is not None:
            forget(key)


def ingest_success(
    state: TargetState,
    scrape: EngineScrape,
    *,
    sample_time: float,
    wall_time: float,
    duration_s: float,
    window_s: float,
    watermark: float,
    extenders: tuple[Extender, ...] = (),
) -> None:
    """Record one good scrape and recompute the target's derived gauges."""
    _note_rejections(state, scrape)
    _forget_another_engine(state, scrape, extenders)
    present: set[ModelEngine] = set()
    for obs in scrape.observations:
        obs = _intern_pool(state, obs)
        present.add(obs.key)
        hist = state.history.setdefault(obs.key, deque())
        if hist and sample_time < hist[-1][0]:
            hist.clear()  # the clock went backwards (a replay restarted): old samples are meaningless
        hist.append((sample_time, obs))
        while hist and hist[0][0] < sample_time - state.history_s:
            hist.popleft()
    for gone in set(state.history) - present:  # a model/engine vanished: its series go with it
        del state.history[gone]
        forget_engine(extenders, (state.target.name,) + gone)
    _prune(state, present)
    derived: dict[ModelEngine, Derived] = {}
    values: dict[ModelEngine, Values] = {}
    for key, hist in state.history.items():
        d = derive(hist, sample_time, window_s=window_s, watermark=watermark)
        derived[key] = d
        merged: dict[MetricDoc, Gauge] = base_values(d, scrape.engine_kind, scrape.generation)
        step = Step((state.target.name,) + key, hist, sample_time, d)
        for extend in extenders:
            try:
                merged.update(extend(step))
            except Exception:  # a layer's bug or an odd input must not cost the base gauges
                _log_layer_failure(state, extend, key)
        values[key] = merged
    state.failing_reason = state.failing_field = None
    state.failing_count = 0
    state.snapshot = Snapshot(
        up=True,
        last_success_wall=wall_time,
        last_duration_s=duration_s,
        engine_kind=scrape.engine_kind,
        generation=scrape.generation,
        derived=derived,
        values=values,
    )


def _forget_another_engine(state: TargetState, scrape: EngineScrape, extenders: tuple[Extender, ...]) -> None:
    """A target (``engine: auto``) whose server is now another engine (vLLM replaced by SGLang on the same
    port) restarted with new settings: one configuration change, and nothing of the old engine is kept
    (its history, pools and the layers' series: its trend, peaks and start time are not the new one's),
    even when the new engine serves the same model name under the same engine index."""
    previous = state.snapshot.engine_kind
    if previous is None or previous == scrape.engine_kind:
        return
    state.config_changes += 1
    log.warning(
        "engine changed target=%s engine_kind:%s->%s; its history starts afresh",
        state.target.name,
        previous,
        scrape.engine_kind,
    )
    for gone in list(state.history):
        del state.history[gone]
        forget_engine(extenders, (state.target.name,) + gone)
    state.last_cache_config.clear()


def _prune(state: TargetState, present: set[ModelEngine]) -> None:
    """Forget what was kept per engine for the engines that are gone (engines come and go with restarts)."""
    for key in [k for k in state.last_cache_config if k not in present]:
        del state.last_cache_config[key]
    state.reported_layer_failures = {tag for tag in state.reported_layer_failures if tag[1] in present}


def _note_rejections(state: TargetState, scrape: EngineScrape) -> None:
    """Count the series the adapter dropped; log each (reason, field) when it starts and when it ends."""
    for reason, n in scrape.dropped.items():
        state.dropped[reason] += n
    current = scrape.rejected
    for cond, example in current.items():
        if cond not in state.rejecting:
            state.rejecting[cond] = 0
            log.warning(
                "series dropped target=%s reason=%s field=%s example=%s (logged again when it ends)",
                state.target.name,
                cond[0],
                cond[1],
                example,
            )
        state.rejecting[cond] += 1
    for cond in [c for c in state.rejecting if c not in current]:
        scrapes = state.rejecting.pop(cond)
        log.info(
            "series no longer dropped target=%s reason=%s field=%s after %d scrapes",
            state.target.name,
            cond[0],
            cond[1],
            scrapes,
        )


def _log_layer_failure(state: TargetState, extend: object, key: ModelEngine) -> None:
    """Log a layer's exception once per target, layer and key (not at every scrape)."""
    tag = (type(extend).__name__, key)
    if tag not in state.reported_layer_failures:
        state.reported_layer_failures.add(tag)
        log.exception(
            "derivation layer %s failed target=%s model=%s engine=%s; its gauges are withheld",
            type(extend).__name__,
            state.target.name,
            key[0],
            key[1],
        )


def ingest_failure(state: TargetState, reason: str, *, duration_s: float) -> None:
    """Count a failed scrape. Derived gauges stay until the staleness limit (the exporter checks it)."""
    state.errors[reason] += 1
    state.snapshot = replace(state.snapshot, up=False, last_duration_s=duration_s)


#: What a pool that grows or shrinks at run time changes, and nothing else: vLLM's
#: ``--enable-extensible-kv-cache`` (PR #50779 → #56492) commits blocks after warm-up, so
#: ``num_gpu_blocks`` (and with it ``kv_cache_size_tokens`` and ``kv_cache_max_concurrency``) is no
#: longer a start-up constant (``extend_kv_cache`` in ``vllm/v1/worker/extensible_kv_cache.py`` sets
#: ``kv_cache_config.num_blocks`` to the committed count). Typed fields, then the engine's own labels.
SIZE_FIELDS = frozenset({"num_blocks", "capacity_tokens"})
SIZE_INFO = frozenset({"num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency"})


#: ``CacheConfig.enable_extensible_kv_cache``, a ``vllm:cache_config_info`` label like every field of
#: the class: only a pool that says it is extensible may change size without new settings.
EXTENSIBLE_LABEL = "enable_extensible_kv_cache"


def is_resize(old: KVPool, new: KVPool) -> bool:
    """Whether two pools of an extensible engine differ only in their size (a run-time resize).

    A resize is followed per scrape (derive reads each scrape's pool) and keeps every history: it is
    not counted in ``kvcache_sidecar_config_changes_total``, only logged. Any other pool whose size
    changes restarted with new settings (a configuration change).
    """
    if not (old.info.get(EXTENSIBLE_LABEL) == new.info.get(EXTENSIBLE_LABEL) == "True"):
        return False
    if {k: v for k, v in old.info.items() if k not in SIZE_INFO} != {
        k: v for k, v in new.info.items() if k not in SIZE_INFO
    }:
        return False
    return all(
        getattr(old, f.name) == getattr(new, f.name) for f in fields(KVPool) if f.name not in SIZE_FIELDS | {"info"}
    )


def _intern_pool(state: TargetState, obs: Observation) -> Observation:
    """Count a change of the engine's pool (a restart with new settings); share equal pools to save memory.

    A change of size alone (:func:`is_resize`) is logged but not counted: the sizes are read per scrape.
    """
    previous = state.last_cache_config.get(obs.key)
    if previous is not None and previous == obs.pool:
        return replace(obs, pool=previous)
    if previous is not None and obs.pool is not None and is_resize(previous, obs.pool):
        log.info(
            "KV pool resized target=%s engine=%s fields=%s",
            state.target.name,
            obs.engine,
            ",".join(_changes(previous, obs.pool)[:8]),
        )
    elif previous is not None and obs.pool is not None:
        state.config_changes += 1
        log.warning(
            "cache config changed target=%s engine=%s fields=%s",
            state.target.name,
            obs.engine,
            ",".join(_changes(previous, obs.pool)[:8]),
        )
    if obs.pool is not None:
        state.last_cache_config[obs.key] = obs.pool
    return obs


def _changes(old: KVPool, new: KVPool) -> list[str]:
    """What changed, ``name:old->new``: the settings as the engine shows them, else the typed fields."""
    keys = sorted(k for k in set(old.info) | set(new.info) if old.info.get(k) != new.info.get(k))
    if keys:
        return [f"{k}:{old.info.get(k)}->{new.info.get(k)}" for k in keys]
    typed = [f.name for f in fields(KVPool) if f.name != "info" and getattr(old, f.name) != getattr(new, f.name)]
    return [f"{k}:{getattr(old, k)}->{getattr(new, k)}" for k in typed]
