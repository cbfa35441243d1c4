"""Where the served model's ``config.json`` is: a file, a model directory, or a Hugging Face hub cache.

``model.config`` names one of three things:

- a ``config.json`` file, or a model directory holding one: used as is; a folder of model directories:
  the one named like the served model (``/models/llama-3.1-8b`` for ``--served-model-name llama-3.1-8b``);
- a Hugging Face hub cache, the folder ``vllm serve org/name`` downloads into: ``$HF_HOME`` (holding
  ``hub/``) or the ``hub/`` folder itself (``$HF_HUB_CACHE``). The model is the one vLLM serves, by the
  ``model_name`` label of its series (vLLM's ``--served-model-name``, which defaults to the ``org/name``
  it was started with); when the cache holds one model only, that one (a ``--served-model-name`` alias).

The cache's layout is Hugging Face's (https://huggingface.co/docs/huggingface_hub/guides/manage-cache,
"Understand caching"): ``models--org--name/refs/main`` holds the commit the ``main`` branch resolved to,
``snapshots/<commit>/config.json`` is a link into ``blobs/``, and a file being downloaded is
``blobs/<etag>.incomplete`` until it is complete and linked. :func:`locate` reads it the way
``huggingface_hub.try_to_load_from_cache`` does (``huggingface_hub/file_download.py``): refs, then the
snapshot's link; ``tests/test_model_discovery.py`` checks both agree on caches ``hf_hub_download`` wrote.
The library itself is not a dependency of the daemon: 26 MB installed (its ``hf-xet`` native module, a
second HTTP client) for a lookup of two paths.

While any ``.incomplete`` blob of the repository exists the model is *downloading*: nothing of it is read
(the weights' index may still be missing, and a half-written file is never parsed). When ``refs/main``
moves (vLLM restarted on a new revision) or vLLM serves another model, :func:`locate` answers the new
snapshot. I/O edge: a few ``stat``/``readlink`` calls, no file content.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: ``kvcache_model_config_loaded``'s reasons (docs/metrics.md). ``loaded`` is the capacity layer's.
LOADED = "loaded"
WAITING = "waiting"  # the path does not exist yet, or vLLM has not said which model it serves
NOT_FOUND = "not_found"  # a hub cache without the served model
DOWNLOADING = "download_in_progress"  # the model's files are still being downloaded
INVALID = "invalid"  # the config.json is there but cannot be used (the log names the problem)
REASONS = (LOADED, WAITING, NOT_FOUND, DOWNLOADING, INVALID)

#: The revision vLLM downloads when started without ``--revision``.
REVISION = "main"
_REPO_PREFIX = "models--"


@dataclass(frozen=True)
class Located:
    """Where the config.json is (``path``), or why there is none yet (``reason``, ``detail`` for the log)."""

    path: str | None
    reason: str
    detail: str = ""


def hub_cache(path: str) -> Path | None:
    """The hub cache ``path`` names (``$HF_HOME`` holding ``hub/``, or ``hub/`` itself), else None."""
    p = Path(path)
    if (p / "config.json").exists() or p.is_file():
        return None
    for candidate in (p / "hub", p):
        if candidate.is_dir() and (candidate.name == "hub" or _repos(candidate)):
            return candidate
    return None


def is_hub_cache(path: str) -> bool:
    return hub_cache(path) is not None


def repo_folder(repo_id: str) -> str:
    """``org/name`` -> ``models--org--name`` (``huggingface_hub``'s ``repo_folder_name``)."""
    return _REPO_PREFIX + repo_id.replace("/", "--")


def _repos(hub: Path) -> list[Path]:
    try:
        return sorted(p for p in hub.iterdir() if p.name.startswith(_REPO_PREFIX) and p.is_dir())
    except OSError:
        return []


def locate(path: str, model_name: str | None) -> Located:
    """The config.json ``model.config`` means for the served ``model_name`` (None: not known yet)."""
    hub = hub_cache(path)
    if hub is None:
        p = Path(path)
        target = p / "config.json" if p.is_dir() else p
        if not target.exists() and model_name and p.is_dir():
            target = p / Path(model_name).name / "config.json"  # a volume of model folders: the served one's
        if target.exists():
            return Located(str(target), LOADED)
        return Located(None, WAITING, f"{path}: no such file yet")
    if not model_name:
        return Located(None, WAITING, f"{hub}: a hub cache; waiting for vLLM to say which model it serves")
    repo = hub / repo_folder(model_name)
    if not repo.is_dir():
        repos = _repos(hub)
        if len(repos) != 1:
            return Located(
                None,
                NOT_FOUND,
                f"{hub}: no {repo.name} for the served model {model_name!r} ({len(repos)} models in the cache; "
                "set model.config to the model's directory when --served-model-name is an alias)",
            )
        repo = repos[0]
    return _snapshot(repo)


def _snapshot(repo: Path) -> Located:
    """``repo``'s config.json at :data:`REVISION`, as ``try_to_load_from_cache`` finds it."""
    if any(b.name.endswith(".incomplete") for b in _files(repo / "blobs")):
        return Located(None, DOWNLOADING, f"{repo}: download in progress")
    try:
        commit = (repo / "refs" / REVISION).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        commit = REVISION  # a revision given as a commit hash has no ref
    config = repo / "snapshots" / commit / "config.json"
    if config.exists():  # follows the link: a link to a blob not there yet does not exist
        return Located(str(config), LOADED)
    if (repo / ".no_exist" / commit / "config.json").exists():
        return Located(None, INVALID, f"{repo}: the hub says this revision ({commit}) has no config.json")
    return Located(None, DOWNLOADING, f"{repo}: no config.json in snapshot {commit} yet")


def _files(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder)]
    except OSError:
        return []
