"""The HTTP endpoint against hostile and broken clients (sidecar/endpoint.py).

Most cases run against a real ``kv-sidecar run`` at debug level, whose stderr is read after each one:
it must stay up, answer ``/healthz``, and print nothing but logfmt lines, never a traceback. The cases
that need a short deadline or a small cap run the same server in this process (``start_http``) with
the constant lowered. Speed and memory are measured by ``bench/hostile_http.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import re
import resource
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from certs import needs_openssl, self_signed
from processes import free_port, kv_sidecar
from prometheus_client.core import GaugeMetricFamily

from sidecar import endpoint, webconfig
from sidecar.config import load_config
from sidecar.endpoint import start_http
from sidecar.limits import LIMITS
from sidecar.scrape_loop import Sidecar
from sidecar.webconfig import load_web_config, serving

#: One logfmt record (sidecar/logs.py): every stderr line of the daemon must be one.
LOGFMT = re.compile(r'^ts=\S+ level=(debug|info|warning|error|critical) logger=\S+ msg="(?:[^"\\]|\\.)*"( err=".*")?$')


def raise_open_files(needed: int) -> None:
    """Let this process (and the sidecar it starts) hold ``needed`` sockets; skip where the hard limit forbids."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the open-file hard limit ({hard}) is below the {needed} sockets this case opens")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


# ----------------------------------------------------------------------------- raw clients


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (a reset ends it too)."""
    s.settimeout(timeout)
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    return out


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection, then read until the server closes it."""
    with connect(port, timeout) as s:
        s.sendall(data)
        return read_all(s, timeout)


