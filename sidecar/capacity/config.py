"""Load a model's ``config.json`` and resolve the fields KV sizing needs.

Sources: vLLM ``vllm/config/model.py`` ``ModelConfig`` (``hf_text_config``,
``get_total_num_kv_heads``, ``get_head_size``); explained in ``docs/capacity.md``
("Reading config.json"). This module only reads; the per-layer kinds live in
``layer_kinds.py`` and the byte math in ``layout.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CapacityError

#: Where multimodal / composite configs keep the language model's config, in
#: the order vLLM's ``get_hf_text_config`` looks (``thinker_config`` first).
_TEXT_CONFIG_PATHS: tuple[tuple[str, ...], ...] = (
    ("thinker_config", "text_config"),
    ("text_config",),
    ("llm_config",),
    ("language_config",),
)

#: transformers' defaults for fields that abridged text configs omit (the
#: saved gemma-3-27b-it config has no vocab_size / max_position_embeddings /
#: sliding_window_pattern in its text_config; transformers fills them in).
_TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6},
    "gemma2": {"sliding_window": 4096},
    "cohere2": {"sliding_window_pattern": 4},
}

#: Models with no paged KV cache at all, or whose state we do not model yet.
#: Each maps to the reason shown to the user.
_UNSUPPORTED_MODEL_TYPES: dict[str, str] = {
    "mamba": "attention-free state-space model: it has no paged KV cache",
    "mamba2": "attention-free state-space model: it has no paged KV cache",
    "falcon_mamba": "attention-free state-space model: it has no paged KV cache",
    "rwkv": "attention-free RNN: it has no paged KV cache",
    "jamba": "attention + mamba hybrid whose mamba state is not modelled yet",
    "bamba": "attention + mamba hybrid whose mamba state is not modelled yet",
    "granitemoehybrid": "attention + mamba hybrid whose mamba state is not modelled yet",
    "nemotron_h": "attention + mamba hybrid whose mamba state is not modelled yet",
    "falcon_h1": "attention + mamba hybrid whose mamba state is not modelled yet",
    "zamba": "attention + mamba hybrid whose mamba state is not modelled yet",
    "zamba2": "attention + mamba hybrid whose mamba state is not modelled yet",
    "plamo2": "attention + mamba hybrid whose mamba state is not modelled yet",
    "lfm2": "attention + short-conv hybrid whose state is not modelled yet",
    "minimax": "attention + lightning-attention hybrid whose state is not modelled yet",
    "minimax_text_01": "attention + lightning-attention hybrid whose state is not modelled yet",
    "kimi_linear": "MLA + KDA linear-attention hybrid whose state is not modelled yet",
    "t5": "encoder-decoder model: its cross-attention cache is not modelled",
    "bart": "encoder-decoder model: its cross-attention cache is not modelled",
    "whisper": "encoder-decoder model: its cross-attention cache is not modelled",
    "bert": "encoder-only model: vLLM keeps no paged KV cache for it",
    "roberta": "encoder-only model: vLLM keeps no paged KV cache for it",
    "xlm-roberta": "encoder-only model: vLLM keeps no paged KV cache for it",
}


@dataclass(frozen=True)
class ModelSpec:
    """The fields of a model's text config that KV sizing needs, resolved.

    ``text`` keeps the whole resolved text config so that ``layer_kinds.py`` can
    read per-layer fields (``layer_types``, ``sliding_window``...).
    """

    source: str
    architecture: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    config_dtype: str | None
    tie_word_embeddings: bool
    quantization: Mapping[str, Any] | None
    is_mla: bool
    #: ``metadata.total_size`` of ``model.safetensors.index.json`` when present.
    safetensors_total_bytes: int | None = None
    text: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A text-config field, ``default`` when missing or null."""
        value = self.text.get(key)
        return default if value is None else value


def load_model(path: str | Path) -> ModelSpec:
    """Load ``config.json`` (a file, or a model directory holding one).

    A ``model.safetensors.index.json`` beside it, when present, gives the
    exact weight size (its ``metadata.total_size``).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise CapacityError(
            f"--model-config: {path}: no such file (give a config.json or a model directory holding one)"
        )
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CapacityError(f"--model-config: {p}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise CapacityError(f"--model-config: {p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(config, dict):
        raise CapacityError(f"--model-config: {p}: expected a JSON object (a model's config.json)")
    total = _safetensors_total_size(p.parent / "model.safetensors.index.json")
    return spec_from_dict(config, source=str(p), safetensors_total_bytes=total)


def _safetensors_total_size(index: Path) -> int | None:
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        total = int(data["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CapacityError(
            f"{index}: metadata.total_size: missing or not a number (fix or remove the index file)"
        ) from None
    if total <= 0:
        raise CapacityError(f"{index}: metadata.total_size: must be > 0, got {total}")
    return total


def resolve_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config inside a composite (multimodal) config.

    Follows vLLM's ``get_hf_text_config``: ``thinker_config.text_config``,
    ``text_config``, ``llm_config``, ``language_config``; else the config
    itself. Top-level fields the nested config lacks (dtype, quantization)
    are inherited, then transformers' defaults for the nested model type.
    """
    text: Mapping[str, Any] = config
    for path in _TEXT_CONFIG_PATHS:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            text = node
            break
    merged = dict(text)
    if text is not config:
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings", "architectures"):
            if merged.get(key) is None and config.get(key) is not None:
                merged[key] = config[key]
    for key, value in _TRANSFORMERS_DEFAULTS.get(str(merged.get("model_type", "")), {}).items():
        merged.setdefault(key, value)
    return merged


