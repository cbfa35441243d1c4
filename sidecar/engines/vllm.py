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

Every number is checked here, at the edge (:mod:`sidecar.limits`), so that nothing after the
adapter meets an overflow, a NaN or a negative count:

* a number of ``vllm:cache_config_info`` that cannot be one (``num_gpu_blocks="1e999"``, ``"-6144"``,
  ``"1.28e32"``, ``block_size="0"``; :data:`CACHE_NUMBERS`) makes the whole page unusable: it raises
  :class:`~sidecar.limits.OutOfRange` (a failed scrape, ``invalid_value``), since every capacity
  gauge stands on those labels;
* any other value that cannot be what it measures (a usage outside 0..1, a negative or non-finite
  count, a histogram whose buckets fall or whose ``_count`` is not its ``+Inf`` bucket) drops that
  series for that engine, counted by reason in :attr:`EngineScrape.dropped`;
* an exact duplicate series (same name and labels: not ``pid`` copies) drops its whole family: the
  page contradicts itself, and summing the copies would double a counter;
* a label exported again (the waiting ``reason``) keeps at most ``label_values_limit`` values per engine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Literal, TypedDict

from ..generations import Generation
from ..limits import finite_number, whole_number
from ..observation import EngineScrape, Histogram, Observation, Rejections

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

#: The numeric labels of ``vllm:cache_config_info`` something reads: label -> (whole number?, low, high).
#: The bounds are rows of sidecar.limits (page.*); "None" or "" = not set by this vLLM.
CACHE_NUMBERS: dict[str, tuple[bool, float, float]] = {
    "num_gpu_blocks": (True, 1, 1 << 31),
    "block_size": (True, 1, 1 << 20),
    "kv_cache_size_tokens": (True, 0, 1 << 40),
    "kv_cache_max_concurrency": (False, 0, 1 << 40),
    "kv_cache_memory_bytes": (True, 0, 1 << 50),
    "gpu_memory_utilization": (False, 0, 1),
}
#: The range of every count read (counters, queue lengths, histogram buckets): page.count.
MAX_COUNT = float(1 << 63)
#: Float slack around [0, 1] for the usage fraction (vLLM computes 1 - free / total).
USAGE_SLACK = 1e-9
#: The range of each scalar field; every other field is a count in [0, MAX_COUNT].
RANGES: dict[str, tuple[float, float]] = {
    "usage_ratio": (-USAGE_SLACK, 1 + USAGE_SLACK),
    "prefix_cache_hit_rate_gauge": (-1.0, 1 + USAGE_SLACK),  # V0: -1 when prefix caching is off
}
#: Default of targets[].label_values_limit (the settings row is the source; this is for direct callers).
LABEL_VALUES_LIMIT = 32

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


def normalise(samples: Iterable[_Sample], *, label_values_limit: int = LABEL_VALUES_LIMIT) -> EngineScrape | None:
    """Observations per (model_name, engine) from a scrape's samples; None when no vLLM family is present.

    ``samples`` are ``(name, labels, value)`` as yielded by ``prometheus_client.parser``. A value that
    cannot be what it measures is dropped (NaN, ±Inf, a negative count, a usage outside 0..1) and
    counted in the result's ``dropped``; a number of ``vllm:cache_config_info`` that cannot be one
    raises :class:`~sidecar.limits.OutOfRange`. ``label_values_limit``: distinct waiting reasons and
    sleep states kept per engine (0 = no limit).
    """
    by_name: _ByName = defaultdict(list)
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    duplicated: set[str] = set()
    for name, labels, value in samples:
        if name in NEEDED:
            if type(value) is not float:  # the parser gives an int for an integer's text, of any length
                try:
                    value = float(value)
                except OverflowError:
                    value = math.inf  # counted as unusable below, like any other infinity
            series = (name, frozenset(labels.items()))
            if series in seen:
                duplicated.add(name)
            else:
                seen.add(series)
            by_name[name].append((labels, value))
    if not by_name:
        return None

    present = set(by_name)  # the generation is told by the names on the page, trusted or not
    rejections = Rejections()
    _drop_duplicated(by_name, duplicated, rejections)
    cache_configs = _cache_configs(by_name)
    fields: defaultdict[_Key, _Fields] = defaultdict(_Fields)
    _read_scalars(by_name, fields, rejections)
    _read_by_label(by_name, fields, rejections, label_values_limit)
    _read_histograms(by_name, fields, rejections)
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
    generation = detect_generation(present, cache_configs.values())
    return EngineScrape(KIND, generation, tuple(observations), rejections.counts, rejections.examples)


