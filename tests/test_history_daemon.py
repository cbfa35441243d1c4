"""The daemon's history writer (history.path): what /metrics shows is what the file keeps, bad files stop
the start with exit 2 before anything listens, failed writes are counted and never stop the scrapes."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
import time
from pathlib import Path

from processes import Processes, free_port, http_get, kv_sidecar
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import build_config
from sidecar.history import HistoryStore
from sidecar.history_writer import MAX_HISTORY_BACKLOG, HistoryWriter, open_history
from sidecar.scrape_loop import Sidecar
from sidecar.simulator import SimConfig, Simulator
from sidecar.simulator.server import SimServer


def _config(tmp_path: Path, url: str, **history: object):
    return build_config(
        {
            "targets": [{"name": "sim", "url": url, "clock": "simulated"}],
            "scrape": {"interval": "1s"},
            "history": {"path": str(tmp_path / "history.sqlite"), **history},
        }
    )


def _exported(sidecar: Sidecar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = generate_latest(sidecar.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name.endswith("_created") or s.name.startswith("kvcache_sidecar_build_info"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_history_keeps_what_metrics_shows(tmp_path):
    sim = SimServer(Simulator(SimConfig(), scenario="ramp-10m", seed=1), "127.0.0.1", 0, 60.0).start()
    clock = [1_800_000_000.0]  # a minute boundary: the scrapes below fall in one minute
    try:
        config = _config(tmp_path, f"{sim.url}/metrics")
        sidecar = Sidecar(config, clock=lambda: clock[0], history=open_history(config, now=clock[0]))
        state = sidecar.states[0]
        shown = []
        for _ in range(3):
            asyncio.run(sidecar.scrape_once(state))
            shown.append(_exported(sidecar))
            clock[0] += 5
            time.sleep(0.5)  # 30 simulated seconds: requests arrive, the counters move
        clock[0] += 60  # the next minute: the first one is written
        asyncio.run(sidecar.scrape_once(state))
        sidecar.close_history()
        asyncio.run(sidecar.aclose())
    finally:
        sim.stop()

    store = HistoryStore.open(tmp_path / "history.sqlite", read_only=True)
    first_minute = 1_800_000_000
    names = set(store.names())
    exported_names = {name for name, _ in shown[0]} - {"kvcache_sidecar_history_write_errors_total"}
    assert exported_names <= names, exported_names - names
    assert "kvcache_sidecar_history_write_errors_total" not in names  # the sidecar's own bookkeeping
    for name in ("kvcache_usage_ratio", "kvcache_capacity_tokens"):
        ((sid, stored_labels),) = store.series(name)
        key = (name, tuple(sorted(stored_labels.items())))
        values = [page[key] for page in shown]
        (p, _) = store.points(sid, first_minute, first_minute + 120)
        assert (p.min, p.max, p.count, p.last) == (min(values), max(values), 3, values[-1])
        assert abs(p.mean - sum(values) / 3) < 1e-12
    # a counter keeps its increase over the minute
    ((sid, labels),) = store.series("kvcache_prefix_cache_queries_tokens_total")
    key = ("kvcache_prefix_cache_queries_tokens_total", tuple(sorted(labels.items())))
    (p, _) = store.points(sid, first_minute, first_minute + 120)
    assert p.increase == shown[2][key] - shown[0][key] and p.increase > 0
    store.close()


def test_failed_writes_are_counted_and_the_scrapes_go_on(tmp_path):
    sim = SimServer(Simulator(SimConfig(), scenario="ramp-10m", seed=1), "127.0.0.1", 0, 60.0).start()
    clock = [1_800_000_000.0]
    other = None
    try:
        config = _config(tmp_path, f"{sim.url}/metrics")
        sidecar = Sidecar(config, clock=lambda: clock[0], history=open_history(config, now=clock[0]))
        state = sidecar.states[0]
        asyncio.run(sidecar.scrape_once(state))
        other = sqlite3.connect(tmp_path / "history.sqlite", timeout=0)
        other.execute("BEGIN EXCLUSIVE")  # another process holds the file
        clock[0] += 60
        asyncio.run(sidecar.scrape_once(state))  # the first minute cannot be written
        deadline = time.monotonic() + 10
        while sidecar.history_errors == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the writer thread waits one second for the lock, then gives up
        assert sidecar.history_errors == 1
        page = _exported(sidecar)
        assert page[("kvcache_sidecar_history_write_errors_total", ())] == 1
        assert page[("kvcache_sidecar_target_up", (("target", "sim"),))] == 1  # scraping went on
        other.rollback()
        clock[0] += 60
        asyncio.run(sidecar.scrape_once(state))  # the buffered minutes are written now
        sidecar.close_history()
        asyncio.run(sidecar.aclose())
    finally:
        if other is not None:
            other.close()
        sim.stop()
    store = HistoryStore.open(tmp_path / "history.sqlite", read_only=True)
    ((sid, _),) = store.series("kvcache_usage_ratio")
    assert [p.minute for p in store.points(sid, 0, 2e9)] == [1_800_000_000, 1_800_000_060, 1_800_000_120]
    store.close()


def test_no_history_no_history_series(tmp_path):
    config = build_config({"targets": ["http://127.0.0.1:9/metrics"]})
    assert open_history(config) is None
    assert "kvcache_sidecar_history_write_errors_total" not in generate_latest(Sidecar(config).registry).decode()


def test_a_foreign_history_file_never_stops_the_sidecar(tmp_path):
    """A sidecar that exits would crash-loop and take its pod out of the Service: it serves without a
    history instead, says why once, counts it, and leaves the file alone."""
    foreign = tmp_path / "history.sqlite"
    foreign.write_bytes(b"not a database, and precious\n" * 100)
    procs = Processes(tmp_path)
    port = free_port()
    try:
        procs.start(
            "sidecar",
            [
                *kv_sidecar(),
                "run",
                "--target",
                "http://127.0.0.1:9/metrics",
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--history.path",
                str(foreign),
            ],
        )
        deadline = time.monotonic() + 30
        body = b""
        while time.monotonic() < deadline and b"kvcache_sidecar_history_write_errors_total" not in body:
            procs.check_alive()
            _, body = http_get(f"http://127.0.0.1:{port}/metrics")
            time.sleep(0.2)
        assert b"kvcache_sidecar_history_write_errors_total 1.0" in body
        log = procs.logs("sidecar")
    finally:
        procs.stop()
    assert "history.path" in log and str(foreign) in log and "Traceback" not in log
    assert foreign.read_bytes() == b"not a database, and precious\n" * 100  # untouched


def test_the_daemon_keeps_a_history_across_sigterm(tmp_path):
    procs = Processes(tmp_path)
    sim_port, port = free_port(), free_port()
    try:
        procs.start("sim", [*kv_sidecar(), "simulate", "--port", str(sim_port), "--speed", "30"])
        procs.start(
            "sidecar",
            [
                *kv_sidecar(),
                "run",
                "--target",
                f"http://127.0.0.1:{sim_port}/metrics",
                "--scrape.interval",
                "1s",
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--history.path",
                str(tmp_path / "h.sqlite"),
            ],
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            if status == 200 and b"kvcache_usage_ratio{" in body:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(procs.logs("sidecar", "sim"))
        assert b"kvcache_sidecar_history_write_errors_total 0.0" in body
        time.sleep(3)
        procs.procs["sidecar"].send_signal(signal.SIGTERM)
        assert procs.procs["sidecar"].wait(timeout=10) == 0
    finally:
        procs.stop()
    store = HistoryStore.open(tmp_path / "h.sqlite", read_only=True)
    ((sid, _),) = store.series("kvcache_usage_ratio")
    points = store.points(sid, 0, 2e9)
    assert points and sum(p.count for p in points) >= 3  # the last minute was flushed on SIGTERM
    store.close()


def test_a_failed_last_flush_still_closes_cleanly(tmp_path):
    config = build_config({"targets": ["http://127.0.0.1:9/metrics"], "history": {"path": str(tmp_path / "h")}})
    clock = [1_800_000_000.0]
    sidecar = Sidecar(config, clock=lambda: clock[0], history=open_history(config, now=clock[0]))
    sidecar.record_history(sidecar.states[0])
    other = sqlite3.connect(tmp_path / "h", timeout=0)
    try:
        other.execute("BEGIN EXCLUSIVE")
        sidecar.close_history()  # counted and logged, never raised: SIGTERM stays a clean stop
    finally:
        other.close()
    assert sidecar.history_errors == 1


def test_a_locked_history_never_delays_a_scrape(tmp_path):
    """The write waits for the lock in the writer thread: the scrape has returned before it fails."""
    config = build_config({"targets": ["http://127.0.0.1:9/metrics"], "history": {"path": str(tmp_path / "h")}})
    clock = [1_800_000_000.0]
    sidecar = Sidecar(config, clock=lambda: clock[0], history=open_history(config, now=clock[0]))
    sidecar.record_history(sidecar.states[0])  # a minute in the buffer: the next minute's record writes it
    other = sqlite3.connect(tmp_path / "h", timeout=0)
    try:
        other.execute("BEGIN EXCLUSIVE")
        clock[0] += 60
        asyncio.run(sidecar.scrape_once(sidecar.states[0]))  # refused at once; its record is queued
        assert sidecar.history_errors == 0  # the writer is still waiting for the lock (one second)
        sidecar.close_history()  # drains the writer: its write failed on the lock, and was counted
        assert sidecar.history_errors >= 1
    finally:
        other.close()
    asyncio.run(sidecar.aclose())


def test_a_writer_that_falls_behind_drops_records_and_says_so():
    release = threading.Event()
    written = []
    writer = HistoryWriter(lambda ts, samples: (release.wait(10), written.append(ts)))
    accepted = [writer.submit(float(i), []) for i in range(MAX_HISTORY_BACKLOG + 2)]
    assert not all(accepted) and accepted[0]  # bounded: the records past the backlog are refused
    release.set()
    writer.close()
    assert written == [float(i) for i, ok in enumerate(accepted) if ok]  # in order, none lost once queued
