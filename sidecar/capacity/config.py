"""Load a model's ``config.json`` and resolve the fields KV sizing needs.

Sources: vLLM ``vllm/config/model.py`` ``ModelConfig`` (``hf_text_config``,
``get_total_num_kv_heads``, ``get_head_size``); explained in ``docs/capacity.md``
("Reading config.json"). This module only reads; the per-layer kinds live in
``layer_kinds.py`` and the byte math in ``layout.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import input_files as files
from ..limits import LIMITS, OutOfRange, finite_number, whole_number
from .errors import CapacityError
from .hub_defaults import fill_class_defaults

#: Where multimodal / composite configs keep the language model's config, in
#: the order vLLM's ``get_hf_text_config`` looks (``thinker_config`` first).
_TEXT_CONFIG_PATHS: tuple[tuple[str, ...], ...] = (
    ("thinker_config", "text_config"),
    ("text_config",),
    ("llm_config",),
    ("language_config",),
)

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
    #: fields config.json left out, filled with its model_type's class defaults (``hub_defaults.py``)
    defaulted: tuple[str, ...] = ()
    text: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A text-config field, ``default`` when missing or null."""
        value = self.text.get(key)
        return default if value is None else value


class ModelFileMissing(CapacityError):
    """``model.config`` names no file yet (a model still downloading): ``run`` waits for it, others refuse."""


def load_model(path: str | Path) -> ModelSpec:
    """Load ``config.json`` (a file, or a model directory holding one).

    A ``model.safetensors.index.json`` beside it, when present, gives the
    exact weight size (its ``metadata.total_size``). Both are read by
    :func:`sidecar.input_files.read_json` (a regular file, at most 16 MiB and 64 MiB,
    nesting bounded); every field KV sizing reads is checked by :func:`spec_from_dict`.
    Raises :class:`ModelFileMissing` when there is no such file, :class:`CapacityError` otherwise.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ModelFileMissing(
            f"--model-config: {path}: no such file (give a config.json or a model directory holding one)"
        )
    try:
        config = files.read_json(str(p), max_bytes=files.JSON_MAX_BYTES, what="a model's config.json")
    except files.FileProblem as exc:
        raise CapacityError(*(f"--model-config: {p}: {problem}" for problem in exc.problems)) from None
    if not isinstance(config, dict):
        raise CapacityError(f"--model-config: {p}: expected a JSON object (a model's config.json)")
    total = _safetensors_total_size(p.parent / "model.safetensors.index.json")
    try:
        return spec_from_dict(config, source=str(p), safetensors_total_bytes=total)
    except CapacityError as exc:
        raise CapacityError(
            *(f"--model-config: {p}: {problem.removeprefix('config.json: ')}" for problem in exc.problems)
        ) from None


#: The largest model.safetensors.index.json metadata.total_size taken: 1 PiB of weights.
_MAX_WEIGHT_BYTES = 1 << 50


def _safetensors_total_size(index: Path) -> int | None:
    if not index.exists():
        return None
    try:
        data = files.read_json(str(index), max_bytes=files.INDEX_MAX_BYTES, what="model.safetensors.index.json")
    except files.FileProblem as exc:
        raise CapacityError(*(f"{index}: {p} (fix or remove the index file)" for p in exc.problems)) from None
    meta = data.get("metadata") if isinstance(data, dict) else None
    raw = meta.get("total_size") if isinstance(meta, dict) else None
    if raw is None:
        raise CapacityError(f"{index}: metadata.total_size: missing or not a number (fix or remove the index file)")
    try:
        return whole_number(raw, "metadata.total_size", low=1, high=_MAX_WEIGHT_BYTES)
    except OutOfRange as exc:
        raise CapacityError(f"{index}: {exc} (fix or remove the index file)") from None


def _defaulted_fields(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields :func:`resolve_text_config` took from the model_type's class defaults."""
    return fill_class_defaults(_merged_text_config(config))[1]


