"""HTTP edge of the simulator: the engine's metrics path and ``/health``, like a vLLM (or SGLang, ...) server.

Simulated time follows the wall clock times ``speed``. The simulator is advanced
lazily, when a request arrives, to ``(monotonic() - start) x speed``; between
requests nothing runs, so an idle simulator costs no CPU.

Every response carries ``X-Simulated-Time: <seconds>``, the simulated clock the
body was rendered at. It exists for tests and replays only (a sidecar configured
for replays stamps its samples with it); a real vLLM sends no such header.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..generations import Generation
from .engines import DEFAULT_ENGINE, exposition_of
from .simulation import Simulator

SIMULATED_TIME_HEADER = "X-Simulated-Time"


class SimServer:
    """Serve one ``Simulator``; ``start()`` runs it on a daemon thread, ``stop()`` ends it.

    ``engine`` picks the exposition (``sidecar.simulator.engines``): its text, its metrics path and
    its Content-Type; ``generation`` is the vLLM metric generation (other engines have one each).
    """

    def __init__(
        self,
        sim: Simulator,
        host: str = "127.0.0.1",
        port: int = 8000,
        speed: float = 1.0,
        generation: Generation = Generation.V1_CAPACITY_LABELS,
        clock: Callable[[], float] = time.monotonic,
        engine: str = DEFAULT_ENGINE,
    ) -> None:
        self.sim = sim
        self.speed = speed
        self.generation = generation
        self.exposition = exposition_of(engine)
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"owner": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def metrics_url(self) -> str:
        """Where the simulated engine serves its metrics (``/prometheus/metrics`` for TensorRT-LLM)."""
        return self.url + self.exposition.path

    def sync(self) -> tuple[float, bool, str | None]:
        """Advance to the current simulated time; return (sim time, up, /metrics body)."""
        with self._lock:
            target = (self._clock() - self._t0) * self.speed
            if target > self.sim.now:
                self.sim.advance_to(target)
            up = self.sim.up
            body = self.exposition.render(self.sim, self.generation) if up else None
            return self.sim.now, up, body

    def start(self) -> SimServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    owner: SimServer
    server_version = "kv-sidecar-simulator"
    disable_nagle_algorithm = True  # headers and body leave at once, no delayed-ACK stall
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every few seconds would flood the terminal

    def _send(self, code: int, body: bytes, content_type: str, sim_time: float) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header(SIMULATED_TIME_HEADER, repr(float(sim_time)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        now, up, body = self.owner.sync()
        metrics = self.owner.exposition
        if path not in (metrics.path, "/health"):
            self._send(404, b"Not Found\n", "text/plain; charset=utf-8", now)
        elif not up:
            self._send(503, b"engine restarting (simulated)\n", "text/plain; charset=utf-8", now)
        elif path == "/health":
            self._send(200, b"", "text/plain; charset=utf-8", now)
        else:
            self._send(200, (body or "").encode(), metrics.content_type, now)

    do_HEAD = do_GET
