"""The sidecar's own history: its series downsampled to one row per minute, in one SQLite file.

What: :class:`HistoryStore` keeps, for every series the sidecar records (a name, its labels and a kind,
``gauge`` or ``counter``), one row per minute in an SQLite file, and reads them back by series and time
range.

Why: a single VM, a laptop or the demo has no Prometheus, yet the weekly capacity report needs a week of
usage. Stdlib ``sqlite3`` only, so it costs no dependency.

Who writes and reads it: the daemon, from its I/O edge after every scrape, when ``history.path`` is set
(:mod:`sidecar.daemon`); ``kv-sidecar report --history PATH`` reads it, read-only
(:mod:`sidecar.report.embedded`).

Resolution: one minute. A row covers ``[minute, minute + 60)`` in Unix seconds (``minute`` is the start).
A gauge's row holds the minute's min, max, sum and count of samples (mean = sum / count) and the last
sample. A counter's row holds in ``sum`` the counter's *increase* over the minute: each sample adds its
rise since the previous sample (that of the previous minute too, and the last one stored before a
reopen), and a drop means the counter restarted, so the increase after a reset is the new value, as
Prometheus' ``increase()`` treats resets. The first sample ever of a counter adds nothing (there is no
earlier value to rise from). ``last`` is the raw counter value, from which the next increase is computed
across minutes and across a reopen; ``min``/``max`` are the raw values' extremes. Summing a counter's
increases over any range gives its increase over that range, without Prometheus' extrapolation.

Values: NaN samples are skipped (nothing was measured). A gauge's +Inf/-Inf is stored as it is (SQLite's
REAL holds infinities; "time until full" is +Inf when nothing grows); a minute holding both signs has a
NaN mean. A counter sample that is infinite or negative is skipped: no increase can be computed from it.

Writes: the current minute is buffered in memory; its rows are written, in one transaction, when a
sample of a later minute arrives or on :meth:`HistoryStore.flush`. A sample older than the newest minute
seen (a wall-clock step back) is counted in that newest minute, so a clock step never loses samples. A
flush writes one small transaction; a file locked by another process makes it wait at most
``BUSY_TIMEOUT_S`` and then raise, keeping the buffer for the next flush (at most
``MAX_PENDING_MINUTES`` minutes of it).

Crash guarantee: WAL journal mode with ``synchronous=NORMAL``. A kill of the process at any moment
leaves a readable file holding every minute whose flush returned; a power loss may lose the last
commits but never corrupts the file.

Bounded growth: :meth:`HistoryStore.prune` drops the minutes older than the retention, then, while the
file (main file + WAL) is above the size cap, the oldest minutes; freed pages go back to the file system
(``auto_vacuum=INCREMENTAL``) and the WAL is truncated. Every flush that leaves the file above the cap
enforces the cap itself, so the cap holds whatever the run time, down to a file of bare schema.

Safety: a file that is not ours (not SQLite, another application's SQLite, a newer schema, a corrupt
file) raises :class:`HistoryError` naming the path and the fix, and is never written: it is inspected
read-only before any write.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import input_files

#: ``PRAGMA application_id`` of a history file: "KVSH" in ASCII.
APPLICATION_ID = 0x4B565348
#: ``PRAGMA user_version``: the schema version this module writes and reads.
SCHEMA_VERSION = 1
#: How long a write waits for another process's lock before it gives up.
BUSY_TIMEOUT_S = 1.0
#: Buffered minutes kept while writes fail (then the oldest are dropped): bounded memory.
MAX_PENDING_MINUTES = 60
#: When the cap is exceeded, the oldest minutes are dropped down to this share of it, so that the cap
#: is enforced once per tenth of it written, not at every flush.
CAP_TARGET = 0.9
KINDS = ("gauge", "counter")
#: Series keys remembered between scrapes (see ``HistoryStore._key``).
MAX_KEY_CACHE = 10_000

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    kind TEXT NOT NULL,
    UNIQUE (name, labels)
);
CREATE TABLE IF NOT EXISTS points (
    series_id INTEGER NOT NULL REFERENCES series (id),
    minute INTEGER NOT NULL,
    min REAL,
    max REAL,
    sum REAL,
    count INTEGER NOT NULL,
    last REAL,
    PRIMARY KEY (series_id, minute)
) WITHOUT ROWID;
"""
_UPSERT = """
INSERT INTO points (series_id, minute, min, max, sum, count, last) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (series_id, minute) DO UPDATE SET
    min = min(points.min, excluded.min),
    max = max(points.max, excluded.max),
    sum = points.sum + excluded.sum,
    count = points.count + excluded.count,
    last = excluded.last
"""

