"""Reloading without losing state: SIGHUP, POST /-/reload and a ConfigMap's ``..data`` swap re-read the
configuration; a good one keeps the unchanged targets' state and scrape jobs, a bad one is refused,
logged once and counted while the running one goes on; SIGHUP never stops the process.

Real ``kv-sidecar run`` processes against ``kv-sidecar simulate`` (or a port where nothing listens, whose
refused scrapes make a counter that grows at every scrape: a state that restarted would show it).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import bcrypt
import httpx
import pytest
from certs import needs_openssl, self_signed
from processes import Processes, free_port, kv_sidecar
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import Config, build_config
from sidecar.daemon import _adopt
from sidecar.exporter import RELOAD_SERIES, SidecarCollector
from sidecar.layers import build_extenders
from sidecar.reload import Reloader, ReloadStatus, Sources, fingerprint
from sidecar.scrape_loop import Sidecar
from sidecar.webconfig import WebConfig

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(page: Samples, name: str, **labels: str) -> float | None:
    return page.get((name, tuple(sorted(labels.items()))))


class Daemon:
    """One ``kv-sidecar run`` with a config file (and its simulator), read over HTTP."""

    def __init__(self, tmp_path: Path, config: Path, *extra: str, web_config: Path | None = None):
        self.procs = Processes(tmp_path)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.auth: tuple[str, str] | None = None
        argv = [*kv_sidecar(), "run", "--config.file", str(config), "--web.listen-address", f"127.0.0.1:{self.port}"]
        if web_config is not None:
            argv += ["--web.config.file", str(web_config)]
        self.proc = self.procs.start("sidecar", [*argv, *extra])

    def page(self) -> Samples:
        r = httpx.get(self.base + "/metrics", timeout=5, auth=self.auth)
        r.raise_for_status()
        return samples(r.text)

    def wait_for(self, what: str, ok: Callable[[Samples], bool], seconds: float = 20.0) -> Samples:
        deadline = time.monotonic() + seconds
        while True:
            self.procs.check_alive()
            try:
                page = self.page()
                if ok(page):
                    return page
            except httpx.HTTPError:  # not up yet, or not yet with these credentials
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {seconds}s for {what}\n{self.procs.logs()}")
            time.sleep(0.1)

    def reloads(self, page: Samples) -> tuple[float | None, float | None, float | None]:
        """(successes, failures, last_reload_successful)."""
        return (
            value(page, "kvcache_sidecar_config_reloads_total", result="success"),
            value(page, "kvcache_sidecar_config_reloads_total", result="failure"),
            value(page, "kvcache_sidecar_config_last_reload_successful"),
        )

    def logs(self) -> str:
        return self.procs.logs("sidecar", tail=200)

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=10)
        self.procs.stop()
        return code


def config_text(targets: dict[str, str], watermark: float = 0.95, interval: str = "200ms") -> str:
    lines = ["targets:"] + [f"  - {{name: {name}, url: '{url}'}}" for name, url in targets.items()]
    return "\n".join(lines + [f"scrape: {{interval: {interval}}}", f"thresholds: {{watermark: {watermark}}}", ""])


def headroom_matches(page: Samples, target: str, watermark: float) -> bool:
    """kvcache_watermark_headroom_tokens as sidecar/derive.py computes it for ``watermark`` from the page's
    own used and free tokens and block size."""
    used = free = headroom = block = None
    for (name, labels), v in page.items():
        d = dict(labels)
        if d.get("target") != target:
            continue
        if name == "kvcache_used_tokens":
            used = v
        elif name == "kvcache_free_tokens":
            free = v
        elif name == "kvcache_watermark_headroom_tokens":
            headroom = v
        elif name == "kvcache_server_info":
            block = float(d["block_size"])
    if None in (used, free, headroom, block):
        return False
    assert used is not None and free is not None and block is not None
    allowed = math.floor(watermark * (used + free) / block + 1e-9) * block
    return headroom == max(0.0, allowed - used)


@pytest.fixture
def simulator(tmp_path):
    procs = Processes(tmp_path)
    port = free_port()
    procs.start("sim", [*kv_sidecar(), "simulate", "--port", str(port), "--scenario", "steady-low", "--speed", "30"])
    yield f"http://127.0.0.1:{port}/metrics"
    procs.stop()


def test_sighup_applies_a_new_threshold_and_target_list_and_keeps_the_unchanged_targets_state(tmp_path, simulator):
    down, gone, added = (f"http://127.0.0.1:{free_port()}/metrics" for _ in range(3))
    config = tmp_path / "sidecar.yaml"
    config.write_text(config_text({"sim": simulator, "down": down, "gone": gone}, watermark=0.95))
    d = Daemon(tmp_path, config, "--config.auto-reload-interval", "0")  # only SIGHUP reloads here
    try:
        page = d.wait_for(
            "the simulator's gauges and a few refused scrapes",
            lambda p: (
                headroom_matches(p, "sim", 0.95)
                and (value(p, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0) >= 10
            ),
        )
        assert d.reloads(page) == (0.0, 0.0, 1.0)
        started_at = value(page, "kvcache_sidecar_config_last_reload_success_timestamp_seconds")
        refused_before = value(page, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0

        config.write_text(config_text({"sim": simulator, "down": down, "added": added}, watermark=0.99))
        d.proc.send_signal(signal.SIGHUP)
        page = d.wait_for("the reload", lambda p: d.reloads(p)[0] == 1.0)
        # the kept target's counter goes on from where it was (a new state would restart from 0)
        assert (
            value(page, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0
        ) >= refused_before
        assert value(page, "kvcache_sidecar_target_up", target="gone") is None  # removed: its series are gone
        assert value(page, "kvcache_sidecar_target_up", target="sim") == 1.0
        assert (value(page, "kvcache_sidecar_config_last_reload_success_timestamp_seconds") or 0) > (started_at or 0)
        d.wait_for("the new threshold", lambda p: headroom_matches(p, "sim", 0.99))
        d.wait_for("the added target", lambda p: value(p, "kvcache_sidecar_target_up", target="added") == 0.0)
        logs = d.logs()
        assert "configuration reloaded trigger=SIGHUP kept=sim,down added=added removed=gone" in logs
        assert d.stop() == 0
    finally:
        d.procs.stop()


def test_a_bad_reload_is_refused_counted_and_the_running_configuration_stays(tmp_path):
    down = f"http://127.0.0.1:{free_port()}/metrics"
    config = tmp_path / "sidecar.yaml"
    config.write_text(config_text({"down": down}))
    d = Daemon(tmp_path, config, "--config.auto-reload-interval", "0")
    try:
        d.wait_for("a scrape", lambda p: value(p, "kvcache_sidecar_target_up", target="down") == 0.0)
        config.write_text(config_text({"down": down}).replace("interval: 200ms", "interval: soon") + "nonsense: 1\n")
        d.proc.send_signal(signal.SIGHUP)
        page = d.wait_for("the refusal", lambda p: d.reloads(p)[1] == 1.0)
        assert d.reloads(page) == (0.0, 1.0, 0.0)
        refused = value(page, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0
        d.wait_for(  # the old configuration keeps scraping, every 200ms
            "scrapes after the refusal",
            lambda p: (
                (value(p, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0) > refused + 3
            ),
        )
        (line,) = [x for x in d.logs().splitlines() if "reload refused" in x]
        assert (
            "trigger=SIGHUP" in line and f"{config}: scrape.interval: " in line and "nonsense: unknown section" in line
        )

        r = httpx.post(d.base + "/-/reload")  # the same refusal, answered to the caller
        assert r.status_code == 500 and "scrape.interval" in r.text
        assert httpx.get(d.base + "/-/reload").status_code == 405  # POST only
        assert httpx.get(d.base + "/-/reload").headers["Allow"] == "POST"

        config.write_text(config_text({"down": down}) + f"history: {{path: '{tmp_path / 'h.sqlite'}'}}\n")
        r = httpx.post(d.base + "/-/reload")
        assert r.status_code == 500 and "history.path: changed from None to" in r.text and "needs a restart" in r.text

        config.write_text(config_text({"down": down}))
        r = httpx.post(d.base + "/-/reload", content=b"ignored body")
        assert r.status_code == 200 and r.text.startswith("unchanged")  # equal to the running one: not applied again
        assert d.reloads(d.page()) == (1.0, 3.0, 1.0)
        assert d.stop() == 0
    finally:
        d.procs.stop()


def _configmap(folder: Path, version: str, text: str) -> None:
    """Write a ConfigMap volume's new version the way the kubelet does: a new folder, then ``..data`` renamed."""
    (folder / version).mkdir(parents=True)
    (folder / version / "sidecar.yaml").write_text(text)
    (folder / "..data_tmp").symlink_to(version)
    os.replace(folder / "..data_tmp", folder / "..data")


