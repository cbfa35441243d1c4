"""The HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``POST /-/reload`` (the serving edge).

What it serves, for one :class:`~sidecar.scrape_loop.Sidecar`:

* ``/metrics``: the sidecar's registry in the format the ``Accept`` header asks for, gzipped when the
  scraper sends ``Accept-Encoding: gzip`` (as Prometheus does);
* ``/healthz``: every target's scrape loop ticked within three intervals (the liveness probe);
* ``/readyz``: configuration loaded and HTTP up, never depending on vLLM (the startup probe);
* ``POST /-/reload``: re-read the configuration (Prometheus' convention);
* ``HEAD`` wherever ``GET`` is served; ``405`` with ``Allow`` for another method on a known path,
  ``501`` for a method HTTP does not define;
* ``--web.config.file`` (:mod:`sidecar.webconfig`): TLS with the current certificate for each new
  connection, basic auth on everything but :data:`OPEN_PATHS`, extra response headers.

How it stays up in a pod, whatever connects to it. One thread runs an ``asyncio`` loop that owns every
connection, so an idle or slow connection costs a socket and a few kilobytes, never a thread; the
requests are parsed by `h11 <https://h11.readthedocs.io>`_ (an HTTP/1.1 state machine: framing,
keep-alive, ``HEAD``, the header-block bound). Every bound below is a row of :data:`sidecar.limits.LIMITS`:

* the listen backlog is :data:`LISTEN_BACKLOG`, so a burst of probes and scrapes waits in the kernel
  rather than being refused;
* a request must arrive whole, TLS handshake included, within :data:`REQUEST_TIMEOUT_S` of its first
  byte (of the connection, for the first one): the time counts for the request, not for each read, so a
  client that drips its request line or headers a byte at a time is dropped (``408``) at that deadline;
  a kept-alive connection may wait :data:`IDLE_TIMEOUT_S` for its next request;
* request line, header block and body are bounded (:data:`MAX_REQUEST_LINE_BYTES` ``414``,
  :data:`MAX_HEADER_BYTES` ``431``, :data:`MAX_BODY_BYTES` ``413``); a request that is not HTTP/1.x,
  TLS on the plain port among them, is a ``400``;
* at most :data:`MAX_CONNECTIONS` connections are open (fewer when the process may open fewer files).
  When a new one arrives at the limit, the connection that has waited longest for its request is closed
  to make room, so a flood of idle or dripping connections cannot lock the kubelet's probes out; when
  every open connection is being answered, the new one gets a ``503``;
* basic auth (:class:`~sidecar.webconfig.BasicAuth`) is decided before a request takes a place:
  remembered credentials on the loop at once (one HMAC), so a scrape never waits behind a bcrypt
  check; the others on one thread of their own, at most ``AUTH_CHECKS_PENDING`` at a time and
  ``AUTH_FAILURES_PER_CLIENT`` failures per client and minute (past either, ``429`` at once);
* the answers that cost CPU or wait (``/metrics``, a reload) run on
  :data:`WORKERS` threads, at most :data:`MAX_REQUESTS_IN_FLIGHT` at a time (the rest wait, up to
  :data:`REQUEST_TIMEOUT_S`, then ``503``), which also bounds the memory of answers not yet read by
  their clients; ``/healthz`` and ``/readyz`` are answered on the loop at once, never behind them;
* an answer must be taken by its client within :data:`RESPONSE_TIMEOUT_S`;
* a reset, a timeout, garbage or a failed handshake ends its connection with one debug line: nothing
  reaches stderr but log lines in the configured format.

:meth:`Server.shutdown` closes every connection and returns within a fraction of a second, whatever
the clients are doing; the worker threads are daemons, so a request still being answered never delays
the process' exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import email.utils
import errno
import gzip
import logging
import queue
import resource
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from . import __version__, webconfig
from .config import Config
from .webconfig import Serving


class Sidecar(Protocol):
    """What the endpoint needs of :class:`sidecar.scrape_loop.Sidecar`."""

    config: Config
    registry: CollectorRegistry

    def healthy(self) -> tuple[bool, str]: ...


log = logging.getLogger("kv_sidecar.http")

#: Connections the kernel queues before the server accepts them (Linux caps it at
#: ``net.core.somaxconn``, 4096 by default). At the old 5, a burst of 50 probes left most unanswered.
LISTEN_BACKLOG = 1024
#: Connections open at once; past it the one that waited longest for its request is closed (or, when
#: all are being answered, the new one gets a 503). Lowered to what the process' open-file limit leaves.
MAX_CONNECTIONS = 1024
#: File descriptors kept for everything but HTTP connections (targets, the history, the log) when
#: :data:`MAX_CONNECTIONS` is lowered to the open-file limit.
RESERVED_FDS = 64
#: How long a request may take to arrive whole, from its first byte (for a connection's first request:
#: from the accept, TLS handshake included). Prometheus and the kubelet send theirs in well under a
#: millisecond; a client that drips its request is dropped at this deadline, however often it sends.
REQUEST_TIMEOUT_S = 10.0
#: How long a kept-alive connection may wait for its next request: longer than the usual scrape
#: intervals (15 s to 1 min), so Prometheus keeps its connection from one scrape to the next.
IDLE_TIMEOUT_S = 120.0
#: How long a client may take to read an answer (a ``/metrics`` of a few hundred kilobytes to a slow
#: client); past it the connection is closed and its buffer freed.
RESPONSE_TIMEOUT_S = 30.0
#: Request line (method, path and query, version): longer is a 414. Prometheus' is ~30 bytes.
MAX_REQUEST_LINE_BYTES = 8192
#: Request line and headers together: more is a 431 (h11's own default; a basic-auth header is at most
#: 4 KiB, sidecar.webconfig.MAX_AUTHORIZATION_BYTES).
MAX_HEADER_BYTES = 16384
#: A request body (only ``POST /-/reload`` has one, and it is ignored): longer is a 413.
MAX_BODY_BYTES = 65536
#: Threads that compute answers (``/metrics``, basic auth, a reload).
WORKERS = 4
#: Answers being computed or written at once, the probes' excepted; the others wait for a place.
MAX_REQUESTS_IN_FLIGHT = 64
#: How long a 429 for basic-auth attempts past their bounds waits before it is sent: a flood of wrong
#: passwords that retries at once is slowed to a few requests a second per connection, on the loop.
AUTH_REFUSAL_DELAY_S = 0.5
#: Paths served without authentication: kubelet's probes cannot send credentials, and they say no more
#: than "up" and "ready".
OPEN_PATHS = ("/healthz", "/readyz")
#: Bytes read from a socket at once.
READ_CHUNK = 16384
#: After an error answer, how long and how much the server reads what the client still sends before it
#: closes, so that the close does not reset the connection under the answer.
LINGER_S = 1.0
LINGER_BYTES = 1 << 20

#: Answers ``POST /-/reload``: (applied, what happened), from a worker thread.
ReloadRequest = Callable[[], tuple[bool, str]]

#: Methods HTTP defines (RFC 9110): another one is a 501, one of these on a path that does not serve it a 405.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})
GET_ONLY = "GET, HEAD"
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    429: "Too Many Requests",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def max_connections() -> int:
    """:data:`MAX_CONNECTIONS`, lowered so that open connections never exhaust the open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft - RESERVED_FDS))


