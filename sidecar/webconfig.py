"""``--web.config.file``: TLS, client certificates, basic auth and response headers of the sidecar's endpoint.

The file has the format of the Prometheus exporter toolkit, so an exporter's web configuration works
here as it is (docs/security.md). It is read and validated whole at start-up and at every reload,
every problem at once (:func:`load_web_config` raises :class:`~sidecar.config.ConfigError` naming the
file and the field): unknown keys, a value that is not a bcrypt hash, a certificate or key that cannot
be read or do not belong together, a client-certificate policy without the CA that verifies it.
Relative paths are relative to the file's own folder, as in the toolkit.

What serves with it:

* :class:`TLSCertificates`: the current ``ssl.SSLContext``. Before each new connection it compares the
  certificate, key and CA files' identity (device, inode, size, mtime: a Kubernetes Secret is swapped
  by renaming a symlink, so the inode changes) with the loaded one and builds a new context when they
  changed; a pair that does not load (the key written after the certificate, a truncated file) keeps
  the old context, is logged once per distinct failure, and is tried again when the files change again.
* :class:`BasicAuth`: ``Authorization: Basic`` against bcrypt hashes. A success is remembered for
  :data:`AUTH_CACHE_S` after its last use under a keyed digest of the credentials (never the password
  itself), so a scrape every few seconds costs a dictionary look-up, answered without waiting behind
  any bcrypt check (:meth:`BasicAuth.cached`). Credentials not remembered are checked one at a time
  (each check costs tens of milliseconds of CPU by design), at most :data:`AUTH_CHECKS_PENDING` waiting
  (then ``429`` at once), and a client with :data:`AUTH_FAILURES_PER_CLIENT` failures within
  :data:`AUTH_FAILURE_WINDOW_S` gets ``429`` at once until the window passes: a flood of wrong passwords
  costs one core at most and never delays a scrape whose credentials are remembered. An unknown user is
  checked against a fixed hash of cost 10 (as the exporter toolkit does, ``web/handler.go``
  ``ServeHTTP``), so its timing tells little and its cost is bounded whatever the users' hashes. A hash
  above :data:`MAX_BCRYPT_COST` is refused at load.
* :class:`Serving`: the two and the extra headers, as the HTTP server uses them; replaced whole at a reload.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from . import input_files
from .config import ConfigError, did_you_mean, read_yaml

log = logging.getLogger("kv_sidecar.web")

#: How long a client may take to finish the TLS handshake before its connection is closed, so that a
#: client that never speaks TLS cannot hold one of the server's threads.
HANDSHAKE_TIMEOUT_S = 10.0
#: How long a successful basic-auth check is remembered (longer than any usual scrape interval, so a
#: Prometheus scraping every 15-60 s pays one bcrypt check per period, not one per scrape).
AUTH_CACHE_S = 300.0
#: Successful checks remembered at most (a few users, each with one password, in practice).
AUTH_CACHE_SIZE = 64
#: An ``Authorization`` header longer than this is refused unread.
MAX_AUTHORIZATION_BYTES = 4096
#: The highest bcrypt cost a hash may have. The exporter toolkit accepts what Go's bcrypt accepts, 4 to
#: 31 (``web/handler.go`` ``validateUsers`` calls ``bcrypt.Cost``; golang.org/x/crypto/bcrypt ``MaxCost``
#: is 31), but each step doubles a check's CPU: cost 10 takes about 80 ms here, 14 about 1.3 s, 31 days.
#: Above this the file is refused (one field, naming the limit), so a check always ends in seconds.
MAX_BCRYPT_COST = 14
#: Credentials not remembered, being checked or waiting for a check at once; more get a 429 at once.
AUTH_CHECKS_PENDING = 4
#: Failed checks a client (by IP address) may have within :data:`AUTH_FAILURE_WINDOW_S`; past them its
#: unremembered credentials get a 429 at once, without a check, until the window passes.
AUTH_FAILURES_PER_CLIENT = 5
AUTH_FAILURE_WINDOW_S = 60.0
#: Clients whose failures are remembered at most (the oldest is forgotten first).
AUTH_FAILURE_CLIENTS = 4096
#: The hash an unknown user's password is checked against: bcrypt of a random password at cost 10, so
#: that the check costs what a documented hash costs (the toolkit's ``ServeHTTP`` does the same).
DECOY_HASH = b"$2b$10$FDDlmX.BBBOiPJczrRPTkecPzPNV18Pn77uN8ruHr0gL3U8Z.4Jzi"

#: client_auth_type -> what Python's ssl does with the client's certificate.
CLIENT_AUTH_TYPES: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
#: The toolkit's policies that accept a client certificate without verifying it: Python's ssl verifies
#: every certificate it asks for, so they cannot be honoured (and the toolkit itself calls them insecure).
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: cipher_suites (Go's names, as the toolkit takes them) -> OpenSSL's names. They apply up to TLS 1.2;
#: TLS 1.3 suites are not configurable (in Go either).
CIPHER_SUITES: dict[str, str] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
#: Response headers the file may set, with the values allowed when they are an enumeration (the toolkit's list).
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

_SECTIONS = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
)
_HTTP_KEYS = ("headers", "http2")
#: Fields of the toolkit's format that have no faithful equivalent here: field -> why, and what to do.
UNSUPPORTED: dict[str, str] = {
    "rate_limit": "not supported by kv-sidecar; limit the rate in front of it (NetworkPolicy, a proxy) and remove it",
    "tls_server_config.cert": "inline certificates are not supported (Python's ssl loads them from files); "
    "put it in a file and use cert_file",
    "tls_server_config.key": "inline keys are not supported (Python's ssl loads them from files); "
    "put it in a file (mode 0600) and use key_file",
    "tls_server_config.curve_preferences": "not supported (Python's ssl cannot set a list of curves); remove it, "
    "OpenSSL's defaults (X25519, P-256, P-384, ...) apply",
}
#: ``$2a$``, ``$2b$``, ``$2x$`` or ``$2y$``, a two-digit cost, 22 characters of salt and 31 of hash.
_BCRYPT = re.compile(r"^\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}$")
_HASH_FIX = "make one with: htpasswd -nBC 10 '' | tr -d ':\\n' (more in docs/security.md)"


@dataclass(frozen=True)
class TLSSettings:
    """``tls_server_config``, with its paths made absolute."""

    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca: str | None = None  # inline PEM
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @property
    def files(self) -> tuple[str, ...]:
        """The files the context is built from (watched for rotation)."""
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())


@dataclass(frozen=True)
class WebConfig:
    """The validated web configuration; the default (no file) serves plain HTTP to anyone."""

    path: str | None = None
    tls: TLSSettings | None = None
    headers: tuple[tuple[str, str], ...] = ()
    #: user -> bcrypt hash; empty = no authentication
    users: tuple[tuple[str, bytes], ...] = ()
    http2: bool = True  # accepted for compatibility; the sidecar speaks HTTP/1.x only

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


# ----------------------------------------------------------------------------- reading the file


def load_web_config(path: str | None) -> WebConfig:
    """The web configuration in ``path`` (None: plain HTTP, no authentication), validated whole.

    Raises :class:`ConfigError` listing every problem, each ``field: problem (fix)``; the certificate,
    key and CA files are loaded as the server will load them.
    """
    if path is None:
        return WebConfig()
    data = read_yaml(path, sections=_SECTIONS)
    problems: list[str] = []
    base = Path(path).parent
    for key in data:
        if str(key) in UNSUPPORTED:
            problems.append(f"{key}: {UNSUPPORTED[str(key)]}")
        elif key not in _SECTIONS:
            problems.append(f"{key}: unknown field{did_you_mean(str(key), _SECTIONS)}")
    tls = _tls(_mapping(data, "tls_server_config", problems), base, problems)
    headers, http2 = _http(_mapping(data, "http_server_config", problems), problems)
    users = _users(data.get("basic_auth_users"), problems)
    if tls is not None and tls.cert_file and tls.key_file:
        problems.extend(certificate_problems(tls))
    if problems:
        raise ConfigError(problems, path)
    return WebConfig(path=path, tls=tls, headers=headers, users=users, http2=http2)


def _mapping(data: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{name}: must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _check_keys(section: str, mapping: Mapping[str, Any], allowed: tuple[str, ...], problems: list[str]) -> None:
    for key in mapping:
        path = f"{section}.{key}"
        if path in UNSUPPORTED:
            problems.append(f"{path}: {UNSUPPORTED[path]}")
        elif key not in allowed:
            problems.append(f"{path}: unknown field{did_you_mean(str(key), allowed)}")


def _text(mapping: Mapping[str, Any], section: str, key: str, problems: list[str]) -> str | None:
    value = mapping.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.append(f"{section}.{key}: must be a string, got {type(value).__name__}")
        return None
    return value


def _strings(mapping: Mapping[str, Any], section: str, key: str, problems: list[str]) -> tuple[str, ...]:
    value = mapping.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{section}.{key}: must be a list of strings")
        return ()
    return tuple(value)


def _tls(raw: Mapping[str, Any], base: Path, problems: list[str]) -> TLSSettings | None:
    """``tls_server_config`` (None when absent or empty: plain HTTP).

    A field with a problem takes its default in the result, so that the files can still be checked in
    the same pass (the problems stop the load anyway).
    """
    if not raw:
        return None
    s = "tls_server_config"
    _check_keys(s, raw, _TLS_KEYS, problems)

    def path_of(key: str) -> str | None:
        value = _text(raw, s, key, problems)
        return None if value is None else str(base / value)  # an absolute value stays as it is

    cert, key, ca_file = path_of("cert_file"), path_of("key_file"), path_of("client_ca_file")
    if cert is None:
        problems.append(f"{s}.cert_file: missing (the server's certificate, PEM, e.g. /etc/kv-sidecar/tls/tls.crt)")
    if key is None:
        problems.append(f"{s}.key_file: missing (the certificate's private key, PEM, e.g. /etc/kv-sidecar/tls/tls.key)")
    ca_inline = _text(raw, s, "client_ca", problems)
    if ca_file and ca_inline:
        problems.append(f"{s}.client_ca: give client_ca_file or client_ca, not both")
    auth = _client_auth(raw, ca_file or ca_inline, problems)
    sans = _strings(raw, s, "client_allowed_sans", problems)
    if sans and CLIENT_AUTH_TYPES[auth] == ssl.CERT_NONE:
        problems.append(
            f"{s}.client_allowed_sans: needs client certificates (set client_auth_type: RequireAndVerifyClientCert)"
        )
    low = _version(raw, "min_version", "TLS12", problems)
    high = _version(raw, "max_version", "TLS13", problems)
    if TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        problems.append(f"{s}.min_version: {low} is above max_version {high}")
        low, high = "TLS12", "TLS13"
    ciphers = _strings(raw, s, "cipher_suites", problems)
    for i, name in enumerate(ciphers):
        if name not in CIPHER_SUITES:
            problems.append(
                f"{s}.cipher_suites[{i}]: {name!r} is not a supported suite{did_you_mean(name, tuple(CIPHER_SUITES))}"
            )
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append(f"{s}.prefer_server_cipher_suites: must be true or false, got {prefer!r}")
    return TLSSettings(
        cert_file=cert or "",
        key_file=key or "",
        client_auth_type=auth,
        client_ca_file=ca_file,
        client_ca=None if ca_file else ca_inline,
        client_allowed_sans=sans,
        min_version=low,
        max_version=high,
        cipher_suites=tuple(c for c in ciphers if c in CIPHER_SUITES),
        prefer_server_cipher_suites=prefer if isinstance(prefer, bool) else True,
    )


def _client_auth(raw: Mapping[str, Any], ca: str | None, problems: list[str]) -> str:
    """The client-certificate policy (NoClientCert when the value has a problem)."""
    s = "tls_server_config.client_auth_type"
    auth = _text(raw, "tls_server_config", "client_auth_type", problems) or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        problems.append(
            f"{s}: {auth} accepts certificates nobody verified, which Python's ssl cannot do; "
            "use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"
        )
    elif auth not in CLIENT_AUTH_TYPES:
        problems.append(f"{s}: {auth!r} is not a policy{did_you_mean(auth, tuple(CLIENT_AUTH_TYPES))}")
    elif CLIENT_AUTH_TYPES[auth] != ssl.CERT_NONE and not ca:
        problems.append(f"{s}: {auth} needs the CA that signs the client certificates (set client_ca_file)")
    elif CLIENT_AUTH_TYPES[auth] == ssl.CERT_NONE and ca:
        problems.append(
            f"{s}: a client CA is set but {auth} asks for no client certificate "
            "(set RequireAndVerifyClientCert, or remove the CA)"
        )
    else:
        return auth
    return "NoClientCert"


def _version(raw: Mapping[str, Any], key: str, default: str, problems: list[str]) -> str:
    """A TLS version's name (``default`` when the value is not one)."""
    value = raw.get(key, default)
    if value not in TLS_VERSIONS:
        problems.append(f"tls_server_config.{key}: {value!r} is not a TLS version (one of {', '.join(TLS_VERSIONS)})")
        return default
    return str(value)


