"""TensorRT-LLM's memory lever, ``free_gpu_memory_fraction``, read back from a live page.

TRT-LLM gives the KV cache a share of the GPU memory that is FREE once the weights and buffers are
loaded, not a share of the GPU's total memory (vLLM's ``--gpu-memory-utilization`` and SGLang's
``--mem-fraction-static`` are shares of TOTAL memory):

* ``trtllm-serve --kv_cache_free_gpu_memory_fraction`` (``tensorrt_llm/commands/serve.py``, default
  0.9): "Free GPU memory fraction reserved for KV Cache, after allocating model weights and buffers";
* ``KvCacheConfig.free_gpu_memory_fraction`` (``tensorrt_llm/llmapi/llm_args.py``; TRT-LLM docs, "How
  to Change KV Cache Behavior": "The default for free_gpu_memory_fraction is 0.9, which means
  TensorRT LLM will try to allocate 90% of free GPU memory for KV cache");
* the Triton backend's model parameter ``kv_cache_free_gpu_mem_fraction`` (tensorrtllm_backend
  ``inflight_batcher_llm/src/model_instance_state.cc``: "will use default value of 0.9").

So the KV budget is ``F × f`` with ``F`` the free memory after weights and buffers, and ``F`` does
not depend on ``f``: the pool scales in proportion to the fraction. The pool is whole blocks of
``tokens_per_block`` tokens: ``B = ⌊F × f ÷ block_bytes⌋``. From one page (``B0`` blocks at ``f0``)
``F ÷ block_bytes`` lies in ``[B0 ÷ f0, (B0 + 1) ÷ f0)``, which is all the sidecar needs: no GPU size,
no weights, no bytes per token.

Two limits, said wherever the suggestion is shown (:func:`advice_text`):

* ``max_tokens`` (``KvCacheConfig.max_tokens``) caps the pool too; with both set TRT-LLM takes the
  smaller, and then the fraction is not what sets the capacity;
* one pool per attention window size (docs/source/features/kvcache.md, "A separate pool is created
  for each combination of attention window size and number of heads"): ``blocks × tokens_per_block``
  is the capacity of a uniform model only; for a hybrid (sliding-window) model the page's block count
  spans pools of different costs and the proportional rule below does not hold per pool.

The arithmetic with memory figures (a calculator, not a live page) is
:func:`sidecar.capacity.engines.trtllm_capacity` / ``trtllm_fraction_for``.
"""

from __future__ import annotations

import math

#: The flag as trtllm-serve spells it; the LLM API field; the Triton backend's model parameter.
SERVE_FLAG = "--kv_cache_free_gpu_memory_fraction"
LLM_API_FIELD = "kv_cache_config.free_gpu_memory_fraction"
TRITON_PARAMETER = "kv_cache_free_gpu_mem_fraction"
#: Its default in all three (see the module docstring).
DEFAULT_FRACTION = 0.9


def _check_fraction(name: str, value: float) -> float:
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{name}: {value!r} is not a fraction in (0, 1]")
    return value


def _check_positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: {value!r} must be a positive number")
    return value


def blocks_at_fraction(*, f: float, f0: float, blocks0: int) -> int:
    """The blocks TRT-LLM would allocate at fraction ``f``, all else equal: ``⌊B0 × f ÷ f0⌋``.

    A lower bound: ``F × f0`` may exceed ``B0`` blocks by up to one block (the floor), so the true
    count at ``f`` is ``⌊B0 × f ÷ f0⌋`` or at most ``⌊(B0 + 1) × f ÷ f0⌋``.
    """
    _check_fraction("f", f)
    _check_fraction("f0", f0)
    if blocks0 < 1:
        raise ValueError(f"blocks0: {blocks0!r} must be at least 1 block")
    return math.floor(blocks0 * f / f0 + 1e-9)


def suggest_free_gpu_memory_fraction(
    *,
    f0: float,
    max_blocks: int,
    tokens_per_block: int,
    peak_demand_tokens: float,
    target_usage: float,
) -> float:
    """``free_gpu_memory_fraction`` at which the peak demand sits at ``target_usage`` of the pool.

    ``f* = f0 × W ÷ B0`` with ``B0 = max_blocks`` (the page's pool at ``f0``) and ``W =
    ⌈peak ÷ target_usage ÷ tokens_per_block⌉`` the whole blocks wanted. Since ``F ≥ B0 × block_bytes
    ÷ f0``, setting ``f*`` gives at least ``W`` blocks. The result may exceed 1: then no fraction is
    enough on this GPU (callers say so; TRT-LLM accepts at most 1). Not clamped, so that callers can
    tell "lower it" from "cannot reach it".
    """
    _check_fraction("f0", f0)
    _check_positive("tokens_per_block", tokens_per_block)
    _check_fraction("target_usage", target_usage)
    if max_blocks < 1:
        raise ValueError(f"max_blocks: {max_blocks!r} must be at least 1 block")
    if not (math.isfinite(peak_demand_tokens) and peak_demand_tokens >= 0):
        raise ValueError(f"peak_demand_tokens: {peak_demand_tokens!r} must be a count of tokens")
    wanted_blocks = max(1, math.ceil(peak_demand_tokens / target_usage / tokens_per_block - 1e-9))
    return f0 * wanted_blocks / max_blocks


def fraction_text(f: float) -> str:
    """The fraction as printed: rounded UP to 0.001 (setting it then gives at least the blocks wanted)."""
    up = math.ceil(f * 1000 - 1e-6) / 1000
    return f"{up:.3f}"


def advice_text(f: float, *, triton: bool = False) -> str:
    """How the suggestion must read: the value, where it is set, and what it is a share of.

    A value above 1 cannot be set: the text then says that no fraction is enough on this GPU.
    """
    name = f"model parameter {TRITON_PARAMETER}" if triton else SERVE_FLAG
    also = "" if triton else f"LLM API {LLM_API_FIELD}; "
    share = (
        "a share of the GPU memory that is FREE after the weights and buffers are loaded, not of the "
        "GPU's total memory; a kv_cache_config.max_tokens cap, when set, wins if it is smaller"
    )
    if f > 1.0:
        return (
            f"{name}: no value is enough (it would need {fraction_text(f)} > 1 of the free memory, "
            f"{share}); add replicas, a GPU with more memory, or an FP8 KV cache"
        )
    return f"{name} {fraction_text(f)} ({also}{share})"
