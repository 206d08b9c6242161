"""Embedded default for the examples and tests: no download needed.

* :class:`ByteTokenizer` - UTF-8 bytes as token ids (plus BOS/EOS/PAD), vocab 259.
* :func:`synthetic_corpus` - a deterministic long-tail corpus: mostly short documents, a few
  long ones that dominate attention cost (the regime WFAP and ATP-CP are for). The text has
  learnable structure (templated sentences, counters), so the loss visibly falls in tens of steps.
* :func:`tiny_llama_config` - a small Llama to build with ``AutoModelForCausalLM.from_config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ByteTokenizer", "synthetic_corpus", "synthetic_lengths", "tiny_llama_config"]

_WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "window", "garden", "orbit",
          "signal", "matrix", "kernel", "anchor", "tail", "packet", "token", "shard", "batch")
_TEMPLATES = (
    "the {a} follows the {b} and the {b} follows the {c}. ",
    "step {n}: move {a} to {b}, then {c} to {a}. ",
    "{a} {b} {c} {a} {b} {c}; count {n} {m}. ",
    "if {a} then {b} else {c}. ",
    "record {n} holds {a} and {b}. ",
)


class ByteTokenizer:
    """Byte-level tokenizer: id = byte value (0..255), BOS 256, EOS 257, PAD 258."""

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids, self.eos_token_id] if add_special_tokens else ids

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __call__(self, text: str | list[str], **_: Any) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.encode(text)}
        return {"input_ids": [self.encode(t) for t in text]}


def synthetic_lengths(num_docs: int, *, seed: int = 0, max_len: int = 6144) -> np.ndarray:
    """Long-tail document lengths in tokens: ~85% short (median ``max_len / 50``), ~12% medium
    (``max_len / 10 .. max_len / 3``), ~3% long (``max_len / 3 .. max_len``)."""
    if max_len < 64:
        raise ValueError(f"max_len={max_len} must be >= 64")
    rng = np.random.default_rng([seed, 1])
    kind = rng.random(num_docs)
    short = rng.lognormal(np.log(max_len / 50), 0.6, num_docs)
    medium = rng.uniform(max_len / 10, max_len / 3, num_docs)
    long = rng.uniform(max_len / 3, max_len, num_docs)
    lengths = np.where(kind < 0.85, short, np.where(kind < 0.97, medium, long))
    return np.clip(lengths, 16, max_len).astype(np.int64)


def synthetic_corpus(num_docs: int = 400, *, seed: int = 0, max_len: int = 6144) -> list[str]:
    """``num_docs`` deterministic documents with :func:`synthetic_lengths` byte lengths (before BOS/EOS)."""
    rng = np.random.default_rng([seed, 2])
    docs = []
    for i, n in enumerate(synthetic_lengths(num_docs, seed=seed, max_len=max_len)):
        words = [_WORDS[j] for j in rng.permutation(len(_WORDS))[:3]]
        counter = int(rng.integers(0, 500))
        parts, size = [f"doc {i}. "], 0
        while size < n:
            t = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
            s = t.format(a=words[0], b=words[1], c=words[2], n=counter, m=counter + 1)
            counter += 1
            parts.append(s)
            size += len(s)
        docs.append("".join(parts)[: int(n)])
    return docs


def tiny_llama_config(*, hidden_size: int = 128, num_layers: int = 4, vocab_size: int = ByteTokenizer.vocab_size,
                      max_position_embeddings: int = 16384, **overrides: Any):
    """A small ``LlamaConfig`` (GQA: 4 heads, 2 K/V heads) for CPU runs."""
    from transformers import LlamaConfig

    cfg = dict(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
               max_position_embeddings=max_position_embeddings, attention_dropout=0.0, tie_word_embeddings=True)
    if vocab_size >= ByteTokenizer.vocab_size:
        cfg.update(bos_token_id=ByteTokenizer.bos_token_id, eos_token_id=ByteTokenizer.eos_token_id,
                   pad_token_id=ByteTokenizer.pad_token_id)
    cfg.update(overrides)
    return LlamaConfig(**cfg)
