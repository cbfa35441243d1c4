"""The page-reader threads: a fetched page is read off the event loop, within what is left of its timeout.

The read itself is :func:`sidecar.pipeline.read_page` (pure). This module only decides where it runs
and for how long: the event loop, the probes and SIGTERM never wait for a page.

- A page of at most :data:`INLINE_PAGE_BYTES` whose target has every label limit on is read at once, on
  the event loop: the limits bound its cost.
- Any other page goes to one of :data:`PAGE_READERS` daemon threads and is awaited at most the rest of
  the target's timeout. A read past it is a ``parse_timeout``; it may still run (a thread cannot be
  stopped), and until it ends the target's next pages are refused with the same reason rather than read
  beside it, so one target never holds more than one reader.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from . import page_parser
from .config import TargetConfig
from .observation import EngineScrape
from .pipeline import read_page
from .reasons import ScrapeFailed

#: A page up to this size is read on the event loop when every label limit of its target is on: the limits
#: bound its cost (a worst such page takes tens of milliseconds; bench/hostile_page.py), and handing it to a
#: thread would cost a fifth of a whole scrape cycle's CPU (bench/scrape_cycle.py). A vLLM page is 20-100 KiB.
INLINE_PAGE_BYTES = 256 << 10
#: Threads that read the other pages (decode, parse, normalise) off the event loop, each read within what is
#: left of its target's timeout. One: a read is bounded by the targets' limits, and each thread's
#: allocations stay in an arena of their own (four readers took 30 MiB more peak RSS on a 15 MiB page,
#: bench/hostile_page.py). Daemon threads: a page still being read never delays the exit.
PAGE_READERS = 1


class PageRead:
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


class ReadSlot(Protocol):
    """Where a target keeps its last page read (a reader thread may still run it past its deadline)."""

    reading: PageRead | None


class PageReaders:
    """A few daemon threads that run page reads; started at the first read, stopped by :meth:`close`."""

    def __init__(self, size: int = PAGE_READERS):
        self._size = size
        self._queue: queue.SimpleQueue[PageRead | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    async def read_within(
        self,
        slot: ReadSlot,
        target: TargetConfig,
        parser: page_parser.FilteredParser,
        body: bytes | bytearray,
        deadline_s: float,
    ) -> EngineScrape:
        """:func:`~sidecar.pipeline.read_page` of ``body`` within ``deadline_s`` (what is left of the
        target's timeout), inline or on a reader thread (see the module's docstring); raises
        :class:`ScrapeFailed` (``parse_timeout`` past the deadline, or the pipeline's reason)."""
        if slot.reading is not None and not slot.reading.finished.is_set():
            raise ScrapeFailed("parse_timeout", "the previous page of this target is still being read", "previous")
        bounded = target.label_limit and target.label_name_length_limit and target.label_value_length_limit
        if len(body) <= INLINE_PAGE_BYTES and bounded:
            return read_page(target, parser, body)
        read = slot.reading = PageRead(lambda: read_page(target, parser, body), asyncio.get_running_loop())
        self._submit(read)
        expiry = read.loop.call_later(max(deadline_s, 0.0), read.expire)
        try:
            return await read.waiter
        except TimeoutError:
            raise ScrapeFailed(
                "parse_timeout",
                f"the page ({len(body)} bytes) was not read within the {max(deadline_s, 0.0):.3g}s left of "
                f"the timeout of {target.timeout_s:g}s",
            ) from None
        finally:
            expiry.cancel()

    def _submit(self, read: PageRead) -> None:
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
