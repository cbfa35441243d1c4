"""The parameters every generated artifact is made from, and the names they share.

- :class:`Thresholds` (the ``thresholds:`` section) is read by the sidecar's derived gauges
  (watermark headroom, time until watermark, suggested utilization) *and* by the alert
  rules, so a page can never use a different watermark than the headroom gauge.
- :class:`RuleParams` (the ``alerts:`` section) is everything in the rules that is not a
  usage threshold: ``for:`` durations, the sidecar's job label, the link bases.
- The dashboard uids and template-variable names are fixed here because alerts link to
  them (``dashboard_url``): dashboards must reuse them so that links in pages never break.

Pure: no I/O. ``sidecar.config`` parses both sections into these classes, once.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..units import prometheus_duration_seconds

#: Grafana dashboard uids. The alerts link to the first two; the pod view is reserved for the
#: per-pod dashboard (see dashboards/README.md), so nothing else may take that uid.
DASHBOARD_OVERVIEW_UID = "kvcache-overview"
DASHBOARD_CAPACITY_UID = "kvcache-capacity"
DASHBOARD_POD_UID = "kvcache-pod"
DASHBOARD_UIDS = (DASHBOARD_OVERVIEW_UID, DASHBOARD_CAPACITY_UID, DASHBOARD_POD_UID)

#: Template variables the alerts fill in ``dashboard_url`` (``var-<name>=<the alert's label <name>>``);
#: each is named after the label it filters on.
VAR_NAMESPACE = "namespace"
VAR_MODEL_NAME = "model_name"
VAR_POD = "pod"
DASHBOARD_VARIABLES = (VAR_NAMESPACE, VAR_MODEL_NAME, VAR_POD)


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


# How each RuleParams field is read from the config and checked (its ``kind`` metadata).
_DURATION, _FRACTION, _RATE, _TEXT, _URL = "duration", "fraction", "rate", "text", "url"


def _param(kind: str, default: Any, help: str, example: str | None = None) -> Any:
    """A RuleParams field: its default, how it is checked, and the one-line help the docs show."""
    return field(default=default, metadata={"kind": kind, "help": help, "example": example})


@dataclass(frozen=True)
class RuleParams:
    """Everything in the rules that is not a usage threshold (the ``alerts:`` config section).

    Durations are Prometheus duration strings because they are written into the rules verbatim.
    Each field's ``help`` metadata is what ``docs/configuration.md`` and the example config say.
    """

    sidecar_job: str = _param(
        _TEXT,
        "kv-cache-sidecar",
        "the job label Prometheus gives the sidecar (a PodMonitor defaults to <namespace>/<name>: set jobLabel "
        "or this)",
    )
    runbook_base_url: str = _param(
        _URL,
        "https://github.com/kv-cache-sidecar/kv-cache-sidecar/blob/main/docs/runbooks",
        "runbook_url = this + /<AlertName>.md",
    )
    dashboard_base_url: str = _param(
        _URL, "https://grafana.example.com", "your Grafana's root URL; dashboard_url = this + /d/<uid>?var-..."
    )
    evaluation_interval: str | None = _param(
        _DURATION, None, "rule-group evaluation interval (default: Prometheus' global one)", example="30s"
    )
    #: vLLM answers /metrics slowly exactly when saturated, and a saturated engine's usage dips
    #: between completions (0.89-1.0 on the real vLLM captures), so a missed scrape or a dip must
    #: not reset ``for:``. The window also lengthens every excursion by up to its own length: at
    #: 1m a 4-minute spike stays short of the 5m page, at 2m it would page.
    gap_window: str = _param(
        _DURATION,
        "1m",
        "max_over_time window under the usage alerts: a missed scrape or a dip does not reset for: "
        "(it lengthens every excursion by as much)",
    )
    warning_for: str = _param(_DURATION, "15m", "KVCacheAlmostFull warning: above thresholds.warning this long")
    critical_for: str = _param(
        _DURATION, "5m", "KVCacheAlmostFull critical (the page): above thresholds.watermark this long"
    )
    full_soon_within: str = _param(_DURATION, "15m", "KVCacheFullSoon: the forecast says full within this ...")
    #: ``bench/forecast.py`` measures lead time and false pages of this choice.
    full_soon_for: str = _param(_DURATION, "2m", "... for this long")
    preemptions_per_second: float = _param(
        _RATE, 0.0, "KVCachePreemptions: preemption rate over 5m above this (per second) ..."
    )
    preemptions_for: str = _param(_DURATION, "10m", "... for this long")
    waiting_for: str = _param(
        _DURATION, "5m", "KVCacheRequestsWaitingForKV: requests wait for capacity above the watermark this long"
    )
    prefix_hit_ratio_low: float = _param(
        _FRACTION, 0.2, "KVCachePrefixHitRatioLow: namespace/model hit ratio (tokens) below this ..."
    )
    prefix_hit_ratio_for: str = _param(_DURATION, "30m", "... for this long")
    capacity_mismatch_tolerance: float = _param(
        _FRACTION, 0.2, "KVCacheCapacityMismatch: |actual/theoretical - 1| above this (exact budgets only) ..."
    )
    capacity_mismatch_for: str = _param(_DURATION, "15m", "... for this long")
    overprovisioned_below: float = _param(
        _FRACTION, 0.3, "KVCacheOverProvisioned (info): awake-time usage quantile below this ..."
    )
    overprovisioned_quantile: float = _param(_FRACTION, 0.95, "... the quantile ...")
    overprovisioned_window: str = _param(_DURATION, "1d", "... over this window ...")
    overprovisioned_for: str = _param(_DURATION, "1h", "... for this long")
    #: Longer than vLLM's slowest restart (model loading: 20 s - 10 min).
    scrape_failing_for: str = _param(
        _DURATION, "15m", "KVCacheSidecarScrapeFailing: failing this long (only after a first good scrape)"
    )
    #: As fast as the page it protects (``critical_for``).
    sidecar_down_for: str = _param(_DURATION, "5m", "KVCacheSidecarDown: down or absent this long")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, prefix: str = "alerts") -> tuple[RuleParams, list[str]]:
        """Params from the ``alerts:`` config mapping, plus every problem found (each naming the field).

        Unknown keys are problems (a typo would silently keep a default). On
        problems the defaults are returned for the bad fields.
        """
        problems: list[str] = []
        if mapping is None:
            return cls(), problems
        if not isinstance(mapping, Mapping):
            return cls(), [f"{prefix}: must be a mapping, got {type(mapping).__name__}"]
        kinds = {f.name: f.metadata["kind"] for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            if key not in kinds:
                close = difflib.get_close_matches(str(key), list(kinds), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(kinds)}"
                problems.append(f"{prefix}.{key}: unknown key ({hint})")
                continue
            try:
                values[key] = _read_param(kinds[key], key, value)
            except ValueError:
                problems.append(f"{prefix}.{key}: must be a number, got {value!r}")
        params = cls(**values)
        bad = params.problems(prefix)
        problems.extend(bad)
        if bad:  # keep what is valid, default what is not
            bad_fields = {p.split(":", 1)[0].removeprefix(prefix + ".") for p in bad}
            params = cls(**{k: v for k, v in values.items() if k not in bad_fields})
        return params, problems

    def problems(self, prefix: str = "alerts") -> list[str]:
        """Every invalid field, each with the fix."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            kind = f.metadata["kind"]
            if kind == _DURATION and value is not None:
                try:
                    if prometheus_duration_seconds(value) <= 0:
                        out.append(f"{prefix}.{f.name}: must be longer than 0, got {value!r}")
                except ValueError as e:
                    out.append(f"{prefix}.{f.name}: {e}")
            elif kind == _FRACTION and not 0.0 <= value <= 1.0:
                out.append(f"{prefix}.{f.name}: must be a fraction between 0 and 1, got {value!r}")
            elif kind == _RATE and value < 0:
                out.append(f"{prefix}.{f.name}: must be 0 or more, got {value!r}")
            elif kind == _TEXT and not re.fullmatch(r"[^\"\\\s]+", value or ""):
                out.append(
                    f"{prefix}.{f.name}: must be a non-empty job label value without quotes, backslashes "
                    f"or spaces, got {value!r} (e.g. kv-cache-sidecar)"
                )
            elif kind == _URL and (not re.fullmatch(r"https?://[^\s\"{}]+", value or "") or value.endswith("/")):
                out.append(
                    f"{prefix}.{f.name}: must be an http(s) URL without a trailing slash, got {value!r} "
                    f"(e.g. https://grafana.example.com)"
                )
        return out

    def fast(self) -> RuleParams:
        """The ``fast`` variant: the same rules on a seconds scale, for the end-to-end test.

        Only timings change; expressions and thresholds are the defaults'.
        """
        return dataclasses.replace(self, **FAST_VARIANT)


def _read_param(kind: str, key: str, value: Any) -> Any:
    """One ``alerts:`` value as RuleParams holds it; ``ValueError`` when a number is not one."""
    if kind in (_FRACTION, _RATE):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = float(str(value))
        return float(value)
    if key == "evaluation_interval" and value is None:
        return None  # explicit null: Prometheus' global evaluation interval
    return str(value)  # durations, job name, URLs are written into the rules as text


#: Overrides of the ``fast`` variant (1 s evaluation; ``for:`` in seconds).
FAST_VARIANT: dict[str, Any] = {
    "evaluation_interval": "1s",
    "gap_window": "5s",
    "warning_for": "20s",
    "critical_for": "40s",
    "full_soon_for": "10s",
    "preemptions_for": "20s",
    "waiting_for": "20s",
    "prefix_hit_ratio_for": "30s",
    "capacity_mismatch_for": "20s",
    "scrape_failing_for": "30s",
    "sidecar_down_for": "20s",
}

#: ``kv-sidecar rules render --variant``.
VARIANTS = ("default", "fast")
