"""The top recommendation: one scenario per reason, the fixed label sets, suppression while asleep."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.forecast import ACTIONS, REASONS, Recommendation, recommend

# The hand-computed GPU of test_forecast_sizing: 98,304 tokens (6144 blocks of 16) now,
# 131,072 at the upper bound (0.95), usable now 98,288.
NOW = 98_304
AT_HI = 131_072
BASE = dict(capacity_tokens=NOW, block_size=16, target_usage=0.75, max_capacity_tokens=AT_HI)

SCENARIOS = {
    # name: (kwargs, expected action, expected reason)
    "asleep at a huge peak": (dict(asleep=True, peak_demand_tokens=500_000), "none", "engine_asleep"),
    "warming up": (dict(asleep=False, peak_demand_tokens=None), "none", "insufficient_data"),
    "peak at target": (dict(asleep=False, peak_demand_tokens=0.75 * 98_288), "none", "within_target"),
    "peak at 0.79 (inside the dead band)": (
        dict(asleep=False, peak_demand_tokens=0.79 * 98_288),
        "none",
        "within_target",
    ),
    # 0.9 x 98,288 = 88,459 -> C* = (cdiv(117,946, 16) + 1) x 16 = 117,968 <= 131,072
    "peak at 0.9, room up to hi": (
        dict(asleep=False, peak_demand_tokens=0.9 * 98_288),
        "raise_gpu_memory_utilization",
        "peak_above_target",
    ),
    # C* = 160,016 > 131,072, but fp8 gives 262,144
    "peak beyond hi, bf16 KV": (
        dict(asleep=False, peak_demand_tokens=120_000, kv_dtype_bytes=2),
        "enable_fp8_kv_cache",
        "shortfall_fp8_covers",
    ),
    "peak beyond hi, already fp8": (
        dict(asleep=False, peak_demand_tokens=120_000, kv_dtype_bytes=1),
        "add_replicas",
        "shortfall_at_upper_bound",
    ),
    # C* = 266,688 > 2 x 131,072
    "peak beyond even fp8": (
        dict(asleep=False, peak_demand_tokens=200_000, kv_dtype_bytes=2),
        "add_replicas",
        "shortfall_at_upper_bound",
    ),
    "peak at 0.3": (
        dict(asleep=False, peak_demand_tokens=0.3 * 98_288),
        "lower_gpu_memory_utilization",
        "peak_below_target",
    ),
    # one 98,288-token request needs (6143 + 1) blocks = the whole pool: cannot shrink it
    "peak at 0.3, max_model_len fills the pool": (
        dict(asleep=False, peak_demand_tokens=0.3 * 98_288, max_model_len=98_288),
        "lower_max_model_len",
        "max_model_len_blocks_lowering",
    ),
    # the other engines' levers: the same rules, the action names the engine's own setting
    "SGLang, peak at 0.9": (
        dict(asleep=False, peak_demand_tokens=0.9 * 98_288, memory_mode="mem_fraction_static"),
        "raise_mem_fraction_static",
        "peak_above_target",
    ),
    "TensorRT-LLM, peak at 0.3": (
        dict(asleep=False, peak_demand_tokens=0.3 * 98_288, memory_mode="free_gpu_memory_fraction"),
        "lower_free_gpu_memory_fraction",
        "peak_below_target",
    ),
    # no memory setting to size (TGI, llama.cpp): replicas above target, nothing to lower below it
    "no lever, peak at 0.9": (
        dict(asleep=False, peak_demand_tokens=0.9 * 98_288, memory_mode="none"),
        "add_replicas",
        "no_memory_lever",
    ),
    "no lever, peak at 0.3": (
        dict(asleep=False, peak_demand_tokens=0.3 * 98_288, memory_mode="none"),
        "none",
        "no_memory_lever",
    ),
    "no lever, peak at target": (
        dict(asleep=False, peak_demand_tokens=0.75 * 98_288, memory_mode="none"),
        "none",
        "within_target",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_recommendation(name):
    kwargs, action, reason = SCENARIOS[name]
    assert recommend(**{**BASE, **kwargs}) == Recommendation(action, reason)


def test_every_reason_has_a_scenario():
    assert {reason for _, _, reason in SCENARIOS.values()} == set(REASONS)


def test_actions_hold_the_issues_set():
    assert set(ACTIONS) >= {
        "none",
        "raise_gpu_memory_utilization",
        "lower_gpu_memory_utilization",
        "enable_fp8_kv_cache",
        "add_replicas",
        "lower_max_model_len",
    }
    assert len(set(ACTIONS)) == len(ACTIONS)


def test_docs_list_exactly_the_actions_and_reasons():
    """docs/forecast.md is where dashboards and alerts look the labels up: the same sets, no more, no less."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "forecast.md").read_text()
    actions_section = doc.split("**Actions**", 1)[1].split("**Rules.**", 1)[0]
    assert re.findall(r"^- `([a-z_0-9]+)`$", actions_section, re.M) == list(ACTIONS)
    rules = doc.split("**Rules.**", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|") for line in rules.splitlines() if line.startswith("| ") and "`" in line]
    assert {row[-2].strip().strip("`") for row in rows} == set(REASONS)


def test_kv_cache_memory_bytes_mode_names_the_setting_vllm_obeys():
    # real gqa-6mib_full-b: demand 49,792 tokens on a 6144-token pool set by --kv-cache-memory-bytes
    rec = recommend(
        asleep=False,
        peak_demand_tokens=49_792,
        capacity_tokens=6144,
        block_size=128,
        target_usage=0.75,
        memory_mode="kv_cache_memory_bytes",
    )
    assert rec == Recommendation("raise_kv_cache_memory_bytes", "peak_above_target")
    low = recommend(
        asleep=False,
        peak_demand_tokens=500,
        capacity_tokens=6144,
        block_size=128,
        target_usage=0.75,
        memory_mode="kv_cache_memory_bytes",
        max_model_len=1024,
    )
    assert low == Recommendation("lower_kv_cache_memory_bytes", "peak_below_target")


def test_unknown_labels_are_rejected():
    with pytest.raises(ValueError, match="action"):
        Recommendation("scale_up", "peak_above_target")
    with pytest.raises(ValueError, match="reason"):
        Recommendation("none", "because")
    with pytest.raises(ValueError, match="memory_mode"):
        recommend(asleep=False, peak_demand_tokens=1, memory_mode="auto", **BASE)
