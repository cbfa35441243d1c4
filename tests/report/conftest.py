"""Fixtures shared by the report's tests."""

from __future__ import annotations

import pytest
from test_prometheus_source import Stub


@pytest.fixture
def stub():
    """stub(answer) -> a Prometheus stand-in answering each request with ``answer(handler, form)``."""
    servers: list[Stub] = []

    def make(answer):
        servers.append(Stub(answer))
        return servers[-1]

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()
