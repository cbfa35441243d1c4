"""Signals to a real ``kv-sidecar run``: SIGHUP reloads and never stops it; SIGTERM and SIGINT stop it
cleanly (exit 0, no traceback) whatever it is doing: a scrape hanging on a target that never answers,
hundreds of open connections, an answer being written, a second signal during the stop.

How fast it stops is measured by ``bench/hostile_http.py``; here only that it exits, and how.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostile.test_http import LOGFMT, Daemon, connect, exchange, get, raise_open_files, status

#: Generous: a stop that takes longer than this is a hang, whatever the benchmark says about speed.
EXIT_WITHIN_S = 10.0


class HungTarget:
    """A TCP server that accepts every connection and never answers: a scrape of it hangs until its timeout."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.accepted = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self._held.append(conn)
                self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for c in self._held:
            c.close()


@pytest.fixture
def hung() -> Iterator[HungTarget]:
    target = HungTarget()
    yield target
    target.close()


def scraping_hung(folder: Path, hung: HungTarget) -> Daemon:
    """A daemon whose scrape of ``hung`` is in flight, and would wait 9 s more for an answer."""
    config = folder / "sidecar.yaml"
    config.write_text(f"scrape: {{interval: 10s}}\ntargets: [{{url: '{hung.url}', timeout: 9s}}]\n")
    daemon = Daemon(folder, "--config.file", str(config), target=None, interval=None)
    assert hung.accepted.wait(10)
    time.sleep(0.2)
    return daemon


def stops_cleanly(daemon: Daemon, *signals: signal.Signals, gap_s: float = 0.0) -> None:
    """Send ``signals`` (``gap_s`` apart); the daemon exits 0, its stderr all logfmt, no traceback."""
    for i, sig in enumerate(signals):
        if i and gap_s:
            time.sleep(gap_s)
        with contextlib.suppress(ProcessLookupError):
            daemon.proc.send_signal(sig)
    try:
        code = daemon.proc.wait(timeout=EXIT_WITHIN_S)
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
    text = daemon.log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    for line in text.splitlines():
        assert LOGFMT.match(line), line[:300]
    assert 'msg="stopping"' in text


def test_ten_sighups_reload_and_never_stop_the_process(tmp_path):
    config = tmp_path / "sidecar.yaml"
    config.write_text("scrape:\n  interval: 1s\n")
    daemon = Daemon(tmp_path, "--config.file", str(config), interval=None)
    pid = daemon.proc.pid
    for _ in range(10):
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(0.1)
        assert daemon.proc.poll() is None
        assert status(exchange(daemon.port, get("/healthz"))) == 200
    deadline = time.monotonic() + 10
    while daemon.log.read_text().count("SIGHUP") < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon.log.read_text().count("SIGHUP") >= 10  # each one reloaded (or was merged into a reload)
    assert daemon.proc.pid == pid and daemon.proc.poll() is None
    stops_cleanly(daemon, signal.SIGTERM)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_a_scrape_hangs_on_a_silent_target(tmp_path, hung, sig):
    stops_cleanly(scraping_hung(tmp_path, hung), sig)


def test_sigterm_with_500_open_connections(tmp_path):
    raise_open_files(1200)
    daemon = Daemon(tmp_path)
    clients = [connect(daemon.port) for _ in range(500)]
    try:
        for c in clients[:250]:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request each
        assert status(exchange(daemon.port, get("/healthz"))) == 200
        stops_cleanly(daemon, signal.SIGTERM)
    finally:
        for c in clients:
            c.close()


def test_sigterm_while_answers_are_being_written_to_clients_that_do_not_read(tmp_path):
    daemon = Daemon(tmp_path)
    clients = []
    for _ in range(50):
        c = connect(daemon.port)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 20)  # pipelined, never read
        clients.append(c)
    try:
        time.sleep(0.3)
        stops_cleanly(daemon, signal.SIGTERM)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize(
    ("signals", "gap_s"),
    [
        pytest.param((signal.SIGTERM, signal.SIGTERM), 0.0, id="two-sigterms-at-once"),
        pytest.param((signal.SIGTERM, signal.SIGTERM, signal.SIGTERM), 0.02, id="sigterms-during-the-stop"),
        pytest.param((signal.SIGINT, signal.SIGINT), 0.02, id="two-sigints"),
        pytest.param((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), 0.01, id="term-int-hup"),
    ],
)
def test_a_second_signal_during_the_stop_changes_nothing(tmp_path, hung, signals, gap_s):
    stops_cleanly(scraping_hung(tmp_path, hung), *signals, gap_s=gap_s)


def test_sighups_during_a_hung_scrape(tmp_path, hung):
    daemon = scraping_hung(tmp_path, hung)
    for _ in range(3):
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(0.05)
    assert daemon.proc.poll() is None
    assert status(exchange(daemon.port, get("/healthz"))) == 200
    stops_cleanly(daemon, signal.SIGTERM)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_storm_of_signals_until_the_exit_still_exits_0(tmp_path, sig):
    """A signal every half millisecond from the first until the process is gone: one lands in every phase of
    the stop, the loop's close and the interpreter's exit included."""
    for run in range(3):
        folder = tmp_path / str(run)
        folder.mkdir()
        daemon = Daemon(folder)
        deadline = time.monotonic() + EXIT_WITHIN_S
        while daemon.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                daemon.proc.send_signal(sig)
            time.sleep(0.0005)
        if daemon.proc.poll() is None:
            daemon.proc.kill()
        daemon.proc.wait()
        text = daemon.log.read_text(errors="replace")
        assert daemon.proc.returncode == 0, (run, text[-2000:])
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
