"""The distillation recipe: settings dataclasses only, no torch, so that the command line builds its
options from them instantly (`bertforge distill task --help`).

One recipe serves three kinds of distillation (`mode`): `task` (a fine-tuned teacher teaches a student
its task, on the task's training data and optional unlabelled text), `general` (a teacher encoder
teaches a student on prepared pre-training shards) and `sentences` (a sentence encoder teaches a
student of any vocabulary its sentence vectors, on a file of unlabelled text). Settings a mode does
not read are ignored by it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bertforge.recipe import resolve, setting
from bertforge.train.config import OptimConfig, TrainConfig

# bertforge.precision's choices, named here so that the recipe (and the CLI) need not import torch
TEACHER_PRECISIONS = ("auto", "fp32", "bf16", "int8")

MODES = ("task", "general", "sentences")


@dataclass
class DistillLosses:
    """What the student is taught, each term with its weight; a weight of 0 turns a term off (and its
    extra outputs: hidden states and attention probabilities are asked for only when weighed)."""

    temperature: float = setting(2.0, help="T of the soft targets: both models' logits are divided by T before the "
                                           "softmax, and the KL term is multiplied by T^2 (Hinton et al. 2015).")
    alpha: float = setting(0.5, help="Task distillation: the weight of the hard-label loss; the soft-target loss "
                                     "gets 1 - alpha (unlabelled rows count only in the soft term).")
    hidden_weight: float = setting(0.0, help="Weight of the hidden-state MSE between mapped layers (student layer j "
                                             "to a teacher layer), through a learned projection when the widths "
                                             "differ (TinyBERT).")
    attention_weight: float = setting(0.0, help="Weight of the KL between the last layer's attention distributions "
                                                "(MiniLM); heads are averaged when the head counts differ.")
    relation_weight: float = setting(0.0, help="Weight of the KL between the last layer's self-relations, "
                                               "softmax(h h^T / sqrt(d)) over each token's output vector "
                                               "(MiniLM's value relation, on the layer outputs every family "
                                               "returns); works across widths.")
    mlm_weight: float = setting(0.0, help="General distillation: weight of the KL between the masked-LM "
                                          "distributions at the masked positions (both models need a masked-LM "
                                          "head; the student is then saved with its head).")

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be above 0, got {self.temperature}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        for name in ("hidden_weight", "attention_weight", "relation_weight", "mlm_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")


@dataclass
class DistillOptim(OptimConfig):
    """The student's optimiser: `OptimConfig` with a distillation default (a small student learns
    faster than a fine-tuned one: 1e-4, 10% warm-up)."""

    lr: float = setting(1e-4, help="Peak learning rate.")
    warmup_ratio: float = setting(0.1, help="Fraction of the steps spent warming up.", aliases=("--warmup",))


@dataclass
class DistillLoop:
    """How long and on what the student trains, and how the run checkpoints."""

    epochs: float = setting(3.0, help="Task distillation: passes over the training data (labelled and "
                                      "unlabelled rows together).")
    max_steps: int = setting(0, help="Optimiser steps (task and sentence distillation: 0 runs `epochs` or "
                                     "`budget_minutes`; general distillation needs a number).")
    budget_minutes: float = setting(0.0, help="Sentence distillation: train for this many minutes instead, the "
                                              "warm-up and the decay to zero fitted to them (0: by steps or "
                                              "epochs).")
    batch_size: int = setting(32, help="Rows per optimiser step.")
    max_length: int | None = setting(None, help="Task distillation: pieces per input (default: the teacher's "
                                                "task.json, else the task's).")
    eval_batch_size: int = setting(64, help="Rows per forward pass when scoring.")
    eval_every_steps: int = setting(0, help="Score every N steps (0: task distillation every epoch, general at the "
                                            "end).")
    eval_max_batches: int = setting(8, help="General distillation: validation batches per evaluation (0: all).")
    max_train_examples: int | None = setting(None, help="Task distillation: a fixed random sub-sample of the "
                                                        "labelled training examples.")
    max_unlabelled: int | None = setting(None, help="Task distillation: read at most this many unlabelled texts.")
    max_texts: int | None = setting(None, help="Sentence distillation: a fixed random sample of this many of the "
                                               "file's texts (the teacher encodes each once, before training).")
    heldout_texts: int = setting(500, help="Sentence distillation: texts held out of training (a fixed random "
                                           "choice) on which the student's agreement with the teacher is scored.")
    augment: int = setting(0, help="Task distillation: up to this many perturbed copies of each training input "
                                   "(words masked, n-grams sampled: Tang et al. 2019), labelled by the teacher "
                                   "only; each copy adds a row to every epoch.")
    augment_mask_prob: float = setting(0.1, help="Augmentation: the chance that a word of a copy is masked.")
    augment_ngram_prob: float = setting(0.25, help="Augmentation: the chance that a copy keeps only a random "
                                                   "1- to 5-word run of its words.")
    max_eval_examples: int | None = setting(None, help="Score only the first N dev examples.")
    seed: int = setting(1, help="Seed of the student's initialisation, the batch order and dropout.")
    precision: str = setting(TrainConfig.precision, help="fp32, bf16 (CPU or GPU) or fp16 (GPU).")
    max_grad_norm: float = setting(TrainConfig.max_grad_norm, help="Gradient clipping norm (0: no clipping).")
    device: str | None = setting(None, help="torch device (default: cuda if visible, else cpu).")
    save_every_steps: int = setting(0, help="Write a resumable checkpoint every N steps (0: by time only); "
                                            "rerunning the same command continues from the newest.")
    save_every_minutes: float = setting(10.0, help="Also write one when this many minutes of training passed "
                                                   "since the last (0: off).")
    keep_last: int = setting(2, help="Checkpoints kept while the run goes (0: all).")
    progress: bool = setting(True, help="The progress bar (metrics.jsonl is always written).")

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.max_steps < 0:
            raise ValueError(f"epochs must be positive, batch_size at least 1 and max_steps 0 or more, got "
                             f"{self.epochs}, {self.batch_size}, {self.max_steps}")
        if min(self.eval_every_steps, self.eval_max_batches, self.save_every_steps, self.keep_last,
               self.augment, self.heldout_texts) < 0 or self.save_every_minutes < 0:
            raise ValueError("eval_every_steps, eval_max_batches, save_every_steps, save_every_minutes, "
                             "keep_last, augment and heldout_texts must be 0 or more")
        if not 0 <= self.budget_minutes < float("inf"):
            raise ValueError(f"budget_minutes must be 0 or a number of minutes, got {self.budget_minutes}")
        if self.max_texts is not None and self.max_texts < 1:
            raise ValueError(f"max_texts must be 1 or more, got {self.max_texts}")
        if not (0.0 <= self.augment_mask_prob <= 1.0 and 0.0 <= self.augment_ngram_prob <= 1.0):
            raise ValueError(f"augment_mask_prob and augment_ngram_prob are probabilities, got "
                             f"{self.augment_mask_prob} and {self.augment_ngram_prob}")


def _task_setting_names(recipe: DistillRecipe) -> list[str]:
    """The task options `task_settings` takes one at a time: every task family's (the family itself is
    known only once the teacher's task.json is read)."""
    from bertforge.tasks import FAMILIES

    names: list[str] = ["train", "dev", "test"]
    for family in FAMILIES.values():
        names += [name for name in family.setting_options if name not in names]
    return names


