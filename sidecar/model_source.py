"""The edge that finds, loads and watches the served model's ``config.json`` (``model.config``).

The capacity layer (:class:`sidecar.layers.capacity.CapacityLayer`) is pure: it reads the model it is
handed and never touches a file. This module does the file work for it:

* :class:`ModelSource` locates the file (:func:`sidecar.model_discovery.locate`: a file, a model
  directory or a Hugging Face hub cache), loads it with :func:`sidecar.capacity.load_model`, and puts the
  model and where loading stands (``kvcache_model_config_loaded``'s reason) in the layer's
  :class:`~sidecar.layers.capacity.ModelSlot`;
* :func:`refresh_models` is the one call the daemon makes per good scrape (``Sidecar.record``, before
  ``state.ingest_success``): every layer's source looks again, at most once per ``retry_s`` of
  *sample* time, so a replay at any speed reads the file exactly as the daemon would.

A ``model.config`` that is not there yet (a sidecar starts before vLLM, which may still be downloading
the model) is looked for again every ``retry_s``: the wait is logged once when it starts and once when
the file appears; a file that cannot be used is read again only once it changed (inode, size, mtime).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable

from . import capacity as cap
from . import model_discovery as discovery
from . import process_discovery as processes
from .config import TargetConfig
from .engine_cmdline import EngineArgs
from .layers.capacity import ModelSlot, served_settings
from .observation import EngineScrape

log = logging.getLogger("kv_sidecar.layers")


class ModelSource:
    """Finds, loads and watches the served model's config.json, and puts what it found in a slot."""

    def __init__(self, slot: ModelSlot):
        """``slot``: where the model goes (a capacity layer's :class:`~sidecar.layers.capacity.ModelSlot`,
        whose settings have ``model.config`` set)."""
        if slot.settings.config is None:
            raise ValueError("ModelSource needs model.config")
        self.slot = slot
        self.settings = slot.settings
        self.retry_s = slot.retry_s
        self._next_try = -math.inf
        self._identity: tuple[int, int, int] | None = None  # the unusable file `problem` was about
        self._path: str | None = None  # the config.json the loaded model was read from
        self._tries = 0

    def poll(self, now: float | None, model_name: str | None = None) -> None:
        """Look for the served model's config.json and load it when it is new: at most once per
        ``retry_s`` of sample time (``now``; None = now, whatever the last try), a file that could not
        be used only once it changed, and again when the file found changes (a new revision or model in
        a hub cache). ``model_name``: the served model's name, for a hub cache or a folder of models."""
        if now is not None and now < self._next_try:
            return
        self._next_try = -math.inf if now is None else now + self.retry_s
        found = discovery.locate(self.settings.config or "", model_name)
        if found.path is not None and found.path == self._path and self.slot.model is not None:
            return
        if found.path is None:
            self._waiting(found)
            return
        identity = _file_identity(found.path)
        if self.slot.problem is not None and identity is not None and identity == self._identity:
            return  # the same unusable file: nothing new to read
        self._read(found.path, identity)

    def _waiting(self, found: discovery.Located) -> None:
        """No file to read (yet): drop the model and log when the wait starts or its reason changes."""
        self._drop(found.reason)
        if self.slot.problem != found.reason:
            log.warning(
                "model.config: %s; the capacity gauges are absent until it is there "
                "(looked for every %gs; logged again when it is)",
                found.detail,
                self.retry_s,
            )
        self.slot.problem, self._identity = found.reason, None

    def _read(self, path: str, identity: tuple[int, int, int] | None) -> None:
        """Load ``path``; on success the model replaces the previous one, else the problem is logged once."""
        self._tries += 1
        # the parallel sizes vLLM runs with when its command line was read (one target), else model.*'s
        learnt = next(iter(self.slot.learnt.values())) if len(self.slot.learnt) == 1 else None
        run = served_settings(self.settings, None, learnt)
        try:
            spec = cap.load_model(path)
            cap.kv_layout(spec, tp=run.tp, pp=run.pp, dtype=run.dtype)
        except cap.CapacityError as e:  # ModelFileMissing too: removed between locate() and the read
            problem = "; ".join(e.problems)
            if problem != self.slot.problem:
                log.error(
                    "model.config %s cannot be used: %s; the capacity gauges are absent until the file is fixed "
                    "(kv-sidecar check-config names every problem)",
                    path,
                    problem,
                )
            self._drop(discovery.INVALID)
            self.slot.problem, self._identity = problem, identity
            return
        if self.slot.problem is not None or self._path is not None:
            log.info(
                "model.config %s: loaded after %d attempt%s (%s); the capacity gauges are published",
                path,
                self._tries,
                "" if self._tries == 1 else "s",
                spec.architecture,
            )
        self.slot.model, self._path, self.slot.problem, self._identity = spec, path, None, None
        self.slot.reason = discovery.LOADED

    def _drop(self, reason: str) -> None:
        """Forget the loaded model (its file is gone, or another one is due): no gauge from a stale model."""
        self.slot.model, self._path, self.slot.reason = None, None, reason


