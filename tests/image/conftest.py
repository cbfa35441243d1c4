"""The container image, built once per session from this checkout by scripts/build-image.sh (podman).

- podman, runc or mmdebstrap missing and ``CI=true``: the image tests FAIL (CI must build and run it).
- missing elsewhere: skipped with the reason and the fix, repeated in the terminal summary.

The build log is kept in ``.test-artifacts/image/build.log``; containers the tests start are removed
in teardown, also when a test fails. podman itself: podmantools.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from podmantools import ARTIFACTS, FIGURES, ROOT, SKIPS, Image, inspect, podman, skip_or_fail


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the measured figures; repeat a skip reason at the very end, where nobody can miss it."""
    if FIGURES:
        terminalreporter.section("container image figures")
        for key, value in FIGURES.items():
            terminalreporter.write_line(f"{key}: {value}")
    if SKIPS:
        terminalreporter.section("container image", sep="!", yellow=True, bold=True)
        terminalreporter.write_line(SKIPS[0], yellow=True, bold=True)
        terminalreporter.write_line("The image was NOT built or run.", yellow=True)


@pytest.fixture(scope="session")
def image() -> Image:
    """The image built from this checkout (a warm rebuild takes seconds), or skip/fail as above."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        skip_or_fail(f"{', '.join(missing)} not found (as root: bash scripts/install-container-tools.sh)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "build.log"
    started = time.monotonic()
    with open(log, "w") as stderr:
        result = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-image.sh")],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=1200,
        )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"scripts/build-image.sh exited with {result.returncode} (log {log}):\n{tail}", pytrace=False)
    report_ref, ref = result.stdout.split()[-2:]
    size = int(inspect("image", ref)["Size"])
    report_size = int(inspect("image", report_ref)["Size"])
    FIGURES["image"] = ref
    FIGURES["build (s, base and layers cached or not)"] = round(seconds, 1)
    FIGURES["size (MB)"] = round(size / 1e6)
    FIGURES["report image"] = report_ref
    FIGURES["report image size (MB)"] = round(report_size / 1e6)
    return Image(ref, seconds, size, report_ref, report_size)


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of the containers a test starts; each is removed (forcibly) when the test ends."""
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)
