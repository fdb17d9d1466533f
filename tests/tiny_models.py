"""A random one-layer BERT with a WordPiece vocabulary trained on a few words: the model the plumbing
tests fine-tune, predict with and upload (its scores mean nothing)."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge import BertConfig, BertModel, BertTokenizer


def save_tiny_encoder(root: Path, text: str, *, vocab_size: int = 150, hidden_size: int = 32,
                      max_positions: int = 128, num_layers: int = 1,
                      num_heads: int = 2) -> Path:
    """A bare encoder saved as a Hugging Face directory under `root`, its vocabulary trained on `text`."""
    corpus = root / "corpus.txt"
    corpus.write_text((text + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=vocab_size, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                        num_attention_heads=num_heads, intermediate_size=2 * hidden_size, max_position_embeddings=max_positions)
    directory = root / "encoder"
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory
