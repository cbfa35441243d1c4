"""Every bound the sidecar puts on what it reads, one row each, and the checks that apply them.

Whatever vLLM (or anything else on its port) returns, and whatever a ConfigMap or a model directory
holds, the sidecar must keep serving, stay small and say precisely what is wrong. So every input is
bounded: a page's size and series, a label's length and its distinct values, a file's size and depth,
a model's shape, the HTTP endpoint's connections. The rows of :data:`LIMITS` name each bound, its
default, what happens when it is exceeded and how to raise it; ``docs/limits.md`` is generated from
them (``make generate``).

Numbers read from a page, a configuration file or a model's ``config.json`` pass through
:func:`whole_number` or :func:`finite_number` (or a check built on them), so that an overflow, a NaN,
a negative count or an absurd size becomes one :class:`OutOfRange` naming the field, the value and
what was expected, never a traceback and never a gauge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limit:
    """One bound on an input."""

    #: ``<surface>.<name>``: the surface is one of page, config, model, http, history.
    key: str
    #: The default (a constant's value, or the default of the setting that changes it).
    default: int | float
    #: ``bytes``, ``series``, ``characters``, ``seconds``, ``connections``, ...
    unit: str
    #: What it bounds, in one line.
    bounds: str
    #: What happens past it: the reason counted (``kvcache_sidecar_scrape_errors_total{reason=...}``,
    #: ``..._dropped_total``) or the exit code.
    exceeded: str
    #: How to raise it: the setting (``targets[].label_limit``) or why it is a constant.
    change: str
    #: The setting that changes it, as docs/configuration.md names it (``targets[].label_limit``), if
    #: any: a test checks that ``default`` is that setting's default.
    setting: str | None = None


class OutOfRange(ValueError):
    """A number that cannot be used: not a number, not finite, not whole, or outside its range."""

    def __init__(self, field: str, value: Any, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        shown = repr(value)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        super().__init__(f"{field}: {shown} is not {expected}")


def finite_number(value: Any, field: str, *, low: float, high: float) -> float:
    """``value`` (a number, or the text of one) as a finite float in ``[low, high]``; else :class:`OutOfRange`.

    Booleans are refused (YAML's ``yes`` is not a count); so are integers too big for a float.
    """
    expected = f"a finite number from {low:g} to {high:g}"
    if isinstance(value, bool):
        raise OutOfRange(field, value, expected)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise OutOfRange(field, value, expected) from None
    if not math.isfinite(number) or not low <= number <= high:
        raise OutOfRange(field, value, expected)
    return number


def whole_number(value: Any, field: str, *, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``: an int, an integral float (``6144.0``) or its text.

    Anything else is an :class:`OutOfRange`.
    """
    expected = f"a whole number from {low} to {high}"
    if isinstance(value, int) and not isinstance(value, bool):
        if not low <= value <= high:
            raise OutOfRange(field, value, expected)
        return value
    if isinstance(value, str) and len(value) > 64:  # int("9" * 10**6) is quadratic; no count is that long
        raise OutOfRange(field, value, expected)
    try:
        number = finite_number(value, field, low=low, high=high)
    except OutOfRange:
        raise OutOfRange(field, value, expected) from None
    if not number.is_integer():
        raise OutOfRange(field, value, expected)
    return int(number)


#: Every bound, grouped by surface. Add a row where its surface's marker is.
LIMITS: tuple[Limit, ...] = (
    # --- page ---
    # --- config ---
    # --- model ---
    # --- http ---
)
