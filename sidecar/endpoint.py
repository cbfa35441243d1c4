"""The HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``POST /-/reload`` (the serving edge).

A threaded ``http.server`` serving one :class:`~sidecar.daemon.Sidecar`:

* ``/metrics``: the sidecar's registry in the format the ``Accept`` header asks for;
* ``/healthz``: every target's scrape loop ticked within three intervals (the liveness probe);
* ``/readyz``: configuration loaded and HTTP up, never depending on vLLM (the startup probe);
* ``POST /-/reload``: re-read the configuration (Prometheus' convention);
* ``--web.config.file`` (:mod:`sidecar.webconfig`): TLS, each accepted connection wrapped with the current
  certificate in its own thread, basic auth on everything but :data:`OPEN_PATHS`, extra response headers.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import __version__
from .config import Config
from .webconfig import Serving


class Sidecar(Protocol):
    """What the endpoint needs of :class:`sidecar.daemon.Sidecar`."""

    config: Config
    registry: CollectorRegistry

    def healthy(self) -> tuple[bool, str]: ...


log = logging.getLogger("kv_sidecar.http")

#: How long an HTTP connection may wait between two reads or writes (a client that sends nothing
#: holds a thread no longer than this).
REQUEST_TIMEOUT_S = 30.0
#: Paths served without authentication: kubelet's probes cannot send credentials, and they say no more
#: than "up" and "ready".
OPEN_PATHS = ("/healthz", "/readyz")

#: Answers ``POST /-/reload``: (applied, what happened), from the HTTP thread.
ReloadRequest = Callable[[], tuple[bool, str]]


class _Handler(BaseHTTPRequestHandler):
    """The endpoint; :func:`_handler` binds it to one sidecar."""

    server_version = f"kv-cache-sidecar/{__version__}"
    disable_nagle_algorithm = True  # headers and body leave at once, no delayed-ACK stall
    timeout = REQUEST_TIMEOUT_S
    server: Server
    sidecar: Sidecar
    ready: Callable[[], bool]
    reload: ReloadRequest | None = None

    def do_GET(self) -> None:  # http.server's naming
        path = self.path.split("?", 1)[0]
        if path not in OPEN_PATHS and not self._authorized():
            return
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.sidecar.registry), content_type)
        elif path == "/healthz":
            ok, why = self.sidecar.healthy()
            self._text(200 if ok else 503, why)
        elif path == "/readyz":
            ok = self.ready()
            self._text(200 if ok else 503, "ready" if ok else "not ready")
        elif path == "/-/reload" and self.reload is not None:
            self._text(405, "use POST to reload", ("Allow", "POST"))
        elif path == "/":
            page = (
                f"<html><head><title>kv-cache-sidecar</title></head><body><h1>kv-cache-sidecar "
                f"{__version__}</h1><p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                f"<a href='/readyz'>/readyz</a></p></body></html>"
            )
            self._send(200, page.encode(), "text/html; charset=utf-8")
        else:
            self._text(404, "not found")

    def do_POST(self) -> None:
        """``POST /-/reload`` (Prometheus' convention): 200 when applied, 500 with the problems when refused."""
        path = self.path.split("?", 1)[0]
        self._discard_body()
        if path not in OPEN_PATHS and not self._authorized():
            return
        reload = self.reload
        if path == "/-/reload" and reload is not None:
            ok, message = reload()
            self._text(200 if ok else 500, message)
        elif path in ("/metrics", "/", *OPEN_PATHS):
            self._text(405, "use GET", ("Allow", "GET"))
        else:
            self._text(404, "not found")

    def _discard_body(self) -> None:
        """Read a small request body: closing with unread bytes would reset the connection under the answer."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= 65536:
            self.rfile.read(length)

    def _authorized(self) -> bool:
        """True when no basic auth is configured or the request's credentials pass; else answers 401."""
        auth = self.server.serving.auth
        if auth is None or auth.allows(self.headers.get("Authorization")):
            return True
        self._text(401, "unauthorized", ("WWW-Authenticate", 'Basic realm="kv-cache-sidecar", charset="UTF-8"'))
        return False

    def _text(self, code: int, text: str, *headers: tuple[str, str]) -> None:
        self._send(code, (text + "\n").encode(), "text/plain; charset=utf-8", *headers)

    def _send(self, code: int, body: bytes, content_type: str, *headers: tuple[str, str]) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (*self.server.serving.headers, *headers):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http %s", format % args)


def _handler(sidecar: Sidecar, ready: Callable[[], bool], reload: ReloadRequest | None) -> type[_Handler]:
    # staticmethod: plain functions stored on the class would otherwise become methods of each request
    attrs = {"sidecar": sidecar, "ready": staticmethod(ready), "reload": staticmethod(reload) if reload else None}
    return type("Handler", (_Handler,), attrs)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    #: TLS, auth and headers; replaced whole by a reload
    serving: Serving = Serving()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's own thread: the TLS handshake first (bounded), then the request."""
        tls = self.serving.tls
        if tls is None:
            super().finish_request(request, client_address)
            return
        try:
            conn = tls.wrap(request)
        except (OSError, ValueError) as e:  # ssl.SSLError and timeouts are OSErrors
            log.debug("TLS handshake failed client=%s: %s", client_address[0], e)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            self.shutdown_request(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed mid-request (a reset, a timeout): one debug line, not a traceback on stderr."""
        log.debug("http connection from %s ended with an error", client_address[0], exc_info=True)


class Server6(Server):
    address_family = socket.AF_INET6


def start_http(
    sidecar: Sidecar,
    ready: Callable[[], bool],
    reload: ReloadRequest | None = None,
    web: Serving | None = None,
) -> Server:
    """Serve on ``config.listen_address`` in a thread; ``reload`` answers ``POST /-/reload`` (404 without)."""
    host, port = sidecar.config.listen_host_port
    server_class = Server6 if ":" in host else Server
    server = server_class((host or "0.0.0.0", port), _handler(sidecar, ready, reload))
    server.serving = web or Serving()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
