"""Worst time and peak memory of the sidecar on hostile input, per surface.

The hostile-input tests (``tests/hostile/``) assert what the sidecar does with each bad page, file,
connection or signal: the exit code, the reason counted, no traceback. How long it took and how much
memory it needed are measured here instead, where a slow machine gives a number rather than a flaky
test. Each surface has its own script, run in its own process so that peak RSS is that surface's:

- ``bench/hostile_page.py``: pages a target may return (overflowing values, huge label sets, 100,000
  label values, duplicates), through the daemon's scrape path;
- ``bench/hostile_files.py``: configuration and model files (``/dev/zero``, a FIFO, a YAML alias bomb, a
  50 MB YAML, a 200 MB ``config.json``, absurd shapes), through the real CLI;
- ``bench/hostile_http.py``: clients of the endpoint (bursts, idle connections, slow requests, garbage)
  and signals.

Each prints one JSON line per case, ``{"surface", "case", "seconds", "rss_mib"}``; this script prints
every case and, per surface, the worst time and the peak RSS with the case that caused them.

    .venv/bin/python bench/hostile.py [--surface page ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SURFACES = ("page", "files", "http")


def run_surface(surface: str) -> list[dict[str, object]]:
    """The cases one surface's script reports (its stderr passes through)."""
    script = HERE / f"hostile_{surface}.py"
    done = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script.name} exited {done.returncode}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise SystemExit(f"{script.name} reported no case")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--surface", action="append", choices=SURFACES, help="only these surfaces (repeatable)")
    args = ap.parse_args(argv)
    summary = []
    for surface in args.surface or SURFACES:
        rows = run_surface(surface)
        print(f"\n{surface}: {len(rows)} cases")
        for row in rows:
            print(f"  {row['case']:<48} {float(row['seconds']):8.3f} s {float(row['rss_mib']):8.1f} MiB")
        slowest = max(rows, key=lambda r: float(r["seconds"]))
        biggest = max(rows, key=lambda r: float(r["rss_mib"]))
        summary.append((surface, len(rows), slowest, biggest))
    print("\n| surface | cases | worst time | case | peak RSS | case |\n|---|---|---|---|---|---|")
    for surface, n, slowest, biggest in summary:
        print(
            f"| {surface} | {n} | {float(slowest['seconds']):.3f} s | {slowest['case']} | "
            f"{float(biggest['rss_mib']):.1f} MiB | {biggest['case']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
