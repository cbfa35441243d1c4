"""Every saved config.json against docs/capacity.md's "Checked values" (bf16, TP 1), plus TP,
fp8 and the naive values a `2 · L · kv_heads · hidden/heads · 2` calculator gives.
"""

from __future__ import annotations

import pytest
from capacity_fixtures import MODEL_CONFIGS, config_path

from sidecar.capacity import CapacityError, kv_layout, layer_kinds, load_model

# name: (attention, growing-layer bytes/token, all-layers bytes/token) — docs/capacity.md, "Checked values".
B3 = {
    "Llama-2-7b-chat-hf": ("mha", 524_288, 524_288),
    "Llama-3.1-8B": ("gqa", 131_072, 131_072),
    "Llama-3.1-70B-Instruct": ("gqa", 327_680, 327_680),
    "Mistral-7B-Instruct-v0.3": ("gqa", 131_072, 131_072),
    "Qwen2.5-7B": ("gqa", 57_344, 57_344),
    "Qwen2.5-7B-Instruct": ("gqa", 57_344, 57_344),
    "Qwen3-8B": ("gqa", 147_456, 147_456),
    "Qwen3-32B": ("gqa", 262_144, 262_144),
    "Qwen3-30B-A3B": ("gqa", 98_304, 98_304),
    "gemma-2-9b-it": ("hybrid", 172_032, 344_064),
    "gemma-3-27b-it": ("hybrid", 81_920, 507_904),
    "DeepSeek-V3": ("mla", 70_272, 70_272),
    "Kimi-K2-Instruct.abridged": ("mla", 70_272, 70_272),
    "gpt-oss-20b": ("hybrid", 24_576, 49_152),
    "gpt-oss-120b": ("hybrid", 36_864, 73_728),
    "Qwen3-Next-80B-A3B-Thinking": ("hybrid", 24_576, 98_304),
}


def test_every_saved_config_is_covered():
    saved = {p.stem for p in MODEL_CONFIGS.glob("*.json")}
    assert saved == set(B3), (
        "a config was added to or removed from tests/fixtures/model-configs; update B3 here and docs/capacity.md"
    )


@pytest.mark.parametrize("name", sorted(B3))
def test_bytes_per_token_matches_b3(name):
    attention, growing, all_layers = B3[name]
    layout = kv_layout(load_model(config_path(name)))
    assert layout.attention == attention
    assert layout.kv_dtype == "bfloat16" or (name == "Llama-2-7b-chat-hf" and layout.kv_dtype == "float16")
    assert layout.bytes_per_token == growing
    assert layout.bytes_per_token_all_layers == all_layers
    assert layout.is_hybrid == (attention == "hybrid")
    assert (layout.per_request_state_bytes > 0) == layout.is_hybrid


# Naive: hidden/heads as head size, every layer full, num_key_value_heads as
# stored (MLA: qk_nope + qk_rope per head, ×2). What the model must NOT give.
NAIVE = {
    "Qwen3-32B": 163_840,  # head 80 instead of 128: −37.5%
    "Qwen3-30B-A3B": 49_152,  # head 64 instead of 128: −50%
    "gemma-2-9b-it": 301_056,  # head 224 instead of 256, and sliding layers counted
    "gemma-3-27b-it": 666_624,  # head 168 instead of 128
    "gpt-oss-20b": 34_560,  # head 45 instead of 64
    "DeepSeek-V3": 2 * 61 * 128 * 192 * 2,  # 128 KV heads × (128 + 64): ~85× too much
}


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_not_the_naive_value(name):
    layout = kv_layout(load_model(config_path(name)))
    assert layout.bytes_per_token != NAIVE[name]
    assert layout.bytes_per_token_all_layers != NAIVE[name]


def test_missing_kv_heads_means_mha_not_gqa():
    spec = load_model(config_path("Llama-2-7b-chat-hf"))
    assert spec.num_kv_heads == spec.num_attention_heads == 32


def test_qwen25_window_ignored_when_use_sliding_window_false():
    kinds = layer_kinds(load_model(config_path("Qwen2.5-7B")))
    assert {k.kind for k in kinds} == {"full"}


