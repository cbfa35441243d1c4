"""Per-engine capacity arithmetic (sidecar/capacity/engines.py) against real configs and printed figures.

Real values used:
* Llama-3.1-8B's config.json (tests/fixtures/model-configs): 32 layers x 8 KV heads x 128 x 2 (K, V)
  x 2 bytes (bf16) = 131,072 bytes per token on one GPU;
* TGI 2.4.0 printing ``KV-cache blocks: 123449, size: 1`` and inferring ``MAX_BATCH_TOTAL_TOKENS =
  123449`` (huggingface/text-generation-inference issue #2748, 2024-11-21, flashinfer attention);
* TGI's BLOCK_SIZE per backend (text-generation-inference models/globals.py lines 38-46);
* SGLang printing ``KV Cache is allocated. #tokens: 367404, K size: 8.23 GB`` for Qwen3-235B-A22B-FP8 at
  ``--tp 4`` (vllm-project/vllm issue #21348, 2025-07-22).
"""

from __future__ import annotations

import json

import pytest
from capacity_fixtures import GiB, config_path

from sidecar.capacity import CapacityError, kv_layout, load_model, spec_from_dict, weights_bytes
from sidecar.capacity.cli import main
from sidecar.capacity.engines import (
    TGI_BLOCK_SIZE,
    engine_bytes_per_token,
    sglang_capacity,
    sglang_fraction_for,
    tgi_block_size,
    tgi_capacity,
    tgi_max_batch_total_tokens,
    trtllm_capacity,
    trtllm_fraction_for,
)


@pytest.fixture(scope="module")
def llama8b():  # type: ignore[no-untyped-def]
    return kv_layout(load_model(config_path("Llama-3.1-8B")), tp=1)


def test_tgi_block_size_per_attention_backend_is_tgis_table() -> None:
    assert TGI_BLOCK_SIZE == {"flashdecoding": 256, "flashinfer": 1, "flashdecoding-ipex": 64, "paged": 16}
    with pytest.raises(CapacityError, match="--tgi-attention: 'flash'"):
        tgi_block_size("flash")


def test_tgi_2_4_flashinfer_log_gives_its_max_batch_total_tokens() -> None:
    # text-generation-inference issue #2748: "KV-cache blocks: 123449, size: 1" and MAX_BATCH_TOTAL_TOKENS = 123449.
    assert tgi_max_batch_total_tokens(123449, "flashinfer") == 123449
    # the same blocks under paged attention would be 16 tokens each
    assert tgi_max_batch_total_tokens(123449, "paged") == 1_975_184


def test_bytes_per_token_of_llama_3_1_8b_is_the_same_for_every_engine(llama8b) -> None:  # type: ignore[no-untyped-def]
    for engine in ("vllm", "sglang", "trtllm", "tgi"):
        assert engine_bytes_per_token(llama8b, engine) == 32 * 8 * 128 * 2 * 2 == 131_072


def test_tgi_capacity_on_an_80_gib_gpu_by_hand(llama8b) -> None:  # type: ignore[no-untyped-def]
    total = 80 * GiB
    free = total - 15 * GiB  # weights only (the warmup peak is the caveat)
    cap = tgi_capacity(llama8b, total_bytes=total, free_after_warmup_bytes=free, attention="paged")
    budget = int(free - 0.10 * total)  # 1 - 1.0 x 0.90 of total kept back
    assert cap.kv_budget_bytes == budget
    assert cap.num_blocks == budget // (131_072 * 16)
    assert cap.capacity_tokens == cap.num_blocks * 16
    assert "warmup" in cap.caveat
    flash = tgi_capacity(llama8b, total_bytes=total, free_after_warmup_bytes=free)  # flashinfer: 1 token blocks
    assert flash.capacity_tokens == budget // 131_072 >= cap.capacity_tokens


def test_sglang_fraction_is_a_share_of_total_memory_and_inverts(llama8b) -> None:  # type: ignore[no-untyped-def]
    total, free = 80 * GiB, 65 * GiB
    cap = sglang_capacity(llama8b, total_bytes=total, free_after_weights_bytes=free, mem_fraction_static=0.88)
    assert cap.kv_budget_bytes == int(free - total * 0.12)
    assert cap.capacity_tokens == int(free - total * 0.12) // 131_072
    f = sglang_fraction_for(cap.capacity_tokens, 131_072, total_bytes=total, free_after_weights_bytes=free)
    assert f == pytest.approx(0.88, abs=131_072 / total)