@dataclass
class DistillRecipe:
    """Everything a distillation run depends on; OUT/run_config.yaml holds it resolved."""

    mode: str = setting("task", help="task: a fine-tuned teacher teaches its task; general: a teacher encoder "
                                     "teaches on pre-training shards; sentences: a sentence encoder teaches its "
                                     "sentence vectors on unlabelled text.")
    teacher: str | None = setting(None, help="The teacher's directory (task: a fine-tuned model with its task.json; "
                                             "general: any encoder checkpoint; sentences: any encoder, pooled as "
                                             "its sentence-transformers files say, else by the mean).")
    student: str | None = setting(None, help="The student: a preset (tiny, mini, small, ...), a config.json (both: "
                                             "random weights, the teacher's vocabulary) or a checkpoint directory "
                                             "with the teacher's vocabulary (a generally distilled student, say); "
                                             "sentences: any vocabulary (--tokenizer for a preset, a checkpoint "
                                             "brings its own).")
    student_layers_from_teacher: str | None = setting(
        None, help="Instead of --student: the teacher's own layers, every k-th (`2`: layers 1, 3, 5, ... counted "
                   "from 0, the top one included) or a comma list (`0,5,11`), with its embeddings and head copied.")
    data: str | None = setting(None, help="task: the task's data directory (own-data families read the files their "
                                          "task.json names); general: shards from `bertforge prepare`; sentences: "
                                          "a file of texts (.txt one a line, or .csv/.tsv/.jsonl/.parquet with "
                                          "--text-column; compressed too).")
    text_column: str = setting("text", help="Sentence distillation: the column of --data holding the text.")
    tokenizer: str | None = setting(None, help="Sentence distillation: the vocabulary of a --student preset or "
                                               "config.json (a directory with vocab.txt or tokenizer.json, from "
                                               "`bertforge tokenizer train`, say); default: the teacher's.")
    teacher_precision: str = setting("fp32", help="Sentence distillation: the precision the teacher encodes --data "
                                                  "in (bertforge.precision): fp32, bf16, int8, or auto (bf16 where "
                                                  "the CPU has native bf16 instructions, which make it faster; "
                                                  "docs/benchmarks-engines.md).")
    family: str | None = setting(None, help="Task family (default: the teacher's task.json).")
    task: str | None = setting(None, help="Task within the family (default: the teacher's task.json).")
    task_settings: dict[str, Any] = setting(default_factory=dict, keys=_task_setting_names,
                                            help="Task options over the teacher's (own-data files: train, dev).")
    unlabelled: str | None = setting(None, help="Task distillation: a UTF-8 file of extra inputs the teacher labels "
                                                "softly, one a line (`text ||| pair` for sentence pairs; words "
                                                "split on spaces for tagging).")
    losses: DistillLosses = dataclasses.field(default_factory=DistillLosses)
    optim: DistillOptim = dataclasses.field(default_factory=DistillOptim)
    train: DistillLoop = dataclasses.field(default_factory=DistillLoop)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.student is not None and self.student_layers_from_teacher is not None:
            raise ValueError("give either student or student_layers_from_teacher, not both")
        if self.student_layers_from_teacher is not None:
            teacher_layers(self.student_layers_from_teacher, None)  # checks the spelling
        if self.teacher_precision not in TEACHER_PRECISIONS:
            raise ValueError(f"teacher_precision {self.teacher_precision!r} is not one of "
                             f"{', '.join(TEACHER_PRECISIONS)}")


