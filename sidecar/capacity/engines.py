"""KV capacity arithmetic of the engines other than vLLM: each engine's own formula, with its source.

The model's KV bytes per token come from the same :class:`~sidecar.capacity.layout.KVLayout` as
vLLM's (``2 × kv_heads_per_rank × head_dim × dtype bytes`` per attention layer); what differs per
engine is how the memory budget is taken and how it is cut into tokens:

=========  =====================================================  ==========================================
engine     KV budget (bytes, per GPU)                             tokens
=========  =====================================================  ==========================================
SGLang     ``free_after_weights − total × (1 − mem_fraction_static)``  ``budget // cell_size`` (no blocks)
TRT-LLM    ``free_after_weights × free_gpu_memory_fraction``       ``budget // (bytes/token × tokens_per_block)``
                                                                  blocks × tokens_per_block
TGI        ``free_after_warmup − (1 − fraction × 0.90) × total``   ``budget // (bytes/token × BLOCK_SIZE)``
                                                                  blocks × BLOCK_SIZE
=========  =====================================================  ==========================================

Sources (each function repeats its own):

* SGLang: ``python/sglang/srt/model_executor/model_runner.py``, ``profile_max_num_token``:
  ``cell_size = num_kv_heads_per_tp × head_dim × num_layers × 2 × element_size`` (MLA:
  ``(kv_lora_rank + qk_rope_head_dim) × num_layers × element_size``) and
  ``rest_memory = available_gpu_memory − total_gpu_memory × (1 − mem_fraction_static)``: the fraction
  is a share of TOTAL memory that weights and KV together may use.
* TensorRT-LLM: ``KvCacheConfig.free_gpu_memory_fraction`` (``tensorrt_llm/llmapi/llm_args.py``,
  default 0.9): "the fraction of GPU memory that is free after the model is loaded" given to the KV
  cache: a share of FREE memory after weights, not of total.
* TGI: ``server/text_generation_server/models/flash_causal_lm.py`` ``FlashCausalLM.warmup`` (text-
  generation-inference @ db931fcf42da018a3657580c64bf2720f167f9ab): ``cache_block_size = BLOCK_SIZE ×
  num_kv_heads × head_size``, ``total_cache_size = num_layers × cache_block_size × 2 × dtype_size``,
  ``num_blocks = free_memory // total_cache_size + warmup_batch_blocks`` with ``free_memory =
  get_free_memory(device, MEMORY_FRACTION × TGI_WIGGLE_ROOM)`` (``utils/import_utils.py``:
  ``max(0, free − (1 − fraction) × total)``; ``CUDA_MEMORY_FRACTION`` defaults to 1.0,
  ``TGI_WIGGLE_ROOM`` to 0.90 in ``models/globals.py``); ``max_batch_total_tokens = num_blocks ×
  BLOCK_SIZE`` (the value the router logs as "Setting max batch total tokens to N").
  ``BLOCK_SIZE`` per attention backend: ``models/globals.py`` lines 38-46 (below).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CapacityError
from .layout import KVLayout

#: TGI's KV block size per attention backend (``ATTENTION`` env, set by the launcher):
#: text-generation-inference ``server/text_generation_server/models/globals.py`` lines 38-46.
TGI_BLOCK_SIZE: dict[str, int] = {"flashdecoding": 256, "flashinfer": 1, "flashdecoding-ipex": 64, "paged": 16}
#: The launcher's choice when nothing forces another (``launcher/src/main.rs`` ``resolve_attention``:
#: ``attention.unwrap_or("flashinfer")``; compute capability < 8 or an unsupported head dim falls back
#: to ``paged``, else ``flashdecoding``).
TGI_DEFAULT_ATTENTION = "flashinfer"
#: ``TGI_WIGGLE_ROOM`` default (``models/globals.py`` line 32): the share of memory TGI lets itself use.
TGI_WIGGLE_ROOM = 0.90
#: ``CUDA_MEMORY_FRACTION`` default (``utils/dist.py`` line 13).
TGI_MEMORY_FRACTION = 1.0
#: TRT-LLM's ``free_gpu_memory_fraction`` default (``KvCacheConfig``).
TRTLLM_DEFAULT_FREE_FRACTION = 0.9
#: TRT-LLM's ``tokens_per_block`` default (``KvCacheConfig.tokens_per_block``).
TRTLLM_DEFAULT_TOKENS_PER_BLOCK = 32

ENGINES = ("vllm", "sglang", "trtllm", "tgi")


@dataclass(frozen=True)
class EngineCapacity:
    """One engine's KV capacity for one model on one GPU (per rank)."""

    engine: str
    bytes_per_token: int
    block_size: int  # tokens per block; 1 for SGLang (token-granular pool)
    kv_budget_bytes: int
    num_blocks: int
    capacity_tokens: int
    #: the engine's memory lever and its value, as the engine spells them
    lever: str
    lever_value: float
    #: what the figure does not subtract (said next to it, never hidden)
    caveat: str


def _fraction(value: float, flag: str) -> float:
    if not 0 < value <= 1:
        raise CapacityError(f"{flag}: {value!r} must be above 0 and at most 1")
    return value


def _non_negative(value: int, what: str) -> int:
    if value < 0:
        raise CapacityError(f"{what}: {value:,} bytes is negative")
    return value


def engine_bytes_per_token(layout: KVLayout, engine: str) -> int:
    """KV bytes one token costs on one rank under ``engine``.

    vLLM and SGLang keep sliding-window layers bounded (``layout.bytes_per_token``); TGI's warmup sizes
    every layer as full attention (``num_layers × cache_block_size × 2 × dtype_size``), and TRT-LLM's
    single pool (uniform models) does the same, so both use ``bytes_per_token_all_layers``.
    """
    if engine in ("tgi", "trtllm"):
        return layout.bytes_per_token_all_layers
    if engine in ("vllm", "sglang"):
        return layout.bytes_per_token
    raise CapacityError(f"--engine: {engine!r} is not one of {', '.join(ENGINES)}")


