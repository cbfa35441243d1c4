"""The weekly report from a real Prometheus holding a week of 64 pods scraped every 15 s: wall time and
peak RSS of ``kv-sidecar report``, and what the Prometheus server used answering it.

The data are the daemon's own: the known week of the report tests (``tests/report/known_week.py``:
five pods of two models, one scrape a minute through the sidecar's code, generated once and cached
under ``.test-artifacts/known-week/``) is copied 13 times into 64 pods (pod, target and instance
renamed; the namespace varied over 4 values, so 8 models of 8 pods), and each one-minute sample is
repeated at 0, 15, 30 and 45 s, as a 15 s scrape interval would store it. That is written as
OpenMetrics, backfilled with ``promtool tsdb create-blocks-from openmetrics`` (blocks of up to a
week: the default 2 h blocks make promtool read the file once per block), the recording rules of
the generated rules file are backfilled over it with ``create-blocks-from rules``, and a real
Prometheus serves the result (``tests/report/backfill.py``, as in the known-week test).

Then ``kv-sidecar report --prometheus-url`` runs in a child process over the week, writing Markdown,
HTML and JSON; its own rusage is read with ``os.wait4``, so promtool's and Prometheus' memory are not
counted in it. CPU time is shown beside the wall time (the report's user + system seconds, and what
Prometheus spent answering it, from ``/proc/<pid>/stat``): on a shared machine the wall time moves with
the other load, the CPU seconds much less.

Targets: the report within 30 s and 250 MB of peak RSS.

    .venv/bin/python bench/report_prometheus.py [--pods 64] [--interval 15] [--week DIR] [--extra FLAGS...]

The backfilled TSDB is kept in ``.test-artifacts/report-bench/`` (about 1 GB for 64 pods): later runs
only start Prometheus on it; delete the folder to rebuild it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "report")]
from backfill import backfilled_prometheus  # noqa: E402
from backfill import start as start_prometheus  # noqa: E402
from known_week import PODS, Known, cached_week, known  # noqa: E402
from processes import Processes, free_port  # noqa: E402

NAMESPACES = 4  # copies spread over this many namespaces: more models, each with fewer pods
TARGET_S, TARGET_MB = 30.0, 250.0


def _series(lines: Iterator[str]) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """(series text, [(value, timestamp)]) of an OpenMetrics file written series by series."""
    current, points = None, []
    for line in lines:
        if line.startswith("#"):
            continue
        text, value, ts = line.rsplit(" ", 2)
        if text != current:
            if current is not None:
                yield current, points
            current, points = text, []
        points.append((value, int(ts)))
    if current is not None:
        yield current, points


def _copy_labels(text: str, pod: str, instance: str, namespace: str, k: int) -> str:
    """The series of copy ``k`` of ``pod``: its pod, target, instance and namespace renamed."""
    host, port = instance.rsplit(":", 1)
    return (
        text.replace(f'pod="{pod}"', f'pod="{pod}-{k}"')
        .replace(f'target="{pod}"', f'target="{pod}-{k}"')
        .replace(f'instance="{instance}"', f'instance="{host}.{k}:{port}"')
        .replace(f'namespace="{namespace}"', f'namespace="{namespace}-{k % NAMESPACES}"')
    )


def write_week(source: Path, out: Path, start: int, end: int, pods: int, interval: int) -> int:
    """The 64-pod week in ``out`` (families contiguous, each series in time order); lines written."""
    plans = {p.name: p for p in PODS}
    copies = -(-pods // len(PODS))
    kept = {(p.name, k) for i, (p, k) in enumerate((p, k) for k in range(copies) for p in PODS) if i < pods}
    offsets = range(0, 60, interval)
    n = 0
    with source.open(encoding="utf-8") as src, out.open("w", encoding="utf-8") as f:
        family = None
        for text, points in _series(src):
            name = text.split("{", 1)[0]
            base = name.removesuffix("_total")
            if base != family:
                family = base
                kind = "counter" if name.endswith("_total") else "gauge"
                f.write(f"# TYPE {base} {kind}\n")
            pod = next((p for p in plans if f'pod="{p}"' in text), None)
            if pod is None:
                continue
            plan = plans[pod]
            week = [(v, t) for v, t in points if start <= t < end]
            for k in range(copies):
                if (pod, k) not in kept:
                    continue
                copy = _copy_labels(text, pod, plan.instance, plan.model.namespace, k)
                f.writelines(f"{copy} {v} {t + o}\n" for v, t in week for o in offsets)
                n += len(week) * len(offsets)
        f.write("# EOF\n")
    return n


def run_report(url: str, start: int, end: int, out: Path, extra: list[str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of one ``kv-sidecar report`` child, and
    what it printed."""
    cmd = [str(Path(sys.executable).with_name("kv-sidecar")), "report", "--prometheus-url", url]
    cmd += ["--from", str(start), "--to", str(end), "--out", str(out), *extra]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "stdout.txt").open("w+") as stdout, (out / "stderr.txt").open("w+") as stderr:
        t0 = time.perf_counter()
        # to files, not pipes: reading pipes means communicate(), which reaps the child before wait4 can
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        if code != 0:
            raise SystemExit(f"report failed ({code}): {stderr.read()}")
        return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, stdout.read()


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (the peak resident set) of process ``pid``, from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    hwm = next((line for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return int(hwm.split()[1]) / 1024 if hwm else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=64)
    ap.add_argument("--interval", type=int, default=15, help="seconds between samples (divides 60)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more flags for kv-sidecar report")
    ap.add_argument(
        "--week",
        type=Path,
        help="a generated known-week folder (.test-artifacts/known-week/<hash>/) to use as it is, "
        "even if the sidecar's code has changed since (default: generate it when missing)",
    )
    args = ap.parse_args()
    if 60 % args.interval:
        raise SystemExit("--interval must divide 60")
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        raise SystemExit("needs promtool and prometheus on PATH (make tools installs them)")
    t0 = time.perf_counter()
    if args.week:
        week = replace(known(), files={"om": args.week / "week.om"})
    else:
        week = cached_week()
    print(f"known week ready in {time.perf_counter() - t0:.0f} s ({week.files['om']})")
    cache = ROOT / ".test-artifacts" / "report-bench" / f"pods{args.pods}-every{args.interval}s"
    if not (cache / "complete").exists():
        build(week, cache, args.pods, args.interval)
    out = Path(tempfile.mkdtemp(prefix="kv-report-bench-"))
    procs = Processes(cache)
    try:
        url = start_prometheus(procs, cache, cache / "data", free_port())
        pid = procs.procs["prometheus"].pid
        server_cpu0 = cpu_s(pid)
        took, cpu, peak, stdout = run_report(url, week.start, week.end, out, args.extra)
        server_cpu1 = cpu_s(pid)
        server = peak_rss_mb(pid)
    finally:
        procs.stop()
    print(stdout.rstrip())
    shown = f", Prometheus peak RSS {server:.0f} MB" if server is not None else ""
    if server_cpu0 is not None and server_cpu1 is not None:
        shown += f" and {server_cpu1 - server_cpu0:.1f} CPU-s answering"
    print(
        f"report over 7 days of {args.pods} pods at {args.interval}s: {took:.1f} s (target {TARGET_S:g}; "
        f"{cpu:.1f} CPU-s), peak RSS {peak:.0f} MB (target {TARGET_MB:g}){shown}; files in {out}"
    )


def build(week: Known, cache: Path, pods: int, interval: int) -> None:
    """The backfilled TSDB in ``cache/data`` (kept for the next runs: building it takes minutes)."""
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    om = cache / "week.om"
    t0 = time.perf_counter()
    lines = write_week(week.files["om"], om, week.start, week.end, pods, interval)
    size_gb = om.stat().st_size / 1e9
    print(f"wrote {lines:,} samples of {pods} pods ({size_gb:.1f} GB) in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    with backfilled_prometheus(cache, om, week.start - 3600, week.end):
        print(f"backfilled in {time.perf_counter() - t0:.0f} s")
    om.unlink()  # the blocks hold it now
    (cache / "complete").touch()


if __name__ == "__main__":
    main()
