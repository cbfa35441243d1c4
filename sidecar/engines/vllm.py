"""vLLM: the metric map (a table) and the adapter that applies it.

Every vLLM metric generation (see :mod:`sidecar.generations`) is mapped onto
the canonical :class:`~sidecar.observation.Observation` fields by the tables
below; a renamed metric is a new name in a row, not new code. Sources:
``vllm/v1/metrics/loggers.py``, ``vllm/engine/metrics.py`` (V0),
vLLM's ``docs/usage/metrics.md``; explained in ``docs/vllm-metrics.md``.

Traps handled here (each in docs/vllm-metrics.md):

* The usage gauge is a fraction 0..1 under both names (``kv_cache_usage_perc``
  since 0.9.2, ``gpu_cache_usage_perc`` before; both in 0.9.2-0.10).
* ``vllm:cache_config_info`` has ``engine`` but no ``model_name``: it joins
  on ``engine``. Its labels change by version, so they are kept verbatim.
* ``engine`` is missing before V1 (and on old V1 info gauges): engine "0".
* With ``--api-server-count > 1`` (prometheus_client multiprocess mode) a
  series can come once per ``pid``: gauges fold by ``max`` (every copy is the
  same engine's state, the freshest is the largest for a growing cache and
  equal otherwise), counters by ``sum`` (each process counted its own part).
  Before vLLM PR #28792 (≈0.11.2) a gauge copy of a process that stopped
  updating could stay high; ``max`` then over-reports usage until vLLM
  restarts, which errs on the side of paging.
* ``*_created`` series are ignored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Literal, TypedDict

from ..generations import Generation
from ..observation import EngineScrape, Histogram, Observation

KIND = "vllm"

#: The Observation fields each table fills (mypy checks every row against them).
ScalarField = Literal[
    "usage_ratio",
    "prefix_cache_queries_tokens",
    "prefix_cache_hits_tokens",
    "prefix_cache_hit_rate_gauge",
    "preemptions",
    "requests_running",
    "requests_waiting",
    "requests_swapped",
    "prompt_tokens",
    "generation_tokens",
]
LabelField = Literal["requests_waiting_by_reason", "sleep_state"]
HistogramField = Literal["prompt_length", "generation_length"]
Fold = Literal["max", "sum"]

#: Plain numeric fields: Observation field -> (fold, exposed sample names in order of preference).
#: The first name present wins; the others are the same quantity under an older name.
SCALARS: dict[ScalarField, tuple[Fold, tuple[str, ...]]] = {
    "usage_ratio": ("max", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "prefix_cache_queries_tokens": ("sum", ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")),
    "prefix_cache_hits_tokens": ("sum", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    "prefix_cache_hit_rate_gauge": ("max", ("vllm:gpu_prefix_cache_hit_rate",)),
    "preemptions": ("sum", ("vllm:num_preemptions_total",)),
    "requests_running": ("max", ("vllm:num_requests_running",)),
    "requests_waiting": ("max", ("vllm:num_requests_waiting",)),
    "requests_swapped": ("max", ("vllm:num_requests_swapped",)),
    "prompt_tokens": ("sum", ("vllm:prompt_tokens_total",)),
    "generation_tokens": ("sum", ("vllm:generation_tokens_total",)),
}

#: Gauges split by one label: Observation field -> (sample name, label key).
BY_LABEL: dict[LabelField, tuple[str, str]] = {
    "requests_waiting_by_reason": ("vllm:num_requests_waiting_by_reason", "reason"),
    "sleep_state": ("vllm:engine_sleep_state", "sleep_state"),
}

#: Histograms: Observation field -> family name (samples ``_bucket``, ``_count``, ``_sum``).
HISTOGRAMS: dict[HistogramField, str] = {
    "prompt_length": "vllm:request_prompt_tokens",
    "generation_length": "vllm:request_generation_tokens",
}

CACHE_CONFIG_INFO = "vllm:cache_config_info"

#: Names whose presence identifies a generation (see sidecar.generations).
V0_MARKERS = ("vllm:num_requests_swapped", "vllm:gpu_prefix_cache_hit_rate")
NEW_USAGE, OLD_USAGE = "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"


def needed_sample_names() -> frozenset[str]:
    """Every exposed sample name the adapter reads (the pre-filter keeps exactly these)."""
    names: set[str] = {CACHE_CONFIG_INFO}
    for _, candidates in SCALARS.values():
        names.update(candidates)
    names.update(name for name, _ in BY_LABEL.values())
    for fam in HISTOGRAMS.values():
        names.update((fam + "_bucket", fam + "_count", fam + "_sum"))
    return frozenset(names)


NEEDED = needed_sample_names()

_Sample = tuple[str, dict[str, str], float]  # (name, labels, value)
_Key = tuple[str, str]  # (model_name, engine)
_ByName = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value) in page order


class _Fields(TypedDict, total=False):
    """What one (model_name, engine) got from a scrape: Observation's keyword arguments."""

    usage_ratio: float | None
    prefix_cache_queries_tokens: float | None
    prefix_cache_hits_tokens: float | None
    prefix_cache_hit_rate_gauge: float | None
    preemptions: float | None
    requests_running: float | None
    requests_waiting: float | None
    requests_waiting_by_reason: Mapping[str, float]
    requests_swapped: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    prompt_length: Histogram | None
    generation_length: Histogram | None
    sleep_state: str | None


def _key(labels: dict[str, str]) -> _Key:
    return labels.get("model_name", ""), labels.get("engine", "0")


def _fold(values: list[float], how: Fold) -> float:
    return max(values) if how == "max" else math.fsum(values)


