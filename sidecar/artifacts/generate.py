"""``make generate``: rewrite every file of the repository that is generated from the code.

Each :class:`Generated` entry is a whole file, or a block of one between
``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->`` markers (the README's generated tables).
``tests/test_artifacts.py`` fails, naming ``make generate``, when a committed file differs from
what its generator gives.

    python -m sidecar.artifacts.generate            # write what changed
    python -m sidecar.artifacts.generate --check    # exit 1 listing what is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

from ..alert_params import RuleParams
from ..thresholds import Thresholds
from .deploy import generated as deploy_files
from .docs import configuration_page, example_config, limits_table, metrics_page, oncall_table, run_flags
from .files import write_atomically
from .params import DASHBOARD_UIDS
from .provisioning import CONFIGMAPS_FILE, DATASOURCE_FILE, PROVIDER_FILE, dashboard_provider_yaml, datasource_yaml
from .rules import render

FIX = "make generate"


@dataclass(frozen=True)
class Generated:
    """One generated file (or one marked block of a file) and the function that makes it."""

    path: str  # relative to the repository root
    make: Callable[[], str]
    source: str  # what it is generated from
    block: str | None = None  # the marker name when only a block of the file is generated

    @property
    def name(self) -> str:
        return self.path + (f"#{self.block}" if self.block else "")

    def updated(self, current: str) -> str:
        """The file's text with this artifact regenerated (``current``: the file as it is now)."""
        if self.block is None:
            return self.make()
        name = re.escape(self.block)
        pattern = re.compile(rf"(<!-- {name}:begin[^>]*-->\n)(.*?)(<!-- {name}:end -->)", re.S)
        if not pattern.search(current):
            raise ValueError(f"{self.path} lost its <!-- {self.block}:begin --> / <!-- {self.block}:end --> markers")
        return pattern.sub(lambda m: m.group(1) + self.make() + m.group(3), current, count=1)


@cache
def _dashboard_texts() -> dict[str, str]:
    """uid -> the committed dashboard JSON (default thresholds and labels).

    Deferred import: the dashboard builder needs the ``dashboards`` extra (grafana-foundation-sdk).
    """
    from .dashboards import build_dashboards, render_dashboard_json

    return {uid: render_dashboard_json(d) for uid, d in build_dashboards().items()}


def _dashboard_text(uid: str) -> str:
    return _dashboard_texts()[uid]


def _configmaps() -> str:
    from .provisioning import configmaps_yaml

    return configmaps_yaml(_dashboard_texts())


_DASHBOARDS_SOURCE = "sidecar/artifacts/dashboards/ with the default thresholds and labels"

#: Every generated file the repository commits.
GENERATED: tuple[Generated, ...] = (
    Generated(
        "alerts/kvcache.rules.yaml",
        lambda: render(Thresholds(), RuleParams()),
        "sidecar/artifacts/rules.py with the default thresholds and alerts",
    ),
    Generated("docs/metrics.md", metrics_page, "sidecar/metrics.py"),
    Generated("docs/configuration.md", configuration_page, "sidecar/settings.py"),
    Generated("deploy/examples/sidecar.yaml", example_config, "sidecar/settings.py"),
    Generated("README.md", oncall_table, "sidecar/metrics.py (ONCALL)", block="oncall-metrics"),
    Generated("README.md", run_flags, "sidecar/settings.py", block="run-flags"),
    Generated("docs/limits.md", limits_table, "sidecar/limits.py", block="limits"),
    *(Generated(f"dashboards/{uid}.json", partial(_dashboard_text, uid), _DASHBOARDS_SOURCE) for uid in DASHBOARD_UIDS),
    Generated(PROVIDER_FILE, dashboard_provider_yaml, "sidecar/artifacts/provisioning.py"),
    Generated(DATASOURCE_FILE, datasource_yaml, "sidecar/artifacts/provisioning.py"),
    Generated(CONFIGMAPS_FILE, _configmaps, _DASHBOARDS_SOURCE),
    *(Generated(path, make, source) for path, make, source in deploy_files()),
)


def plan(root: Path) -> tuple[dict[Path, str], list[Generated]]:
    """What regenerating under ``root`` changes: the new text of each file that differs, and the
    artifacts that made it differ. Artifacts apply in order, so two blocks of one file compose."""
    before: dict[Path, str] = {}
    after: dict[Path, str] = {}
    changed: list[Generated] = []
    for artifact in GENERATED:
        path = root / artifact.path
        if path not in after:
            before[path] = after[path] = path.read_text(encoding="utf-8") if path.exists() else ""
        text = artifact.updated(after[path])
        if text != after[path]:
            after[path] = text
            changed.append(artifact)
    return {path: text for path, text in after.items() if text != before[path]}, changed


def stale(root: Path) -> list[Generated]:
    """The artifacts whose committed text under ``root`` differs from what their generator gives."""
    return plan(root)[1]


def generate(root: Path) -> list[Path]:
    """Rewrite every out-of-date file under ``root``; the paths written."""
    texts, _ = plan(root)
    for path, text in texts.items():
        write_atomically(path, text)
    return list(texts)


def main(argv: list[str] | None = None) -> int:
    """``python -m sidecar.artifacts.generate [--check] [--root DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.artifacts.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: .)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    try:
        if args.check:
            out_of_date = stale(args.root)
            for artifact in out_of_date:
                print(f"{artifact.name} is out of date (from {artifact.source}): run `{FIX}`", file=sys.stderr)
            return 1 if out_of_date else 0
        for path in generate(args.root):
            print(f"wrote {path}", file=sys.stderr)
    except (OSError, ValueError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
