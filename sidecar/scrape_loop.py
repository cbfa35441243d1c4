"""The targets and one scrape of each: what the daemon runs per target, usable in-process.

:class:`Sidecar` holds each target's state, connection pool and parser, and what ``/metrics`` shows.
:meth:`Sidecar.scrape_once` is one scrape of one target: fetch (:mod:`sidecar.scrape`, HTTP), read
(:func:`sidecar.pipeline.read_page`, pure; on a page-reader thread when the page is large,
:mod:`sidecar.page_readers`), record (:func:`sidecar.state.ingest_success`, the derivations), then the
target's exported series go to the history's writer thread (:mod:`sidecar.history_writer`).
:meth:`Sidecar.apply` swaps in a reloaded configuration, keeping every target whose source is unchanged.
What ``/metrics`` shows is the Sidecar's own ``CollectorRegistry`` (never the global one) with one
:class:`~sidecar.exporter.SidecarCollector`.

The scheduler, the HTTP server, reloads and signals that drive it are :mod:`sidecar.daemon`; tests,
benchmarks and replays drive it directly, at simulated time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry

from .config import Config, TargetConfig
from .exporter import HISTORY_ERRORS, SidecarCollector
from .history import HistoryStore, Sample
from .history_writer import HistoryRecorder
from .model_source import refresh_models
from .observation import EngineScrape
from .page_parser import FilteredParser
from .page_readers import PageRead, PageReaders
from .pipeline import parser_for, read_page
from .reasons import ScrapeFailed
from .scrape import fetch, make_client
from .state import Extender, TargetState, forget_engine, ingest_failure, ingest_success

# The daemon's logger: a scrape's failures and recoveries are the daemon's log lines.
log = logging.getLogger("kv_sidecar.daemon")


def same_source(a: TargetConfig, b: TargetConfig) -> bool:
    """Whether a reload keeps a target's state: the same name reading the same server the same way.

    Its other settings (timeout, size limit, token file, TLS) may change: the state is kept and the
    connection pool rebuilt. A new URL, engine or clock is another series of samples: a new state.
    """
    return (a.name, a.url, a.engine, a.clock) == (b.name, b.url, b.engine, b.clock)


@dataclass
class _Target:
    """One target's state and what scraping it needs; replaced only when its source changes."""

    state: TargetState
    client: httpx.AsyncHTTPTransport
    parser: FilteredParser
    #: what /metrics shows of this target alone (the history records it)
    collector: SidecarCollector
    busy: bool = False  # a scrape is in flight
    retired: bool = False  # replaced or removed by a reload: its pool closes when the scrape in flight ends
    #: the read of this target's last page (a reader thread may still run it past its deadline)
    reading: PageRead | None = None


@dataclass(frozen=True)
class TargetChanges:
    """What :meth:`Sidecar.apply` did to the targets, by name."""

    kept: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    reconnected: tuple[str, ...] = ()  # kept, with new connection settings

    def __str__(self) -> str:
        return " ".join(f"{k}={','.join(v) or '-'}" for k, v in vars(self).items())


