"""The history file under hostile or broken paths: a FIFO never blocks the daemon's start nor the report,
and a file another process holds exclusively is reported as locked (the report's documented exit 2).

Through the real CLI in a process of its own where the exit code matters (docs/report.md lists the
codes); in this process for the history module itself.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sidecar.history import HistoryError, HistoryStore

CLI = (sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())")
#: Far longer than any refusal takes; a FIFO that blocked would wait forever.
TIMEOUT_S = 60


def _opened(path: Path, **kw: object) -> BaseException | None:
    """What opening ``path`` raised, from a thread so that a hang fails the test instead of freezing it."""
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            HistoryStore.open(path, **kw).close()  # type: ignore[arg-type]
            result.append(None)
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert result, f"opening {path} blocked"
    return result[0]


@pytest.mark.parametrize("read_only", [False, True])
def test_a_fifo_as_the_history_or_its_wal_is_refused_without_blocking(tmp_path, read_only):
    fifo = tmp_path / "history.sqlite"
    os.mkfifo(fifo)
    error = _opened(fifo, read_only=read_only)
    assert isinstance(error, HistoryError) and "FIFO" in str(error) and "not a regular file" in str(error)
    real = tmp_path / "real.sqlite"
    HistoryStore.open(real).close()
    os.mkfifo(tmp_path / "real.sqlite-wal")  # SQLite would open it beside the file
    error = _opened(real, read_only=read_only)
    assert isinstance(error, HistoryError) and "real.sqlite-wal: is a FIFO" in str(error)


def test_report_on_a_fifo_exits_2_at_once(tmp_path):
    fifo = tmp_path / "history.sqlite"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [*CLI, "report", "--history", str(fifo), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert "FIFO" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_history_held_exclusively_by_another_process_is_reported_locked(tmp_path):
    path = tmp_path / "h.sqlite"
    with HistoryStore.open(path, now=time.time()) as store:
        store.record(time.time(), [("kvcache_usage_ratio", {"target": "a"}, 0.5, "gauge")])
    with open(path, "rb") as held:  # flock: a lock of the open file, so this process conflicts with itself
        fcntl.flock(held, fcntl.LOCK_EX)
        error = _opened(path, read_only=True)
        assert isinstance(error, HistoryError) and "locked by another process" in str(error)
    # a POSIX lock (what SQLite's exclusive locking mode takes) from another process
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'r+b'); fcntl.lockf(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = subprocess.run(
            [*CLI, "report", "--history", str(path), "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 2 and "locked by another process" in proc.stderr, proc.stderr
    finally:
        holder.communicate("", timeout=10)
    with HistoryStore.open(path, read_only=True) as store:  # released: read as usual
        assert store.names() == ["kvcache_usage_ratio"]
