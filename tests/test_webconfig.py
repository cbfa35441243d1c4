"""--web.config.file: TLS with rotating certificates, client certificates, basic auth and headers, in the
exporter-toolkit format; a bad file stops the start with exit 2 naming every field at once.

Certificates are made by ``openssl`` (tests/certs.py). The endpoint is the daemon's own server: a real
``kv-sidecar run`` where start-up and rotation matter, ``start_http`` in this process for the TLS edge
cases (timeouts, client certificates).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import httpx
import pytest
from certs import ca, encrypted_key, needs_openssl, self_signed, signed
from processes import Processes, free_port, http_status, kv_sidecar

from sidecar import webconfig
from sidecar.config import ConfigError, load_config
from sidecar.endpoint import start_http
from sidecar.scrape_loop import Sidecar
from sidecar.webconfig import BasicAuth, load_web_config, serving

pytestmark = needs_openssl

PASSWORD = "correct horse"
#: cost 4, the lowest: the tests check behaviour, not bcrypt's price (measured in docs/security.md)
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_web_config(str(path))
    assert e.value.source == str(path)
    return e.value.problems


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def client_context(ca_file: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


# ----------------------------------------------------------------------------- validation


def test_every_problem_of_a_bad_file_is_named_in_one_pass(tmp_path):
    cert, key = self_signed(tmp_path / "tls", "server")
    web = write(
        tmp_path / "web.yml",
        f"""
tls_server_config:
  cert_file: tls/missing.crt
  key_file: {key}
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS14
  curve_preferences: [X25519]
http_server_config:
  headers:
    X-Frame-Options: allow
    Server: mine
basic_auth_users:
  prom: hunter2
  "a:b": {HASH}
tls_sever_config: {{}}
rate_limit: {{burst: 1}}
""",
    )
    problems = problems_of(web)
    text = "\n".join(problems)
    expected = [
        "tls_sever_config: unknown field (did you mean 'tls_server_config'?)",
        "rate_limit: not supported",
        "tls_server_config.curve_preferences: not supported",
        "tls_server_config.client_auth_type: RequireAndVerifyClientCert needs the CA",
        "tls_server_config.min_version: 'TLS14' is not a TLS version",
        "http_server_config.headers.X-Frame-Options: 'allow' is not allowed (one of deny, sameorigin)",
        "http_server_config.headers.Server: this header cannot be set",
        "basic_auth_users.prom: not a bcrypt hash",
        "basic_auth_users: 'a:b' is not a user name",
        f"tls_server_config.cert_file: cannot read {str(tmp_path / 'tls' / 'missing.crt')!r}",
    ]
    for line in expected:
        assert any(p.startswith(line) for p in problems), f"{line!r} not in:\n{text}"
    assert len(problems) == len(expected), text
    assert "hunter2" not in text  # a plain password put where a hash belongs is never echoed


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path):
    cert, _ = self_signed(tmp_path, "a")
    _, other_key = self_signed(tmp_path, "b")
    web = write(tmp_path / "web.yml", f"tls_server_config: {{cert_file: a.crt, key_file: {other_key.name}}}\n")
    (problem,) = problems_of(web)
    assert problem.startswith("tls_server_config.key_file: ") and "is not the key of the certificate" in problem


def test_files_that_hold_no_certificate_or_no_key_name_the_field(tmp_path):
    cert, key = self_signed(tmp_path, "a")
    web = write(tmp_path / "web.yml", "tls_server_config: {cert_file: a.key, key_file: a.key}\n")
    assert problems_of(web) == [f"tls_server_config.cert_file: no PEM certificate in {str(key)!r}"]
    write(web, "tls_server_config: {cert_file: a.crt, key_file: a.crt}\n")
    assert problems_of(web) == [f"tls_server_config.key_file: no PEM private key in {str(cert)!r}"]
    write(web, "tls_server_config: {cert_file: a.crt, key_file: a.key, client_auth_type: "
               "RequireAndVerifyClientCert, client_ca_file: a.key}\n")  # fmt: skip
    assert problems_of(web) == ["tls_server_config.client_ca_file: no PEM certificate in it (the CA of the client "
                                "certificates)"]  # fmt: skip


def test_an_encrypted_key_is_refused_instead_of_prompting_for_its_passphrase(tmp_path):
    encrypted_key(tmp_path, "enc")
    web = write(tmp_path / "web.yml", "tls_server_config: {cert_file: enc.crt, key_file: enc.key}\n")
    (problem,) = problems_of(web)
    assert problem.startswith("tls_server_config.key_file: the key is encrypted")


def test_policies_python_cannot_honour_say_what_to_use_instead(tmp_path):
    self_signed(tmp_path, "a")
    web = write(
        tmp_path / "web.yml",
        "tls_server_config: {cert_file: a.crt, key_file: a.key, client_auth_type: RequireAnyClientCert}\n",
    )
    (problem,) = problems_of(web)
    assert "RequireAndVerifyClientCert" in problem and "client_ca_file" in problem
    write(web, "tls_server_config: {cert_file: a.crt, key_file: a.key, client_ca_file: a.crt}\n")
    (problem,) = problems_of(web)
    assert problem.startswith("tls_server_config.client_auth_type: a client CA is set but NoClientCert")


def test_paths_are_relative_to_the_files_folder_and_a_good_file_loads(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path / "conf" / "tls", "server")
    web = write(
        tmp_path / "conf" / "web.yml",
        f"""
