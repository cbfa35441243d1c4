"""Budget terms, memory parsing, weights, and the inverse questions."""

from __future__ import annotations

import json

import pytest
from capacity_fixtures import GiB, config_path

from sidecar.capacity import (
    CapacityError,
    activation_estimate_bytes,
    blocks_for,
    capacity_tokens,
    estimate_budget,
    exact_budget,
    kv_layout,
    load_model,
    max_concurrency,
    num_blocks,
    parse_memory,
    required_kv_cache_memory_bytes,
    required_utilization,
    weights_bytes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("80 GiB", 80 * GiB),
        ("80GB", 80 * 10**9),
        ("1.5GiB", 3 * GiB // 2),
        ("6291456", 6_291_456),
        ("6MiB", 6 * 2**20),
        ("H100-80GB", round(79.19 * GiB)),
        ("h100 80gb", round(79.19 * GiB)),
        ("A100-40GB", round(39.39 * GiB)),
    ],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


def test_h100_is_about_79_2_gib_not_80():
    assert parse_memory("H100-80GB") / GiB == pytest.approx(79.2, abs=0.05)
    # 80 GB (10^9) = 74.5 GiB < what an H100 80GB reports (79.19 GiB) < 80 GiB
    assert parse_memory("80GB") < parse_memory("H100-80GB") < parse_memory("80GiB")


@pytest.mark.parametrize("text", ["80", "lots", "80G", "-1GiB", "0GiB", "MI355X-288GB", ""])
def test_parse_memory_refuses(text):
    if text == "80":  # a bare number is bytes: valid, just tiny
        assert parse_memory(text) == 80
        return
    with pytest.raises(CapacityError, match="--gpu-memory"):
        parse_memory(text)


# ------------------------------------------------------------ weights


@pytest.mark.parametrize(
    ("name", "measured_gib", "tolerance"),
    [
        # vLLM "Model loading took X GiB" in real logs (docs/capacity.md, "The budget")
        ("Llama-3.1-8B", 14.99, 0.01),
        ("Qwen2.5-7B", 14.25, 0.01),  # Qwen2-7B has the same shape
        # mxfp4 experts: 60.7 GiB from the shapes, 6 % under the log, because vLLM's MXFP4 MoE
        # kernels pad the experts to their tile (docs/capacity.md, "The budget", the weights item)
        ("gpt-oss-120b", 64.4, 0.07),
    ],
)
def test_weights_from_shapes_match_vllm_logs(name, measured_gib, tolerance):
    got = weights_bytes(load_model(config_path(name))) / GiB
    assert got == pytest.approx(measured_gib, rel=tolerance)


def test_weights_tp_split_matches_vllm_log():
    """Qwen2-7B at TP 2: "Model loading took 7.12 GiB" per rank."""
    assert weights_bytes(load_model(config_path("Qwen2.5-7B")), tp=2) / GiB == pytest.approx(7.12, rel=0.01)


def test_fp8_checkpoint_weights_are_about_one_byte_per_parameter():
    spec = load_model(config_path("DeepSeek-V3"))  # quant_method fp8, 671B parameters
    assert 600 * GiB < weights_bytes(spec) < 700 * GiB


def test_safetensors_index_wins(tmp_path):
    (tmp_path / "config.json").write_text(config_path("Llama-3.1-8B").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16_060_522_496}, "weight_map": {}})
    )
    spec = load_model(tmp_path)
    assert spec.safetensors_total_bytes == 16_060_522_496
    assert weights_bytes(spec) == 16_060_522_496
    assert weights_bytes(spec, tp=2) == 8_030_261_248


def test_broken_safetensors_index_is_named(tmp_path):
    (tmp_path / "config.json").write_text(config_path("Llama-3.1-8B").read_text())
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CapacityError, match="metadata.total_size"):
        load_model(tmp_path)


# ------------------------------------------------------------- budget


def test_utilization_is_a_fraction_of_total_memory_not_of_what_is_left():
    """A common reading (docs/capacity.md, "Worked examples") gives KV 90% of (total − weights − overhead);
    vLLM takes total × 0.9 − the rest."""
    spec = load_model(config_path("Llama-3.1-8B"))
    layout = kv_layout(spec)
    total, w = 24 * 10**9, 16 * 10**9
    b = estimate_budget(
        spec,
        layout,
        gpu_memory_bytes=total,
        gpu_memory_utilization=0.9,
        weights=w,
        activation_bytes=10**9,
        non_torch_bytes=10**9,
        cudagraph_bytes=0,
    )
    assert b.requested_bytes == int(total * 0.9)
    assert b.kv_budget_bytes == int(total * 0.9) - w - 2 * 10**9  # 3.6 GB
    seed000 = int((total - w - 2 * 10**9) * 0.9)  # 5.4 GB: the article's reading
    assert b.kv_budget_bytes != seed000