def test_a_configmap_update_is_noticed_by_itself_and_a_bad_one_is_logged_once(tmp_path):
    first, second = (f"http://127.0.0.1:{free_port()}/metrics" for _ in range(2))
    volume = tmp_path / "config"
    _configmap(volume, "..2026_01_01_00_00_00.1", config_text({"first": first}))
    (volume / "sidecar.yaml").symlink_to("..data/sidecar.yaml")
    d = Daemon(tmp_path, volume / "sidecar.yaml", "--config.auto-reload-interval", "200ms")
    try:
        d.wait_for("a scrape", lambda p: value(p, "kvcache_sidecar_target_up", target="first") == 0.0)
        _configmap(volume, "..2026_01_01_00_01_00.2", config_text({"second": second}))
        page = d.wait_for("the new target", lambda p: value(p, "kvcache_sidecar_target_up", target="second") == 0.0)
        assert value(page, "kvcache_sidecar_target_up", target="first") is None
        assert d.reloads(page) == (1.0, 0.0, 1.0)

        _configmap(volume, "..2026_01_01_00_02_00.3", config_text({"second": second}, watermark=1.5))
        page = d.wait_for("the refusal", lambda p: d.reloads(p)[1] == 1.0)
        time.sleep(1.0)  # five more polls of the same bad content
        assert d.reloads(d.page()) == (1.0, 1.0, 0.0)  # counted once, not at every poll
        refusals = [x for x in d.logs().splitlines() if "reload refused" in x]
        assert len(refusals) == 1 and "thresholds.watermark" in refusals[0] and "file-changed" in refusals[0]
        assert value(d.page(), "kvcache_sidecar_target_up", target="second") == 0.0  # still running
        assert d.stop() == 0
    finally:
        d.procs.stop()


