"""``kv-sidecar report``'s own checks: every bad argument is one line and exit 2, before anything is read."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from processes import kv_sidecar


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--from", "nan", "--to", "nan"], "--from: 'nan' is not a time"),
        (["--from", "2026-11-23", "--to", "1e20"], "--to: '1e20' is not a time"),
        (["--from", "2026-11-23"], "--from and --to: give both"),
        (["--from", "2026-11-30", "--to", "2026-11-23"], "the period is empty"),
        (["--from", "yesterday", "--to", "2026-11-23"], "--from: 'yesterday' is not a time"),
        (["--selector", "namespace=prod"], "--selector:"),
        (["--selector", '{a="\udcff"}'], "not UTF-8"),
        (["--header", "X-Tenant: é"], "--header"),
        (["--format", "pdf"], "--format"),
        (["--report-url", "reports/"], "--report-url"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, says):
    proc = subprocess.run(
        [*kv_sidecar(), "report", "--history", str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_history_that_is_a_directory_or_missing_exits_2(tmp_path):
    for path in (tmp_path, tmp_path / "missing.sqlite"):
        proc = subprocess.run(
            [*kv_sidecar(), "report", "--history", str(path), "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "--history:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_since_covers_the_minute_in_progress():
    from sidecar.report.cli import Options, period_of
    from sidecar.report.data import Period

    t0 = 1_800_000_000.0  # a whole minute
    assert period_of(Options(since_s=3600), now=t0 + 30) == Period(t0 + 60 - 3600, t0 + 60)
    assert period_of(Options(since_s=3600), now=t0) == Period(t0 - 3600, t0)
    assert period_of(Options(start=t0 + 1, end=t0 + 3599), now=0) == Period(t0 + 60, t0 + 3540)


def test_the_summary_links_to_the_published_folder_not_to_local_paths():
    from sidecar.report.cli import summary_text
    from sidecar.report.data import Period

    class Week:
        period, source, summary = Period(1_795_392_000, 1_795_996_800), "history", ["llama needs more memory."]

    paths = [Path("/srv/out/kvcache-2026-11-23.html"), Path("/srv/out/kvcache 2026-11-23.md"), Path("/srv/out/a.json")]
    local = summary_text(Week, paths)
    assert "Report: /srv/out/kvcache-2026-11-23.html" in local and "a.json" not in local
    published = summary_text(Week, paths, "https://wiki.example.com/kv/")
    assert "/srv" not in published
    assert published.splitlines()[-2:] == [
        "Report: https://wiki.example.com/kv/kvcache-2026-11-23.html",
        "Report: https://wiki.example.com/kv/kvcache%202026-11-23.md",
    ]
    assert published.splitlines()[1] == "1. llama needs more memory."


def test_a_dry_run_checks_the_flags_and_prints_the_next_runs(tmp_path):
    proc = subprocess.run(
        [
            *kv_sidecar(),
            "reporter",
            "--history",
            str(tmp_path / "h.sqlite"),
            "--dry-run",
            "--timezone",
            "Asia/Tokyo",
            "--out",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    runs = [datetime.fromisoformat(line.strip()) for line in proc.stdout.splitlines()[1:]]
    assert len(runs) == 5 and runs == sorted(runs) and runs[0] > datetime.now(UTC)
    assert all((t.weekday(), t.hour, t.minute, t.utcoffset()) == (0, 6, 0, timedelta(hours=9)) for t in runs)
    assert not (tmp_path / "reports").exists()
    bad = subprocess.run(
        [*kv_sidecar(), "reporter", "--history", "h", "--dry-run", "--schedule", "0 6 * *"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("kv-sidecar reporter: --schedule:"), bad.stderr
    secret = subprocess.run(
        [*kv_sidecar(), "reporter", "--prometheus-url", "https://ops:s3cret@prom.example.com", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert secret.returncode == 0 and "s3cret" not in secret.stdout + secret.stderr
    assert "from https://prom.example.com into" in secret.stdout, secret.stdout