def detect_generation(present: set[str], cache_configs: Iterable[dict[str, str]]) -> str:
    """The metric generation, from which names are present (docs/vllm-metrics.md, "Metric generations")."""
    if any(n in present for n in V0_MARKERS):
        return Generation.V0.value
    if NEW_USAGE in present and OLD_USAGE in present:
        return Generation.V1_BOTH_NAMES.value
    if OLD_USAGE in present:
        return Generation.V1_GPU_NAMES.value
    if any(c.get("kv_cache_size_tokens", "None") != "None" for c in cache_configs):
        return Generation.V1_CAPACITY_LABELS.value
    return Generation.V1.value


def normalise(samples: Iterable[_Sample]) -> EngineScrape | None:
    """Observations per (model_name, engine) from a scrape's samples; None when no vLLM family is present.

    ``samples`` are ``(name, labels, value)`` as yielded by ``prometheus_client.parser``.
    NaN and ±Inf values are treated as absent (a gauge that cannot be read is not zero).
    """
    by_name: _ByName = defaultdict(list)
    for name, labels, value in samples:
        if name in NEEDED:
            by_name[name].append((labels, value))
    if not by_name:
        return None

    cache_configs = _cache_configs(by_name)
    fields: defaultdict[_Key, _Fields] = defaultdict(_Fields)
    _read_scalars(by_name, fields)
    _read_by_label(by_name, fields)
    _read_histograms(by_name, fields)
    # No fields (e.g. an engine still starting, only the info gauge): no per-model state yet.
    observations = [
        Observation(
            model_name=model_name,
            engine=engine,
            cache_config=cache_configs.get(engine, cache_configs.get("0", {})),
            **fields[(model_name, engine)],
        )
        for model_name, engine in sorted(fields)
    ]
    return EngineScrape(KIND, detect_generation(set(by_name), cache_configs.values()), tuple(observations))


def _cache_configs(by_name: _ByName) -> dict[str, dict[str, str]]:
    """The info gauge's labels per ``engine`` (it has no ``model_name``), without ``engine`` and ``pid``."""
    cache_configs: dict[str, dict[str, str]] = {}
    for labels, _ in by_name.get(CACHE_CONFIG_INFO, ()):
        info = {k: v for k, v in labels.items() if k not in ("engine", "pid")}
        cache_configs[labels.get("engine", "0")] = info
    return cache_configs


def _read_scalars(by_name: _ByName, fields: defaultdict[_Key, _Fields]) -> None:
    """Each SCALARS row: its first name present, folded over copies; a non-finite copy counts as absent."""
    for field, (how, candidates) in SCALARS.items():
        name = next((n for n in candidates if n in by_name), None)
        if name is None:
            continue
        grouped: dict[_Key, list[float]] = defaultdict(list)
        for labels, value in by_name[name]:
            if math.isfinite(value):
                grouped[_key(labels)].append(value)
            else:
                grouped.setdefault(_key(labels), [])
        for key, values in grouped.items():
            fields[key][field] = _fold(values, how) if values else None


def _read_by_label(by_name: _ByName, fields: defaultdict[_Key, _Fields]) -> None:
    """The BY_LABEL gauges: waiting requests per reason, and the sleep state whose gauge is 1."""
    for key, by_reason in _split_by_label(by_name, *BY_LABEL["requests_waiting_by_reason"]).items():
        fields[key]["requests_waiting_by_reason"] = by_reason
    for key, states in _split_by_label(by_name, *BY_LABEL["sleep_state"]).items():
        active = [state for state, v in states.items() if v >= 1]
        fields[key]["sleep_state"] = active[0] if active else None


def _split_by_label(by_name: _ByName, name: str, label: str) -> dict[_Key, dict[str, float]]:
    """``name``'s finite values per (model_name, engine) and value of ``label``, the max over copies."""
    grouped: dict[_Key, dict[str, float]] = defaultdict(dict)
    for labels, value in by_name.get(name, ()):
        if not math.isfinite(value):
            continue
        bucket = grouped[_key(labels)]
        bucket[labels.get(label, "")] = max(bucket.get(labels.get(label, ""), value), value)
    return grouped


def _read_histograms(by_name: _ByName, fields: defaultdict[_Key, _Fields]) -> None:
    for field, fam in HISTOGRAMS.items():
        for key, hist in _histograms(by_name, fam).items():
            fields[key][field] = hist


def _histograms(by_name: _ByName, fam: str) -> dict[_Key, Histogram]:
    buckets: dict[_Key, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[_Key, float] = defaultdict(float)
    sums: dict[_Key, float] = defaultdict(float)
    broken: set[_Key] = set()  # a non-finite or unparsable piece makes the whole histogram absent
    for labels, value in by_name.get(fam + "_bucket", ()):
        try:
            le = float(labels.get("le", "nan"))
        except ValueError:
            le = math.nan
        if math.isnan(le) or not math.isfinite(value):
            broken.add(_key(labels))
            continue
        buckets[_key(labels)][le] += value  # per-pid copies of a counter add up
    for suffix, target in (("_count", counts), ("_sum", sums)):
        for labels, value in by_name.get(fam + suffix, ()):
            if not math.isfinite(value):
                broken.add(_key(labels))
            target[_key(labels)] += value
    out: dict[_Key, Histogram] = {}
    for key, les in buckets.items():
        if key in broken or math.inf not in les:
            continue
        out[key] = Histogram(buckets=tuple(sorted(les.items())), count=counts.get(key, 0.0), sum=sums.get(key, 0.0))
    return out
