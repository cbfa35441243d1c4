"""How a setting's value is read: one parser per kind of value, each naming the fix when it refuses.

A parser turns one YAML, environment or flag value into the value the sidecar holds, raising
``ValueError`` (or :class:`Invalid` for several problems) with a message that says what to write
instead. ``show`` writes a parsed value back the way the docs, ``--help`` and the example
configuration show it. The settings table (:mod:`sidecar.settings`) gives each setting its parser.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

from .capacity import CapacityError, parse_memory
from .capacity.vllm_rules import rules_for
from .input_files import TOKEN_MAX_BYTES, FileProblem, read_bytes
from .units import format_duration, format_size, parse_duration, parse_size, prometheus_duration_seconds


class Invalid(ValueError):
    """A parser's verdict on one value when it has several problems, or problems in its parts.

    Each problem is ``(sub-field, message)``: ``("[1]", "not a duration: 'soon'")`` is reported
    as ``forecast.long_windows[1]: not a duration: 'soon'``. A plain ``ValueError`` is one
    problem of the value itself.
    """

    def __init__(self, *problems: tuple[str, str]):
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


class Parser(Protocol):
    """Reads one YAML/environment/flag value; raises ``ValueError`` (or :class:`Invalid`) naming the fix."""

    @property
    def metavar(self) -> str:
        """How ``--help`` names the flag's value (``DURATION``)."""
        ...

    def __call__(self, value: Any) -> Any: ...

    def show(self, value: Any) -> str:
        """A parsed value (a default) as the docs, ``--help`` and the example config write it."""
        ...


@dataclass(frozen=True)
class Duration:
    """A duration (``5s``, ``1m30s``, ``500ms`` or seconds) in seconds, greater than 0."""

    at_least: float = 0.0
    zero_ok: bool = False  # 0, "0" and "0s" mean "off"
    metavar: str = "DURATION"

    def __call__(self, value: Any) -> float:
        if self.zero_ok and value in (0, "0", "0s"):
            return 0.0
        seconds = parse_duration(value)
        if seconds <= 0:
            raise ValueError(f"must be greater than 0s, got {value!r}")
        if seconds < self.at_least:
            raise ValueError(f"must be at least {format_duration(self.at_least)}, got {value!r}")
        return seconds

    def show(self, value: Any) -> str:
        return format_duration(value)


