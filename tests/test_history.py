"""The embedded history (sidecar/history.py) on real SQLite files: aggregation, bounds, crashes, bad files."""

from __future__ import annotations

import math
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from fixtures import REPO

from sidecar.history import APPLICATION_ID, SCHEMA_VERSION, HistoryError, HistoryStore, file_size

T0 = 1_700_000_040  # a minute start
LABELS = {"target": "http://a:8000/metrics", "model_name": "m"}
WEEK = 7 * 86400


def _only(store, name, match=None):
    found = store.series(name, match)
    assert len(found) == 1, found
    return found[0][0]


def test_a_gauge_minute_holds_min_max_mean_last(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, now=T0) as store:
        for offset, value in [(0, 0.5), (15, 0.25), (30, 0.75), (45, 0.5)]:
            store.record(T0 + offset, [("usage", LABELS, value, "gauge")])
        store.record(T0 + 60, [("usage", LABELS, 0.125, "gauge")])  # a later minute writes the first
        store.flush()
        sid = _only(store, "usage")
        first, second = store.points(sid, T0, T0 + 120)
    assert (first.minute, first.min, first.max, first.mean, first.count, first.last) == (T0, 0.25, 0.75, 0.5, 4, 0.5)
    assert first.increase is None
    assert (second.minute, second.mean, second.count, second.last) == (T0 + 60, 0.125, 1, 0.125)


def test_a_minute_is_written_when_a_later_one_starts(tmp_path):
    path = tmp_path / "h.db"
    store = HistoryStore.open(path, now=T0)
    store.record(T0, [("usage", LABELS, 1.0, "gauge")])
    with HistoryStore.open(path, now=T0, read_only=True) as reader:
        assert reader.names() == []  # still buffered
    store.record(T0 + 61, [("usage", LABELS, 2.0, "gauge")])
    with HistoryStore.open(path, now=T0, read_only=True) as reader:
        sid = _only(reader, "usage")
        assert [p.mean for p in reader.points(sid, 0, math.inf)] == [1.0]
    store.close()  # flushes the last minute


def test_counter_increases_across_minutes_and_resets(tmp_path):
    path = tmp_path / "h.db"
    values = [
        (T0 + 0, 100.0),  # the first sample: nothing to rise from
        (T0 + 20, 110.0),
        (T0 + 40, 130.0),
        (T0 + 60, 135.0),  # next minute: +5 from the previous minute's last
        (T0 + 80, 3.0),  # reset mid-minute: the increase is the new value
        (T0 + 100, 10.0),
        (T0 + 125, 2.0),  # reset across minutes: the first sample of the minute is below the last
        (T0 + 150, 4.0),
    ]
    with HistoryStore.open(path, now=T0) as store:
        for ts, value in values:
            store.record(ts, [("preemptions", LABELS, value, "counter")])
        store.flush()
        points = store.points(_only(store, "preemptions"), T0, T0 + 180)
    assert [p.increase for p in points] == [30.0, 5.0 + 3.0 + 7.0, 2.0 + 2.0]
    assert [p.last for p in points] == [130.0, 10.0, 4.0]
    assert [(p.min, p.max) for p in points] == [(100.0, 130.0), (3.0, 135.0), (2.0, 4.0)]
    assert all(p.mean is None for p in points)


def test_counter_increase_continues_across_reopen(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("tokens", LABELS, 50.0, "counter")])
        store.record(T0 + 30, [("tokens", LABELS, 80.0, "counter")])
    with HistoryStore.open(path, now=T0 + 120) as store:
        store.record(T0 + 120, [("tokens", LABELS, 100.0, "counter")])  # +20 from the stored last
        store.record(T0 + 180, [("tokens", LABELS, 5.0, "counter")])  # a restart while we were away
        store.flush()
        points = store.points(_only(store, "tokens"), T0, T0 + 240)
    assert [(p.minute, p.increase) for p in points] == [(T0, 30.0), (T0 + 120, 20.0), (T0 + 180, 5.0)]


def test_a_flush_mid_minute_merges_with_the_rest_of_the_minute(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("usage", LABELS, 4.0, "gauge"), ("req", LABELS, 1.0, "counter")])
        store.flush()
        store.record(T0 + 30, [("usage", LABELS, 2.0, "gauge"), ("req", LABELS, 6.0, "counter")])
        store.flush()
        (gauge,) = store.points(_only(store, "usage"), T0, T0 + 60)
        (counter,) = store.points(_only(store, "req"), T0, T0 + 60)
    assert (gauge.min, gauge.max, gauge.mean, gauge.count, gauge.last) == (2.0, 4.0, 3.0, 2, 2.0)
    assert (counter.increase, counter.count, counter.last) == (5.0, 2, 6.0)


