"""The inverse questions: what budget or utilization a target needs, and
the context length where the KV cache outgrows the weights.

Built on the forward formulas (``blocks.py``, ``budget.py``); sources there.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from .blocks import blocks_per_request
from .budget import Budget, estimate_budget
from .config import ModelSpec
from .errors import CapacityError
from .layout import KVLayout, cdiv


class Target(TypedDict, total=False):
    """What to size for, as ``blocks_for`` takes it: ``tokens``, or ``concurrency`` × ``request_tokens``."""

    tokens: int | None
    concurrency: int | None
    request_tokens: int | None


def blocks_for(
    layout: KVLayout,
    *,
    tokens: int | None = None,
    concurrency: int | None = None,
    request_tokens: int | None = None,
) -> int:
    """``num_blocks`` needed so that requests can actually hold the target.

    Either ``tokens`` (usable tokens in full-attention terms: ``cdiv(tokens,
    bs)``) or ``concurrency`` requests of ``request_tokens`` each (vLLM's
    per-group rule, so sliding-window caps count). One block is added for
    the null block.
    """
    if tokens is not None:
        if tokens < 1:
            raise CapacityError(f"target tokens: must be positive, got {tokens}")
        return cdiv(tokens, layout.block_size) + 1
    if concurrency is None or request_tokens is None:
        raise CapacityError("target: give tokens, or concurrency and request_tokens")
    if concurrency < 1 or request_tokens < 1:
        raise CapacityError(
            f"target: concurrency and request length must be positive, got {concurrency}, {request_tokens}"
        )
    mbt = layout.max_num_batched_tokens
    per_request = sum(blocks_per_request(g, layout, request_tokens, mbt) for g in layout.groups)
    return concurrency * per_request + 1


def required_kv_cache_memory_bytes(layout: KVLayout, **target: Unpack[Target]) -> int:
    """Smallest ``--kv-cache-memory-bytes`` giving ``blocks_for(**target)`` blocks.

    Inverse of ``num_blocks = ⌊⌊budget / page⌋ / group_size⌋``:
    ``blocks × group_size × page``.
    """
    return blocks_for(layout, **target) * layout.group_size * layout.page_size_bytes


def required_utilization(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    gpu_memory_bytes: int,
    max_num_batched_tokens: int = 2048,
    vllm_version: str | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int | None = None,
    weights: int | None = None,
    **target: Unpack[Target],
) -> float:
    """``gpu_memory_utilization`` that yields the target: (KV + non-KV) ÷ total.

    The non-KV terms are those of ``estimate_budget``; a result above 1 means
    the target does not fit on this GPU at any utilization.
    """
    base: Budget = estimate_budget(
        spec,
        layout,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=1.0,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_version=vllm_version,
        activation_bytes=activation_bytes,
        non_torch_bytes=non_torch_bytes,
        cudagraph_bytes=cudagraph_bytes,
        weights=weights,
    )
    non_kv = base.weights_bytes + base.activation_bytes + base.non_torch_bytes + base.cudagraph_bytes
    return (required_kv_cache_memory_bytes(layout, **target) + non_kv) / gpu_memory_bytes


def inflection_context_length(layout: KVLayout, weights_bytes: int, concurrency: int = 1) -> int:
    """Smallest total context (tokens per request) at which KV bytes exceed the weights.

    The "inflection point" of docs/capacity.md ("Worked examples"):
    ``⌊weights / (bytes_per_token × concurrency)⌋ + 1``
    (growing layers only; bounded sliding / state memory is ignored).
    """
    if weights_bytes <= 0 or concurrency < 1:
        raise CapacityError("inflection point: weights and concurrency must be positive")
    return weights_bytes // (layout.bytes_per_token * concurrency) + 1