def test_cudagraph_term_only_from_vllm_0_21():
    spec = load_model(config_path("Llama-3.1-8B"))
    layout = kv_layout(spec)
    kw = dict(gpu_memory_bytes=parse_memory("H100-80GB"), gpu_memory_utilization=0.9)
    old = estimate_budget(spec, layout, vllm_version="0.20.1", **kw)
    new = estimate_budget(spec, layout, vllm_version="0.21.0", **kw)
    assert old.cudagraph_bytes == 0 and 0.36 * GiB <= new.cudagraph_bytes <= 5 * GiB
    assert new.kv_budget_bytes == old.kv_budget_bytes - new.cudagraph_bytes


def test_activation_estimate_in_observed_range():
    """0.2–1.5 GiB at max_num_batched_tokens 2048 for ≤ 8B models in real vLLM logs.

    Source: docs/capacity.md, "The budget".
    """
    for name in ("Llama-3.1-8B", "Qwen2.5-7B", "Qwen3-8B", "Llama-2-7b-chat-hf"):
        spec = load_model(config_path(name))
        act = activation_estimate_bytes(spec, kv_layout(spec), 2048)
        assert 0.2 * GiB <= act <= 1.5 * GiB, name


def test_budget_refusals():
    spec = load_model(config_path("Llama-3.1-70B-Instruct"))
    layout = kv_layout(spec)
    b = estimate_budget(spec, layout, gpu_memory_bytes=parse_memory("A100-80GB"), gpu_memory_utilization=0.9)
    assert b.kv_budget_bytes < 0  # 131 GiB of weights on one 80 GB card
    with pytest.raises(CapacityError, match="no memory for KV cache blocks"):
        num_blocks(layout, b.kv_budget_bytes)
    with pytest.raises(CapacityError, match="--gpu-memory-utilization"):
        estimate_budget(spec, layout, gpu_memory_bytes=80 * GiB, gpu_memory_utilization=1.5)
    with pytest.raises(CapacityError, match="--kv-cache-memory-bytes"):
        exact_budget(0)


# ------------------------------------------------------------ inverse


def test_required_kv_memory_round_trips_through_num_blocks():
    layout = kv_layout(load_model(config_path("Llama-3.1-8B")))
    need = required_kv_cache_memory_bytes(layout, concurrency=12, request_tokens=4096)
    blocks = num_blocks(layout, need)
    assert blocks == blocks_for(layout, concurrency=12, request_tokens=4096) == 12 * 256 + 1
    assert int(max_concurrency(layout, blocks - 1, 4096)) == 12  # 12 usable after the null block
    assert num_blocks(layout, need - 1) == blocks - 1  # and not a byte less
    assert capacity_tokens(layout, required_kv_cache_memory_bytes(layout, tokens=100_000)) >= 100_000 + 16


def test_required_utilization_inverts_estimate_budget():
    spec = load_model(config_path("Llama-3.1-8B"))
    layout = kv_layout(spec)
    gpu = parse_memory("H100-80GB")
    util = required_utilization(spec, layout, gpu_memory_bytes=gpu, concurrency=16, request_tokens=16384)
    assert 0.5 < util < 0.7  # 32 GiB of KV + 15 GiB of weights + ~1.3 GiB of the rest, of 79.19 GiB
    enough = estimate_budget(spec, layout, gpu_memory_bytes=gpu, gpu_memory_utilization=util + 1e-9)
    assert int(max_concurrency(layout, num_blocks(layout, enough.kv_budget_bytes) - 1, 16384)) == 16
    short = estimate_budget(spec, layout, gpu_memory_bytes=gpu, gpu_memory_utilization=util - 1e-6)
    assert int(max_concurrency(layout, num_blocks(layout, short.kv_budget_bytes) - 1, 16384)) < 16
    # 64 GiB of KV + 15 GiB of weights do not fit in 79.19 GiB at any utilization
    assert required_utilization(spec, layout, gpu_memory_bytes=gpu, concurrency=32, request_tokens=16384) > 1
