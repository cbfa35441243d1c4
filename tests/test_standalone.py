"""The repository stands alone: no file points at material a clone does not have.

A clone holds everything its tests, docs and docstrings refer to. These tests fail when a text file of
the project (tracked, or new and not ignored) names:

* a folder outside the repository: the research-notes folder that once lay beside the clone (its
  relative path, or its ``reference`` and ``fixtures`` subfolders), a path of the machine the project was
  built on, or the environment variable that once pointed at the folder (``FORBIDDEN_STRINGS``);
* the private research notes by name (``kv-capacity.md``, ``ops-conventions.md``, ``containers-here.md``;
  ``docs/vllm-metrics.md`` is the project's own page and is allowed) or a "reference …" citation of them;
* a section sign ``§``, which is how those notes and the issue tracker were cited ("§A2", "issue 5 §1").
  The one use allowed is a standard's section, ``RFC <number> §<section>``;
* an issue of the project's tracker, ``issue N`` / ``issues N–M`` / ``Issue N's`` / ``issue #N``, which a
  reader of a clone cannot open. Upstream issues stay citable: an ``issue`` preceded by the upstream
  project's name (``vLLM issue #23192``, ``production-stack issue #617``, ``NVIDIA/TensorRT-LLM issue #3376``),
  or written as
  ``owner/repo#N`` (``pytorch/pytorch#175666``), which the pattern does not match at all;
* a numbered seed article (``seed 000``): cite the article by its title (docs/capacity.md, "Worked
  examples").

Say what a fact rests on instead: a vLLM file and function, a vLLM PR or issue number, a doc page, or a
page of ``docs/``.

Data files under ``tests/fixtures/`` (captures, configs, golden outputs) are checked only by name: their
bodies are other people's bytes. Their READMEs and ``__init__.py`` are checked like any other file.
This file builds its forbidden strings from pieces so that it does not match itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import fixtures
from fixtures import REPO

THIS = Path(__file__).resolve()

_SHARED = "shared"
#: Plain substrings no file may contain.
FORBIDDEN_STRINGS: tuple[str, ...] = (
    "../" + _SHARED,
    _SHARED + "/reference",
    _SHARED + "/fixtures",
    "/work" + "/",
    "KV_SIDECAR_" + "SHARED",
    "kv-" + "capacity.md",
    "ops-" + "conventions.md",
    "containers-" + "here.md",
)

_SECTION = "\u00a7"
SECTION_SIGN = re.compile(_SECTION)
#: What may stand just before a section sign: a standard, "RFC 6750 §2.1".
RFC_BEFORE = re.compile(r"\bRFC \d+ $")
#: "reference vllm-metrics.md", "reference kv-…": how the notes were cited without a section sign.
REFERENCE_CITATION = re.compile(r"\breference\s+(?:vllm-metrics|kv-|ops-)", re.IGNORECASE)
#: "issue 5", "Issue 4's", "issues 2–6", "issue #12"; the word before decides whether it is upstream.
ISSUE = re.compile(r"\b(?P<word>issues?)\s+#?\d+", re.IGNORECASE)
#: Projects whose issues may be cited as "<project> issue #N".
UPSTREAM = frozenset(
    {
        "vllm",
        "production-stack",
        "pytorch",
        "sglang",
        "tgi",
        "llm-d",
        "aibrix",
        "dynamo",
        "datadog",
        "prometheus",
        "alertmanager",
        "grafana",
        "client_python",
        "transformers",
        "httpx",
        "apscheduler",
        "kubernetes",
        "gie",
        "inference-perf",
        "tensorrt-llm",
        "text-generation-inference",
        "llama.cpp",
        "ik_llama.cpp",
        "kthena",
        "hilbertraum",
        "mooncake",
    }
)
SEED = re.compile(r"\bseeds?\s+0\d\d\b", re.IGNORECASE)

#: Fixture data: bodies not checked (their names are).
FIXTURE_DATA_SUFFIXES = frozenset({".txt", ".json", ".prom"})


def project_files() -> list[Path]:
    """Tracked files plus new files git does not ignore (a user's clone is a git checkout)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    names = {n for n in out.decode().split("\0") if n}
    return [REPO / n for n in sorted(names) if (REPO / n).is_file()]


def _is_fixture_data(path: Path) -> bool:
    rel = path.relative_to(REPO).as_posix()
    return rel.startswith("tests/fixtures/") and path.suffix in FIXTURE_DATA_SUFFIXES


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary: nothing a reader follows


def problems_in(text: str) -> list[str]:
    """Every forbidden reference in ``text``, as ``line N: <match>``."""
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        for s in FORBIDDEN_STRINGS:
            if s in line:
                found.append(f"line {number}: {s!r}")
        for m in SECTION_SIGN.finditer(line):
            if RFC_BEFORE.search(line[: m.start()]):
                continue
            found.append(f"line {number}: {line[max(0, m.start() - 20) : m.end() + 5].strip()!r}")
        for m in REFERENCE_CITATION.finditer(line):
            found.append(f"line {number}: {m.group(0)!r}")
        for m in SEED.finditer(line):
            found.append(f"line {number}: {m.group(0)!r}")
        for m in ISSUE.finditer(line):
            before = line[: m.start()].rstrip().split()
            project = before[-1].strip("(`'\"[").lower() if before else ""
            if project.split("/")[-1].removesuffix("'s") in UPSTREAM:  # "NVIDIA/TensorRT-LLM issue #3376"
                continue
            found.append(f"line {number}: {m.group(0)!r}")
    return found


def test_no_file_points_outside_the_repository_or_at_the_old_notes():
    report = []
    for path in project_files():
        rel = path.relative_to(REPO).as_posix()
        report += [f"{rel} (its name) {problem}" for problem in problems_in(rel)]
        if path.resolve() == THIS or _is_fixture_data(path):
            continue
        text = _text(path)
        if text is None:
            continue
        for problem in problems_in(text):
            report.append(f"{path.relative_to(REPO)} {problem}")
    assert not report, (
        "references a clone cannot follow (cite the vLLM source, a PR/issue number with its project, "
        "or a page of docs/ instead; see this test's docstring):\n" + "\n".join(report)
    )


def test_the_patterns_catch_what_they_are_for():
    bad = [
        "see ../" + _SHARED + "/reference/x.md",
        "issue 5 " + _SECTION + "1",
        "Issue 4's different shape",
        "(issues 2–6)",
        "the issue #12 fix",
        "kv-" + "capacity.md A2",
        "reference vllm-metrics.md",
        "reference " + _SECTION + "7",
        "seed 000's table",
        "KV_SIDECAR_" + "SHARED=/x",
    ]
    good = [
        "vLLM issue #23192",
        "vllm issue #28924",
        "(production-stack issue #617)",
        "pytorch/pytorch#175666",
        "RFC 6750 " + _SECTION + "2.1",
        "PR #42206",
        "docs/vllm-metrics.md",
        "a shared prefix",
        "--seed 1",
        "seeds 1-5",
        "tissue 5",
    ]
    for line in bad:
        assert problems_in(line), line
    for line in good:
        assert not problems_in(line), line


def test_fixture_paths_are_inside_the_repository():
    """Every path ``tests/fixtures/__init__.py`` hands the tests is a file or folder of this clone."""
    assert (REPO / "pyproject.toml").is_file() and REPO == THIS.parents[1]
    paths = {name: value for name, value in vars(fixtures).items() if isinstance(value, Path)}
    assert {"REPO", "METRICS", "CPU_032", "MODEL_CONFIGS"} <= set(paths)
    for name, path in paths.items():
        resolved = path.resolve()
        assert resolved == REPO or resolved.is_relative_to(REPO), f"{name} = {path} is outside {REPO}"
        assert resolved.exists(), f"{name} = {path} does not exist"


def test_every_fixture_folder_says_where_its_files_come_from():
    root = Path(fixtures.__file__).resolve().parent
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"]]:
        data = [p for p in folder.iterdir() if p.suffix in FIXTURE_DATA_SUFFIXES]
        if data:
            assert (folder / "README.md").is_file(), f"{folder.relative_to(REPO)} has data but no README.md"
