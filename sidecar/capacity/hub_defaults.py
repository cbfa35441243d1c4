"""Fields a Hub config.json leaves out because they equal its ``model_type``'s defaults.

vLLM reads config.json through transformers' ``AutoConfig`` (``vllm/transformers_utils/config.py``
``get_config``), so a missing field takes the config class' default; ``save_pretrained`` writes
``PretrainedConfig.to_diff_dict()`` (``src/transformers/configuration_utils.py``), which drops
fields equal to the defaults, and nested ``text_config`` dicts lose even their sizes
(``recursive_diff_dict``): gemma-3-27b-it's ``text_config`` has no ``vocab_size``. A raw-JSON
reader must fill them the same way, per ``model_type``: from transformers' own config classes when
the package is importable, else from :data:`CLASS_DEFAULTS`, copied from those classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The fields the capacity model reads, as transformers' config classes default them
#: (``src/transformers/models/<type>/configuration_<type>.py``, the ``__init__`` defaults; checked
#: equal to transformers 5.19's ``CONFIG_MAPPING[type]()``, except ``sliding_window_pattern``, a
#: transformers 4.x field that 5.x replaced with ``layer_types``).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
    },
    "qwen2": {"vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768},
    "qwen3": {"vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768, "head_dim": 128},
    "qwen3_moe": {"vocab_size": 151936, "tie_word_embeddings": False},
    "gemma2": {"vocab_size": 256000, "tie_word_embeddings": True, "head_dim": 256, "sliding_window": 4096},
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "cohere2": {"sliding_window_pattern": 4},
    "gpt_oss": {"vocab_size": 201088, "tie_word_embeddings": False, "head_dim": 64},
}


def _transformers_defaults(model_type: str, keys: set[str]) -> dict[str, Any] | None:
    """The class defaults from transformers itself, when it is installed and knows the type."""
    try:
        from transformers import CONFIG_MAPPING  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    try:
        default = CONFIG_MAPPING[model_type]().to_dict()
    except (KeyError, TypeError, ValueError):
        return None
    return {k: default[k] for k in keys if default.get(k) is not None}


def fill_class_defaults(text: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``text`` with its ``model_type``'s defaults for the fields it lacks, and the names filled.

    ``head_dim`` is filled only where the class has a fixed one (Qwen3, Gemma); elsewhere
    transformers derives it from ``hidden_size / num_attention_heads``, as the capacity model does.
    """
    model_type = str(text.get("model_type") or "")
    table = CLASS_DEFAULTS.get(model_type, {})
    defaults = _transformers_defaults(model_type, set(table)) if table else None
    defaults = {**table, **(defaults or {})}
    filled = dict(text)
    names = []
    for key, value in defaults.items():
        if filled.get(key) is None:
            filled[key] = value
            names.append(key)
    return filled, tuple(sorted(names))