class Sidecar:
    """Everything the daemon runs, usable in-process by tests and benchmarks."""

    def __init__(
        self,
        config: Config,
        extenders: tuple[Extender, ...] = (),
        clock: Callable[[], float] = time.time,
        history: HistoryStore | None = None,
        history_refused: bool = False,
    ):
        """``history_refused``: ``history.path`` is set but its file could not be used at start; the
        sidecar serves without a history and counts it as one failed write."""
        self.config = config
        self.clock = clock  # wall time, injectable so tests can step past the staleness limit
        self.extenders = extenders
        refresh_models(extenders, None)  # the model looked for now: a wait is said at start, not at the first scrape
        # The collector describes its families (the catalogue), so registering a second collector that
        # exports one of those names fails; auto_describe only matters for collectors without describe().
        self.registry = CollectorRegistry(auto_describe=False)
        self._history = HistoryRecorder(history, refused=history_refused)
        self._targets = {
            t.name: self._target(TargetState(target=t, history_s=config.derive_window_s)) for t in config.targets
        }
        self.states = [rt.state for rt in self._targets.values()]
        self.collector = SidecarCollector(
            self.states,
            staleness_s=config.staleness_s,
            clock=clock,
            history_errors=(lambda: self._history.errors) if history is not None or history_refused else None,
        )
        self.registry.register(self.collector)
        self.started_monotonic = time.monotonic()
        self._readers = PageReaders()

    @property
    def history_errors(self) -> int:
        """Failed history writes since the start (``kvcache_sidecar_history_write_errors_total``)."""
        return self._history.errors

    def _target(self, state: TargetState) -> _Target:
        t = state.target
        return _Target(
            state=state,
            client=make_client(t),
            parser=parser_for(t),
            collector=SidecarCollector([state], staleness_s=self.config.staleness_s, clock=self.clock),
        )

    def apply(
        self, config: Config, extenders: tuple[Extender, ...]
    ) -> tuple[TargetChanges, list[httpx.AsyncHTTPTransport]]:
        """Run with a new (validated) configuration from now on, keeping what it did not change.

        A target whose source is unchanged (:func:`same_source`) keeps its state: its history window,
        counters, snapshot, and the layers' state for it when ``extenders`` are the running ones. The
        others start afresh; removed targets' series go from the next collect(). Returns what changed and
        the connection pools to close now (those of a scrape in flight close when it ends). Everything is
        swapped before returning, with no await: a scrape on the event loop sees the old configuration
        or the new one, never a mix.
        """
        old = self._targets
        targets: dict[str, _Target] = {}
        retired: list[_Target] = []
        reconnected: list[str] = []
        for t in config.targets:
            rt = old.get(t.name)
            if rt is None or not same_source(rt.state.target, t):
                targets[t.name] = self._target(TargetState(target=t, history_s=config.derive_window_s))
                continue
            rt.state.history_s = config.derive_window_s
            rt.collector.reconfigure([rt.state], config.staleness_s)
            if rt.state.target != t:  # new timeout, TLS, token file...: same state, a new pool
                reconnected.append(t.name)
                rt.state.target = t
                retired.append(rt)
                # the read still running on a reader thread stays this target's: its next pages wait for it
                # (a second read beside it would share the parser and break the one-reader bound)
                rt = _Target(rt.state, make_client(t), rt.parser, rt.collector, reading=rt.reading)
            targets[t.name] = rt
        removed = [rt for name, rt in old.items() if name not in targets or targets[name].state is not rt.state]
        if extenders == self.extenders:  # the running layers forget the engines that left with their target
            for rt in removed:
                for key in rt.state.history:
                    forget_engine(extenders, (rt.state.target.name, *key))
        retired += removed
        for rt in retired:
            rt.retired = True
        if extenders != self.extenders:
            refresh_models(extenders, None)  # new layers: their model looked for now, as at start
        self.config, self.extenders, self._targets = config, extenders, targets
        self.states = [rt.state for rt in targets.values()]
        self.collector.reconfigure(self.states, config.staleness_s)
        kept = [name for name, rt in targets.items() if name in old and old[name].state is rt.state]
        changes = TargetChanges(
            kept=tuple(kept),
            added=tuple(name for name in targets if name not in kept),
            removed=tuple(rt.state.target.name for rt in removed),
            reconnected=tuple(reconnected),
        )
        return changes, [rt.client for rt in retired if not rt.busy]

    def _current(self, state: TargetState) -> _Target | None:
        rt = self._targets.get(state.target.name)
        return rt if rt is not None and rt.state is state else None

    async def scrape_once(self, state: TargetState) -> None:
        """Fetch, parse, normalise and derive one target; failures are counted, never raised."""
        rt = self._current(state)
        if rt is None:
            return  # removed by a reload while its job was due
        rt.busy = True
        try:
            await self._scrape(state, rt)
        finally:
            rt.busy = False
            if rt.retired:  # a reload replaced its pool or removed the target meanwhile
                await rt.client.aclose()
            self.queue_history(state)

    async def _scrape(self, state: TargetState, rt: _Target) -> None:
        target = state.target
        state.last_tick_monotonic = time.monotonic()
        start = time.perf_counter()
        try:
            fetched = await fetch(rt.client, target)
            if self._current(state) is None:
                return  # the target was removed by a reload during the fetch: nothing to record
            left_s = target.timeout_s - (time.perf_counter() - start)
            scrape = await self.read_within(state, rt, fetched.body, left_s)
            if self._current(state) is None:
                # removed or replaced by a reload during the read: the layers already forgot its engines,
                # recording it would hand them the old state's sample again (under the new state's keys)
                return
        except asyncio.CancelledError:
            return  # shutting down mid-scrape: nothing to count
        except ScrapeFailed as e:
            self._failed(state, e.reason, e.field, e.detail, start)
            return
        except Exception:  # the adapter met input it could not make sense of: count it, keep running
            if self._failed(state, "invalid_text", "internal", "the adapter failed on this page", start):
                log.exception("cannot read the answer of target=%s (logged once per run)", target.name)
            return
        if state.failing_reason is not None:
            log.info(
                "scrape recovered target=%s after reason=%s failed_scrapes=%d",
                target.name,
                state.failing_reason,
                state.failing_count,
            )
        wall = self.clock()
        sample_time = (
            fetched.simulated_time if (target.clock == "simulated" and fetched.simulated_time is not None) else wall
        )
        self.record(state, scrape, sample_time=sample_time, wall_time=wall, duration_s=time.perf_counter() - start)

    def _failed(self, state: TargetState, reason: str, field: str | None, detail: str, start: float) -> bool:
        """Count a failed scrape; log it when a run of failures starts or its reason or field changes
        (vLLM loading a model refuses connections for minutes; the counter has every one). Returns
        whether it was news."""
        news = (state.failing_reason, state.failing_field) != (reason, field)
        state.failing_reason, state.failing_field = reason, field
        state.failing_count += 1
        ingest_failure(state, reason, duration_s=time.perf_counter() - start)
        (log.warning if news else log.debug)(
            "scrape failed target=%s reason=%s detail=%r", state.target.name, reason, detail
        )
        return news

    async def read_within(
        self, state: TargetState, rt: _Target, body: bytes | bytearray, deadline_s: float
    ) -> EngineScrape:
        """:meth:`read_body` within ``deadline_s`` (what is left of the target's timeout), inline or on a
        page-reader thread (:meth:`sidecar.page_readers.PageReaders.read_within`)."""
        # the target and parser as they are now: a reload may replace them meanwhile
        return await self._readers.read_within(rt, state.target, rt.parser, body, deadline_s)

    def read_body(self, state: TargetState, body: bytes | bytearray) -> EngineScrape:
        """What the daemon makes of a fetched body: :func:`sidecar.pipeline.read_page` with the target's
        own parser (docs/limits.md); raises :class:`ScrapeFailed` naming the reason of a refusal.

        Public so that benchmarks and tests run exactly this code; the daemon runs it within the
        target's timeout (:meth:`read_within`).
        """
        return read_page(state.target, self._targets[state.target.name].parser, body)

    def record(
        self, state: TargetState, scrape: EngineScrape, *, sample_time: float, wall_time: float, duration_s: float
    ) -> None:
        """Record a good scrape taken at ``sample_time`` and recompute the target's gauges.

        The layers' model sources look for the served model's config.json first (at most once per
        their retry interval of sample time), so the layers read the model as it is now."""
        refresh_models(self.extenders, sample_time, scrape, state.target)  # target: its vLLM process
        ingest_success(
            state,
            scrape,
            sample_time=sample_time,
            wall_time=wall_time,
            duration_s=duration_s,
            window_s=self.config.derive_window_s,
            watermark=self.config.thresholds.watermark,
            extenders=self.extenders,
        )

    @property
    def history(self) -> HistoryStore | None:
        """The history file (None without ``history.path``): given at construction, never swapped after."""
        return self._history.store

    def queue_history(self, state: TargetState) -> None:
        """Take what ``/metrics`` shows of this target now and hand it to the history's writer thread."""
        if self.history is None or self._current(state) is None:
            return
        self._history.submit(self.clock(), self._target_samples(state))

    def record_history(self, state: TargetState) -> None:
        """Append what ``/metrics`` shows of this target now to the history, in this thread (replays and
        benchmarks at simulated time; the daemon queues with :meth:`queue_history`)."""
        if self.history is not None:
            self._history.write(self.clock(), self._target_samples(state))

    def _target_samples(self, state: TargetState) -> list[Sample]:
        """The target's exported samples as (name, labels, value, kind); info series are gauges of 1."""
        samples: list[Sample] = []
        for family in self._targets[state.target.name].collector.collect():
            if family.name in ("kvcache_sidecar_build_info", HISTORY_ERRORS):
                continue
            kind = "counter" if family.type == "counter" else "gauge"
            samples.extend((s.name, s.labels, s.value, kind) for s in family.samples if not s.name.endswith("_created"))
        return samples

    def prune_history(self) -> None:
        """Drop the history's minutes past its retention (the daemon runs it every
        :data:`~sidecar.history_writer.HISTORY_PRUNE_S`)."""
        self._history.prune(self.clock())

    def close_history(self) -> None:
        """Drain the writer, then flush and close the file (never raises: a failure is counted and logged)."""
        self._history.close()

    def healthy(self, now_monotonic: float | None = None) -> tuple[bool, str]:
        """True when every target's loop ticked within three intervals."""
        now = time.monotonic() if now_monotonic is None else now_monotonic
        limit = 3 * self.config.scrape_interval_s
        for st in self.states:
            last = st.last_tick_monotonic or self.started_monotonic
            if now - last > limit:
                return False, f"scrape loop for target {st.target.name} last ticked {now - last:.1f}s ago"
        return True, "ok"

    async def aclose(self) -> None:
        self._readers.close()
        for rt in self._targets.values():
            await rt.client.aclose()
