"""Basic auth under a flood of wrong passwords: the authenticated scrape's latency, quiet and flooded.

Starts the simulator and a real ``kv-sidecar run`` with a ``--web.config.file`` holding one user with a
cost-10 bcrypt hash (the cost docs/security.md documents), remembers the scraper's credentials with one
scrape, then opens ``--clients`` keep-alive connections that send wrong passwords as fast as they are
answered (each from its own loopback address and with a new user name each time, so neither the
per-client bound nor a cache helps) for ``--seconds``, while a scraper
with the right credentials asks ``/metrics`` every 0.25 s on its own keep-alive connection. Prints one
JSON line per client count::

    {"surface": "auth", "clients": 128, "quiet_worst_s": 0.01, "flood_worst_s": 0.05, "flood_p50_s": ...,
     "scrapes": 60, "failed_scrapes": 0, "flood_answers": {"401": 300, "429": 9000}}

The target is ``flood_worst_s`` within 1 s of ``quiet_worst_s``. About 20 s per client count.

    .venv/bin/python bench/hostile_auth.py [--clients 64 128] [--seconds 15]
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import bcrypt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_http import KV, Process, free_port, wait_port

PASSWORD = b"scraper-password"


def _header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


class KeepAlive:
    """One keep-alive HTTP/1.1 connection that sends GET /metrics with a given Authorization header."""

    def __init__(self, port: int, source: str = "127.0.0.1"):
        self.port = port
        self.source = source
        self.sock: socket.socket | None = None

    def get(self, authorization: str, timeout: float = 30.0) -> int:
        """The status of one request (0 when the connection failed; it is reopened next time)."""
        request = f"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nAuthorization: {authorization}\r\n\r\n".encode()
        try:
            if self.sock is None:
                self.sock = socket.create_connection(
                    ("127.0.0.1", self.port), timeout=timeout, source_address=(self.source, 0)
                )
            self.sock.settimeout(timeout)
            self.sock.sendall(request)
            return self._read_answer()
        except OSError:
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            return 0

    def _read_answer(self) -> int:
        assert self.sock is not None
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("closed")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next((int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0)
        while len(body) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("closed")
            body += chunk
        if any(x.lower() == "connection: close" for x in lines[1:]):
            self.sock.close()
            self.sock = None
        return status


def scrape_latencies(port: int, seconds: float, stop: threading.Event | None = None) -> tuple[list[float], int]:
    """Latencies of authenticated scrapes every 0.25 s for ``seconds``, and how many were not a 200."""
    conn = KeepAlive(port)
    out: list[float] = []
    failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop and stop.is_set()):
        t = time.monotonic()
        status = conn.get(_header("prometheus", PASSWORD), timeout=30)
        out.append(time.monotonic() - t)
        failed += status != 200
        time.sleep(0.25)
    return out, failed


def flood(port: int, clients: int, stop: threading.Event, answers: Counter[str]) -> list[threading.Thread]:
    lock = threading.Lock()

    def one(i: int) -> None:
        conn = KeepAlive(port, f"127.0.{1 + i // 250}.{2 + i % 250}")  # an address each: no per-client bound helps
        n = 0
        while not stop.is_set():
            n += 1
            status = conn.get(_header(f"attacker{i}-{n}", b"wrong"), timeout=30)
            with lock:
                answers[str(status)] += 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    return threads


def case(target: str, clients: int, seconds: float, folder: Path) -> dict[str, object]:
    hashed = bcrypt.hashpw(PASSWORD, bcrypt.gensalt(10)).decode()
    web = folder / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port = free_port()
    p = Process(
        [str(KV), "run", "--target", target, "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web)]
    )
    try:
        wait_port(port)
        quiet, quiet_failed = scrape_latencies(port, 3.0)  # the first one runs bcrypt, then remembered
        quiet = quiet[1:]
        stop = threading.Event()
        answers: Counter[str] = Counter()
        threads = flood(port, clients, stop, answers)
        time.sleep(1.0)  # the flood is under way
        flooded, failed = scrape_latencies(port, seconds)
        stop.set()
        for t in threads:
            t.join(35)
        return {
            "surface": "auth",
            "clients": clients,
            "quiet_worst_s": round(max(quiet), 3),
            "flood_worst_s": round(max(flooded), 3),
            "flood_p50_s": round(statistics.median(flooded), 3),
            "scrapes": len(flooded),
            "failed_scrapes": failed + quiet_failed,
            "flood_answers": dict(answers),
            "rss_mib": p.peak_mib(),
        }
    finally:
        p.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    sim_port = free_port()
    sim = Process([str(KV), "simulate", "--port", str(sim_port), "--speed", "30"])
    try:
        wait_port(sim_port)
        with tempfile.TemporaryDirectory() as tmp:
            for clients in args.clients:
                result = case(f"http://127.0.0.1:{sim_port}/metrics", clients, args.seconds, Path(tmp))
                print(json.dumps(result), flush=True)
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