def test_gemma_layer_patterns():
    g2 = layer_kinds(load_model(config_path("gemma-2-9b-it")))
    assert [k.kind for k in g2[:4]] == ["sliding", "full", "sliding", "full"]
    assert sum(k.kind == "sliding" for k in g2) == 21
    g3 = layer_kinds(load_model(config_path("gemma-3-27b-it")))
    assert sum(k.kind == "full" for k in g3) == 10 and sum(k.kind == "sliding" for k in g3) == 52
    assert g3[5].kind == "full" and g3[0].window == 1024


def test_qwen3_next_hybrid_block_size_and_groups():
    """vLLM logs "Setting attention block size to 544 tokens" for Qwen3-Next (bf16 GDN state)."""
    layout = kv_layout(load_model(config_path("Qwen3-Next-80B-A3B-Thinking")))
    assert layout.block_size == 544
    assert layout.group_size == 12 and layout.num_groups == 4  # 1 full + 3 linear groups of 12
    # 36 GDN layers × one state page each (conv 8192×3 + state 32×128×128, bf16, padded to 544 × 2048 B)
    assert layout.per_request_state_bytes == 36 * 544 * 2048


# ------------------------------------------------------------------ TP


@pytest.mark.parametrize(
    ("name", "tp", "per_rank"),
    [
        ("Llama-3.1-70B-Instruct", 4, 81_920),  # docs/capacity.md: TP4 → 81,920 per rank
        ("Llama-3.1-70B-Instruct", 8, 40_960),
        ("Llama-3.1-70B-Instruct", 16, 40_960),  # 8 KV heads: replicated beyond TP 8
        ("Llama-3.1-8B", 2, 65_536),
        ("Qwen3-32B", 8, 32_768),
        ("Qwen2.5-7B", 4, 14_336),
        ("Qwen2.5-7B", 28, 14_336),  # 4 KV heads, TP 28 → still 1 head per rank
        ("Llama-2-7b-chat-hf", 32, 16_384),
        ("DeepSeek-V3", 8, 70_272),  # MLA latent is not split by TP
        ("Kimi-K2-Instruct.abridged", 16, 70_272),
        ("gpt-oss-120b", 8, 4_608),
    ],
)
def test_tensor_parallel_per_rank(name, tp, per_rank):
    assert kv_layout(load_model(config_path(name)), tp=tp).bytes_per_token == per_rank


@pytest.mark.parametrize(
    ("name", "tp"),
    [("Llama-3.1-8B", 3), ("Qwen2.5-7B", 8), ("gemma-2-9b-it", 3), ("Qwen3-30B-A3B", 5), ("DeepSeek-V3", 6)],
)
def test_tensor_parallel_not_dividing_heads_is_refused(name, tp):
    with pytest.raises(CapacityError, match="--tensor-parallel-size: .* does not divide num_attention_heads"):
        kv_layout(load_model(config_path(name)), tp=tp)


def test_pipeline_parallel_uses_vllm_split():
    spec = load_model(config_path("Llama-3.1-8B"))
    # get_pp_indices(32, ·, 3): [10, 11, 11] → the 11-layer stages limit.
    layout = kv_layout(spec, pp=3)
    assert layout.layers_per_rank == 11 and layout.bytes_per_token == 11 * 4096
    assert kv_layout(spec, pp=2).bytes_per_token == 65_536


# ----------------------------------------------------------------- fp8


@pytest.mark.parametrize(
    ("name", "fp8"),
    [("Llama-3.1-8B", 65_536), ("Qwen3-32B", 131_072), ("DeepSeek-V3", 35_136), ("gemma-3-27b-it", 40_960)],
)
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_halves(name, fp8, kv_dtype):
    layout = kv_layout(load_model(config_path(name)), kv_cache_dtype=kv_dtype)
    assert layout.bytes_per_token == fp8 and layout.kv_dtype_bytes == 1


def test_fp8_ds_mla_is_656_per_layer():
    assert kv_layout(load_model(config_path("DeepSeek-V3")), kv_cache_dtype="fp8_ds_mla").bytes_per_token == 61 * 656


def test_mla_default_block_size_is_flashmla_64():
    assert kv_layout(load_model(config_path("DeepSeek-V3"))).block_size == 64
    assert kv_layout(load_model(config_path("Llama-3.1-8B"))).block_size == 16
