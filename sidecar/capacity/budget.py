"""The KV memory budget: GPU memory × utilization minus what is not KV.

``available ≈ total × gpu_memory_utilization − weights − activation peak −
non-torch memory (− CUDA-graph estimate from vLLM 0.21)``, per rank
(``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``;
``docs/capacity.md``, "The budget").

``gpu_memory_utilization`` is a fraction of the GPU's TOTAL memory, not of
what is left after the weights (a common reading gets this wrong: that 90% of
"total − weights − overhead" goes to the KV pool; docs/capacity.md, "The budget").

The weights term is exact when ``model.safetensors.index.json`` is present,
otherwise computed from the config's shapes. The activation, non-torch and
CUDA-graph terms are documented estimates (ranges seen in real vLLM logs);
each can be overridden with a measured value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from ..units import parse_size
from .blocks import CUDAGRAPH_BUDGET_SINCE, parse_version
from .config import ModelSpec
from .dtypes import dtype_bytes, served_dtype
from .errors import CapacityError
from .layout import KVLayout, get_pp_indices

GiB = 1 << 30
MiB = 1 << 20

#: Total memory vLLM sees per GPU (``torch.cuda.mem_get_info`` total), in
#: GiB as vLLM prints it with two decimals, so ±5 MiB. Sources: vLLM's own
#: start-up lines "Free memory on device (x/TOTAL GiB)" and PyTorch's OOM
#: message "TOTAL GiB total capacity" quoted in public logs; see docs/capacity.md.
GPU_TOTAL_GIB: dict[str, float] = {
    "H100-80GB": 79.19,  # vLLM logs "Free memory on device (78.66/79.19 GiB)" on H100 80GB
    "H200-141GB": 139.72,  # vLLM issue #23192 "Free memory on device (7.34/139.72 GiB)"
    "A100-80GB": 79.15,  # PyTorch OOM "79.15 GiB total capacity" on A100 80GB
    "A100-40GB": 39.39,  # vLLM "Free memory on device cuda:0 (3.71/39.39 GiB)"
    "L4": 22.05,  # vLLM CI (L4) in pytorch/pytorch#175666 "(19.77/22.05 GiB)"
    "A10G": 22.19,  # PyTorch OOM "22.19 GiB total capacity" on AWS A10G
    "RTX-4090": 23.65,  # PyTorch OOM message "23.65 GiB total capacity" (a 24 GB card)
    "RTX-3090": 23.69,  # PyTorch OOM "23.69 GiB total capacity"
    "T4": 14.75,  # PyTorch OOM "14.75 GiB total capacity" (Colab T4)
    "V100-16GB": 15.77,  # PyTorch OOM "15.77 GiB total capacity"
    "V100-32GB": 31.74,  # PyTorch OOM "31.74 GiB total capacity"
}

_GPU_ALIASES: dict[str, str] = {
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-PCIE": "H100-80GB",
    "H100-SXM-80GB": "H100-80GB",
    "H100-PCIE-80GB": "H100-80GB",
    "H100-80G": "H100-80GB",
    "H200": "H200-141GB",
    "A100": "A100-80GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-80G": "A100-80GB",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-40G": "A100-40GB",
    "4090": "RTX-4090",
    "RTX4090": "RTX-4090",
    "3090": "RTX-3090",
    "RTX3090": "RTX-3090",
    "V100": "V100-16GB",
}


def gpu_memory_bytes(name: str) -> int | None:
    """Total memory of a known GPU name (``H100-80GB``, ``a100 40gb``...), else None."""
    key = re.sub(r"[\s_]+", "-", name.strip().upper()).replace("NVIDIA-", "")
    key = _GPU_ALIASES.get(key, key)
    gib = GPU_TOTAL_GIB.get(key)
    return None if gib is None else round(gib * GiB)


def parse_memory(text: str, name: str = "--gpu-memory") -> int:
    """Bytes from ``80GiB`` (2^30), ``80GB`` (10^9), a plain byte count, or a GPU name.

    A known GPU name (``H100-80GB``) gives the total memory vLLM sees, which
    is less than the marketing size (an H100 80GB reports 79.19 GiB).
    Errors name ``name``: the calculator's flag, or the sidecar's config field.
    """
    raw = str(text)
    known = gpu_memory_bytes(raw)
    if known is not None:
        return known
    try:
        value = parse_size(raw)
    except ValueError:
        names = ", ".join(GPU_TOTAL_GIB)
        raise CapacityError(
            f"{name}: {raw!r} is not a size or a known GPU (write 80GiB, 80GB = 80×10^9 bytes, or one of: {names})"
        ) from None
    if value <= 0:
        raise CapacityError(f"{name}: {raw!r} must be more than 0")
    return value


# ----------------------------------------------------------------- weights

#: Bits per weight of quantized linear layers, scales included: fp8 = 8;
#: int4 AWQ/GPTQ with group 128 = 4 + 16-bit scale (+ zero) per 128 ≈ 4.25;
#: mxfp4 = 4 + one 8-bit scale per 32 = 4.25 (OCP MX spec).
_QUANT_BITS: dict[str, float] = {
    "fp8": 8.0,
    "fbgemm_fp8": 8.0,
    "compressed-tensors-fp8": 8.0,
    "awq": 4.25,
    "awq_marlin": 4.25,
    "gptq": 4.25,
    "gptq_marlin": 4.25,
    "mxfp4": 4.25,
    "bitsandbytes": 4.5,
}


def _quant_bits(quant: Mapping[str, Any] | None) -> tuple[float | None, bool]:
    """(bits per quantized weight, experts_only) from ``quantization_config``."""
    if not quant:
        return None, False
    method = str(quant.get("quant_method", "")).lower()
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        # n-bit weights plus fp16 scales and packed zeros per group of 128, rounded up.
        return float(quant.get("bits") or quant.get("w_bit") or 4) + 0.25, False
    if method == "mxfp4":
        # gpt-oss keeps attention, router, embeddings and lm_head in bf16.
        return _QUANT_BITS["mxfp4"], True
    if method in _QUANT_BITS:
        return _QUANT_BITS[method], False
    if method == "compressed-tensors":
        return 8.0, False  # most published compressed-tensors checkpoints are w8a8/fp8
    raise CapacityError(
        f"config.json: quantization_config.quant_method: {method!r} is not modelled"
        " (give the measured size: --weights-memory for `kv-sidecar capacity`, model.weights_memory for"
        " the sidecar; or put model.safetensors.index.json next to config.json)"
    )


def parameter_counts(spec: ModelSpec) -> dict[str, int]:
    """Parameter counts by part (embeddings, attention, dense MLP, experts), whole model.

    Shapes as in the Hugging Face modelling files: gated MLP ``3 × hidden ×
    intermediate``; GQA attention ``hidden × (heads + 2 × kv_heads) × head_dim
    + heads × head_dim × hidden``; MLA projections (DeepSeek-V2/V3); MoE
    ``experts × 3 × hidden × moe_intermediate`` plus shared experts and router.
    Norms and biases are below 0.1% and ignored.
    """
    t = spec.text
    h, L = spec.hidden_size, spec.num_layers
    vocab = int(spec.vocab_size or 0)
    heads = spec.num_attention_heads
    counts = {"embeddings": vocab * h * (1 if spec.tie_word_embeddings else 2)}

    if spec.is_mla:
        rope, nope = int(t["qk_rope_head_dim"]), int(t.get("qk_nope_head_dim") or 0)
        v_head = int(t.get("v_head_dim") or nope)
        q_rank = t.get("q_lora_rank")
        q = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank * heads * (nope + rope)
        kv = h * (int(t["kv_lora_rank"]) + rope) + int(t["kv_lora_rank"]) * heads * (nope + v_head)
        attn = q + kv + heads * v_head * h
    else:
        hd, kvh = spec.head_dim, spec.num_kv_heads
        attn = h * (heads + 2 * kvh) * hd + heads * hd * h
    linear_layers = 0
    if t.get("full_attention_interval") and t.get("linear_num_value_heads"):
        # Qwen3-Next: GDN layers replace attention; size their projections alike.
        nk, nv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
        hk, hv = int(t["linear_key_head_dim"]), int(t["linear_value_head_dim"])
        linear_layers = L - L // int(t["full_attention_interval"])
        gdn = h * (2 * nk * hk + 2 * nv * hv + 2 * nv) + nv * hv * h
        counts["attention"] = (L - linear_layers) * attn + linear_layers * gdn
    else:
        counts["attention"] = L * attn

    experts = int(t.get("n_routed_experts") or t.get("num_local_experts") or t.get("num_experts") or 0)
    inter = int(spec.intermediate_size or 0)
    if experts:
        moe_inter = int(t.get("moe_intermediate_size") or inter)
        dense_layers = int(t.get("first_k_dense_replace") or 0)
        shared = int(t.get("n_shared_experts") or 0) * moe_inter + int(t.get("shared_expert_intermediate_size") or 0)
        moe_layers = L - dense_layers
        counts["mlp"] = dense_layers * 3 * h * inter + moe_layers * (3 * h * shared + h * experts)
        counts["experts"] = moe_layers * experts * 3 * h * moe_inter
    else:
        counts["mlp"] = L * 3 * h * inter
        counts["experts"] = 0
    return counts


def _largest_stage_share(num_layers: int, pp: int) -> float:
    """Fraction of the layers on the most loaded pipeline stage (``get_pp_indices``)."""
    sizes = [end - start for start, end in (get_pp_indices(num_layers, r, pp) for r in range(pp))]
    return max(sizes) / num_layers


def weights_bytes(spec: ModelSpec, *, tp: int = 1, pp: int = 1, dtype: str | None = None) -> int:
    """Weight bytes resident on the most loaded rank.

    With ``model.safetensors.index.json``: its ``metadata.total_size`` (the
    checkpoint as stored, quantized or not) ÷ tp, × the limiting stage's share
    of layers. Otherwise parameter counts (``parameter_counts``) × the served
    dtype's bytes, with quantized linear layers at their bits per weight.
    Checked against vLLM's "Model loading took X GiB": Llama-3.1-8B bf16
    14.99 GiB (docs/capacity.md, "The budget").
    """
    stage_share = _largest_stage_share(spec.num_layers, pp)
    if spec.safetensors_total_bytes:
        return int(spec.safetensors_total_bytes * stage_share / tp)
    counts = parameter_counts(spec)
    weight_b = dtype_bytes(served_dtype(spec.config_dtype, dtype))
    bits, experts_only = _quant_bits(spec.quantization)
    linear = counts["attention"] + counts["mlp"] + counts["experts"]
    layer_bytes: float
    if bits is None:
        layer_bytes = linear * weight_b
    elif experts_only:
        layer_bytes = (counts["attention"] + counts["mlp"]) * weight_b + counts["experts"] * bits / 8
    else:
        layer_bytes = linear * bits / 8
    total = counts["embeddings"] * weight_b + layer_bytes * stage_share
    return int(total / tp)


# --------------------------------------------------------- other memory terms


def activation_estimate_bytes(
    spec: ModelSpec, layout: KVLayout, max_num_batched_tokens: int, max_num_seqs: int = 256
) -> int:
    """Estimated torch peak of vLLM's profiling run (``profile_run``).

    The dummy forward pass over ``max_num_batched_tokens`` tokens keeps about
    two hidden-size and two MLP-width activations live (in/out of the widest
    op) in the served dtype, and the dummy sampler over ``max_num_seqs``
    requests holds about three fp32 vocab-wide tensors (logits, probs,
    sorted). It lands in the 0.2–1.5 GiB range vLLM logs show at
    ``max_num_batched_tokens`` 2048 for ≤ 8B models (docs/capacity.md, "The budget"),
    which is this term's source; it is the main error of the estimate, so
    pass the measured "peak activation" when you have it.
    """
    t = spec.text
    moe_width = int(t.get("moe_intermediate_size") or 0) * int(t.get("num_experts_per_tok") or 0)
    width = moe_width or int(spec.intermediate_size or 0)
    act_b = dtype_bytes(layout.served_dtype)
    forward = max_num_batched_tokens * (2 * spec.hidden_size + 2 * width // layout.tp) * act_b * 2
    sampler = max_num_seqs * int(spec.vocab_size or 0) * 4 * 3
    return forward + sampler


def non_torch_estimate_bytes(layout: KVLayout) -> int:
    """Estimated non-torch memory (CUDA context extras, cuBLAS workspaces, NCCL buffers).

    0.03–0.6 GiB in real logs, growing with tensor parallelism and custom
    all-reduce (docs/capacity.md, "The budget"): 0.15 GiB on one GPU, 0.5 GiB with TP/PP.
    """
    return int(0.15 * GiB) if layout.tp * layout.pp == 1 else int(0.5 * GiB)


def cudagraph_estimate_bytes(layout: KVLayout) -> int:
    """Estimated CUDA-graph memory vLLM ≥ 0.21 subtracts before sizing the KV cache.

    vLLM logs "Estimated CUDA graph memory" of 0.36–5 GiB (``profile_cudagraph_memory`` in
    ``vllm/v1/worker/gpu_model_runner.py``); it grows with the number
    of layers captured. 16 MiB per layer on the rank, at least 0.36 GiB.
    """
    return max(int(0.36 * GiB), layout.layers_per_rank * 16 * MiB)


@dataclass(frozen=True)
class NonKVBytes:
    """What stays on one rank besides the KV cache (bytes): vLLM's ``non_kv_cache_memory`` and CUDA graphs."""

    weights: int
    activation: int
    non_torch: int
    cudagraph: int

    @property
    def total(self) -> int:
        return self.weights + self.activation + self.non_torch + self.cudagraph


