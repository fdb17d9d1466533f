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
    (`feed` hands the text to the backend and its trainer; it is called twice), and those options.

    The same text gives the same vocabulary in every process. `tokenizers`' trainer gives the "##"
    continuation of each character its id in hash-map order, and those ids break ties between equally
    frequent merges (huggingface/tokenizers#1794). A first pass without merges finds the alphabet (in
    the trainer's own order) and the continuation characters; the second pass starts from both, the
    continuations in their characters' order, so every tie is broken alike.
    """
    options = {"lowercase": lowercase, "strip_accents": strip_accents, "tokenize_chinese_chars": tokenize_chinese_chars}
    alphabet_probe, alphabet_trainer = wordpiece_trainer(len(TRAINED_SPECIALS) + 1, min_frequency, limit_alphabet,
                                                         False, **options)
    feed(alphabet_probe, alphabet_trainer)
    first = sorted(alphabet_probe.get_vocab().items(), key=lambda item: item[1])
    characters = [t for t, _ in first if len(t) == 1 and t not in TRAINED_SPECIALS]
    continued = {t[2:] for t, _ in first if t.startswith("##") and len(t) == 3}
    continuations = [f"##{c}" for c in characters if c in continued]
    seeded = [*TRAINED_SPECIALS, *characters, *continuations]
    probe, trainer = wordpiece_trainer(vocab_size, min_frequency, limit_alphabet, show_progress, **options)
    trainer.special_tokens = seeded  # added first, in this order: the trainer's own layout, minus the hash order
    feed(probe, trainer)
    learnt = sorted(probe.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    if [t for t, _ in learnt[:len(seeded)]] != seeded or [i for _, i in learnt] != list(range(len(learnt))):
        raise RuntimeError(f"the trainer did not keep the {len(seeded)} pieces it started from at ids 0..{len(seeded) - 1}")
    return dict(learnt), options
