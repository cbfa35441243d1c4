"""The daemon's side of the embedded history: one writer thread, and the count of failed writes.

After every scrape the daemon takes the target's exported series at its wall time and hands them here
(:meth:`HistoryRecorder.submit`), so a file that another process holds locked never delays a scrape or
``/metrics``. The file itself (its format, retention and size cap) is :mod:`sidecar.history`.

A file that cannot be used stops nothing: a write that fails (or a record dropped because the writer is
:data:`MAX_HISTORY_BACKLOG` records behind) is counted (``kvcache_sidecar_history_write_errors_total``),
logged once per run of failures, and the scrapes go on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from .config import Config
from .history import HistoryError, HistoryStore, Sample

log = logging.getLogger("kv_sidecar.daemon")

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


class HistoryRecorder:
    """The history file (``store``, None when ``history.path`` is unset), its writer thread, and the
    count of failed writes the exporter publishes.

    ``refused``: ``history.path`` is set but its file could not be used at start; the sidecar serves
    without a history and counts it as one failed write. Every method is safe to call without a store.
    """

    def __init__(self, store: HistoryStore | None, refused: bool = False):
        self.store = store
        self.errors = 1 if refused else 0
        self._failing = False
        self._lock = threading.Lock()  # the writer, the prune job and shutdown count errors
        self._writer = HistoryWriter(self.write) if store is not None else None

    def submit(self, ts: float, samples: list[Sample]) -> None:
        """Queue a record for the writer thread; never blocks (a record past the backlog is counted lost)."""
        if self._writer is not None and not self._writer.submit(ts, samples):
            self.failed(HistoryError(f"the writer is {MAX_HISTORY_BACKLOG} records behind; one dropped"))

    def write(self, ts: float, samples: list[Sample]) -> None:
        """Append a record in this thread (the writer's, or a replay's at simulated time)."""
        if self.store is None:
            return
        try:
            self.store.record(ts, samples)
        except (HistoryError, OSError) as e:
            self.failed(e)
        else:
            with self._lock:
                recovered, self._failing = self._failing, False
            if recovered:
                log.info("history writes recovered path=%s", self.store.path)

    def prune(self, now: float) -> None:
        """Drop the minutes past the retention (and re-check the size cap); a failure is counted."""
        if self.store is None:
            return
        try:
            self.store.prune(now)
        except (HistoryError, OSError) as e:
            self.failed(e)

    def failed(self, e: Exception) -> None:
        """Count a failed write; log it when a run of failures starts (the rest at debug)."""
        with self._lock:
            self.errors += 1
            news = not self._failing
            self._failing = True
        (log.warning if news else log.debug)("history write failed: %s", e)

    def close(self) -> None:
        """Drain the writer, then flush and close the file (never raises: a failure is counted and logged)."""
        if self.store is None:
            return
        if self._writer is not None:
            self._writer.close()
        try:
            self.store.flush()
        except (HistoryError, OSError) as e:
            self.failed(e)
        finally:
            try:
                self.store.close()  # flushes again: the minutes that could not be written are lost now
            except (HistoryError, OSError) as e:
                log.warning("history closed with unwritten minutes: %s", e)