def non_kv_bytes(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    max_num_batched_tokens: int,
    weights: int | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int = 0,
) -> NonKVBytes:
    """Weights, activation peak and non-torch memory on the most loaded rank: each the measured value
    when given (vLLM's start-up log), else the estimate above; the CUDA-graph term as given."""
    w = weights_bytes(spec, tp=layout.tp, pp=layout.pp, dtype=layout.served_dtype) if weights is None else weights
    act = (
        activation_estimate_bytes(spec, layout, max_num_batched_tokens)
        if activation_bytes is None
        else activation_bytes
    )
    nt = non_torch_estimate_bytes(layout) if non_torch_bytes is None else non_torch_bytes
    return NonKVBytes(w, act, nt, cudagraph_bytes)


@dataclass(frozen=True)
class Budget:
    """The KV cache budget of one rank and how it was formed (bytes)."""

    kv_budget_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    #: "exact" when given (--kv-cache-memory-bytes or a measured value), "estimated" otherwise
    source: str = "estimated"


def exact_budget(kv_cache_memory_bytes: int) -> Budget:
    """A budget given as ``--kv-cache-memory-bytes`` (vLLM then ignores the utilization)."""
    if (
        isinstance(kv_cache_memory_bytes, bool)
        or not isinstance(kv_cache_memory_bytes, int)
        or kv_cache_memory_bytes <= 0
    ):
        raise CapacityError(
            f"--kv-cache-memory-bytes: must be a positive number of bytes, got {kv_cache_memory_bytes!r}"
        )
    return Budget(kv_cache_memory_bytes, kv_cache_memory_bytes, 0, 0, 0, 0, 0, 0.0, source="exact")