def _http(raw: Mapping[str, Any], problems: list[str]) -> tuple[tuple[tuple[str, str], ...], bool]:
    s = "http_server_config"
    _check_keys(s, raw, _HTTP_KEYS, problems)
    http2 = raw.get("http2", True)
    if not isinstance(http2, bool):
        problems.append(f"{s}.http2: must be true or false, got {http2!r}")
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        problems.append(f"{s}.headers: must be a mapping of header names to values")
        return (), True
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        where = f"{s}.headers.{name}"
        if name not in HEADERS:
            problems.append(f"{where}: this header cannot be set{did_you_mean(str(name), tuple(HEADERS))}")
        elif not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            problems.append(f"{where}: must be a one-line string")
        elif HEADERS[name] and value not in HEADERS[name]:
            problems.append(f"{where}: {value!r} is not allowed (one of {', '.join(HEADERS[name])})")
        elif value:  # blank = unset, as in the toolkit
            out.append((name, value))
    return tuple(out), bool(http2)


def _users(raw: Any, problems: list[str]) -> tuple[tuple[str, bytes], ...]:
    """``basic_auth_users``: user -> bcrypt hash. A bad value is never echoed (it may be a plain password)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append("basic_auth_users: must be a mapping of user names to bcrypt hashes")
        return ()
    out: list[tuple[str, bytes]] = []
    for user, hashed in raw.items():
        where = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"basic_auth_users: {str(user)!r} is not a user name (a non-empty string without ':')")
        elif not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            problems.append(f"{where}: not a bcrypt hash (it starts with $2y$, $2b$ or $2a$ and the cost); {_HASH_FIX}")
        elif not 4 <= int(hashed[4:6]) <= MAX_BCRYPT_COST:
            problems.append(
                f"{where}: bcrypt cost {hashed[4:6]} is outside 4-{MAX_BCRYPT_COST} (the exporter toolkit takes "
                f"up to 31, but one check above {MAX_BCRYPT_COST} holds a core for seconds to days); {_HASH_FIX}"
            )
        else:
            out.append((user, hashed.encode("ascii")))
    return tuple(out)


# ----------------------------------------------------------------------------- TLS


class _NoPassword(Exception):
    pass


def _no_password() -> bytes:
    """Called by OpenSSL only when the key is encrypted: refuse instead of prompting on a terminal."""
    raise _NoPassword


#: The largest certificate, key or CA bundle read (a CA bundle of every public root is about 250 KiB).
PEM_MAX_BYTES = 4 << 20


def _readable(path: str) -> str | None:
    """Why ``path`` cannot be read (None when it can): a regular file of at most :data:`PEM_MAX_BYTES`,
    checked without blocking (OpenSSL, which reads it next, would wait on a FIFO forever)."""
    try:
        input_files.read_bytes(path, max_bytes=PEM_MAX_BYTES, what="a PEM file")
    except input_files.FileProblem as e:
        return e.reason
    return None


def certificate_problems(tls: TLSSettings) -> list[str]:
    """What keeps ``tls``'s files from making a context, each naming the field; [] when they load."""
    try:
        build_context(tls)
    except ConfigError as e:
        return e.problems
    return []


