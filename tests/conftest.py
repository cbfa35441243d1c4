"""Suite-wide settings. Fixture paths live in tests/fixtures/__init__.py (`from fixtures import CPU_032`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faultserver import FaultServer
from harness import Harness
from hypothesis import settings

# CI must not flake on a lucky draw: property tests replay the same examples there.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def server():
    """A local /metrics server whose behaviour each test sets (tests/faultserver.py)."""
    s = FaultServer()
    yield s
    s.stop()


@pytest.fixture
def h(server):
    """An in-process sidecar scraping ``server``, on a wall clock the test steps (tests/harness.py)."""
    harness = Harness(server)
    yield harness
    harness.close()


REPO = Path(__file__).resolve().parents[1]
#: The modules that read the known week (tests/report/known_week.py, about 12 minutes of CPU to make).
KNOWN_WEEK_MODULES = frozenset({"test_known_week.py", "test_known_week_report.py"})
_known_week: subprocess.Popen[bytes] | None = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The known week's tests run last, so that the week made in the background has the whole suite's time."""
    items.sort(key=lambda item: item.path.name in KNOWN_WEEK_MODULES)  # stable: the order is kept otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start making the known week in the background, at the lowest CPU priority, when a test that reads
    it was collected. The suite runs one test at a time, so one of CI's two cores is mostly idle: the week
    is made there, and is ready when its tests come, last (``pytest_collection_modifyitems``). They wait
    for it (``cached_week`` holds a lock while it generates) or, if the background run died, make it
    themselves. ``KV_SIDECAR_KNOWN_WEEK_BACKGROUND=0`` turns this off; its output is in
    ``.test-artifacts/known-week/background.log``."""
    global _known_week
    if session.config.option.collectonly or os.environ.get("KV_SIDECAR_KNOWN_WEEK_BACKGROUND") == "0":
        return
    if not any(item.path.name in KNOWN_WEEK_MODULES for item in session.items):
        return
    log_dir = REPO / ".test-artifacts" / "known-week"
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "background.log").open("wb") as log:
        _known_week = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "report" / "known_week.py"), "--cache", str(os.getpid())],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its worker processes go with it in sessionfinish
        )
    os.setpriority(os.PRIO_PROCESS, _known_week.pid, 19)  # before it starts its workers, which inherit it


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a background known week still running (its tests were deselected, or the run was cut short)."""
    if _known_week is not None and _known_week.poll() is None:
        os.killpg(_known_week.pid, signal.SIGTERM)
        try:
            _known_week.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(_known_week.pid, signal.SIGKILL)
