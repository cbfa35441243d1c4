"""podman for the image tests, run as scripts/build-image.sh runs it (``--runtime runc --cgroup-manager
cgroupfs``, explicit ulimits): what works on machines where podman's defaults are refused."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".test-artifacts" / "image"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
#: How every container of these tests runs: what a "restricted" Kubernetes pod with a read-only root
#: allows (and no tmpfs that podman adds by itself: /tmp is writable only where a test mounts one).
RESTRICTED = [
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop=ALL",
    "--security-opt",
    "no-new-privileges",
    "--network",
    "host",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
]
#: The Dockerfile's USER.
UID = 10001

#: Skip reasons and measured figures, printed in the terminal summary (conftest.py).
SKIPS: list[str] = []
FIGURES: dict[str, object] = {}


@dataclass(frozen=True)
class Image:
    ref: str
    build_seconds: float
    size_bytes: int
    report_ref: str = ""  # the weekly report's image (the Dockerfile's report target)
    report_size_bytes: int = 0


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One podman command; on failure (with ``check``) the test fails with its output."""
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(
            f"podman {' '.join(args)} exited with {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}",
            pytrace=False,
        )
    return result


def inspect(kind: str, name: str) -> dict[str, Any]:
    (data,) = json.loads(podman(kind, "inspect", name).stdout)
    result: dict[str, Any] = data
    return result


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}: CI must build and run the container image.", pytrace=False)
    message = f"CONTAINER IMAGE TESTS SKIPPED: {reason}"
    SKIPS.append(message)
    pytest.skip(message)
