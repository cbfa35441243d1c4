"""The tables of three introductory KV-sizing articles, reproduced (values in GiB = 2^30 bytes; the
articles write "GB"). Titles and claims: docs/capacity.md, "Worked examples".

Article 1: Llama-3-8B KV table and the 24 GB card example. Article 2: the MHA
example (32 layers, hidden 4096). Article 3: Llama-2-7B / Llama-2-70B at 32K
and the INT8 (1-byte) row.
"""

from __future__ import annotations

import pytest
from capacity_fixtures import GiB, config_path

from sidecar.capacity import (
    capacity_tokens,
    inflection_context_length,
    kv_layout,
    load_model,
    max_concurrency,
    num_blocks,
    request_kv_bytes,
    spec_from_dict,
    usable_concurrency,
    usable_tokens,
    weights_bytes,
)

# Llama-3-8B has no saved config; the saved Llama-3.1-8B copy has the same
# shape (32 layers, 32 heads, 8 KV heads, head_dim 128, bf16), see SOURCES.md.
LLAMA3_8B = "Llama-3.1-8B"

#: Llama-2-70B has no saved config.json copy (SOURCES.md "Not found"): built
#: here from its published shape — 80 layers, 64 heads, 8 KV heads (GQA),
#: hidden 8192, intermediate 28672, vocab 32000, float16, 4096 positions.
LLAMA2_70B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}


@pytest.fixture(scope="module")
def llama3():
    return kv_layout(load_model(config_path(LLAMA3_8B)))


def test_llama3_8b_bytes_per_token(llama3):
    assert llama3.bytes_per_token == 131_072  # 2 × 32 × 8 × 128 × 2
    assert llama3.attention == "gqa"


@pytest.mark.parametrize(
    ("concurrency", "context", "gib"),
    [(1, 4096, 0.5), (8, 4096, 4), (32, 4096, 16), (8, 16384, 16), (32, 16384, 64)],
)
def test_seed000_llama3_table(llama3, concurrency, context, gib):
    assert llama3.bytes_per_token * context * concurrency == gib * GiB
    # The pool-exact figure (whole blocks) is the same at these block-aligned lengths.
    assert request_kv_bytes(llama3, context) * concurrency == gib * GiB


def test_seed000_kv_over_weights_at_32x16k(llama3):
    """The seed's "4×" uses a nominal 16 GB of weights; the real bf16 weights are 14.96 GiB."""
    spec = load_model(config_path(LLAMA3_8B))
    ratio = 64 * GiB / weights_bytes(spec)
    assert 4.0 <= ratio <= 4.4
    assert ratio == pytest.approx(4.28, abs=0.01)


def test_seed000_24gb_card(llama3):
    """6 GiB of KV at 4K tokens per request: 12 as vLLM counts, 11 usable (null block)."""
    budget = 6 * GiB
    blocks = num_blocks(llama3, budget)
    assert blocks == 3072  # 6 GiB / (16 tokens × 4096 B × 32 layers)
    assert capacity_tokens(llama3, budget) == 49_152
    assert usable_tokens(llama3, budget) == 49_136
    assert max_concurrency(llama3, blocks, 4096) == 12.0
    assert max_concurrency(llama3, blocks, 4096, version="0.8.5") == 12.0  # old tokens/len rule agrees here
    assert usable_concurrency(llama3, blocks, 4096) == 11


def test_seed001_mha_example():
    """32 layers, hidden 4096, MHA: 8 × 4096 tokens = 16.0 GiB (≈ 17.2 GB)."""
    spec = spec_from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "torch_dtype": "float16",
        }
    )
    layout = kv_layout(spec)
    assert layout.attention == "mha"  # no num_key_value_heads → MHA, not GQA
    total = layout.bytes_per_token * 8 * 4096
    assert total == 16 * GiB
    assert round(total / 1e9, 1) == 17.2


def test_seed002_llama2_7b():
    layout = kv_layout(load_model(config_path("Llama-2-7b-chat-hf")))
    assert layout.served_dtype == "float16"
    assert layout.bytes_per_token == 524_288
    assert layout.bytes_per_token * 32768 == 16 * GiB
    fp8 = kv_layout(load_model(config_path("Llama-2-7b-chat-hf")), kv_cache_dtype="fp8")
    assert fp8.bytes_per_token * 32768 == 8 * GiB  # the seed's INT8 row


def test_seed002_llama2_70b_built_from_shape():
    layout = kv_layout(spec_from_dict(LLAMA2_70B_CONFIG, source="Llama-2-70B (shape, no saved config)"))
    assert layout.bytes_per_token == 327_680
    assert layout.bytes_per_token * 32768 == 10 * GiB
    assert kv_layout(spec_from_dict(LLAMA2_70B_CONFIG), kv_cache_dtype="fp8").bytes_per_token * 32768 == 5 * GiB


def test_seed002_inflection_point():
    """The seed: 7B's KV passes its ~14 GB (FP16) weights before 32K tokens; 70B's stays below even at 128K."""
    spec7 = load_model(config_path("Llama-2-7b-chat-hf"))
    l7 = kv_layout(spec7)
    point = inflection_context_length(l7, weights_bytes(spec7))
    assert 16_384 < point < 32_768
    assert l7.bytes_per_token * (point - 1) <= weights_bytes(spec7) < l7.bytes_per_token * point
    spec70 = spec_from_dict(LLAMA2_70B_CONFIG)
    assert inflection_context_length(kv_layout(spec70), weights_bytes(spec70)) > 131_072
