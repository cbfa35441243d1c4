"""The advice policy on plain numbers: memory mode, suggestions, shortfall, levers and the warm-up gate.

The hand-computed GPU of test_forecast_sizing: 131,072 B/token (Llama-3-8B-like), blocks of 16,
80 GiB, so 655,360 tokens per 1.0 of utilization; vLLM runs 98,304 tokens (6144 blocks, 6143
usable = 98,288 tokens).
"""

from __future__ import annotations

import pytest

from sidecar.capacity import NonKVBytes
from sidecar.forecast.policy import AdviceSettings, Pool, ServedModel, advise
from sidecar.forecast.recommendation import Recommendation

GiB = 2**30
BPT = 131_072
M = 80 * GiB
C0 = 6144 * 16
USABLE = C0 - 16
ADVICE_SETTINGS = AdviceSettings(target_usage=0.75, utilization_min=0.5, utilization_max=0.95, peak_window_s=3600.0)
WATCHED = 3600.0  # a whole peak window: the gate is open
NON_KV = NonKVBytes(weights=15 * GiB, activation=1.5 * GiB, non_torch=0.5 * GiB, cudagraph=0.0)


def model(
    *,
    gpu_memory: float | None = M,
    non_kv: NonKVBytes = NON_KV,
    kv_dtype_bytes: float = 2,
    kv_heads: int = 8,
    attention: str = "gqa",
    tp: int = 1,
) -> ServedModel:
    return ServedModel(
        bytes_per_token=BPT,
        kv_dtype_bytes=kv_dtype_bytes,
        kv_heads=kv_heads,
        attention=attention,
        tensor_parallel=tp,
        gpu_memory_bytes=gpu_memory,
        non_kv_bytes=lambda: non_kv,
    )


def never() -> NonKVBytes:
    raise AssertionError("the non-KV bytes were read although nothing needs them")


def by_utilization(u0: float = 0.85, **kw: object) -> Pool:
    return Pool(capacity_tokens=C0, block_size=16, gpu_memory_utilization=u0, **kw)  # type: ignore[arg-type]


def by_bytes(kv_bytes: float = C0 * BPT, **kw: object) -> Pool:
    return Pool(capacity_tokens=C0, block_size=16, kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=0.9, **kw)  # type: ignore[arg-type]


# --- memory mode: gpu_memory_utilization ------------------------------------------------------------------


def test_raise_utilization_with_the_configured_gpu_memory():
    # peak 98,292 at 0.75 -> C* = 131,072 tokens; u* = 0.85 + 32,768 / 655,360 = 0.90
    served = ServedModel(
        bytes_per_token=BPT,
        kv_dtype_bytes=2,
        kv_heads=8,
        attention="gqa",
        tensor_parallel=1,
        gpu_memory_bytes=M,
        non_kv_bytes=never,
    )
    a = advise(
        peak_demand_tokens=98_292, watched_s=WATCHED, pool=by_utilization(), model=served, settings=ADVICE_SETTINGS
    )
    assert a.recommendation == Recommendation("raise_gpu_memory_utilization", "peak_above_target")
    basis, u = a.suggested_gpu_memory_utilization
    assert basis == "configured" and u == pytest.approx(0.90, abs=1e-12)
    assert a.suggested_kv_cache_memory_bytes is None
    # C_max at 0.95 = 98,304 + 0.10 x 655,360 = 163,840 >= C*: no shortfall, no replicas, no levers
    assert (a.capacity_shortfall_tokens, a.suggested_replicas, a.lever_capacity_tokens) == (None, None, {})


def test_gpu_memory_is_inferred_from_the_pool_when_not_configured():
    # 450,560 tokens x 131,072 B = 55 GiB of KV + 17 GiB non-KV = 72 GiB = 0.9 x M -> M = 80 GiB
    pool = Pool(capacity_tokens=450_560, block_size=16, gpu_memory_utilization=0.9)
    a = advise(
        peak_demand_tokens=0.9 * (450_560 - 16),
        watched_s=WATCHED,
        pool=pool,
        model=model(gpu_memory=None),
        settings=ADVICE_SETTINGS,
    )
    basis, u = a.suggested_gpu_memory_utilization
    assert basis == "inferred"
    assert u == 0.95  # C* = 540,672 needs 0.9 + 90,112 / 655,360 = 1.04: clamped to hi
    # ... and the largest pool (hi) is 450,560 + 0.05 x 655,360 = 483,328 < C*: short by 57,344
    assert a.capacity_shortfall_tokens == 540_672 - 483_328
    assert a.recommendation == Recommendation("enable_fp8_kv_cache", "shortfall_fp8_covers")


