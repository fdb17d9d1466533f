"""Learning a WordPiece vocabulary with BERT's normalisation and word splitting (`tokenizers`' trainer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers

# The reserved ids of a vocabulary trained here (Google's vocabs use 0, 100-103).
TRAINED_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def wordpiece_trainer(vocab_size: int, min_frequency: int, limit_alphabet: int, show_progress: bool, *,
                       lowercase: bool, strip_accents: bool | None,
                       tokenize_chinese_chars: bool) -> tuple[BackendTokenizer, Any]:
    """A backend with the exact normaliser and pre-tokeniser the trained tokenizer will use, and its trainer."""
    if vocab_size <= len(TRAINED_SPECIALS):
        raise ValueError(f"vocab_size must exceed the {len(TRAINED_SPECIALS)} special tokens, got {vocab_size}")
    probe = BackendTokenizer(models.WordPiece(unk_token="[UNK]"))
    probe.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=lowercase if strip_accents is None else strip_accents, lowercase=lowercase,
    )
    probe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(TRAINED_SPECIALS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
    )
    return probe, trainer


def learn_vocab(feed: Callable[[BackendTokenizer, Any], None], *, vocab_size: int = 30522, min_frequency: int = 2,
                lowercase: bool = True, strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                limit_alphabet: int = 1000, show_progress: bool = True) -> tuple[dict[str, int], dict[str, Any]]:
    """A WordPiece vocabulary learnt with the exact normaliser and pre-tokeniser the tokenizer will use
    (`feed` hands the text to the backend and its trainer), and those normalisation options."""
    options = {"lowercase": lowercase, "strip_accents": strip_accents, "tokenize_chinese_chars": tokenize_chinese_chars}
    probe, trainer = wordpiece_trainer(vocab_size, min_frequency, limit_alphabet, show_progress, **options)
    feed(probe, trainer)
    vocab = probe.get_vocab(with_added_tokens=True)
    for index, token in enumerate(TRAINED_SPECIALS):
        if vocab.get(token) != index:  # the trainer's documented behaviour; check, don't trust
            raise RuntimeError(f"the trainer put {token} at id {vocab.get(token)}, expected {index}")
    return vocab, options