def status(answer: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    assert m, answer[:200]
    return int(m.group(1))


def head_and_body(answer: bytes) -> tuple[dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers, body


def reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of a FIN."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: sidecar\r\n{extra}Connection: close\r\n\r\n".encode()


# ----------------------------------------------------------------------------- the daemon, as deployed


class Daemon:
    """A ``kv-sidecar run`` at debug level; :meth:`check` asserts it is up and its stderr is clean so far."""

    def __init__(self, folder: Path, *extra: str, target: str | None = "", interval: str | None = "1s"):
        """``target`` None: none on the command line (the configuration file's); "": a port where nothing listens."""
        self.port = free_port()
        self.log = folder / "sidecar.stderr"
        self._seen = 0
        argv = [*kv_sidecar(), "run", "--web.listen-address", f"127.0.0.1:{self.port}", "--log.level", "debug"]
        if target is not None:
            argv += ["--target", target or f"http://127.0.0.1:{free_port()}/metrics"]
        if interval is not None:
            argv += ["--scrape.interval", interval]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [*argv, *extra], stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            with contextlib.suppress(OSError):
                if status(exchange(self.port, get("/readyz"), timeout=2)) == 200:
                    break
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads: line")

    def new_stderr(self) -> list[str]:
        lines = self.log.read_text(errors="replace").splitlines()
        new, self._seen = lines[self._seen :], len(lines)
        return new

    def check(self) -> list[str]:
        """Up, answering /healthz, and every stderr line since the last check logfmt without a traceback."""
        assert self.proc.poll() is None, self.log.read_text()[-4000:]
        assert status(exchange(self.port, get("/healthz"))) == 200
        lines = self.new_stderr()
        for line in lines:
            assert LOGFMT.match(line), f"not a logfmt line: {line[:300]!r}"
            assert "Traceback" not in line, line[:2000]
        return lines

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def running(tmp_path_factory) -> Iterator[Daemon]:
    raise_open_files(2200)  # before the start: the sidecar inherits the limit
    daemon = Daemon(tmp_path_factory.mktemp("http"))
    yield daemon
    code = daemon.stop()
    assert code == 0, daemon.log.read_text()[-4000:]


@pytest.fixture
def sidecar(running: Daemon) -> Iterator[Daemon]:
    """The running daemon; after the case it must still be up and its stderr clean."""
    running.new_stderr()
    yield running
    running.check()


# ----------------------------------------------------------------------------- load


def test_a_burst_of_200_concurrent_probes_is_answered_whole(sidecar):
    clients = [connect(sidecar.port) for _ in range(200)]  # all queued in the backlog at once
    try:
        for c in clients:
            c.sendall(get("/healthz"))
        answers = [read_all(c) for c in clients]
    finally:
        for c in clients:
            c.close()
    assert [status(a) for a in answers] == [200] * 200


def test_1000_idle_connections_hold_no_threads_and_the_probes_still_answer(sidecar):
    before = sidecar.threads()
    idle = [connect(sidecar.port) for _ in range(1000)]
    try:
        time.sleep(0.5)
        during = sidecar.threads()
        assert during <= before + 2, (before, during)  # one loop for every connection, not a thread each
        start = time.monotonic()
        assert status(exchange(sidecar.port, get("/healthz"))) == 200
        assert status(exchange(sidecar.port, get("/metrics"))) == 200
        assert time.monotonic() - start < 5
    finally:
        for s in idle:
            s.close()


def test_keep_alive_and_pipelined_requests_are_answered_in_order(sidecar):
    with httpx.Client(base_url=sidecar.base) as client:
        for path in ("/healthz", "/metrics", "/readyz", "/healthz"):
            assert client.get(path).status_code == 200  # one connection, reused
    with connect(sidecar.port) as s:
        s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n" + get("/healthz"))
        answers = read_all(s)
    assert re.findall(rb"HTTP/1\.1 (\d{3})", answers) == [b"200", b"404", b"200"]


# ----------------------------------------------------------------------------- requests that are not HTTP


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(bytes(range(256)) * 4, id="binary-noise"),
        pytest.param(b"\x00\x00\x00\x00GET / HTTP/1.1\r\n\r\n", id="nul-bytes"),
        pytest.param(b"GET /\r\n", id="http-0.9"),
        pytest.param(b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", id="http-2-in-text"),
        pytest.param(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", id="http-2-preface"),
        pytest.param(bytes.fromhex("1603010200010002000303") + os.urandom(64) + b"\n", id="tls-hello"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", id="malformed-header"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http-1.1-without-host"),
        pytest.param(b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n", id="bad-content-length"),
        pytest.param(
            b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            id="smuggling-length-and-chunked",
        ),
    ],
)
def test_what_is_not_an_http_1_request_gets_a_400_and_nothing_else(sidecar, data):
    answer = exchange(sidecar.port, data)
    assert status(answer) == 400, answer[:300]
    assert b"kvcache_" not in answer


def test_tls_on_the_plain_port_gets_a_400_at_once(sidecar):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with connect(sidecar.port) as raw, pytest.raises((ssl.SSLError, OSError)):
        context.wrap_socket(raw, server_hostname="sidecar")  # the server's answer is a plain 400, not TLS


def test_a_huge_request_line_is_a_414(sidecar):
    answer = exchange(sidecar.port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status(answer) == 414
    endless = exchange(sidecar.port, b"G" * 50_000)  # never a line end: refused at the bound, not at the deadline
    assert status(endless) == 414


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(b"X-Big: " + b"b" * 40_000 + b"\r\n", id="one-huge-header"),
        pytest.param(b"".join(b"X-H%d: value\r\n" % i for i in range(5000)), id="5000-small-headers"),
    ],
)
def test_a_huge_header_block_is_a_431(sidecar, headers):
    answer = exchange(sidecar.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status(answer) == 431


def test_a_huge_body_is_a_413_unread(sidecar):
    with connect(sidecar.port) as s:
        s.sendall(b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n" + b"x" * 100_000)
        assert status(read_all(s)) == 413
    chunked = b"POST /-/reload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"10000\r\n" + b"y" * 65536
    assert status(exchange(sidecar.port, chunked + b"\r\n" + b"10\r\n" + b"y" * 16 + b"\r\n0\r\n\r\n")) == 413


def test_resets_mid_request_and_mid_answer_leave_no_trace(sidecar):
    for partial in (b"GET /metr", b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: te", b"POST /-/reload HTTP/1.1\r\n"):
        s = connect(sidecar.port)
        s.sendall(partial)
        time.sleep(0.05)
        reset(s)
    for _ in range(20):  # asks for the biggest answer, then resets before reading it
        s = connect(sidecar.port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reset(s)
    s = connect(sidecar.port)
    s.close()  # connects and leaves at once
    time.sleep(0.3)
    lines = sidecar.check()
    assert not [line for line in lines if "level=error" in line or ("level=warning" in line and "http" in line)]


# ----------------------------------------------------------------------------- methods, HEAD, gzip


@pytest.mark.parametrize(
    ("request_line", "code", "allow"),
    [
        ("PUT /metrics", 405, "GET, HEAD"),
        ("DELETE /metrics", 405, "GET, HEAD"),
        ("PATCH /", 405, "GET, HEAD"),
        ("DELETE /-/reload", 405, "POST"),
        ("PUT /healthz", 405, "GET, HEAD"),
        ("OPTIONS /metrics", 405, "GET, HEAD"),
        ("BREW /metrics", 501, None),
        ("TRACE /nope", 404, None),
    ],
)
def test_other_methods_are_refused_with_405_or_501(sidecar, request_line, code, allow):
    answer = exchange(sidecar.port, f"{request_line} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    headers, _ = head_and_body(answer)
    assert status(answer) == code
    assert headers.get("allow") == allow


def test_head_gives_the_headers_of_get_without_a_body(sidecar):
    for path, content_type in (
        ("/metrics", "text/plain; version=0.0.4"),
        ("/healthz", "text/plain"),
        ("/", "text/html"),
    ):
        answer = exchange(sidecar.port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        headers, body = head_and_body(answer)
        assert status(answer) == 200 and headers["content-type"].startswith(content_type), path
        assert int(headers["content-length"]) > 0 and body == b"", path
    got = httpx.get(sidecar.base + "/healthz")
    assert (
        got.headers["content-length"]
        == head_and_body(exchange(sidecar.port, b"HEAD /healthz HTTP/1.0\r\n\r\n"))[0]["content-length"]
    )


def test_metrics_are_gzipped_when_the_scraper_asks_and_only_then(sidecar):
    zipped = exchange(sidecar.port, get("/metrics", "Accept-Encoding: gzip\r\n"))
    headers, body = head_and_body(zipped)
    assert headers["content-encoding"] == "gzip" and "accept-encoding" in headers["vary"].lower()
    assert int(headers["content-length"]) == len(body)
    text = gzip.decompress(body).decode()
    assert "kvcache_sidecar_target_up{" in text
    plain_headers, plain = head_and_body(exchange(sidecar.port, get("/metrics", "Accept-Encoding: identity\r\n")))
    assert "content-encoding" not in plain_headers and b"kvcache_sidecar_target_up{" in plain
    assert len(body) < len(plain) / 3
    openmetrics = httpx.get(
        sidecar.base + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
    )
    assert openmetrics.headers["content-encoding"] == "gzip"
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")  # httpx decoded it


def test_an_expect_100_continue_reload_is_answered(sidecar):
    with connect(sidecar.port) as s:
        s.sendall(b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 100 ")
        s.sendall(b"body")
        rest = s.recv(65536)
    assert b"HTTP/1.1 200 " in rest, rest[:300]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param("Upgrade: websocket\r\nConnection: Upgrade\r\n", id="upgrade-websocket"),
        pytest.param("Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n", id="upgrade-h2c"),
        pytest.param("Accept: \xff\xfe\x00garbage;;;q=x, */*;q=nan\r\n", id="accept-garbage"),
        pytest.param("Accept-Encoding: " + "gzip;q=0, " * 300 + "\r\n", id="accept-encoding-long"),
        pytest.param("Authorization: Basic !!!not-base64\r\n", id="authorization-garbage"),
    ],
)
def test_odd_headers_on_a_good_request_change_nothing(sidecar, extra):
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode("latin-1")
    answer = exchange(sidecar.port, request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert status(answer) in (200, 400), answer[:300]
    assert status(answer) == 200 or b"\x00" in request


def test_an_absolute_form_request_target_is_served(sidecar):
    answer = exchange(
        sidecar.port, b"GET http://sidecar:9437/healthz?x=1 HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n"
    )
    assert status(answer) == 200


def test_http_1_0_clients_are_served_and_closed(sidecar):
    answer = exchange(sidecar.port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status(answer) == 200 and answer.endswith(b"ok\n")


# ----------------------------------------------------------------------------- in this process: short deadlines, caps


@pytest.fixture
def endpoint_in_process(monkeypatch, caplog):
    """start(reload=None, web_yml=None) -> port of a ``start_http`` server in this process, stopped afterwards.

    Lowered for the cases: the request deadline (1 s) and whatever the case sets on ``sidecar.endpoint``
    before calling. After the case, no record at warning or above carries a traceback."""
    monkeypatch.setattr(endpoint, "REQUEST_TIMEOUT_S", 1.0)
    started = []

    def start(reload=None, web_yml: Path | None = None) -> int:
        port = free_port()
        config = load_config(
            None, env={}, flags={("web", "listen_address"): f"127.0.0.1:{port}"}, flag_targets=["http://127.0.0.1:9/"]
        )
        sidecar = Sidecar(config)
        web = serving(load_web_config(str(web_yml))) if web_yml else None
        started.append((start_http(sidecar, ready=lambda: True, reload=reload, web=web), sidecar))
        return port

    caplog.set_level("DEBUG", logger="kv_sidecar.http")
    start.started = started  # type: ignore[attr-defined]
    yield start
    for server, sidecar in started:
        start = time.monotonic()
        server.shutdown()
        server.server_close()
        assert time.monotonic() - start < 1.5  # whatever the case left open
        asyncio.run(sidecar.aclose())
    for record in caplog.records:
        assert record.exc_info is None or record.levelname == "DEBUG", record.getMessage()
        assert record.levelname != "ERROR", record.getMessage()


def drip(s: socket.socket, data: bytes, every_s: float) -> tuple[float, bytes]:
    """Send ``data`` a byte at a time until the server answers or closes; (seconds it took, the answer)."""
    start = time.monotonic()
    s.settimeout(every_s)
    for i in range(len(data)):
        try:
            s.send(data[i : i + 1])
            answer = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe: closed on us
            return time.monotonic() - start, b""
        return time.monotonic() - start, answer + read_all(s, timeout=2)
    raise AssertionError(f"still open after {time.monotonic() - start:.1f}s of dripping")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GET /metrics?" + b"a" * 4000 + b" HTTP/1.1\r\n", id="request-line"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: a\r\n" * 400, id="headers"),
    ],
)
def test_a_client_dripping_its_request_is_dropped_at_the_request_deadline(endpoint_in_process, data):
    port = endpoint_in_process()
    with connect(port) as s:
        took, answer = drip(s, data, every_s=0.05)  # a byte every 50 ms: a per-read timeout would never fire
    assert 0.9 < took < 3.0, took
    assert answer == b"" or status(answer) == 408
    assert status(exchange(port, get("/healthz"))) == 200


def test_a_silent_connection_and_a_stalled_body_are_closed_at_the_deadline(endpoint_in_process):
    port = endpoint_in_process(reload=lambda: (True, "reloaded"))
    with connect(port) as silent, connect(port) as stalled:
        stalled.sendall(b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
        start = time.monotonic()
        assert read_all(silent, timeout=5) == b""  # closed without a word
        assert status(read_all(stalled, timeout=5)) == 408
        assert time.monotonic() - start < 3.0


def test_at_the_connection_limit_the_longest_waiting_connection_makes_room(endpoint_in_process, monkeypatch, caplog):
    monkeypatch.setattr(endpoint, "MAX_CONNECTIONS", 20)
    monkeypatch.setattr(endpoint, "REQUEST_TIMEOUT_S", 30.0)  # nothing times out during the case
    port = endpoint_in_process()
    idle = [connect(port) for _ in range(20)]
    try:
        time.sleep(0.2)
        assert status(exchange(port, get("/healthz"))) == 200  # a probe always gets in ...
        for _ in range(5):
            idle.append(connect(port))  # ... and so does each new connection
            time.sleep(0.05)
        assert status(exchange(port, get("/healthz"))) == 200
        closed = []
        for s in idle[:8]:  # 20 open: probe 1 closes one, 5 new connections close 4 (one fits), probe 2 one more
            s.settimeout(0.5)
            try:
                closed.append(s.recv(1) == b"")
            except ConnectionResetError:
                closed.append(True)
            except TimeoutError:
                closed.append(False)
        assert closed == [True] * 6 + [False] * 2  # the six that waited longest made room, in order
        assert "at the limit of 20" in caplog.text
    finally:
        for s in idle:
            s.close()


def test_probes_never_wait_behind_slow_answers(endpoint_in_process, monkeypatch):
    monkeypatch.setattr(endpoint, "MAX_REQUESTS_IN_FLIGHT", 1)
    release = threading.Event()

    def slow_reload():
        release.wait(10)
        return True, "reloaded"

    port = endpoint_in_process(reload=slow_reload)
    reloading = threading.Thread(target=exchange, args=(port, b"POST /-/reload HTTP/1.0\r\n\r\n"))
    reloading.start()
    try:
        time.sleep(0.2)
        start = time.monotonic()
        assert status(exchange(port, get("/healthz"))) == 200  # answered on the loop, at once
        assert status(exchange(port, get("/readyz"))) == 200
        assert time.monotonic() - start < 2.0  # not after the reload (10 s), nor after a place (a 503 at 1 s)
        busy = exchange(port, get("/metrics"))  # waits for the one place, up to the deadline
        assert status(busy) == 503 and b"Retry-After: 1" in busy
    finally:
        release.set()
        reloading.join(10)


def test_a_client_that_does_not_read_its_answers_is_closed(endpoint_in_process, monkeypatch):
    monkeypatch.setattr(endpoint, "RESPONSE_TIMEOUT_S", 0.5)
    port = endpoint_in_process()
    server, _ = endpoint_in_process.started[-1]
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the accepted sockets inherit it
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200)  # about 2 MB of answers, pipelined
        time.sleep(1.5)  # never reads: the buffers fill, the answer being written times out
        assert status(exchange(port, get("/healthz"))) == 200
        received = read_all(s, timeout=3)
    assert received.count(b"HTTP/1.1 200 ") < 200  # closed before the answers were all taken


class BigPage:
    """A collector whose exposition is ``size`` bytes: an answer far bigger than the socket buffers."""

    def __init__(self, size: int):
        self.size = size

    def collect(self):
        family = GaugeMetricFamily("big_page", "padding", labels=["pad"])
        family.add_metric(["x" * self.size], 1.0)
        yield family


def test_a_big_answer_to_a_slow_reader_arrives_whole_before_the_close(endpoint_in_process):
    port = endpoint_in_process()
    server, sidecar = endpoint_in_process.started[-1]
    sidecar.registry.register(BigPage(300_000))
    # Small kernel buffers on both ends: most of the answer waits in the server's own buffer, and leaves it
    # a few kilobytes at a time, so a close that does not wait for the last byte would cut the answer.
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the accepted sockets inherit it
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(get("/metrics"))
        time.sleep(0.3)
        headers, body = head_and_body(read_all(s, timeout=20))
    assert len(body) == int(headers["content-length"]) > 300_000


@needs_openssl
def test_tls_garbage_and_clear_text_on_the_tls_port_cost_nothing(endpoint_in_process, tmp_path, monkeypatch):
    monkeypatch.setattr(webconfig, "HANDSHAKE_TIMEOUT_S", 1.0)
    cert, _ = self_signed(tmp_path, "server")
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    port = endpoint_in_process(web_yml=web)
    noise = [
        bytes.fromhex("1603010200010001fc0303") + os.urandom(300),  # a ClientHello header, then noise
        os.urandom(2000),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",  # clear text
        bytes.fromhex("16030100"),  # a record header, then nothing
    ]
    for data in noise:
        answer = exchange(port, data, timeout=5)
        assert b"kvcache_" not in answer and b"HTTP/1.1" not in answer
    half = connect(port)
    half.sendall(bytes.fromhex("1603010200"))
    reset(half)
    context = ssl.create_default_context(cafile=str(cert))
    with httpx.Client(verify=context) as client:
        assert client.get(f"https://127.0.0.1:{port}/metrics").status_code == 200


# ----------------------------------------------------------------------------- the log format


def test_every_stderr_line_is_json_with_log_format_json(tmp_path):
    daemon = Daemon(tmp_path, "--log.format", "json")
    try:
        exchange(daemon.port, os.urandom(100) + b"\n")
        exchange(daemon.port, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n")
        s = connect(daemon.port)
        s.sendall(b"GET /met")
        reset(s)
        assert status(exchange(daemon.port, get("/healthz"))) == 200
    finally:
        assert daemon.stop() == 0
    lines = daemon.log.read_text().splitlines()
    assert lines and all(json.loads(line)["level"] for line in lines)
    assert "Traceback" not in daemon.log.read_text()


def test_the_http_limit_rows_are_the_endpoints_constants():
    """docs/limits.md is made of sidecar/limits.py's rows: they must say what the endpoint really does."""
    rows = {limit.key: limit.default for limit in LIMITS if limit.key.startswith("http.")}
    assert rows == {
        "http.listen_backlog": endpoint.LISTEN_BACKLOG,
        "http.max_connections": endpoint.MAX_CONNECTIONS,
        "http.request_timeout": endpoint.REQUEST_TIMEOUT_S,
        "http.idle_timeout": endpoint.IDLE_TIMEOUT_S,
        "http.response_timeout": endpoint.RESPONSE_TIMEOUT_S,
        "http.tls_handshake_timeout": webconfig.HANDSHAKE_TIMEOUT_S,
        "http.request_line": endpoint.MAX_REQUEST_LINE_BYTES,
        "http.header_bytes": endpoint.MAX_HEADER_BYTES,
        "http.body_bytes": endpoint.MAX_BODY_BYTES,
        "http.requests_in_flight": endpoint.MAX_REQUESTS_IN_FLIGHT,
        "http.workers": endpoint.WORKERS,
        "http.bcrypt_cost": webconfig.MAX_BCRYPT_COST,
        "http.auth_checks_pending": webconfig.AUTH_CHECKS_PENDING,
        "http.auth_failures_per_client": webconfig.AUTH_FAILURES_PER_CLIENT,
    }
    assert endpoint.LISTEN_BACKLOG >= 128


def test_what_python_itself_would_print_on_stderr_is_a_log_line_too():
    """A thread's uncaught exception, a warning, an exception in a finaliser, the main program's crash."""
    program = """
import sys, threading, warnings
from sidecar.logs import setup_logging
setup_logging("info", "logfmt")
t = threading.Thread(target=lambda: 1 / 0, name="doomed"); t.start(); t.join()
warnings.warn("a warning")
class Bad:
    def __del__(self):
        raise RuntimeError("in a finaliser")
Bad()
raise ValueError("the end")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 4, done.stderr
    for line in lines:
        assert LOGFMT.match(line), line
    assert "ZeroDivisionError in thread doomed" in lines[0] and "a warning" in lines[1]
    assert "in a finaliser" in lines[2] and "ValueError: the end" in lines[3]
