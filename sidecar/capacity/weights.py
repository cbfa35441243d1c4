"""``W``: the weights one rank holds after ``load_model``, quantized and padded as vLLM stores them.

vLLM measures the weights as the torch memory allocated by ``load_model`` (V1
``vllm/v1/worker/gpu_model_runner.py`` ``load_model`` under ``DeviceMemoryProfiler``, logged as
"Model loading took X GiB"), after ``process_weights_after_loading`` has repacked and padded them.
So the estimate counts the tensors as stored, not ``parameters × bits``: quantized linear layers at
their format's bytes per weight with scales, embeddings / lm_head / norms / routers in 16 bits,
the vocabulary padded for TP (``pad_vocab_size``: a multiple of 64 × tp), k/v projections
replicated when TP exceeds the KV heads, and MXFP4 experts padded to their backend's tiles.
Sources per format below and in ``docs/capacity.md``, "The terms, by vLLM's profile run".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ModelSpec
from .dtypes import dtype_bytes, served_dtype
from .errors import CapacityError
from .layout import get_pp_indices

#: ``vllm/model_executor/layers/vocab_parallel_embedding.py`` ``DEFAULT_VOCAB_PADDING_SIZE``.
VOCAB_PADDING = 64

#: MXFP4 MoE tiles by backend, (intermediate multiple, hidden multiple) as
#: ``vllm/model_executor/layers/quantization/mxfp4.py`` ``Mxfp4MoEMethod.create_weights`` pads them
#: (later ``fused_moe/oracle/mxfp4.py`` ``mxfp4_round_up_hidden_size_and_intermediate_size``):
#: Marlin (GPUs before Hopper, the fallback) 128 / 256; FlashInfer TRT-LLM (Blackwell) 256 / 256;
#: CUTLASS 128 / 128; Triton (Hopper's default) 64 / unpadded, before its swizzle adds a few percent.
MXFP4_PADDING: dict[str, tuple[int, int]] = {
    "marlin": (128, 256),
    "flashinfer-trtllm": (256, 256),
    "cutlass": (128, 128),
    "triton": (64, 1),
}
#: The largest padding: the conservative choice when the backend is not known.
DEFAULT_MXFP4_BACKEND = "marlin"


@dataclass(frozen=True)
class QuantFormat:
    """How a checkpoint's quantized linear layers are stored."""

    name: str
    #: bytes per quantized weight, scales and zeros included
    bytes_per_weight: float
    #: only the MoE experts are quantized (gpt-oss MXFP4: attention, router, embeddings stay 16-bit)
    experts_only: bool = False


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _int4_grouped(bits: int, group: int) -> float:
    """n-bit weights with a 16-bit scale (and an n-bit zero) per group: GPTQ/AWQ as Marlin repacks them."""
    per_group = 0.0 if group <= 0 else (2 + bits / 8) / group
    return bits / 8 + per_group


def _compressed_tensors(quant: Mapping[str, Any]) -> QuantFormat:
    """``compressed-tensors`` (llm-compressor): the first config group's weights scheme."""
    fmt = str(quant.get("format", "")).lower()
    if "nvfp4" in fmt:
        return QuantFormat("nvfp4", 0.5 + 1 / 16)
    groups = quant.get("config_groups")
    weights: Mapping[str, Any] = {}
    if isinstance(groups, Mapping):
        for group in groups.values():
            if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping):
                weights = group["weights"]
                break
    bits = int(weights.get("num_bits") or 8)
    if bits >= 8:
        return QuantFormat("compressed-tensors w8", 1.0)
    if str(weights.get("type", "int")) == "float":
        return QuantFormat("nvfp4", 0.5 + 1 / 16)
    return QuantFormat(f"compressed-tensors w{bits}", _int4_grouped(bits, int(weights.get("group_size") or 128)))


