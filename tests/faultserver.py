"""A local HTTP server that misbehaves on demand, for the scrape fault tests.

Set ``server.behaviour`` to one of the functions below (or any callable taking
the request handler) between scrapes.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.behaviour = ok(b"")
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests += 1
        try:
            self.server.behaviour(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sidecar gave up on us: that is the point of some behaviours

    def log_message(self, *args) -> None:
        pass


def _send(h: BaseHTTPRequestHandler, code: int, body: bytes, content_type="text/plain; version=1.0.0; charset=utf-8"):
    h.send_response(code)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def ok(body: bytes, delay_s: float = 0.0):
    def behave(h):
        if delay_s:
            time.sleep(delay_s)
        _send(h, 200, body)

    return behave


def status(code: int):
    return lambda h: _send(h, code, b"error\n")


def slow_body(body: bytes, seconds: float):
    """Headers at once, then the body dripped over ``seconds`` (each read stays under the timeout)."""

    def behave(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        pieces = 20
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            h.wfile.write(body[i : i + step])
            h.wfile.flush()
            time.sleep(seconds / pieces)

    return behave


def huge_chunked(total_bytes: int):
    """A chunked body without Content-Length, larger than any sane limit."""

    def behave(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        line = b"# padding padding padding padding padding padding padding padding\n" * 1000
        sent = 0
        while sent < total_bytes:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            sent += len(line)
        h.wfile.write(b"0\r\n\r\n")

    return behave
