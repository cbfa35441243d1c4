"""``kv-sidecar report``'s own checks: every bad argument is one line and exit 2, before anything is read."""

from __future__ import annotations

import subprocess

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