def test_nan_is_skipped_and_gauge_infinities_are_kept(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("eta", LABELS, math.nan, "gauge"), ("req", LABELS, 1.0, "counter")])
        store.record(T0 + 10, [("eta", LABELS, math.inf, "gauge"), ("req", LABELS, math.nan, "counter")])
        store.record(T0 + 20, [("eta", LABELS, 30.0, "gauge"), ("req", LABELS, math.inf, "counter")])
        store.record(T0 + 30, [("req", LABELS, 3.0, "counter")])
        store.flush()
        (eta,) = store.points(_only(store, "eta"), T0, T0 + 60)
        (req,) = store.points(_only(store, "req"), T0, T0 + 60)
    assert (eta.count, eta.min, eta.max, eta.last, eta.mean) == (2, 30.0, math.inf, 30.0, math.inf)
    assert (req.count, req.increase) == (2, 2.0)


def test_kind_is_checked(tmp_path):
    with HistoryStore.open(tmp_path / "h.db", now=T0) as store:
        with pytest.raises(ValueError, match="histogram"):
            store.record(T0, [("x", LABELS, 1.0, "histogram")])
        store.record(T0, [("x", LABELS, 1.0, "gauge")])
        with pytest.raises(ValueError, match="recorded as a gauge"):
            store.record(T0, [("x", LABELS, 1.0, "counter")])


def test_series_ids_are_stable_across_reopen_and_reads_are_ordered(tmp_path):
    path = tmp_path / "h.db"
    pods = [{"model_name": "m", "pod": p} for p in ("c", "a", "b")]
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("usage", labels, 1.0, "gauge") for labels in pods])
        store.record(T0, [("free", pods[0], 1.0, "gauge")])
        store.flush()
        before = store.series("usage")
    assert [labels["pod"] for _, labels in before] == ["a", "b", "c"]
    with HistoryStore.open(path, now=T0 + 60) as store:
        store.record(T0 + 60, [("usage", labels, 2.0, "gauge") for labels in reversed(pods)])
        store.flush()
        assert store.series("usage") == before
        assert store.series("usage", {"pod": "b"}) == [before[1]]
        assert store.series("usage", {"pod": "z"}) == []
        assert store.names() == ["free", "usage"]
        assert [p.mean for p in store.points(before[2][0], 0, math.inf)] == [1.0, 2.0]


def test_the_file_is_ours_in_wal_mode(tmp_path):
    path = tmp_path / "h.db"
    HistoryStore.open(path, now=T0).close()
    conn = sqlite3.connect(path)
    try:
        pragmas = [conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("application_id", "user_version")]
        assert pragmas == [APPLICATION_ID, SCHEMA_VERSION]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    finally:
        conn.close()


def test_retention_drops_old_minutes(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, retention_s=600, now=T0) as store:
        for m in range(30):
            store.record(T0 + 60 * m, [("usage", LABELS, float(m), "gauge")])
        store.flush()
        store.prune(T0 + 60 * 30)
        kept = store.points(_only(store, "usage"), 0, math.inf)
    assert [p.minute for p in kept] == [T0 + 60 * m for m in range(20, 30)]


def test_a_series_without_points_left_is_forgotten(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, retention_s=600, now=T0) as store:
        store.record(T0, [("old", LABELS, 1.0, "gauge")])
        store.record(T0 + 3600, [("new", LABELS, 1.0, "gauge")])
        store.flush()
        store.prune(T0 + 3600)
        assert store.names() == ["new"]


def test_the_size_cap_holds_and_keeps_the_newest_minutes(tmp_path):
    path = tmp_path / "h.db"
    cap = 2**20
    minutes = 4000
    series = [{"target": f"http://pod-{i}:8000/metrics", "model_name": "m"} for i in range(20)]
    sizes = []
    with HistoryStore.open(path, max_bytes=cap, retention_s=10 * WEEK, now=T0) as store:
        for m in range(minutes):
            store.record(T0 + 60 * m, [("usage", labels, m + i / 100, "gauge") for i, labels in enumerate(series)])
            if m % 100 == 99:
                store.flush()
                sizes.append(file_size(path))
            if m % 1000 == 999:
                store.prune(T0 + 60 * m)
                sizes.append(file_size(path))
        store.flush()
        kept = {tuple(sorted(labels.items())): store.points(sid, 0, math.inf) for sid, labels in store.series("usage")}
    assert max(sizes) <= cap, sizes
    assert len(kept) == 20
    newest = T0 + 60 * (minutes - 1)
    for points in kept.values():
        stamps = [p.minute for p in points]
        assert stamps[-1] == newest
        assert stamps == list(range(stamps[0], newest + 60, 60))  # contiguous up to the newest
        assert 0.5 * cap / 60 < len(stamps) * 20 < minutes * 20  # some were dropped, most of the cap is used
    assert file_size(path) <= cap


