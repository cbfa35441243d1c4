"""Suite-wide settings. Fixture paths live in tests/fixtures/__init__.py (`from fixtures import CPU_032`).

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`): each test file is one
group, so a file's module- and session-scoped fixtures (a Prometheus, a backfill) start once, on one
worker; the tests sharing a costly session fixture across files are one group (:data:`SHARED`), so that
fixture starts once in the whole run, not once per worker.
"""

from __future__ import annotations

import os

import pytest
from faultserver import FaultServer
from harness import Harness
from hypothesis import settings

# CI must not flake on a lucky draw: property tests replay the same examples there.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


#: Tests sharing one costly session fixture across files: (path prefix under tests/, group). The real vLLM
#: server (minutes to start, gigabytes of memory), the container images (built once) and the known week
#: (a week of series computed once into .test-artifacts/known-week/).
SHARED = (
    ("realvllm/", "realvllm"),
    ("image/", "image"),
    ("report/test_known_week", "known-week"),
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its own hook adds them to node ids)
def pytest_collection_modifyitems(config, items):
    """One ``xdist_group`` per test: its :data:`SHARED` group, else its file (harmless without xdist)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        group = next((name for prefix, name in SHARED if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))


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
