"""Parsing and display of the Prometheus-style durations and byte sizes used in the configuration."""

from __future__ import annotations

import math
import re

#: The longest duration a setting takes (ten years; ``config.duration`` in ``sidecar.limits``).
MAX_DURATION_S = 10 * 365 * 86400.0
#: The largest size a setting takes (1 PiB; ``config.size`` in ``sidecar.limits``).
MAX_SIZE = 1 << 50

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", re.ASCII)

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)


def parse_duration(value: object) -> float:
    """Seconds from ``"5s"``, ``"1m30s"``, ``"500ms"`` (Prometheus' duration syntax) or a plain number.

    Raises ``ValueError`` with the accepted syntax in the message.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 5s, 1m30s, 500ms)")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"not a duration: {value!r} (use e.g. 5s, 1m30s, 500ms)")
        return _bounded_duration(float(value), value)
    text = str(value).strip()
    if text.startswith("-") and text[1:2].isdigit():
        raise ValueError(f"must be positive, got {value!r} (use e.g. 5s, 1m30s, 500ms)")
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r} (use e.g. 5s, 1m30s, 500ms)")
    return _bounded_duration(total, value)


def _bounded_duration(seconds: float, value: object) -> float:
    if seconds > MAX_DURATION_S:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{shown} is longer than ten years, the longest duration a setting takes")
    return seconds


# Prometheus' own duration syntax (model.ParseDuration): units in this order, integers only. Rule
# files need exactly this (`promtool check rules` rejects "1.5m" or "30s1m"); the sidecar's own
# settings accept the looser parse_duration above.
_PROM_DURATION_RE = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$", re.ASCII
)
_PROM_DURATION_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def prometheus_duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration such as ``"1h30m"``; ``ValueError`` if it is not one."""
    m = _PROM_DURATION_RE.match(text) if isinstance(text, str) else None
    if not m or not text:
        raise ValueError(f"not a Prometheus duration: {text!r} (use e.g. 30s, 5m, 1h30m, 1d)")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _PROM_DURATION_UNITS, strict=True) if g)


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration` for display (``90`` -> ``"1m30s"``)."""
    if seconds < 1 and seconds > 0:
        return f"{round(seconds * 1000)}ms"
    s = int(round(seconds))
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts) or "0s"


def parse_size(value: object) -> int:
    """Bytes from ``"16MiB"`` (2^20), ``"16MB"`` (10^6) or a plain integer."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r} (use e.g. 16MiB, 1GB, 1048576)")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE_RE.match(str(value))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"not a size: {value!r} (use e.g. 16MiB, 1GB, 1048576)")
        number = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
        size = int(number) if number <= MAX_SIZE else MAX_SIZE + 1
    if size > MAX_SIZE:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{shown} is more than 1PiB, the largest size a setting takes")
    return size


def format_size(size: int) -> str:
    """The inverse of :func:`parse_size` for display: the largest binary unit that divides it (``16MiB``)."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
