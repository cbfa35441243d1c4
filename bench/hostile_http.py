"""The HTTP endpoint and the signals under hostile clients: worst time per case and peak RSS of the sidecar.

Starts a real ``kv-sidecar run`` scraping the simulator, throws each case at it and prints one JSON line
per case::

    {"surface": "http", "case": "burst_200_healthz", "seconds": 0.04, "rss_mib": 41.2, ...}

``seconds`` is the worst wall time of the case (the slowest answer, or the time to be dropped, or from
SIGTERM to the exit), ``rss_mib`` the sidecar's peak RSS during the case (its high-water mark, reset
before each case where the kernel allows). Some cases add what they measure: ``threads`` (the sidecar's
threads with 1,000 connections open), ``answered`` / ``of``. Exits 0; about 40 s.

    .venv/bin/python bench/hostile_http.py [--case NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KV = Path(sys.executable).with_name("kv-sidecar")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: sidecar\r\n{extra}Connection: close\r\n\r\n".encode()


def exchange(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := s.recv(65536):
                out += chunk
        return out


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


class Process:
    """A child process; its peak RSS (VmHWM) and threads from /proc."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )

    def status(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"no {field} in /proc/{self.proc.pid}/status")

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError):  # "5" resets the peak RSS (Linux >= 4.0); not allowed everywhere
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def peak_mib(self) -> float:
        return round(self.status("VmHWM") / 1024, 1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sidecar(target: str, *extra: str) -> tuple[Process, int]:
    port = free_port()
    p = Process([str(KV), "run", "--target", target, "--web.listen-address", f"127.0.0.1:{port}", *extra])
    wait_port(port)
    return p, port


# ----------------------------------------------------------------------------- the cases


def burst(port: int, clients: int, data: bytes) -> dict[str, object]:
    """``clients`` connections at once, each sending ``data``; the slowest answer and how many were answered."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(clients)]
    start = time.perf_counter()
    for s in socks:
        s.sendall(data)
    worst, answered = 0.0, 0
    for s in socks:
        with contextlib.suppress(OSError):
            if s.recv(65536)[:12] in (b"HTTP/1.1 200", b"HTTP/1.0 200"):
                answered += 1
        worst = max(worst, time.perf_counter() - start)
        s.close()
    return {"seconds": worst, "answered": answered, "of": clients}


def idle_connections(port: int, p: Process, count: int) -> dict[str, object]:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    try:
        time.sleep(0.5)
        threads = p.status("Threads")
        worst = max(timed(lambda: exchange(port, get("/healthz"))) for _ in range(20))
        worst = max(worst, max(timed(lambda: exchange(port, get("/metrics"))) for _ in range(5)))
    finally:
        for s in socks:
            s.close()
    return {"seconds": worst, "threads": threads, "connections": count}


def slowloris(port: int, clients: int) -> dict[str, object]:
    """``clients`` connections dripping a request a byte every 100 ms: the time until the last is dropped."""

    def drip() -> float:
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.settimeout(0.1)
            request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Drip: a\r\n" * 1000
            for i in range(len(request)):
                if time.perf_counter() - start > 60:
                    break  # never dropped: the case reports the cap
                try:
                    s.send(request[i : i + 1])
                    if not s.recv(1):
                        break
                    break  # answered (408): dropped
                except TimeoutError:
                    continue
                except OSError:
                    break
        return time.perf_counter() - start

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(drip) for _ in range(clients)]
        probe = max(timed(lambda: exchange(port, get("/healthz"))) for _ in range(5))
        dropped = [f.result() for f in futures]
    return {"seconds": max(dropped), "healthz_seconds": probe, "clients": clients}


def garbage(port: int) -> dict[str, object]:
    payloads = [
        os.urandom(4096),
        b"GET /\r\n",
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"b" * 100_000 + b"\r\n\r\n",
        b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n" + b"x" * 65536,
        bytes.fromhex("1603010200010001fc0303") + os.urandom(500),
    ]
    worst = 0.0
    for _ in range(20):
        for data in payloads:
            worst = max(worst, timed(lambda data=data: exchange(port, data)))
    for _ in range(200):  # resets mid-request
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    worst = max(worst, timed(lambda: exchange(port, get("/healthz"))))
    return {"seconds": worst, "requests": 20 * len(payloads) + 200}


def metrics(port: int, gzip_on: bool) -> dict[str, object]:
    data = get("/metrics", "Accept-Encoding: gzip\r\n" if gzip_on else "")
    times = [timed(lambda: exchange(port, data)) for _ in range(50)]
    size = len(exchange(port, data).partition(b"\r\n\r\n")[2])
    return {"seconds": max(times), "median_seconds": sorted(times)[25], "body_bytes": size}


def sigterm(target: str, extra: tuple[str, ...] = (), connections: int = 0) -> dict[str, object]:
    p, port = sidecar(target, *extra)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(connections)]
    try:
        time.sleep(1.5)  # a scrape is in flight (the hung target) or done
        rss = p.peak_mib()
        start = time.perf_counter()
        p.proc.send_signal(signal.SIGTERM)
        code = p.proc.wait(30)
        seconds = time.perf_counter() - start
    finally:
        for s in socks:
            s.close()
        p.stop()
    return {"seconds": seconds, "exit_code": code, "rss_mib": rss}


class Hung:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.sock.accept()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="run only these cases")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))

    sim_port = free_port()
    sim = Process([str(KV), "simulate", "--port", str(sim_port), "--speed", "30"])
    wait_port(sim_port)
    target = f"http://127.0.0.1:{sim_port}/metrics"
    p, port = sidecar(target, "--scrape.interval", "1s")
    hung = Hung()
    time.sleep(2)  # a few scrapes: /metrics has the target's series
    cases: dict[str, Callable[[], dict[str, object]]] = {
        "burst_200_healthz": lambda: burst(port, 200, get("/healthz")),
        "burst_500_clients": lambda: burst(port, 500, get("/healthz")),
        "burst_100_metrics": lambda: burst(port, 100, get("/metrics", "Accept-Encoding: gzip\r\n")),
        "idle_1000_connections": lambda: idle_connections(port, p, 1000),
        "slowloris_100_clients": lambda: slowloris(port, 100),
        "garbage_and_resets": lambda: garbage(port),
        "metrics_gzip": lambda: metrics(port, True),
        "metrics_plain": lambda: metrics(port, False),
        "sigterm_idle": lambda: sigterm(target),
        "sigterm_hung_target": lambda: sigterm(hung.url),
        "sigterm_1000_connections": lambda: sigterm(target, connections=1000),
    }
    try:
        for name, run in cases.items():
            if args.case and name not in args.case:
                continue
            p.reset_peak()
            result = run()
            if p.proc.poll() is not None:
                result["error"] = f"the sidecar exited with {p.proc.returncode}"
            seconds = result.pop("seconds")
            assert isinstance(seconds, float)
            row: dict[str, object] = {"surface": "http", "case": name, "seconds": round(seconds, 4)}
            row["rss_mib"] = result.pop("rss_mib") if "rss_mib" in result else p.peak_mib()
            row.update(result)
            print(json.dumps(row), flush=True)
    finally:
        p.stop()
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