@dataclass(frozen=True)
class DurationList:
    """A YAML list of durations or a comma-separated string, sorted; ``[]`` or ``''`` turns them off."""

    metavar: str = "DURATION,..."

    def __call__(self, value: Any) -> tuple[float, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError(f"must be a list of durations such as [20m, 40m], got {value!r}")
        windows: list[float] = []
        bad: list[tuple[str, str]] = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                item = item.strip()
                if not item:
                    continue
            try:
                windows.append(Duration()(item))
            except ValueError as e:
                bad.append((f"[{i}]", str(e)))
        if bad:
            raise Invalid(*bad)
        return tuple(sorted(set(windows)))

    def show(self, value: Any) -> str:
        return "[" + ", ".join(format_duration(w) for w in value) + "]"


@dataclass(frozen=True)
class Number:
    """A finite number (``kind=int``: a whole one), optionally at least ``minimum``."""

    kind: type = float
    minimum: float | None = None
    metavar: str = "FRACTION"

    def __call__(self, value: Any) -> Any:
        try:
            if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):
                raise ValueError  # float("٣") is 3.0: a value is written with the digits 0-9
            as_float = float(value)
            if not math.isfinite(as_float) or (self.kind is int and not as_float.is_integer()):
                raise ValueError
            number = self.kind(as_float)
        except (TypeError, ValueError):
            kind = "whole number" if self.kind is int else "finite number"
            raise ValueError(f"must be a {kind}, got {value!r}") from None
        if self.minimum is not None and number < self.minimum:
            raise ValueError(f"must be at least {self.minimum:g}, got {number}")
        return number

    def show(self, value: Any) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class Choice:
    """One of ``options``. ``template`` words the refusal from ``raw`` (the value given) or ``text`` (as read)."""

    options: tuple[str, ...]
    lower: bool = True
    template: str = "{raw!r} is not one of {options}"
    metavar: str = "CHOICE"

    def __call__(self, value: Any) -> str:
        text = str(value).lower() if self.lower else str(value)
        if text not in self.options:
            raise ValueError(self.template.format(raw=value, text=text, options=", ".join(self.options)))
        return text

    def show(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Text:
    """Any text, kept as given."""

    metavar: str = "TEXT"

    def __call__(self, value: Any) -> str:
        return str(value)

    def show(self, value: Any) -> str:
        return "none" if value is None else str(value)


@dataclass(frozen=True)
class Boolean:
    """``true`` or ``false`` (YAML booleans only: a quoted "false" is text, and refused)."""

    metavar: str = "BOOL"

    def __call__(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value

    def show(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class Size:
    """Bytes from ``16MiB`` (2^20), ``16MB`` (10^6) or a plain integer; ``positive``: more than 0."""

    positive: bool = False
    metavar: str = "SIZE"

    def __call__(self, value: Any) -> int:
        size = parse_size(value)
        if self.positive and size <= 0:
            raise ValueError(f"must be positive, got {value!r}")
        return size

    def show(self, value: Any) -> str:
        return "none" if value is None else format_size(value)


@dataclass(frozen=True)
class GpuMemory(Text):
    """A memory size or a known GPU name (``H100-80GB``), as the capacity model reads it; kept as text."""

    metavar: str = "SIZE|GPU"

    def __call__(self, value: Any) -> str:
        try:
            parse_memory(str(value), name="gpu_memory")
        except CapacityError as e:
            raise ValueError(str(e).partition(": ")[2]) from None
        return str(value)


@dataclass(frozen=True)
class VllmVersion(Text):
    """A vLLM version whose memory-profile rules the capacity model knows (0.6.4 or later)."""

    metavar: str = "X.Y.Z"

    def __call__(self, value: Any) -> str:
        try:
            rules_for(str(value))
        except CapacityError as e:
            raise ValueError(str(e).partition(": ")[2]) from None
        return str(value)


@dataclass(frozen=True)
class ModelPath(Text):
    """A model's ``config.json``, or a directory holding one."""

    metavar: str = "PATH"

    def __call__(self, value: Any) -> str:
        """The path as text: whether it exists, and what it holds, is checked with the model
        (``sidecar.config.model_problems``), where ``run`` may wait for a model still downloading."""
        text = str(value)
        if not text.strip():
            raise ValueError("empty (give a config.json or a model directory holding one)")
        return text


@dataclass(frozen=True)
class ReadableFile(Text):
    """A file that exists (read when used, not now)."""

    metavar: str = "FILE"

    def __call__(self, value: Any) -> str:
        if not os.path.isfile(str(value)):
            raise ValueError(f"{value!r} is not a readable file")
        return str(value)


#: RFC 6750 §2.1 ``b64token``: what may follow "Bearer " in an Authorization header.
_TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def read_bearer_token(path: str) -> str:
    """The token in ``path``: one line of RFC 6750 ``b64token`` characters, surrounding whitespace removed.

    Raises ``ValueError`` with a message that never contains the file's content: a token with a
    newline or a non-ASCII byte would otherwise reach h11's "Illegal header value" error, which
    quotes the header, or fail to encode (Kubernetes service-account tokens and most API keys fit).
    """
    try:
        raw = read_bytes(path, max_bytes=TOKEN_MAX_BYTES, what="a token file")
    except FileProblem as e:
        raise ValueError(f"{path!r} {'; '.join(e.problems)}") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} holds non-ASCII bytes (write the token alone, as plain ASCII)") from None
    if not token:
        raise ValueError(f"{path!r} is empty (write the token into it)")
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError(
            f"{path!r} is not one token: only A-Z a-z 0-9 - . _ ~ + / and trailing = may appear, "
            "on one line (write the token alone)"
        )
    return token


@dataclass(frozen=True)
class TokenFile(Text):
    """A file holding one bearer token; checked now, read again at every scrape."""

    metavar: str = "FILE"

    def __call__(self, value: Any) -> str:
        if not os.path.isfile(str(value)):
            raise ValueError(
                f"{value!r} is not a readable file (mount the token as a file; tokens are never given inline)"
            )
        read_bearer_token(str(value))
        return str(value)


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)


def _listen_host(host: str) -> bool:
    """Whether ``host`` (of HOST:PORT) is empty, an IP address (``[v6]``) or a DNS name."""
    if not host:
        return True
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address((host[1:-1] if bracketed else host).split("%", 1)[0])
        return address.version == 6 or not bracketed
    except ValueError:
        if bracketed or ":" in host:
            return False
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and not labels[-1].isdigit() and all(_HOST_LABEL.fullmatch(label) for label in labels)


@dataclass(frozen=True)
class ListenAddress(Text):
    """``HOST:PORT`` (``:9437`` = every interface; port 0 = any free port)."""

    metavar: str = "HOST:PORT"

    def __call__(self, value: Any) -> str:
        """The address as given, when ``run`` can listen on it: ASCII digits for the port (``int()``
        reads "٩٤٣٧" too, the socket does not), and a host that is empty, an IP address (IPv6 in
        brackets) or a DNS name."""
        listen = str(value)
        host, sep, port = listen.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()) or len(port) > 5:
            raise ValueError(
                f"{listen!r} is not HOST:PORT with a port of digits 0-9 (use e.g. :9437 or 127.0.0.1:9437)"
            )
        if int(port) > 65535:
            raise ValueError(f"port {port} is out of range (0-65535; 0 = any free port)")
        if not _listen_host(host):
            raise ValueError(
                f"{host!r} is not a host to listen on: leave it empty for every interface, or give an IP "
                "address (IPv6 in brackets: [::1]:9437) or a host name"
            )
        return listen


