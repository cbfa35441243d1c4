"""Serve a fixed /metrics page from a separate process (so its CPU is not the sidecar's).

Each answer carries ``X-Simulated-Time``, advancing by ``--step`` seconds per
request, so a benchmark can run thousands of cycles in seconds while the
sidecar's history sees a realistic 5 s interval (target ``clock: simulated``).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_page(page: Path | list[Path], step_s: float = 5.0):
    """Serve ``page`` (or, given a list, the pages in turn, one per request)."""
    pages = page if isinstance(page, list) else [page]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, str(port), str(step_s)] + [str(p) for p in pages])
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _main(port: int, step_s: float, pages: list[str]) -> None:
    bodies = [Path(p).read_bytes() for p in pages]
    clock = [0.0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn
        disable_nagle_algorithm = True  # headers and body leave at once, no delayed-ACK stall

        def do_GET(self):
            clock[0] += step_s
            body = bodies[int(clock[0] / step_s) % len(bodies)]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=1.0.0; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Simulated-Time", f"{clock[0]:.3f}")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # the sidecar drops a page past its limits mid-body: a reset here is the point, not news

    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    _main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:])