tls_server_config:
  cert_file: tls/server.crt
  key_file: {key}
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]
http_server_config:
  http2: false
  headers: {{X-Content-Type-Options: nosniff, Strict-Transport-Security: max-age=31536000}}
basic_auth_users:
  prom: {HASH}
""",
    )
    monkeypatch.chdir(tmp_path)  # not the file's folder
    loaded = load_web_config(str(web))
    assert loaded.tls is not None and loaded.tls.cert_file == str(cert) and loaded.tls.min_version == "TLS13"
    assert loaded.scheme == "https" and dict(loaded.users) == {"prom": HASH.encode()}
    assert dict(loaded.headers) == {
        "X-Content-Type-Options": "nosniff",
        "Strict-Transport-Security": "max-age=31536000",
    }
    assert load_web_config(str(write(tmp_path / "empty.yml", ""))).scheme == "http"  # an empty file: plain HTTP


# ----------------------------------------------------------------------------- basic auth


def test_basic_auth_accepts_the_password_and_refuses_everything_else():
    auth = BasicAuth((("prom", HASH.encode()), ("grafana", HASH.encode())))
    assert auth.allows(basic("prom", PASSWORD)) and auth.allows(basic("grafana", PASSWORD))
    refused = [
        None,
        "",
        basic("prom", "wrong"),
        basic("nobody", PASSWORD),  # a known password under an unknown name
        basic("prom", PASSWORD + "x" * 80),  # longer than bcrypt's 72 bytes
        "Bearer " + base64.b64encode(f"prom:{PASSWORD}".encode()).decode(),
        "Basic not-base64!",
        "Basic " + base64.b64encode(b"no colon").decode(),
        "Basic " + base64.b64encode(b"prom:\xff\xfe").decode(),
        "Basic " + "A" * 5000,
    ]
    for header in refused:
        assert not auth.allows(header), header


def test_a_success_is_remembered_and_an_unknown_user_costs_a_real_check():
    auth = BasicAuth((("prom", HASH.encode()),))
    assert auth.allows(basic("prom", PASSWORD)) and auth.checks == 1
    for _ in range(5):
        assert auth.allows(basic("prom", PASSWORD))
    assert auth.checks == 1  # remembered: no bcrypt check per scrape
    for _ in range(2):
        assert not auth.allows(basic("prom", "wrong"))
    assert auth.checks == 3  # failures are never remembered
    assert not auth.allows(basic("mallory", PASSWORD))
    assert auth.checks == 4  # an unknown name is checked against a real hash: its timing tells nothing


def test_a_remembered_success_expires(monkeypatch):
    monkeypatch.setattr(webconfig, "AUTH_CACHE_S", 0.0)  # a success is remembered for no time at all ...
    auth = BasicAuth((("prom", HASH.encode()),))
    for _ in range(3):
        assert auth.allows(basic("prom", PASSWORD))
    assert auth.checks == 3  # ... so each request runs bcrypt again


def test_a_hash_above_the_cost_limit_is_refused_naming_the_limit(tmp_path):
    # cost 31 is valid for the exporter toolkit (Go's bcrypt.MaxCost) but one check takes days of CPU:
    # the hash text is built, not computed (bcrypt would take that long to make it too)
    slow = HASH.replace("$04$", "$31$", 1)
    assert HASH.startswith("$2b$04$")
    problems = problems_of(write(tmp_path / "web.yml", f"basic_auth_users: {{prom: '{slow}'}}\n"))
    assert len(problems) == 1 and f"outside 4-{webconfig.MAX_BCRYPT_COST}" in problems[0], problems
    assert slow not in problems[0]  # never echoed
    at_limit = HASH.replace("$04$", f"${webconfig.MAX_BCRYPT_COST}$", 1)
    assert load_web_config(str(write(tmp_path / "ok.yml", f"basic_auth_users: {{prom: '{at_limit}'}}\n"))).users


def test_an_unknown_user_is_checked_against_the_fixed_decoy_not_a_users_hash(monkeypatch):
    seen: list[bytes] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, hashed: seen.append(hashed) or real(pw, hashed))
    slow = bcrypt.hashpw(b"x", bcrypt.gensalt(12))  # a user's hash dearer than the decoy
    auth = BasicAuth((("prom", slow),))
    assert not auth.allows(basic("mallory", PASSWORD))
    assert seen == [webconfig.DECOY_HASH] and webconfig.DECOY_HASH.startswith(b"$2b$10$")
    assert not real(b"", webconfig.DECOY_HASH)  # a real bcrypt hash: the check costs what cost 10 costs


def test_a_remembered_success_is_answered_on_the_spot_and_its_expiry_slides(monkeypatch):
    auth = BasicAuth((("prom", HASH.encode()),))
    assert auth.cached(basic("prom", PASSWORD)) is None  # not known yet: a check must decide
    assert auth.cached(None) is False and auth.cached("Basic !!") is False  # refused without a check
    assert auth.check(basic("prom", PASSWORD))
    monkeypatch.setattr(webconfig, "AUTH_CACHE_S", 0.2)
    for _ in range(4):  # used every 0.1 s: stays remembered past 0.2 s
        assert auth.cached(basic("prom", PASSWORD)) is True
        time.sleep(0.1)
    assert auth.checks == 1


def test_a_clients_failures_are_bounded_then_refused_without_a_check():
    auth = BasicAuth((("prom", HASH.encode()),))
    for _ in range(webconfig.AUTH_FAILURES_PER_CLIENT):
        assert not auth.blocked("10.0.0.9")
        auth.failed("10.0.0.9")
    assert auth.blocked("10.0.0.9") and not auth.blocked("10.0.0.10")
    for i in range(webconfig.AUTH_FAILURE_CLIENTS + 10):  # a spray of addresses: the table stays bounded
        auth.failed(f"fd00::{i:x}")
    assert len(auth._failures) == webconfig.AUTH_FAILURE_CLIENTS


# ----------------------------------------------------------------------------- the server, in this process


@pytest.fixture
def endpoint(tmp_path):
    """start(web_yml_text) -> https base URL of a sidecar endpoint (start_http) serving with that web config."""
    started = []

    def start(text: str) -> str:
        port = free_port()
        config = load_config(
            None, env={}, flags={("web", "listen_address"): f"127.0.0.1:{port}"}, flag_targets=["http://127.0.0.1:9/"]
        )
        sidecar = Sidecar(config)
        web = load_web_config(str(write(tmp_path / "web.yml", text)))
        server = start_http(sidecar, ready=lambda: True, web=serving(web))
        started.append((server, sidecar))
        return f"{web.scheme}://127.0.0.1:{port}"

    start.started = started  # type: ignore[attr-defined]
    yield start
    for server, sidecar in started:
        server.shutdown()
        server.server_close()
        asyncio.run(sidecar.aclose())


def test_client_certificates_are_required_verified_and_matched_to_the_allowed_names(tmp_path, endpoint):
    server_cert, _ = self_signed(tmp_path, "server")
    authority = ca(tmp_path / "ca")
    prometheus = signed(tmp_path / "clients", "prometheus", authority, san="DNS:prometheus.monitoring.svc")
    intruder = signed(tmp_path / "clients", "intruder", authority, san="DNS:intruder")
    stranger = self_signed(tmp_path / "clients", "stranger", san="DNS:prometheus.monitoring.svc")
    url = endpoint(
        f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {authority[0]}
  client_allowed_sans: [prometheus.monitoring.svc]
"""
    )
    with httpx.Client(verify=client_context(server_cert, prometheus)) as c:
        assert c.get(url + "/metrics").status_code == 200
    for who in (None, intruder, stranger):  # no certificate, a SAN not allowed, a CA not trusted
        with httpx.Client(verify=client_context(server_cert, who)) as c, pytest.raises(httpx.TransportError):
            c.get(url + "/metrics")
    with httpx.Client(verify=client_context(server_cert, prometheus)) as c:
        assert c.get(url + "/healthz").status_code == 200  # refused clients cost the server nothing


