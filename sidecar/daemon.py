"""The daemon: the scheduler, the HTTP server, reloads and signals around the scrape loop (the I/O edge).

The targets and one scrape of each are :class:`sidecar.scrape_loop.Sidecar` (fetch, read, record,
history); this module runs it as a process:

* One APScheduler 3.x ``AsyncIOScheduler`` interval job per target,
  ``max_instances=1`` and ``coalesce=True`` so a slow vLLM never stacks
  scrapes, ``misfire_grace_time`` explicit (3.x defaults to 1 s).
* ``/metrics``; ``/readyz`` = configuration loaded and HTTP up (never depends
  on vLLM: as a native sidecar its readiness gates the whole pod);
  ``/healthz`` = every target's scrape loop ticked within three intervals.
* The embedded history (``history.path``; :mod:`sidecar.history`) is opened here and pruned every
  :data:`~sidecar.history_writer.HISTORY_PRUNE_S`; a file that cannot be used never stops the start:
  the sidecar serves without a history and counts it as one failed write.
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
import signal
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from . import __version__
from .config import Config
from .endpoint import Server, start_http
from .history import HistoryError
from .history_writer import HISTORY_PRUNE_S, open_history
from .logs import setup_logging
from .reload import Reloader, Sources
from .scrape_loop import Sidecar as Sidecar  # re-exported: tests and benchmarks import it from here
from .scrape_loop import same_source
from .state import Extender, TargetState
from .webconfig import WebConfig, serving

log = logging.getLogger("kv_sidecar.daemon")


#: How long ``POST /-/reload`` waits for the reload to finish before answering 503.
RELOAD_TIMEOUT_S = 30.0
#: The Config fields the derivation layers are built from (sidecar.layers.build_extenders): a reload that
#: changes one of them builds new layers, any other reload keeps the running ones and their state.
LAYER_FIELDS = ("thresholds", "model", "forecast", "derive_window_s")


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