Sample = tuple[str, Mapping[str, str], float, str]
SeriesKey = tuple[str, str]  # (name, canonical labels JSON)


class HistoryError(Exception):
    """A history file that cannot be used; the message is one line naming the path and the fix."""


@dataclass(frozen=True)
class Point:
    """One minute of one series, as read back."""

    minute: int  # start of the minute, Unix seconds
    min: float
    max: float
    mean: float | None  # gauges: sum / count; None for counters
    count: int  # samples in the minute
    last: float
    increase: float | None  # counters: the increase over the minute; None for gauges


@dataclass
class _Minute:
    """One series' samples of one minute, while buffered."""

    min: float
    max: float
    sum: float
    count: int
    last: float

    def add(self, value: float, increment: float) -> None:
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self.sum += increment
        self.count += 1
        self.last = value


def canonical_labels(labels: Mapping[str, str]) -> str:
    """Labels as the JSON stored in ``series.labels``: sorted keys, no spaces."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def minute_of(ts: float) -> int:
    """The start of the minute holding ``ts``, in Unix seconds."""
    return int(ts // 60) * 60


def file_size(path: Path) -> int:
    """Bytes the history takes on disk: the main file and its WAL."""
    return sum(p.stat().st_size for p in (path, _wal_path(path)) if p.exists())


def _wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _error(path: Path, exc: sqlite3.Error) -> HistoryError:
    """The one-line message for an SQLite failure on ``path``."""
    if _is_busy(exc):
        return HistoryError(
            f"{path}: history file is locked by another process (held longer than {BUSY_TIMEOUT_S:g} s); "
            "stop the other kv-sidecar using it or give each process its own history.path"
        )
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return HistoryError(
            f"{path}: history file is corrupt ({exc}); move it away (a new history starts) or set history.path"
        )
    return HistoryError(f"{path}: cannot use the history file ({exc}); check the path and its permissions")


@contextmanager
def _translated(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _error(path, exc) from exc


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        # Without a WAL file no connection has the file open (a WAL-mode connection keeps one while
        # open): "immutable" then reads it without creating -wal/-shm files, so the report needs no
        # write access to the daemon's folder. With a WAL, a running daemon's -shm lets it read.
        uri = path.resolve().as_uri() + ("?mode=ro" if _wal_path(path).exists() else "?mode=ro&immutable=1")
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)


def _held_exclusively(path: Path) -> bool:
    """Whether another process holds an exclusive lock on ``path`` (``flock``, or a POSIX lock as SQLite's
    exclusive locking mode takes), probed without waiting. A WAL writer's transaction holds none: readers
    see its last commit, as SQLite intends. Only for reading: the probe's release would drop the POSIX
    locks this process holds on the file, and a reader holds none yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # the open that follows says why
    try:
        for lock in (fcntl.flock, fcntl.lockf):
            try:
                lock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    return True
                raise
            lock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _inspect(path: Path) -> bool:
    """Whether ``path`` (an existing file) is ours; False for an empty database we may adopt.

    Reads only: the header, then a read-only connection. Raises :class:`HistoryError` for anything else.
    """
    try:
        with path.open("rb") as f:
            header = f.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise HistoryError(f"{path}: cannot read it ({e.strerror or e}); check the path and its permissions") from None
    if not header:
        return False  # a zero-byte file: SQLite's empty database, nothing to lose
    if header != _SQLITE_MAGIC:
        raise HistoryError(f"{path}: not an SQLite file, so not a kv-sidecar history; move it away or set history.path")
    with _translated(path):
        conn = _connect(path, read_only=True)
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            objects = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
            check = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        finally:
            conn.close()
    if app_id == 0 and version == 0 and objects == 0:
        return False
    if app_id != APPLICATION_ID:
        raise HistoryError(
            f"{path}: an SQLite file of another application (application_id {app_id:#x}, ours is "
            f"{APPLICATION_ID:#x}); move it away or set history.path to another file"
        )
    if version > SCHEMA_VERSION:
        raise HistoryError(
            f"{path}: history schema version {version} is newer than this kv-sidecar reads ({SCHEMA_VERSION}); "
            "upgrade kv-sidecar or set history.path to another file"
        )
    if check != "ok":
        raise HistoryError(f"{path}: history file is corrupt ({check}); move it away (a new history starts)")
    return True


