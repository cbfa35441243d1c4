"""Requests the CLI sends (the report's Prometheus, the reporter): a total deadline, cancellation, and
one redaction of URLs and secrets for everything printed or written.

**Deadline.** httpx's timeouts bound each connect, read and write, not the request: a server that
sends one byte a second never trips a 3 s read timeout. :func:`client` builds an ``httpx.Client``
whose connections come from :class:`DeadlineBackend`, httpcore's own socket backend with every
connect, read and write bounded by the time left to the calling thread's deadline (set around each
request with :meth:`DeadlineBackend.deadline`). A read waits in slices of :data:`POLL_S` so that
:func:`cancel_all` (the reporter's SIGTERM) ends a request in flight within that time, whatever the
server does. The backend is installed on httpx's connection pool (httpx has no public hook for it;
``tests/report/test_transport.py`` fails if an httpx release moves it).

**Redaction.** :func:`shown_url` parses a URL with httpx's own parser, so the user information it
drops is exactly what httpx would send (a password containing ``@`` included: both split at the
last ``@``); a URL httpx cannot parse is never echoed (its error quotes the text, part of a password
with ``/`` in it). :func:`scrubbed` makes a server's text printable: the known secrets replaced,
one line, control characters dropped, at most :data:`MAX_SHOWN_CHARS`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

#: The longest wait of one socket operation before the deadline and cancellation are looked at again.
POLL_S = 0.25
#: A server's text in a message is cut here.
MAX_SHOWN_CHARS = 200
#: Set by :func:`cancel_all`: every request of this process in flight or to come fails at once.
CANCELLED = threading.Event()


class Cancelled(Exception):
    """The process is stopping (:func:`cancel_all`): the request was abandoned."""


def cancel_all() -> None:
    """End every request in flight within :data:`POLL_S` (the reporter calls it on SIGTERM)."""
    CANCELLED.set()


def shown_url(url: str) -> str:
    """What may be printed of ``url``: without its ``user:password@``, parsed as httpx parses it."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "(a URL that cannot be parsed)"
    if parsed.userinfo:
        parsed = parsed.copy_with(username=None, password=None)
    return str(parsed)


def url_problem(url: str) -> str | None:
    """Why httpx cannot send to ``url`` (None when it can), without quoting any of it."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return (
            "not a URL httpx can parse (in a user or password, write '@' as %40, '/' as %2F and ':' as %3A; "
            "or use a token file instead)"
        )
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "not an http(s) URL with a host; e.g. http://prometheus:9090"
    return None


def url_secrets(url: str) -> list[str]:
    """The user and password of ``url`` as they may appear in a server's text (decoded and as written)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return []
    if not parsed.userinfo:
        return []
    raw = parsed.userinfo.decode("ascii", "replace")
    return [s for s in {parsed.password, raw.partition(":")[2], raw} if s]


def scrubbed(text: str | bytes, secrets: Iterable[str]) -> str:
    """``text`` as one printable line: each secret (longest first) replaced by ``***``, control
    characters dropped, cut at :data:`MAX_SHOWN_CHARS`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= MAX_SHOWN_CHARS else line[: MAX_SHOWN_CHARS - 3] + "..."


# ----------------------------------------------------------------------------- the deadline


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with each operation bounded by the calling thread's deadline."""

    def __init__(self, cancellable: bool = True) -> None:
        self._inner = httpcore.SyncBackend()
        self._local = threading.local()
        self.cancellable = cancellable  # False: cancel_all() leaves this client's requests alone

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every connect, read and write of this thread ends within ``seconds`` from now."""
        self._local.end = time.monotonic() + seconds
        try:
            yield
        finally:
            self._local.end = None

    def left(self, timeout: float | None, timed_out: type[Exception]) -> float:
        """The time an operation with ``timeout`` may take now (at most :data:`POLL_S`); raises
        ``timed_out`` past the deadline, :class:`Cancelled` after :func:`cancel_all`."""
        if CANCELLED.is_set() and self.cancellable:
            raise Cancelled("the process is stopping")
        end: float | None = getattr(self._local, "end", None)
        left = POLL_S if end is None else end - time.monotonic()
        if left <= 0:
            raise timed_out("the request's total time ran out")
        return min(left, POLL_S, timeout if timeout is not None else POLL_S)

    def budget(self, timeout: float | None, timed_out: type[Exception]) -> float | None:
        """The whole time an operation that cannot be resumed (a write, a handshake) may take."""
        if CANCELLED.is_set() and self.cancellable:
            raise Cancelled("the process is stopping")
        end: float | None = getattr(self._local, "end", None)
        if end is None:
            return timeout
        left = end - time.monotonic()
        if left <= 0:
            raise timed_out("the request's total time ran out")
        return left if timeout is None else min(left, timeout)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        started = time.monotonic()
        while True:
            wait = self.left(timeout, httpcore.ConnectTimeout)
            try:
                stream = self._inner.connect_tcp(host, port, wait, local_address, socket_options)
            except httpcore.ConnectTimeout:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise
                continue
            return _Stream(stream, self)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:  # pragma: no cover - the CLI sends to http(s) URLs only
        return _Stream(
            self._inner.connect_unix_socket(path, self.left(timeout, httpcore.ConnectTimeout), socket_options), self
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Stream(httpcore.NetworkStream):
    """A connection whose reads and writes wait in slices, the deadline and cancellation looked at between."""

    def __init__(self, inner: httpcore.NetworkStream, backend: DeadlineBackend):
        self._inner = inner
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        started = time.monotonic()
        while True:
            wait = self._backend.left(timeout, httpcore.ReadTimeout)
            try:
                return self._inner.read(max_bytes, wait)
            except httpcore.ReadTimeout:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # not sliced (a partial send cannot be resumed through httpcore's stream): bounded by the deadline
        self._inner.write(buffer, self._backend.budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        budget = self._backend.budget(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, budget), self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def client(
    timeout_s: float, verify: str | bool = True, *, cancellable: bool = True, **kw: Any
) -> tuple[httpx.Client, DeadlineBackend]:
    """An ``httpx.Client`` whose requests honour :meth:`DeadlineBackend.deadline` and, when ``cancellable``,
    :func:`cancel_all` (the webhook of a report already written is not: its deadline bounds it)."""
    backend = DeadlineBackend(cancellable)
    transport = httpx.HTTPTransport(verify=verify, trust_env=False)
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):  # pragma: no cover - an httpx release that moved it
        raise RuntimeError("this httpx has no connection pool backend to bound; pin httpx < 1")
    pool._network_backend = backend
    return httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport, trust_env=False, **kw), backend