def _family(name: str) -> str:
    """The family a sample name belongs to: a histogram's three names are one family."""
    for fam in HISTOGRAMS.values():
        if name in (fam + "_bucket", fam + "_count", fam + "_sum"):
            return fam
    return name


def _drop_duplicated(by_name: _ByName, duplicated: set[str], rejections: Rejections) -> None:
    """Drop every family that holds an exact duplicate series: the page contradicts itself."""
    for fam in sorted({_family(name) for name in duplicated}):
        names = [fam + s for s in ("_bucket", "_count", "_sum")] if fam in HISTOGRAMS.values() else [fam]
        for name in names:
            dropped = by_name.pop(name, [])
            if dropped:
                rejections.add("duplicate_series", fam, _show(dropped[0][0]), len(dropped))


def _show(labels: Mapping[str, str]) -> str:
    """A series' labels for a log line, cut short."""
    text = ",".join(f"{k}={v!r}" for k, v in sorted(labels.items()))
    return "{" + (text if len(text) <= 80 else text[:77] + "...") + "}"


def _cache_configs(by_name: _ByName) -> dict[str, dict[str, str]]:
    """The info gauge's labels per ``engine`` (it has no ``model_name``), without ``engine`` and ``pid``.

    Raises :class:`~sidecar.limits.OutOfRange` for a number of :data:`CACHE_NUMBERS` that cannot be one.
    """
    cache_configs: dict[str, dict[str, str]] = {}
    for labels, _ in by_name.get(CACHE_CONFIG_INFO, ()):
        info = {k: v for k, v in labels.items() if k not in ("engine", "pid")}
        for key, (whole, low, high) in CACHE_NUMBERS.items():
            raw = info.get(key)
            if raw is None or raw in ("None", ""):
                continue
            where = f"cache_config_info.{key}"
            if whole:
                whole_number(raw, where, low=int(low), high=int(high))
            else:
                finite_number(raw, where, low=low, high=high)
        cache_configs[labels.get("engine", "0")] = info
    return cache_configs


def _usable(field: str, value: float) -> bool:
    """Whether ``value`` can be what ``field`` measures (its RANGES row, else a count)."""
    low, high = RANGES.get(field, (0.0, MAX_COUNT))
    return math.isfinite(value) and low <= value <= high


def _read_scalars(by_name: _ByName, fields: defaultdict[_Key, _Fields], rejections: Rejections) -> None:
    """Each SCALARS row: its first name present, folded over copies.

    An engine's field is absent when one of its copies cannot be used (a sum over copies without
    one of them would mislead); NaN is counted like any other unusable value.
    """
    for field, (how, candidates) in SCALARS.items():
        name = next((n for n in candidates if n in by_name), None)
        if name is None:
            continue
        grouped: dict[_Key, list[float]] = defaultdict(list)
        bad: set[_Key] = set()
        for labels, value in by_name[name]:
            key = _key(labels)
            if _usable(field, value):
                grouped[key].append(value)
            else:
                bad.add(key)
                rejections.add("invalid_value", name, repr(value))
        for key in bad:
            fields[key][field] = None
        for key, values in grouped.items():
            if key not in bad:
                fields[key][field] = _fold(values, how)