def test_without_the_capacity_model_there_is_no_utilization_to_suggest():
    a = advise(
        peak_demand_tokens=98_292, watched_s=WATCHED, pool=by_utilization(), model=None, settings=ADVICE_SETTINGS
    )
    assert a.suggested_gpu_memory_utilization is None and a.suggested_kv_cache_memory_bytes is None
    assert a.capacity_shortfall_tokens is None and a.lever_capacity_tokens == {}
    assert a.recommendation == Recommendation("raise_gpu_memory_utilization", "peak_above_target")


# --- memory mode: kv_cache_memory_bytes (vLLM ignores the utilization then) ----------------------------------


def test_kv_cache_memory_bytes_mode_names_the_setting_that_acts():
    # no model: bytes per token from vLLM's own pool, 12 GiB / 98,304 tokens = 131,072; no GPU size: no cap
    a = advise(peak_demand_tokens=98_292, watched_s=WATCHED, pool=by_bytes(), model=None, settings=ADVICE_SETTINGS)
    assert a.recommendation == Recommendation("raise_kv_cache_memory_bytes", "peak_above_target")
    assert a.suggested_kv_cache_memory_bytes == 131_072 * BPT  # C* x bytes per token = 16 GiB
    assert a.suggested_gpu_memory_utilization is None
    assert a.capacity_shortfall_tokens is None


