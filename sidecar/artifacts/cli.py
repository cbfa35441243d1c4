"""``kv-sidecar rules render``: the alert and recording rules from a configuration file.

The file's ``thresholds:`` and ``alerts:`` sections are read by the sidecar's own rows and parsers
(:func:`sidecar.config.load_rule_params`), so they mean exactly what they mean to ``kv-sidecar run``;
the file is read alone (no ``KV_SIDECAR_*`` variable changes the rules) and its other sections are
not checked (a ``model.config`` path of the production machine need not exist here). The flags are
the rows with ``render_flag`` in :mod:`sidecar.settings`, spelled as ``run`` spells them
(``--thresholds.watermark``), and win over the file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..alert_params import RuleParams
from ..config import ConfigError, load_rule_params
from ..settings import ALERT_SETTINGS, SETTINGS, add_flag
from ..thresholds import Thresholds
from .files import write_atomically
from .params import VARIANTS
from .rules import FORMATS, PROMETHEUSRULE_FILE_NAME, RULES_FILE_NAME, render

#: The settings ``rules render`` has a flag for.
RENDER_FLAGS = tuple(row for row in SETTINGS + ALERT_SETTINGS if row.render_flag)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rules`` (with the ``render`` action) on the CLI's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rules",
        help="render the Prometheus alerting/recording rules",
        description="Render the alert and recording rules from the thresholds: and alerts: config sections "
        "(the same file `kv-sidecar run --config.file` reads). Flags win over the file.",
    )
    parser.add_argument("action", choices=["render"], help="what to do")
    parser.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        default=None,
        help="sidecar configuration YAML; its thresholds: and alerts: sections are used, and nothing else "
        "of the file or the environment (default: none)",
    )
    parser.add_argument(
        "--out",
        default="-",
        metavar="DIR|-",
        help=f"directory to write {RULES_FILE_NAME} (or {PROMETHEUSRULE_FILE_NAME}) into, "
        f"atomically; '-' prints to stdout (default: -)",
    )
    parser.add_argument(
        "--format",
        choices=list(FORMATS),
        default="rules",
        help="plain Prometheus rule file, or a Kubernetes PrometheusRule (default: rules)",
    )
    parser.add_argument(
        "--variant",
        choices=list(VARIANTS),
        default="default",
        help="'fast' shortens every for: to seconds and evaluates every 1s, for end-to-end tests (default: default)",
    )
    for row in RENDER_FLAGS:
        add_flag(parser, row, f"from --config.file, else {row.default_text()}")
    parser.set_defaults(func=run)
    return parser


def _load(args: argparse.Namespace) -> tuple[Thresholds, RuleParams, list[str]]:
    """Thresholds and params from the config file and the override flags; the problems, if any."""
    flags = {(row.section, row.key): getattr(args, row.dest) for row in RENDER_FLAGS}
    try:
        thresholds, params = load_rule_params(args.config_file, flags=flags)
    except ConfigError as e:
        return Thresholds(), RuleParams(), [f"{e.source}: {p}" for p in e.problems]
    return thresholds, params, []


def run(args: argparse.Namespace) -> int:
    """``kv-sidecar rules render``: 0 on success, 2 on a bad configuration or output path."""
    thresholds, params, problems = _load(args)
    if problems:
        for p in problems:
            print(f"kv-sidecar rules: {p}", file=sys.stderr)
        return 2
    text = render(thresholds, params, fmt=args.format, variant=args.variant)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        print(
            f"kv-sidecar rules: --out: {out_dir} is not a directory (give a directory, or - for stdout)",
            file=sys.stderr,
        )
        return 2
    path = out_dir / (RULES_FILE_NAME if args.format == "rules" else PROMETHEUSRULE_FILE_NAME)
    try:
        write_atomically(path, text)
    except OSError as e:
        print(f"kv-sidecar rules: --out: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0
