"""The canonical, engine-independent view of one scrape: the contract every engine adapter fills.

An engine adapter (``sidecar/engines/<kind>.py``) turns ONE ``/metrics`` page into typed fields
ONCE: an :class:`EngineScrape` holding one :class:`Observation` per (``model_name``, ``engine``) —
``engine`` being the data-parallel engine index (vLLM's ``engine`` label; "0" when the server has
none) — each with the pool's static settings as a typed :class:`KVPool`. The derivations
(:mod:`sidecar.derive`), the layers (:mod:`sidecar.layers`) and the exporter read only these
fields, never an engine's label strings, so a new inference server is an adapter module plus its
row in :data:`sidecar.engines.ADAPTERS`, nothing else.

The rules every adapter follows (each checked by ``tests/test_engine_contract.py``):

* ``None`` (or an empty mapping) means "this server does not export it"; never a made-up 0.
* Every number is already checked at the edge (:mod:`sidecar.limits`): finite, counts ``>= 0``,
  fractions within ``[-USAGE_SLACK, 1 + USAGE_SLACK]``. A value that cannot be what it measures is
  dropped and counted (:data:`DROP_REASONS`), never passed on.
* Units are the ones named in each field: tokens, blocks, bytes, requests, fractions 0..1.
* Counters are cumulative since the engine started (a drop is a restart, read reset-safe).
* A gauge family this engine cannot have by design is named in :attr:`EngineScrape.absent` with
  the reason (shown in the engine's docs), so "absent" is told apart from "broken".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Float slack around [0, 1] for a usage fraction: engines compute it as ``1 − free ÷ total``
#: (vLLM's ``BlockPool.get_usage``), which can miss 0 or 1 by a rounding error. Adapters accept
#: ``[−USAGE_SLACK, 1 + USAGE_SLACK]``; :func:`sidecar.derive.readable_usage` clamps into [0, 1].
USAGE_SLACK = 1e-9


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are ``(le, count)``, ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True)
class KVPool:
    """The KV-cache pool's static settings, typed once by the adapter (``None`` = not exported).

    These change only when the engine restarts with new settings: two scrapes whose pools differ
    count as a configuration change (``kvcache_sidecar_config_changes_total``). Sizes:

    * ``num_blocks`` blocks of ``block_size`` tokens, of which ``null_blocks`` are never allocatable
      (vLLM's ``BlockPool`` keeps block 0 as a null block: 1; other engines 0). An engine that
      allocates token by token (SGLang's default ``page_size`` 1) reports ``block_size=1`` and
      ``num_blocks`` = its token capacity.
    * ``capacity_tokens``: the engine's own token-capacity figure as it reports it (vLLM:
      ``kv_cache_size_tokens``, else ``num_gpu_blocks × block_size``, null block included;
      SGLang: ``max_total_num_tokens``). For a hybrid pool it is the engine's group-aware figure
      when it gives one (used for the capacity-efficiency ratio), but ``kvcache_capacity_tokens``
      is not exported.
    * ``hybrid``: ``num_blocks × block_size`` is not a token capacity (sliding-window, mamba or
      attention-free layers: vllm issue #51163, PR #42206); then no used/free split is derived.
    """

    num_blocks: int | None = None
    block_size: int | None = None
    #: blocks never allocatable (vLLM: 1, the null block; else 0)
    null_blocks: int = 0
    capacity_tokens: int | None = None
    hybrid: bool = False
    #: the KV-cache dtype as the engine names it, lower case ("auto", "fp8", "fp8_e4m3", "bfloat16", ...)
    kv_dtype: str | None = None
    #: bytes the engine gave the KV cache, when it reports them (vLLM ``--kv-cache-memory-bytes``)
    kv_cache_memory_bytes: int | None = None
    #: the longest request in tokens the engine accepts (vLLM 0.21+: kv_cache_size_tokens ÷ max_concurrency)
    max_model_len: int | None = None
    #: whether prefix caching is on; None when the engine does not say
    prefix_caching: bool | None = None
    #: the engine's flag that sizes the pool as a fraction of GPU memory: "gpu_memory_utilization"
    #: (vLLM), "mem_fraction_static" (SGLang), "free_gpu_memory_fraction" (TRT-LLM), ...
    memory_lever: str | None = None
    #: that flag's value, 0..1 (exported as ``kvcache_gpu_memory_utilization``)
    memory_fraction: float | None = None
    #: the lowest engine version this page proves (vLLM: a cache_config_info label added in a release,
    #: sidecar.capacity.vllm_rules.VERSION_FLOORS); picks the capacity model's profile rules
    version_floor: str | None = None
    #: every setting the engine reports, as display strings (vLLM: cache_config_info's labels but
    #: ``engine``/``pid``). ``kvcache_server_info`` shows the keys of sidecar.metrics.CACHE_SETTINGS
    #: ("" when missing); a change of any of them is a configuration change. For display and change
    #: detection only: nothing derives a number from these strings.
    info: Mapping[str, str] = field(default_factory=dict)

    @property
    def usable_blocks(self) -> int | None:
        """Blocks that can hold tokens: ``num_blocks − null_blocks``."""
        return None if self.num_blocks is None else max(self.num_blocks - self.null_blocks, 0)

    @property
    def usable_tokens(self) -> int | None:
        """Tokens the pool can hold: ``usable_blocks × block_size``; None for a hybrid or unsized pool."""
        if self.hybrid or self.usable_blocks is None or self.block_size is None:
            return None
        return self.usable_blocks * self.block_size


@dataclass(frozen=True)
class Observation:
    """One engine's state as read from one scrape. ``None`` = not exported by this server."""

    model_name: str
    engine: str
    #: KV-cache usage fraction 0..1 as the engine computes it (vLLM: blocks held by running requests
    #: / usable blocks). When the engine exports used_tokens instead, leave it None: it is derived.
    usage_ratio: float | None = None
    #: Tokens the engine counts as used now (SGLang ``num_used_tokens``, TRT-LLM used blocks × tokens
    #: per block). None when only usage_ratio is exported (vLLM: used/free then come from usage ×
    #: usable blocks in whole blocks, BlockPool's arithmetic).
    used_tokens: float | None = None
    #: Of used_tokens, those the engine can evict without preempting a request (cache no running
    #: request references). Derive counts them as free and as headroom, not as used; None or 0 when
    #: the engine's used count already leaves them out (SGLang's num_used_tokens does).
    evictable_tokens: float | None = None
    #: Tokens reserved for admitted requests but not yet written (TGI's admission budget): NEVER
    #: usage; kept for the engine's own docs and future gauges.
    reserved_tokens: float | None = None
    #: The longest sequence in tokens any slot has held since start (llama.cpp ``n_tokens_max``): a
    #: high-water mark, never a counter nor current usage; kept for the engine's docs and future gauges.
    longest_sequence_tokens: float | None = None
    #: Prefix-cache counters, in tokens (vLLM V1 counts tokens).
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    #: V0's block hit-rate gauge; -1 means prefix caching is disabled.
    prefix_cache_hit_rate_gauge: float | None = None
    #: requests preempted (a counter)
    preemptions: float | None = None
    #: the second (offload) tier's usage fraction 0..1 by tier name (vLLM 0.32:
    #: ``vllm:kv_offload_cpu_cache_usage_perc`` → {"cpu": f}: blocks pinned by transfers in flight ÷
    #: the tier's blocks; blocks that only hold evictable cache count as free); empty without a tier
    offload_usage_by_tier: Mapping[str, float] = field(default_factory=dict)
    #: requests the engine refused at admission, by its reason (counters; vLLM 0.32:
    #: ``vllm:admission_rejections_total{reason="max_num_queued_reqs"|"max_num_queued_tokens"}``, the
    #: 503s of ``--max-num-queued-reqs/-tokens``); empty when the engine exports none
    admission_rejections_by_reason: Mapping[str, float] = field(default_factory=dict)
    #: requests preempted, by the engine's reason (counters; vLLM PR #58037:
    #: ``vllm:num_preemptions_by_reason_total{reason="kv_full"|"priority"|"prefix_cache_reset"}``, whose
    #: reasons sum to ``preemptions``; only ``kv_full`` is KV capacity pressure); empty when not exported
    preemptions_by_reason: Mapping[str, float] = field(default_factory=dict)
    requests_running: float | None = None
    requests_waiting: float | None = None
    #: waiting requests split by the engine's reason (vLLM: ``capacity``/``deferred``); empty when the
    #: engine exports only the total (then ``kvcache_requests_waiting{reason="all"}``)
    requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    requests_swapped: float | None = None
    #: prompt and generated tokens (counters); a drop of prompt_tokens marks a restart for the forecast
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    #: per-request prompt and generation lengths in tokens (histograms)
    prompt_length: Histogram | None = None
    generation_length: Histogram | None = None
    #: The active sleep state (``awake``, ``weights_offloaded``, ``discard_all``) or None.
    sleep_state: str | None = None
    #: The pool's static settings; None when the engine does not report them (vLLM without
    #: ``vllm:cache_config_info``): then no capacity, used/free or advice gauges.
    pool: KVPool | None = None

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
    # the engine's page gives no KV capacity and targets[].capacity_tokens is not set: the scrape
    # succeeds, the capacity-based gauges are absent (EngineScrape.absent says which); one per engine
    "no_capacity",
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

    engine_kind: str  # the adapter's KIND: "vllm", "sglang", "trtllm", "tgi", ...
    generation: str  # the metric generation the adapter detected, e.g. "v1-capacity-labels"
    observations: tuple[Observation, ...]
    #: series dropped, per reason of DROP_REASONS (absent = none)
    dropped: Mapping[str, int] = field(default_factory=dict)
    #: (reason, field) -> an example of what was dropped (the value, the labels), for the log
    rejected: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: catalogue gauge name -> why this engine cannot have it by design (e.g. TGI exports no usage:
    #: "kvcache_usage_ratio": "TGI exports no KV usage"); shown in the engine's docs and checked by
    #: tests/test_engine_contract.py. Empty for an engine that can light every per-engine gauge.
    absent: Mapping[str, str] = field(default_factory=dict)
