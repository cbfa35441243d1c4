"""Property-based fuzz of the model-config reader: real config.json files with mutated values and types.

Each example takes one of the real configs of tests/fixtures/model-configs, replaces a few of its fields
(those KV sizing reads, and others) with hostile values (huge, negative, fractional, NaN, text, lists,
booleans, nested objects), and runs the whole capacity model on it. Properties: nothing but
:class:`CapacityError` escapes, and an accepted config gives a finite, non-negative bytes per token (positive over
all layers) and a finite budget. Deterministic (``derandomize``) and bounded, so CI time is fixed.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar import capacity as cap
from sidecar.capacity.config import _FIELDS

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "model-configs"
CONFIGS = {p.name: json.loads(p.read_text()) for p in sorted(MODELS.glob("*.json"))}
#: The fields the capacity model reads, and a few it reads as structure.
KEYS = sorted(
    {*_FIELDS, "sliding_window", "layer_types", "no_rope_layers", "use_sliding_window", "architectures"}
    | {"model_type", "torch_dtype", "quantization_config", "text_config", "tie_word_embeddings", "attn_config"}
)

HOSTILE = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([0, 1, 2, 3, 7, 64, 1023, 1024, 1025, 10**9, -1, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e9, 0.5, -600.0, 4096.0, 1e308]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["4096", "٩", "1e9", "bfloat16", "fp8", "full_attention", "sliding_attention"]),
    st.lists(st.sampled_from([0, 1, None, "full_attention", "sliding_attention", 4096]), max_size=6),
    st.dictionaries(st.sampled_from(["bits", "quant_method", "kv_n_heads", "num_hidden_layers"]), st.integers()),
)


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    config = json.loads(json.dumps(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]))
    target = config
    if isinstance(config.get("text_config"), dict) and draw(st.booleans()):
        target = config["text_config"]
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)):
        target[key] = draw(HOSTILE)
    return config


def _check(config: dict[str, Any]) -> None:
    try:
        spec = cap.spec_from_dict(config, source="fuzz")
        layout = cap.kv_layout(spec)
    except cap.CapacityError:
        return
    # bytes_per_token counts the layers that grow with the context (0 when every layer slides, as in
    # Mistral-7B-v0.1); every layer together costs something
    assert math.isfinite(layout.bytes_per_token) and layout.bytes_per_token >= 0, layout
    assert 0 < layout.bytes_per_token_all_layers < 2**50, layout
    try:
        budget = cap.estimate_budget(spec, layout, gpu_memory_bytes=80 * 2**30, gpu_memory_utilization=0.9)
    except cap.CapacityError:
        return
    assert math.isfinite(budget.kv_budget_bytes)


@settings(
    max_examples=2000, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(mutated_configs())
def test_no_exception_but_capacity_error_escapes_and_accepted_configs_give_positive_finite_sizes(config):
    _check(config)


def test_the_unmutated_real_configs_pass_the_same_checks():
    for config in CONFIGS.values():
        _check(config)


TEXTS = {name: (MODELS / name).read_bytes() for name in sorted(CONFIGS)}
INSERTS = st.sampled_from(
    [b"[" * 80, b"9" * 400, b"NaN", b"-Infinity", b"\xff\xfe", b"\x00", b'"', b",", b"}", b'{"a":', b"\xef\xbb\xbf"]
)


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.sampled_from(sorted(TEXTS)), st.floats(0, 1), INSERTS, st.booleans())
def test_the_file_reader_refuses_broken_json_with_capacity_error_only(name, where, insert, truncate):
    """Bytes inserted into (or the file cut at) any point of a real config.json: a CapacityError or a model."""
    text = TEXTS[name]
    at = int(where * len(text))
    broken = text[:at] if truncate else text[:at] + insert + text[at:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(broken)
        try:
            spec = cap.load_model(path)
        except cap.CapacityError as e:
            assert all(p.startswith(f"--model-config: {path}") for p in e.problems), e.problems
            return
        _check(dict(spec.text))