def check_utilization(value: float) -> float:
    """vLLM's ``CacheConfig`` bound: 0 < gpu_memory_utilization ≤ 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise CapacityError(f"--gpu-memory-utilization: must be in (0, 1], got {value!r} (vLLM's default is 0.9)")
    return float(value)


class MeasuredMemory(TypedDict, total=False):
    """Measured non-KV terms that replace ``estimate_budget``'s estimates (bytes per rank)."""

    activation_bytes: int | None
    non_torch_bytes: int | None
    cudagraph_bytes: int | None


def estimate_budget(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int = 2048,
    vllm_version: str | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int | None = None,
    weights: int | None = None,
) -> Budget:
    """``total × utilization − weights − activation − non-torch (− CUDA graphs on ≥ 0.21)``.

    vLLM ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``): the
    utilization is a fraction of TOTAL memory per GPU. The CUDA-graph term is
    subtracted only from v0.21.0 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
    default on); ``vllm_version=None`` means the newest rules. The result
    may be ≤ 0; ``num_blocks`` refuses it as vLLM does.
    """
    if gpu_memory_bytes <= 0:
        raise CapacityError(f"--gpu-memory: must be more than 0 bytes, got {gpu_memory_bytes}")
    util = check_utilization(gpu_memory_utilization)
    requested = int(gpu_memory_bytes * util)
    if cudagraph_bytes is None:
        v = parse_version(vllm_version)
        cudagraph_bytes = cudagraph_estimate_bytes(layout) if v is None or v >= CUDAGRAPH_BUDGET_SINCE else 0
    rest = non_kv_bytes(
        spec,
        layout,
        max_num_batched_tokens=max_num_batched_tokens,
        weights=weights,
        activation_bytes=activation_bytes,
        non_torch_bytes=non_torch_bytes,
        cudagraph_bytes=cudagraph_bytes,
    )
    return Budget(
        kv_budget_bytes=requested - int(rest.total),
        requested_bytes=requested,
        weights_bytes=rest.weights,
        activation_bytes=rest.activation,
        non_torch_bytes=rest.non_torch,
        cudagraph_bytes=cudagraph_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=util,
        source="estimated",
    )
