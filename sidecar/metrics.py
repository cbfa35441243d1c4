"""The catalogue of every metric the sidecar exports: one row each.

The exporter builds its families from these rows (name, type, HELP), the
README's metric table is generated from them (``kv-sidecar docs metrics``),
and ``tests/test_metric_docs.py`` fails when the README, this table and what
the exporter actually emits disagree.
"""

from __future__ import annotations

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


CATALOGUE: tuple[MetricDoc, ...] = (
    # --- capacity from vLLM's own signals (issue 2) ---
    MetricDoc("kvcache_usage_ratio", "gauge", "ratio", KEY,
              "KV-cache usage 0-1: blocks held by running requests / usable blocks (vllm:kv_cache_usage_perc "
              "or vllm:gpu_cache_usage_perc).",
              "Above 0.9 requests start to queue and be preempted: see KVCacheAlmostFull."),
    MetricDoc("kvcache_capacity_tokens", "gauge", "tokens", KEY,
              "vLLM's KV capacity in tokens (kv_cache_size_tokens label, else num_gpu_blocks x block_size; "
              "includes the null block). Not exported for hybrid models.",
              "Changes only on restart with new settings; compare with kvcache_theoretical_capacity_tokens."),
    MetricDoc("kvcache_used_tokens", "gauge", "tokens", KEY,
              "Tokens held: round(usage x (num_gpu_blocks - 1)) x block_size (whole blocks).",
              "Read with kvcache_free_tokens: how much room is left in tokens."),
    MetricDoc("kvcache_free_tokens", "gauge", "tokens", KEY,
              "Tokens still allocatable: (num_gpu_blocks - 1) x block_size - used (block 0 is vLLM's null block).",
              "Near 0: new requests wait and running ones get preempted."),
    MetricDoc("kvcache_watermark_headroom_tokens", "gauge", "tokens", KEY,
              "Tokens left before usage crosses the watermark (thresholds.watermark); 0 above it.",
              "0 means the paging watermark is crossed."),
    MetricDoc("kvcache_prefix_cache_queries_tokens_total", "counter", "tokens", KEY,
              "Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries_total or the gpu_ name).",
              "Aggregate with rate(); the hit ratio is hits/queries."),
    MetricDoc("kvcache_prefix_cache_hits_tokens_total", "counter", "tokens", KEY,
              "Prompt tokens found in the prefix cache (vllm:prefix_cache_hits_total or the gpu_ name).",
              "Falling hits at steady traffic: prompts stopped sharing prefixes or the cache is evicting."),
    MetricDoc("kvcache_preemptions_total", "counter", "requests", KEY,
              "Requests preempted for lack of KV blocks (vllm:num_preemptions_total; resets on restart).",
              "Any sustained rate means the cache is too small for the load: see KVCachePreemptions."),
    MetricDoc("kvcache_prefix_cache_hit_ratio", "gauge", "ratio", KEY,
              "Prefix-cache hits / queries over derive.window (V0: vLLM's hit-rate gauge). Absent when prefix "
              "caching is off or nothing was queried.",
              "Low ratio with shared system prompts: check routing affinity and enable_prefix_caching."),
    MetricDoc("kvcache_preemptions_per_second", "gauge", "1/s", KEY,
              "Preemptions per second over derive.window (reset-safe).",
              "Above 0 for minutes: raise KV capacity or lower concurrency."),
    MetricDoc("kvcache_requests_running", "gauge", "requests", KEY,
              "Requests in the running batch (vllm:num_requests_running).",
              "Compare with max_num_seqs; flat at it means the scheduler, not KV, is the limit."),
    MetricDoc("kvcache_requests_waiting", "gauge", "requests", KEY + ("reason",),
              "Requests waiting, by vLLM's reason. reason=capacity means SCHEDULER capacity: KV blocks, but also "
              "max_num_seqs or the per-step token budget, so waiting is not by itself KV pressure; "
              "reason=all when vLLM exports only the total.",
              "KV pressure only together with usage above the watermark (KVCacheRequestsWaitingForKV)."),
    MetricDoc("kvcache_server_info", "info", "", KEY + ("engine_kind", "metrics_generation", "block_size",
                                                        "num_gpu_blocks", "cache_dtype", "gpu_memory_utilization",
                                                        "kv_cache_memory_bytes", "enable_prefix_caching", "hybrid"),
              "1 per engine: the inference server's kind, detected metric generation and cache settings.",
              "A new metrics_generation after an upgrade is expected; check dashboards still read."),
    MetricDoc("kvcache_engine_asleep", "gauge", "bool", KEY,
              "1 while the engine sleeps (vllm:engine_sleep_state other than awake), else 0.",
              "Forecasts and over-provisioning advice are suppressed while asleep."),
    # --- self-monitoring ---
    MetricDoc("kvcache_sidecar_target_up", "gauge", "bool", ("target",),
              "1 when the last scrape of the target succeeded.",
              "0 for long: vLLM is down, loading, or unreachable (KVCacheSidecarScrapeFailing)."),
    MetricDoc("kvcache_sidecar_scrape_duration_seconds", "gauge", "seconds", ("target",),
              "Duration of the last scrape of the target (HTTP and parsing).",
              "Rising towards the timeout: vLLM answers slowly, typically when saturated."),
    MetricDoc("kvcache_sidecar_scrape_errors_total", "counter", "scrapes", ("target", "reason"),
              "Failed scrapes by reason: refused, timeout, http_4xx, http_5xx, too_large, invalid_text, empty, "
              "no_engine_metrics.",
              "The reason says where to look: network, vLLM health, the URL, or the body size limit."),
    MetricDoc("kvcache_sidecar_last_success_timestamp_seconds", "gauge", "seconds", ("target",),
              "Unix time of the last successful scrape; absent before the first one.",
              "time() - this > staleness: derived gauges have been withdrawn."),
    MetricDoc("kvcache_sidecar_config_changes_total", "counter", "changes", ("target",),
              "Times vLLM's cache configuration (vllm:cache_config_info) changed between scrapes: a restart "
              "with new settings.",
              "Expected after a deploy; unexpected ones mean someone changed vLLM's flags."),
    MetricDoc("kvcache_sidecar_build_info", "info", "", ("version",),
              "1, labelled with the sidecar's version.",
              "Absent: the sidecar is down (KVCacheSidecarDown)."),
)

BY_NAME = {m.name: m for m in CATALOGUE}


def markdown_table() -> str:
    """The README's metric table."""
    lines = ["| name | type | unit | labels | meaning | when it moves |", "|---|---|---|---|---|---|"]
    for m in CATALOGUE:
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.name}` | {m.type} | {m.unit} | {labels} | {m.help} | {m.action} |")
    return "\n".join(lines) + "\n"