@needs_openssl
def test_the_web_config_reloads_too_and_tls_cannot_be_switched_on_without_a_restart(tmp_path):
    config = tmp_path / "sidecar.yaml"
    config.write_text(config_text({"down": f"http://127.0.0.1:{free_port()}/metrics"}))
    web = tmp_path / "web.yml"
    old, new = (bcrypt.hashpw(p, bcrypt.gensalt(4)).decode() for p in (b"old", b"new"))
    web.write_text(f"basic_auth_users: {{prom: '{old}'}}\n")
    d = Daemon(tmp_path, config, "--config.auto-reload-interval", "200ms", web_config=web)
    d.auth = ("prom", "old")
    try:
        d.wait_for("the endpoint", lambda p: True)
        web.write_text(f"basic_auth_users: {{prom: '{new}'}}\n")
        d.auth = ("prom", "new")
        page = d.wait_for("the new password", lambda p: True)
        assert d.reloads(page) == (1.0, 0.0, 1.0)
        assert httpx.get(d.base + "/metrics", auth=("prom", "old")).status_code == 401

        web.write_text(f"basic_auth_users: {{prom: '{new}'}}\ntls_server_config: {{cert_file: a, key_file: b}}\n")
        d.wait_for("the refusal", lambda p: d.reloads(p)[1] == 1.0)
        assert f"{web}: tls_server_config.cert_file: cannot read" in d.logs()  # the files are checked first
        self_signed(tmp_path, "server")
        web.write_text(
            f"basic_auth_users: {{prom: '{new}'}}\ntls_server_config: {{cert_file: server.crt, key_file: server.key}}\n"
        )
        d.wait_for("the second refusal", lambda p: d.reloads(p)[1] == 2.0)
        assert "tls_server_config: added; switching between HTTP and HTTPS needs a restart" in d.logs()
        assert httpx.get(d.base + "/metrics", auth=("prom", "new")).status_code == 200  # still plain HTTP
        assert d.stop() == 0
    finally:
        d.procs.stop()


def test_sighup_never_stops_the_daemon(tmp_path):
    config = tmp_path / "sidecar.yaml"
    config.write_text(config_text({"down": f"http://127.0.0.1:{free_port()}/metrics"}))
    d = Daemon(tmp_path, config)
    try:
        d.wait_for("the endpoint", lambda p: True)
        for _ in range(20):
            d.proc.send_signal(signal.SIGHUP)
        page = d.wait_for("20 reloads", lambda p: (d.reloads(p)[0] or 0) >= 1)
        time.sleep(0.5)
        assert d.proc.poll() is None and d.reloads(page)[1] == 0.0
        assert d.stop() == 0
    finally:
        d.procs.stop()


# ----------------------------------------------------------------------------- in this process


