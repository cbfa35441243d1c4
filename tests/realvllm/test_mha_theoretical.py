"""Real vLLM: the theoretical capacity from config.json equals vLLM's to the token (docs/capacity.md).

A second tiny model of a different shape from the GQA one: MHA with ``num_key_value_heads`` and
``head_dim`` absent from config.json (defaults: KV heads = heads, head_dim = hidden / heads), a
float32 config that vLLM serves as bfloat16, and ``--block-size 64`` instead of the CPU default 128,
under a deliberately non-round 3,000,000-byte budget. The sidecar gets the model directory
(``--model.config``) and must reproduce vLLM's ``kv_cache_size_tokens`` exactly.

The same server (in this module, so that it starts once) proves that the sidecar finds vLLM's API server
in this machine's /proc and learns its flags: the server (``python -m vllm.entrypoints.openai.api_server
--model DIR --port P --enforce-eager --max-model-len 1024 --kv-cache-memory-bytes 3000000 --block-size
64``) runs beside the test in one PID namespace, as vLLM and the sidecar do in a pod with
``shareProcessNamespace: true``. Its engine-core process (``VLLM::EngineCore``) and the resource tracker
are its children: the API server is the one found. ``mha_sidecar`` runs ``kv-sidecar run`` with
``model.process_discovery`` at its default.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from realvllm_harness import Sidecar, VllmServer

from sidecar import process_discovery as pd

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


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def test_the_api_server_is_found_and_its_flags_learnt(mha_server: VllmServer, figures):
    children = _children(mha_server.proc.pid)
    assert children, "vLLM V1 runs its engine core in a child process"
    started = time.perf_counter()
    found = pd.ProcessDiscovery(mha_server.metrics_url).poll(None)
    figures["process discovery: one /proc scan (ms)"] = round((time.perf_counter() - started) * 1000, 1)
    assert found.status == pd.FOUND, found.detail
    assert found.server is not None and found.server.pid == mha_server.proc.pid
    args = found.server.args
    assert args.model == str(mha_server.model_dir)
    assert args.listen_port == mha_server.port
    assert (args.max_model_len, args.kv_cache_memory_bytes, args.enforce_eager) == (1024, 3_000_000, True)
    assert args.tensor_parallel_size is None and args.pipeline_parallel_size is None  # vLLM's default: 1
    assert args.problems == ()
    own = Path(f"/proc/{mha_server.proc.pid}/cmdline").read_bytes()
    same = [c for c in children if Path(f"/proc/{c}/cmdline").read_bytes() == own]
    figures["vLLM children with the API server's own command line"] = f"{len(same)} of {len(children)}"


def test_the_sidecar_exports_the_learnt_values(mha_server: VllmServer, mha_sidecar: Sidecar, figures):
    page = mha_sidecar.wait_for_scrape_after(time.time())
    labels = {"model_name": mha_server.model_name, "engine": "0"}
    settings = {
        s.labels["setting"]: (s.labels["value"], s.labels["source"])
        for s in page.find("kvcache_model_setting_info", **labels)
    }
    figures["mha kvcache_model_setting_info"] = settings
    assert settings["tensor_parallel_size"] == ("1", "cmdline")
    assert settings["pipeline_parallel_size"] == ("1", "cmdline")
    assert settings["enforce_eager"] == ("true", "cmdline")  # only the command line says it
    assert settings["max_model_len"] == ("1024", "metrics")  # vLLM's page says it first
    assert settings["kv_cache_memory_bytes"] == ("3000000", "metrics")
    info = page.find("kvcache_model_info", **labels)
    assert len(info) == 1 and info[0].labels["tp"] == "1" and info[0].labels["pp"] == "1"
    log = mha_sidecar.log_path.read_text(errors="replace")
    assert f"vLLM's command line read pid={mha_server.proc.pid} port={mha_server.port}" in log