def quant_format(quant: Mapping[str, Any] | None) -> QuantFormat | None:
    """The storage of ``quantization_config``'s method; None when unquantized.

    * FP8 (``fp8``, ``fbgemm_fp8``, ModelOpt ``FP8``): 1 B per weight; 128×128 block scales add 4 B
      per 16,384 weights (``vllm/model_executor/layers/quantization/fp8.py``).
    * GPTQ / AWQ (and their Marlin kernels): ``bits/8`` + a 16-bit scale and a packed zero per group.
    * bitsandbytes 4-bit: ½ B + an fp32 absmax per 64 weights (``bitsandbytes.py``); 8-bit: 1 B.
    * NVFP4 (ModelOpt ``NVFP4``, compressed-tensors ``nvfp4-pack-quantized``): ½ B + an fp8 scale per 16.
    * MXFP4 (gpt-oss): the experts only, padded (:func:`mxfp4_expert_bytes`).
    """
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8", "fp_quant"):
        return QuantFormat("fp8", 1.0 + 4 / 16384)
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        group = int(quant.get("group_size") or quant.get("q_group_size") or 128)
        return QuantFormat(method, _int4_grouped(bits, group))
    if method == "bitsandbytes":
        if quant.get("load_in_8bit"):
            return QuantFormat("bitsandbytes 8-bit", 1.0)
        return QuantFormat("bitsandbytes 4-bit", 0.5 + 4 / 64)
    if method == "mxfp4":
        return QuantFormat("mxfp4", 0.5 + 1 / 32, experts_only=True)
    if method == "modelopt" or method == "modelopt_fp4":
        algo = str(quant.get("quant_algo", "FP8")).upper()
        return QuantFormat("nvfp4", 0.5 + 1 / 16) if "FP4" in algo else QuantFormat("fp8", 1.0)
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    raise CapacityError(
        f"config.json: quantization_config.quant_method: {method!r} is not modelled"
        " (give the measured size: --weights-memory for `kv-sidecar capacity`, model.weights_memory for"
        " the sidecar; or put model.safetensors.index.json next to config.json)"
    )


def parameter_counts(spec: ModelSpec) -> dict[str, int]:
    """Parameter counts by part (embeddings, attention, dense MLP, experts), whole model.

    Shapes as in the Hugging Face modelling files: gated MLP ``3 × hidden × intermediate``; GQA
    attention ``hidden × (heads + 2 × kv_heads) × head_dim + heads × head_dim × hidden``; MLA
    projections (DeepSeek-V2/V3); MoE ``experts × 3 × hidden × moe_intermediate`` plus shared
    experts and router. Norms and biases are below 0.1% and ignored.
    """
    t = spec.text
    h, L = spec.hidden_size, spec.num_layers
    vocab = int(spec.vocab_size or 0)
    heads = spec.num_attention_heads
    counts = {"embeddings": vocab * h * (1 if spec.tie_word_embeddings else 2)}
    if spec.is_mla:
        split, replicated = _mla_counts(spec)
        attn = split + replicated
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


def _mla_counts(spec: ModelSpec) -> tuple[int, int]:
    """MLA attention of one layer: (parameters split by TP, the replicated ``kv_a`` projection)."""
    t = spec.text
    h, heads = spec.hidden_size, spec.num_attention_heads
    rope, nope = int(t["qk_rope_head_dim"]), int(t.get("qk_nope_head_dim") or 0)
    v_head = int(t.get("v_head_dim") or nope)
    q_rank = t.get("q_lora_rank")
    q = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank * heads * (nope + rope)
    kv_a = h * (int(t["kv_lora_rank"]) + rope)
    kv_b = int(t["kv_lora_rank"]) * heads * (nope + v_head)
    return q + kv_b + heads * v_head * h, kv_a


def _attention_per_rank(spec: ModelSpec, tp: int) -> float:
    """Attention parameters of one layer on one rank: q/o split by TP; k/v split, or replicated
    when TP exceeds the KV heads (``QKVParallelLinear``: ``max(1, kv_heads / tp)`` heads per rank)."""
    if spec.is_mla:
        split, replicated = _mla_counts(spec)
        return split / tp + replicated
    h, heads, hd, kvh = spec.hidden_size, spec.num_attention_heads, spec.head_dim, spec.num_kv_heads
    kv_heads_per_rank = max(1.0, kvh / tp)
    return 2 * h * heads * hd / tp + 2 * h * hd * kv_heads_per_rank


