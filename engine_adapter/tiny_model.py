"""A tiny causal LM with random weights and a tokenizer trained on the spot,
saved as a Hugging Face folder a live engine loads (nothing is downloaded).

    path = build_tiny_model(dir, layers=2, hidden=128)   # idempotent per (dir, shape)

The tokenizer is byte-level BPE trained with ``tokenizers`` on a few built-in
sentences, so any text encodes; the weights are seeded, so two builds of the
same shape are the same model.  Raises ImportError (with the install line)
when ``transformers``/``tokenizers`` are missing.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

_CORPUS = (
    "An agent calls a tool, waits for the result, and continues the conversation.",
    "The test suite ran for forty seconds and two tests failed with assertion errors.",
    "Build the project, run the linter, then open a pull request with the change.",
    "The user approved the plan after reading the summary of the diff.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "{\"role\": \"tool\", \"content\": \"exit code 0\"}",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?()[]{}<>/\\|@#$%^&*-_=+'\"",
)


@dataclass(frozen=True)
class TinyModel:
    """The shape of the model ``build_tiny_model`` writes."""
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 1024
    max_positions: int = 4096
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """KV bytes one token holds in the engine's cache (fp32 by default)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def params(self) -> int:
        """Parameter count (embeddings, attention, MLP, norms, untied LM head)."""
        h, i, v, l = self.hidden, self.intermediate, self.vocab, self.layers
        attn = h * h * 2 + h * self.kv_heads * self.head_dim * 2
        return 2 * v * h + l * (attn + 3 * h * i + 2 * h) + h


def build_tiny_model(root: str | Path, shape: TinyModel = TinyModel()) -> Path:
    """Write (once) a Llama of ``shape`` with seeded random weights and a trained
    byte-level BPE tokenizer under ``root``; returns the model folder.  A folder
    already holding this exact shape is reused."""
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(f"the tiny live model needs transformers and tokenizers "
                          f"(pip install 'kvtier[hf]'): {exc}") from exc
    root = Path(root)
    tag = "tiny-llama-" + "-".join(f"{k}{v}" for k, v in asdict(shape).items())
    out = root / tag
    stamp = out / "kvtier-shape.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(shape):
        return out
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=shape.vocab, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(out)

    torch.manual_seed(shape.seed)
    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.max_positions,
                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():      # random weights scaled so greedy outputs vary with the context
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    stamp.write_text(json.dumps(asdict(shape)))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m kvtier.engine_adapter.tiny_model DIR``: build (once) the tiny model under DIR, print its folder."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m kvtier.engine_adapter.tiny_model", description=main.__doc__)
    p.add_argument("dir", help="where to build it")
    p.add_argument("--layers", type=int, default=TinyModel.layers)
    p.add_argument("--hidden", type=int, default=TinyModel.hidden)
    a = p.parse_args(argv)
    if a.layers < 1 or a.hidden < 8 or a.hidden % 4:
        p.error("--layers must be >= 1 and --hidden a multiple of 4, >= 8")
    print(build_tiny_model(a.dir, TinyModel(layers=a.layers, hidden=a.hidden, intermediate=2 * a.hidden)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