def test_apply_keeps_the_state_object_of_a_target_whose_source_is_unchanged():
    base = {"scrape": {"interval": "1s"}}
    a = build_config({**base, "targets": [{"name": "a", "url": "http://127.0.0.1:9/a"}, "http://127.0.0.1:9/b"]})
    sidecar = Sidecar(a, build_extenders(a))
    kept, replaced = sidecar.states
    kept.errors["refused"] = 7
    b = build_config(
        {
            **base,
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:9/a", "timeout": "500ms"},  # same source, new timeout
                {"name": "127.0.0.1:9", "url": "http://127.0.0.1:9/other"},  # same name, another URL
            ],
            "derive": {"window": "10m"},
        }
    )
    changes, to_close = sidecar.apply(b, sidecar.extenders)
    assert sidecar.states[0] is kept and kept.errors["refused"] == 7 and kept.target.timeout_s == 0.5
    assert kept.history_s == 600.0
    assert sidecar.states[1] is not replaced and sidecar.states[1].target.url.endswith("/other")
    assert (changes.kept, changes.added, changes.removed, changes.reconnected) == (
        ("a",),
        ("127.0.0.1:9",),
        ("127.0.0.1:9",),
        ("a",),
    )
    assert len(to_close) == 2  # a's old pool and the replaced target's

    async def close() -> None:
        for c in to_close:
            await c.aclose()
        await sidecar.aclose()

    asyncio.run(close())


def test_the_reloader_refuses_what_needs_a_restart_and_reads_files_by_content(tmp_path):
    path = tmp_path / "sidecar.yaml"
    path.write_text("targets: ['http://127.0.0.1:9/metrics']\n")
    config = build_config({"targets": ["http://127.0.0.1:9/metrics"]})
    applied = []

    async def apply(c: Config, w: WebConfig) -> str:
        applied.append(c)
        return "ok"

    def load() -> Config:
        return build_config({"targets": ["http://127.0.0.1:9/metrics"], "history": {"path": str(tmp_path / "h")}})

    async def run() -> tuple[bool, str]:
        reloader = Reloader(Sources(load=load, load_web=WebConfig, watched=(str(path),)), config, WebConfig(), apply)
        return await reloader.reload("test")

    ok, message = asyncio.run(run())
    assert not ok and message.startswith("1 problem: history.path: changed from None to") and not applied
    before = fingerprint(str(path))
    path.write_text("targets: ['http://127.0.0.1:9/metrics']\n")  # rewritten, the same content
    assert fingerprint(str(path)) == before
    assert fingerprint(str(tmp_path)) == "not a regular file" and fingerprint(str(tmp_path / "no")).startswith("unread")


def test_the_reload_series_are_exported_only_where_reloads_happen():
    collector = SidecarCollector([], staleness_s=60.0)
    names = {f.name for f in collector.collect()}
    assert "kvcache_sidecar_build_info" in names and not names & {n.removesuffix("_total") for n in RELOAD_SERIES}
    collector.reload_status = lambda: ReloadStatus(successful=False, last_success_s=5.0, successes=2, failures=1)
    exported = {(s.name, s.labels.get("result")): s.value for f in collector.collect() for s in f.samples}
    assert exported[("kvcache_sidecar_config_last_reload_successful", None)] == 0.0
    assert exported[("kvcache_sidecar_config_reloads_total", "failure")] == 1.0
    assert exported[("kvcache_sidecar_config_last_reload_success_timestamp_seconds", None)] == 5.0


def test_a_rebuilt_layer_may_take_over_its_predecessors_state_for_the_kept_targets():
    """The ``adopt(previous, keep)`` hook of a layer (sidecar.daemon._adopt): kept targets' engines only."""

    class Layer:
        def __init__(self, series: dict[tuple[str, str, str], list[float]]):
            self.series = series

        def adopt(self, previous: Layer, keep: Callable[[tuple[str, str, str]], bool]) -> None:
            self.series.update((k, v) for k, v in previous.series.items() if keep(k))

    old = Layer({("kept", "m", "0"): [1.0], ("gone", "m", "0"): [2.0]})
    new = Layer({})
    _adopt((new,), (old,), {"kept"})  # type: ignore[arg-type]
    assert new.series == {("kept", "m", "0"): [1.0]}