def build_context(tls: TLSSettings) -> ssl.SSLContext:
    """A server ``SSLContext`` from the files of ``tls``; raises :class:`ConfigError` naming the field."""
    s = "tls_server_config"
    problems = [
        f"{s}.{key}: cannot read {path!r}: {why} (check the path and that the sidecar's user may read it)"
        for key, path in (
            ("cert_file", tls.cert_file),
            ("key_file", tls.key_file),
            ("client_ca_file", tls.client_ca_file),
        )
        if path is not None and (why := _readable(path)) is not None
    ]
    if problems:
        raise ConfigError(problems, "tls")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.cipher_suites:
        try:
            ctx.set_ciphers(":".join(CIPHER_SUITES[name] for name in tls.cipher_suites))
        except ssl.SSLError:
            raise ConfigError(
                ["tls_server_config.cipher_suites: none of them is available in this OpenSSL"], "tls"
            ) from None
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_no_password)
    except _NoPassword:
        raise ConfigError(
            [f"{s}.key_file: the key is encrypted; give an unencrypted key (openssl pkey -in KEY -out KEY.plain)"],
            "tls",
        ) from None
    except ssl.SSLError as e:
        raise ConfigError([_pair_problem(tls, e)], "tls") from None
    ctx.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    if tls.client_ca_file or tls.client_ca:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca)
        except (ssl.SSLError, ValueError):
            field_name = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise ConfigError(
                [f"{s}.{field_name}: no PEM certificate in it (the CA of the client certificates)"], "tls"
            ) from None
    return ctx


