"""``--keep-weeks``: the reports in ``--out`` older than the last N weeks are removed after a report is written.

What is a report file: only the names :func:`sidecar.report.render.base_name` gives,
``kvcache-report-<start>_<end>.md|.html|.json``, and the PNGs in ``kvcache-report-<start>_<end>-images/``
(the folder is removed once empty). Anything else in ``--out`` (a README, another tool's files, a
report's temporary ``.``-file, the pending-delivery marker) is never touched; a folder holding
something else than PNGs keeps it.

Which are old: a report whose period ended at least ``N − ½`` weeks before the end of the newest report
in the folder. With one report a week (the CronJob), that keeps exactly N, however many minutes the
runs' times drift; a missed week is not made up by keeping an older one.

Each removal is one ``unlink``, atomic: a crash leaves some old files, never a half file, and the next
run removes the rest.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

WEEK_S = 7 * 86400.0
_NAME = re.compile(
    r"^kvcache-report-(?P<start>\d{4}-\d{2}-\d{2}(?:T\d{4})?)_(?P<end>\d{4}-\d{2}-\d{2}(?:T\d{4})?)"
    r"(?P<kind>\.md|\.html|\.json|-images)$"
)


def _end(name: str) -> float | None:
    """The period's end a report file's name says (Unix seconds), None for any other name."""
    match = _NAME.match(name)
    if match is None:
        return None
    end = match["end"]
    fmt = "%Y-%m-%dT%H%M" if "T" in end else "%Y-%m-%d"
    return datetime.strptime(end, fmt).replace(tzinfo=UTC).timestamp()


def prune(out_dir: Path, keep_weeks: int) -> list[Path]:
    """Remove the reports of ``out_dir`` older than ``keep_weeks`` weeks (module docstring); the paths removed."""
    if keep_weeks < 1:
        raise ValueError("keep_weeks: at least 1")
    reports = [(end, p) for p in Path(out_dir).iterdir() if (end := _end(p.name)) is not None]
    if not reports:
        return []
    newest = max(end for end, _ in reports)
    cutoff = newest - (keep_weeks - 0.5) * WEEK_S
    removed: list[Path] = []
    for end, path in sorted(reports):
        if end > cutoff:
            continue
        if path.is_dir() and not path.is_symlink():
            for png in sorted(path.iterdir()):
                if png.suffix == ".png" and png.is_file() and not png.is_symlink():
                    png.unlink()
                    removed.append(png)
            if not any(path.iterdir()):
                path.rmdir()
                removed.append(path)
        elif path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed
