"""The canonical, engine-independent view of one scrape.

Every engine adapter turns its server's families into :class:`Observation`s,
one per (``model_name``, ``engine``) — ``engine`` being the data-parallel
engine index (vLLM's ``engine`` label; "0" when the server has none). The
derivations and the exporter only ever see these, so a new inference server is
an adapter module plus its metric-map table, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are ``(le, count)``, ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True)
class Observation:
    """One engine's state as read from one scrape. ``None`` = not exported by this server."""

    model_name: str
    engine: str
    #: KV-cache usage fraction 0..1 (blocks held by running requests / usable blocks).
    usage_ratio: float | None = None
    #: Prefix-cache counters, in tokens (vLLM V1 counts tokens).
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    #: V0's block hit-rate gauge; -1 means prefix caching is disabled.
    prefix_cache_hit_rate_gauge: float | None = None
    preemptions: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    #: ``vllm:num_requests_waiting_by_reason`` (``capacity``/``deferred``), empty when not exported.
    requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    requests_swapped: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_length: Histogram | None = None
    generation_length: Histogram | None = None
    #: The active sleep state (``awake``, ``weights_offloaded``, ``discard_all``) or None.
    sleep_state: str | None = None
    #: The labels of the engine's cache-config info gauge, verbatim strings ("None" = absent).
    cache_config: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.model_name, self.engine)

    @property
    def asleep(self) -> bool:
        return self.sleep_state is not None and self.sleep_state != "awake"


#: Why an adapter drops a series it read (``kvcache_sidecar_series_dropped_total{reason}``); fixed, so
#: the counter's cardinality is bounded, and exported at 0 from the start.
DROP_REASONS: tuple[str, ...] = (
    "invalid_value",  # not a number it can be: NaN, ±Inf, a negative count, a usage outside 0..1
    "duplicate_series",  # the same name and labels twice: the whole family is dropped
    "histogram_mismatch",  # _count differs from the +Inf bucket, buckets fall, or no +Inf bucket
    "label_values",  # past targets[].label_values_limit distinct values of an exported label
)


class Rejections:
    """What an adapter dropped from one page: a count per reason, and one example per (reason, field).

    The fields are the adapter's own sample names (a fixed set), so the examples stay bounded
    whatever the page holds; the daemon logs each (reason, field) when it starts and when it ends.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[tuple[str, str], str] = {}

    def add(self, reason: str, field: str, example: str, n: int = 1) -> None:
        assert reason in DROP_REASONS, reason
        self.counts[reason] = self.counts.get(reason, 0) + n
        self.examples.setdefault((reason, field), example)


@dataclass(frozen=True)
class EngineScrape:
    """What an adapter read from one ``/metrics`` body."""

    engine_kind: str  # "vllm", later "sglang", "tgi", ...
    generation: str  # metric generation, e.g. "v1-capacity-labels"
    observations: tuple[Observation, ...]
    #: series dropped, per reason of DROP_REASONS (absent = none)
    dropped: Mapping[str, int] = field(default_factory=dict)
    #: (reason, field) -> an example of what was dropped (the value, the labels), for the log
    rejected: Mapping[tuple[str, str], str] = field(default_factory=dict)
