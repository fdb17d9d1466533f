"""Perturbed copies of a task's training inputs, for the teacher to label in task distillation.

A small task's training set shows the student few of the inputs on which it should copy the teacher.
Tang et al. 2019 ("Distilling Task-Specific Knowledge from BERT into Simple Neural Networks", section
3.3) multiply it with cheap rules and let the teacher label the copies softly; TinyBERT's augmentation
does the same with a word-substitution model. The rules here are theirs without the part-of-speech one
(it needs a tagger):

- masking: each word becomes the mask token with probability `mask_prob`, so the student sees what
  the teacher answers without that word;
- n-gram sampling: with probability `ngram_prob` a copy keeps only a random run of 1 to 5 of its
  (masked) words.

Sentence pairs are perturbed segment by segment; tagging inputs keep one word per word (a masked word
stays a word the teacher tags). Copies equal to their original or to an earlier copy are dropped.
Which copies are made depends only on the examples, the settings and `seed`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from bertforge.tasks.base import Task

MAX_NGRAM = 5
# Draws per wanted copy before giving up on an input too short to yield that many distinct copies.
TRIES_PER_COPY = 4


def perturb_words(words: Sequence[str], rng: random.Random, mask_token: str, mask_prob: float,
                  ngram_prob: float) -> list[str]:
    """One perturbed copy of `words`: masked word by word, then maybe cut to a random n-gram."""
    copy = [mask_token if rng.random() < mask_prob else word for word in words]
    if len(copy) > 1 and rng.random() < ngram_prob:
        length = rng.randint(1, min(MAX_NGRAM, len(copy)))
        start = rng.randrange(len(copy) - length + 1)
        copy = copy[start:start + length]
    return copy


def _perturb_fields(fields: dict[str, Any], rng: random.Random, mask_token: str, mask_prob: float,
                    ngram_prob: float) -> dict[str, Any]:
    if "words" in fields:
        return {"words": perturb_words(fields["words"], rng, mask_token, mask_prob, ngram_prob)}
    perturbed = {"text": " ".join(perturb_words(fields["text"].split(), rng, mask_token, mask_prob, ngram_prob))}
    pair = fields.get("text_pair")
    perturbed["text_pair"] = None if pair is None else " ".join(
        perturb_words(pair.split(), rng, mask_token, mask_prob, ngram_prob))
    return perturbed


def _key(fields: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(fields["words"]) if "words" in fields else (fields["text"], fields.get("text_pair"))


def augment_examples(spec: Task, examples: Sequence[Any], copies: int, *, mask_token: str, seed: int,
                     mask_prob: float = 0.1, ngram_prob: float = 0.25) -> list[Any]:
    """Up to `copies` distinct perturbed copies of each example, as unlabelled examples of `spec`.

    Only sentence and token classification tasks take them (their inputs are texts and words)."""
    if spec.inference_task not in ("text-classification", "token-classification"):
        raise ValueError(f"augmentation perturbs texts and words: it makes inputs for sentence and token "
                         f"classification, not for the {spec.family} task family")
    if copies < 0 or not 0.0 <= mask_prob <= 1.0 or not 0.0 <= ngram_prob <= 1.0:
        raise ValueError(f"augmentation needs copies >= 0 and probabilities in [0, 1], got {copies}, "
                         f"{mask_prob}, {ngram_prob}")
    rng = random.Random(seed)
    made: list[Any] = []
    for example in examples:
        fields = spec.inference_fields(example)
        seen = {_key(fields)}
        for _ in range(copies * TRIES_PER_COPY):
            if len(seen) > copies:
                break
            perturbed = _perturb_fields(fields, rng, mask_token, mask_prob, ngram_prob)
            key = _key(perturbed)
            if key in seen or not any(key):
                continue
            seen.add(key)
            made.append(spec.inference_example(len(made), perturbed))
    return made
