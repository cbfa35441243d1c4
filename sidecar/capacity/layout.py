"""Bytes per token, page size and layer groups: how vLLM lays out the KV pool.

Sources (vLLM file paths; explained in ``docs/capacity.md``, "Bytes per token" and
"Page size and layer groups"):

* per-layer page: ``vllm/v1/kv_cache_interface.py`` — ``AttentionSpec``
  ``2 × block_size × kv_heads × head_size × dtype_bytes``; ``MLAAttentionSpec``
  ``block_size × head_size × dtype_bytes`` (no K/V factor 2, one latent "head");
  ``MambaSpec`` = the state bytes, padded to the attention page;
* KV heads per rank: ``ModelConfig.get_num_kv_heads`` = ``max(1, kv_heads //
  tp)`` (replicated beyond), MLA always 1;
* layers per pipeline stage: ``vllm/distributed/utils.py`` ``get_pp_indices``;
* groups: ``vllm/v1/core/kv_cache_utils.py`` ``_get_kv_cache_groups_uniform_page_size``
  (group size = the smallest layer count among attention types, or the
  largest when it is below 1.5× the smallest; group i of a type =
  ``layers[i::num_groups]``);
* block size: 16 on CUDA (``vllm/platforms/cuda.py``), 64 for FlashMLA models, 128 on CPU; hybrid
  attention + linear-state models raise it so the attention page holds the
  state (``Platform._align_hybrid_block_size`` in ``vllm/platforms/interface.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .config import ModelSpec
from .dtypes import FP8_DS_MLA_BYTES_PER_TOKEN_LAYER, dtype_bytes, served_dtype
from .dtypes import kv_cache_dtype as resolve_kv_dtype
from .errors import CapacityError
from .layer_kinds import GROWING_KINDS, LayerKV, layer_kinds

Attention = Literal["mha", "gqa", "mqa", "mla", "hybrid"]

#: ``CacheConfig.block_size`` when the user gives none (docs/capacity.md, "Block size").
DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}
#: FlashMLA (DeepSeek / Kimi on Hopper, vLLM's default MLA backend there) needs multiples of 64.
MLA_BLOCK_SIZE = 64
#: vLLM's smallest CUDA attention kernel block, the alignment unit for hybrid block sizes.
KERNEL_BLOCK_ALIGNMENT = 16
#: vLLM's ``max_num_batched_tokens`` default in the v0.10-0.11 serve logs we have (8192 in v0.15+).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: vLLM's ``max_model_len`` when the config names no length (``_get_and_verify_max_len``).
DEFAULT_MAX_MODEL_LEN = 2048


def cdiv(a: float, b: int) -> int:
    """Ceiling division, as ``vllm.utils.math_utils.cdiv`` (``-(a // -b)``); ``a`` may be a float
    (a mean request length), the result is a whole number of blocks."""
    return int(-(-a // b))


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: layers of one kind sharing a block table.

    ``layers`` are global layer indices (vLLM pads short groups; a padded
    slot costs memory like a real layer, which ``group_size`` accounts for).
    """

    kind: str
    window: int | None
    layers: tuple[int, ...]


@dataclass(frozen=True)
class KVLayout:
    """How one model's KV cache is laid out on the limiting rank."""

    architecture: str
    model_type: str
    attention: Attention
    #: decoder layers of the whole model (``num_hidden_layers``)
    layers: int
    #: layers on the limiting pipeline stage (all of them when pp == 1)
    layers_per_rank: int
    kv_heads: int
    kv_heads_per_rank: int
    head_dim: int
    tp: int
    pp: int
    served_dtype: str
    kv_dtype: str
    kv_dtype_bytes: int
    device: str
    block_size: int
    #: KV bytes one token costs in one attention layer on this rank
    bytes_per_token_layer: int
    #: one block of one layer (the unit ``num_blocks`` counts), padded state pages included
    page_size_bytes: int
    #: layers that share each block (``num_blocks = budget // page // group_size``)
    group_size: int
    groups: tuple[KVGroup, ...]
    #: per rank, layers that grow with context (full attention / MLA)
    bytes_per_token: int
    #: per rank, if every layer were a full-attention layer of the same shape
    bytes_per_token_all_layers: int
    #: per rank, bounded per-request memory: sliding-window / chunk caps and linear-attention state
    per_request_state_bytes: int
    is_hybrid: bool
    hybrid_kv_cache_manager: bool
    max_model_len: int
    max_num_batched_tokens: int
    layer_counts: Mapping[str, int]

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def block_bytes(self) -> int:
        """Pool bytes one block id costs: ``page × group_size``."""
        return self.page_size_bytes * self.group_size


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """Layer range ``[start, end)`` of a pipeline stage (vLLM ``vllm/distributed/utils.py``).

    ``num_layers // pp`` each; the remainder goes one layer each to stages
    ``-2, -3, …`` (never the last stage, which also holds the final norm).
    ``VLLM_PP_LAYER_PARTITION`` is not modelled.
    """
    partitions = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def gdn_state_bytes(spec: ModelSpec, tp: int, served: str) -> int:
    """Per-request state of one Gated-DeltaNet layer (Qwen3-Next), per rank.

    vLLM ``mamba_utils.py`` ``gated_delta_net_state_shape``: conv state
    ``(k_dim·nk·2 + v_dim·nv) / tp × (kernel − 1)`` and recurrent state
    ``nv / tp × v_dim × k_dim``, both in the served dtype under
    ``mamba_cache_dtype=auto`` (``_mamba_state_dtype``). Qwen3-Next:
    conv 8192 × 3, state 32 × 128 × 128 (docs/capacity.md, "Linear attention and mamba state").
    """
    nk, nv = int(spec.get("linear_num_key_heads", 0)), int(spec.get("linear_num_value_heads", 0))
    hk, hv = int(spec.get("linear_key_head_dim", 0)), int(spec.get("linear_value_head_dim", 0))
    kernel = int(spec.get("linear_conv_kernel_dim", 4))
    if not (nk and nv and hk and hv):
        raise CapacityError(
            "config.json: linear_num_key_heads/linear_key_head_dim/...: missing for a linear-attention model"
        )
    for name, heads in (("linear_num_key_heads", nk), ("linear_num_value_heads", nv)):
        if heads % tp:
            raise CapacityError(f"--tensor-parallel-size: {tp} does not divide {name} {heads} (vLLM refuses it)")
    conv = (hk * nk * 2 + hv * nv) // tp * (kernel - 1)
    recurrent = nv // tp * hv * hk
    return (conv + recurrent) * dtype_bytes(served)


def _check_parallel(spec: ModelSpec, tp: int, pp: int) -> None:
    for flag, value in (("--tensor-parallel-size", tp), ("--pipeline-parallel-size", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CapacityError(f"{flag}: must be a positive integer, got {value!r}")
    heads = spec.num_attention_heads
    if heads % tp:
        ok = [d for d in range(1, heads + 1) if heads % d == 0]
        raise CapacityError(
            f"--tensor-parallel-size: {tp} does not divide num_attention_heads {heads} (vLLM refuses it);"
            f" use one of {', '.join(map(str, ok))}"
        )
    kvh = spec.num_kv_heads
    if not spec.is_mla and (tp % kvh if tp >= kvh else kvh % tp):
        raise CapacityError(
            f"--tensor-parallel-size: {tp} and num_key_value_heads {kvh}: one must divide the other"
            " (vLLM's QKV projection shards or replicates whole KV heads)"
        )
    if pp > spec.num_layers:
        raise CapacityError(f"--pipeline-parallel-size: {pp} is more than the {spec.num_layers} layers")


def _block_size(spec: ModelSpec, block_size: int | None, device: str) -> int:
    if block_size is None:
        if device == "cpu":
            return DEFAULT_BLOCK_SIZE["cpu"]
        return MLA_BLOCK_SIZE if spec.is_mla else DEFAULT_BLOCK_SIZE["cuda"]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise CapacityError(f"--block-size: must be a positive integer, got {block_size!r}")
    if device == "cpu" and block_size % 32:
        raise CapacityError(f"--block-size: {block_size} on CPU must be a multiple of 32 (vLLM's CPU backend)")
    return block_size


def _group_layers(kinds: tuple[LayerKV, ...]) -> tuple[KVGroup, ...]:
    """vLLM's ``_get_kv_cache_groups_uniform_page_size`` over layer kinds."""
    buckets: dict[tuple[str, int | None], list[int]] = {}
    for i, layer in enumerate(kinds):
        buckets.setdefault((layer.kind, layer.window), []).append(i)
    if len(buckets) == 1:
        (((kind, window), layers),) = buckets.items()
        return (KVGroup(kind, window, tuple(layers)),)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < 1.5 * min(sizes):  # few padding layers: use the larger count
        group_size = max(sizes)
    groups: list[KVGroup] = []
    for (kind, window), layers in buckets.items():
        n = cdiv(len(layers), group_size)
        groups.extend(KVGroup(kind, window, tuple(layers[i::n])) for i in range(n))
    return tuple(groups)


def _check_positive(flag: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CapacityError(f"{flag}: must be a positive integer, got {value!r}")


def _max_model_len(spec: ModelSpec, max_model_len: int | None) -> int:
    """``--max-model-len``, or the model's ``max_position_embeddings`` (vLLM's ``_get_and_verify_max_len``)."""
    if max_model_len is None:
        return int(spec.max_position_embeddings or DEFAULT_MAX_MODEL_LEN)
    _check_positive("--max-model-len", max_model_len)
    if spec.max_position_embeddings and max_model_len > spec.max_position_embeddings:
        raise CapacityError(
            f"--max-model-len: {max_model_len} is above the model's limit {spec.max_position_embeddings}"
            " (max_position_embeddings; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    return max_model_len


def _bytes_per_token_layer(spec: ModelSpec, kv_heads_per_rank: int, kv_dtype: str, kv_dtype_bytes: int) -> int:
    """KV bytes of one token in one attention layer: K and V per head, or MLA's one latent."""
    if not spec.is_mla:
        return 2 * kv_heads_per_rank * spec.head_dim * kv_dtype_bytes
    if kv_dtype == "fp8_ds_mla":
        return FP8_DS_MLA_BYTES_PER_TOKEN_LAYER
    return spec.head_dim * kv_dtype_bytes


def _default_hybrid_kv_cache_manager(kinds: tuple[LayerKV, ...], device: str) -> bool:
    """vLLM 0.32 (vllm/config/vllm.py): off on non-CUDA platforms, and for chunked
    local attention unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1."""
    return device == "cuda" and not any(k.kind == "chunked" for k in kinds)


def _unify_hybrid(spec: ModelSpec, kinds: tuple[LayerKV, ...]) -> tuple[LayerKV, ...]:
    """Without the hybrid KV cache manager (``unify_hybrid_kv_cache_specs``): sliding and
    chunked layers become full layers; linear-attention state cannot be unified."""
    if any(k.kind == "linear" for k in kinds):
        raise CapacityError(
            f"{spec.architecture}: linear-attention layers need vLLM's hybrid KV cache manager"
            " (CUDA, not disabled); use --device cuda"
        )
    return tuple(LayerKV("full") for _ in kinds)


def _hybrid_block_size(block: int, state_bytes: int, token_layer: int) -> int:
    """The block size raised so that one attention page holds a linear layer's state,
    in multiples of the kernel alignment (``Platform._align_hybrid_block_size``)."""
    align = max(KERNEL_BLOCK_ALIGNMENT, block)
    return max(block, align * cdiv(state_bytes, align * token_layer))


def _limiting_stage(num_layers: int, pp: int, groups: tuple[KVGroup, ...]) -> tuple[range, int]:
    """The pipeline stage with the largest per-block layer count, and that count (its group size).

    With equal budgets that stage gets the fewest blocks, and vLLM takes the min over workers.
    """
    stages = [range(*get_pp_indices(num_layers, r, pp)) for r in range(pp)]
    per_stage = [max(sum(1 for i in g.layers if i in stage) for g in groups) for stage in stages]
    limiting = max(range(pp), key=lambda r: per_stage[r])
    return stages[limiting], per_stage[limiting]


def request_blocks(
    kind: str, window: int | None, request_tokens: int, block_size: int, max_num_batched_tokens: int
) -> int:
    """Blocks one request of ``request_tokens`` holds in one layer of ``kind``.

    ``max_memory_usage_bytes / page`` per spec (``kv_cache_interface.py``):
    full / MLA ``cdiv(L, bs)``; sliding ``cdiv(min(W − 1 + mbt, L), bs) + 1``;
    chunked local ``cdiv(min(chunk + mbt, L), bs)``; linear / mamba state 1
    (``mamba_cache_mode`` none), the state padded to one attention page.
    """
    if kind == "sliding":
        return cdiv(min(_span(kind, window) - 1 + max_num_batched_tokens, request_tokens), block_size) + 1
    if kind == "chunked":
        return cdiv(min(_span(kind, window) + max_num_batched_tokens, request_tokens), block_size)
    if kind == "linear":
        return 1
    return cdiv(request_tokens, block_size)


def _span(kind: str, window: int | None) -> int:
    """The window (sliding) or chunk (chunked) of a bounded layer; ``layer_kinds`` always sets it."""
    if window is None:
        raise CapacityError(f"a {kind} layer has no window")
    return window


def _attention(spec: ModelSpec, is_hybrid: bool) -> Attention:
    if spec.is_mla:
        return "mla"
    if is_hybrid:
        return "hybrid"
    if spec.num_kv_heads == spec.num_attention_heads:
        return "mha"
    if spec.num_kv_heads == 1:
        return "mqa"
    return "gqa"


def kv_layout(
    spec: ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str | None = None,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    device: str = "cuda",
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid_kv_cache_manager: bool | None = None,
) -> KVLayout:
    """Resolve how vLLM would lay out ``spec``'s KV cache on one rank.

    Per attention layer and token: ``2 × kv_heads_rank × head_dim × b``
    (MLA: ``head_dim × b``, 576 × 2 = 1152 B for DeepSeek-V3), with ``b`` the
    KV dtype's bytes. ``bytes_per_token`` sums the layers that grow with
    context on the limiting pipeline stage (docs/capacity.md, "Bytes per token").
    """
    if device not in DEFAULT_BLOCK_SIZE:
        raise CapacityError(f"--device: {device!r} is not one of {', '.join(DEFAULT_BLOCK_SIZE)}")
    _check_parallel(spec, tp, pp)
    served = served_dtype(spec.config_dtype, dtype)
    kv_dtype = resolve_kv_dtype(kv_cache_dtype, served)
    if kv_dtype == "fp8_ds_mla" and not spec.is_mla:
        raise CapacityError("--kv-cache-dtype: fp8_ds_mla is only for MLA models (DeepSeek-V3.2); use fp8")
    b = dtype_bytes(kv_dtype)
    max_model_len = _max_model_len(spec, max_model_len)
    _check_positive("--max-num-batched-tokens", max_num_batched_tokens)

    kvh_rank = 1 if spec.is_mla else max(1, spec.num_kv_heads // tp)
    token_layer = _bytes_per_token_layer(spec, kvh_rank, kv_dtype, b)

    kinds = layer_kinds(spec)
    is_hybrid = len({k.kind for k in kinds}) > 1
    if hybrid_kv_cache_manager is None:
        hybrid_kv_cache_manager = _default_hybrid_kv_cache_manager(kinds, device)
    if is_hybrid and not hybrid_kv_cache_manager:
        kinds = _unify_hybrid(spec, kinds)

    block = _block_size(spec, block_size, device)
    state_bytes = gdn_state_bytes(spec, tp, served) if any(k.kind == "linear" for k in kinds) else 0
    if state_bytes:
        block = _hybrid_block_size(block, state_bytes, token_layer)
    page = block * token_layer

    groups = _group_layers(kinds)
    stage, group_size = _limiting_stage(spec.num_layers, pp, groups)
    growing = sum(1 for i in stage if kinds[i].kind in GROWING_KINDS)
    mbt = max_num_batched_tokens
    bounded = page * sum(
        request_blocks(kinds[i].kind, kinds[i].window, max_model_len, block, mbt)
        for i in stage
        if kinds[i].kind not in GROWING_KINDS
    )
    counts: dict[str, int] = {}
    for layer in kinds:
        counts[layer.kind] = counts.get(layer.kind, 0) + 1

    return KVLayout(
        architecture=spec.architecture,
        model_type=spec.model_type,
        attention=_attention(spec, is_hybrid),
        layers=spec.num_layers,
        layers_per_rank=len(stage),
        kv_heads=spec.num_kv_heads,
        kv_heads_per_rank=kvh_rank,
        head_dim=spec.head_dim,
        tp=tp,
        pp=pp,
        served_dtype=served,
        kv_dtype=kv_dtype,
        kv_dtype_bytes=b,
        device=device,
        block_size=block,
        bytes_per_token_layer=token_layer,
        page_size_bytes=page,
        group_size=group_size,
        groups=groups,
        bytes_per_token=growing * token_layer,
        bytes_per_token_all_layers=len(stage) * token_layer,
        per_request_state_bytes=bounded,
        is_hybrid=is_hybrid,
        hybrid_kv_cache_manager=bool(hybrid_kv_cache_manager),
        max_model_len=max_model_len,
        max_num_batched_tokens=mbt,
        layer_counts=counts,
    )
