"""``kv-sidecar rules render``: the alert and recording rules from a configuration file.

The configuration is read by the sidecar's own loader (:func:`sidecar.config.load_config`), so the
``thresholds:`` and ``alerts:`` sections mean exactly what they mean to ``kv-sidecar run``; the flags
are the same spellings as ``run``'s (``--thresholds.watermark``) and win over the file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..config import ConfigError, load_config
from ..settings import setting
from .files import write_atomically
from .params import VARIANTS, RuleParams, Thresholds
from .rules import FORMATS, PROMETHEUSRULE_FILE_NAME, RULES_FILE_NAME, render

#: The override flags: (section, key, metavar, what it is); the defaults shown are the settings table's.
_OVERRIDES = (
    ("thresholds", "watermark", "FRACTION", ": the page (critical)"),
    ("thresholds", "warning", "FRACTION", ": the ticket"),
    ("thresholds", "target_usage", "FRACTION", ""),
    ("alerts", "sidecar_job", "JOB", ": the Prometheus job label of the sidecar"),
    ("alerts", "runbook_base_url", "URL", ""),
    ("alerts", "dashboard_base_url", "URL", ", the Grafana root URL"),
)


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
        help="sidecar configuration YAML; its thresholds: and alerts: sections are used (default: none)",
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
    # The same spellings as `kv-sidecar run` (--thresholds.watermark), so one flag means one thing.
    for section, key, metavar, what in _OVERRIDES:
        shown = setting(f"{section}.{key}").default_text()
        parser.add_argument(
            f"--{section}.{key.replace('_', '-')}",
            dest=key,
            default=None,
            metavar=metavar,
            type=float if section == "thresholds" else str,
            help=f"override {section}.{key}{what} (default: from the config, else {shown})",
        )
    parser.set_defaults(func=run)
    return parser


def _load(args: argparse.Namespace) -> tuple[Thresholds, RuleParams, list[str]]:
    """Thresholds and params from the config file (as the sidecar reads it) and the override flags."""
    flags = {(section, key): getattr(args, key) for section, key, _, _ in _OVERRIDES}
    try:
        cfg = load_config(args.config_file, flags=flags)
    except ConfigError as e:
        # Only the thresholds:/alerts: sections matter here, but a config the
        # sidecar would refuse is not one to render rules from either.
        return Thresholds(), RuleParams(), [f"{e.source}: {p}" for p in e.problems]
    return cfg.thresholds, cfg.alerts, []


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