def teacher_layers(spec: str, teacher_depth: int | None) -> list[int]:
    """The teacher layers (0-based, bottom to top) a student made of the teacher's own layers keeps:
    `"k"` every k-th with the top one included (k-1, 2k-1, ...), `"a,b,c"` exactly those. Without
    `teacher_depth` only the spelling is checked."""
    text = str(spec).strip()
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"student_layers_from_teacher {spec!r}: expected a number k or a comma list of "
                         "layer numbers") from None
    if not numbers or any(n < 0 for n in numbers):
        raise ValueError(f"student_layers_from_teacher {spec!r}: expected a positive k or layer numbers from 0")
    if "," not in text:
        if numbers[0] < 1:
            raise ValueError(f"student_layers_from_teacher {spec!r}: every k-th layer needs k of 1 or more")
        if teacher_depth is None:
            return []
        layers = list(range(numbers[0] - 1, teacher_depth, numbers[0]))
        if not layers:
            raise ValueError(f"student_layers_from_teacher {spec!r}: the teacher has only {teacher_depth} layers")
        return layers
    if numbers != sorted(set(numbers)):
        raise ValueError(f"student_layers_from_teacher {spec!r}: list the layers once each, bottom to top")
    if teacher_depth is not None and numbers[-1] >= teacher_depth:
        raise ValueError(f"student_layers_from_teacher {spec!r}: the teacher has layers 0 to {teacher_depth - 1}")
    return numbers


def build_recipe(mode: str, config: Any = None, options: Mapping[str, Any] = (),
                 assignments: Iterable[str] = ()) -> DistillRecipe:
    """What `bertforge distill MODE` runs, resolved as every recipe is (`bertforge.recipe.resolve`): the
    defaults, the `config` recipe, `options` by name, then `--set` assignments. A recipe of the other
    mode is refused."""
    recipe = resolve(DistillRecipe, config, options, assignments, base={"mode": mode})
    if recipe.mode != mode:
        raise ValueError(f"{config if config is not None else 'the settings'}: the recipe is for "
                         f"`distill {recipe.mode}`, not `distill {mode}`")
    return recipe


__all__ = ["MODES", "TEACHER_PRECISIONS", "DistillLoop", "DistillLosses", "DistillOptim", "DistillRecipe", "build_recipe", "teacher_layers"]