def sglang_capacity(
    layout: KVLayout, *, total_bytes: int, free_after_weights_bytes: int, mem_fraction_static: float
) -> EngineCapacity:
    """SGLang's ``max_total_num_tokens``: ``(free_after_weights − total × (1 − f)) // cell_size``.

    ``profile_max_num_token`` in ``sglang/srt/model_executor/model_runner.py``; the pool is token-
    granular (``page_size`` 1 by default), so there is no block rounding.
    """
    f = _fraction(mem_fraction_static, "--mem-fraction-static")
    cell = engine_bytes_per_token(layout, "sglang")
    budget = max(0, int(_non_negative(free_after_weights_bytes, "free memory") - total_bytes * (1 - f)))
    tokens = budget // cell
    return EngineCapacity(
        "sglang",
        cell,
        1,
        budget,
        tokens,
        tokens,
        "--mem-fraction-static",
        f,
        "free memory after weights taken as total − weights: the CUDA context (≈0.5-1 GiB) is not subtracted",
    )


def sglang_fraction_for(
    capacity_tokens: int, cell_size: int, *, total_bytes: int, free_after_weights_bytes: int
) -> float:
    """The ``--mem-fraction-static`` that gives ``capacity_tokens``: the inverse of :func:`sglang_capacity`.

    ``f = 1 − (free_after_weights − tokens × cell_size) / total``.
    """
    return 1 - (free_after_weights_bytes - capacity_tokens * cell_size) / total_bytes


def trtllm_capacity(
    layout: KVLayout,
    *,
    free_after_weights_bytes: int,
    free_gpu_memory_fraction: float = TRTLLM_DEFAULT_FREE_FRACTION,
    tokens_per_block: int = TRTLLM_DEFAULT_TOKENS_PER_BLOCK,
) -> EngineCapacity:
    """TRT-LLM's KV pool: ``free_after_weights × free_gpu_memory_fraction``, cut in blocks of
    ``tokens_per_block`` tokens (``KvCacheConfig``). A share of FREE memory, not of total."""
    f = _fraction(free_gpu_memory_fraction, "--free-gpu-memory-fraction")
    bpt = engine_bytes_per_token(layout, "trtllm")
    budget = int(_non_negative(free_after_weights_bytes, "free memory") * f)
    blocks = budget // (bpt * tokens_per_block)
    return EngineCapacity(
        "trtllm",
        bpt,
        tokens_per_block,
        budget,
        blocks,
        blocks * tokens_per_block,
        "free_gpu_memory_fraction",
        f,
        "uniform models only (one pool); activations measured by TRT-LLM before sizing are not subtracted",
    )


def trtllm_fraction_for(capacity_tokens: int, bytes_per_token: int, *, free_after_weights_bytes: int) -> float:
    """The ``free_gpu_memory_fraction`` that gives ``capacity_tokens``: ``tokens × bytes/token / free``."""
    if free_after_weights_bytes <= 0:
        raise CapacityError("free memory after weights must be positive to compute free_gpu_memory_fraction")
    return capacity_tokens * bytes_per_token / free_after_weights_bytes


def tgi_block_size(attention: str) -> int:
    """TGI's ``BLOCK_SIZE`` for an attention backend (``models/globals.py`` lines 38-46)."""
    try:
        return TGI_BLOCK_SIZE[attention]
    except KeyError:
        raise CapacityError(
            f"--tgi-attention: {attention!r} is not one of {', '.join(TGI_BLOCK_SIZE)}"
            " (the ATTENTION value TGI logs at start-up as 'Using attention ...')"
        ) from None


def tgi_max_batch_total_tokens(num_blocks: int, attention: str) -> int:
    """``max_batch_total_tokens = num_blocks × BLOCK_SIZE`` (``FlashCausalLM.warmup``'s return value)."""
    return num_blocks * tgi_block_size(attention)


def tgi_capacity(
    layout: KVLayout,
    *,
    total_bytes: int,
    free_after_warmup_bytes: int,
    attention: str = TGI_DEFAULT_ATTENTION,
    memory_fraction: float = TGI_MEMORY_FRACTION,
    wiggle_room: float = TGI_WIGGLE_ROOM,
) -> EngineCapacity:
    """TGI's ``max_batch_total_tokens`` from the memory free after its warmup batch.

    ``budget = max(0, free − (1 − memory_fraction × wiggle_room) × total)``;
    ``num_blocks = budget // (bytes/token × BLOCK_SIZE)``; tokens = ``num_blocks × BLOCK_SIZE``.
    TGI adds the warmup batch's own blocks back (they were allocated while measuring); with
    ``free_after_warmup`` taken as total − weights, the warmup activation peak is not subtracted
    either, so the figure is an upper bound.
    """
    _fraction(memory_fraction, "CUDA_MEMORY_FRACTION")
    _fraction(wiggle_room, "TGI_WIGGLE_ROOM")
    block = tgi_block_size(attention)
    bpt = engine_bytes_per_token(layout, "tgi")
    free = _non_negative(free_after_warmup_bytes, "free memory")
    budget = max(0, int(free - (1 - memory_fraction * wiggle_room) * total_bytes))
    blocks = budget // (bpt * block)
    return EngineCapacity(
        "tgi",
        bpt,
        block,
        budget,
        blocks,
        tgi_max_batch_total_tokens(blocks, attention),
        "CUDA_MEMORY_FRACTION",
        memory_fraction,
        "at most: TGI's warmup activation peak (--max-batch-prefill-tokens) is not subtracted",
    )