def _read_by_label(
    by_name: _ByName, fields: defaultdict[_Key, _Fields], rejections: Rejections, label_values_limit: int
) -> None:
    """The BY_LABEL gauges: waiting requests per reason, and the sleep state whose gauge is 1."""
    name, label = BY_LABEL["requests_waiting_by_reason"]
    for key, by_reason in _split_by_label(by_name, name, label, rejections, label_values_limit).items():
        fields[key]["requests_waiting_by_reason"] = by_reason
    name, label = BY_LABEL["sleep_state"]
    for key, states in _split_by_label(by_name, name, label, rejections, label_values_limit).items():
        active = [state for state, v in states.items() if v >= 1]
        fields[key]["sleep_state"] = active[0] if active else None


def _split_by_label(
    by_name: _ByName, name: str, label: str, rejections: Rejections, limit: int
) -> dict[_Key, dict[str, float]]:
    """``name``'s usable values per (model_name, engine) and value of ``label``, the max over copies;
    at most ``limit`` values of ``label`` per engine (0 = no limit), the first in page order."""
    grouped: dict[_Key, dict[str, float]] = defaultdict(dict)
    for labels, value in by_name.get(name, ()):
        if not _usable("", value):
            rejections.add("invalid_value", name, repr(value))
            continue
        bucket = grouped[_key(labels)]
        which = labels.get(label, "")
        if which not in bucket and limit and len(bucket) >= limit:
            rejections.add("label_values", f"{name}{{{label}}}", repr(which[:40]))
            continue
        bucket[which] = max(bucket.get(which, value), value)
    return grouped


def _read_histograms(by_name: _ByName, fields: defaultdict[_Key, _Fields], rejections: Rejections) -> None:
    for field, fam in HISTOGRAMS.items():
        for key, hist in _histograms(by_name, fam, rejections).items():
            fields[key][field] = hist


def _histograms(by_name: _ByName, fam: str, rejections: Rejections) -> dict[_Key, Histogram]:
    """Each engine's histogram of ``fam``, per-pid copies added up; a histogram that cannot be one is
    dropped: a bound or a count that is not a number (``invalid_value``), buckets that fall with
    the bound, no ``+Inf`` bucket, or a ``_count`` other than the ``+Inf`` bucket (``histogram_mismatch``)."""
    buckets: dict[_Key, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[_Key, float] = defaultdict(float)
    sums: dict[_Key, float] = defaultdict(float)
    broken: set[_Key] = set()
    for labels, value in by_name.get(fam + "_bucket", ()):
        try:
            le = float(labels.get("le", "nan"))
        except ValueError:
            le = math.nan
        if math.isnan(le) or not _usable("", value):
            if _key(labels) not in broken:
                rejections.add("invalid_value", fam + "_bucket", f"le={labels.get('le', '')[:20]!r} {value!r}")
            broken.add(_key(labels))
            continue
        buckets[_key(labels)][le] += value  # per-pid copies of a counter add up
    for suffix, target in (("_count", counts), ("_sum", sums)):
        for labels, value in by_name.get(fam + suffix, ()):
            if not _usable("", value):
                if _key(labels) not in broken:
                    rejections.add("invalid_value", fam + suffix, repr(value))
                broken.add(_key(labels))
            target[_key(labels)] += value
    out: dict[_Key, Histogram] = {}
    for key, les in buckets.items():
        if key in broken:
            continue
        ordered = tuple(sorted(les.items()))
        rising = all(a[1] <= b[1] for a, b in zip(ordered, ordered[1:], strict=False))
        count = counts.get(key)
        if math.inf not in les or not rising or count is None or count != les[math.inf]:
            rejections.add(
                "histogram_mismatch", fam, f"_count={count!r} +Inf bucket={les.get(math.inf)!r} rising={rising}"
            )
            continue
        out[key] = Histogram(buckets=ordered, count=count, sum=sums.get(key, 0.0))
    return out
