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
* SIGTERM/SIGINT stop everything within about a second.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import __version__, parse
from .config import Config
from .engines import adapter
from .exporter import HISTORY_ERRORS, SidecarCollector
from .history import HistoryError, HistoryStore, Sample
from .observation import EngineScrape
from .scrape import ScrapeFailed, fetch, make_client
from .state import Extender, TargetState, ingest_failure, ingest_success

log = logging.getLogger("kv_sidecar.daemon")


#: (model_name, engine) pairs one target may report. A vLLM server has one engine per data-parallel
#: rank (tens at most); far more means the URL is not one inference server, and exporting them all
#: would stall the other targets and swell /metrics.
MAX_ENGINES_PER_TARGET = 256
#: How often the history drops the minutes past its retention (and re-checks its size cap).
HISTORY_PRUNE_S = 600.0
#: Scrapes' records the history writer may have queued: a write waits at most the store's busy
#: timeout (one second) for a lock, and only one write a minute touches the file, so a full queue
#: means the file is unusable; the records past it are dropped and counted, memory stays bounded.
MAX_HISTORY_BACKLOG = 64
#: How long shutdown waits for the writer to drain its queue before flushing what it has.
HISTORY_DRAIN_S = 5.0


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


class Sidecar:
    """Everything the daemon runs, usable in-process by tests and benchmarks."""

    def __init__(
        self,
        config: Config,
        extenders: tuple[Extender, ...] = (),
        clock: Callable[[], float] = time.time,
        history: HistoryStore | None = None,
    ):
        self.config = config
        self.clock = clock  # wall time, injectable so tests can step past the staleness limit
        self.extenders = extenders
        history_s = config.derive_window_s  # the forecast layer keeps its own, lighter, demand series
        self.states = [TargetState(target=t, history_s=history_s) for t in config.targets]
        # The collector describes its families (the catalogue), so registering a second collector that
        # exports one of those names fails; auto_describe only matters for collectors without describe().
        self.registry = CollectorRegistry(auto_describe=False)
        self.history = history
        self.history_errors = 0
        self._history_failing = False
        self._history_lock = threading.Lock()  # the writer, the prune job and shutdown count errors
        self._history_writer = HistoryWriter(self._write_history) if history is not None else None
        self.registry.register(
            SidecarCollector(
                self.states,
                staleness_s=config.staleness_s,
                clock=clock,
                history_errors=(lambda: self.history_errors) if history is not None else None,
            )
        )
        # One collector per target for the history: what /metrics shows of that target, nothing else.
        self._target_collectors = {
            st.target.name: SidecarCollector([st], staleness_s=config.staleness_s, clock=clock) for st in self.states
        }
        self._clients = {t.name: make_client(t) for t in config.targets}
        self._parsers = {t.name: parse.FilteredParser(adapter(t.engine).NEEDED) for t in config.targets}
        self.started_monotonic = time.monotonic()

    async def scrape_once(self, state: TargetState) -> None:
        """Fetch, parse, normalise and derive one target; failures are counted, never raised."""
        try:
            await self._scrape(state)
        finally:
            self.queue_history(state)

    async def _scrape(self, state: TargetState) -> None:
        target = state.target
        state.last_tick_monotonic = time.monotonic()
        start = time.perf_counter()
        try:
            fetched = await fetch(self._clients[target.name], target)
            scrape = self.read_body(state, fetched.body)
        except asyncio.CancelledError:
            return  # shutting down mid-scrape: nothing to count
        except ScrapeFailed as e:
            # Say it once per run of failures with the same reason (vLLM loading a model refuses
            # connections for minutes); the counter has every one.
            news = state.failing_reason != e.reason
            state.failing_reason = e.reason
            ingest_failure(state, e.reason, duration_s=time.perf_counter() - start)
            (log.warning if news else log.debug)(
                "scrape failed target=%s reason=%s detail=%r", target.name, e.reason, e.detail
            )
            return
        except Exception:  # the adapter met input it could not make sense of: count it, keep running
            log.exception("cannot read the answer of target=%s", target.name)
            ingest_failure(state, "invalid_text", duration_s=time.perf_counter() - start)
            return
        if state.failing_reason is not None:
            log.info("scrape recovered target=%s after reason=%s", target.name, state.failing_reason)
        wall = self.clock()
        sample_time = (
            fetched.simulated_time if (target.clock == "simulated" and fetched.simulated_time is not None) else wall
        )
        self.record(state, scrape, sample_time=sample_time, wall_time=wall, duration_s=time.perf_counter() - start)

    def read_body(self, state: TargetState, body: bytes) -> EngineScrape:
        """What the daemon makes of a fetched body: decode, pre-filtered parse, normalise.

        Raises :class:`ScrapeFailed` (``empty``, ``invalid_text``, ``no_engine_metrics``).
        Public so that replays (:mod:`sidecar.replay`) run exactly this code.
        """
        target = state.target
        if not body.strip():
            raise ScrapeFailed("empty", "200 with an empty body")
        try:
            samples = self._parsers[target.name].samples(parse.decode(body))
            scrape: EngineScrape | None = adapter(target.engine).normalise(samples)
        except parse.InvalidText as e:
            raise ScrapeFailed("invalid_text", str(e)) from None
        if scrape is None:
            raise ScrapeFailed("no_engine_metrics", f"no {target.engine} metric family in the answer")
        if len(scrape.observations) > MAX_ENGINES_PER_TARGET:
            # Like Prometheus' sample_limit: a page under the byte limit can still carry enough
            # series to stall every target's loop and blow up /metrics; refuse it whole.
            raise ScrapeFailed(
                "too_large",
                f"{len(scrape.observations)} (model, engine) pairs > the limit of "
                f"{MAX_ENGINES_PER_TARGET} (one target per server)",
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
        if self._history_writer is None:
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
        for family in self._target_collectors[state.target.name].collect():
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
        for transport in self._clients.values():
            await transport.aclose()


def _handler(sidecar: Sidecar, ready: Callable[[], bool]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"kv-cache-sidecar/{__version__}"
        disable_nagle_algorithm = True  # headers and body leave at once, no delayed-ACK stall

        def do_GET(self) -> None:  # http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, encoder(sidecar.registry), content_type)
            elif path == "/healthz":
                ok, why = sidecar.healthy()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            elif path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n", "text/plain; charset=utf-8")
            elif path == "/":
                page = (
                    f"<html><head><title>kv-cache-sidecar</title></head><body><h1>kv-cache-sidecar "
                    f"{__version__}</h1><p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                    f"<a href='/readyz'>/readyz</a></p></body></html>"
                )
                self._send(200, page.encode(), "text/html; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http %s", format % args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def start_http(sidecar: Sidecar, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    host, port = sidecar.config.listen_host_port
    server_class = _Server6 if ":" in host else _Server
    server = server_class((host or "0.0.0.0", port), _handler(sidecar, ready))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


async def serve(
    config: Config,
    extenders: tuple[Extender, ...] = (),
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set).

    Raises :class:`~sidecar.history.HistoryError` before serving when ``history.path`` cannot be used.
    """
    sidecar = Sidecar(config, extenders, history=open_history(config))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass
    try:
        server = start_http(sidecar, ready=lambda: True)
    except OSError:
        sidecar.close_history()
        raise
    host, port = server.server_address[:2]
    url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host!s}:{port}/metrics"
    log.info(
        "listening address=%s:%s version=%s targets=%s",
        host,
        port,
        __version__,
        ",".join(t.name for t in config.targets),
    )
    if on_listening:
        on_listening(url)

    scheduler = AsyncIOScheduler(
        timezone="UTC",
        job_defaults={
            "coalesce": True,
            "max_instances": 1,
            "misfire_grace_time": max(1, int(config.scrape_interval_s)),
        },
    )
    for st in sidecar.states:
        scheduler.add_job(
            sidecar.scrape_once,
            "interval",
            args=[st],
            seconds=config.scrape_interval_s,
            id=f"scrape:{st.target.name}",
            next_run_time=datetime.now(UTC),
        )
    if sidecar.history is not None:
        scheduler.add_job(sidecar.prune_history, "interval", seconds=HISTORY_PRUNE_S, id="history:prune")
        log.info(
            "history path=%s retention=%ss max_bytes=%s",
            config.history.path,
            config.history.retention_s,
            config.history.max_bytes,
        )
    scheduler.start()
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        scheduler.shutdown(wait=False)
        server.shutdown()
        server.server_close()
        await sidecar.aclose()
        sidecar.close_history()
