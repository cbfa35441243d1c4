"""Real vLLM: the theoretical capacity from config.json equals vLLM's to the token (docs/capacity.md).

A second tiny model of a different shape from the GQA one: MHA with ``num_key_value_heads`` and
``head_dim`` absent from config.json (defaults: KV heads = heads, head_dim = hidden / heads), a
float32 config that vLLM serves as bfloat16, and ``--block-size 64`` instead of the CPU default 128,
under a deliberately non-round 3,000,000-byte budget. The sidecar gets the model directory
(``--model.config``) and must reproduce vLLM's ``kv_cache_size_tokens`` exactly.
"""

from __future__ import annotations

import json
import time

import pytest
from realvllm_harness import Sidecar, VllmServer

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(300)]


def test_theoretical_capacity_exact(mha_server: VllmServer, mha_sidecar: Sidecar, figures):
    cache = mha_server.cache_config()
    log_tokens = mha_server.kv_cache_size_tokens_from_log()
    figures["mha vLLM start (s)"] = round(mha_server.start_seconds, 1)
    figures["mha log 'CPU KV cache size' (tokens)"] = log_tokens
    figures["mha vLLM num_gpu_blocks × block_size"] = f"{cache['num_gpu_blocks']} × {cache['block_size']}"

    # Premises: the shape this test claims to exercise is the one vLLM actually served.
    config = json.loads((mha_server.model_dir / "config.json").read_text())
    assert "num_key_value_heads" not in config and "head_dim" not in config, config
    assert config["dtype"] == "float32"
    assert "Downcasting torch.float32 to torch.bfloat16" in mha_server.log_text()
    assert cache["block_size"] == "64" and cache["kv_cache_memory_bytes"] == "3000000", cache
    vllm_tokens = int(cache["kv_cache_size_tokens"])
    assert vllm_tokens == log_tokens

    labels = {"model_name": mha_server.model_name, "engine": "0"}
    page = mha_sidecar.wait_for_scrape_after(time.time())
    theoretical = page.value("kvcache_theoretical_capacity_tokens", budget="exact", **labels)
    figures["mha sidecar theoretical{exact} vs vLLM (tokens)"] = (theoretical, vllm_tokens)
    assert theoretical == vllm_tokens
    assert page.value("kvcache_capacity_tokens", **labels) == vllm_tokens
    assert page.value("kvcache_capacity_efficiency_ratio", budget="exact", **labels) == 1.0

    # The per-token figure is bracketed by vLLM's own numbers: num_blocks = ⌊budget / (B × block)⌋
    # (vLLM kv_cache_utils: page size = block_size × bytes per token over all layers) holds only for
    # B in (budget / ((blocks + 1) × block), budget / (blocks × block)]; float32 (2×) or a GQA misread
    # of the absent num_key_value_heads would land outside.
    bytes_per_token = page.value("kvcache_theoretical_bytes_per_token", **labels)
    budget, block, blocks = 3_000_000, 64, int(cache["num_gpu_blocks"])
    figures["mha sidecar theoretical bytes/token"] = bytes_per_token
    assert budget / ((blocks + 1) * block) < bytes_per_token <= budget / (blocks * block), (bytes_per_token, blocks)

    info = page.find("kvcache_model_info", **labels)
    assert len(info) == 1 and info[0].value == 1.0, info
    assert (info[0].labels["attention"], info[0].labels["kv_dtype"]) == ("mha", "bfloat16"), info[0].labels
