"""The Dockerfile and its build context, read without building (these run without podman)."""

from __future__ import annotations

import re

from podmantools import ROOT

import sidecar

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_a_plain_build_labels_the_image_with_the_package_version():
    # `podman build .` / `docker build .` without --build-arg VERSION must still say the right version
    defaults = re.findall(r"^ARG VERSION=(\S+)$", DOCKERFILE, re.M)
    assert len(defaults) == 2  # the daemon's stage and the report's
    assert set(defaults) == {sidecar.__version__}, f"set ARG VERSION={sidecar.__version__} in the Dockerfile"


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else():
    allowed = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    assert (ROOT / ".dockerignore").read_text().splitlines().count("*") == 1  # an allow-list: the rest stays out
    copied = []
    for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE, re.M):
        *sources, _destination = line.split()
        copied += [source.rstrip("/") for source in sources]
    assert sorted(set(copied)) == sorted(allowed)
    assert all((ROOT / path).exists() for path in copied)


def test_the_final_stage_runs_no_commands():
    # no RUN after the last FROM: the final stage needs no shell, and build-time mounts (the CA bundle,
    # pip.conf) leave no mount points in it
    final = DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]
    assert not re.search(r"^RUN ", final, re.M)
    assert re.search(r"^USER 10001:10001$", final, re.M)
