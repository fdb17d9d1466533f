"""The quickstart's settings: its stages, the starts of its learning curve, and the budgets (how big
each stage is)."""

from __future__ import annotations

import math
from dataclasses import dataclass

STAGES = ("tokenizer", "data", "pretrain", "pretrain_eval", "teach", "subsamples", "curve_taught", "curve_pretrained",
          "curve_random", "curve_minilm", "adapt_minilm", "curve_minilm_adapted", "report")

# The starting points of the learning curve, by stage: (label in the report, output folder).
CURVES = {
    "curve_taught": ("pre-trained and taught here", "curve-taught"),
    "curve_pretrained": ("masked LM alone", "curve-pretrained"),
    "curve_random": ("random weights", "curve-random"),
    "curve_minilm": ("all-MiniLM-L6-v2", "curve-minilm"),
    "curve_minilm_adapted": ("all-MiniLM-L6-v2 adapted here", "curve-minilm-adapted"),
}
# Adapting MiniLM to the task's text (`bertforge adapt`): its masked-LM head is new, so it trains alone
# for the first share of the steps at its own rate, then everything at MiniLM's fine-tuning rate.
ADAPT_LR = 1e-4
ADAPT_HEAD_WARMUP = 0.3
FINETUNE_BATCH_SIZE = 32
# Teaching the pre-trained model MiniLM's sentence vectors (`bertforge distill sentences`): a small
# student takes a large rate; batch 64 of short phrases (docs/research/research-log-2026-11-29.md).
TEACH_LR = 1e-3
TEACH_BATCH_SIZE = 64
TEACH_HELDOUT = 500  # of the bundled texts, never trained on: the student's agreement with MiniLM
MINILM_LR = 1e-4  # 50 steps from 100 sentences: 5e-5 left it at 0.53 (3 seeds, the majority class), 1e-4 gave 0.71
SUBSAMPLE_SEED = 0  # which sentences each size gets; the same for every model and every fine-tuning seed
# A gap between two starts counts only when every seed of one beats every seed of the other by this
# much at least on average (points); below, the report calls it no clear difference.
MIN_GAP_POINTS = 1.0

FILL_MASK_PROMPTS = (
    "she opened the [MASK] and looked out at the garden.",
    "\"i am very glad to [MASK] you,\" said he.",
    "it was the best of times, it was the worst of [MASK].",
    "the [MASK] was dark and the streets were empty.",
)


@dataclass(frozen=True)
class Budget:
    """How big each stage is. `full` is the README's quickstart; `smoke` is the same path for CI."""

    books: int | None  # bundled novels used (None: all five)
    vocab_size: int
    max_seq_length: int  # of pre-training instances and of the fine-tuning inputs
    objective: str  # the sentence-pair task of pre-training: sop (ALBERT) or nsp (BERT)
    dupe_factor: int  # pairings of the text, each with other sentence pairs (masks are drawn per epoch)
    validation_fraction: float  # of the documents (chapters), held out and masked once
    model: str  # a preset name (bertforge.model.registry.preset_names())
    pretrain_steps: int  # the steps, or with pretrain_minutes the most steps
    pretrain_minutes: float  # training minutes (warm-up and decay fitted to them); 0: by steps
    pretrain_batch_size: int
    pretrain_lr: float
    pretrain_warmup_steps: int  # by steps; a run by minutes warms up over the first 6% of them
    pretrain_dropout: float  # hidden and attention dropout while pre-training (fine-tuning keeps it)
    teach_texts: int  # bundled in-domain texts (SST-2 training phrases, labels dropped) MiniLM encodes
    teach_minutes: float  # minutes of sentence distillation into the pre-trained model; 0: by teach_steps
    teach_steps: int
    eval_every: int
    curve_sizes: tuple[int, ...]  # labelled sentences at each point of the curve (of the 4,000 bundled)
    curve_seeds: tuple[int, ...]  # fine-tuning seeds at each size: the head's initialisation, the batch order
    curve_epochs: float  # passes over the sentences at each size, within the step limits below
    curve_min_steps: int  # small sizes: at least this many updates, so the few sentences are learnt
    curve_max_steps: int  # large sizes: at most this many (fewer passes), which bounds the cost
    mlm_alone_max_size: int  # the model after masked LM alone (the contrast to teaching) runs up to this size
    minilm_max_size: int  # MiniLM runs at the curve sizes up to this (it costs ~14x tiny per step) ...
    minilm_max_steps: int  # ... with the curve's steps at a size, but at most this many
    finetune_eval_examples: int | None  # of the 872 SST-2 dev sentences
    finetune_lr: float  # the model pre-trained here and its random twin (MiniLM: MINILM_LR)
    finetune_pooling: str  # the sentence vector the new output layer reads, for every start
    adapt_steps: int  # MiniLM's adaptation to the bundled training sentences' text (labels dropped)


