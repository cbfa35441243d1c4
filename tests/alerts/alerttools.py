"""Helpers for the alerting tests: the Prometheus tools and the committed files.

(A module with its own name, not conftest.py: every test directory has a conftest.)

The tools come from Debian's ``prometheus`` and ``prometheus-alertmanager``
packages (``scripts/install-prometheus-tools.sh``, run by ``make test``), found
on PATH or unpacked in ``.tools/``.

- Tool missing and ``CI=true``: the test FAILS — CI must not go green without
  having run promtool/amtool/Prometheus/Alertmanager.
- Tool missing elsewhere: skipped with the reason and the fix, repeated in the
  terminal summary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
RUNBOOKS = REPO / "docs" / "runbooks"
TOOLS = REPO / ".tools"

_SKIPS: list[str] = []


def find_tool(*names: str) -> str | None:
    """First of ``names`` on PATH, in ``.tools/bin`` or in ``.tools/root/usr/bin``."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for d in (TOOLS / "bin", TOOLS / "root" / "usr" / "bin"):
            candidate = d / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def require_tool(*names: str) -> str:
    """The tool's path; otherwise fail in CI, skip loudly elsewhere."""
    path = find_tool(*names)
    if path:
        return path
    reason = (
        f"{' / '.join(names)} not found on PATH or in {TOOLS}/bin; "
        f"run `bash scripts/install-prometheus-tools.sh` (or `make test`)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    message = f"PROMETHEUS TOOL MISSING, TEST SKIPPED: {reason}"
    _SKIPS.append(message)
    pytest.skip(message)


def run_tool(*argv: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tool, capturing text output; bounded in time."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd)