def test_a_file_caught_empty_or_partial_is_refused_never_read_as_the_defaults(tmp_path):
    """An editor or a ConfigMap update leaves the file empty (or half written) for a moment: the watcher
    must refuse it, not scrape the default 127.0.0.1:8000 and then re-add the real target afresh."""
    down = f"http://127.0.0.1:{free_port()}/metrics"
    config = tmp_path / "sidecar.yaml"
    whole = config_text({"down": down})
    config.write_text(whole)
    d = Daemon(tmp_path, config, "--config.auto-reload-interval", "100ms")
    try:
        d.wait_for("a scrape", lambda p: value(p, "kvcache_sidecar_target_up", target="down") == 0.0)
        config.write_text("")  # caught mid-rewrite
        d.wait_for("the empty file refused", lambda p: d.reloads(p)[1] == 1.0)
        config.write_text("# being written\n")  # comments only: YAML's null, as empty
        r = httpx.post(d.base + "/-/reload")
        assert r.status_code == 500 and "the file is empty" in r.text
        config.write_text(whole.split("targets:")[0] + "scrape: {interval: 200ms}\n")  # the head of a file, no targets
        r = httpx.post(d.base + "/-/reload")
        assert r.status_code == 500 and "targets: missing" in r.text
        page = d.page()
        assert {dict(k[1]).get("target") for k in page if k[0] == "kvcache_sidecar_target_up"} == {"down"}
        before = value(page, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0
        config.write_text(whole)  # the whole file again: equal to the running one, nothing restarts
        page = d.wait_for("the whole file read again", lambda p: d.reloads(p)[0] == 1.0)
        assert (value(page, "kvcache_sidecar_scrape_errors_total", target="down", reason="refused") or 0) >= before
        assert "127.0.0.1:8000" not in d.logs()
        assert any("the file is empty" in line and "reload refused" in line for line in d.logs().splitlines())
        assert d.stop() == 0
    finally:
        d.procs.stop()


def test_a_reconnecting_reload_keeps_the_read_still_running_on_a_reader_thread():
    """A reload that changes only a target's connection settings keeps its parser; the page a reader thread
    is still reading past its deadline stays the target's, so its next page is refused (parse_timeout)
    rather than read beside it with the same parser (a reconnecting reload used to drop the slot)."""
    import threading

    from sidecar.page_readers import PageRead
    from sidecar.reasons import ScrapeFailed

    a = build_config({"targets": [{"name": "a", "url": "http://127.0.0.1:9/a"}]})
    sidecar = Sidecar(a, ())
    state = sidecar.states[0]

    async def scenario() -> None:
        still_running = PageRead(lambda: None, asyncio.get_running_loop())  # never run: its thread "still runs"
        sidecar._targets["a"].reading = still_running
        b = build_config({"targets": [{"name": "a", "url": "http://127.0.0.1:9/a", "timeout": "500ms"}]})
        changes, to_close = sidecar.apply(b, ())
        assert changes.reconnected == ("a",)
        rt = sidecar._targets["a"]
        assert rt.reading is still_running
        with pytest.raises(ScrapeFailed) as refused:
            await sidecar.read_within(state, rt, b"vllm:num_requests_running 1\n", 1.0)
        assert refused.value.reason == "parse_timeout" and refused.value.field == "previous"
        still_running.finished.set()  # the thread ends: the next page is read again
        assert isinstance(still_running.finished, threading.Event)
        for c in to_close:
            await c.aclose()
        await sidecar.aclose()

    asyncio.run(scenario())


def test_a_page_read_while_a_reload_replaces_its_target_is_not_recorded(monkeypatch):
    """A reload that replaces a target (here: its engine, auto -> sglang) while the target's page is being
    read: the read's result is dropped, so the running layers, which forgot the old target's engines, are
    not handed its sample again under the same (target, model, engine) key."""
    from fixtures import CPU_032

    from sidecar import scrape_loop
    from sidecar.scrape import Fetched

    body = (CPU_032 / "gqa-6mib_full-a.txt").read_bytes()
    seen: list[tuple[str, str, str]] = []

    class Layer:
        def __call__(self, step):
            seen.append(step.key)
            return {}

        def forget(self, key):
            pass

    layers = (Layer(),)
    a = build_config({"targets": [{"name": "a", "url": "http://127.0.0.1:9/a"}]})
    b = build_config({"targets": [{"name": "a", "url": "http://127.0.0.1:9/a", "engine": "sglang"}]})
    sidecar = Sidecar(a, layers)
    old = sidecar.states[0]

    async def fetched(client, target):
        return Fetched(body=body, duration_s=0.0, simulated_time=None)

    async def read_during_a_reload(state, rt, page, deadline_s):
        scrape = sidecar.read_body(state, page)
        sidecar.apply(b, layers)  # the reload lands while the page is read
        return scrape

    monkeypatch.setattr(scrape_loop, "fetch", fetched)
    monkeypatch.setattr(sidecar, "read_within", read_during_a_reload)

    async def scenario() -> None:
        await sidecar.scrape_once(old)
        await sidecar.aclose()

    asyncio.run(scenario())
    assert sidecar.states[0] is not old
    assert seen == []  # nothing recorded for the replaced state
    assert not old.snapshot.up and not old.history and not any(old.errors.values())
