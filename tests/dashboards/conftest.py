"""Fixtures of the dashboard tests: Prometheus (see tests/alerts/alerttools.py for the skip/fail policy),
one real stack per vLLM metric generation (tests/dashboards/stack.py) and the artifact directory.

The stack is module-scoped and parametrized by generation, so pytest starts one stack per
generation and runs every test that uses it before stopping it and starting the next.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "alerts"))
from alerttools import require_tool  # noqa: E402
from stack import GENERATIONS, REPO, Stack, running_stack, wait_for_signals  # noqa: E402


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return require_tool("prometheus")


@pytest.fixture(scope="module", params=GENERATIONS)
def stack(
    request: pytest.FixtureRequest, prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The whole stack speaking one vLLM metric generation, once it shows everything the dashboards draw."""
    generation = request.param
    t0 = time.monotonic()
    with running_stack(tmp_path_factory.mktemp(f"stack-{generation}"), prometheus_bin, generation) as s:
        waited = wait_for_signals(s)
        print(f"\n{generation} stack ready in {time.monotonic() - t0:.0f} s ({waited:.0f} s waiting for its signals)")
        yield s


@pytest.fixture(scope="session")
def artifact_dir() -> Path:
    """``$KV_SIDECAR_TEST_ARTIFACTS``, else ``<repo>/.test-artifacts/dashboards`` (gitignored)."""
    env = os.environ.get("KV_SIDECAR_TEST_ARTIFACTS")
    path = Path(env) if env else REPO / ".test-artifacts" / "dashboards"
    path.mkdir(parents=True, exist_ok=True)
    return path
