"""Suite-wide settings. Fixture paths live in tests/fixtures/__init__.py (`from fixtures import CPU_032`)."""

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
