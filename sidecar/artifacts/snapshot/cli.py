"""``kv-sidecar dashboards snapshot``: its flags, their checks, and one PNG per dashboard file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...units import parse_duration
from ..panels import PrometheusAPI, PrometheusError
from .dashboard import render_dashboard


class UsageError(Exception):
    """Bad input to the command (exit 2); the message is one line."""


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kv-sidecar dashboards snapshot``."""
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus to query (required), e.g. http://127.0.0.1:9090"
    )
    parser.add_argument(
        "--dashboards",
        metavar="DIR",
        default="dashboards",
        help="directory of dashboard JSON files to draw (default: dashboards)",
    )
    parser.add_argument(
        "--out", metavar="DIR", default="snapshots", help="where <uid>.png is written (default: snapshots)"
    )
    parser.add_argument(
        "--var",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a template variable's value, repeatable (twice for two values); unset variables are All",
    )
    parser.add_argument(
        "--from",
        dest="from_",
        metavar="DURATION",
        default=None,
        help="draw the last DURATION, e.g. 1h or now-6h (default: each dashboard's own time range)",
    )
    parser.add_argument(
        "--step", metavar="DURATION", default=None, help="query step (default: the range / 600, at least 1s)"
    )


def parse_vars(items: Sequence[str]) -> dict[str, Any]:
    """``["pod=a", "pod=b", "namespace=x"]`` -> ``{"pod": ["a", "b"], "namespace": "x"}``."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--var: expected NAME=VALUE, got {item!r}")
        name = name.strip()
        if name in out:
            out[name] = [*([out[name]] if isinstance(out[name], str) else out[name]), value]
        else:
            out[name] = value
    return out


def _duration_ago(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text.removeprefix("now-"))
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    if seconds <= 0:
        raise UsageError(f"{flag}: must be above zero, got {text!r}")
    return seconds


def load_dashboards(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` dashboard in ``directory`` (sorted by file name); UsageError when there is none."""
    if not directory.is_dir():
        raise UsageError(f"--dashboards: {directory} is not a directory")
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"--dashboards: {path}: not readable JSON: {e}") from None
        if not isinstance(doc, dict) or not doc.get("uid") or not isinstance(doc.get("panels"), list):
            raise UsageError(f"--dashboards: {path}: not a Grafana dashboard (needs uid and panels)")
        out.append(doc)
    if not out:
        raise UsageError(f"--dashboards: no *.json dashboard in {directory}")
    return out


def _own_range(dashboard: Mapping[str, Any]) -> float:
    """The length of the dashboard's saved relative time range (``now-7d``), else one hour."""
    try:
        return _duration_ago(str((dashboard.get("time") or {}).get("from", "now-1h")), "time.from")
    except UsageError:
        return 3600.0


def snapshot_command(args: argparse.Namespace) -> int:
    """``kv-sidecar dashboards snapshot``: 0 when every PNG is written, 2 on bad input, 1 when
    Prometheus cannot be reached."""
    try:
        if not args.prometheus_url:
            raise UsageError("--prometheus-url is required")
        values = parse_vars(args.var)
        ago = _duration_ago(args.from_, "--from") if args.from_ else None
        step = _duration_ago(args.step, "--step") if args.step else None
        dashboards = load_dashboards(Path(args.dashboards))
    except UsageError as e:
        print(f"kv-sidecar dashboards snapshot: {e}", file=sys.stderr)
        return 2
    with PrometheusAPI(args.prometheus_url) as api:
        try:
            api.query("vector(1)")
        except PrometheusError as e:
            print(f"kv-sidecar dashboards snapshot: Prometheus not usable: {e}", file=sys.stderr)
            return 1
        end = time.time()
        for dashboard in dashboards:
            out = Path(args.out) / f"{dashboard['uid']}.png"
            try:
                snap = render_dashboard(
                    dashboard, api, values, end - (ago or _own_range(dashboard)), end, out, step=step
                )
            except OSError as e:
                print(f"kv-sidecar dashboards snapshot: --out: cannot write {out}: {e.strerror or e}", file=sys.stderr)
                return 2
            print(f"wrote {snap.path} ({snap.summary()}) in {snap.seconds:.1f}s", file=sys.stderr)
    return 0
