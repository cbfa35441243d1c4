"""Bytes per token, page size and layer groups: how vLLM lays out the KV pool.

Sources (vLLM file paths; see ``../shared/reference/kv-capacity.md``):

* per-layer page: ``vllm/v1/kv_cache_interface.py`` — ``AttentionSpec``
  ``2 × block_size × kv_heads × head_size × dtype_bytes``; ``MLAAttentionSpec``
  ``block_size × head_size × dtype_bytes`` (no K/V factor 2, one latent "head");
  ``MambaSpec`` = the state bytes, padded to the attention page (§A3);
* KV heads per rank: ``ModelConfig.get_num_kv_heads`` = ``max(1, kv_heads //
  tp)`` (replicated beyond), MLA always 1 (§A5);
* layers per pipeline stage: ``vllm/distributed/utils.py`` ``get_pp_indices``;
* groups: ``vllm/v1/core/kv_cache_utils.py`` ``_get_kv_cache_groups_uniform_page_size``
  (group size = the smallest layer count among attention types, or the
  largest when it is below 1.5× the smallest; group i of a type =
  ``layers[i::num_groups]``), §A7;
* block size: 16 on CUDA, 64 for FlashMLA models, 128 on CPU (§A6); hybrid
  attention + linear-state models raise it so the attention page holds the
  state (``Platform._align_hybrid_block_size`` in ``vllm/platforms/interface.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from .config import ModelSpec
from .dtypes import FP8_DS_MLA_BYTES_PER_TOKEN_LAYER, dtype_bytes, kv_cache_dtype as resolve_kv_dtype, served_dtype
from .errors import CapacityError
from .layer_kinds import GROWING_KINDS, LayerKV, layer_kinds

Attention = Literal["mha", "gqa", "mqa", "mla", "hybrid"]

#: ``CacheConfig.block_size`` when the user gives none (kv-capacity.md §A6).
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
    conv 8192 × 3, state 32 × 128 × 128 (kv-capacity.md §B2).
    """
    nk, nv = int(spec.get("linear_num_key_heads", 0)), int(spec.get("linear_num_value_heads", 0))
    hk, hv = int(spec.get("linear_key_head_dim", 0)), int(spec.get("linear_value_head_dim", 0))
    kernel = int(spec.get("linear_conv_kernel_dim", 4))
    if not (nk and nv and hk and hv):
        raise CapacityError("config.json: linear_num_key_heads/linear_key_head_dim/...: missing for a linear-attention model")
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
        ((kind, window), layers), = buckets.items()
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
    context on the limiting pipeline stage (kv-capacity.md §A10 / §B).
    """
    if device not in DEFAULT_BLOCK_SIZE:
        raise CapacityError(f"--device: {device!r} is not one of {', '.join(DEFAULT_BLOCK_SIZE)}")
    _check_parallel(spec, tp, pp)
    served = served_dtype(spec.config_dtype, dtype)
    kv_dtype = resolve_kv_dtype(kv_cache_dtype, served)
    if kv_dtype == "fp8_ds_mla" and not spec.is_mla:
        raise CapacityError("--kv-cache-dtype: fp8_ds_mla is only for MLA models (DeepSeek-V3.2); use fp8")
    b = dtype_bytes(kv_dtype)

    if max_model_len is None:
        max_model_len = int(spec.max_position_embeddings or DEFAULT_MAX_MODEL_LEN)
    elif isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise CapacityError(f"--max-model-len: must be a positive integer, got {max_model_len!r}")
    elif spec.max_position_embeddings and max_model_len > spec.max_position_embeddings:
        raise CapacityError(
            f"--max-model-len: {max_model_len} is above the model's limit {spec.max_position_embeddings}"
            " (max_position_embeddings; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    if isinstance(max_num_batched_tokens, bool) or not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
        raise CapacityError(f"--max-num-batched-tokens: must be a positive integer, got {max_num_batched_tokens!r}")

    kvh_rank = 1 if spec.is_mla else max(1, spec.num_kv_heads // tp)
    if spec.is_mla:
        token_layer = FP8_DS_MLA_BYTES_PER_TOKEN_LAYER if kv_dtype == "fp8_ds_mla" else spec.head_dim * b
    else:
        token_layer = 2 * kvh_rank * spec.head_dim * b

    kinds = layer_kinds(spec)
    is_hybrid = len({k.kind for k in kinds}) > 1
    if hybrid_kv_cache_manager is None:
        # vLLM 0.32 (vllm/config/vllm.py): off on non-CUDA platforms, and for
        # chunked local attention unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.
        hybrid_kv_cache_manager = device == "cuda" and not any(k.kind == "chunked" for k in kinds)
    if is_hybrid and not hybrid_kv_cache_manager:
        if any(k.kind == "linear" for k in kinds):
            raise CapacityError(
                f"{spec.architecture}: linear-attention layers need vLLM's hybrid KV cache manager"
                " (CUDA, not disabled); use --device cuda"
            )
        # unify_hybrid_kv_cache_specs: sliding / chunked layers become full layers.
        kinds = tuple(LayerKV("full") for _ in kinds)

    block = _block_size(spec, block_size, device)
    state_bytes = gdn_state_bytes(spec, tp, served) if any(k.kind == "linear" for k in kinds) else 0
    if state_bytes:
        align = max(KERNEL_BLOCK_ALIGNMENT, block)
        block = max(block, align * cdiv(state_bytes, align * token_layer))
    page = block * token_layer

    groups = _group_layers(kinds)
    stages = [range(*get_pp_indices(spec.num_layers, r, pp)) for r in range(pp)]
    # The limiting stage has the largest per-block layer count: with equal
    # budgets it gets the fewest blocks, and vLLM takes the min over workers.
    per_stage = [max(sum(1 for i in g.layers if i in stage) for g in groups) for stage in stages]
    limiting = max(range(pp), key=lambda r: per_stage[r])
    stage = stages[limiting]
    group_size = per_stage[limiting]

    growing = sum(1 for i in stage if kinds[i].kind in GROWING_KINDS)
    mbt = max_num_batched_tokens
    bounded = 0
    for i in stage:
        layer = kinds[i]
        if layer.kind == "sliding":
            bounded += (cdiv(min(layer.window - 1 + mbt, max_model_len), block) + 1) * page
        elif layer.kind == "chunked":
            bounded += cdiv(min(layer.window + mbt, max_model_len), block) * page
        elif layer.kind == "linear":
            bounded += page  # the state, padded to one attention page

    counts: dict[str, int] = {}
    for layer in kinds:
        counts[layer.kind] = counts.get(layer.kind, 0) + 1

    if spec.is_mla:
        attention: Attention = "mla"
    elif is_hybrid:
        attention = "hybrid"
    elif spec.num_kv_heads == spec.num_attention_heads:
        attention = "mha"
    elif spec.num_kv_heads == 1:
        attention = "mqa"
    else:
        attention = "gqa"

    return KVLayout(
        architecture=spec.architecture,
        model_type=spec.model_type,
        attention=attention,
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
