"""Values as Grafana displays them in a panel's unit: ``0.873`` in ``percentunit`` is ``87.3%``, ``7200`` in ``s``
is ``2 hours``, ``3 * 2**30`` in ``bytes`` is ``3 GiB``.

The rules follow Grafana's value formats (``packages/grafana-data/src/valueFormats/categories.ts``):
SI prefixes for ``short``, ``reqps`` and ``si:<unit>``; binary (IEC) prefixes for ``bytes``, decimal
ones for ``decbytes``; durations in the largest whole unit; the custom ``suffix:``/``prefix:`` units
verbatim. Only the units our dashboards use and a few neighbours are known; any other is shown as the
number followed by the unit's name, as Grafana shows a custom unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

_SI = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_IEC = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_DECIMAL_BYTES = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def _number(v: float, decimals: int | None) -> str:
    if decimals is not None:
        return f"{v:.{decimals}f}"
    a = abs(v)
    if a == 0 or a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    if a >= 0.01:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"


def _scaled(v: float, scales: Sequence[tuple[float, str]], suffix_sep: str, decimals: int | None) -> str:
    for factor, suffix in scales:
        if abs(v) >= factor:
            return f"{_number(v / factor, decimals)}{suffix_sep}{suffix}"
    return _number(v, decimals)


def _seconds(v: float, decimals: int | None) -> str:
    a = abs(v)
    if a == 0:
        return "0 s"
    for factor, suffix in ((86400 * 365, "year"), (86400 * 7, "week"), (86400, "day"), (3600, "hour")):
        if a >= factor:
            n = v / factor
            return f"{_number(n, decimals)} {suffix}{'' if abs(n) == 1 else 's'}"
    if a >= 60:
        return f"{_number(v / 60, decimals)} min"
    if a >= 1:
        return f"{_number(v, decimals)} s"
    if a >= 0.001:
        return f"{_number(v * 1000, decimals)} ms"
    return f"{_number(v * 1e6, decimals)} µs"


def format_value(v: float, unit: str | None, decimals: int | None = None) -> str:
    """``v`` as Grafana displays it in ``unit`` (the units our dashboards use, and a few more)."""
    if v is None or math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    unit = unit or "short"
    simple = {
        "percentunit": lambda: f"{_number(v * 100, decimals)}%",
        "percent": lambda: f"{_number(v, decimals)}%",
        "s": lambda: _seconds(v, decimals),
        "ms": lambda: _seconds(v / 1000, decimals),
        "m": lambda: _seconds(v * 60, decimals),
        "h": lambda: _seconds(v * 3600, decimals),
        "d": lambda: _seconds(v * 86400, decimals),
        "bytes": lambda: _scaled(v, _IEC, " ", decimals) + ("" if abs(v) >= 1024 else " B"),
        "decbytes": lambda: _scaled(v, _DECIMAL_BYTES, " ", decimals) + ("" if abs(v) >= 1000 else " B"),
        "reqps": lambda: _scaled(v, _SI, " ", decimals) + " req/s",
        "ops": lambda: _scaled(v, _SI, " ", decimals) + " ops/s",
        "none": lambda: _number(v, decimals),
        "dateTimeAsIso": lambda: utc(v),
    }
    if unit in simple:
        return simple[unit]()
    # Grafana's custom units: "suffix:<text>" and "prefix:<text>" verbatim, "si:<unit>" scaled
    if unit.startswith("suffix:"):
        return f"{_number(v, decimals)}{unit[len('suffix:') :]}"
    if unit.startswith("prefix:"):
        return f"{unit[len('prefix:') :]}{_number(v, decimals)}"
    if unit.startswith("si:"):
        return f"{_scaled(v, _SI, ' ', decimals)}{unit[len('si:') :]}"
    if unit == "short":
        return _scaled(v, _SI, " ", decimals)
    # an unknown unit: the number, and the unit's own name as a suffix (Grafana's custom units)
    return f"{_scaled(v, _SI, ' ', decimals)} {unit}"


def utc(t: float) -> str:
    """A Unix time as ``2026-09-21 14:13:20`` (UTC), as Grafana's ``dateTimeAsIso`` shows it in UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
