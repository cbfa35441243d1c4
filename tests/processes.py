"""Child processes for the end-to-end tests: free ports, the ``kv-sidecar`` command, plain GETs and
a group of processes that are always stopped.

Used by the alerting end-to-end test (simulator, sidecar, Prometheus, Alertmanager), the dashboard
stack and the other tests that start real servers on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it; the race window is tiny)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def prometheus_argv(binary: str, config: Path, data: Path, port: int, *extra: str) -> list[str]:
    """Debian's ``prometheus`` on 127.0.0.1:``port`` with ``config`` and its TSDB in ``data``."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra,
    ]


def kv_sidecar() -> list[str]:
    """The ``kv-sidecar`` command of the interpreter running the tests."""
    script = Path(sys.executable).with_name("kv-sidecar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sidecar.cli"]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status of a GET, 0 when nothing answers."""
    return http_get(url, timeout)[0]


class Processes:
    """Child processes in their own process groups, each logging to a file; ``stop()`` ends them all."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logdir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.logdir,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}\n{self.logs(name)}")

    def logs(self, *names: str, tail: int = 40) -> str:
        out = []
        for name in names or self.procs:
            path = self.logdir / f"{name}.log"
            lines = path.read_text(errors="replace").splitlines()[-tail:] if path.exists() else []
            out.append(f"--- {name} ({path}) ---\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self, *names: str) -> None:
        """SIGTERM to the process groups of ``names`` (no names: all), SIGKILL to those alive after 5 s."""
        procs = [self.procs.pop(name) for name in (names or list(self.procs))]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # one process stuck even after SIGKILL must not keep the others from being waited on
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
