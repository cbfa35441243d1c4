"""``kv-sidecar dashboards``: render, push and snapshot the Grafana dashboards.

- ``render`` writes the dashboards' JSON (``dashboards/<uid>.json``, what ``make generate`` commits
  with the defaults), or their Kubernetes ConfigMaps, from the same ``thresholds:``/``alerts:``
  sections ``kv-sidecar rules render`` reads (:func:`sidecar.config.load_rule_params`), so the lines
  the dashboards draw are the thresholds that page, and its ``forecast:`` section
  (:func:`sidecar.config.load_forecast_params`), so the workload advice sizes as the sidecars do.
  ``--namespace-label``/``--pod-label`` name the labels Prometheus' discovery sets when they are not
  kube-prometheus' ``namespace``/``pod``.
- ``push`` upserts them through Grafana's HTTP API (:mod:`sidecar.artifacts.grafana`).
- ``snapshot`` draws their panels from a Prometheus to PNG files (:mod:`sidecar.artifacts.snapshot`).

The builder needs the ``dashboards`` extra (grafana-foundation-sdk); it is imported only when
``render`` runs, so ``kv-sidecar run`` and ``--help`` work without it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ConfigError, load_forecast_params, load_rule_params
from . import grafana, snapshot
from .files import write_atomically
from .provisioning import CONFIGMAPS_FILE

FORMATS = ("json", "configmap")
#: File ``render --format configmap --out DIR`` writes.
CONFIGMAPS_FILE_NAME = Path(CONFIGMAPS_FILE).name

#: How to get the module each action needs (the builder, the Grafana client, the plotting library).
EXTRA_HINT = "pip install 'kv-cache-sidecar[dashboards]'"

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _label_name(value: str) -> str:
    """argparse type: a Prometheus label name."""
    if not _LABEL_NAME.match(value):
        raise argparse.ArgumentTypeError(f"not a Prometheus label name: {value!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``dashboards`` with its actions ``render``, ``push`` and ``snapshot``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "dashboards",
        help="render, push or snapshot the Grafana dashboards",
        description="The KV-cache Grafana dashboards: render them as JSON or ConfigMaps, push them to Grafana, "
        "or draw their panels from a Prometheus.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_render(actions)
    push = actions.add_parser(
        "push",
        help="create or update the dashboards in Grafana through its HTTP API",
        description="Ensure the folder, then upsert each dashboard (overwrite, folder uid always given); "
        "the token is read from a file or GRAFANA_TOKEN, never a flag.",
    )
    grafana.add_push_arguments(push)
    push.set_defaults(func=_needs_extra("grafana_client", grafana.push_command))
    shot = actions.add_parser(
        "snapshot",
        help="draw each dashboard's panels from a Prometheus to a PNG",
        description="Run every panel's queries against Prometheus and draw them in their grid positions, "
        "one picture per dashboard.",
    )
    snapshot.add_snapshot_arguments(shot)
    shot.set_defaults(func=_needs_extra("matplotlib", snapshot.snapshot_command))
    return parser


def _needs_extra(module: str, command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, or exit 2 with the install line when ``module`` of the ``dashboards`` extra is missing."""

    def run(args: argparse.Namespace) -> int:
        try:
            importlib.import_module(module)
        except ImportError:
            print(
                f"kv-sidecar dashboards {args.action}: {module} is not installed; it comes with the "
                f"dashboards extra: {EXTRA_HINT}",
                file=sys.stderr,
            )
            return 2
        return command(args)

    return run


def _add_render(actions: Any) -> None:
    render = actions.add_parser(
        "render",
        help="write the dashboards' JSON or their Kubernetes ConfigMaps",
        description="Build the dashboards from the thresholds:, alerts: and forecast: sections of the "
        "configuration (the file `kv-sidecar rules render` reads) and write them.",
    )
    render.add_argument(
        "--out",
        default="-",
        metavar="DIR|-",
        help=f"directory to write <uid>.json (or {CONFIGMAPS_FILE_NAME}) into, atomically; '-' prints to stdout: "
        "one JSON object uid -> dashboard, or the ConfigMaps as a YAML stream (default: -)",
    )
    render.add_argument(
        "--format",
        choices=list(FORMATS),
        default="json",
        help="Grafana dashboard JSON, or one Kubernetes ConfigMap per dashboard for the Grafana Helm chart's "
        "sidecar (default: json)",
    )
    render.add_argument(
        "--namespace-label",
        type=_label_name,
        default="namespace",
        metavar="L",
        help="label holding the Kubernetes namespace on the scraped series (default: namespace); the capacity "
        "planning dashboard reads the recording rules, which keep grouping by `namespace`",
    )
    render.add_argument(
        "--pod-label",
        type=_label_name,
        default="pod",
        metavar="L",
        help="label holding the pod name on the scraped series (default: pod)",
    )
    render.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        default=None,
        help="sidecar configuration YAML; its thresholds:, alerts: and forecast: sections are used (default: none)",
    )
    render.set_defaults(func=_needs_extra("grafana_foundation_sdk", render_command))


def _fail(message: str) -> int:
    print(f"kv-sidecar dashboards render: {message}", file=sys.stderr)
    return 2


def _texts(args: argparse.Namespace) -> dict[str, str]:
    """File name -> text, for the chosen format. Raises ConfigError or ValueError."""
    from .dashboards import DashboardParams, build_dashboards, render_dashboard_json  # needs the extra
    from .provisioning import configmaps_yaml

    thresholds, rules = load_rule_params(args.config_file)
    params = DashboardParams.from_rules(
        thresholds,
        rules,
        namespace_label=args.namespace_label,
        pod_label=args.pod_label,
        forecast=load_forecast_params(args.config_file),
    )
    dashboards = build_dashboards(params)
    if args.format == "json":
        return {f"{uid}.json": render_dashboard_json(d) for uid, d in dashboards.items()}
    texts = {uid: render_dashboard_json(d) for uid, d in dashboards.items()}
    return {CONFIGMAPS_FILE_NAME: configmaps_yaml(texts, command="kv-sidecar dashboards render --format configmap")}


def _stdout(texts: dict[str, str], fmt: str) -> str:
    if fmt == "configmap":
        return next(iter(texts.values()))
    by_uid = {name.removesuffix(".json"): json.loads(text) for name, text in texts.items()}
    return json.dumps(by_uid, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def render_command(args: argparse.Namespace) -> int:
    """``kv-sidecar dashboards render``: 0 on success, 2 on a bad configuration or output path."""
    try:
        texts = _texts(args)
    except ConfigError as e:
        for problem in e.problems:
            _fail(f"{e.source}: {problem}")
        return 2
    except ValueError as e:  # a ConfigMap over kubectl apply's limit
        return _fail(str(e))
    if args.out == "-":
        sys.stdout.write(_stdout(texts, args.format))
        return 0
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        return _fail(f"--out: {out_dir} is not a directory (give a directory, or - for stdout)")
    for name, text in texts.items():
        path = out_dir / name
        try:
            write_atomically(path, text)
        except OSError as e:
            return _fail(f"--out: cannot write {path}: {e.strerror or e}")
        print(f"wrote {path}", file=sys.stderr)
    return 0
