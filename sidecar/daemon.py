"""The daemon: scheduler, scrape loop and HTTP server wiring (the I/O edge).

* One APScheduler 3.x ``AsyncIOScheduler`` interval job per target,
  ``max_instances=1`` and ``coalesce=True`` so a slow vLLM never stacks
  scrapes, ``misfire_grace_time`` explicit (3.x defaults to 1 s).
* Our own ``CollectorRegistry`` with :class:`~sidecar.exporter.SidecarCollector`.
* ``/metrics``; ``/readyz`` = configuration loaded and HTTP up (never depends
  on vLLM: as a native sidecar its readiness gates the whole pod);
  ``/healthz`` = every target's scrape loop ticked within three intervals.
* The embedded history (``history.path``; :mod:`sidecar.history`): after every scrape, the
  target's exported series are taken at the sidecar's wall time, from here and nowhere else (the
  derivations stay pure), and handed to one writer thread (:class:`HistoryWriter`), so a file that
  another process holds locked never delays a scrape or ``/metrics``; pruned every
  :data:`HISTORY_PRUNE_S`, drained, flushed and closed on shutdown. A file that cannot be used
  stops the start before anything is served; a write that fails later (or a record dropped because
  the writer is :data:`MAX_HISTORY_BACKLOG` records behind) is counted
  (``kvcache_sidecar_history_write_errors_total``), logged once per run of failures, and never
  stops the scrapes.
* The HTTP endpoint (:mod:`sidecar.endpoint`) serves ``/metrics``, the probes and ``POST /-/reload``
  from one asyncio loop of its own (a thread), with ``--web.config.file`` (:mod:`sidecar.webconfig`).
* Reloads (:mod:`sidecar.reload`): SIGHUP, ``POST /-/reload`` and a change of a watched file re-read
  the configuration; :meth:`Sidecar.apply` keeps the state and scrape job of every target whose URL,
  engine and clock are unchanged, starts the new ones and stops the removed ones (their series go).
* SIGTERM/SIGINT stop everything within about a second; SIGHUP reloads, it never stops the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry

from . import __version__, parse
from .config import Config, TargetConfig
from .endpoint import Server, start_http
from .engines import adapter
from .exporter import HISTORY_ERRORS, SidecarCollector
from .history import HistoryError, HistoryStore, Sample
from .limits import OutOfRange
from .logs import setup_logging
from .observation import EngineScrape
from .reload import Reloader, Sources
from .scrape import ScrapeFailed, fetch, make_client
from .state import Extender, TargetState, ingest_failure, ingest_success
from .webconfig import WebConfig, serving

log = logging.getLogger("kv_sidecar.daemon")


#: A page up to this size is read on the event loop when every label limit of its target is on: the limits
#: bound its cost (a worst such page takes tens of milliseconds; bench/hostile_page.py), and handing it to a
#: thread would cost a fifth of a whole scrape cycle's CPU (bench/scrape_cycle.py). A vLLM page is 20-100 KiB.
INLINE_PAGE_BYTES = 256 << 10
#: Threads that read the other pages (decode, parse, normalise) off the event loop, each read within what is
#: left of its target's timeout (:meth:`Sidecar.read_within`). One: a read is bounded by the targets'
#: limits, and each thread's allocations stay in an arena of their own (four readers took 30 MiB more
#: peak RSS on a 15 MiB page, bench/hostile_page.py). Daemon threads: a page still being read never
#: delays the exit.
PAGE_READERS = 1
#: How often the history drops the minutes past its retention (and re-checks its size cap).
HISTORY_PRUNE_S = 600.0
#: Scrapes' records the history writer may have queued: a write waits at most the store's busy
#: timeout (one second) for a lock, and only one write a minute touches the file, so a full queue
#: means the file is unusable; the records past it are dropped and counted, memory stays bounded.
MAX_HISTORY_BACKLOG = 64
#: How long shutdown waits for the writer to drain its queue before flushing what it has.
HISTORY_DRAIN_S = 5.0
#: How long ``POST /-/reload`` waits for the reload to finish before answering 503.
RELOAD_TIMEOUT_S = 30.0
#: The Config fields the derivation layers are built from (sidecar.layers.build_extenders): a reload that
#: changes one of them builds new layers, any other reload keeps the running ones and their state.
LAYER_FIELDS = ("thresholds", "model", "forecast", "derive_window_s")


def open_history(config: Config, now: float | None = None) -> HistoryStore | None:
    """The history file of ``history.path`` (None when unset); raises :class:`HistoryError` on a bad file."""
    h = config.history
    if h.path is None:
        return None
    return HistoryStore.open(h.path, retention_s=h.retention_s, max_bytes=h.max_bytes, now=now)


class HistoryWriter:
    """One thread that applies the scrapes' records to the history, in order, off the event loop.

    ``submit`` never blocks: when :data:`MAX_HISTORY_BACKLOG` records are waiting it returns False
    and the caller counts the record as lost. ``close`` lets the queue drain (at most
    :data:`HISTORY_DRAIN_S`) and stops the thread.
    """

    def __init__(self, write: Callable[[float, list[Sample]], None]):
        self._write = write
        self._queue: queue.Queue[tuple[float, list[Sample]] | None] = queue.Queue(MAX_HISTORY_BACKLOG)
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()

    def submit(self, ts: float, samples: list[Sample]) -> bool:
        try:
            self._queue.put_nowait((ts, samples))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._write(*item)

    def close(self) -> None:
        """Let the queue drain (at most :data:`HISTORY_DRAIN_S`) and stop the thread."""
        try:
            self._queue.put(None, timeout=HISTORY_DRAIN_S)
        except queue.Full:
            log.warning("history writer still %d records behind at shutdown", self._queue.qsize())
            return
        self._thread.join(HISTORY_DRAIN_S)


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
    parser: parse.FilteredParser
    #: what /metrics shows of this target alone (the history records it)
    collector: SidecarCollector
    busy: bool = False  # a scrape is in flight
    retired: bool = False  # replaced or removed by a reload: its pool closes when the scrape in flight ends
    #: the read of this target's last page (a reader thread may still run it past its deadline)
    reading: _Read | None = None


class _Read:
    """One page read handed to a reader thread; its outcome goes to ``waiter``, on the event loop."""

    def __init__(self, work: Callable[[], EngineScrape], loop: asyncio.AbstractEventLoop):
        self.work = work
        self.loop = loop
        self.waiter: asyncio.Future[EngineScrape] = loop.create_future()
        #: set by the reader thread when the read ended (or was skipped): until then, it may still run
        self.finished = threading.Event()

    def run(self) -> None:
        if self.waiter.done():  # its deadline passed while it waited for a thread
            self.finished.set()
            return
        try:
            result, error = self.work(), None
        except BaseException as e:  # handed to the awaiting scrape, which classifies it
            result, error = None, e
        self.finished.set()  # before the result is handed over: the next read may start at once
        try:
            self.loop.call_soon_threadsafe(self._settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: the daemon stopped meanwhile

    def _settle(self, result: EngineScrape | None, error: BaseException | None) -> None:
        if self.waiter.done():
            return  # too late: the scrape already failed with parse_timeout
        if error is not None:
            self.waiter.set_exception(error)
        else:
            assert result is not None
            self.waiter.set_result(result)

    def expire(self) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(TimeoutError())


class _Readers:
    """A few daemon threads that run page reads; started at the first read, stopped by :meth:`close`."""

    def __init__(self, size: int):
        self._size = size
        self._queue: queue.SimpleQueue[_Read | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, read: _Read) -> None:
        if not self._threads:
            for i in range(self._size):
                thread = threading.Thread(target=self._run, name=f"page-reader-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)
        self._queue.put(read)

    def _run(self) -> None:
        while (read := self._queue.get()) is not None:
            read.run()

    def close(self) -> None:
        """Stop the threads once they finish what they run (never waits: they are daemon threads)."""
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []


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
        # The collector describes its families (the catalogue), so registering a second collector that
        # exports one of those names fails; auto_describe only matters for collectors without describe().
        self.registry = CollectorRegistry(auto_describe=False)
        self.history = history
        self.history_errors = 1 if history_refused else 0
        self._history_failing = False
        self._history_lock = threading.Lock()  # the writer, the prune job and shutdown count errors
        self._history_writer = HistoryWriter(self._write_history) if history is not None else None
        self._targets = {
            t.name: self._target(TargetState(target=t, history_s=config.derive_window_s)) for t in config.targets
        }
        self.states = [rt.state for rt in self._targets.values()]
        self.collector = SidecarCollector(
            self.states,
            staleness_s=config.staleness_s,
            clock=clock,
            history_errors=(lambda: self.history_errors) if history is not None or history_refused else None,
        )
        self.registry.register(self.collector)
        self.started_monotonic = time.monotonic()
        self._readers = _Readers(PAGE_READERS)

    def _target(self, state: TargetState) -> _Target:
        t = state.target
        return _Target(
            state=state,
            client=make_client(t),
            parser=parse.FilteredParser(adapter(t.engine).NEEDED),
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
                rt = _Target(rt.state, make_client(t), rt.parser, rt.collector)
            targets[t.name] = rt
        removed = [rt for name, rt in old.items() if name not in targets or targets[name].state is not rt.state]
        if extenders == self.extenders:  # the running layers forget the engines that left with their target
            for rt in removed:
                for key in rt.state.history:
                    _forget(extenders, (rt.state.target.name, *key))
        retired += removed
        for rt in retired:
            rt.retired = True
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
        """:meth:`read_body` within ``deadline_s`` (what is left of the target's timeout): the event loop,
        the probes and SIGTERM never wait for a page.

        A page of at most :data:`INLINE_PAGE_BYTES` whose target has every label limit on is read
        at once (the limits bound its cost); any other page goes to a reader thread, awaited at most
        ``deadline_s``. A read past its deadline is a ``parse_timeout``; it may still run (a thread
        cannot be stopped), and until it ends the target's next pages are refused with the same
        reason rather than read beside it, so one target never holds more than one reader.
        """
        if rt.reading is not None and not rt.reading.finished.is_set():
            raise ScrapeFailed("parse_timeout", "the previous page of this target is still being read", "previous")
        target, parser = state.target, rt.parser  # as they are now: a reload may replace them meanwhile
        bounded = target.label_limit and target.label_name_length_limit and target.label_value_length_limit
        if len(body) <= INLINE_PAGE_BYTES and bounded:
            return self._read(target, parser, body)
        read = rt.reading = _Read(lambda: self._read(target, parser, body), asyncio.get_running_loop())
        self._readers.submit(read)
        expiry = read.loop.call_later(max(deadline_s, 0.0), read.expire)
        try:
            return await read.waiter
        except TimeoutError:
            raise ScrapeFailed(
                "parse_timeout",
                f"the page ({len(body)} bytes) was not read within the {max(deadline_s, 0.0):.3g}s left of "
                f"the timeout of {state.target.timeout_s:g}s",
            ) from None
        finally:
            expiry.cancel()

    def read_body(self, state: TargetState, body: bytes | bytearray) -> EngineScrape:
        """What the daemon makes of a fetched body: decode, pre-filtered parse, normalise, within the
        target's limits (docs/limits.md).

        Raises :class:`ScrapeFailed` (``empty``, ``invalid_text``, ``no_engine_metrics``, ``sample_limit``,
        ``label_limit``, ``invalid_value``, ``too_large``). Public so that replays (:mod:`sidecar.replay`)
        run exactly this code; the daemon runs it within the target's timeout (:meth:`read_within`).
        """
        return self._read(state.target, self._targets[state.target.name].parser, body)

    @staticmethod
    def _read(target: TargetConfig, parser: parse.FilteredParser, body: bytes | bytearray) -> EngineScrape:
        if not body or body.isspace():  # (not strip(): no copy of a large page)
            raise ScrapeFailed("empty", "200 with an empty body")
        limits = parse.PageLimits(
            target.sample_limit, target.label_limit, target.label_name_length_limit, target.label_value_length_limit
        )
        try:
            samples = parser.samples(parse.decode(body), limits)
            scrape: EngineScrape | None = adapter(target.engine).normalise(
                samples, label_values_limit=target.label_values_limit
            )
        except parse.LimitExceeded as e:
            raise ScrapeFailed(e.reason, str(e)) from None
        except parse.InvalidText as e:
            raise ScrapeFailed("invalid_text", str(e)) from None
        except OutOfRange as e:  # a number the capacity stands on cannot be one: nothing of the page is used
            # the value is part of the field at fault: another bad value is logged again
            raise ScrapeFailed("invalid_value", str(e), f"{e.field}={str(e.value)[:40]}") from None
        if scrape is None:
            raise ScrapeFailed("no_engine_metrics", f"no {target.engine} metric family in the answer")
        if target.engine_limit and len(scrape.observations) > target.engine_limit:
            # Like Prometheus' sample_limit: a page under the byte limit can still carry enough
            # series to stall every target's loop and blow up /metrics; refuse it whole.
            raise ScrapeFailed(
                "too_large",
                f"{len(scrape.observations)} (model, engine) pairs > targets[].engine_limit "
                f"{target.engine_limit} (one target per server)",
            )
        return scrape

    def record(
        self, state: TargetState, scrape: EngineScrape, *, sample_time: float, wall_time: float, duration_s: float
    ) -> None:
        """Record a good scrape taken at ``sample_time`` and recompute the target's gauges."""
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

    def queue_history(self, state: TargetState) -> None:
        """Take what ``/metrics`` shows of this target now and hand it to the history's writer thread."""
        if self._history_writer is None or self._current(state) is None:
            return
        if not self._history_writer.submit(self.clock(), self._target_samples(state)):
            self._history_failed(HistoryError(f"the writer is {MAX_HISTORY_BACKLOG} records behind; one dropped"))

    def record_history(self, state: TargetState) -> None:
        """Append what ``/metrics`` shows of this target now to the history, in this thread (replays and
        benchmarks at simulated time; the daemon queues with :meth:`queue_history`)."""
        if self.history is not None:
            self._write_history(self.clock(), self._target_samples(state))

    def _write_history(self, ts: float, samples: list[Sample]) -> None:
        assert self.history is not None
        try:
            self.history.record(ts, samples)
        except (HistoryError, OSError) as e:
            self._history_failed(e)
        else:
            with self._history_lock:
                recovered, self._history_failing = self._history_failing, False
            if recovered:
                log.info("history writes recovered path=%s", self.history.path)

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
        if self.history is None:
            return
        try:
            self.history.prune(self.clock())
        except (HistoryError, OSError) as e:
            self._history_failed(e)

    def _history_failed(self, e: Exception) -> None:
        with self._history_lock:
            self.history_errors += 1
            news = not self._history_failing
            self._history_failing = True
        (log.warning if news else log.debug)("history write failed: %s", e)

    def close_history(self) -> None:
        """Drain the writer, then flush and close the file (never raises: a failure is counted and logged)."""
        if self.history is None:
            return
        if self._history_writer is not None:
            self._history_writer.close()
        try:
            self.history.flush()
        except (HistoryError, OSError) as e:
            self._history_failed(e)
        finally:
            try:
                self.history.close()  # flushes again: the minutes that could not be written are lost now
            except (HistoryError, OSError) as e:
                log.warning("history closed with unwritten minutes: %s", e)

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


def _forget(extenders: tuple[Extender, ...], key: tuple[str, str, str]) -> None:
    for extend in extenders:
        forget = getattr(extend, "forget", None)
        if forget is not None:
            forget(key)


def _job_id(name: str) -> str:
    return f"scrape:{name}"


class _Daemon:
    """The running daemon's parts a reload touches: the sidecar, its scrape jobs, the HTTP server's TLS and auth."""

    def __init__(
        self,
        sidecar: Sidecar,
        scheduler: AsyncIOScheduler,
        build_layers: Callable[[Config], tuple[Extender, ...]],
        loop: asyncio.AbstractEventLoop,
    ):
        self.sidecar = sidecar
        self.scheduler = scheduler
        self.build_layers = build_layers
        self.loop = loop
        self.server: Server | None = None
        self.reloader: Reloader | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def schedule(self, state: TargetState) -> None:
        interval = self.sidecar.config.scrape_interval_s
        self.scheduler.add_job(
            self.sidecar.scrape_once,
            "interval",
            args=[state],
            seconds=interval,
            id=_job_id(state.target.name),
            next_run_time=datetime.now(UTC),
            misfire_grace_time=max(1, int(interval)),
            replace_existing=True,
        )

    async def apply(self, config: Config, web: WebConfig) -> str:
        """Apply a validated configuration (the reloader's ``apply``): layers, targets, jobs, web, logging."""
        sidecar, old = self.sidecar, self.sidecar.config
        rebuilt = any(getattr(config, f) != getattr(old, f) for f in LAYER_FIELDS)
        extenders = sidecar.extenders
        if rebuilt:
            extenders = await asyncio.to_thread(self.build_layers, config)  # reads the model's config.json
            previous = {t.name: t for t in old.targets}
            kept = {t.name for t in config.targets if t.name in previous and same_source(previous[t.name], t)}
            _adopt(extenders, sidecar.extenders, kept)
        # Everything that can fail (the model file, the certificates) is built before anything is swapped.
        web_serving = serving(web, self.server.serving if self.server is not None else None)
        changes, to_close = sidecar.apply(config, extenders)
        for name in changes.removed:
            if self.scheduler.get_job(_job_id(name)) is not None:
                self.scheduler.remove_job(_job_id(name))
        for st in sidecar.states:
            if st.target.name in changes.added:
                self.schedule(st)
            elif config.scrape_interval_s != old.scrape_interval_s:
                job = _job_id(st.target.name)
                self.scheduler.reschedule_job(job, trigger="interval", seconds=config.scrape_interval_s)
                self.scheduler.modify_job(job, misfire_grace_time=max(1, int(config.scrape_interval_s)))
        if self.server is not None:
            self.server.serving = web_serving
        if (config.log_level, config.log_format) != (old.log_level, old.log_format):
            setup_logging(config.log_level, config.log_format)
        for client in to_close:
            await client.aclose()
        return f"{changes} layers={'rebuilt' if rebuilt else 'kept'}"

    def on_sighup(self) -> None:
        assert self.reloader is not None
        task = self.loop.create_task(self.reloader.reload("SIGHUP"))
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def request_reload(self) -> tuple[bool, str]:
        """``POST /-/reload``, from an HTTP thread: the reload runs on the event loop; waits for it."""
        assert self.reloader is not None
        future = asyncio.run_coroutine_threadsafe(self.reloader.reload("POST /-/reload"), self.loop)
        try:
            return future.result(RELOAD_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return False, f"the reload did not finish within {RELOAD_TIMEOUT_S:g}s; see the sidecar's log"


def _adopt(new: tuple[Extender, ...], old: tuple[Extender, ...], kept: set[str]) -> None:
    """Hand each rebuilt layer the state its predecessor keeps for the targets that stay.

    A layer that defines ``adopt(previous, keep)`` (``keep(TargetModelEngine) -> bool``) takes over the
    series of the engines ``keep`` selects; one that does not starts afresh after a change of its settings.
    """
    for layer in new:
        adopt = getattr(layer, "adopt", None)
        previous = next((p for p in old if type(p) is type(layer)), None)
        if adopt is not None and previous is not None:
            adopt(previous, lambda key: key[0] in kept)


def _quiet_signals(loop: asyncio.AbstractEventLoop) -> None:
    """Once stopping, a second SIGTERM or SIGINT (or a SIGHUP) changes nothing: the stop is under way and bounded.

    Each signal is ignored first, then taken off the loop without the loop's own ``remove_signal_handler``,
    which would restore the default action (killed by SIGTERM, KeyboardInterrupt on SIGINT) for an instant,
    and the loop's close would do the same for good: a signal landing there ended the process with another
    exit code than the stop's, or a traceback.
    """
    handlers = getattr(loop, "_signal_handlers", None)  # asyncio's Unix loops keep them there (3.4 to 3.13)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread (tests): the loop never had the signal
            continue
        if isinstance(handlers, dict):
            handlers.pop(sig, None)
        else:  # another loop: its own removal, and the short window it leaves
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
    if isinstance(handlers, dict) and not handlers:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)  # as the loop does once it has no handler left


async def serve(
    config: Config,
    extenders: tuple[Extender, ...] = (),
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    *,
    sources: Sources | None = None,
    web: WebConfig | None = None,
    build_layers: Callable[[Config], tuple[Extender, ...]] | None = None,
    refused_at_start: bool = False,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set); SIGHUP and ``POST /-/reload`` reload.

    ``refused_at_start``: ``config`` stands in for a file that could not be used (``kv-sidecar run``
    serves its built-in configuration meanwhile): the reload series say so from the start.

    ``sources`` say how to read the configuration again (default: ``config`` itself, so a reload only
    re-applies it); ``web`` is the web configuration ``sources`` read at start; ``build_layers`` makes the
    derivation layers of a reloaded configuration whose layer settings changed (default: keep ``extenders``).
    A ``history.path`` that cannot be used (not a history file, locked, a FIFO) never stops the start:
    the sidecar serves without a history, logs why and counts one failed history write.
    """
    web = web or WebConfig()
    sources = sources or Sources.fixed(config, web)
    try:
        history, history_refused = open_history(config), False
    except HistoryError as e:
        log.error("history.path: %s; serving without a history (restart with a usable file to keep one)", e)
        history, history_refused = None, True
    sidecar = Sidecar(config, extenders, history=history, history_refused=history_refused)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    scheduler = AsyncIOScheduler(timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1})
    daemon = _Daemon(sidecar, scheduler, build_layers or (lambda _: extenders), loop)
    reloader = daemon.reloader = Reloader(sources, config, web, daemon.apply)
    if refused_at_start:
        reloader.status = replace(reloader.status, successful=False, failures=1)
    sidecar.collector.reload_status = lambda: reloader.status
    for sig, handler in ((signal.SIGTERM, stop.set), (signal.SIGINT, stop.set), (signal.SIGHUP, daemon.on_sighup)):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass
    try:
        server = daemon.server = start_http(sidecar, ready=lambda: True, reload=daemon.request_reload, web=serving(web))
    except OSError:
        sidecar.close_history()
        raise
    host, port = server.server_address[:2]
    url = f"{web.scheme}://{'127.0.0.1' if host == '0.0.0.0' else host!s}:{port}/metrics"
    log.info(
        "listening address=%s:%s scheme=%s auth=%s version=%s targets=%s",
        host,
        port,
        web.scheme,
        "basic" if web.users else "none",
        __version__,
        ",".join(t.name for t in config.targets),
    )
    if on_listening:
        on_listening(url)

    for st in sidecar.states:
        daemon.schedule(st)
    if sidecar.history is not None:
        scheduler.add_job(sidecar.prune_history, "interval", seconds=HISTORY_PRUNE_S, id="history:prune")
        log.info(
            "history path=%s retention=%ss max_bytes=%s",
            config.history.path,
            config.history.retention_s,
            config.history.max_bytes,
        )
    if sources.watched and sources.watch_interval_s > 0:
        scheduler.add_job(reloader.poll, "interval", seconds=sources.watch_interval_s, id="config:watch")
    scheduler.start()
    try:
        await stop.wait()
    finally:
        _quiet_signals(loop)
        log.info("stopping")
        scheduler.shutdown(wait=False)
        server.shutdown()
        server.server_close()
        await sidecar.aclose()
        sidecar.close_history()
