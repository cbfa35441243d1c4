"""Per-layer KV kind: which layers grow with context and which are bounded.

Sources: vLLM ``ModelConfig.get_sliding_window`` (``vllm/config/model.py``)
and vLLM's model files, explained in ``docs/capacity.md`` ("Sliding windows",
"Chunked local attention", "Linear attention and mamba state"): ``layer_types`` (transformers >= 4.53
writes it), Gemma-2 alternation (even layers slide), Gemma-3 / Cohere2
``sliding_window_pattern`` (a layer is full when ``(i + 1) % pattern == 0``),
Qwen2 ``use_sliding_window: false`` (window ignored), Llama 4 chunked local
attention on RoPE layers (``no_rope_layers``), Qwen3-Next
``full_attention_interval`` (the other layers are Gated-DeltaNet linear
attention with a constant per-request state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .config import ModelSpec
from .errors import CapacityError

Kind = Literal["full", "mla", "sliding", "chunked", "linear"]

#: Kinds whose KV grows with every token of context.
GROWING_KINDS: frozenset[str] = frozenset({"full", "mla"})


@dataclass(frozen=True)
class LayerKV:
    """One decoder layer's KV cache kind.

    ``window`` is the sliding window (``sliding``) or the attention chunk
    (``chunked``), ``None`` otherwise.
    """

    kind: Kind
    window: int | None = None


_LAYER_TYPE_NAMES: dict[str, Kind] = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "sliding_attention": "sliding",
    "sliding_window_attention": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
}


def _window(spec: ModelSpec) -> int | None:
    """The sliding window vLLM applies (``ModelConfig.get_sliding_window``).

    Qwen2-family configs carry ``sliding_window: 131072`` with
    ``use_sliding_window: false``: vLLM then uses no window at all.
    """
    if spec.text.get("use_sliding_window") is False:
        return None
    window = spec.get("sliding_window")
    if isinstance(window, list):  # some configs give one window per layer; we use the first
        window = next((w for w in window if w), None)
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise CapacityError(f"config.json: sliding_window: must be a positive integer or null, got {window!r}")
    return window


def layer_kinds(spec: ModelSpec) -> tuple[LayerKV, ...]:
    """The KV kind of every decoder layer, in layer order."""
    n = spec.num_layers
    if spec.is_mla:
        return tuple(LayerKV("mla") for _ in range(n))

    layer_types = spec.text.get("layer_types")
    window = _window(spec)
    chunk = spec.get("attention_chunk_size")

    if spec.get("full_attention_interval") and spec.get("linear_num_value_heads"):
        return _qwen3_next_layers(n, int(spec.get("full_attention_interval")))
    if isinstance(layer_types, list) and layer_types:
        return _listed_layers(layer_types, n, window, chunk)
    if chunk:
        return _llama4_layers(spec, int(chunk))
    if window is None:
        return tuple(LayerKV("full") for _ in range(n))
    return _sliding_window_layers(spec, window)


def _qwen3_next_layers(n: int, interval: int) -> tuple[LayerKV, ...]:
    """Qwen3-Next: every interval-th layer is full attention, the rest GDN."""
    return tuple(LayerKV("full") if (i + 1) % interval == 0 else LayerKV("linear") for i in range(n))


def _listed_layers(layer_types: list[Any], n: int, window: int | None, chunk: Any) -> tuple[LayerKV, ...]:
    """``layer_types`` names every layer's attention (transformers >= 4.53 writes it)."""
    if len(layer_types) != n:
        raise CapacityError(
            f"config.json: layer_types: has {len(layer_types)} entries for {n} layers (num_hidden_layers)"
        )
    return tuple(_listed_layer(i, name, window, chunk) for i, name in enumerate(layer_types))


def _listed_layer(i: int, name: object, window: int | None, chunk: Any) -> LayerKV:
    """One ``layer_types`` entry; sliding and chunked entries need the config's window or chunk."""
    kind = _LAYER_TYPE_NAMES.get(str(name))
    if kind is None:
        raise CapacityError(
            f"config.json: layer_types[{i}]: unknown layer type {name!r}"
            f" (known: {', '.join(sorted(_LAYER_TYPE_NAMES))})"
        )
    if kind == "sliding":
        if window is None:
            raise CapacityError("config.json: sliding_window: missing but layer_types has sliding layers")
        return LayerKV("sliding", window)
    if kind == "chunked":
        if not chunk:
            raise CapacityError("config.json: attention_chunk_size: missing but layer_types has chunked layers")
        return LayerKV("chunked", int(chunk))
    return LayerKV(kind)


def _llama4_layers(spec: ModelSpec, chunk: int) -> tuple[LayerKV, ...]:
    """Llama 4: RoPE layers use chunked local attention, NoPE layers are full."""
    n = spec.num_layers
    no_rope = spec.text.get("no_rope_layers")
    if isinstance(no_rope, list) and len(no_rope) == n:
        return tuple(LayerKV("chunked", chunk) if no_rope[i] else LayerKV("full") for i in range(n))
    interval = int(spec.get("nope_layer_interval", 4))
    return tuple(LayerKV("full") if (i + 1) % interval == 0 else LayerKV("chunked", chunk) for i in range(n))


def _sliding_window_layers(spec: ModelSpec, window: int) -> tuple[LayerKV, ...]:
    """Which layers of a model with a sliding window slide, by family."""
    n = spec.num_layers
    if spec.model_type == "gemma2":
        # vLLM gemma2.py: even-indexed layers use the sliding window.
        return tuple(LayerKV("sliding", window) if i % 2 == 0 else LayerKV("full") for i in range(n))
    pattern = spec.get("sliding_window_pattern")
    if pattern:
        # Gemma-3 / Cohere2: a layer is full when (i + 1) % pattern == 0.
        every = int(pattern)
        return tuple(LayerKV("full") if (i + 1) % every == 0 else LayerKV("sliding", window) for i in range(n))
    if spec.model_type.startswith("qwen2") and spec.text.get("use_sliding_window"):
        # Qwen2 with the window switched on: only layers from max_window_layers slide.
        first = int(spec.get("max_window_layers", n))
        return tuple(LayerKV("sliding", window) if i >= first else LayerKV("full") for i in range(n))
    # Mistral-7B-v0.1, Starcoder2, Phi-3: every layer slides.
    return tuple(LayerKV("sliding", window) for _ in range(n))
