"""Property tests over generated model shapes (derandomized when CI is set)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.capacity import CapacityError, capacity_tokens, kv_layout, num_blocks, spec_from_dict

PROFILE = settings(derandomize=bool(os.environ.get("CI")), max_examples=100, deadline=None)


@st.composite
def shapes(draw, max_layers: int = 96):
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": draw(st.integers(1, max_layers)),
        "num_attention_heads": kv_heads * group,
        "num_key_value_heads": kv_heads,
        "head_dim": draw(st.sampled_from([64, 80, 96, 128, 256])),
        "hidden_size": 4096,
        "torch_dtype": draw(st.sampled_from(["bfloat16", "float16", "float32", None])),
        "max_position_embeddings": 131072,
    }


@PROFILE
@given(shapes(), st.integers(1, 1 << 40), st.integers(0, 1 << 36), st.sampled_from([None, 16, 32, 128]))
def test_capacity_is_monotone_in_budget(config, budget, extra, block):
    layout = kv_layout(spec_from_dict(config), block_size=block)
    assert capacity_tokens(layout, budget) <= capacity_tokens(layout, budget + extra)
    assert num_blocks(layout, budget) * layout.block_bytes <= budget


@PROFILE
@given(shapes())
def test_bytes_per_token_scale_exactly_with_dtype(config):
    spec = spec_from_dict(config)
    bf16 = kv_layout(spec, dtype="bfloat16").bytes_per_token
    assert kv_layout(spec, dtype="float16").bytes_per_token == bf16
    assert kv_layout(spec, dtype="float32").bytes_per_token == 2 * bf16
    assert kv_layout(spec, kv_cache_dtype="fp8").bytes_per_token * 2 == bf16
    # auto: float32 or no dtype is served as bfloat16
    assert kv_layout(spec).bytes_per_token == bf16


@PROFILE
@given(shapes(max_layers=48), st.integers(2, 4))
def test_bytes_per_token_scale_exactly_with_layers(config, factor):
    one = kv_layout(spec_from_dict(config)).bytes_per_token
    more = kv_layout(spec_from_dict({**config, "num_hidden_layers": config["num_hidden_layers"] * factor}))
    assert more.bytes_per_token == factor * one
    assert one == 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2


@PROFILE
@given(shapes(), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from([1, 2, 4, 8, 16]))
def test_tensor_parallel_never_grows_per_rank_bytes(config, tp_small, step):
    spec = spec_from_dict(config)
    tp_large = tp_small * step
    try:
        small = kv_layout(spec, tp=tp_small).bytes_per_token
        large = kv_layout(spec, tp=tp_large).bytes_per_token
    except CapacityError:
        return  # a TP size vLLM refuses for this shape
    assert large <= small <= kv_layout(spec).bytes_per_token
