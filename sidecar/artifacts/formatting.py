"""How a threshold is written into the generated artifacts: as PromQL text, and as a sentence says it.

One helper each, shared by the alert rules (:mod:`sidecar.artifacts.rules`) and the dashboards
(:mod:`sidecar.artifacts.dashboards`), so the watermark an alert compares against and the one a
panel draws and describes are the same text.
"""

from __future__ import annotations


def promql_number(x: float) -> str:
    """A threshold as PromQL text, exactly: 0.9 -> "0.9", 604800.0 -> "604800", 0.123456789 keeps every digit.

    ``repr`` is Python's shortest text that reads back as the same float, so PromQL compares against
    the very value of the configuration (no rounding as ``%g`` would do).
    """
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def percent(x: float) -> str:
    """A ratio as descriptions say it: 0.9 -> "90%", 0.123456 -> "12.3456%" (no float noise such as
    90.00000000000001%: rounded to four decimals of a percent, trailing zeros dropped)."""
    return f"{round(x * 100, 4):g}%"
