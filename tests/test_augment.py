"""Augmentation for task distillation: perturbed copies of training inputs (masking, n-gram sampling)."""

from __future__ import annotations

import random

import pytest

from bertforge.distill.augment import MAX_NGRAM, augment_examples, perturb_words
from bertforge.tasks import make_task
from bertforge.tasks.classify import ClassifyExample
from bertforge.tasks.glue import GlueExample
from bertforge.tasks.ner import NerSentence

WORDS = ["the", "quiet", "film", "moves", "slowly", "toward", "a", "warm", "and", "clever", "ending"]


def test_masking_keeps_the_words_in_place_and_masks_about_the_asked_share() -> None:
    rng = random.Random(0)
    masked = total = 0
    for _ in range(400):
        copy = perturb_words(WORDS, rng, "[MASK]", mask_prob=0.3, ngram_prob=0.0)
        assert len(copy) == len(WORDS)
        assert all(c in (w, "[MASK]") for c, w in zip(copy, WORDS, strict=True))
        masked += copy.count("[MASK]")
        total += len(copy)
    assert 0.25 < masked / total < 0.35


def test_ngram_sampling_keeps_a_contiguous_run_of_one_to_five_words() -> None:
    rng = random.Random(1)
    lengths = set()
    for _ in range(300):
        copy = perturb_words(WORDS, rng, "[MASK]", mask_prob=0.0, ngram_prob=1.0)
        assert 1 <= len(copy) <= MAX_NGRAM
        start = WORDS.index(copy[0])
        assert WORDS[start:start + len(copy)] == copy
        lengths.add(len(copy))
    assert lengths == set(range(1, MAX_NGRAM + 1))


def test_sentence_pairs_are_perturbed_segment_by_segment_distinct_and_reproducible() -> None:
    spec = make_task("glue", "mrpc")
    examples = [GlueExample("1", "the cat sat on the mat today", "a cat was sitting on a mat", "1"),
                GlueExample("2", "stocks fell sharply in early trading", "shares dropped early on", "0")]
    copies = augment_examples(spec, examples, 5, mask_token="[MASK]", seed=3, mask_prob=0.2, ngram_prob=0.25)
    assert len(copies) == 10 and all(isinstance(c, GlueExample) and c.label is None for c in copies)
    assert all(c.text_b for c in copies)  # a pair stays a pair
    originals = {(e.text_a, e.text_b) for e in examples}
    pairs = [(c.text_a, c.text_b) for c in copies]
    assert len(set(pairs)) == len(pairs) and not originals & set(pairs)
    again = augment_examples(spec, examples, 5, mask_token="[MASK]", seed=3, mask_prob=0.2, ngram_prob=0.25)
    assert [(c.text_a, c.text_b) for c in again] == pairs
    other = augment_examples(spec, examples, 5, mask_token="[MASK]", seed=4, mask_prob=0.2, ngram_prob=0.25)
    assert [(c.text_a, c.text_b) for c in other] != pairs


def test_a_short_input_yields_only_the_distinct_copies_it_has() -> None:
    spec = make_task("classify", None, {"train": "t.csv", "dev": "d.csv"})
    copies = augment_examples(spec, [ClassifyExample("fine", label="positive")], 10, mask_token="[MASK]", seed=0,
                              mask_prob=0.5, ngram_prob=0.0)
    assert [c.text for c in copies] == ["[MASK]"]  # the one copy that differs from "fine"


def test_tagging_inputs_keep_one_word_per_word_and_other_tasks_are_refused() -> None:
    ner = make_task("ner", None)
    sentence = NerSentence("s", ["Maria", "flew", "to", "Rome", "."], ["B-PER", "O", "O", "B-LOC", "O"], [], [], 0)
    copies = augment_examples(ner, [sentence], 4, mask_token="[MASK]", seed=0, mask_prob=0.3, ngram_prob=0.0)
    assert copies and all(len(c.words) == 5 and not c.labels for c in copies)
    with pytest.raises(ValueError, match="sentence and token classification"):
        augment_examples(make_task("squad", None), [], 2, mask_token="[MASK]", seed=0)
