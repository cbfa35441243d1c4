"""The ``alerts:`` section: everything in the alert rules that is not a usage threshold.

:class:`RuleParams` holds the rules' ``for:`` durations, the sidecar's job label, the namespace and the
link bases; the usage fractions are :class:`sidecar.thresholds.Thresholds`. It lives in the core
(pure, no I/O, no import of the package) because :mod:`sidecar.config` reads the section into it
and validates it with the rest of the configuration; the rules themselves are written by
:mod:`sidecar.artifacts.rules`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RuleParams:
    """Everything in the rules that is not a usage threshold (the ``alerts:`` config section).

    Durations are Prometheus duration strings because they are written into the rules verbatim.
    What each field means, how it is read and checked: its row in
    :data:`sidecar.settings.ALERT_SETTINGS` (``docs/configuration.md`` is generated from it).
    """

    sidecar_job: str = "kv-cache-sidecar"
    #: The namespace every rule reads (``namespace="..."`` on each series it selects), so that two
    #: installations in one Prometheus (the dev and prod overlays) never alert twice or record the
    #: same series twice. None: every namespace (one installation per Prometheus).
    namespace: str | None = None
    #: The repository's own runbooks, so that a link works without configuration.
    runbook_base_url: str = "https://github.com/kv-cache-sidecar/kv-cache-sidecar/blob/main/docs/runbooks"
    #: Your Grafana's root URL. None: alerts carry no ``dashboard_url`` (each runbook names its dashboard).
    dashboard_base_url: str | None = None
    evaluation_interval: str | None = None  # None: Prometheus' global evaluation interval
    #: vLLM answers /metrics slowly exactly when saturated, and a saturated engine's usage dips
    #: between completions (0.89-1.0 on the real vLLM captures), so a missed scrape or a dip must
    #: not reset the warning's ``for:``. The window also lengthens every excursion by up to its own
    #: length.
    gap_window: str = "1m"
    #: The ticket stays "above the warning for 15 minutes": sustained load, what capacity planning acts on.
    warning_for: str = "15m"
    #: The page (KVCacheAlmostFull critical) is "the peaks keep reaching the watermark": the
    #: ``critical_quantile`` of usage over ``critical_window`` is above it, i.e. usage was above it for
    #: more than 1 - 0.95 = 5 % of the last 10 minutes (30 s), with no ``for:``. Real bursts are shorter
    #: than any ``for:`` that does not page on noise (docs/forecast-validation.md, "Real traffic").
    critical_window: str = "10m"
    critical_quantile: float = 0.95
    #: The page stays firing this long after the peaks stop: one page per saturation, not one per burst.
    critical_keep_firing_for: str = "5m"
    full_soon_within: str = "15m"
    #: ``bench/forecast.py`` measures lead time and false pages of this choice.
    full_soon_for: str = "2m"
    #: One preemption a second over 5 minutes, the floor of the community's vLLM alert examples
    #: (docs/runbooks/KVCachePreemptions.md): below it a preemption now and then is the scheduler
    #: working as designed, not a cache to resize.
    preemptions_per_second: float = 1.0
    preemptions_for: str = "10m"
    waiting_for: str = "5m"
    prefix_hit_ratio_low: float = 0.2
    #: KVCachePrefixHitRatioLow fires only for a workload whose median hit ratio over
    #: ``prefix_hit_ratio_baseline`` is at least this: one that has shared prefixes and lost them.
    #: A workload without shared prefixes sits near 0 by nature and never fires.
    prefix_hit_ratio_usual: float = 0.5
    prefix_hit_ratio_baseline: str = "1d"
    prefix_hit_ratio_for: str = "30m"
    capacity_mismatch_tolerance: float = 0.2
    capacity_mismatch_for: str = "15m"
    overprovisioned_below: float = 0.3
    overprovisioned_quantile: float = 0.95
    overprovisioned_window: str = "1d"
    overprovisioned_for: str = "1h"
    #: Longer than vLLM's slowest restart (model loading: 20 s - 10 min).
    scrape_failing_for: str = "15m"
    #: As long: a model directory that vLLM is still downloading or loading is not missing yet.
    model_config_missing_for: str = "15m"
    #: Five minutes: with the sidecar gone KVCacheAlmostFull cannot fire, which is worth a page of its own.
    sidecar_down_for: str = "5m"

    def fast(self) -> RuleParams:
        """The ``fast`` variant: the same rules on a seconds scale, for the end-to-end test.

        Only timings change; expressions and thresholds are the defaults'. The page's window and
        ``keep_firing_for`` shrink by 10 (10m -> 60s, 5m -> 30s): at the 1 s evaluation the window still
        holds 60 samples, so "above for 5 % of it" is 3 s, not one sample.
        """
        return dataclasses.replace(self, **FAST_VARIANT)


#: Overrides of the ``fast`` variant (1 s evaluation; ``for:`` in seconds).
FAST_VARIANT: dict[str, Any] = {
    "evaluation_interval": "1s",
    "gap_window": "5s",
    "warning_for": "20s",
    "critical_window": "60s",
    "critical_keep_firing_for": "30s",
    "full_soon_for": "10s",
    "preemptions_for": "20s",
    "waiting_for": "20s",
    "prefix_hit_ratio_for": "30s",
    "capacity_mismatch_for": "20s",
    "scrape_failing_for": "30s",
    "model_config_missing_for": "30s",
    "sidecar_down_for": "20s",
}
