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
  on ``engine``. Its labels change by version: :func:`kv_pool` types the ones
  something reads into a :class:`~sidecar.observation.KVPool` (the only place
  they are parsed) and keeps them all verbatim as the pool's ``info``.
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
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, TypedDict, cast

from ..capacity.vllm_rules import served_version
from ..generations import Generation
from ..limits import finite_number, whole_number
from ..observation import USAGE_SLACK, EngineScrape, Histogram, KVPool, Observation, Rejections
from .families import no_capacity

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
    "offload_usage_ratio",
]
LabelField = Literal[
    "requests_waiting_by_reason", "sleep_state", "admission_rejections_by_reason", "preemptions_by_reason"
]
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
    # the CPU offload tier (PR #45737, help text "experimental: name may change"):
    # (allocated − free − evictable blocks) ÷ the tier's blocks, CPUOffloadingManager.get_stats in
    # vllm/v1/kv_offload/cpu/manager.py; read into Observation.offload_usage_by_tier["cpu"]
    "offload_usage_ratio": ("max", ("vllm:kv_offload_cpu_cache_usage_perc",)),
}

#: Gauges split by one label: Observation field -> (sample name, label key).
BY_LABEL: dict[LabelField, tuple[str, str]] = {
    "requests_waiting_by_reason": ("vllm:num_requests_waiting_by_reason", "reason"),
    "sleep_state": ("vllm:engine_sleep_state", "sleep_state"),
    # a counter without an ``engine`` label (vLLM PR #55812: one API-server queue per model), given to
    # the model's lowest engine (:func:`_read_admission_rejections`)
    "admission_rejections_by_reason": ("vllm:admission_rejections_total", "reason"),
    # a counter per engine and reason (vLLM PR #58037, open when this was written: proposed after 0.32):
    # reason="kv_full" (no free KV block for a running request), "priority" (evicted for a higher-priority
    # request under --scheduling-policy priority), "prefix_cache_reset" (reset_prefix_cache with requests
    # running); the reasons sum to vllm:num_preemptions_total. The PR declares it like
    # vllm:num_preemptions, whose prometheus_client Counter is exposed with "_total" only
    # (docs/vllm-metrics.md); :func:`_read_preemptions_by_reason`
    "preemptions_by_reason": ("vllm:num_preemptions_by_reason_total", "reason"),
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
#: The range of each scalar field; every other field is a count in [0, MAX_COUNT].
RANGES: dict[str, tuple[float, float]] = {
    "usage_ratio": (-USAGE_SLACK, 1 + USAGE_SLACK),
    "prefix_cache_hit_rate_gauge": (-1.0, 1 + USAGE_SLACK),  # V0: -1 when prefix caching is off
    "offload_usage_ratio": (-USAGE_SLACK, 1 + USAGE_SLACK),
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
#: Sample names that prove a page is vLLM's (:func:`sidecar.engines.detect`): any it reads, all ``vllm:``.
SIGNATURE = NEEDED

_Sample = tuple[str, dict[str, str], float]  # (name, labels, value)
_Key = tuple[str, str]  # (model_name, engine)
_ByName = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value) in page order


class _ObservationFields(TypedDict, total=False):
    """Observation's keyword arguments a scrape fills."""

    usage_ratio: float | None
    prefix_cache_queries_tokens: float | None
    prefix_cache_hits_tokens: float | None
    prefix_cache_hit_rate_gauge: float | None
    preemptions: float | None
    requests_running: float | None
    requests_waiting: float | None
    requests_waiting_by_reason: Mapping[str, float]
    admission_rejections_by_reason: Mapping[str, float]
    preemptions_by_reason: Mapping[str, float]
    requests_swapped: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    prompt_length: Histogram | None
    generation_length: Histogram | None
    sleep_state: str | None


class _Fields(_ObservationFields, total=False):
    """What one (model_name, engine) got from a scrape: Observation's keyword arguments, and the
    offload tier's usage (:func:`_observation` keys it by tier)."""

    offload_usage_ratio: float | None


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


def normalise(
    samples: Iterable[_Sample], *, label_values_limit: int = LABEL_VALUES_LIMIT, capacity_tokens: int | None = None
) -> EngineScrape | None:
    """Observations per (model_name, engine) from a scrape's samples; None when no vLLM family is present.

    ``samples`` are ``(name, labels, value)`` as yielded by ``prometheus_client.parser``. A value that
    cannot be what it measures is dropped (NaN, ±Inf, a negative count, a usage outside 0..1) and
    counted in the result's ``dropped``; a number of ``vllm:cache_config_info`` that cannot be one
    raises :class:`~sidecar.limits.OutOfRange`. ``label_values_limit``: distinct waiting reasons and
    sleep states kept per engine (0 = no limit). ``capacity_tokens`` (``targets[].capacity_tokens``) is
    used only for an engine without ``vllm:cache_config_info``; without either, the engine's usage is
    exported, its capacity gauges are absent and ``no_capacity`` is counted (:func:`.families.no_capacity`).
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
    pools = {engine: kv_pool(info) for engine, info in cache_configs.items()}
    fields: defaultdict[_Key, _Fields] = defaultdict(_Fields)
    _read_scalars(by_name, fields, rejections)
    _read_by_label(by_name, fields, rejections, label_values_limit)
    _read_histograms(by_name, fields, rejections)
    _read_admission_rejections(by_name, fields, rejections, label_values_limit)
    _read_preemptions_by_reason(by_name, fields, rejections, label_values_limit)
    # No fields (e.g. an engine still starting, only the info gauge): no per-model state yet.
    operators = None if capacity_tokens is None else operator_pool(capacity_tokens)
    observations = [
        _observation(model_name, engine, _pool_of(pools, engine) or operators, fields[(model_name, engine)])
        for model_name, engine in sorted(fields)
    ]
    absent = no_capacity(observations, rejections, field="vllm:cache_config_info", reason=NO_CAPACITY)
    generation = detect_generation(present, cache_configs.values())
    return EngineScrape(KIND, generation, tuple(observations), rejections.counts, rejections.examples, absent)


#: Why an engine has no capacity (counted as ``no_capacity``; the absent gauges' reason), and the fix.
NO_CAPACITY = (
    "the page has no vllm:cache_config_info (an old vLLM, or a trimmed page): set targets[].capacity_tokens "
    "to the 'GPU KV cache size: N tokens' vLLM logs at start-up"
)


def operator_pool(capacity_tokens: int) -> KVPool:
    """The pool of ``targets[].capacity_tokens`` for a page without ``cache_config_info``: token-sized blocks
    and no null block, so used = usage x capacity (to the token, where vLLM's own pool counts whole blocks)."""
    return KVPool(num_blocks=capacity_tokens, block_size=1, null_blocks=0, capacity_tokens=capacity_tokens)


def _observation(model_name: str, engine: str, pool: KVPool | None, found: _Fields) -> Observation:
    """One engine's Observation from what the tables read; the offload tier's usage keyed by its tier."""
    offload = found.get("offload_usage_ratio")
    tiers = {} if offload is None else {"cpu": offload}
    kwargs = cast(_ObservationFields, {k: v for k, v in found.items() if k != "offload_usage_ratio"})
    return Observation(model_name=model_name, engine=engine, pool=pool, offload_usage_by_tier=tiers, **kwargs)


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


#: The labels of a hybrid KV layout, for which ``num_gpu_blocks × block_size`` is not a token
#: capacity (vllm issue #51163, PR #42206): label -> its value on a plain model.
#: ``mamba_cache_dtype``/``mamba_ssm_cache_dtype``/``mamba_cache_mode`` are deliberately absent: they
#: carry defaults on plain models (seen on vLLM 0.32).
HYBRID_SIGNS: tuple[tuple[str, str], ...] = (
    ("sliding_window", "None"),
    ("mamba_page_size_padded", "None"),
    ("mamba_block_size", "None"),
)


def _cache_configs(by_name: _ByName) -> dict[str, dict[str, str]]:
    """The info gauge's labels per ``engine`` (it has no ``model_name``), without ``engine`` and ``pid``."""
    return {
        labels.get("engine", "0"): {k: v for k, v in labels.items() if k not in ("engine", "pid")}
        for labels, _ in by_name.get(CACHE_CONFIG_INFO, ())
    }


def cache_numbers(info: Mapping[str, str]) -> dict[str, float]:
    """The :data:`CACHE_NUMBERS` labels of ``info`` that are set, as checked numbers (whole ones as int).

    Raises :class:`~sidecar.limits.OutOfRange` for one that cannot be what it counts.
    """
    numbers: dict[str, float] = {}
    for key, (whole, low, high) in CACHE_NUMBERS.items():
        raw = info.get(key)
        if raw is None or raw in ("None", ""):
            continue
        where = f"cache_config_info.{key}"
        if whole:
            numbers[key] = whole_number(raw, where, low=int(low), high=int(high))
        else:
            numbers[key] = finite_number(raw, where, low=low, high=high)
    return numbers


def is_hybrid(info: Mapping[str, str]) -> bool:
    """True when the cache config shows sliding-window, mamba or attention-free layers."""
    if info.get("is_attention_free") == "True":
        return True
    return any(info.get(key, absent) != absent for key, absent in HYBRID_SIGNS)


def kv_pool(info: Mapping[str, str]) -> KVPool:
    """The pool of one engine from its ``vllm:cache_config_info`` labels; the one place they are read.

    Raises :class:`~sidecar.limits.OutOfRange` for a number of :data:`CACHE_NUMBERS` that cannot be one
    (every capacity gauge stands on them).

    * capacity: ``kv_cache_size_tokens`` (vLLM PR #42206, group-aware) when present, else
      ``num_gpu_blocks × block_size`` (``_report_kv_cache_config`` in ``vllm/v1/core/kv_cache_utils.py``)
      except for hybrid models, where ``block_size`` is the minimum over groups and the product is
      meaningless; block 0 is ``BlockPool``'s null block (``vllm/v1/core/block_pool.py``);
    * ``max_model_len``: ``kv_cache_size_tokens ÷ kv_cache_max_concurrency``, rounded: vLLM sets
      ``kv_cache_size_tokens = int(max_concurrency × max_model_len)`` (``get_kv_cache_capacity``;
      docs/capacity.md, "The tokens line across versions"), so the ratio is ``max_model_len`` up to
      the int() truncation;
    * the version floor: a label added in a release dates the server at that release or later
      (:func:`sidecar.capacity.vllm_rules.served_version`).
    """
    numbers = cache_numbers(info)
    blocks, block_size = _whole(numbers, "num_gpu_blocks"), _whole(numbers, "block_size")
    hybrid = is_hybrid(info)
    capacity = _whole(numbers, "kv_cache_size_tokens")
    if capacity is None and not hybrid and blocks is not None and block_size is not None:
        capacity = blocks * block_size
    tokens, concurrency = numbers.get("kv_cache_size_tokens"), numbers.get("kv_cache_max_concurrency")
    dtype = info.get("cache_dtype")
    prefix = info.get("enable_prefix_caching")
    return KVPool(
        num_blocks=blocks,
        block_size=block_size,
        null_blocks=1,
        capacity_tokens=capacity,
        hybrid=hybrid,
        kv_dtype=None if dtype in (None, "None", "") else dtype.lower(),
        kv_cache_memory_bytes=_whole(numbers, "kv_cache_memory_bytes"),
        max_model_len=int(round(tokens / concurrency)) if tokens and concurrency else None,
        prefix_caching={"True": True, "False": False}.get(prefix or ""),
        memory_lever="gpu_memory_utilization",
        memory_fraction=numbers.get("gpu_memory_utilization"),
        version_floor=served_version(info, None),
        info=info,
    )


def _pool_of(pools: Mapping[str, KVPool], engine: str) -> KVPool | None:
    """The pool of ``engine``: its own info gauge, else engine "0"'s (old V1 info gauges have no
    ``engine`` label); None when there is none or it has no label at all (nothing to read)."""
    pool = pools.get(engine, pools.get("0"))
    return pool if pool is not None and pool.info else None


def _whole(numbers: Mapping[str, float], key: str) -> int | None:
    value = numbers.get(key)
    return None if value is None else int(value)


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


def _read_admission_rejections(
    by_name: _ByName, fields: defaultdict[_Key, _Fields], rejections: Rejections, label_values_limit: int
) -> None:
    """``vllm:admission_rejections_total{model_name, reason}``: summed over ``pid`` copies (a counter per
    process), given to the lowest engine of its model that the page shows. The family deliberately has
    no ``engine`` label (PR #55812: the queue limits act in the API server, before any engine), so
    giving it to one engine keeps a sum over engines right; a model with no engine series is skipped."""
    name, label = BY_LABEL["admission_rejections_by_reason"]
    per_model: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in by_name.get(name, ()):
        if not _usable("", value):
            rejections.add("invalid_value", name, repr(value))
            continue
        model, reason = labels.get("model_name", ""), labels.get(label, "")
        counts = per_model[model]
        if reason not in counts and label_values_limit and len(counts) >= label_values_limit:
            rejections.add("label_values", f"{name}{{{label}}}", repr(reason[:40]))
            continue
        counts[reason] = counts.get(reason, 0.0) + value
    for model, counts in per_model.items():
        engines = sorted(engine for m, engine in fields if m == model)
        if engines:
            fields[(model, engines[0])]["admission_rejections_by_reason"] = counts


def _read_preemptions_by_reason(
    by_name: _ByName, fields: defaultdict[_Key, _Fields], rejections: Rejections, label_values_limit: int
) -> None:
    """``vllm:num_preemptions_by_reason_total{model_name, engine, reason}`` (vLLM PR #58037): per engine and
    reason, ``pid`` copies summed (a counter per process, like ``vllm:num_preemptions_total``); at most
    ``label_values_limit`` reasons per engine, the first in page order. Only ``kv_full`` is KV capacity
    pressure; the total (``preemptions``) stays the figure of rates and alerts."""
    name, label = BY_LABEL["preemptions_by_reason"]
    for key, counts in _split_by_label(by_name, name, label, rejections, label_values_limit, combine=sum).items():
        fields[key]["preemptions_by_reason"] = counts


def _split_by_label(
    by_name: _ByName,
    name: str,
    label: str,
    rejections: Rejections,
    limit: int,
    combine: Callable[[tuple[float, float]], float] = max,
) -> dict[_Key, dict[str, float]]:
    """``name``'s usable values per (model_name, engine) and value of ``label``, copies combined by
    ``combine`` (the max of a gauge's copies; ``sum`` for a counter per process); at most ``limit``
    values of ``label`` per engine (0 = no limit), the first in page order."""
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
        bucket[which] = combine((bucket[which], value)) if which in bucket else value
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
