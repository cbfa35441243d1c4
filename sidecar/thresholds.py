"""The ``thresholds:`` section: the usage fractions every part of the sidecar shares.

One :class:`Thresholds` is read by the derived gauges (watermark headroom, time until the watermark,
the suggested ``gpu_memory_utilization``), the forecast, the weekly report *and* the alert rules, so a
page can never use another watermark than the headroom gauge shows.

Core, pure: no I/O and no import of the package. :mod:`sidecar.config` reads the section into it
with the rows of :mod:`sidecar.settings` (each value's parser, default and help).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """The ``thresholds:`` section: usage fractions shared by the gauges and the alert rules."""

    #: KV usage fraction above which the cache is "full" for paging purposes
    #: (critical KVCacheAlmostFull, headroom gauges, waiting-for-KV demand).
    watermark: float = 0.9
    #: KV usage fraction that opens a ticket (warning KVCacheAlmostFull).
    warning: float = 0.8
    #: Usage the suggested gpu_memory_utilization aims the peak demand at;
    #: deliberately below ``warning`` so following the advice does not flap
    #: the warning at every peak.
    target_usage: float = 0.75

    def problems(self, prefix: str = "thresholds") -> list[str]:
        """Every inconsistency, each naming the field and the fix."""
        out: list[str] = []
        for name in ("watermark", "warning", "target_usage"):
            v = getattr(self, name)
            if not (0.0 < v < 1.0):
                out.append(f"{prefix}.{name}: must be a fraction between 0 and 1 exclusive, got {v!r}")
        if not out:
            if not self.warning < self.watermark:
                out.append(
                    f"{prefix}.warning: must be below {prefix}.watermark "
                    f"({self.warning} >= {self.watermark}); e.g. warning 0.8, watermark 0.9"
                )
            if not self.target_usage < self.warning:
                out.append(
                    f"{prefix}.target_usage: must be below {prefix}.warning "
                    f"({self.target_usage} >= {self.warning}) so that following the advice "
                    f"does not flap the warning"
                )
        return out