def test_a_client_that_never_speaks_tls_holds_no_thread_past_the_handshake_timeout(tmp_path, endpoint, monkeypatch):
    server_cert, _ = self_signed(tmp_path, "server")
    monkeypatch.setattr(webconfig, "HANDSHAKE_TIMEOUT_S", 0.5)
    url = endpoint("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    port = int(url.rsplit(":", 1)[1])
    silent = socket.create_connection(("127.0.0.1", port))
    plain = socket.create_connection(("127.0.0.1", port))
    try:
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # HTTP on the HTTPS port
        with httpx.Client(verify=client_context(server_cert)) as c:
            assert c.get(url + "/metrics").status_code == 200  # served meanwhile
        plain.settimeout(5)
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert b"kvcache_" not in answer  # no answer in clear text: an alert or a reset
        silent.settimeout(5)
        start = time.monotonic()
        assert silent.recv(1) == b""  # closed by the server ...
        assert time.monotonic() - start < 3  # ... once the handshake timeout passed
    finally:
        silent.close()
        plain.close()


def test_basic_auth_protects_everything_but_the_probes(tmp_path, endpoint):
    url = endpoint(
        f"basic_auth_users: {{prom: '{HASH}'}}\nhttp_server_config: {{headers: {{X-Frame-Options: deny}}}}\n"
    )
    for path in ("/metrics", "/", "/nope", "/-/reload"):
        r = httpx.get(url + path)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic "), path
        assert r.headers["X-Frame-Options"] == "deny"  # configured headers go on every answer
        assert httpx.get(url + path, auth=("prom", "wrong")).status_code == 401
    assert httpx.post(url + "/-/reload").status_code == 401
    for path in ("/healthz", "/readyz"):
        assert httpx.get(url + path).status_code == 200  # kubelet probes send no credentials
    r = httpx.get(url + "/metrics", auth=("prom", PASSWORD))
    assert r.status_code == 200 and "kvcache_sidecar_target_up" in r.text


def test_wrong_passwords_cannot_hold_back_a_remembered_scrape(tmp_path, endpoint, monkeypatch):
    """Checks that never end (a hash as dear as the toolkit allows) fill the pending bound: the next
    unremembered credentials get a 429 at once, and a scrape with remembered credentials a 200."""
    url = endpoint(f"basic_auth_users: {{prom: '{HASH}'}}\n")
    assert httpx.get(url + "/metrics", auth=("prom", PASSWORD)).status_code == 200  # now remembered
    release = threading.Event()
    real_check = BasicAuth.check
    monkeypatch.setattr(BasicAuth, "check", lambda self, header: release.wait(30) and real_check(self, header))
    pending = ThreadPoolExecutor(webconfig.AUTH_CHECKS_PENDING)
    stuck = [
        pending.submit(httpx.get, url + "/metrics", auth=(f"u{i}", "wrong"), timeout=30)
        for i in range(webconfig.AUTH_CHECKS_PENDING)
    ]
    server = endpoint.started[-1][0]
    try:
        deadline = time.monotonic() + 20
        while server._auth_pending < webconfig.AUTH_CHECKS_PENDING:  # every check taken
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.get(url + "/metrics", auth=("other", "x"))
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        r = httpx.get(url + "/metrics", auth=("prom", PASSWORD), timeout=5)
        assert r.status_code == 200 and "kvcache_sidecar_target_up" in r.text  # not behind the stuck checks
    finally:
        release.set()
        assert all(f.result().status_code == 401 for f in stuck)
        pending.shutdown()


def test_a_client_past_its_failures_gets_429_without_a_bcrypt_check(tmp_path, endpoint):
    url = endpoint(f"basic_auth_users: {{prom: '{HASH}'}}\n")
    for _ in range(webconfig.AUTH_FAILURES_PER_CLIENT):
        assert httpx.get(url + "/metrics", auth=("prom", "wrong")).status_code == 401
    assert httpx.get(url + "/metrics", auth=("prom", "wrong")).status_code == 429
    assert httpx.get(url + "/metrics", auth=("prom", PASSWORD)).status_code == 429  # unremembered: not checked
    assert httpx.get(url + "/healthz").status_code == 200


# ----------------------------------------------------------------------------- kv-sidecar run


def _wait(url: str, ctx: ssl.SSLContext | bool, procs: Processes, **kw: object) -> httpx.Response:
    deadline = time.monotonic() + 30
    while True:
        procs.check_alive()
        try:
            r = httpx.get(url, verify=ctx, timeout=2, **kw)  # type: ignore[arg-type]
            if r.status_code == 200:
                return r
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(procs.logs())
        time.sleep(0.2)


def test_run_serves_https_with_basic_auth_and_open_probes(tmp_path):
    cert, key = self_signed(tmp_path / "tls", "server")
    web = write(
        tmp_path / "web.yml",
        f"tls_server_config: {{cert_file: tls/server.crt, key_file: tls/server.key}}\n"
        f"basic_auth_users: {{prometheus: '{HASH}'}}\n"
        "http_server_config: {headers: {X-Content-Type-Options: nosniff}}\n",
    )
    procs = Processes(tmp_path)
    sim, port = free_port(), free_port()
    ctx = client_context(cert)
    try:
        procs.start("sim", [*kv_sidecar(), "simulate", "--port", str(sim), "--speed", "30"])
        procs.start(
            "sidecar",
            [
                *kv_sidecar(), "run", "--target", f"http://127.0.0.1:{sim}/metrics", "--scrape.interval", "500ms",
                "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
            ],
        )  # fmt: skip
        base = f"https://localhost:{port}"
        assert _wait(base + "/readyz", ctx, procs).text == "ready\n"  # no credentials needed
        assert httpx.get(base + "/healthz", verify=ctx).status_code == 200
        r = httpx.get(base + "/metrics", verify=ctx)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
        assert httpx.get(base + "/metrics", verify=ctx, auth=("prometheus", "nope")).status_code == 401
        deadline = time.monotonic() + 20
        while (
            "kvcache_usage_ratio{"
            not in (r := httpx.get(base + "/metrics", verify=ctx, auth=("prometheus", PASSWORD))).text
        ):
            assert time.monotonic() < deadline, procs.logs()
            time.sleep(0.3)
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert "kvcache_sidecar_config_last_reload_successful 1.0" in r.text
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=3)  # no plain HTTP on the TLS port
        assert "scheme=https auth=basic" in procs.logs("sidecar")
    finally:
        procs.stop()


