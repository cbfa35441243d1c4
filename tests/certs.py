"""Certificates for the TLS tests, made by the ``openssl`` command (Debian's ``openssl``, which
``ca-certificates`` pulls in): a self-signed server pair, a CA and client pairs it signs.

EC P-256 keys: each pair takes a few milliseconds. Valid for two days, with the SANs the tests connect
with (``localhost``, ``127.0.0.1``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")
#: Outside CI a machine without openssl skips the TLS tests, saying why; CI must run them.
needs_openssl = pytest.mark.skipif(
    OPENSSL is None and not os.environ.get("CI"), reason="the `openssl` command is not installed (apt install openssl)"
)
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run([OPENSSL or "openssl", *args], check=True, capture_output=True, timeout=30)


def self_signed(folder: Path, name: str, san: str = "DNS:localhost,IP:127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) of a new self-signed server certificate in ``folder``; its certificate is its own CA."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req", "-x509", *_KEY, "-keyout", str(key), "-out", str(cert), "-days", "2",
        "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}",
    )  # fmt: skip
    return cert, key


def ca(folder: Path, name: str = "test-ca") -> tuple[Path, Path]:
    """(certificate, key) of a new CA in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req", "-x509", *_KEY, "-keyout", str(key), "-out", str(cert), "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
    )  # fmt: skip
    return cert, key


def signed(folder: Path, name: str, by: tuple[Path, Path], san: str, usage: str = "clientAuth") -> tuple[Path, Path]:
    """(certificate, key) of a new certificate for ``name`` with ``san``, signed by the CA ``by``."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key, csr, ext = (folder / f"{name}{suffix}" for suffix in (".crt", ".key", ".csr", ".ext"))
    _openssl("req", "-new", *_KEY, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(by[0]), "-CAkey", str(by[1]),
        "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def encrypted_key(folder: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) whose key is encrypted with a passphrase."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-passout", "pass:secret",
        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
    )  # fmt: skip
    return cert, key