def _file_identity(path: str | None) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of ``path``: a file replaced or rewritten has another identity."""
    try:
        st = os.stat(path or "")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def refresh_models(
    extenders: Iterable[object],
    now: float | None,
    scrape: EngineScrape | None = None,
    target: TargetConfig | None = None,
) -> None:
    """Let every layer's model slot be filled: its file looked for once per served model of ``scrape``
    (or once, for none), at most once per ``retry_s`` of sample time (``now``; None = now, whatever the
    last try); with ``target`` (the scraped one) and ``model.process_discovery`` on, the target's vLLM
    process is looked for too (:mod:`sidecar.process_discovery`) and what its command line says goes in
    the slot's ``learnt`` (its model, as given to vLLM, then finds the config.json in a hub cache or a
    folder of models even when ``--served-model-name`` is an alias).

    The daemon calls it per good scrape, before ``state.ingest_success`` (so the layers then read the
    model as loaded now); a layer with a slot has it as its ``slot`` attribute, and its watcher is made
    at the first call.
    """
    for slot in (s for s in (getattr(x, "slot", None) for x in extenders) if isinstance(s, ModelSlot)):
        if slot.settings.config is None:
            continue
        if not isinstance(slot.watcher, ModelSource):
            slot.watcher = ModelSource(slot)
        learnt = learn(slot, target, now) if target is not None else None
        if learnt is not None and learnt.model:
            names: list[str | None] = [learnt.model]
        else:
            names = [o.model_name for o in scrape.observations] if scrape is not None else [None]
        for name in names or [None]:
            slot.watcher.poll(now, name)


def learn(slot: ModelSlot, target: TargetConfig, now: float | None) -> EngineArgs | None:
    """What ``target``'s vLLM command line says (None: off, not found, ambiguous), kept in ``slot.learnt``.
    A ``model:`` value the command line contradicts is logged once per new process (what runs wins)."""
    if not slot.settings.process_discovery:
        slot.learnt.pop(target.name, None)
        return None
    finder = slot.finders.get(target.name)
    if not isinstance(finder, processes.ProcessDiscovery) or finder.url != target.url:
        finder = slot.finders[target.name] = processes.ProcessDiscovery(target.url, retry_s=slot.retry_s)
    before = finder.last.server
    found = finder.poll(now).server
    if found is None:
        slot.learnt.pop(target.name, None)
        return None
    slot.learnt[target.name] = found.args
    if before is None or (before.pid, before.start) != (found.pid, found.start):
        _contradicted(slot, target.name, found.args)
    return found.args


def _contradicted(slot: ModelSlot, target: str, args: EngineArgs) -> None:
    """Log each ``model:`` setting the command line contradicts (the command line's value is used)."""
    m, run = slot.settings, served_settings(slot.settings, None, args)
    given = {
        "tensor_parallel_size": (m.tensor_parallel_size, run.tp, m.tensor_parallel_size != 1),
        "pipeline_parallel_size": (m.pipeline_parallel_size, run.pp, m.pipeline_parallel_size != 1),
        "dtype": (m.dtype, run.dtype, m.dtype is not None and args.dtype is not None),
    }
    for name, (config, running, set_) in given.items():
        if set_ and config != running:
            log.warning(
                "model.%s is %s but vLLM runs with %s target=%s (from its command line); %s is used: "
                "fix or remove model.%s",
                name,
                config,
                running,
                target,
                running,
                name,
            )
