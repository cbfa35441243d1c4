"""Config fields the Hub leaves out, filled per model_type as transformers fills them."""

from __future__ import annotations

import json

from capacity_fixtures import config_path

from sidecar.capacity import load_model, spec_from_dict
from sidecar.capacity.hub_defaults import CLASS_DEFAULTS, fill_class_defaults


def test_gemma3_text_config_gets_its_vocabulary_and_tying():
    """gemma-3-27b-it's text_config, as on the Hub, has no vocab_size and no tie_word_embeddings."""
    raw = json.loads(config_path("gemma-3-27b-it").read_text())
    assert "vocab_size" not in raw["text_config"] and "tie_word_embeddings" not in raw["text_config"]
    spec = load_model(config_path("gemma-3-27b-it"))
    assert spec.vocab_size == 262208 and spec.tie_word_embeddings is True
    assert {"vocab_size", "tie_word_embeddings"} <= set(spec.defaulted)


def test_llama_leaves_embeddings_untied_when_the_file_says_nothing():
    """LlamaConfig's default is tie_word_embeddings=False: an lm_head of its own, counted in W."""
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096}
    base |= {"num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256}
    spec = spec_from_dict(base)
    assert spec.tie_word_embeddings is False and spec.defaulted == ("max_position_embeddings", "tie_word_embeddings")


def test_a_field_the_file_gives_is_never_replaced():
    filled, names = fill_class_defaults({"model_type": "qwen2", "vocab_size": 1000, "tie_word_embeddings": True})
    assert filled["vocab_size"] == 1000 and filled["tie_word_embeddings"] is True
    assert names == ("max_position_embeddings",)


def test_unknown_model_types_get_nothing():
    assert fill_class_defaults({"model_type": "my_model"}) == ({"model_type": "my_model"}, ())


def test_every_table_row_names_only_fields_the_capacity_model_reads():
    read = {
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "sliding_window",
        "sliding_window_pattern",
        "tie_word_embeddings",
    }
    for model_type, row in CLASS_DEFAULTS.items():
        assert set(row) <= read, model_type
