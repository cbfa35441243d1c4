"""A raw TCP stand-in for a misbehaving HTTP server (tests and bench/hostile_report.py).

:class:`RawServer` accepts on 127.0.0.1, reads each request (one ``recv``), records it, and hands the
connection to ``answer(server, conn, request)``; :func:`drip` is the answer of a server that sends a
200 one byte at a time, the case that a per-read timeout never ends. ``close()`` stops every answer in
progress (they wait on ``server.stop``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

Answer = Callable[["RawServer", socket.socket, bytes], None]


class RawServer:
    def __init__(self, answer: Answer):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.answer = answer
        self.requests: list[bytes] = []
        self.stop = threading.Event()
        self.accepted = threading.Event()  # set at each connection: a request is in flight
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.set()
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            request = conn.recv(65536)
            self.requests.append(request)
            self.answer(self, conn, request)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def drip(every_s: float, length: int = 1000) -> Answer:
    """A 200 JSON answer of ``length`` body bytes, sent one byte every ``every_s`` seconds."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length

    def answer(server: RawServer, conn: socket.socket, _request: bytes) -> None:
        for byte in head + b" " * (length - 1):
            if server.stop.wait(every_s):
                return
            conn.sendall(bytes([byte]))

    return answer


def respond(status_line: bytes, body: bytes) -> Answer:
    """An answer sent at once: ``status_line`` (b"HTTP/1.1 400 Bad Request") and ``body``."""

    def answer(_server: RawServer, conn: socket.socket, _request: bytes) -> None:
        conn.sendall(status_line + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    return answer