class HistoryStore:
    """One history file, open for writing (the daemon) or reading (the report)."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, *, retention_s: float, max_bytes: int, read_only: bool
    ) -> None:
        self._conn = conn
        self.path = path
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.read_only = read_only
        self._lock = threading.RLock()
        self._ids: dict[SeriesKey, int] = {}
        self._kinds: dict[int, str] = {}
        self._counter_last: dict[SeriesKey, float] = {}
        self._pending: dict[int, dict[SeriesKey, _Minute]] = {}
        self._pending_kinds: dict[SeriesKey, str] = {}
        self._newest_minute: int | None = None
        self._keys: dict[tuple[str, tuple[tuple[str, str], ...]], SeriesKey] = {}

    # --- opening and closing ---

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        retention_s: float = 8 * 86400,
        max_bytes: int = 64 * 2**20,
        now: float | None = None,
        read_only: bool = False,
    ) -> HistoryStore:
        """Open (or create) the history at ``path``; a writable open prunes once, at ``now`` (default: the clock).

        ``read_only`` (the report) never creates nor writes the file: a missing file raises too.
        """
        path = Path(path)
        if path.is_dir():
            raise HistoryError(f"{path}: a directory, not a history file; name a file in it ({path}/history.sqlite)")
        for part in (path, _wal_path(path)):  # before SQLite opens them: opening a FIFO waits for a writer
            if (kind := input_files.not_regular(part)) is not None:
                raise HistoryError(f"{part}: is {kind}, not a regular file; set history.path to a file")
        exists = path.exists()
        if read_only and not exists:
            raise HistoryError(f"{path}: no history file there; check the path (the daemon's history.path)")
        if read_only and _held_exclusively(path):
            raise HistoryError(
                f"{path}: history file is locked by another process (an exclusive lock); "
                "read it once the other process let it go, or read a copy"
            )
        ours = _inspect(path) if exists else False
        if read_only and not ours:
            raise HistoryError(f"{path}: an empty file, not a kv-sidecar history yet; check the path")
        with _translated(path):
            conn = _connect(path, read_only=read_only)
            try:
                if not read_only:
                    cls._create_or_upgrade(conn, max_bytes)
                store = cls(conn, path, retention_s=retention_s, max_bytes=max_bytes, read_only=read_only)
                store._load()
            except BaseException:
                conn.close()
                raise
        if not read_only:
            try:
                store.prune(time.time() if now is None else now)
            except BaseException:
                store.close()
                raise
        return store

    @staticmethod
    def _create_or_upgrade(conn: sqlite3.Connection, max_bytes: int) -> None:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect only before the first table
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        wal_bytes = max(16 * page_size, min(max_bytes // 16, 1000 * page_size))  # a WAL small beside the cap
        conn.execute(f"PRAGMA wal_autocheckpoint = {wal_bytes // page_size}")
        conn.execute(f"PRAGMA journal_size_limit = {wal_bytes}")
        with _transaction(conn):  # BEGIN IMMEDIATE: a locked file fails at open, not at the first flush
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _load(self) -> None:
        """Series ids and kinds, each counter's last raw value, and the newest stored minute."""
        self._ids.clear()
        self._kinds.clear()
        for sid, name, labels, kind in self._conn.execute("SELECT id, name, labels, kind FROM series"):
            self._ids[(name, labels)] = sid
            self._kinds[sid] = kind
        for key, sid in self._ids.items():
            row = self._conn.execute(
                "SELECT minute, last FROM points WHERE series_id = ? ORDER BY minute DESC LIMIT 1", (sid,)
            ).fetchone()
            if row is None:
                continue
            self._newest_minute = max(self._newest_minute or row[0], row[0])
            if self._kinds[sid] == "counter" and key not in self._counter_last:
                self._counter_last[key] = row[1]

    def close(self) -> None:
        """Flush the buffer (when writable) and close the file."""
        with self._lock:
            try:
                if not self.read_only:
                    self.flush()
            finally:
                self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ---

    def record(self, ts: float, samples: Iterable[Sample]) -> None:
        """Buffer ``samples`` taken at ``ts`` (name, labels, value, kind); writes the minutes before ``ts``'s."""
        minute = minute_of(ts)
        with self._lock:
            self._require_writable()
            if self._newest_minute is not None and minute < self._newest_minute:
                minute = self._newest_minute  # a clock step back: counted in the newest minute
            self._newest_minute = minute
            bucket = self._pending.setdefault(minute, {})
            for name, labels, value, kind in samples:
                self._add(bucket, name, labels, float(value), kind)
            while len(self._pending) > MAX_PENDING_MINUTES:
                del self._pending[min(self._pending)]
            if any(m < minute for m in self._pending):
                self._write(lambda m: m < minute)

    def _add(
        self, bucket: dict[SeriesKey, _Minute], name: str, labels: Mapping[str, str], value: float, kind: str
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"{name}: kind {kind!r} is not one of {', '.join(KINDS)}")
        key = self._key(name, labels)
        known = self._kinds.get(self._ids[key]) if key in self._ids else self._pending_kinds.get(key)
        if known is not None and known != kind:
            raise ValueError(f"{name}{key[1]}: recorded as a {known}, now as a {kind}")
        if math.isnan(value) or (kind == "counter" and (math.isinf(value) or value < 0)):
            return
        increment = value if kind == "gauge" else self._counter_increase(key, value)
        self._pending_kinds[key] = kind
        if key in bucket:
            bucket[key].add(value, increment)
        else:
            bucket[key] = _Minute(value, value, increment, 1, value)

    def _key(self, name: str, labels: Mapping[str, str]) -> SeriesKey:
        """``(name, canonical labels)``, memoised: the same series arrive at every scrape, and the JSON
        encoding was most of the cost of recording one."""
        raw = (name, tuple(labels.items()))
        key = self._keys.get(raw)
        if key is None:
            if len(self._keys) >= MAX_KEY_CACHE:
                self._keys.clear()  # label churn (pods come and go): start afresh rather than grow
            key = self._keys[raw] = (name, canonical_labels(labels))
        return key

    def _counter_increase(self, key: SeriesKey, value: float) -> float:
        previous = self._counter_last.get(key)
        self._counter_last[key] = value
        if previous is None:
            return 0.0
        return value - previous if value >= previous else value  # a drop: the counter restarted from 0

    def flush(self) -> None:
        """Write every buffered minute, the current one included, in one transaction."""
        with self._lock:
            self._require_writable()
            if self._pending:
                self._write(lambda m: True)

    def _write(self, selected: Callable[[int], bool]) -> None:
        minutes = sorted(m for m in self._pending if selected(m))
        new_ids: dict[SeriesKey, int] = {}
        with _translated(self.path), _transaction(self._conn):
            rows = []
            for minute in minutes:
                for key, acc in self._pending[minute].items():
                    sid = self._ids.get(key) or new_ids.get(key) or self._insert_series(key, new_ids)
                    rows.append((sid, minute, acc.min, acc.max, acc.sum, acc.count, acc.last))
            self._conn.executemany(_UPSERT, rows)
        for key, sid in new_ids.items():  # only once committed: a rolled-back id must not be reused
            self._ids[key] = sid
            self._kinds[sid] = self._pending_kinds[key]
        for minute in minutes:
            del self._pending[minute]
        if file_size(self.path) > self.max_bytes:
            self._enforce_cap()

    def _insert_series(self, key: SeriesKey, new_ids: dict[SeriesKey, int]) -> int:
        cur = self._conn.execute(
            "INSERT INTO series (name, labels, kind) VALUES (?, ?, ?)", (*key, self._pending_kinds[key])
        )
        assert cur.lastrowid is not None
        new_ids[key] = cur.lastrowid
        return cur.lastrowid

    def _require_writable(self) -> None:
        if self.read_only:
            raise HistoryError(f"{self.path}: opened read-only; the daemon writes the history")

    # --- bounded growth ---

    def prune(self, now: float) -> None:
        """Drop minutes older than the retention, then the oldest ones while the file is above the cap."""
        with self._lock:
            self._require_writable()
            with _translated(self.path):
                self._delete_before(minute_of(now - self.retention_s))
                self._release_space()
                self._enforce_cap()

    def _enforce_cap(self) -> None:
        """While main file + WAL exceed the cap, drop the oldest minutes (down to ``CAP_TARGET`` of it)."""
        with _translated(self.path):
            if file_size(self.path) <= self.max_bytes:
                return
            self._release_space()  # a checkpoint may be enough: the WAL's frames were counted
            target = CAP_TARGET * self.max_bytes
            if file_size(self.path) <= self.max_bytes:
                return
            while (size := file_size(self.path)) > target:
                span = self._minute_span()
                if span is None:
                    return  # nothing left to drop: the cap is below an empty history's size
                oldest, newest = span
                share = (size - target) / size
                drop = max(1, math.ceil(share * ((newest - oldest) // 60 + 1)))
                self._delete_before(oldest + 60 * drop)
                self._release_space()

    def _minute_span(self) -> tuple[int, int] | None:
        """The oldest and newest stored minutes, each found on the primary key, series by series."""
        spans = [
            self._conn.execute("SELECT min(minute), max(minute) FROM points WHERE series_id = ?", (sid,)).fetchone()
            for sid in self._kinds
        ]
        present = [s for s in spans if s[0] is not None]
        if not present:
            return None
        return min(s[0] for s in present), max(s[1] for s in present)

    def _delete_before(self, minute: int) -> None:
        """Delete points before ``minute`` and the series left without points."""
        with _transaction(self._conn):
            self._conn.executemany(
                "DELETE FROM points WHERE series_id = ? AND minute < ?", [(sid, minute) for sid in self._kinds]
            )
            self._conn.execute("DELETE FROM series WHERE id NOT IN (SELECT DISTINCT series_id FROM points)")
        self._load()

    def _release_space(self) -> None:
        """Give freed pages back to the file system and truncate the WAL."""
        self._conn.executescript("PRAGMA incremental_vacuum;")  # one page per step: executescript runs them all
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    # --- reading (what is in the file; a writer's buffer is not) ---

    def names(self) -> list[str]:
        """Every stored series name, sorted."""
        with self._lock, _translated(self.path):
            return [r[0] for r in self._conn.execute("SELECT DISTINCT name FROM series ORDER BY name")]

    def series(self, name: str, match: Mapping[str, str] | None = None) -> list[tuple[int, dict[str, str]]]:
        """The series called ``name`` whose labels include every ``match`` pair, as (id, labels), sorted by labels."""
        with self._lock, _translated(self.path):
            rows = self._conn.execute("SELECT id, labels FROM series WHERE name = ? ORDER BY labels, id", (name,))
            found = [(sid, json.loads(labels)) for sid, labels in rows]
        wanted = dict(match or {})
        return [(sid, labels) for sid, labels in found if all(labels.get(k) == v for k, v in wanted.items())]

    def points(self, series_id: int, start: float, end: float) -> list[Point]:
        """The minutes of a series starting in ``[start, end)``, oldest first."""
        with self._lock, _translated(self.path):
            kind_row = self._conn.execute("SELECT kind FROM series WHERE id = ?", (series_id,)).fetchone()
            if kind_row is None:
                return []
            rows = self._conn.execute(
                "SELECT minute, min, max, sum, count, last FROM points"
                " WHERE series_id = ? AND minute >= ? AND minute < ? ORDER BY minute",
                (series_id, start, end),
            ).fetchall()
        return [_point(kind_row[0], *row) for row in rows]


def _point(kind: str, minute: int, lo: float, hi: float, total: float | None, count: int, last: float) -> Point:
    total = math.nan if total is None else total  # SQLite stores a NaN sum (+Inf and -Inf) as NULL
    if kind == "counter":
        return Point(minute, lo, hi, None, count, last, total)
    return Point(minute, lo, hi, total / count, count, last, None)


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a full disk, say)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
