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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from .config import TargetConfig
from .derive import Derived, derive
from .observation import DROP_REASONS, EngineScrape, Observation
from .scrape import REASONS

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
    extra: Mapping[ModelEngine, Mapping[str, object]] = field(default_factory=dict)
    cache_configs: Mapping[ModelEngine, Mapping[str, str]] = field(default_factory=dict)


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
    last_cache_config: dict[str, Mapping[str, str]] = field(default_factory=dict)  # per engine
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


#: Extension point for the derivation layers (capacity model, forecast; ``sidecar.layers``): called
#: per engine after the base derivation with (TargetModelEngine, history, now, derived) -> extra gauges.
#: A layer may define ``forget(engine: TargetModelEngine)``, called when that model/engine disappears
#: from its target, to drop its own state.
Extender = Callable[[TargetModelEngine, History, float, Derived], Mapping[str, object]]


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
    present: set[ModelEngine] = set()
    for obs in scrape.observations:
        obs = _intern_cache_config(state, obs)
        present.add(obs.key)
        hist = state.history.setdefault(obs.key, deque())
        if hist and sample_time < hist[-1][0]:
            hist.clear()  # the clock went backwards (a replay restarted): old samples are meaningless
        hist.append((sample_time, obs))
        while hist and hist[0][0] < sample_time - state.history_s:
            hist.popleft()
    for gone in set(state.history) - present:  # a model/engine vanished: its series go with it
        del state.history[gone]
        for extend in extenders:
            forget = getattr(extend, "forget", None)
            if forget is not None:
                forget((state.target.name,) + gone)
    _prune(state, present)
    derived: dict[ModelEngine, Derived] = {}
    extra: dict[ModelEngine, Mapping[str, object]] = {}
    for key, hist in state.history.items():
        d = derive(hist, sample_time, window_s=window_s, watermark=watermark)
        derived[key] = d
        merged: dict[str, object] = {}
        for extend in extenders:
            try:
                merged.update(extend((state.target.name,) + key, hist, sample_time, d))
            except Exception:  # a layer's bug or an odd input must not cost the base gauges
                _log_layer_failure(state, extend, key)
        extra[key] = merged
    state.failing_reason = state.failing_field = None
    state.failing_count = 0
    state.snapshot = Snapshot(
        up=True,
        last_success_wall=wall_time,
        last_duration_s=duration_s,
        engine_kind=scrape.engine_kind,
        generation=scrape.generation,
        derived=derived,
        extra=extra,
        cache_configs={k: h[-1][1].cache_config for k, h in state.history.items()},
    )


def _prune(state: TargetState, present: set[ModelEngine]) -> None:
    """Forget what was kept per engine for the engines that are gone (engines come and go with restarts)."""
    engines = {engine for _, engine in present}
    for engine in [e for e in state.last_cache_config if e not in engines]:
        del state.last_cache_config[engine]
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


def _intern_cache_config(state: TargetState, obs: Observation) -> Observation:
    """Count a cache-config change (a restart with new settings); share equal dicts to save memory."""
    previous = state.last_cache_config.get(obs.engine)
    if previous is not None and previous == obs.cache_config:
        return replace(obs, cache_config=previous)
    if previous is not None and obs.cache_config:
        changed = sorted(k for k in set(previous) | set(obs.cache_config) if previous.get(k) != obs.cache_config.get(k))
        state.config_changes += 1
        log.warning(
            "cache config changed target=%s engine=%s fields=%s",
            state.target.name,
            obs.engine,
            ",".join(f"{k}:{previous.get(k)}->{obs.cache_config.get(k)}" for k in changed[:8]),
        )
    if obs.cache_config:
        state.last_cache_config[obs.engine] = obs.cache_config
    return obs