def test_a_bad_web_config_names_each_field_and_serves_nothing_until_fixed(tmp_path):
    """`run` never exits on it (docs/kubernetes.md, "Never gate vLLM"), and never serves without its TLS or auth."""
    cert, key = self_signed(tmp_path, "a")
    _, other = self_signed(tmp_path, "b")
    web = write(
        tmp_path / "web.yml",
        "tls_server_config: {cert_file: a.crt, key_file: b.key}\nbasic_auth_users: {prom: 'my password'}\n",
    )
    port = free_port()
    run = subprocess.Popen(
        [*kv_sidecar(), "run", "--target", "http://127.0.0.1:9/metrics", "--web.listen-address",
         f"127.0.0.1:{port}", "--web.config.file", str(web), "--config.auto-reload-interval", "200ms"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert run.stderr is not None
    lines = []
    while not (lines and lines[-1].startswith("kv-sidecar: not stopping")):
        lines.append(run.stderr.readline())
        assert lines[-1], "".join(lines)  # exited instead
    time.sleep(1)
    assert run.poll() is None and http_status(f"http://127.0.0.1:{port}/metrics") == 0  # nothing served
    run.terminate()
    err = "".join(lines) + run.communicate(timeout=30)[1]
    assert run.returncode == 0, err
    assert "nothing is served until the file is fixed" in err
    assert f"{web}: tls_server_config.key_file: " in err and "is not the key" in err
    assert f"{web}: basic_auth_users.prom: not a bcrypt hash" in err
    assert "my password" not in err and "Traceback" not in err and "listening" not in err
    assert err.count("basic_auth_users.prom") == 1  # read again every 200ms, reported once
    check = subprocess.run(
        [*kv_sidecar(), "check-config", str(write(tmp_path / "c.yaml", "{}\n")), "--web.config.file", str(web)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert check.returncode == 2 and lines[1:-1] == [line + "\n" for line in check.stderr.splitlines()[1:]]


def _served_certificate(port: int) -> bytes:
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port), timeout=5))


def _der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def _swap(secret: Path, version: str) -> None:
    """A Kubernetes Secret update: a new timestamped folder, then ``..data`` renamed onto it at once."""
    (secret / "..data.tmp").symlink_to(version)
    os.replace(secret / "..data.tmp", secret / "..data")


def test_a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_not(tmp_path):
    """The files are a Secret volume: tls.crt -> ..data/tls.crt, ..data -> the current version's folder."""
    secret = tmp_path / "secret"
    first = self_signed(secret / "..v1", "tls")
    second = self_signed(secret / "..v2", "tls")
    third = self_signed(secret / "..v3", "tls")
    shutil.copy(first[1], secret / "..v3" / "tls.key")  # v3: a certificate with another pair's key
    (secret / "..data").symlink_to("..v1")
    for name in ("tls.crt", "tls.key"):
        (secret / name).symlink_to(f"..data/{name}")
    web = write(
        tmp_path / "web.yml", f"tls_server_config: {{cert_file: {secret}/tls.crt, key_file: {secret}/tls.key}}\n"
    )
    procs = Processes(tmp_path)
    port = free_port()
    try:
        procs.start(
            "sidecar",
            [*kv_sidecar(), "run", "--target", "http://127.0.0.1:9/metrics", "--web.listen-address",
             f"127.0.0.1:{port}", "--web.config.file", str(web)],
        )  # fmt: skip
        _wait(f"https://127.0.0.1:{port}/readyz", False, procs)
        assert _served_certificate(port) == _der(first[0])
        _swap(secret, "..v2")
        assert _served_certificate(port) == _der(second[0])  # the next connection has the new pair
        _swap(secret, "..v3")
        for _ in range(3):
            assert _served_certificate(port) == _der(second[0])  # the broken pair is refused, v2 stays
        assert _der(third[0]) != _der(second[0])
        logs = procs.logs("sidecar")
        assert logs.count("TLS certificate not reloaded") == 1 and "is not the key of the certificate" in logs
        assert logs.count("TLS certificate reloaded") == 1
        procs.procs["sidecar"].send_signal(signal.SIGTERM)
        assert procs.procs["sidecar"].wait(timeout=10) == 0
    finally:
        procs.stop()