# The full budget's curve, and what it costs. Single fine-tunes were timed with one thread pinned to one
# core of the 2-core machine while other jobs ran (so as CPU seconds, which the load inflates less than
# wall time): the tiny model costs about 1.5 s per fine-tune (load, score the 872 dev sentences, save)
# plus 0.035 s per step of 32 x <=64 tokens; MiniLM about 9 s plus 0.48 s per step. The quickstart's
# last quiet timed run (docs/recipes.md: 10 s for a 375-step tiny fine-tune, 75 s for a 188-step
# MiniLM one, two threads) puts quiet two-thread wall time at about CPU / 1.75 for tiny and / 1.5 for
# MiniLM.
# - Steps: the tiny model's random start stays at the majority class (0.509, all three seeds) after 50
#   steps at 100 and 300 sentences, 96 at 1,000 and 125 at 4,000, and leaves it by 160-250 steps, so
#   fewer steps at the small sizes would show "pre-training helps with little data" where it only
#   helps in few steps. Every size gets 200 steps (64 passes over 100 sentences, 1.6 over 4,000): the
#   curve then varies the labelled data alone. 2 starts x 4 sizes x 3 seeds x (1.5 + 200 x 0.035) s
#   = ~205 CPU s, about 115 s quiet. 200 is short of enough for the random start at 4,000 sentences
#   (0.550-0.687 over the three seeds, against 0.708 for one seed after 250 steps and 0.737 after 375),
#   so the largest size flatters the pre-trained start a little; 300 steps would cost ~50 s more.
# - MiniLM (at lr 1e-4, 100 sentences and 50 steps: 0.727, 0.705, 0.706 for seeds 1-3; 87 s on one core)
#   runs at 100 sentences only, 50 steps: 3 x (9 + 50 x 0.48) = ~100 CPU s, about 65 s quiet. At 300
#   as well it would add another ~65 s.
# Measured on the quiet machine (docs/recipes.md): the curve took 220 s (80 + 82 + 58), pre-training
# 387 s, README command 1 10 min 20 s in all. Trimming it further means fewer steps (and, per the above,
# a random start at the majority class) or fewer sizes.
BUDGETS = {
    "full": Budget(books=None, vocab_size=8000, max_seq_length=64, objective="sop", dupe_factor=5,
                   validation_fraction=0.05, model="tiny", pretrain_steps=20000, pretrain_minutes=1.0,
                   pretrain_batch_size=32,
                   pretrain_lr=1e-3, pretrain_warmup_steps=300, pretrain_dropout=0.0, eval_every=250,
                   teach_texts=16000, teach_minutes=2.0, teach_steps=0,
                   curve_sizes=(100, 300, 1000, 4000), curve_seeds=(1, 2, 3), curve_epochs=3.0,
                   curve_min_steps=200, curve_max_steps=200, mlm_alone_max_size=300, minilm_max_size=100,
                   minilm_max_steps=50,
                   finetune_eval_examples=None, finetune_lr=3e-4, finetune_pooling="mean", adapt_steps=40),
    "smoke": Budget(books=1, vocab_size=1000, max_seq_length=64, objective="sop", dupe_factor=1,
                    validation_fraction=0.25, model="tiny", pretrain_steps=40, pretrain_minutes=0.0,
                    pretrain_batch_size=16,
                    pretrain_lr=1e-3, pretrain_warmup_steps=4, pretrain_dropout=0.0, eval_every=20,
                    teach_texts=300, teach_minutes=0.0, teach_steps=6,
                    curve_sizes=(32, 64), curve_seeds=(1, 2), curve_epochs=1.0, curve_min_steps=2,
                    curve_max_steps=2, mlm_alone_max_size=64, minilm_max_size=32, minilm_max_steps=1,
                    finetune_eval_examples=64,
                    finetune_lr=3e-4, finetune_pooling="mean", adapt_steps=2),
}


def curve_steps(size: int, budget: Budget) -> int:
    """Optimiser steps of a fine-tune on `size` sentences: `curve_epochs` passes, raised to
    `curve_min_steps` (100 sentences are 4 batches a pass; a few dozen updates leave a classifier at
    the majority class) and capped at `curve_max_steps` (the large sizes get fewer passes, which bounds
    the curve's cost). The tiny model from both starts gets the same steps at a size."""
    per_epoch = math.ceil(size / FINETUNE_BATCH_SIZE)
    return min(max(math.ceil(budget.curve_epochs * per_epoch), budget.curve_min_steps), budget.curve_max_steps)
