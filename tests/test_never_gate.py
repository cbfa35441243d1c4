"""``kv-sidecar run`` never stops on a bad configuration file or a model not there yet (docs/kubernetes.md,
"Never gate vLLM"): it serves, says what is wrong in a gauge and a log line, and picks up the fixed file.
``check-config`` still exits 2 on a bad file, and passes a model path that is not there yet, as ``run`` does.
"""

from __future__ import annotations

import subprocess
import time

from fixtures import TINY_LLAMA_CONFIG
from processes import free_port, http_get, kv_sidecar


def metric(body: bytes, line_start: str) -> float | None:
    for line in body.decode().splitlines():
        if line.startswith(line_start + " ") or line.startswith(line_start + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(url: str, what: str, check, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    body = b""
    while time.monotonic() < deadline:
        status, body = http_get(url)
        if status == 200 and check(body):
            return body
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s; last /metrics:\n{body.decode()[-2000:]}")


def test_a_bad_file_at_start_is_served_around_reported_and_picked_up_once_fixed(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("scrape: {interval: soon}\n")  # what a bad ConfigMap edit leaves for the next pod
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [*kv_sidecar(), "run", "--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv + ["--config.auto-reload-interval", "200ms"], stderr=subprocess.PIPE, text=True)
    try:
        body = wait_for(url, "served on the built-in configuration", lambda b: b"reload_successful" in b)
        assert metric(body, "kvcache_sidecar_config_last_reload_successful") == 0.0
        assert b'target="127.0.0.1:8000"' in body  # vLLM in the same pod, the built-in target
        assert proc.poll() is None  # still running: nothing for Kubernetes to restart
        config.write_text(f"scrape: {{interval: 1s}}\ntargets: ['http://127.0.0.1:{free_port()}/metrics']\n")
        body = wait_for(
            url, "the fixed file", lambda b: metric(b, "kvcache_sidecar_config_last_reload_successful") == 1.0
        )
        assert b'target="127.0.0.1:8000"' not in body  # the file's target now
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count("not a duration: 'soon'") == 1  # said once, not at every read
    assert "not stopping: serving the built-in configuration until the file is fixed" in err
    assert "the configuration file is fixed; serving it" in err and "Traceback" not in err


def test_check_config_exits_2_on_a_bad_file_and_passes_a_model_not_there_yet(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scrape: {interval: soon}\n")
    r = subprocess.run([*kv_sidecar(), "check-config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "scrape.interval: not a duration: 'soon'" in r.stderr
    downloading = tmp_path / "downloading"
    good = tmp_path / "good.yaml"
    good.write_text(f"model: {{config: '{downloading}'}}\n")
    r = subprocess.run([*kv_sidecar(), "check-config", str(good)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"note: model.config: {downloading}: no such file yet; `run` serves and waits for it" in r.stdout
    downloading.mkdir()
    (downloading / "config.json").write_text('{"architectures": ["X"], "num_hidden_layers": 1e9}')
    r = subprocess.run([*kv_sidecar(), "check-config", str(good)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2  # once there, its content is checked as strictly as ever
    good.write_text(f"model: {{config: '{TINY_LLAMA_CONFIG}'}}\n")
    r = subprocess.run([*kv_sidecar(), "check-config", str(good)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "note:" not in r.stdout
