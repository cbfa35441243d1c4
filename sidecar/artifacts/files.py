"""Writing generated files: stable YAML text, and atomic replacement.

"Stable" means the same input always gives the same bytes (key order kept as built, no
aliases, no line wrapping), so a generated file committed to git only changes when its
content does, and ``make generate`` followed by ``git diff`` shows exactly what moved.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (readable PromQL), no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(doc: Any) -> str:
    """``doc`` as block-style YAML: keys in insertion order, multi-line strings as ``|`` blocks."""
    return yaml.dump(
        doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1_000_000, allow_unicode=True
    )


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