def test_trtllm_fraction_is_a_share_of_free_memory_and_inverts(llama8b) -> None:  # type: ignore[no-untyped-def]
    free = 65 * GiB
    cap = trtllm_capacity(llama8b, free_after_weights_bytes=free, free_gpu_memory_fraction=0.9)
    assert cap.kv_budget_bytes == int(free * 0.9)
    assert cap.block_size == 32 and cap.capacity_tokens % 32 == 0
    assert cap.capacity_tokens == (int(free * 0.9) // (131_072 * 32)) * 32
    f = trtllm_fraction_for(cap.capacity_tokens, 131_072, free_after_weights_bytes=free)
    assert f == pytest.approx(0.9, abs=32 * 131_072 / free)
    # read as a share of TOTAL (vLLM's meaning: 0.9 x 80 GiB - 15 GiB of weights) the budget would be
    # 57 GiB, not 58.5 GiB: the two readings differ by (1 - 0.9) x the weights
    assert cap.kv_budget_bytes - (int(80 * GiB * 0.9) - 15 * GiB) == pytest.approx(0.1 * 15 * GiB, abs=1)


def test_bad_fractions_name_the_flag(llama8b) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CapacityError, match="--mem-fraction-static"):
        sglang_capacity(llama8b, total_bytes=GiB, free_after_weights_bytes=GiB, mem_fraction_static=1.5)
    with pytest.raises(CapacityError, match="--free-gpu-memory-fraction"):
        trtllm_capacity(llama8b, free_after_weights_bytes=GiB, free_gpu_memory_fraction=0)
    with pytest.raises(CapacityError, match="--engine"):
        engine_bytes_per_token(llama8b, "ollama")


def run_capacity(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["capacity", "--model-config", str(config_path("Llama-3.1-8B")), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_engine_tgi_prints_tgis_figures(capsys: pytest.CaptureFixture[str], llama8b) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run_capacity(capsys, "--gpu-memory", "80GiB", "--engine", "tgi", "--tgi-attention", "paged")
    weights = weights_bytes(load_model(config_path("Llama-3.1-8B")), tp=1, pp=1, dtype=llama8b.served_dtype)
    cap = tgi_capacity(llama8b, total_bytes=80 * GiB, free_after_warmup_bytes=80 * GiB - weights, attention="paged")
    assert code == 0
    assert f"capacity: {cap.capacity_tokens:,} tokens" in out
    assert f"blocks: {cap.num_blocks:,} of 16 tokens" in out
    assert "warmup activation peak" in out  # the figure says what it leaves out


def test_cli_engine_json_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_capacity(capsys, "--gpu-memory", "80GiB", "--engine", "trtllm", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["engine"] == "trtllm" and data["lever"] == "free_gpu_memory_fraction"
    assert data["capacity_tokens"] == data["num_blocks"] * 32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "tgi"), "--engine tgi: give --gpu-memory"),
        (("--engine", "sglang", "--gpu-memory", "80GiB"), "--engine sglang: give --mem-fraction-static"),
        (("--engine", "sglang", "--gpu-memory", "80GiB", "--mem-fraction-static", "x"), "--mem-fraction-static: 'x'"),
        (("--engine", "trtllm", "--gpu-memory", "8GiB"), "do not hold the weights"),
    ],
)
def test_cli_engine_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = run_capacity(capsys, *args)
    assert (code, out) == (2, "")
    assert message in err and err.count("\n") == 1


#: Qwen/Qwen3-235B-A22B's config.json, the fields the KV arithmetic reads (the model card's file;
#: the -FP8 checkpoint has the same shape and bfloat16 as its torch_dtype).
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}


def test_sglang_cell_size_matches_the_k_size_sglang_printed() -> None:
    # vllm-project/vllm issue #21348: SGLang, Qwen3-235B-A22B-FP8, --tp 4, printed
    # "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB" (SGLang's GB = 2^30).
    layout = kv_layout(spec_from_dict(QWEN3_235B), tp=4)
    cell = engine_bytes_per_token(layout, "sglang")
    assert cell == 1 * 128 * 94 * 2 * 2  # one KV head per rank at tp 4, K and V, bf16
    k_size_gib = 367_404 * cell / 2 / GiB
    assert f"{k_size_gib:.2f}" == "8.23"