CHILD = """
import sys
from sidecar.history import HistoryStore
store = HistoryStore.open(sys.argv[1], now={t0})
m = 0
while True:
    ts = {t0} + 60 * m
    store.record(ts, [("usage", {{"pod": str(p)}}, float(m), "gauge") for p in range(5)])
    store.record(ts + 1, [("req", {{"pod": "0"}}, float(m * 3), "counter")])
    store.flush()
    print(m, flush=True)
    m += 1
"""


def test_a_kill_at_any_moment_keeps_every_flushed_minute(tmp_path):
    path = tmp_path / "h.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(t0=T0), str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    started = [child.stdout.readline() for _ in range(10)]  # running (a slow start is no failure)
    time.sleep(1.0)
    child.send_signal(signal.SIGKILL)
    out = child.stdout.read()  # through the same buffer as readline (communicate would skip it)
    child.wait(timeout=10)
    flushed = [int(line) for line in ("".join(started) + out).split("\n")[:-1]]  # a cut last line is dropped
    assert flushed == list(range(len(flushed))) and len(flushed) > 10, out[:200]
    with HistoryStore.open(path, now=T0, read_only=True) as store:
        stored = {p.minute: p for p in store.points(_only(store, "usage", {"pod": "3"}), 0, math.inf)}
        counter = store.points(_only(store, "req"), 0, math.inf)
    for m in flushed:
        assert stored[T0 + 60 * m].last == float(m)
    assert len(stored) - len(flushed) in (0, 1)  # at most the one minute committed but not yet printed
    assert [p.increase for p in counter[1 : len(flushed)]] == [3.0] * (len(flushed) - 1)


def _sqlite_file(path, app_id=0, version=0):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute(f"PRAGMA application_id = {app_id}")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


def _ours_newer(path):
    HistoryStore.open(path, now=T0).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p.write_text("kv-sidecar config, not a database\n" * 20), "not an SQLite file"),
        (lambda p: _sqlite_file(p), "another application"),
        (lambda p: _sqlite_file(p, app_id=0x12345678), "application_id 0x12345678"),
        (_ours_newer, f"schema version {SCHEMA_VERSION + 1} is newer"),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4080), "corrupt"),
    ],
    ids=["text", "sqlite-no-id", "sqlite-other-id", "newer-schema", "corrupt"],
)
def test_a_foreign_file_is_refused_and_left_untouched(tmp_path, make, expected):
    path = tmp_path / "h.db"
    make(path)
    before = path.read_bytes()
    for read_only in (False, True):
        with pytest.raises(HistoryError, match=expected) as err:
            HistoryStore.open(path, now=T0, read_only=read_only)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and "\n" not in message
        assert "history.path" in message or "move it away" in message or "upgrade" in message
    assert path.read_bytes() == before


def test_an_empty_file_becomes_a_history(tmp_path):
    path = tmp_path / "h.db"
    path.touch()
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("usage", LABELS, 1.0, "gauge")])
    with HistoryStore.open(path, now=T0, read_only=True) as store:
        assert store.names() == ["usage"]


def test_a_missing_file_is_created_but_never_by_a_reader(tmp_path):
    with pytest.raises(HistoryError, match="no history file"):
        HistoryStore.open(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()
    HistoryStore.open(tmp_path / "sub-none.db", now=T0).close()
    assert (tmp_path / "sub-none.db").exists()


def test_a_reader_cannot_write(tmp_path):
    path = tmp_path / "h.db"
    HistoryStore.open(path, now=T0).close()
    with HistoryStore.open(path, read_only=True) as store, pytest.raises(HistoryError, match="read-only"):
        store.record(T0, [("usage", LABELS, 1.0, "gauge")])


def test_a_locked_file_gives_a_clear_error_quickly(tmp_path):
    path = tmp_path / "h.db"
    with HistoryStore.open(path, now=T0) as store:
        store.record(T0, [("usage", LABELS, 1.0, "gauge")])
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(HistoryError, match="locked by another process") as err:
            HistoryStore.open(path, now=T0)
        assert time.monotonic() - started < 3.0
        assert str(err.value).startswith(f"{path}: ")
    finally:
        other.close()
    with HistoryStore.open(path, now=T0, read_only=True) as store:  # unharmed once released
        assert store.names() == ["usage"]


def test_a_failed_flush_keeps_the_buffer(tmp_path):
    path = tmp_path / "h.db"
    store = HistoryStore.open(path, now=T0)
    store.record(T0, [("usage", LABELS, 1.0, "gauge")])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with pytest.raises(HistoryError, match="locked"):
        store.flush()
    other.close()
    store.record(T0 + 5, [("usage", LABELS, 3.0, "gauge")])
    store.close()
    with HistoryStore.open(path, now=T0, read_only=True) as reader:
        (point,) = reader.points(_only(reader, "usage"), 0, math.inf)
    assert (point.count, point.mean) == (2, 2.0)
