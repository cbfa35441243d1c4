"""Fixtures of the alerting tests: the Prometheus tools (see alerttools.py for the skip/fail policy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alerttools import _SKIPS, require_tool


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat the skip reasons at the very end, where nobody can miss them."""
    if _SKIPS:
        terminalreporter.section("prometheus tools", sep="!", yellow=True, bold=True)
        for message in sorted(set(_SKIPS)):
            terminalreporter.write_line(message, yellow=True, bold=True)
        terminalreporter.write_line("The promtool/amtool/end-to-end alerting checks did NOT all run.", yellow=True)


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def amtool() -> str:
    return require_tool("amtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return require_tool("prometheus")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    # Debian names the binary prometheus-alertmanager, upstream alertmanager
    return require_tool("prometheus-alertmanager", "alertmanager")