def _pair_problem(tls: TLSSettings, error: ssl.SSLError) -> str:
    """Which of cert_file and key_file is wrong, from OpenSSL's error."""
    s = "tls_server_config"
    if "KEY_VALUES_MISMATCH" in str(error):
        return (
            f"{s}.key_file: {tls.key_file!r} is not the key of the certificate in cert_file {tls.cert_file!r} "
            "(give the key the certificate was made with)"
        )
    try:
        ssl.create_default_context(cafile=tls.cert_file)  # parses the certificates alone
    except ssl.SSLError:
        return f"{s}.cert_file: no PEM certificate in {tls.cert_file!r}"
    return f"{s}.key_file: no PEM private key in {tls.key_file!r}"


def _identity(paths: tuple[str, ...]) -> tuple[tuple[int, int, int, int] | None, ...]:
    """Each file's (device, inode, size, mtime), following symlinks; None for a file that is gone."""
    out: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class TLSCertificates:
    """The server's current ``SSLContext``, rebuilt when its files change (checked before each connection)."""

    def __init__(self, tls: TLSSettings):
        self.settings = tls
        self._seen = _identity(tls.files)
        self._context = build_context(tls)
        self._lock = threading.Lock()
        self._last_failure: str | None = None

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: the files' new pair when they changed and load, else the old one."""
        identity = _identity(self.settings.files)
        if identity == self._seen:
            return self._context
        with self._lock:
            if identity == self._seen:
                return self._context
            self._seen = identity  # a pair that fails is tried again when the files change again, not per connection
            try:
                self._context = build_context(self.settings)
            except ConfigError as e:
                message = "; ".join(e.problems)
                if message != self._last_failure:
                    log.warning("TLS certificate not reloaded, the previous one stays in use: %s", message)
                self._last_failure = message
            else:
                self._last_failure = None
                log.info("TLS certificate reloaded cert_file=%s", self.settings.cert_file)
            return self._context

    def allows(self, peer_certificate: Mapping[str, Any] | None) -> bool:
        """Whether a verified client certificate passes ``client_allowed_sans`` (always, without it)."""
        allowed = self.settings.client_allowed_sans
        return not allowed or _allowed(peer_certificate or {}, allowed)