@dataclass(frozen=True)
class Answer:
    """What a request gets: status, body, content type and extra headers (``gzip``: the body is gzipped)."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text(status: int, message: str, *headers: tuple[str, str]) -> Answer:
    return Answer(status, (message + "\n").encode(), headers=headers)


@dataclass(frozen=True)
class Request:
    """A request as the answers see it: method, path (no query), the headers they read (lower-case names)."""

    method: str
    path: str
    headers: dict[str, str]
    client: str = ""  # the peer's address: what failed basic-auth checks are counted by

    def header(self, name: str) -> str:
        return self.headers.get(name, "")


class _Refused(Exception):
    """A request the server answers with ``status`` and then closes the connection."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


class _Bounds:
    """What one request has sent so far, against the request line, header block and body bounds.

    h11 bounds what it buffers of an incomplete head (:data:`MAX_HEADER_BYTES`), but a head that arrives
    whole in one read passes that check, so the parsed head is measured too.
    """

    __slots__ = ("body", "line", "line_ended", "request")

    def __init__(self) -> None:
        self.line = bytearray()  # the request line so far (at most MAX_REQUEST_LINE_BYTES)
        self.line_ended = False
        self.request: h11.Request | None = None
        self.body = 0

    @property
    def begun(self) -> bool:
        return bool(self.line) or self.request is not None

    def received(self, data: bytes) -> None:
        if self.request is not None or self.line_ended:
            return
        end = data.find(b"\n")
        self.line_ended = end >= 0
        self.line += data[:end] if self.line_ended else data
        if len(self.line) > MAX_REQUEST_LINE_BYTES:
            raise _Refused(414, f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
        if self.line_ended:
            words = bytes(self.line).split()
            if words and (len(words) != 3 or not words[2].startswith(b"HTTP/1.")):
                # HTTP/0.9 ("GET /"), TLS on the plain port, noise: nothing h11 would ever parse
                raise _Refused(400, "not an HTTP/1.x request line")

    def event(self, event: h11.Request | h11.Data) -> None:
        if isinstance(event, h11.Request):
            self.request = event
            head = len(event.method) + len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if head > MAX_HEADER_BYTES:
                raise _Refused(431, f"request headers over {MAX_HEADER_BYTES} bytes")
            names = {n for n, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                # RFC 9112 6.3: a sign of request smuggling, "ought to be handled as an error"
                raise _Refused(400, "both Content-Length and Transfer-Encoding")
            length = _content_length(event)
        else:
            self.body += len(event.data)
            length = self.body
        if length is not None and length > MAX_BODY_BYTES:
            raise _Refused(413, f"request body over {MAX_BODY_BYTES} bytes")


class _Workers(concurrent.futures.Executor):
    """A fixed number of daemon threads: the loop hands them the answers that cost CPU or wait.

    Unlike a ``ThreadPoolExecutor`` (whose threads the interpreter joins at exit), a request still
    being answered when the process stops (a bcrypt check, a reload) never delays the exit.
    """

    def __init__(self, count: int, name: str):
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None]
        self._queue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(count)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as e:  # handed to the awaiting coroutine, which logs it
                future.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


class _Connection:
    """One open connection: its task (cancelled to close it) and its writer."""

    __slots__ = ("peer", "task", "writer")

    def __init__(self, task: asyncio.Task[Any], writer: asyncio.StreamWriter):
        self.task = task
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else "?"

    def abort(self) -> None:
        """Close at once, dropping what is unsent: a client that does not read holds no buffer."""
        self.writer.transport.abort()


class Server:
    """The endpoint on one listening socket: the loop's thread, its connections and the worker threads.

    ``serving`` (TLS, auth, headers) is read for each connection and request; a reload replaces it whole.
    """

    def __init__(
        self,
        sock: socket.socket,
        sidecar: Sidecar,
        ready: Callable[[], bool],
        reload: ReloadRequest | None,
        serving: Serving,
    ):
        self.socket = sock
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self.sidecar = sidecar
        self.ready = ready
        self.reload = reload
        self.serving = serving
        self.max_connections = max_connections()
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_loop_error)
        self._workers = _Workers(WORKERS, "http-worker")
        self._auth_worker = _Workers(1, "http-auth")  # bcrypt checks: never in front of an answer
        self._auth_pending = 0  # checks running or queued (read and written on the loop only)
        self._open: dict[_Connection, None] = {}
        #: connections waiting for (the rest of) a request, longest-waiting first: the ones closed at the limit
        self._waiting: dict[_Connection, None] = {}
        self._limited = 0  # connections closed or refused at the limit since it was last reached
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    # ------------------------------------------------------------------ life cycle

    def start(self) -> Server:
        self._thread.start()
        if not self._started.wait(10):
            raise OSError("the HTTP server did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_REQUESTS_IN_FLIGHT)
        listener = await asyncio.start_server(
            self._on_connection, sock=self.socket, backlog=LISTEN_BACKLOG, limit=READ_CHUNK * 4
        )
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            listener.close()
            tasks = [c.task for c in self._open]
            for c in list(self._open):
                c.abort()
                c.task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=0.5)

    def shutdown(self) -> None:
        """Stop accepting, close every connection and stop the loop's thread (well within a second)."""
        if self._thread.is_alive() and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(2.0)
        self._workers.shutdown(wait=False)
        self._auth_worker.shutdown(wait=False)

    def server_close(self) -> None:
        """Close the listening socket (already closed by :meth:`shutdown` when the server ran)."""
        self.socket.close()

    # ------------------------------------------------------------------ connections

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Connection(task, writer)
        try:
            if not self._admit(conn):
                return
            await self._serve(conn, reader, writer)
        except asyncio.CancelledError:
            pass  # closed to make room, or shutting down; the task ends quietly
        except (OSError, h11.ProtocolError, EOFError, TimeoutError) as e:  # a reset, a closed socket
            log.debug("http connection client=%s ended: %s", conn.peer, e or type(e).__name__)
        except Exception:  # a defect of ours: one line with the traceback, and the server goes on
            log.exception("http connection client=%s failed", conn.peer)
        finally:
            self._open.pop(conn, None)
            self._waiting.pop(conn, None)
            conn.abort()
            if self._limited and len(self._open) < self.max_connections // 2:
                log.info(
                    "http connections below the limit again; %d were closed or refused at the limit of %d",
                    self._limited,
                    self.max_connections,
                )
                self._limited = 0

    def _admit(self, conn: _Connection) -> bool:
        """Whether ``conn`` may be served; at the limit, make room by closing the longest-waiting connection."""
        if len(self._open) >= self.max_connections:
            if not self._limited:
                log.warning(
                    "http connections at the limit of %d: the longest-waiting ones are closed to make room",
                    self.max_connections,
                )
            self._limited += 1
            if not self._waiting:  # every connection is being answered: this one waits for nothing
                if self.serving.tls is None:
                    conn.writer.write(_raw(503, "too many connections"))
                return False
            oldest = next(iter(self._waiting))
            self._waiting.pop(oldest)
            self._open.pop(oldest)
            oldest.abort()
            oldest.task.cancel()
        self._open[conn] = None
        return True

    def _wait_for_request(self, conn: _Connection) -> None:
        self._waiting.pop(conn, None)
        self._waiting[conn] = None  # last: the newest waiter

    async def _serve(self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        self._wait_for_request(conn)
        # drain() then waits until the kernel has every byte, so closing after it never cuts an answer
        writer.transport.set_write_buffer_limits(high=0)
        tls = self.serving.tls
        if tls is not None:
            if not await self._handshake(tls, conn, writer):
                return
            writer.transport.set_write_buffer_limits(high=0)  # the TLS transport that replaced it
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        wait_s, first = REQUEST_TIMEOUT_S - (loop.time() - accepted), True  # the first request: from the accept
        while True:
            self._wait_for_request(conn)
            try:
                request = await self._receive(h, reader, writer, wait_s, started=first)
            except _Refused as e:
                log.debug("http request refused client=%s status=%d: %s", conn.peer, e.status, e)
                if await self._send(h, writer, text(e.status, str(e), ("Connection", "close")), head=False):
                    self._wait_for_request(conn)  # lingering: may be closed to make room
                    await _linger(reader, writer)
                return
            finally:
                self._waiting.pop(conn, None)
            if request is None:
                return
            wait_s, first = IDLE_TIMEOUT_S, False
            answer = await self._answer(dataclasses.replace(request, client=conn.peer))
            if not await self._send(h, writer, answer, head=request.method == "HEAD"):
                return
            log.debug(
                "http request client=%s method=%s path=%s status=%d",
                conn.peer,
                request.method,
                request.path[:200],
                answer.status,
            )
            if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                return  # the client asked to close (or spoke HTTP/1.0)
            h.start_next_cycle()

    async def _handshake(self, tls: webconfig.TLSCertificates, conn: _Connection, writer: asyncio.StreamWriter) -> bool:
        """TLS with the current certificate, bounded by the handshake timeout; False when it failed."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await writer.start_tls(tls.context(), ssl_handshake_timeout=webconfig.HANDSHAKE_TIMEOUT_S)
        except (OSError, ValueError) as e:  # ssl.SSLError and TimeoutError are OSErrors
            log.debug("TLS handshake failed client=%s: %s", conn.peer, e or type(e).__name__)
            return False
        if not tls.allows(writer.get_extra_info("peercert")):
            log.debug("TLS client refused client=%s: no allowed subject alternative name", conn.peer)
            return False
        return True

    async def _receive(
        self,
        h: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        wait_s: float,
        *,
        started: bool,
    ) -> Request | None:
        """The next request, whole, within ``wait_s`` (then :data:`REQUEST_TIMEOUT_S` from its first byte when
        not ``started``); None when the client closed or went quiet; :class:`_Refused` for what gets an error."""
        loop = asyncio.get_running_loop()
        bounds = _Bounds()
        try:
            async with asyncio.timeout(max(wait_s, 0.0)) as deadline:
                while True:
                    event = h.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(READ_CHUNK)
                        if not data:
                            return None  # closed, maybe in the middle of a request: nobody to answer
                        if not started:
                            started = True
                            deadline.reschedule(loop.time() + REQUEST_TIMEOUT_S)
                        bounds.received(data)
                        h.receive_data(data)
                    elif isinstance(event, h11.Request | h11.Data):
                        bounds.event(event)
                        if h.they_are_waiting_for_100_continue:
                            writer.write(h.send(h11.InformationalResponse(status_code=100, headers=[])))
                    elif isinstance(event, h11.EndOfMessage):
                        assert bounds.request is not None
                        return _request(bounds.request)
                    else:  # ConnectionClosed (or PAUSED, which a server reading one request at a time never sees)
                        return None
        except TimeoutError:
            if started and bounds.begun:
                raise _Refused(408, f"request not received within {REQUEST_TIMEOUT_S:g}s") from None
            return None  # nothing came: close quietly
        except h11.RemoteProtocolError as e:
            raise _Refused(e.error_status_hint, f"bad request: {e}") from None

    async def _send(self, h: h11.Connection, writer: asyncio.StreamWriter, answer: Answer, head: bool) -> bool:
        """Write ``answer`` (headers only for ``HEAD``); False when the client did not take it in time."""
        if h.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or writer.is_closing():
            return False
        headers = [
            ("Content-Type", answer.content_type),
            ("Content-Length", str(len(answer.body))),
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Server", f"kv-cache-sidecar/{__version__}"),
            *self.serving.headers,
            *answer.headers,
        ]
        try:
            data = h.send(
                h11.Response(status_code=answer.status, headers=headers, reason=REASONS.get(answer.status, ""))
            )
            if answer.body and not head:
                data += h.send(h11.Data(data=answer.body))
            data += h.send(h11.EndOfMessage())
        except h11.LocalProtocolError as e:  # e.g. a state the request left the connection in
            log.debug("http answer not sent: %s", e)
            return False
        writer.write(data)
        try:
            async with asyncio.timeout(RESPONSE_TIMEOUT_S):
                await writer.drain()
        except TimeoutError:
            log.debug("http answer not read within %ss; connection closed", RESPONSE_TIMEOUT_S)
            return False
        return True

    # ------------------------------------------------------------------ answers

    async def _answer(self, request: Request) -> Answer:
        """The probes at once, on the loop; the rest on a worker, at most MAX_REQUESTS_IN_FLIGHT at a time."""
        if request.method not in KNOWN_METHODS:
            return text(501, f"method {request.method[:20]} not implemented")
        if request.path in OPEN_PATHS:
            return self._probe(request)
        auth = self.serving.auth
        if auth is not None and (refused := await self._authenticate(auth, request)) is not None:
            return refused
        assert self._slots is not None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await self._slots.acquire()
        except TimeoutError:
            return text(503, "busy: too many requests in flight", ("Retry-After", "1"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._workers, self._guarded, request)
        finally:
            self._slots.release()

    async def _authenticate(self, auth: webconfig.BasicAuth, request: Request) -> Answer | None:
        """None when ``request`` may pass; else its 401, or a 429 when checks are at their bounds."""
        header = request.headers.get("authorization")
        verdict = auth.cached(header)
        if verdict is None:
            if auth.blocked(request.client) or self._auth_pending >= webconfig.AUTH_CHECKS_PENDING:
                log.debug("http basic auth not checked client=%s: too many failed or pending checks", request.client)
                await asyncio.sleep(AUTH_REFUSAL_DELAY_S)  # a client that retries at once waits (costs no thread)
                return text(429, "too many authentication attempts", ("Retry-After", "1"))
            self._auth_pending += 1
            try:
                verdict = await asyncio.get_running_loop().run_in_executor(self._auth_worker, auth.check, header)
            finally:
                self._auth_pending -= 1
            if not verdict:
                auth.failed(request.client)
        if verdict:
            return None
        return text(401, "unauthorized", ("WWW-Authenticate", 'Basic realm="kv-cache-sidecar", charset="UTF-8"'))

    def _probe(self, request: Request) -> Answer:
        if request.method not in ("GET", "HEAD"):
            return text(405, "use GET", ("Allow", GET_ONLY))
        if request.path == "/healthz":
            ok, why = self.sidecar.healthy()
            return text(200 if ok else 503, why)
        ok = self.ready()
        return text(200 if ok else 503, "ready" if ok else "not ready")

    def _guarded(self, request: Request) -> Answer:
        method, path = request.method, request.path
        reload = self.reload
        if path == "/-/reload" and reload is not None:
            if method != "POST":
                return text(405, "use POST to reload", ("Allow", "POST"))
            ok, message = reload()
            return text(200 if ok else 500, message)
        if path not in ("/metrics", "/"):
            return text(404, "not found")
        if method not in ("GET", "HEAD"):
            return text(405, "use GET", ("Allow", GET_ONLY))
        if path == "/":
            return Answer(200, _index_page(), "text/html; charset=utf-8")
        encoder, content_type = choose_encoder(request.header("accept"))
        body = encoder(self.sidecar.registry)
        if gzip_accepted(request.header("accept-encoding")):
            return Answer(
                200,
                gzip.compress(body, compresslevel=6, mtime=0),
                content_type,
                (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")),
            )
        return Answer(200, body, content_type, (("Vary", "Accept-Encoding"),))


def _index_page() -> bytes:
    return (
        f"<html><head><title>kv-cache-sidecar</title></head><body><h1>kv-cache-sidecar "
        f"{__version__}</h1><p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
        f"<a href='/readyz'>/readyz</a></p></body></html>"
    ).encode()


def _request(event: h11.Request) -> Request:
    target = event.target.decode("ascii", "replace")
    path = urlsplit(target).path if not target.startswith("/") else target.split("?", 1)[0]
    wanted = {"accept", "accept-encoding", "authorization"}
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("ascii", "replace")
        if key in wanted:
            shown = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {shown}" if key in headers and key != "authorization" else shown
    return Request(event.method.decode("ascii", "replace").upper(), path, headers)


def _content_length(event: h11.Request) -> int | None:
    for name, value in event.headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an error answer, read what the client still sends for a moment before closing: closing a socket
    with unread bytes resets it, and the reset can destroy the answer before the client reads it."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            drained = 0
            while drained < LINGER_BYTES and (data := await reader.read(READ_CHUNK)):
                drained += len(data)
    except (OSError, RuntimeError):  # TimeoutError is an OSError; RuntimeError: the transport closed meanwhile
        pass


def _raw(status: int, message: str) -> bytes:
    """A whole answer written before any request was read (the connection closes after it)."""
    body = (message + "\n").encode()
    return (
        f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What asyncio reports about a connection: one log line in the configured format, never a raw traceback."""
    exc = context.get("exception")
    message = context.get("message", "")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        log.warning("http: %s (%s): the open-file limit is reached", message, exc)
    elif isinstance(exc, OSError | h11.ProtocolError | ssl.SSLError) or exc is None:
        log.debug("http: %s %s", message, exc or "")
    else:
        log.error("http: %s", message, exc_info=exc)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv6 when ``host`` has a colon), with :data:`LISTEN_BACKLOG`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def start_http(
    sidecar: Sidecar,
    ready: Callable[[], bool],
    reload: ReloadRequest | None = None,
    web: Serving | None = None,
) -> Server:
    """Serve on ``config.listen_address`` in a thread; ``reload`` answers ``POST /-/reload`` (404 without).

    Raises OSError when the address cannot be listened on.
    """
    host, port = sidecar.config.listen_host_port
    return Server(listen(host, port), sidecar, ready, reload, web or Serving()).start()
