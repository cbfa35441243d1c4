"""Theoretical KV-cache capacity of a model under vLLM, from its config.json.

Pure functions, no I/O beyond reading the config file in ``load_model``::

    spec = load_model("Llama-3.1-8B/config.json")
    layout = kv_layout(spec, tp=1, kv_cache_dtype="auto")      # 131,072 B/token
    budget = estimate_budget(spec, layout, gpu_memory_bytes=parse_memory("H100-80GB"),
                             gpu_memory_utilization=0.9)
    blocks = num_blocks(layout, budget.kv_budget_bytes)

Formulas and sources: ``docs/capacity.md`` and each module's docstrings.
"""

from .blocks import (
    blocks_per_request,
    capacity_tokens,
    logged_capacity_tokens,
    max_concurrency,
    num_blocks,
    parse_version,
    request_kv_bytes,
    usable_concurrency,
    usable_tokens,
)
from .budget import (
    GPU_TOTAL_GIB,
    Budget,
    NonKVBytes,
    ServingFlags,
    activation_estimate_bytes,
    check_utilization,
    cudagraph_estimate_bytes,
    estimate_budget,
    exact_budget,
    gpu_memory_bytes,
    gpu_name,
    non_kv_bytes,
    non_torch_estimate_bytes,
    parameter_counts,
    parse_memory,
    weights_bytes,
)
from .config import ModelFileMissing, ModelSpec, load_model, resolve_text_config, spec_from_dict
from .dtypes import served_dtype
from .errors import CapacityError
from .inverse import blocks_for, inflection_context_length, required_kv_cache_memory_bytes, required_utilization
from .layer_kinds import LayerKV, layer_kinds
from .layout import KVGroup, KVLayout, get_pp_indices, kv_layout

__all__ = [
    "Budget",
    "CapacityError",
    "ModelFileMissing",
    "GPU_TOTAL_GIB",
    "KVGroup",
    "KVLayout",
    "LayerKV",
    "ModelSpec",
    "NonKVBytes",
    "ServingFlags",
    "gpu_name",
    "non_kv_bytes",
    "activation_estimate_bytes",
    "blocks_for",
    "blocks_per_request",
    "capacity_tokens",
    "check_utilization",
    "cudagraph_estimate_bytes",
    "estimate_budget",
    "exact_budget",
    "get_pp_indices",
    "gpu_memory_bytes",
    "inflection_context_length",
    "kv_layout",
    "layer_kinds",
    "load_model",
    "logged_capacity_tokens",
    "max_concurrency",
    "non_torch_estimate_bytes",
    "num_blocks",
    "parameter_counts",
    "parse_memory",
    "parse_version",
    "request_kv_bytes",
    "required_kv_cache_memory_bytes",
    "required_utilization",
    "resolve_text_config",
    "served_dtype",
    "spec_from_dict",
    "usable_concurrency",
    "usable_tokens",
    "weights_bytes",
]