def test_kv_cache_memory_bytes_capped_by_the_gpu_with_shortfall_replicas_and_levers():
    # 0.95 x 80 GiB - (60 + 1.5 + 0.5) GiB = 14 GiB of KV at most = 7168 blocks of 2 MiB = 114,688 tokens
    heavy = NonKVBytes(weights=60 * GiB, activation=1.5 * GiB, non_torch=0.5 * GiB, cudagraph=0.0)
    pool = by_bytes(requests_running=10)
    a = advise(
        peak_demand_tokens=120_000, watched_s=WATCHED, pool=pool, model=model(non_kv=heavy), settings=ADVICE_SETTINGS
    )
    assert a.suggested_kv_cache_memory_bytes == 14 * GiB  # C* = 160,016 tokens would need more: capped
    assert a.capacity_shortfall_tokens == 160_016 - 114_688
    assert a.suggested_replicas == 2  # ceil(120,000 / (0.75 x 114,672))
    assert a.lever_capacity_tokens == {
        "fp8_kv_cache": 2 * 114_688,  # 1-byte KV doubles the blocks
        "half_kv_heads": 2 * 114_688,  # 8 -> 4 KV heads
        "max_model_len": (7167 // 10) * 16,  # 10 running requests at full length in 7167 usable blocks
    }
    assert list(a.lever_capacity_tokens) == ["fp8_kv_cache", "half_kv_heads", "max_model_len"]
    assert a.recommendation == Recommendation("enable_fp8_kv_cache", "shortfall_fp8_covers")


def test_the_cap_is_never_below_the_budget_vllm_runs_with_now():
    # estimates saying the GPU has no room left (non-KV > 0.95 x M) still allow today's 12 GiB
    huge = NonKVBytes(weights=80 * GiB, activation=0.0, non_torch=0.0, cudagraph=0.0)
    a = advise(
        peak_demand_tokens=120_000,
        watched_s=WATCHED,
        pool=by_bytes(),
        model=model(non_kv=huge),
        settings=ADVICE_SETTINGS,
    )
    assert a.suggested_kv_cache_memory_bytes == 12 * GiB
    assert a.capacity_shortfall_tokens == 160_016 - C0


# --- levers that do not apply ----------------------------------------------------------------------------------


def test_levers_left_out_when_they_cannot_help():
    heavy = NonKVBytes(weights=60 * GiB, activation=1.5 * GiB, non_torch=0.5 * GiB, cudagraph=0.0)
    # fp8 already, MLA (one latent head), and max_model_len already below what 10 requests would allow
    served = model(non_kv=heavy, kv_dtype_bytes=1, attention="mla", kv_heads=8)
    a = advise(
        peak_demand_tokens=120_000,
        watched_s=WATCHED,
        pool=by_bytes(requests_running=10, max_model_len=8192),
        model=served,
        settings=ADVICE_SETTINGS,
    )
    assert a.capacity_shortfall_tokens == 160_016 - 114_688
    assert a.lever_capacity_tokens == {}
    assert a.recommendation == Recommendation("add_replicas", "shortfall_at_upper_bound")


# --- the warm-up gate ------------------------------------------------------------------------------------------


QUIET = 0.3 * USABLE  # peak usage 0.3: memory could be given back


def test_warming_up_withholds_lowering_the_utilization():
    a = advise(peak_demand_tokens=QUIET, watched_s=60.0, pool=by_utilization(), model=model(), settings=ADVICE_SETTINGS)
    assert a.recommendation == Recommendation("none", "insufficient_data")
    assert a.suggested_gpu_memory_utilization is None  # it would be below the 0.85 in use
    after = advise(
        peak_demand_tokens=QUIET, watched_s=3600.0, pool=by_utilization(), model=model(), settings=ADVICE_SETTINGS
    )
    assert after.recommendation == Recommendation("lower_gpu_memory_utilization", "peak_below_target")
    assert after.suggested_gpu_memory_utilization[1] < 0.85


def test_warming_up_withholds_lowering_the_kv_bytes():
    a = advise(peak_demand_tokens=QUIET, watched_s=3599.0, pool=by_bytes(), model=None, settings=ADVICE_SETTINGS)
    assert a.recommendation == Recommendation("none", "insufficient_data")
    assert a.suggested_kv_cache_memory_bytes is None
    after = advise(peak_demand_tokens=QUIET, watched_s=3600.0, pool=by_bytes(), model=None, settings=ADVICE_SETTINGS)
    assert after.recommendation == Recommendation("lower_kv_cache_memory_bytes", "peak_below_target")
    assert after.suggested_kv_cache_memory_bytes < 12 * GiB


def test_warming_up_withholds_lower_max_model_len_too():
    # one 98,288-token request fills the pool: the advice would be to lower max_model_len
    pool = by_utilization(max_model_len=USABLE)
    a = advise(peak_demand_tokens=QUIET, watched_s=0.0, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert a.recommendation == Recommendation("none", "insufficient_data")
    after = advise(peak_demand_tokens=QUIET, watched_s=WATCHED, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert after.recommendation == Recommendation("lower_max_model_len", "max_model_len_blocks_lowering")


def test_a_peak_above_target_is_evidence_at_once():
    a = advise(peak_demand_tokens=98_292, watched_s=0.0, pool=by_utilization(), model=model(), settings=ADVICE_SETTINGS)
    assert a.recommendation == Recommendation("raise_gpu_memory_utilization", "peak_above_target")
    assert a.suggested_gpu_memory_utilization == ("configured", pytest.approx(0.90, abs=1e-12))
    b = advise(peak_demand_tokens=98_292, watched_s=0.0, pool=by_bytes(), model=None, settings=ADVICE_SETTINGS)
    assert b.suggested_kv_cache_memory_bytes == 16 * GiB


# --- per lever: SGLang's --mem-fraction-static, TensorRT-LLM's free_gpu_memory_fraction, none ---------------


def by_sglang(f0: float = 0.85) -> Pool:
    """SGLang: token-granular (page_size 1), no null block, --mem-fraction-static of TOTAL memory."""
    return Pool(
        capacity_tokens=C0, block_size=1, gpu_memory_utilization=f0, memory_lever="mem_fraction_static", null_blocks=0
    )


def by_trtllm(f0: float = 0.5, blocks: int = 1000) -> Pool:
    """TensorRT-LLM: 1000 blocks of 32 tokens, no null block, free_gpu_memory_fraction of FREE memory."""
    return Pool(
        capacity_tokens=blocks * 32,
        block_size=32,
        gpu_memory_utilization=f0,
        memory_lever="free_gpu_memory_fraction",
        null_blocks=0,
    )


def test_sglang_lever_takes_vllms_inverse_formula_by_hand() -> None:
    """98,304 tokens at 0.85; one unit of the fraction is 80 GiB ÷ 131,072 B = 655,360 tokens.

    Peak 98,304 at target 0.75 wants ⌈131,072⌉ + 1 virtual null token = 131,073 tokens in vLLM's
    convention; the pool is 98,304 + 1 = 98,305 there, so f* = 0.85 + 32,768 ÷ 655,360 = 0.90.
    """
    from sidecar.forecast.policy import advice_text, capacity_after, flags_to_set

    pool = by_sglang()
    advice = advise(peak_demand_tokens=98_304, watched_s=WATCHED, pool=pool, model=model(), settings=ADVICE_SETTINGS)
    assert advice.recommendation == Recommendation("raise_mem_fraction_static", "peak_above_target")
    assert advice.suggested_gpu_memory_utilization == ("configured", pytest.approx(0.90))
    assert capacity_after(advice, pool, model()) == 131_072  # the engine's own figure: + 32,768 tokens
    assert flags_to_set(advice, pool) == ("--mem-fraction-static 0.90",)
    assert advice_text(advice, pool) == "--mem-fraction-static 0.90 (a share of the GPU's TOTAL memory)"


def test_sglang_lever_is_not_inferred_from_vllms_profile() -> None:
    """Without model.gpu_memory, M would come from vLLM's non-KV terms: no SGLang suggestion then."""
    advice = advise(
        peak_demand_tokens=98_304,
        watched_s=WATCHED,
        pool=by_sglang(),
        model=model(gpu_memory=None),
        settings=ADVICE_SETTINGS,
    )
    assert advice.recommendation.action == "raise_mem_fraction_static"
    assert advice.suggested_gpu_memory_utilization is None


def test_trtllm_lever_by_hand() -> None:
    """f0 0.5, B0 1000 blocks of 32; peak 26,400 at 0.75 wants ⌈35,200 ÷ 32⌉ = 1100 blocks: f* = 0.5 × 1.1 = 0.55.

    Usage at the peak is 26,400 ÷ 32,000 = 0.825 (no null block), above target + 0.05: raise.
    """
    from sidecar.forecast.policy import advice_text, capacity_after, current_flags, flags_to_set

    pool = by_trtllm()
    advice = advise(peak_demand_tokens=26_400, watched_s=WATCHED, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert advice.recommendation == Recommendation("raise_free_gpu_memory_fraction", "peak_above_target")
    assert advice.suggested_gpu_memory_utilization == ("proportional", pytest.approx(0.55))
    assert advice.capacity_shortfall_tokens is None
    assert capacity_after(advice, pool, None) == 1100 * 32
    assert current_flags(pool) == ("--kv_cache_free_gpu_memory_fraction 0.50",)
    assert flags_to_set(advice, pool) == ("--kv_cache_free_gpu_memory_fraction 0.55",)
    text = advice_text(advice, pool)
    assert text.startswith("--kv_cache_free_gpu_memory_fraction 0.550 (") and "FREE after the weights" in text


def test_trtllm_lever_shortfall_by_hand() -> None:
    """Peak 60,000 wants 2500 blocks: f* = 1.25 > 1, clamped to hi 0.95, which gives ⌊1000 × 0.95 ÷ 0.5⌋ = 1900.

    C_max = (1900 + 1 virtual) × 32 = 60,832; C* = (2500 + 1) × 32 = 80,032: shortfall 19,200 tokens;
    replicas ⌈60,000 ÷ (0.75 × 60,800)⌉ = 2.
    """
    advice = advise(
        peak_demand_tokens=60_000, watched_s=WATCHED, pool=by_trtllm(), model=None, settings=ADVICE_SETTINGS
    )
    assert advice.recommendation == Recommendation("add_replicas", "shortfall_at_upper_bound")
    assert advice.suggested_gpu_memory_utilization == ("proportional", pytest.approx(0.95))
    assert advice.capacity_shortfall_tokens == 19_200
    assert advice.suggested_replicas == 2


def test_trtllm_lever_without_its_fraction_names_the_lever_only() -> None:
    """The page does not carry free_gpu_memory_fraction: the action still names it, no value is made up."""
    pool = by_trtllm(f0=None)  # type: ignore[arg-type]
    advice = advise(peak_demand_tokens=26_400, watched_s=WATCHED, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert advice.recommendation == Recommendation("raise_free_gpu_memory_fraction", "peak_above_target")
    assert advice.suggested_gpu_memory_utilization is None


def test_no_lever_gives_replicas_at_todays_pool_by_hand() -> None:
    """TGI / llama.cpp: 32,000 tokens, peak 28,000 (usage 0.875): C* = (⌈37,333.3 ÷ 32⌉ + 1) × 32 = 37,376.

    Today's pool is the largest (32,000 + 1 virtual block = 32,032): shortfall 5,344 tokens, replicas
    ⌈28,000 ÷ (0.75 × 32,000)⌉ = 2; a peak below target says nothing to lower.
    """
    pool = Pool(capacity_tokens=32_000, block_size=32, memory_lever=None, null_blocks=0)
    advice = advise(peak_demand_tokens=28_000, watched_s=WATCHED, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert advice.recommendation == Recommendation("add_replicas", "no_memory_lever")
    assert advice.suggested_gpu_memory_utilization is None
    assert advice.capacity_shortfall_tokens == 5_344
    assert advice.suggested_replicas == 2
    quiet = advise(peak_demand_tokens=8_000, watched_s=WATCHED, pool=pool, model=None, settings=ADVICE_SETTINGS)
    assert quiet.recommendation == Recommendation("none", "no_memory_lever")
    assert quiet.capacity_shortfall_tokens is None