def resolve_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config inside a composite (multimodal) config.

    Follows vLLM's ``get_hf_text_config``: ``thinker_config.text_config``,
    ``text_config``, ``llm_config``, ``language_config``; else the config
    itself. Top-level fields the nested config lacks (dtype, quantization)
    are inherited, then transformers' class defaults for the nested model type
    (``hub_defaults.py``).
    """
    return fill_class_defaults(_merged_text_config(config))[0]


def _merged_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The nested text config with the top-level fields it lacks (dtype, quantization, tying)."""
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
    return merged


def _first(text: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if text.get(key) is not None:
            return text[key]
    return None


def _positive_int(text: Mapping[str, Any], keys: tuple[str, ...], hint: str) -> int:
    """The first of ``keys`` present (already range-checked by :func:`shape_problems`)."""
    value = _first(text, *keys)
    if value is None:
        raise CapacityError(f"config.json: {keys[0]}: missing ({hint})")
    return int(value)


#: The bound of each numeric field KV sizing reads (a row of :data:`sidecar.limits.LIMITS`) and its
#: lowest value. A field outside its range is refused with its name, before any arithmetic.
_BOUND = {limit.key: int(limit.default) for limit in LIMITS if limit.key.startswith("model.")}
_FIELDS: dict[str, tuple[str, int]] = {
    **{k: ("model.layers", 1) for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")},
    **{k: ("model.layers", 1) for k in ("full_attention_interval", "nope_layer_interval", "sliding_window_pattern")},
    **{k: ("model.layers", 0) for k in ("first_k_dense_replace", "max_window_layers")},
    **{
        k: ("model.heads", 1)
        for k in (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "n_head_kv",
            "num_kv_heads",
            "num_key_value_heads",
            "multi_query_group_num",
            "linear_num_key_heads",
            "linear_num_value_heads",
        )
    },
    **{
        k: ("model.head_dim", 1)
        for k in (
            "head_dim",
            "hidden_size_per_head",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        )
    },
    **{k: ("model.head_dim", 0) for k in ("qk_nope_head_dim", "v_head_dim")},
    **{k: ("model.width", 1) for k in ("hidden_size", "n_embd", "d_model", "q_lora_rank")},
    **{k: ("model.width", 1) for k in ("intermediate_size", "ffn_hidden_size", "n_inner", "moe_intermediate_size")},
    "shared_expert_intermediate_size": ("model.width", 0),
    **{k: ("model.vocab", 1) for k in ("vocab_size", "padded_vocab_size")},
    **{
        k: ("model.context", 1)
        for k in (
            "max_position_embeddings",
            "n_positions",
            "max_seq_len",
            "seq_length",
            "max_sequence_length",
            "attention_chunk_size",
        )
    },
    **{k: ("model.experts", 0) for k in ("n_routed_experts", "num_local_experts", "num_experts")},
    **{k: ("model.experts", 0) for k in ("num_experts_per_tok", "n_shared_experts")},
}
#: What to say after a value out of its range: the bound is what real models have.
_WHY = {
    "model.layers": "no real model has more than 126 layers",
    "model.heads": "no real model has more than 232 heads",
    "model.head_dim": "real heads are 64-576 wide",
    "model.width": "no real model is wider than 73,728",
    "model.vocab": "no real vocabulary holds more than 262,208 tokens",
    "model.context": "no real context is longer than 10,485,760 tokens",
    "model.experts": "no real model has more than 384 experts",
}


def _check(value: Any, key: str, limit: str, low: int, problems: list[str]) -> int | None:
    """``value`` as a whole number within ``limit``'s bound, or None with the problem appended.

    Text is refused: no real config.json quotes a count, and transformers would not read one either.
    """
    try:
        if isinstance(value, str):
            raise OutOfRange(key, value, f"a whole number from {low} to {_BOUND[limit]}")
        return whole_number(value, key, low=low, high=_BOUND[limit])
    except OutOfRange as exc:
        problems.append(f"config.json: {exc} ({_WHY[limit]}: is this the model's own config.json?)")
        return None


def _checked_fields(text: Mapping[str, Any], problems: list[str]) -> dict[str, int]:
    """Every numeric field of :data:`_FIELDS` that ``text`` holds (not null), range-checked."""
    out: dict[str, int] = {}
    for key, (limit, low) in _FIELDS.items():
        if text.get(key) is None:
            continue
        number = _check(text[key], key, limit, low, problems)
        if number is not None:
            out[key] = number
    window = text.get("sliding_window")
    for i, item in enumerate(window if isinstance(window, list) else [window]):
        if item is not None and not (item is False and isinstance(window, list)):
            where = f"sliding_window[{i}]" if isinstance(window, list) else "sliding_window"
            _check(item, where, "model.context", 1, problems)
    attn = text.get("attn_config")
    if isinstance(attn, Mapping) and attn.get("kv_n_heads") is not None:
        _check(attn["kv_n_heads"], "attn_config.kv_n_heads", "model.heads", 1, problems)
    quant = text.get("quantization_config")
    if isinstance(quant, Mapping):
        for key in ("bits", "w_bit"):
            if quant.get(key) is not None:
                try:
                    finite_number(quant[key], f"quantization_config.{key}", low=1, high=64)
                except OutOfRange as exc:
                    problems.append(f"config.json: {exc} (weights are 1 to 64 bits wide)")
    return out


def _text_fields(text: Mapping[str, Any], config: Mapping[str, Any], problems: list[str]) -> None:
    """``architectures`` is a list of names, ``model_type`` a name, ``layer_types`` a list."""
    for where, node in (("", config), ("text config: ", text)):
        arch = node.get("architectures")
        if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
            problems.append(f"config.json: {where}architectures: must be a list of class names, got {arch!r:.40}")
        kind = node.get("model_type")
        if kind is not None and not isinstance(kind, str):
            problems.append(f"config.json: {where}model_type: must be a name such as 'llama', got {kind!r:.40}")
        if node is text:
            break
    layer_types = text.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, list):
        problems.append(f"config.json: layer_types: must be a list of layer kinds, got {layer_types!r:.40}")


def shape_problems(config: Mapping[str, Any]) -> list[str]:
    """Every problem of a parsed config.json that KV sizing would trip over (see :func:`_validated`)."""
    return _validated(config)[1]


def _validated(config: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """The numeric fields KV sizing reads, checked, and every problem of the config, in one pass.

    Each numeric field it reads is a whole number within the bound of its :data:`sidecar.limits.LIMITS`
    row (``model.layers``, ``model.heads``, ...); and the shape can exist: KV heads at most the
    attention heads and dividing them, ``hidden_size`` at least the head count. Returns the checked
    fields as ints and the problems (``[]`` when sound).
    """
    problems: list[str] = []
    text = resolve_text_config(config)
    _text_fields(text, config, problems)
    if problems:
        return {}, problems
    fields = _checked_fields(text, problems)
    heads = next((fields[k] for k in ("num_attention_heads", "n_head", "num_heads") if k in fields), None)
    hidden = next((fields[k] for k in ("hidden_size", "n_embd", "d_model") if k in fields), None)
    kv = next(
        (
            fields[k]
            for k in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
            if k in fields
        ),
        None,
    )
    if heads is not None and hidden is not None and hidden < heads:
        problems.append(
            f"config.json: hidden_size: {hidden} is smaller than num_attention_heads {heads} "
            "(every head is at least one element wide: is this the model's own config.json?)"
        )
    if heads is not None and kv is not None and not is_mla_config(text) and (kv > heads or heads % kv):
        relation = "is more than" if kv > heads else "does not divide"
        problems.append(
            f"config.json: num_key_value_heads: {kv} {relation} num_attention_heads {heads} "
            "(each KV head serves a whole group of attention heads: is this the model's own config.json?)"
        )
    return fields, problems


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
    return int(value)


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
        return int(explicit)
    return hidden_size // num_attention_heads


def spec_from_dict(
    config: Mapping[str, Any], *, source: str = "<config>", safetensors_total_bytes: int | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed config.json object.

    Raises :class:`CapacityError` with every problem of :func:`shape_problems` at once.
    """
    fields, problems = _validated(config)
    if problems:
        raise CapacityError(*problems)
    text = {**resolve_text_config(config), **fields}  # 1.6e4 -> 16000, for the arithmetic after
    defaulted = _defaulted_fields(config)
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
        defaulted=defaulted,
        text=text,
    )