def mxfp4_expert_bytes(hidden: int, intermediate: int, *, tp: int = 1, backend: str = DEFAULT_MXFP4_BACKEND) -> int:
    """One MXFP4 expert on one rank, as ``Mxfp4MoEMethod.create_weights`` allocates it.

    ``w13 [2·I_p, H_p/2]`` u8 + scale ``[2·I_p, H_p/32]`` u8 + bias ``[2·I_p]`` bf16, and ``w2
    [H_p, I_p/2]`` + scale ``[H_p, I_p/32]`` + bias ``[H_p]``, with ``I_p = round_up(I/tp, a)``
    and ``H_p = round_up(H, b)`` by backend (:data:`MXFP4_PADDING`).
    """
    if backend not in MXFP4_PADDING:
        raise CapacityError(f"--mxfp4-backend: {backend!r} is not one of {', '.join(MXFP4_PADDING)}")
    pad_i, pad_h = MXFP4_PADDING[backend]
    i_p = _round_up(-(-intermediate // tp), pad_i)
    h_p = _round_up(hidden, pad_h)
    w13 = 2 * i_p * (h_p // 2 + h_p // 32 + 2)
    w2 = h_p * (i_p // 2 + i_p // 32 + 2)
    return w13 + w2


def _largest_stage_share(num_layers: int, pp: int) -> float:
    """Fraction of the layers on the most loaded pipeline stage (``get_pp_indices``)."""
    sizes = [end - start for start, end in (get_pp_indices(num_layers, r, pp) for r in range(pp))]
    return max(sizes) / num_layers


def _layer_parts_per_rank(spec: ModelSpec, tp: int) -> tuple[float, float, float]:
    """(attention, dense MLP + shared experts + router, routed experts) parameters on one rank, all layers."""
    counts = parameter_counts(spec)
    L = spec.num_layers
    whole_attention = counts["attention"]
    plain_attention = L * (
        sum(_mla_counts(spec))
        if spec.is_mla
        else spec.hidden_size * (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
        + spec.num_attention_heads * spec.head_dim * spec.hidden_size
    )
    # Layers without attention (Qwen3-Next's GDN) keep their own count, split by TP.
    per_rank_attention = (
        L * _attention_per_rank(spec, tp) * (whole_attention / plain_attention if plain_attention else 1)
    )
    return per_rank_attention, counts["mlp"] / tp, counts["experts"] / tp


def weights_bytes(
    spec: ModelSpec, *, tp: int = 1, pp: int = 1, dtype: str | None = None, mxfp4_backend: str = DEFAULT_MXFP4_BACKEND
) -> int:
    """Weight bytes resident on the most loaded rank.

    With ``model.safetensors.index.json`` (and no MXFP4 padding to add): its ``metadata.total_size``
    ÷ tp × the limiting stage's share of layers. Otherwise the parts as stored: embeddings (and an
    untied lm_head) over a vocabulary padded to 64 × tp, split by TP, in the served dtype; the
    layers' attention, MLP and experts per rank at the quantization's bytes per weight
    (:func:`quant_format`). Checked against vLLM's "Model loading took X GiB" in five real logs
    (``tests/capacity/test_capacity_weights.py``): Qwen3-30B-A3B W4A16 15.68 GiB, gpt-oss-120b
    (Marlin) 65.97 GiB.
    """
    stage_share = _largest_stage_share(spec.num_layers, pp)
    fmt = quant_format(spec.quantization)
    if spec.safetensors_total_bytes and not (fmt and fmt.experts_only):
        return int(spec.safetensors_total_bytes * stage_share / tp)
    weight_b = dtype_bytes(served_dtype(spec.config_dtype, dtype))
    vocab = _round_up(int(spec.vocab_size or 0), VOCAB_PADDING * tp)
    embeddings = vocab * spec.hidden_size * (1 if spec.tie_word_embeddings else 2) / tp * weight_b
    attention, mlp, experts = _layer_parts_per_rank(spec, tp)
    if fmt is None:
        layers = (attention + mlp + experts) * weight_b
    elif fmt.experts_only:
        n_experts, width = _moe_shape(spec)
        moe_layers = spec.num_layers - int(spec.text.get("first_k_dense_replace") or 0)
        expert_bytes = (
            moe_layers * n_experts * mxfp4_expert_bytes(spec.hidden_size, width, tp=tp, backend=mxfp4_backend)
        )
        layers = (attention + mlp) * weight_b + expert_bytes
    else:
        layers = (attention + mlp + experts) * fmt.bytes_per_weight
    return int(embeddings + layers * stage_share)


def _moe_shape(spec: ModelSpec) -> tuple[int, int]:
    """(routed experts, expert MLP width); (0, 0) for a dense model."""
    t = spec.text
    experts = int(t.get("n_routed_experts") or t.get("num_local_experts") or t.get("num_experts") or 0)
    return experts, int(t.get("moe_intermediate_size") or spec.intermediate_size or 0) if experts else 0