def _allowed(cert: Mapping[str, Any], allowed: tuple[str, ...]) -> bool:
    """True when one of the certificate's subject alternative names (DNS, IP, e-mail, URI) is in ``allowed``."""
    ips = set()
    for a in allowed:
        try:
            ips.add(ipaddress.ip_address(a))
        except ValueError:
            pass
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                if ipaddress.ip_address(value.strip()) in ips:
                    return True
            except ValueError:
                continue
        elif value in allowed:
            return True
    return False


# ----------------------------------------------------------------------------- basic auth


class BasicAuth:
    """``Authorization: Basic`` against the bcrypt hashes of ``basic_auth_users``.

    The endpoint asks :meth:`cached` on its loop (no bcrypt), then, for credentials it does not
    remember, :meth:`blocked` and :meth:`check` (on a thread of its own) and :meth:`failed`.
    """

    def __init__(self, users: tuple[tuple[str, bytes], ...]):
        self._users = dict(users)
        self._key = secrets.token_bytes(32)  # the cache's digests mean nothing outside this process
        self._cache: dict[bytes, float] = {}  # digest of (user, password) -> monotonic expiry
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # one check at a time: a flood of bad passwords takes one core
        self._failures: dict[str, list[float]] = {}  # client -> monotonic times of its recent failures
        self.checks = 0  # bcrypt checks run (the cache's misses)

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()

    def cached(self, authorization: str | None) -> bool | None:
        """True: credentials remembered as good (their expiry is pushed back); False: refused without a
        check (absent or malformed); None: a bcrypt check must decide. Costs one HMAC."""
        credentials = _credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        if user not in self._users:
            return None
        digest = self._digest(user, password)
        now = time.monotonic()
        with self._cache_lock:
            if self._cache.get(digest, 0.0) > now:
                self._cache[digest] = now + AUTH_CACHE_S
                return True
        return None

    def check(self, authorization: str | None) -> bool:
        """A bcrypt check (one at a time); a success is remembered."""
        credentials = _credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        with self._bcrypt_lock:
            self.checks += 1
            try:
                ok = bcrypt.checkpw(password, hashed if hashed is not None else DECOY_HASH)
            except ValueError:  # longer than bcrypt's 72 bytes: no stored password can match
                ok = False
        if not ok or hashed is None:
            return False
        now = time.monotonic()
        with self._cache_lock:
            if len(self._cache) >= AUTH_CACHE_SIZE:
                for key in [k for k, expiry in self._cache.items() if expiry <= now] or [next(iter(self._cache))]:
                    del self._cache[key]
            self._cache[self._digest(user, password)] = now + AUTH_CACHE_S
        return True

    def allows(self, authorization: str | None) -> bool:
        """Remembered, or checked now (the two steps the endpoint takes separately)."""
        verdict = self.cached(authorization)
        return verdict if verdict is not None else self.check(authorization)

    def blocked(self, client: str) -> bool:
        """Whether ``client`` used up its failures within the window (then its checks are refused unrun)."""
        recent = self._failures.get(client)
        if not recent:
            return False
        horizon = time.monotonic() - AUTH_FAILURE_WINDOW_S
        recent[:] = [t for t in recent if t > horizon]
        if not recent:
            del self._failures[client]
        return len(recent) >= AUTH_FAILURES_PER_CLIENT

    def failed(self, client: str) -> None:
        """Count a failed check of ``client``'s (the oldest client is forgotten past the bound)."""
        recent = self._failures.pop(client, [])
        recent.append(time.monotonic())
        self._failures[client] = recent[-AUTH_FAILURES_PER_CLIENT:]  # newest last: the dict's order is recency
        while len(self._failures) > AUTH_FAILURE_CLIENTS:
            del self._failures[next(iter(self._failures))]


def _credentials(authorization: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a ``Basic`` header (RFC 7617, UTF-8), None when absent or malformed."""
    if not authorization or len(authorization) > MAX_AUTHORIZATION_BYTES:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except (ValueError, UnicodeDecodeError):
        return None


# ----------------------------------------------------------------------------- what the server uses


@dataclass(frozen=True)
class Serving:
    """What the HTTP server applies to each connection and request; replaced whole at a reload."""

    config: WebConfig = field(default_factory=WebConfig)
    tls: TLSCertificates | None = None
    auth: BasicAuth | None = None

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        return self.config.headers


def serving(web: WebConfig, previous: Serving | None = None) -> Serving:
    """What to serve with ``web``. The TLS state of ``previous`` is kept when its settings are the same (a
    reload that changed nothing else does not reload the certificate); the auth cache starts afresh when
    the users change."""
    tls = None
    if web.tls is not None:
        if previous is not None and previous.tls is not None and previous.tls.settings == web.tls:
            tls = previous.tls
        else:
            tls = TLSCertificates(web.tls)
    auth = None
    if web.users:
        kept = previous.auth if previous is not None and previous.config.users == web.users else None
        auth = kept or BasicAuth(web.users)
    return Serving(config=web, tls=tls, auth=auth)
