"""``kv-sidecar dashboards push`` against answers Grafana would never give: a drip, a huge body, a redirect
to another origin. Each ends in one line and exit 1, within bounds, and nothing goes to the other origin.

The servers are raw sockets in this process (what a hostile proxy in front of Grafana would do); the
command is the real one (``sidecar.cli.main``) with the committed dashboards. Wall time against the
drip is measured by bench/hostile_report.py; here only that the command ends.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.cli import main

from rawserver import RawServer, drip  # isort: skip

pytest.importorskip("grafana_client")

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = str(REPO / "dashboards")
TOKEN = "glsa_hostile_push_test_token"
PREFIX = "kv-sidecar dashboards push: "


@pytest.fixture
def servers():
    made: list[RawServer] = []

    def make(answer) -> RawServer:
        made.append(RawServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def run(capsys, monkeypatch, url: str, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    capsys.readouterr()
    code = main(["dashboards", "push", "--grafana-url", url, "--dashboards", DASHBOARDS, *args])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return code, out, err


def test_a_dripping_answer_is_cut_at_the_timeout(servers, capsys, monkeypatch):
    s = servers(drip(0.05, 10_000))
    code, out, err = run(capsys, monkeypatch, s.url, "--timeout", "1")
    assert code == 1 and out == ""
    assert err.strip() == f"{PREFIX}GET /api/folders/kvcache: Grafana at {s.url} did not answer within 1s (--timeout)"


def test_a_huge_answer_is_refused_while_read(servers, capsys, monkeypatch):
    def huge(server: RawServer, conn: socket.socket, _: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
        for _ in range(64):  # 64 MiB, no length announced
            conn.sendall(chunk)

    s = servers(huge)
    code, out, err = run(capsys, monkeypatch, s.url)
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert "more than the 32 MiB read" in err


def test_a_redirect_to_another_origin_is_not_followed(servers, capsys, monkeypatch):
    elsewhere = servers(lambda server, conn, _: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))

    def redirect(server: RawServer, conn: socket.socket, request: bytes) -> None:
        path = request.split(b" ")[1].decode()
        conn.sendall(
            f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere.url}{path}\r\nContent-Length: 0\r\n\r\n".encode()
        )

    s = servers(redirect)
    code, out, err = run(capsys, monkeypatch, s.url)
    assert code == 1 and "created" not in out and len(err.splitlines()) == 1
    assert "redirecting to another origin" in err and "--follow-redirects" in err
    assert elsewhere.requests == []  # nothing was sent there
