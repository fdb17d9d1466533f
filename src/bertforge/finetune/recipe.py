"""The fine-tuning recipe: the optimiser and loop sections with the paper's defaults, the whole recipe
(task, model, data, seeds, task settings, adaptation first), what `bertforge finetune FAMILY` resolves,
the settings a seed's results depend on (`hyperparameters`), and the seeds' summary in results.json."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from bertforge.model.task_heads import TaskHead, check_head, check_layers, check_pooling, uses_task_head
from bertforge.recipe import resolve, setting
from bertforge.recipe import settings_of as recipe_settings
from bertforge.tasks import FAMILIES
from bertforge.tasks.base import Task
from bertforge.train.config import OptimConfig, TrainConfig

RESULTS_FILE = "results.json"


@dataclass
class FinetuneOptim(OptimConfig):
    """The optimiser section of a fine-tuning recipe: `OptimConfig` with the paper's fine-tuning
    defaults (10% warm-up; the learning rate, when left empty, is the task's for the model's width,
    `Task.learning_rate_for`)."""

    lr: float | None = setting(None, help="Peak learning rate (default: the task's: 2e-5 GLUE and SWAG, "
                                          "5e-5 NER and SQuAD, for BERT-base's width; x 768 / H, at most "
                                          "x16, for a narrower model).")
    warmup_ratio: float = setting(0.1, help="Fraction of the steps spent warming up.", aliases=("--warmup",))

    def __post_init__(self) -> None:
        OptimConfig.__post_init__(self if self.lr is not None else dataclasses.replace(self, lr=1.0))


METHODS = ("finetune", "setfit")
DEFAULT_EPOCHS = 3.0  # the paper's fine-tuning passes (Devlin et al. 2019, section A.3: 2, 3 or 4)


@dataclass
class FinetuneLoop:
    """How long and on what the fine-tuning runs; empty settings fall back on the task's defaults."""

    epochs: float | None = setting(None, help="Passes over the training set (fractions allowed). Default: 3, or on a "
                                              "small training set as many as --min-steps optimiser steps take; "
                                              "a number given is obeyed.")
    method: str = setting("finetune", help="finetune (the paper's: every weight, a new output layer) or setfit (few "
                                            "labels, classify only, single- or multi-label: pairs from the labels "
                                            "train the encoder, then a logistic head on its unit-length mean-pooled "
                                            "vectors; Tunstall et al. 2022).")
    min_steps: int = setting(300, help="With --epochs left to its default: the fewest optimiser steps a run takes "
                                       "(a small file is passed over more times); 0: 3 epochs whatever the size.")
    batch_size: int | None = setting(None, help="Training batch size (default: the task's: 32, SWAG 16).")
    max_length: int | None = setting(None, help="Pieces per input, specials included; longer inputs are cut "
                                                "into windows or truncated (default: 128, SQuAD 384).")
    eval_batch_size: int = setting(64, help="Rows per forward pass when scoring.")
    eval_every_epoch: bool = setting(True, help="Score the dev split(s) after every epoch (else at the end).")
    eval_every_steps: int = setting(0, help="Score the dev split(s) every N optimiser steps instead "
                                            "(0: per eval_every_epoch).")
    patience: int | None = setting(None, help="Stop after N evaluations in a row without improving the "
                                              "selection metric (0 or empty: never stop early).")
    selection_metric: str | None = setting(None, help="The dev metric that picks the best model (default: the "
                                                      "task's main metric, e.g. MRPC f1, STS-B pearson).")
    save_best: bool = setting(True, help="Keep the best evaluation's model in seed-N/best/ beside the final one.")
    group_by_length: bool = setting(False, help="Draw each batch from rows of similar length (less padding, "
                                                "faster: 1.3x on full STS-B, same scores over 5 seeds); off: "
                                                "plain random draws, as in BERT's own code and the Trainer.")
    max_train_examples: int | None = setting(None, help="Train on a fixed random sub-sample of this many examples.")
    max_eval_examples: int | None = setting(None, help="Score only the first N dev examples.")
    holdout: float = setting(0.0, help="Hold a fixed random part of the training set out of training and score "
                                       "it as an extra split, holdout: N examples, or a fraction below 1 (the "
                                       "same part whatever the other settings; 0: none).")
    dev_fraction: float | None = setting(None, help="Your own files without --dev: score a held-out part of the "
                                                    "training file as the dev split, this fraction of its rows "
                                                    "(each class keeps its share; a QA paragraph's questions stay "
                                                    "together), written to OUT/dev-split.jsonl. Default: 0.1 "
                                                    "when there is no dev file, none when there is.")
    dev_seed: int = setting(0, help="Seed of the --dev-fraction draw (the same rows for every other setting).")
    reinit_layers: int = setting(0, help="Start the top N encoder layers and the pooler afresh (N = all keeps "
                                         "only the embeddings; Zhang et al. 2021).")
    frozen: bool = setting(False, help="Keep the encoder as loaded (feature-based, the paper's section 5.3): only "
                                       "the head, and a learnt layer mix, train; the encoder runs without "
                                       "dropout or gradients.")
    frozen_layers: str = setting("last", help="With --frozen or --head bilstm, the hidden states the head reads: "
                                              "last, second_to_last, sum_last_four, concat_last_four (4x as "
                                              "wide), sum_all, weighted_sum_all (learnt weights) or embeddings.")
    pooling: str = setting("cls", help="How a sentence task reads one vector per input: cls (the first token's, "
                                       "the paper's C) or mean (the average of the real tokens' final vectors, as "
                                       "sentence-transformers models are trained; a bertforge head, whose encoder "
                                       "transformers loads but not the head).")
    head: str = setting("linear", help="The task's output layer on the encoder (linear: the usual one), or "
                                       "bilstm: a one-layer BiLSTM under it (the paper's Table 5 '+ BiLSTM').")
    lstm_size: int | None = setting(None, help="BiLSTM units per direction (default: half the encoder's width, "
                                               "so both directions are as wide as the encoder).")
    precision: str = setting(TrainConfig.precision, help="fp32, bf16 (CPU or GPU) or fp16 (GPU).")
    max_grad_norm: float = setting(TrainConfig.max_grad_norm, help="Gradient clipping norm (0: no clipping).")
    device: str | None = setting(None, help="torch device (default: cuda if visible, else cpu).")
    save_every_steps: int = setting(0, help="Write a resumable checkpoint every N optimiser steps (0: by time "
                                            "only, see save_every_minutes); a rerun of the same command "
                                            "continues a seed from its newest checkpoint.")
    save_every_minutes: float = setting(10.0, help="Also write one when this many minutes of training passed "
                                                   "since the last (0: off).")
    keep_last: int = setting(2, help="Resumable checkpoints kept per seed while it trains, at most (older ones are "
                                     "deleted; 0: all; transformers' save_total_limit). Each holds the weights "
                                     "and the optimizer's state, 3x the model; the best evaluation's model is "
                                     "kept in best/ whatever the limit.", aliases=("--save-total-limit",))
    keep_checkpoints: bool = setting(False, help="Keep the loop's resumable checkpoints after each seed.")

    def __post_init__(self) -> None:
        if (self.epochs is not None and self.epochs <= 0) or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError(f"epochs must be positive and batch_size at least 1, got {self.epochs}, {self.batch_size}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.min_steps < 0:
            raise ValueError(f"min_steps must be 0 or more, got {self.min_steps}")

        if self.holdout < 0 or (self.holdout >= 1 and not float(self.holdout).is_integer()):
            raise ValueError(f"holdout must be a whole number of examples or a fraction below 1, got {self.holdout}")
        if self.dev_fraction is not None and not 0 <= self.dev_fraction < 1:
            raise ValueError(f"dev_fraction must be a fraction below 1 (0: no dev split), got {self.dev_fraction}")
        if self.reinit_layers < 0:
            raise ValueError(f"reinit_layers must be 0 or more, got {self.reinit_layers}")
        if self.eval_every_steps < 0 or (self.patience is not None and self.patience < 0):
            raise ValueError(f"eval_every_steps and patience must be 0 or more, got {self.eval_every_steps}, "
                             f"{self.patience}")
        if self.save_every_steps < 0 or self.save_every_minutes < 0 or self.keep_last < 0:
            raise ValueError(f"save_every_steps, save_every_minutes and keep_last must be 0 or more, got "
                             f"{self.save_every_steps}, {self.save_every_minutes}, {self.keep_last}")
        check_head(self.head)
        check_layers(self.frozen_layers)
        check_pooling(self.pooling)
        if self.pooling != "cls" and self.head != "linear":
            raise ValueError(f"pooling {self.pooling} goes with the linear head (--head bilstm reads its own final states)")
        if self.frozen_layers != "last" and not (self.frozen or self.head != "linear"):
            raise ValueError(f"frozen_layers {self.frozen_layers} goes with --frozen or --head bilstm (the "
                             "family's own head reads the last layer)")
        if self.lstm_size is not None and (self.lstm_size < 1 or self.head != "bilstm"):
            raise ValueError(f"lstm_size {self.lstm_size}: a positive size, for --head bilstm only")
        if self.frozen and self.reinit_layers:
            raise ValueError("reinit_layers with --frozen would keep the re-initialised layers random")

    def epochs_for(self, steps_per_epoch: int) -> float:
        """The passes a run makes: `epochs` when given; else the paper's 3, raised so that a small training
        set still gets `min_steps` optimiser steps. Three passes over 800 rows are 75 steps of 32, too few
        for a 6-layer model at the default rate to learn what it can (docs/results-finetuning.md, small-file defaults);
        GLUE-sized sets (MRPC and up) take more than 300 steps in 3 epochs and are unchanged."""
        if self.epochs is not None:
            return self.epochs
        return max(DEFAULT_EPOCHS, self.min_steps / max(steps_per_epoch, 1))

    def task_head(self, job: str) -> TaskHead | None:
        """The generic head these settings ask for on a model doing `job` (None: the family's own head)."""
        if not uses_task_head(self.head, self.frozen, self.frozen_layers, self.pooling):
            return None
        return TaskHead(job, head=self.head, frozen=self.frozen, layers=self.frozen_layers, lstm_size=self.lstm_size,
                        pooling=self.pooling)


@dataclass
class FinetuneRecipe:
    """Everything a fine-tuning run depends on; OUT/run_config.yaml holds it resolved.

    `family` and `task` name the task (`bertforge.tasks`), `model` the pre-trained checkpoint and
    `data` the task's data; `task_settings` are the task's own options (SQuAD's `doc_stride`, ...).
    """

    family: str = setting("glue", help="Task family (bertforge.tasks.FAMILIES): a benchmark's (glue, ner, squad, "
                                       "swag) or one that reads your own files (classify, tag, qa, embed).")
    task: str | None = setting(None, help="The task within the family: CoLA, SST-2, MRPC, STS-B, QQP, MNLI, "
                                          "QNLI, RTE, WNLI; conll2003; squad, v1.1, v2.0; swag; the own-file "
                                          "families are one task each.")
    model: str | None = setting(None, help="The pre-trained checkpoint (Hugging Face layout), or a Hugging Face Hub "
                                           "model: org/name or org/name@revision.")
    data: str | None = setting(None, help="The task's data directory (or file, for SQuAD; the own-file "
                                          "families take --train/--dev/--test instead), or a Hugging Face Hub data set: "
                                          "org/name[@revision][:config] (nyu-mll/glue, eriktks/conll2003, "
                                          "rajpurkar/squad).")
    seeds: list[int] = setting(default_factory=lambda: [1], help="Comma-separated seeds, one run each.")
    task_settings: dict[str, Any] = setting(default_factory=dict, help="Task options (SQuAD: doc_stride, ...).",
                                            keys=lambda recipe: FAMILIES[recipe.family].setting_options)
    quoting: bool = setting(False, help="Read .tsv files with CSV-style quoting: a cell in double quotes may hold "
                                        "tabs, doubled quotes and line breaks. Off by default, as TSV defines it: "
                                        "a line is a row and a quote is a character (as BERT's GLUE readers and "
                                        "pandas with quoting=QUOTE_NONE read it). .csv files are always read by "
                                        "RFC 4180.")
    adapt_on: str | None = setting(None, help="First continue pre-training the model on unlabelled text "
                                              "(bertforge adapt) and fine-tune the adapted model: 'train' for the "
                                              "training file's own text (labels dropped), or a text file.")
    adapt_minutes: float = setting(0.0, help="With adapt_on: training minutes of the adaptation (0: adapt_epochs).")
    adapt_epochs: float | None = setting(None, help="With adapt_on: passes over the text (default 3).")
    optim: FinetuneOptim = dataclasses.field(default_factory=FinetuneOptim)
    train: FinetuneLoop = dataclasses.field(default_factory=FinetuneLoop)
    # what run_config.yaml records beside the settings: the Hub commits the model and data resolved to
    records: ClassVar[tuple[str, ...]] = ("model_source", "data_source")

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown task family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if not self.seeds:
            raise ValueError("seeds: at least one seed is needed")

    def resolved(self, task: Task, hidden_size: int | None = None) -> FinetuneRecipe:
        """The recipe with every empty default filled in from `task`'s declaration; the learning rate
        for a model of width `hidden_size` (`Task.learning_rate_for`). With `method` setfit the rate,
        batch and passes are those the encoder trains on its pairs with (the setfit package's
        defaults, `bertforge.finetune.setfit`), so that the records say what ran."""
        from bertforge.finetune.setfit import BODY_BATCH_SIZE, BODY_EPOCHS, BODY_LR

        setfit = self.train.method == "setfit"
        lr = self.optim.lr if self.optim.lr is not None else BODY_LR if setfit else task.learning_rate_for(hidden_size)
        optim = dataclasses.replace(self.optim, lr=lr)
        loop = dataclasses.replace(
            self.train, batch_size=self.train.batch_size or (BODY_BATCH_SIZE if setfit else task.default_batch_size),
            max_length=self.train.max_length or task.default_max_length,
            dev_fraction=resolve_dev_fraction(task, self.train.dev_fraction))
        if setfit:
            loop = dataclasses.replace(loop, epochs=loop.epochs or BODY_EPOCHS, min_steps=0)
        return dataclasses.replace(self, task=self.task or task.name, task_settings=dict(task.settings),
                                   optim=optim, train=loop)


def resolve_dev_fraction(task: Task, asked: float | None) -> float:
    """The share of the training file held out as the dev split: only for the own-files families, by
    default 0.1 when they have no dev file; a dev file and a fraction together are refused."""
    from bertforge.finetune.devsplit import DEFAULT_DEV_FRACTION

    if task.reads_data_dir:
        if asked:
            raise ValueError(f"dev_fraction is for your own files (classify, tag, qa); finetune {task.family} "
                             "reads its dev split from --data")
        return 0.0
    has_dev = bool(task.settings.get("dev"))
    if has_dev and asked:
        raise ValueError(f"--dev {task.settings['dev']} and --dev-fraction {asked:g} both give a dev split; "
                         "give one of them")
    if has_dev:
        return 0.0
    if asked == 0:
        raise ValueError(f"finetune {task.family} needs a dev split: give --dev FILE, or leave --dev-fraction "
                         f"out (then {DEFAULT_DEV_FRACTION:g} of the training file is held out)")
    return DEFAULT_DEV_FRACTION if asked is None else asked


def build_recipe(family: str, config: Any = None, options: Mapping[str, Any] = (),
                 assignments: Iterable[str] = ()) -> FinetuneRecipe:
    """What `bertforge finetune FAMILY` runs, resolved as every recipe is (`bertforge.recipe.resolve`):
    the family's defaults, then the `config` recipe, then `options` by name (the family's own task
    settings too: `doc_stride=64` sets `task_settings.doc_stride`), then `--set` assignments.

    A family that is one task (`Task.single_task`: swag, tag, qa) names it; a recipe for another
    family is refused.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    base = {"family": family, "task": family if FAMILIES[family].single_task else None}
    recipe = resolve(FinetuneRecipe, config, options, assignments, base=base)
    if recipe.family != family:
        where = config if config is not None else "the settings"
        raise ValueError(f"{where}: the recipe is for `finetune {recipe.family}`, not `finetune {family}`")
    return recipe


# settings that change where or how visibly a run happens, not what it computes (checkpoints resume
# bit-exactly, so their cadence is one of them)
_NOT_RESULT_SETTINGS = ("seeds", "device", "keep_checkpoints", "eval_batch_size", "save_best", "save_every_steps",
                        "save_every_minutes", "keep_last")


# the head settings at their defaults (the family's own head, fine-tuned): left out of the recorded settings,
# so run directories made before the settings existed still continue
_HEAD_DEFAULTS: dict[str, Any] = {"frozen": False, "frozen_layers": "last", "head": "linear", "lstm_size": None,
                                  "pooling": "cls"}
# likewise no adaptation first
_ADAPT_DEFAULTS: dict[str, Any] = {"adapt_on": None, "adapt_minutes": 0.0, "adapt_epochs": None}


def hyperparameters(recipe: FinetuneRecipe) -> dict[str, Any]:
    """The resolved settings a seed's results depend on, flat by name (task.json's `hyperparameters`):
    a seed is reused only when they are equal."""
    found = recipe_settings(FinetuneRecipe)
    flat = {name: _get_path(recipe, s.path) for name, s in found.items() if name not in _NOT_RESULT_SETTINGS}
    if not flat.get("holdout"):
        flat.pop("holdout", None)  # off: as run directories made before the setting existed recorded it
    if not flat.get("dev_fraction"):  # likewise a dev file rather than a held-out part of the training file
        flat.pop("dev_fraction", None)
        flat.pop("dev_seed", None)
    for name, default in {**_HEAD_DEFAULTS, **_ADAPT_DEFAULTS}.items():  # as recorded before these settings
        if flat.get(name, default) == default:
            flat.pop(name, None)
    return json.loads(json.dumps(flat))  # as it reads back from task.json


def _get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = getattr(obj, part)
    return obj


def summarize(per_seed: Sequence[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation (0 for one seed), median and values of each metric across seeds."""
    summary: dict[str, dict[str, Any]] = {}
    for key in per_seed[0] if per_seed else []:
        values = [float(m[key]) for m in per_seed if key in m and math.isfinite(float(m[key]))]
        if not values:
            continue
        summary[key] = {"mean": statistics.fmean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "median": statistics.median(values), "values": values}
    return summary