def _first(text: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if text.get(key) is not None:
            return text[key]
    return None


def _positive_int(text: Mapping[str, Any], keys: tuple[str, ...], hint: str) -> int:
    value = _first(text, *keys)
    if value is None:
        raise CapacityError(f"config.json: {keys[0]}: missing ({hint})")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CapacityError(f"config.json: {keys[0]}: must be a positive integer, got {value!r}")
    return value


def is_mla_config(text: Mapping[str, Any]) -> bool:
    """DeepSeek-style multi-head latent attention (vLLM ``ModelConfig.is_deepseek_mla``).

    vLLM keys it on the model type (deepseek_v2/v3, kimi_k2, ...) plus a
    non-null ``kv_lora_rank``; every such config also carries
    ``qk_rope_head_dim``, so we key on the two fields.
    """
    return text.get("kv_lora_rank") is not None and text.get("qk_rope_head_dim") is not None


def total_kv_heads(text: Mapping[str, Any], num_attention_heads: int) -> int:
    """KV heads before tensor parallelism (vLLM ``get_total_num_kv_heads``).

    Falcon ``multi_query`` -> 1; MPT/DBRX ``attn_config.kv_n_heads``; then the
    first non-null of ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``,
    ``multi_query_group_num``; else MHA (= ``num_attention_heads``), never 1 or 8.
    """
    if text.get("model_type") in ("falcon", "RefinedWeb", "RefinedWebModel") and text.get("multi_query"):
        if not text.get("new_decoder_architecture"):
            return 1
    attn_config = text.get("attn_config")
    if isinstance(attn_config, Mapping) and attn_config.get("kv_n_heads") is not None:
        return int(attn_config["kv_n_heads"])
    value = _first(text, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    if value is None:
        return num_attention_heads
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CapacityError(f"config.json: num_key_value_heads: must be a positive integer, got {value!r}")
    return value


def head_size(text: Mapping[str, Any], hidden_size: int, num_attention_heads: int) -> int:
    """Per-head size (vLLM ``ModelConfig.get_head_size``).

    MLA -> ``kv_lora_rank + qk_rope_head_dim`` (the latent, 512 + 64 = 576 for
    DeepSeek-V3); an explicit ``head_dim`` wins over ``hidden_size //
    num_attention_heads`` (Qwen3-32B: 128, not 80); then
    ``hidden_size_per_head``; else hidden / heads.
    """
    if is_mla_config(text):
        return int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
    explicit = _first(text, "head_dim", "hidden_size_per_head")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit <= 0:
            raise CapacityError(f"config.json: head_dim: must be a positive integer, got {explicit!r}")
        return explicit
    return hidden_size // num_attention_heads


def spec_from_dict(
    config: Mapping[str, Any], *, source: str = "<config>", safetensors_total_bytes: int | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed config.json object."""
    text = resolve_text_config(config)
    architectures = text.get("architectures") or config.get("architectures") or []
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if not architectures and not model_type:
        raise CapacityError(
            "config.json: architectures: missing, and no model_type either (is this a model's config.json?)"
        )
    architecture = str(architectures[0]) if architectures else model_type
    for kind in (model_type, str(config.get("model_type") or "")):
        if kind in _UNSUPPORTED_MODEL_TYPES:
            raise CapacityError(
                f"config.json: model_type: {kind!r} ({architecture}) is not supported: {_UNSUPPORTED_MODEL_TYPES[kind]}"
                " (give vLLM's measured --kv-cache-memory-bytes and read the blocks from its log instead)"
            )
    layers = _positive_int(
        text,
        ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
        "the number of transformer layers; multimodal configs keep it in text_config",
    )
    heads = _positive_int(text, ("num_attention_heads", "n_head", "num_heads"), "the number of attention heads")
    hidden = _positive_int(text, ("hidden_size", "n_embd", "d_model"), "the model width")
    kv_heads = total_kv_heads(text, heads)
    mla = is_mla_config(text)
    dtype = _first(text, "dtype", "torch_dtype")
    quant = text.get("quantization_config")
    return ModelSpec(
        source=source,
        architecture=architecture,
        model_type=model_type,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=1 if mla else kv_heads,
        head_dim=head_size(text, hidden, heads),
        hidden_size=hidden,
        vocab_size=_first(text, "vocab_size", "padded_vocab_size"),
        intermediate_size=_first(text, "intermediate_size", "ffn_hidden_size", "n_inner"),
        max_position_embeddings=_first(
            text, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"
        ),
        config_dtype=str(dtype) if dtype is not None else None,
        # transformers' PretrainedConfig default is to tie (Gemma configs rely on it).
        tie_word_embeddings=bool(text.get("tie_word_embeddings", True)),
        quantization=quant if isinstance(quant, Mapping) else None,
        is_mla=mla,
        safetensors_total_bytes=safetensors_total_bytes,
        text=text,
    )
