"""W: the weights per rank as vLLM stores them, against vLLM's own "Model loading took X GiB"."""

from __future__ import annotations

from pathlib import Path

import pytest
from capacity_fixtures import GiB, config_path

from sidecar.capacity import CapacityError, load_model, spec_from_dict
from sidecar.capacity.startup_log import parse_startup_log
from sidecar.capacity.weights import MXFP4_PADDING, mxfp4_expert_bytes, quant_format, weights_bytes

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-logs"


@pytest.mark.parametrize(
    ("log", "config", "tp", "backend", "tolerance"),
    [
        # MXFP4 experts through Marlin on Hopper, padded 128 / 256 (vLLM issue #23278)
        ("vllm23278-gpt-oss-120b-h100.log", config_path("gpt-oss-120b"), 1, "marlin", 0.01),
        # bf16 MoE split over 4 ranks (vLLM issue #17469)
        ("vllm17469-qwen3-30b-a3b-tp4-weights.log", config_path("Qwen3-30B-A3B"), 4, "marlin", 0.01),
        # compressed-tensors W4A16, group 128, lm_head in bf16 (vLLM issue #17327)
        ("vllm17327-qwen3-30b-a3b-w4a16-3090-v0.log", LOGS / "Qwen3-30B-A3B.w4a16.config.json", 1, "marlin", 0.01),
        # Qwen2 14B at TP 2, "13.9476 GB" (GiB) per rank (vLLM issue #13061)
        (
            "vllm13061-r1-distill-qwen-14b-2x4090-tp2.log",
            LOGS / "DeepSeek-R1-Distill-Qwen-14B.config.json",
            2,
            "marlin",
            0.02,
        ),
    ],
)
def test_weights_match_vllms_model_loading_line(log, config, tp, backend, tolerance):
    logged = parse_startup_log((LOGS / log).read_text()).weights_gib
    assert logged is not None
    got = weights_bytes(load_model(config), tp=tp, mxfp4_backend=backend) / GiB
    assert got == pytest.approx(logged, rel=tolerance)


def test_mxfp4_on_hoppers_triton_backend_is_a_known_limit():
    """Triton's swizzle pads beyond its 64-multiple (64.38 GiB logged, vLLM issue #33155): the Triton
    estimate is under the log, the default (Marlin, the largest padding) over it."""
    logged = parse_startup_log((LOGS / "vllm33155-gpt-oss-120b-h100-triton-weights.log").read_text()).weights_gib
    spec = load_model(config_path("gpt-oss-120b"))
    assert weights_bytes(spec, mxfp4_backend="triton") / GiB < logged < weights_bytes(spec) / GiB


def test_mxfp4_padding_by_backend():
    """gpt-oss: H = I = 2880. Marlin pads I to 2944 and H to 3072; Triton keeps 2880."""
    marlin = mxfp4_expert_bytes(2880, 2880, backend="marlin")
    triton = mxfp4_expert_bytes(2880, 2880, backend="triton")
    i_p, h_p = 2944, 3072
    assert marlin == 2 * i_p * (h_p // 2 + h_p // 32 + 2) + h_p * (i_p // 2 + i_p // 32 + 2)
    assert triton < marlin and set(MXFP4_PADDING) >= {"marlin", "triton", "cutlass", "flashinfer-trtllm"}
    with pytest.raises(CapacityError, match="--mxfp4-backend"):
        mxfp4_expert_bytes(2880, 2880, backend="magic")


@pytest.mark.parametrize(
    ("quant", "name", "bytes_per_weight"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", 1 + 4 / 16384),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes 4-bit", 0.5 + 4 / 64),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", 0.5 + 1 / 16),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "nvfp4", 0.5 + 1 / 16),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq", 0.5 + 2.5 / 128),
    ],
)
def test_quantization_formats(quant, name, bytes_per_weight):
    fmt = quant_format(quant)
    assert fmt is not None and fmt.name == name and fmt.bytes_per_weight == pytest.approx(bytes_per_weight)


def test_an_unknown_quantization_names_the_override():
    with pytest.raises(CapacityError, match="--weights-memory"):
        quant_format({"quant_method": "hqq"})


def test_kv_projections_replicate_once_tp_exceeds_the_kv_heads():
    """Llama-3.1-8B has 8 KV heads: at TP 16 each rank still holds a whole KV head, so the ranks
    together hold more than at TP 8 (``QKVParallelLinear``)."""
    spec = load_model(config_path("Llama-3.1-8B"))
    assert weights_bytes(spec, tp=16) * 16 > weights_bytes(spec, tp=8) * 8


def test_the_vocabulary_is_padded_for_tp():
    """128,256 rows pad to 128,512 at TP 8 (a multiple of 64 x 8): a config saying 128,512 weighs the same."""
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096}
    base |= {"num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336}
    a = spec_from_dict({**base, "vocab_size": 128256})
    b = spec_from_dict({**base, "vocab_size": 128512})
    assert weights_bytes(a, tp=8) == weights_bytes(b, tp=8)
    assert weights_bytes(a, tp=1) < weights_bytes(b, tp=1)
