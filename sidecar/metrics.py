"""The catalogue of every metric the sidecar exports: one row each.

The exporter builds its families from these rows (name, type, HELP), and
every derived value travels to it keyed by its row (:data:`Values`, the rows
looked up once at import with :func:`entry`, so a misspelt name fails at
import, not at a scrape); ``docs/metrics.md`` and the README's short table of :data:`ONCALL` are
generated from them (:mod:`sidecar.artifacts.docs`, ``make generate``;
``kv-sidecar docs`` prints the full table), and ``tests/test_metric_docs.py``
fails when the docs, this table and what the exporter actually emits disagree.
Data only: no formatting here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

KEY = ("target", "model_name", "engine")


@dataclass(frozen=True)
class MetricDoc:
    name: str
    type: str  # gauge | counter | info
    unit: str
    labels: tuple[str, ...]
    help: str
    action: str  # what on-call does when it moves


#: The labels of ``kvcache_server_info`` that are vLLM's cache settings (from ``vllm:cache_config_info``):
#: the dashboards read a change of any of them as a configuration change.
CACHE_SETTINGS = (
    "block_size",
    "num_gpu_blocks",
    "cache_dtype",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
)

CATALOGUE: tuple[MetricDoc, ...] = (
    # --- capacity from vLLM's own signals (always) ---
    MetricDoc(
        "kvcache_usage_ratio",
        "gauge",
        "ratio",
        KEY,
        "KV-cache usage 0-1: blocks held by running requests / usable blocks (vllm:kv_cache_usage_perc "
        "or vllm:gpu_cache_usage_perc).",
        "Above 0.9 requests start to queue and be preempted: see KVCacheAlmostFull.",
    ),
    MetricDoc(
        "kvcache_capacity_tokens",
        "gauge",
        "tokens",
        KEY,
        "vLLM's KV capacity in tokens (kv_cache_size_tokens label, else num_gpu_blocks x block_size; "
        "includes the null block). Not exported for hybrid models.",
        "Changes only on restart with new settings; compare with kvcache_theoretical_capacity_tokens.",
    ),
    MetricDoc(
        "kvcache_used_tokens",
        "gauge",
        "tokens",
        KEY,
        "Tokens held: round(usage x (num_gpu_blocks - 1)) x block_size (whole blocks).",
        "Read with kvcache_free_tokens: how much room is left in tokens.",
    ),
    MetricDoc(
        "kvcache_free_tokens",
        "gauge",
        "tokens",
        KEY,
        "Tokens still allocatable: (num_gpu_blocks - 1) x block_size - used (block 0 is vLLM's null block).",
        "Near 0: new requests wait and running ones get preempted.",
    ),
    MetricDoc(
        "kvcache_watermark_headroom_tokens",
        "gauge",
        "tokens",
        KEY,
        "Tokens left before usage crosses the watermark (thresholds.watermark); 0 above it.",
        "0 means the paging watermark is crossed.",
    ),
    MetricDoc(
        "kvcache_prefix_cache_queries_tokens_total",
        "counter",
        "tokens",
        KEY,
        "Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries_total or the gpu_ name).",
        "Aggregate with rate(); the hit ratio is hits/queries.",
    ),
    MetricDoc(
        "kvcache_prefix_cache_hits_tokens_total",
        "counter",
        "tokens",
        KEY,
        "Prompt tokens found in the prefix cache (vllm:prefix_cache_hits_total or the gpu_ name).",
        "Falling hits at steady traffic: prompts stopped sharing prefixes or the cache is evicting.",
    ),
    MetricDoc(
        "kvcache_preemptions_total",
        "counter",
        "requests",
        KEY,
        "Requests preempted (vllm:num_preemptions_total; resets on restart): for lack of KV blocks, or, where vLLM "
        "says so, for a higher-priority request or a prefix-cache reset (then also counted by reason).",
        "Any sustained rate means the cache is too small for the load: see KVCachePreemptions.",
    ),
    MetricDoc(
        "kvcache_offload_usage_ratio",
        "gauge",
        "ratio",
        KEY + ("tier",),
        "The offload tier's usage 0-1 beside the GPU pool's kvcache_usage_ratio: tier=cpu is "
        "vllm:kv_offload_cpu_cache_usage_perc (experimental in vLLM), the CPU blocks pinned by transfers in "
        "flight; blocks holding only evictable cache count as free.",
        "Near 1 for long: stores to the CPU tier are dropped (raise --kv-offloading-size); the GPU pool's "
        "headroom is kvcache_watermark_headroom_tokens.",
    ),
    MetricDoc(
        "kvcache_admission_rejections_total",
        "counter",
        "requests",
        KEY + ("reason",),
        "Requests the engine refused at admission, by its reason (vLLM: vllm:admission_rejections_total, "
        "the 503s of --max-num-queued-reqs/-tokens; on the model's lowest engine, as vLLM counts them per "
        "model; resets on restart).",
        "Capacity pressure beside preemptions: a rising rate means clients get 503s because the queue is full.",
    ),
    MetricDoc(
        "kvcache_preemptions_by_reason_total",
        "counter",
        "requests",
        KEY + ("reason",),
        "Requests preempted, by the engine's reason (vLLM PR #58037: vllm:num_preemptions_by_reason_total, "
        "reason kv_full, priority or prefix_cache_reset; the reasons sum to kvcache_preemptions_total). Only "
        "kv_full is KV capacity pressure. Exported only when the engine's page has the family; resets on restart.",
        "A rising kv_full rate: the pool is too small for the load (KVCachePreemptions). Priority or "
        "prefix_cache_reset preemptions are scheduling or operator actions: more KV memory does not stop them.",
    ),
    MetricDoc(
        "kvcache_prefix_cache_hit_ratio",
        "gauge",
        "ratio",
        KEY,
        "Prefix-cache hits / queries over derive.window (V0: vLLM's hit-rate gauge). Absent when prefix "
        "caching is off or nothing was queried.",
        "Low ratio with shared system prompts: check routing affinity and enable_prefix_caching.",
    ),
    MetricDoc(
        "kvcache_preemptions_per_second",
        "gauge",
        "1/s",
        KEY,
        "Preemptions per second over derive.window (reset-safe).",
        "Above 0 for minutes: raise KV capacity or lower concurrency.",
    ),
    MetricDoc(
        "kvcache_requests_running",
        "gauge",
        "requests",
        KEY,
        "Requests in the running batch (vllm:num_requests_running).",
        "Compare with max_num_seqs; flat at it means the scheduler, not KV, is the limit.",
    ),
    MetricDoc(
        "kvcache_requests_waiting",
        "gauge",
        "requests",
        KEY + ("reason",),
        "Requests waiting, by vLLM's reason. reason=capacity means SCHEDULER capacity: KV blocks, but also "
        "max_num_seqs or the per-step token budget, so waiting is not by itself KV pressure; "
        "reason=all when vLLM exports only the total.",
        "KV pressure only together with usage above the watermark (KVCacheRequestsWaitingForKV).",
    ),
    MetricDoc(
        "kvcache_server_info",
        "info",
        "",
        KEY + ("engine_kind", "metrics_generation", *CACHE_SETTINGS, "hybrid"),
        "1 per engine: the inference server's kind, detected metric generation and cache settings.",
        "A new metrics_generation after an upgrade is expected; check dashboards still read.",
    ),
    MetricDoc(
        "kvcache_gpu_memory_utilization",
        "gauge",
        "ratio",
        KEY,
        "The --gpu-memory-utilization vLLM runs with (vllm:cache_config_info's gpu_memory_utilization label), "
        "as a number to chart beside the suggestion; absent when vLLM does not export it.",
        "Compare with kvcache_suggested_gpu_memory_utilization; ignored by vLLM when --kv-cache-memory-bytes is set.",
    ),
    MetricDoc(
        "kvcache_engine_asleep",
        "gauge",
        "bool",
        KEY,
        "1 while the engine sleeps (vllm:engine_sleep_state other than awake), else 0.",
        "Forecasts and over-provisioning advice are suppressed while asleep.",
    ),
    # --- the capacity model (only with model.config; docs/capacity.md) ---
    MetricDoc(
        "kvcache_theoretical_bytes_per_token",
        "gauge",
        "bytes",
        KEY,
        "KV bytes one token costs per rank from config.json: 2 x layers x kv_heads x head_dim x dtype bytes "
        "(MLA: layers x 576 x bytes; hybrids: the full-attention layers that grow with context).",
        "Changes with --kv-cache-dtype or TP; fp8 halves it.",
    ),
    MetricDoc(
        "kvcache_theoretical_capacity_tokens",
        "gauge",
        "tokens",
        KEY + ("budget",),
        "Capacity the model's shape gives for vLLM's KV budget: budget=exact from vLLM's "
        "kv_cache_memory_bytes (equals vLLM's figure), budget=estimated from model.gpu_memory x utilization "
        "minus weights, activations and non-torch memory.",
        "Compare with kvcache_capacity_tokens (KVCacheCapacityMismatch).",
    ),
    MetricDoc(
        "kvcache_capacity_efficiency_ratio",
        "gauge",
        "ratio",
        KEY + ("budget",),
        "vLLM's actual capacity / the theoretical one.",
        "Off 1 by >20% with budget=exact: config drift (dtype, TP, draft layers, num_gpu_blocks_override).",
    ),
    MetricDoc(
        "kvcache_model_info",
        "info",
        "",
        KEY + ("architecture", "attention", "kv_dtype", "tp", "pp"),
        "1, labelled with the model's architecture, attention kind (mha/gqa/mqa/mla/hybrid), KV dtype, TP and PP.",
        "Check after a model or flag change that the sidecar's model section still matches vLLM.",
    ),
    MetricDoc(
        "kvcache_model_setting_info",
        "info",
        "",
        KEY + ("setting", "value", "source"),
        "1 per serving setting the capacity model uses (tensor_parallel_size, pipeline_parallel_size, dtype, "
        "max_model_len, kv_cache_dtype, gpu_memory_utilization, kv_cache_memory_bytes, max_num_seqs, "
        "max_num_batched_tokens, enforce_eager), labelled with its value and where it came from: cmdline "
        "(vLLM's command line, model.process_discovery; a flag the command line leaves out is vLLM's default "
        "for it, known to be what runs), metrics (vLLM's page), config (the model: section) or "
        "default. Absent when model.config is not set.",
        "source=config or default for tensor_parallel_size on a sharded model: the sidecar cannot see vLLM's "
        'process (docs/kubernetes.md, "Tensor and pipeline parallelism").',
    ),
    MetricDoc(
        "kvcache_budget_dominant_overhead_info",
        "info",
        "",
        KEY + ("term",),
        "1, labelled with the largest term of the estimated KV budget after the weights: forward (the profile's "
        'forward pass), sampler (its sampler warm-up), non_torch or cudagraph (docs/capacity.md, "The budget").',
        "sampler: lower --max-num-seqs; forward: lower --max-num-batched-tokens; cudagraph: --enforce-eager "
        "or fewer capture sizes; each frees KV memory.",
    ),
    MetricDoc(
        "kvcache_model_config_loaded",
        "gauge",
        "bool",
        KEY + ("reason",),
        "1 when the served model's config.json (model.config: a file, a model directory or a Hugging Face hub "
        "cache) is loaded (reason loaded); 0 while it is not, with why: waiting (no such path yet, or vLLM has "
        "not named its model), not_found (the hub cache lacks the served model), download_in_progress, invalid. "
        "Absent when model.config is not set.",
        "0 for long: the capacity gauges are absent; the sidecar's log names the path and the fix "
        "(docs/configuration.md, model.config).",
    ),
    # --- forecast and advice (docs/forecast.md) ---
    MetricDoc(
        "kvcache_demand_tokens",
        "gauge",
        "tokens",
        KEY,
        "KV the current work needs: used tokens, plus what requests waiting for capacity would take when "
        "usage is at or above the watermark (queueing by max_num_seqs or the token budget at low usage "
        "is not KV pressure).",
        "Above the usable capacity: the cache is the bottleneck; see the recommendation.",
    ),
    MetricDoc(
        "kvcache_fill_rate_tokens_per_second",
        "gauge",
        "tokens/s",
        KEY,
        "Trend of kvcache_demand_tokens (Theil-Sen slope of the upper envelope) over forecast.window or "
        "one of forecast.long_windows, whichever runs the cache out first; published after 5 samples "
        "spanning 10s.",
        "Positive and steady: the cache is filling; see time until full.",
    ),
    MetricDoc(
        "kvcache_time_until_full_seconds",
        "gauge",
        "seconds",
        KEY,
        "Tokens free above where the demand stands now (its highest level over the last 100 s by default, "
        "requests waiting for KV included, or a rising trend's line) / fill rate; +Inf when not filling, 0 "
        "when at most one block is free at that level.",
        "Below 15 minutes: KVCacheFullSoon (not in the engine's first 10 minutes); act before preemptions start.",
    ),
    MetricDoc(
        "kvcache_time_until_watermark_seconds",
        "gauge",
        "seconds",
        KEY,
        "Watermark headroom above the demand's peaks / fill rate; +Inf when not filling, 0 at or above the watermark.",
        "When the paging watermark will be crossed at the current trend.",
    ),
    MetricDoc(
        "kvcache_burst_tokens",
        "gauge",
        "tokens",
        KEY,
        "Largest rise of kvcache_demand_tokens within a minute over forecast.burst_window (1h by default): at each "
        "sample, demand minus its minimum over the preceding 60s (or since the previous scrape, when scrapes are a "
        "minute or more apart; never across a gap of more than twice the one before: missed scrapes), the maximum "
        "over the window. Counted from forecast.window after the engine's start, restart or wake-up from sleep (a "
        "fill from empty is no burst), published once those samples span 60s; 0 when the demand never rose.",
        "The burst the pool has had to absorb lately: read it with kvcache_burst_headroom_ratio.",
    ),
    MetricDoc(
        "kvcache_burst_headroom_ratio",
        "gauge",
        "ratio",
        KEY,
        "Free tokens now (usable capacity minus kvcache_demand_tokens, at least 0) / kvcache_burst_tokens; +Inf when "
        "the burst is 0. Below 1: a burst as large as the largest of the last forecast.burst_window would not fit "
        "now (requests would wait or be preempted).",
        "Whether a burst like the last hour's largest would fit now, where the time until full reads 0 or +Inf. "
        "Below 1 is common on bursty pools that never preempt: read it with the preemptions; near 0 while they "
        "rise, add KV capacity or replicas.",
    ),
    MetricDoc(
        "kvcache_engine_start_time_seconds",
        "gauge",
        "seconds",
        KEY,
        "Unix time the engine's current process started as the sidecar saw it: its first scrape of the engine, "
        "moved to the scrape at which vllm:prompt_tokens_total went down (vLLM restarted).",
        "KVCacheFullSoon waits until the engine has run for a while: a server filling from empty after a "
        "start, restart or scale-out under load is not a capacity problem.",
    ),
    MetricDoc(
        "kvcache_max_concurrent_requests",
        "gauge",
        "requests",
        KEY + ("basis",),
        "Requests that fit at once in the usable blocks: basis=max_model_len (vLLM's assumption), "
        "observed_mean and observed_p95 (prompt + generation lengths over derive.window).",
        "Compare observed_mean with kvcache_requests_running to see how close concurrency is to the limit.",
    ),
    MetricDoc(
        "kvcache_suggested_gpu_memory_utilization",
        "gauge",
        "ratio",
        KEY + ("basis",),
        "The engine's memory fraction (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static, "
        "TensorRT-LLM free_gpu_memory_fraction) at which the peak demand over forecast.peak_window sits at "
        "thresholds.target_usage: u0 + (C* - C0) x bytes_per_token / M, clamped (TensorRT-LLM: in proportion "
        "to its blocks); basis=configured or inferred GPU memory, or proportional (TensorRT-LLM).",
        "Apply it on the next deploy as the setting kvcache_recommendation_info's action names "
        "(raise/lower_gpu_memory_utilization, _mem_fraction_static, _free_gpu_memory_fraction).",
    ),
    MetricDoc(
        "kvcache_suggested_kv_cache_memory_bytes",
        "gauge",
        "bytes",
        KEY,
        "--kv-cache-memory-bytes at which the peak demand sits at target_usage (when vLLM runs with it, "
        "utilization is ignored).",
        "Apply it when the recommendation says raise/lower_kv_cache_memory_bytes.",
    ),
    MetricDoc(
        "kvcache_gpu_memory_bytes",
        "gauge",
        "bytes",
        KEY + ("basis", "gpu"),
        "GPU memory per rank M the memory suggestion is sized with: basis=configured (model.gpu_memory; gpu is "
        "its GPU name, such as H100-80GB, when given as one, else empty) or inferred from the pool and the "
        "model's non-KV memory (gpu empty); absent without model.config or a utilization to infer it from.",
        "The dashboards size each workload's --gpu-memory-utilization from it (u0 + (C* - C0) x "
        "bytes_per_token / M) and name the GPU; an empty gpu: set model.gpu_memory to the GPU's name.",
    ),
    MetricDoc(
        "kvcache_capacity_shortfall_tokens",
        "gauge",
        "tokens",
        KEY,
        "Tokens the largest allowed pool (forecast.utilization_max) still lacks to hold the peak at "
        "target_usage; absent when there is no shortfall.",
        "Memory alone cannot fix it: fp8 KV cache, more replicas, or shorter requests.",
    ),
    MetricDoc(
        "kvcache_suggested_replicas",
        "gauge",
        "replicas",
        KEY,
        "Replicas this server's peak needs so that it sits at target_usage on each, at the largest allowed "
        "pool; with a shortfall. Each sidecar sees one server's share of the load.",
        "Scale the deployment to the sum over its pods (a pod without a shortfall counts 1; one pod: this value).",
    ),
    MetricDoc(
        "kvcache_lever_capacity_tokens",
        "gauge",
        "tokens",
        KEY + ("lever",),
        "With a shortfall, the effect of the cheaper levers at the largest allowed pool: lever=fp8_kv_cache "
        "(capacity x dtype bytes), half_kv_heads (a model with half the KV heads), max_model_len (the longest "
        "max_model_len that still fits the running requests).",
        "Pick the lever that covers the shortfall before adding replicas.",
    ),
    MetricDoc(
        "kvcache_recommendation_info",
        "info",
        "",
        KEY + ("action", "reason"),
        "1 for the current top recommendation; action in none, raise/lower_gpu_memory_utilization, "
        "raise/lower_kv_cache_memory_bytes, enable_fp8_kv_cache, add_replicas, lower_max_model_len "
        "(reasons: docs/forecast.md).",
        "Follow the action on the next change window; none/engine_asleep while vLLM sleeps.",
    ),
    # --- self-monitoring ---
    MetricDoc(
        "kvcache_sidecar_target_up",
        "gauge",
        "bool",
        ("target",),
        "1 when the last scrape of the target succeeded.",
        "0 for long: vLLM is down, loading, or unreachable (KVCacheSidecarScrapeFailing).",
    ),
    MetricDoc(
        "kvcache_sidecar_scrape_duration_seconds",
        "gauge",
        "seconds",
        ("target",),
        "Duration of the last scrape of the target (HTTP and parsing).",
        "Rising towards the timeout: vLLM answers slowly, typically when saturated.",
    ),
    MetricDoc(
        "kvcache_sidecar_scrape_errors_total",
        "counter",
        "scrapes",
        ("target", "reason"),
        "Failed scrapes by reason: refused, timeout, http_4xx, http_5xx, too_large, invalid_text, empty, "
        "no_engine_metrics, token_file, sample_limit, label_limit, invalid_value, parse_timeout.",
        "The reason says where to look: network, vLLM health, the URL, or a limit (docs/limits.md).",
    ),
    MetricDoc(
        "kvcache_sidecar_series_dropped_total",
        "counter",
        "series",
        ("target", "reason"),
        "Series read from the target but not used, by reason: invalid_value (NaN, a negative count, a usage "
        "outside 0-1), duplicate_series (the whole family), histogram_mismatch (one per histogram), "
        "label_values (past targets[].label_values_limit), no_capacity (one per engine and scrape: the engine's "
        "page gives no KV capacity and targets[].capacity_tokens is not set: capacity, free, headroom and "
        "time-until-full are not exported). All exported at 0 from the start.",
        "Rising: the page the target serves is broken or hostile; the sidecar's log names the series.",
    ),
    MetricDoc(
        "kvcache_sidecar_last_success_timestamp_seconds",
        "gauge",
        "seconds",
        ("target",),
        "Unix time of the last successful scrape; absent before the first one.",
        "time() - this > staleness: derived gauges have been withdrawn.",
    ),
    MetricDoc(
        "kvcache_sidecar_config_changes_total",
        "counter",
        "changes",
        ("target",),
        "Times vLLM's cache configuration (vllm:cache_config_info) changed between scrapes: a restart "
        "with new settings.",
        "Expected after a deploy; unexpected ones mean someone changed vLLM's flags.",
    ),
    MetricDoc(
        "kvcache_sidecar_export_errors_total",
        "counter",
        "values",
        (),
        "Derived values the exporter refused since the start: a name not in the catalogue or labels that do "
        "not fit its row (a bug, logged once per name; the rest of the page is served). Exported only once "
        "non-zero, so a healthy sidecar's page does not change.",
        "Above 0: a derivation layer has a bug; report the sidecar's log line with its version.",
    ),
    MetricDoc(
        "kvcache_sidecar_history_write_errors_total",
        "counter",
        "writes",
        (),
        "Failed writes of the embedded history (history.path): disk full, file locked by another "
        "process, removed or replaced; 1 from the start when the file could not be used at all (the "
        "sidecar then serves without a history). Exported only when history.path is set.",
        "Above 0 and rising: the weekly report from this history will have gaps; see the sidecar's log.",
    ),
    MetricDoc(
        "kvcache_sidecar_config_last_reload_successful",
        "gauge",
        "bool",
        (),
        "1 when the last reload of the sidecar's own configuration (SIGHUP, POST /-/reload, or a change of "
        "--config.file or --web.config.file) was applied; 0 when it was refused and the previous one "
        "keeps running. 1 at start; 0 from the start when --config.file could not be used: the sidecar then "
        "serves its built-in configuration (flags, environment, defaults) and reads the file again every few "
        "seconds until it can (docs/reload.md).",
        "0: the new configuration was refused; the sidecar's log names the field (docs/reload.md). Fix the file.",
    ),
    MetricDoc(
        "kvcache_sidecar_config_last_reload_success_timestamp_seconds",
        "gauge",
        "seconds",
        (),
        "Unix time the running configuration was loaded: the last successful reload, else the start.",
        "Older than the last ConfigMap change while last_reload_successful is 0: the change is not in effect.",
    ),
    MetricDoc(
        "kvcache_sidecar_config_reloads_total",
        "counter",
        "reloads",
        ("result",),
        "Reloads of the sidecar's own configuration since the start, by result (success, failure; both "
        "exported at 0 from the start).",
        "A rising failure count: someone keeps applying a configuration the sidecar refuses.",
    ),
    MetricDoc(
        "kvcache_sidecar_build_info",
        "info",
        "",
        ("version",),
        "1, labelled with the sidecar's version.",
        "Absent: the sidecar is down (KVCacheSidecarDown).",
    ),
)

BY_NAME = {m.name: m for m in CATALOGUE}

#: One derived value of one engine: a number (None = not exported), or for a row with labels beyond
#: :data:`KEY` a number per tuple of those labels' values (``{("capacity",): 56.0}``).
Gauge = float | None | Mapping[tuple[str, ...], float]
#: What a derivation gives for one engine: a value per catalogue row. The exporter refuses (logs once
#: and counts) a row that is not one of :data:`CATALOGUE`'s.
Values = Mapping[MetricDoc, Gauge]


def entry(name: str) -> MetricDoc:
    """The catalogue row called ``name``; :class:`KeyError` naming it when there is none."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in sidecar.metrics.CATALOGUE: add its row first") from None


#: The ten gauges on-call reads first, in reading order (the README's short table).
ONCALL = (
    "kvcache_usage_ratio",
    "kvcache_watermark_headroom_tokens",
    "kvcache_free_tokens",
    "kvcache_time_until_full_seconds",
    "kvcache_preemptions_per_second",
    "kvcache_requests_waiting",
    "kvcache_suggested_gpu_memory_utilization",
    "kvcache_recommendation_info",
    "kvcache_prefix_cache_hit_ratio",
    "kvcache_sidecar_target_up",
)