@dataclass(frozen=True)
class Url(Text):
    """An http(s) URL without credentials (they would end up in labels and logs)."""

    metavar: str = "URL"
    #: the URL a refusal suggests when it cannot guess a better one
    example: str = "http://127.0.0.1:8000/metrics"

    def __call__(self, value: Any) -> str:
        url = str(value)
        if not url:
            raise ValueError(f"missing (e.g. {self.example})")
        parsed = urlparse(url)
        problems = []
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            hint = f"http://{url}" if "://" not in url else self.example
            if "://" not in url and ":" not in url and "/" not in url:
                hint = f"http://{url}:8000/metrics"
            problems.append(("", f"not an http(s) URL: {url!r} (did you mean {hint}?)"))
        if parsed.username or parsed.password:
            problems.append(
                (
                    "",
                    "credentials in the URL would end up in labels and logs "
                    "(remove user:password@ and use the target's bearer_token_file)",
                )
            )
        if problems:
            raise Invalid(*problems)
        return url


@dataclass(frozen=True)
class Fraction:
    """A finite number from 0 to 1 (both included)."""

    metavar: str = "FRACTION"

    def __call__(self, value: Any) -> float:
        number: float = Number()(value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"must be a fraction between 0 and 1, got {value!r}")
        return number

    def show(self, value: Any) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class PromDuration(Text):
    """A Prometheus duration (``30s``, ``5m``, ``1h30m``, ``1d``), greater than 0, kept as text.

    Stricter than :class:`Duration`: integers, units largest first, as ``promtool check rules``
    accepts them, because the rules carry the text verbatim.
    """

    metavar: str = "DURATION"

    def __call__(self, value: Any) -> str:
        text = str(value)
        if prometheus_duration_seconds(text) <= 0:
            raise ValueError(f"must be greater than 0s, got {value!r}")
        return text


@dataclass(frozen=True)
class JobLabel(Text):
    """A Prometheus ``job`` label value, as the rules quote it in ``up{job="..."}``."""

    metavar: str = "JOB"

    def __call__(self, value: Any) -> str:
        text = str(value)
        if not re.fullmatch(r"[^\"\\\s]+", text):
            raise ValueError(
                f"must be a non-empty job label value without quotes, backslashes or spaces, got {value!r} "
                "(e.g. kv-cache-sidecar)"
            )
        return text


@dataclass(frozen=True)
class Namespace(Text):
    """A Kubernetes namespace name (RFC 1123 label), as the rules quote it in ``namespace="..."``."""

    metavar: str = "NAMESPACE"

    def __call__(self, value: Any) -> str:
        text = str(value)
        if len(text) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", text):
            raise ValueError(
                f"must be a Kubernetes namespace name (lower-case letters, digits and '-', at most 63), "
                f"got {value!r} (e.g. llm-prod)"
            )
        return text


@dataclass(frozen=True)
class BaseUrl(Text):
    """An http(s) URL that links are made from (``+ /<path>``): no trailing slash."""

    metavar: str = "URL"

    def __call__(self, value: Any) -> str:
        text = str(value)
        if not re.fullmatch(r"https?://[^\s\"{}]+", text) or text.endswith("/"):
            raise ValueError(
                f"must be an http(s) URL without a trailing slash, got {value!r} (e.g. https://grafana.example.com)"
            )
        return text
