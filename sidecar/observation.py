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


@dataclass(frozen=True)
class EngineScrape:
    """What an adapter read from one ``/metrics`` body."""

    engine_kind: str  # "vllm", later "sglang", "tgi", ...
    generation: str  # metric generation, e.g. "v1-capacity-labels"
    observations: tuple[Observation, ...]
