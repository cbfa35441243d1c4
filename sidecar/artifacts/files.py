"""Writing generated files: stable YAML text, written with the package's one atomic writer.

"Stable" means the same input always gives the same bytes (key order kept as built, no
aliases, no line wrapping), so a generated file committed to git only changes when its
content does, and ``make generate`` followed by ``git diff`` shows exactly what moved.
"""

from __future__ import annotations

from typing import Any

import yaml

# The one atomic writer, re-exported here for the generators that import it from this module
# (artifacts/cli.py, artifacts/dashboards_cli.py, artifacts/generate.py, demo.py).
from ..atomic_write import write_atomically

__all__ = ["dump_yaml", "write_atomically"]


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
