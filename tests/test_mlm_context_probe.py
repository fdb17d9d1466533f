"""The context variants of the MLM context probe (bertforge.pretrain): what each one keeps and what it takes away."""

from __future__ import annotations

import torch

from bertforge.config import IGNORE_INDEX
from bertforge.pretrain import context_variants

SPECIAL, MASK = [0, 1, 2, 3, 4], 4


def test_variants_keep_the_words_or_the_positions_and_nothing_else() -> None:
    ids = torch.tensor([[2, 10, 4, 12, 3, 13, 4, 15, 3, 0, 0]])  # [CLS] a [MASK] b [SEP] c [MASK] d [SEP] pad pad
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 2], labels[0, 6] = 11, 14
    batch = {"input_ids": ids, "labels": labels, "attention_mask": (ids != 0).long()}
    variants = context_variants(batch, SPECIAL, MASK, torch.Generator().manual_seed(3))

    assert torch.equal(variants["context intact"][0], ids)
    blank, blank_labels = variants["no context"]
    assert torch.equal(blank_labels, labels)
    assert blank[0].tolist() == [2, 4, 4, 4, 3, 4, 4, 4, 3, 0, 0]  # only specials and padding survive

    shuffled, shuffled_labels = variants["shuffled order"]
    assert sorted(shuffled[0].tolist()) == sorted(ids[0].tolist())  # the same pieces ...
    assert shuffled[0].tolist() != ids[0].tolist()  # ... in another order
    for position in (0, 4, 8, 9, 10):  # [CLS], [SEP] and padding stay put
        assert shuffled[0, position] == ids[0, position]
    # each label travels with its masked piece, so the same pieces are scored
    assert sorted(shuffled_labels[shuffled_labels != IGNORE_INDEX].tolist()) == [11, 14]
    moved = (shuffled_labels != IGNORE_INDEX).nonzero()[:, 1]
    assert (shuffled[0, moved] == MASK).all()
