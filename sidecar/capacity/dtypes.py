"""Data types: what vLLM serves the weights in and what the KV cache stores.

Sources: vLLM ``vllm/config/cache.py`` (``CacheConfig.cache_dtype``) and
vLLM ``vllm/config/model.py`` (``_resolve_auto_dtype``: a float32 config, or
one without a dtype, is served as bfloat16 under ``--dtype auto``; vLLM 0.32
logs "Downcasting torch.float32 to torch.bfloat16").
"""

from __future__ import annotations

from .errors import CapacityError

#: Canonical dtype name -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}

# Spellings vLLM's --dtype and config.json's torch_dtype use.
_ALIASES: dict[str, str] = {
    "float": "float32",
    "fp32": "float32",
    "torch.float32": "float32",
    "half": "float16",
    "fp16": "float16",
    "torch.float16": "float16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
}

#: Values accepted by ``--kv-cache-dtype`` (vLLM's spellings).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")

#: Values accepted by ``--dtype``.
SERVED_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")

#: ``fp8_ds_mla`` (DeepSeek-V3.2 sparse MLA) stores 656 bytes per token per
#: layer whatever the head size (``MLAAttentionSpec`` in ``vllm/v1/kv_cache_interface.py``).
FP8_DS_MLA_BYTES_PER_TOKEN_LAYER = 656


def canonical_dtype(name: str) -> str:
    """Normalise a dtype spelling (``half``, ``torch.float16``...) to a key of DTYPE_BYTES."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise CapacityError(f"dtype: unknown data type {name!r} (use one of bfloat16, float16, float32)")
    return key


def served_dtype(config_dtype: str | None, requested: str | None = None) -> str:
    """The dtype vLLM serves the weights (and an ``auto`` KV cache) in.

    ``requested`` is ``--dtype``; ``None``/``"auto"`` apply vLLM's rule
    (``vllm/config/model.py`` ``_resolve_auto_dtype``): the config's dtype,
    except that float32 or a missing dtype is served as bfloat16.
    """
    if requested is not None and str(requested).lower() != "auto":
        try:
            dtype = canonical_dtype(requested)
        except CapacityError:
            dtype = ""
        if dtype not in ("float32", "bfloat16", "float16"):
            raise CapacityError(
                f"--dtype: {requested!r} is not a weight dtype (use auto, bfloat16, float16 or float32)"
            )
        return dtype
    if config_dtype is None:
        return "bfloat16"
    try:
        dtype = canonical_dtype(config_dtype)
    except CapacityError:
        raise CapacityError(
            f"config.json: torch_dtype: unknown data type {config_dtype!r} (pass --dtype bfloat16 or --dtype float16)"
        ) from None
    return "bfloat16" if dtype == "float32" else dtype


def kv_cache_dtype(kv_cache_dtype: str, served: str) -> str:
    """Resolve ``--kv-cache-dtype``: ``auto`` = the served dtype (docs/capacity.md, "KV dtype")."""
    key = str(kv_cache_dtype).strip().lower()
    if key == "auto":
        return served
    if key == "fp8_ds_mla":
        return key
    key = _ALIASES.get(key, key)
    if key not in KV_CACHE_DTYPES:
        raise CapacityError(
            f"--kv-cache-dtype: unknown value {kv_cache_dtype!r} (use one of {', '.join(KV_CACHE_DTYPES)})"
        )
    return key


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a canonical dtype (fp8 variants are 1 byte)."""
    if dtype == "fp8_ds_mla":
        return 1
    return DTYPE_BYTES[canonical_dtype(dtype)]
