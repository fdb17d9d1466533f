"""Distillation runs: a teacher, a student and data through THE training loop (`bertforge.train.train`).

Task distillation (`distill_task`): the teacher is a fine-tuned model directory; its task.json names
the task family, task, settings and max length, so the student reads the same training data the
teacher was fine-tuned on (through the task's own reader and features), plus unlabelled inputs and
perturbed copies of the training inputs (`bertforge.distill.augment`) that the teacher labels
softly. Every epoch (or `eval_every_steps`) the student is scored on dev by the task's metric, with
its agreement with the teacher's predictions; the best evaluation's student is written to
OUT/student/, an ordinary fine-tuned model directory (config.json with the labels, model.safetensors,
the tokenizer's files, task.json, dev predictions) that predict, serve and export-onnx take as they
take `finetune`'s seed directories.

General distillation (`distill_general`): the teacher is any encoder checkpoint; the student learns
its hidden states, attention and relations (and its masked-LM distributions, with `mlm_weight`) on
the shards `bertforge prepare` wrote, and OUT/final/ is a pre-trained student in Hugging Face layout
for any later fine-tuning (or for task distillation as `--student`).

Files, per run directory OUT:

    run_config.yaml     the resolved recipe: `bertforge distill MODE --config OUT/run_config.yaml` repeats it
    fingerprint.json    the settings and inputs the run was started with; a rerun with others is refused
    run/                the loop's metrics.jsonl and resumable checkpoints (student + projection)
    student/            task: the best evaluation's student;   final/  the last step's student
                        (each with a model card, README.md: the teacher, the start, the scores)
    start_metrics.json  the student's dev (task) or validation (general) figures before training
    results.json        the teacher's, the start's, the best and the final figures, and the model sizes

A rerun of the same command continues OUT from its newest checkpoint bit-exactly (the teacher is
frozen and deterministic, the student's state, optimiser, schedule, RNG and data position are in the
checkpoint); `overwrite` starts again. All inputs are checked before anything is written: a missing
teacher, a teacher without task.json or without a trained head (task mode), a student or data with
another vocabulary than the teacher's are one-line errors naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.distill.augment import augment_examples
from bertforge.distill.cards import write_student_cards
from bertforge.distill.layers import copy_teacher_weights, layer_student, save_layer_student  # re-exported
from bertforge.distill.recipe import DistillRecipe, teacher_layers
from bertforge.fileio import run_lock, write_text_atomic
from bertforge.finetune import examples_digest, main_metric_key
from bertforge.finetuned import TASK_FILE, TaskRecord, check_max_length, check_tokenizer_fits
from bertforge.hub import local_or_hub
from bertforge.recipe import RUN_CONFIG_FILE, to_mapping
from bertforge.recipe import save as save_recipe
from bertforge.tasks import make_task
from bertforge.tasks.base import Feature, Task, TaskBatches, run_model, subsample, task_title
from bertforge.train.config import TrainConfig
from bertforge.train.rundir import (
    RECORD_FILE,
    RunInput,
    check_run_record,
    clear_run,
    digest_input,
    directory_input,
    file_input,
    flat_settings,
    read_run_record,
    write_run_record,
)

STUDENT_DIR = "student"
FINAL_DIR = "final"
RESULTS_FILE = "results.json"
START_FILE = "start_metrics.json"
RUN_SUBDIR = "run"
TEACHER_VECTORS = "teacher_vectors.npy"  # sentence distillation: the teacher's vectors of the texts, encoded once
# what --overwrite clears before starting again
RUN_STATE = (RUN_SUBDIR, STUDENT_DIR, f".{STUDENT_DIR}.*", FINAL_DIR, RESULTS_FILE, START_FILE, RUN_CONFIG_FILE,
             RECORD_FILE, TEACHER_VECTORS)
# settings that change where or how visibly a run happens, not what it computes
_NOT_RESULT_SETTINGS = ("device", "progress", "eval_batch_size", "save_every_steps", "save_every_minutes",
                        "keep_last")
# the files a checkpoint's tokenizer may be, in the order one is named in messages
_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json", "sentencepiece.bpe.model", "spiece.model",
                    "spm.model")


def say(message: str, verbose: bool) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# the models
# ------------------------------------------------------------------------------------------------
def tokenizer_file(directory: Path) -> Path:
    """The file a checkpoint's vocabulary lives in (for messages); the directory when none is found."""
    for name in _TOKENIZER_FILES:
        if (directory / name).is_file():
            return directory / name
    return directory


def check_model_dir(directory: Path, role: str) -> None:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such {role} directory")
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory / 'config.json'}: missing; the {role} must be a model directory "
                                "(config.json, model.safetensors, tokenizer files)")


def _same_vocabulary(teacher_tokenizer: Any, teacher_dir: Path, other_dir: Path, role: str) -> None:
    """Refuse a student (or data) whose token ids mean other pieces than the teacher's."""
    from bertforge.tokenizer import BertTokenizer

    other = BertTokenizer.from_pretrained(other_dir)
    if other.vocab != teacher_tokenizer.vocab:
        raise ValueError(f"{tokenizer_file(other_dir)}: the {role}'s vocabulary differs from the teacher's "
                         f"({tokenizer_file(teacher_dir)}: {other.vocab_size} vs {teacher_tokenizer.vocab_size} "
                         "pieces): teacher and student must read the same token ids")


def _label_extras(config: Any) -> dict[str, Any]:
    """The config.json entries that carry a task head's labels and loss (copied to the student)."""
    return {key: config.extra[key] for key in ("id2label", "label2id", "problem_type", "num_labels")
            if key in config.extra}


def student_path(student: str) -> Path:
    """--student as a path: a preset name or a config.json stays as given, a Hub model name (not an
    existing directory) becomes its cached snapshot."""
    from bertforge.model.registry import presets

    if student in presets() or student.endswith(".json") or Path(student).expanduser().is_dir():
        return Path(student)
    return local_or_hub(student)


def build_student(recipe: DistillRecipe, teacher: Any, teacher_dir: Path, teacher_tokenizer: Any,
                  job: str) -> tuple[Any, list[int], str, Path | None]:
    """The student for `job`, and for each of its hidden states the teacher's it learns (hidden-state
    loss); also how it was made (for results.json) and its checkpoint directory (None when built here).

    - `student_layers_from_teacher`: the teacher's config with fewer layers, its embeddings, the chosen
      layers and whatever else the two share by name (pooler, head) copied from the teacher;
    - a checkpoint directory: its weights (and a new head for the job), if its vocabulary is the teacher's;
    - a preset or a config.json: random weights at the teacher's vocabulary size and padding id.
    """
    from bertforge.distill.losses import uniform_layer_map
    from bertforge.model.auto import load_for_job
    from bertforge.model.registry import model_class, resolve_config

    depth = teacher.config.num_hidden_layers
    if recipe.student_layers_from_teacher is not None:
        if teacher.config.hidden_groups != depth:
            raise ValueError(f"{teacher_dir / 'config.json'}: the teacher shares its layers "
                             f"({teacher.config.hidden_groups} distinct for {depth}); taking every k-th of them "
                             "means nothing: give a --student preset instead")
        layers = teacher_layers(recipe.student_layers_from_teacher, depth)
        return layer_student(teacher, layers, job), [0, *(i + 1 for i in layers)], f"teacher layers {layers}", None
    if recipe.student is None:
        raise ValueError("no student: give --student (a preset, a config.json or a checkpoint directory) or "
                         "--student-layers-from-teacher")
    spec = student_path(recipe.student)
    if spec.is_dir():
        check_model_dir(spec, "student")
        _same_vocabulary(teacher_tokenizer, teacher_dir, spec, "student")
        student = load_for_job(spec, job, **_label_extras(teacher.config))
        description = str(spec)
    else:
        config = resolve_config(recipe.student)  # a preset or a config.json; a bad name fails in one line
        config = config.with_overrides(vocab_size=teacher.config.vocab_size, pad_token_id=teacher.config.pad_token_id)
        config.extra = {**config.extra, **_label_extras(teacher.config)}
        student = model_class(config.model_type, job)(config)
        description = recipe.student
    if student.config.vocab_size != teacher.config.vocab_size:
        raise ValueError(f"{spec / 'config.json'}: vocab_size {student.config.vocab_size} is not the teacher's "
                         f"{teacher.config.vocab_size}")
    return student, uniform_layer_map(student.config.num_hidden_layers, depth), description, \
        spec if spec.is_dir() else None


def _load_task_teacher(recipe: DistillRecipe) -> tuple[Task, Any, Any, TaskRecord]:
    """The teacher's task (from its task.json, the recipe's family/task/settings over it), its model with
    the trained head, its tokenizer and its record. Refuses a teacher whose head would be new."""
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    if recipe.teacher is None:
        raise ValueError("no teacher: give --teacher (a fine-tuned model directory)")
    teacher_dir = local_or_hub(recipe.teacher)  # a Hub name: its cached snapshot
    check_model_dir(teacher_dir, "teacher")
    record = TaskRecord.read(teacher_dir)
    family = recipe.family or (record.family if record else None)
    if family is None:
        raise ValueError(f"{teacher_dir / TASK_FILE}: {'missing' if record is None else 'names no task family'}; "
                         "task distillation needs a fine-tuned teacher (`bertforge finetune` writes task.json), or "
                         "--family and --task")
    record = record or TaskRecord()
    settings = {**(record.settings if record.family == family else {}), **recipe.task_settings}
    spec = make_task(family, recipe.task or (record.task if record.family == family else None), settings)
    teacher = load_for_job(teacher_dir, spec.job)
    report = teacher.load_report
    if report is not None and report.new_heads:
        raise ValueError(f"{teacher_dir / 'model.safetensors'}: no trained {spec.job} output layer "
                         f"({', '.join(report.new_heads)} would be random); a task teacher must be fine-tuned first")
    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    check_tokenizer_fits(tokenizer, teacher_dir, teacher.config)
    return spec, teacher.eval(), tokenizer, record


# ------------------------------------------------------------------------------------------------
# task data
# ------------------------------------------------------------------------------------------------
def read_unlabelled(path: Path, spec: Task, limit: int | None = None) -> list[Any]:
    """The task's examples for a file of inputs without labels, one per non-blank line: a text (`a ||| b`
    a pair) for a sentence task, words split on spaces for a tagging task."""
    from bertforge.tasks.base import read_text_lines

    if spec.inference_task not in ("text-classification", "token-classification"):
        raise ValueError(f"{path}: unlabelled inputs are read for sentence and token classification, not for "
                         f"{task_title(spec.family, spec.name)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file of unlabelled inputs")
    examples = []
    for _, line in read_text_lines(path):
        if not line.strip():
            continue
        if spec.inference_task == "token-classification":
            fields: dict[str, Any] = {"words": line.split()}
        else:
            first, sep, second = line.partition(" ||| ")
            fields = {"text": first.strip(), "text_pair": second.strip() if sep else None}
        examples.append(spec.inference_example(len(examples), fields))
        if limit and len(examples) >= limit:
            break
    if not examples:
        raise ValueError(f"{path}: no unlabelled inputs (only blank lines)")
    return examples


def _with_placeholders(unlabelled: list[Feature], labelled: Sequence[Feature]) -> list[Feature]:
    """Unlabelled features with the label keys of the labelled ones, filled with "no label": -100 for
    class ids, tags and span positions, NaN for regression values and multi-label rows (the hard loss
    skips both), so that both kinds share batches."""
    template = labelled[0].inputs
    out = []
    for feature in unlabelled:
        inputs = dict(feature.inputs)
        for key in ("labels", "start_positions", "end_positions"):
            if key not in template or key in inputs:
                continue
            value = template[key]
            if isinstance(value, list) and value and isinstance(value[0], float):
                inputs[key] = [math.nan] * len(value)  # multi-label row
            elif isinstance(value, list):
                inputs[key] = [-100] * len(inputs["input_ids"])  # per-token tags
            elif isinstance(value, float):
                inputs[key] = math.nan
            else:
                inputs[key] = -100
        out.append(Feature(inputs, feature.example, feature.meta))
    return out


class _Scorer:
    """The loop's `evaluate`: the student's dev predictions scored by the task's metric, and how often its
    predicted class (per row, per token, per span end) is the teacher's (`agreement`)."""

    def __init__(self, spec: Task, splits: dict[str, tuple[list[Any], list[Feature]]], label_names: list[str] | None,
                 batch_size: int, pad_id: int, multi_label: bool) -> None:
        self.spec, self.splits, self.label_names = spec, splits, label_names
        self.batch_size, self.pad_id, self.multi_label = batch_size, pad_id, multi_label
        self.outputs: dict[str, list[dict[str, np.ndarray]]] = {}
        self.teacher_outputs: dict[str, list[dict[str, np.ndarray]]] = {}

    def _run(self, model: Any) -> dict[str, list[dict[str, np.ndarray]]]:
        return {split: run_model(model, features, self.spec.output_names, token_outputs=self.spec.token_outputs,
                                 batch_size=self.batch_size, pad_id=self.pad_id)
                for split, (_, features) in self.splits.items()}

    def score_teacher(self, teacher: Any) -> dict[str, float]:
        self.teacher_outputs = self._run(teacher)
        return self._metrics(self.teacher_outputs, agreement=False)

    def __call__(self, model: Any) -> dict[str, float]:
        self.outputs = self._run(getattr(model, "student", model))
        return self._metrics(self.outputs, agreement=True)

    def predictions(self, split: str, outputs: dict[str, list[dict[str, np.ndarray]]] | None = None) -> list[Any]:
        examples, features = self.splits[split]
        return self.spec.postprocess(examples, features, (outputs or self.outputs)[split], label_names=self.label_names)

    def _metrics(self, outputs: dict[str, list[dict[str, np.ndarray]]], agreement: bool) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for split, (examples, _) in self.splits.items():
            prefix = f"{split}_" if len(self.splits) > 1 else ""
            if self.spec.has_labels(examples):
                scores = self.spec.metric(examples, self.predictions(split, outputs))
                metrics.update({prefix + k: float(v) for k, v in scores.items()})
            if agreement:
                agreed = self._agreement(outputs[split], self.teacher_outputs[split])
                if agreed is not None:
                    metrics[prefix + "agreement"] = agreed
        return metrics

    def _agreement(self, student: list[dict[str, np.ndarray]], teacher: list[dict[str, np.ndarray]]) -> float | None:
        same = total = 0
        for mine, theirs in zip(student, teacher, strict=True):
            for name in self.spec.output_names:
                a, b = mine[name], theirs[name]
                if a.shape[-1] == 1 and a.ndim == 1 and name not in self.spec.token_outputs:
                    return None  # a regression value has no class to agree on
                if self.multi_label:
                    hits = (a > 0) == (b > 0)
                elif a.ndim == 2 or name not in self.spec.token_outputs:
                    hits = a.argmax(-1) == b.argmax(-1)  # per token (T, K), or per row (K,)
                else:
                    hits = np.asarray(a.argmax() == b.argmax())  # a span end over the T positions
                same += int(np.sum(hits))
                total += int(np.size(hits))
        return same / total if total else None


class _BestStudent:
    """`on_improvement`: writes the student of the best evaluation to OUT/student/ as a fine-tuned model
    directory, under a temporary name swapped in by renames (the directory always holds one whole model)."""

    def __init__(self, directory: Path, spec: Task, scorer: _Scorer, tokenizer: Any, record: TaskRecord,
                 steps_per_epoch: int) -> None:
        self.directory, self.spec, self.scorer, self.tokenizer = directory, spec, scorer, tokenizer
        self.record, self.steps_per_epoch = record, steps_per_epoch
        self._staging = directory.with_name(f".{directory.name}.tmp")
        self._previous = directory.with_name(f".{directory.name}.old")
        if not directory.exists() and self._previous.exists():  # a crash between the two renames
            self._previous.rename(directory)

    def clear(self) -> None:
        for path in (self.directory, self._staging, self._previous):
            shutil.rmtree(path, ignore_errors=True)

    def save(self, model: Any, step: int, metrics: dict[str, float], metric: str) -> None:
        staging = self._staging
        shutil.rmtree(staging, ignore_errors=True)
        write_student(model.student, staging, self.spec, self.scorer, self.tokenizer,
                      dataclasses.replace(self.record, metrics=dict(metrics), step=step,
                                          epoch=round(step / self.steps_per_epoch, 3), selection_metric=metric,
                                          score=float(metrics[metric])))
        shutil.rmtree(self._previous, ignore_errors=True)
        if self.directory.exists():
            self.directory.rename(self._previous)
        staging.rename(self.directory)
        shutil.rmtree(self._previous, ignore_errors=True)


def write_student(student: Any, directory: Path, spec: Task, scorer: _Scorer, tokenizer: Any,
                  record: TaskRecord) -> None:
    """The student as a fine-tuned model directory: weights, config (labels), tokenizer files, the dev
    predictions of its last evaluation and task.json (settings tuned on them included)."""
    first = next((s for s, (e, _) in scorer.splits.items() if spec.has_labels(e) and s in scorer.outputs), None)
    tuned = spec.tune(scorer.splits[first][0], scorer.predictions(first)) if first else {}
    student.save_pretrained(directory, tokenizer=tokenizer)
    for split, (examples, _) in scorer.splits.items():
        if split in scorer.outputs:
            spec.write_predictions(examples, scorer.predictions(split), directory, split)
    dataclasses.replace(record, settings={**spec.settings, **tuned}).write(directory)


# ------------------------------------------------------------------------------------------------
# task distillation
# ------------------------------------------------------------------------------------------------
def distill_task(recipe: DistillRecipe, out_dir: str | Path, *, verbose: bool = True,
                 overwrite: bool = False) -> dict[str, Any]:
    """Distil a fine-tuned teacher's task into a student (see the module docstring); returns results.json's
    content. Every input is checked before OUT is touched."""
    import torch

    from bertforge.distill.losses import Distiller
    from bertforge.model.base import label_names as config_label_names
    from bertforge.model.base import problem_type_of
    from bertforge.train import ModelSelection, train
    from bertforge.train.state import latest_checkpoint, seed_everything

    started = time.perf_counter()
    out_dir = Path(out_dir)
    loop, losses = recipe.train, recipe.losses
    spec, teacher, tokenizer, record = _load_task_teacher(recipe)
    teacher_dir = local_or_hub(str(recipe.teacher))  # a Hub name: its cached snapshot
    if spec.reads_data_dir and recipe.data is None:
        raise ValueError(f"{task_title(spec.family, spec.name)} reads a data directory: give --data")
    data_dir = None if recipe.data is None else Path(recipe.data)
    max_length = loop.max_length or record.max_length or spec.default_max_length
    check_max_length(teacher_dir, max_length)

    train_examples = subsample(spec.read(data_dir, spec.train_split), loop.max_train_examples)
    spec.label_names(train_examples)  # resolves what the reader leaves open (classify's problem type)
    label_list = config_label_names(teacher.config) or None
    train_features = spec.featurize(train_examples, tokenizer, max_length, label_names=label_list)
    if not train_features:
        raise ValueError(f"{data_dir}: no training examples for {task_title(spec.family, spec.name)}")
    unlabelled_examples: list[Any] = []
    if recipe.unlabelled:
        unlabelled_examples = read_unlabelled(Path(recipe.unlabelled), spec, loop.max_unlabelled)
        extra = spec.featurize(unlabelled_examples, tokenizer, max_length, label_names=None)
        train_features = train_features + _with_placeholders(extra, train_features)
    augmented: list[Any] = []  # perturbed copies of the training inputs, labelled by the teacher only
    if loop.augment:
        augmented = augment_examples(spec, train_examples, loop.augment, mask_token=tokenizer.mask_token,
                                     seed=loop.seed, mask_prob=loop.augment_mask_prob,
                                     ngram_prob=loop.augment_ngram_prob)
        extra = spec.featurize(augmented, tokenizer, max_length, label_names=None)
        train_features = train_features + _with_placeholders(extra, train_features)
    eval_sets = {}
    for split in spec.eval_splits():
        examples = spec.read(data_dir, split)
        examples = examples[:loop.max_eval_examples] if loop.max_eval_examples else examples
        eval_sets[split] = (examples, spec.featurize(examples, tokenizer, max_length, label_names=label_list))

    seed_everything(loop.seed)  # the student's (and the projection's) initial weights follow the seed
    student, layer_map, student_from, student_dir = build_student(recipe, teacher, teacher_dir, tokenizer, spec.job)
    if student.config.max_tokens < max_length:
        raise ValueError(f"max_length {max_length} exceeds the student's {student.config.max_tokens} positions")
    _check_attention_maps(recipe, teacher, student, teacher_dir)
    spec.configure_model(student, train_examples, label_list)
    problem = problem_type_of(student.config)
    model = Distiller(student, teacher, losses, job=spec.job, problem_type=problem, layer_map=layer_map)

    settings = run_settings(recipe, spec)
    inputs = [directory_input("teacher", teacher_dir)]
    if student_dir is not None:
        inputs.append(directory_input("student", student_dir))
    if not spec.reads_data_dir:
        inputs += [file_input(f"{split} file", path) for split in ("train", "dev", "test")
                   if (path := spec.named_file(split)) is not None and path.is_file()]
    elif data_dir is not None:
        inputs.append(digest_input("data", data_dir, examples_digest([train_examples,
                                                                      *(e for e, _ in eval_sets.values())])))
    if recipe.unlabelled:
        inputs.append(file_input("unlabelled", recipe.unlabelled))

    with run_lock(out_dir, what="distillation run"):
        open_run(out_dir, recipe, settings, inputs, overwrite, mode="task")
        batches = TaskBatches(train_features, loop.batch_size, seed=loop.seed, pad_id=tokenizer.pad_token_id)
        steps_per_epoch = len(batches)
        max_steps = loop.max_steps or max(1, math.ceil(steps_per_epoch * loop.epochs))
        eval_every = loop.eval_every_steps or steps_per_epoch
        scorer = _Scorer(spec, eval_sets, label_list, loop.eval_batch_size, tokenizer.pad_token_id,
                         multi_label=problem == "multi_label_classification")
        teacher_metrics = scorer.score_teacher(teacher)
        selection_metric = main_metric_key(spec)
        base_record = TaskRecord(spec.family, spec.name, seed=loop.seed, max_length=max_length, labels=label_list,
                                 settings=dict(spec.settings), hyperparameters=settings, source_model=str(teacher_dir),
                                 extra={"distilled_from": str(teacher_dir), "student_from": student_from})
        best = _BestStudent(out_dir / STUDENT_DIR, spec, scorer, tokenizer, base_record, steps_per_epoch)
        run_dir = out_dir / RUN_SUBDIR
        fresh = latest_checkpoint(run_dir) is None
        if fresh:
            best.clear()  # a student/ left by an unfinished earlier run is not this run's
        start = start_metrics(out_dir, fresh, lambda: scorer(model))
        selection = ModelSelection(selection_metric,
                                   on_improvement=lambda m, step, metrics: best.save(m, step, metrics, selection_metric))
        config = TrainConfig(max_steps=max_steps, seed=loop.seed, precision=loop.precision, device=loop.device,
                             max_grad_norm=loop.max_grad_norm, eval_every=eval_every, save_every=loop.save_every_steps,
                             save_every_minutes=loop.save_every_minutes, keep_last=loop.keep_last,
                             log_every=max(1, min(50, steps_per_epoch // 5)), progress=loop.progress)
        added = f" + {len(augmented)} augmented" if augmented else ""
        say(f"distilling {task_title(spec.family, spec.name)}: {len(train_examples)} labelled + "
             f"{len(unlabelled_examples)} unlabelled{added} examples -> {len(train_features)} features; teacher "
            f"{parameter_count(teacher)} parameters, student {parameter_count(student)} ({student_from}); "
            f"{max_steps} steps -> {out_dir}", verbose)
        result = train(model, batches, run_dir, config, recipe.optim, evaluate=scorer, resume=True,
                       selection=selection)
        final_metrics = result.metrics or scorer(model)
        with torch.no_grad():
            write_student(student, out_dir / FINAL_DIR, spec, scorer, tokenizer,
                          dataclasses.replace(base_record, metrics=final_metrics, steps=result.step,
                                              epoch=round(result.step / steps_per_epoch, 3)))
        results = {
            "mode": "task", "family": spec.family, "task": spec.name, "teacher": str(teacher_dir),
            "student": student_from,
            "parameters": {"teacher": parameter_count(teacher), "student": parameter_count(student)},
            "train_examples": len(train_examples), "unlabelled_examples": len(unlabelled_examples),
            "augmented_examples": len(augmented),
            "steps": result.step, "selection_metric": selection_metric, "teacher_metrics": teacher_metrics,
            "start_metrics": start, "final_metrics": final_metrics,
            "best": {"dir": STUDENT_DIR, "step": selection.best_step, "score": selection.best_score},
            "wall_s": round(time.perf_counter() - started, 1),
        }
        write_json(out_dir / RESULTS_FILE, results)
        write_student_cards([out_dir / STUDENT_DIR, out_dir / FINAL_DIR], recipe, results)
        return results


def _check_attention_maps(recipe: DistillRecipe, teacher: Any, student: Any, teacher_dir: Path) -> None:
    if recipe.losses.attention_weight <= 0:
        return
    for role, model in (("teacher", teacher), ("student", student)):
        if not getattr(model, "supports_attention_maps", False):
            where = teacher_dir / "config.json" if role == "teacher" else f"the student ({recipe.student})"
            raise ValueError(f"{where}: the {model.config.model_type!r} family returns no attention probabilities; "
                             "set attention_weight 0 (relation_weight works for every family)")


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def run_settings(recipe: DistillRecipe, spec: Task | None) -> dict[str, Any]:
    """The resolved settings the run's results depend on, flat: a rerun with others is refused."""
    values = to_mapping(recipe)
    if spec is not None:
        values.update(family=spec.family, task=spec.name, task_settings=dict(spec.settings))
    flat = flat_settings(values)
    return {name: value for name, value in flat.items() if name.rpartition(".")[2] not in _NOT_RESULT_SETTINGS}


def open_run(out_dir: Path, recipe: DistillRecipe, settings: dict[str, Any], inputs: list[RunInput],
              overwrite: bool, mode: str) -> None:
    """Holding the lock: clear (`overwrite`) or check what OUT holds, record a fresh start, save the recipe."""
    if overwrite:
        clear_run(out_dir, RUN_STATE)
    else:
        check_run_record(out_dir, settings, inputs, what="distillation run")
    if read_run_record(out_dir) is None:
        write_run_record(out_dir, settings, inputs)
    save_recipe(recipe, out_dir / RUN_CONFIG_FILE,
                header=f"bertforge distill {mode} --config {out_dir / RUN_CONFIG_FILE} --out DIR repeats this run")


def start_metrics(out_dir: Path, fresh: bool, measure: Any) -> dict[str, float]:
    """The student's figures before training: measured on a fresh start, read back on a resume."""
    path = out_dir / START_FILE
    if not fresh and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    import torch

    from bertforge.train.loop import preserved_rng

    with preserved_rng(), torch.no_grad():
        metrics = {k: float(v) for k, v in measure().items()}
    write_json(path, metrics)
    return metrics


def write_json(path: Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------
# general distillation
# ------------------------------------------------------------------------------------------------
def distill_general(recipe: DistillRecipe, out_dir: str | Path, *, verbose: bool = True,
                    overwrite: bool = False) -> dict[str, Any]:
    """Distil a teacher encoder into a student on prepared shards (see the module docstring); OUT/final/
    is the student. Returns results.json's content."""
    import torch

    from bertforge.data.loader import PretrainingLoader
    from bertforge.distill.losses import Distiller
    from bertforge.model.auto import load_any, load_for_job
    from bertforge.pretrain import ShardBatches, read_dataset_info
    from bertforge.tokenizer import BertTokenizer
    from bertforge.train import train
    from bertforge.train.state import latest_checkpoint, seed_everything

    started = time.perf_counter()
    out_dir = Path(out_dir)
    loop, losses = recipe.train, recipe.losses
    if recipe.teacher is None or recipe.data is None:
        raise ValueError("general distillation needs --teacher (a checkpoint) and --data (shards from "
                         "`bertforge prepare`)")
    if loop.max_steps < 1:
        raise ValueError("general distillation runs a number of steps: give --max-steps")
    if losses.hidden_weight + losses.attention_weight + losses.relation_weight + losses.mlm_weight <= 0:
        raise ValueError("general distillation needs a loss: give attention_weight, relation_weight, hidden_weight "
                         "or mlm_weight above 0")
    teacher_dir, data_dir = local_or_hub(recipe.teacher), Path(recipe.data)  # a Hub teacher: its snapshot
    check_model_dir(teacher_dir, "teacher")
    info = read_dataset_info(data_dir)
    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    data_vocab = info.get("tokenizer", {})
    if data_vocab.get("vocab_size") not in (None, tokenizer.vocab_size) or (
            data_vocab.get("vocab_sha1") and data_vocab["vocab_sha1"] != vocab_digest(tokenizer)):
        raise ValueError(f"{tokenizer_file(teacher_dir)}: not the vocabulary the shards in {data_dir} were made with "
                         "(token ids would mean other pieces); prepare the data with the teacher's tokenizer")
    if losses.mlm_weight > 0:  # the teacher's masked-LM head must be a trained one, not a new random layer
        teacher = load_for_job(teacher_dir, "masked-lm")
        if teacher.load_report is not None and teacher.load_report.new_heads:
            raise ValueError(f"{teacher_dir / 'model.safetensors'}: no trained masked-LM head "
                             f"({', '.join(teacher.load_report.new_heads)} would be random); set mlm_weight 0")
    else:
        teacher, _ = load_any(teacher_dir)
    teacher.eval()
    check_tokenizer_fits(tokenizer, teacher_dir, teacher.config)
    job = "masked-lm" if losses.mlm_weight > 0 else "embeddings"
    seed_everything(loop.seed)
    student, layer_map, student_from, student_dir = build_student(recipe, teacher, teacher_dir, tokenizer, job)
    max_length = int(info["options"]["max_seq_length"])
    if student.config.max_tokens < max_length:
        raise ValueError(f"the shards hold {max_length} tokens per sequence but the student has "
                         f"{student.config.max_tokens} positions")
    _check_attention_maps(recipe, teacher, student, teacher_dir)
    model = Distiller(student, teacher, losses, job=None, layer_map=layer_map)

    settings = run_settings(recipe, None)
    inputs = [directory_input("teacher", teacher_dir), directory_input("data", data_dir, ("dataset.json",))]
    if student_dir is not None:
        inputs.append(directory_input("student", student_dir))

    with run_lock(out_dir, what="distillation run"):
        open_run(out_dir, recipe, settings, inputs, overwrite, mode="general")
        batches = ShardBatches(PretrainingLoader(data_dir, loop.batch_size, split="train", seed=loop.seed,
                                                 drop_last=True, even=True))
        valid = PretrainingLoader(data_dir, loop.eval_batch_size, split="valid", shuffle=False)
        evaluate = _validation(valid, loop.eval_max_batches) if len(valid.dataset) else None
        run_dir = out_dir / RUN_SUBDIR
        fresh = latest_checkpoint(run_dir) is None
        start = start_metrics(out_dir, fresh, lambda: evaluate(model)) if evaluate is not None else {}
        config = TrainConfig(max_steps=loop.max_steps, seed=loop.seed, precision=loop.precision, device=loop.device,
                             max_grad_norm=loop.max_grad_norm, eval_every=loop.eval_every_steps,
                             save_every=loop.save_every_steps, save_every_minutes=loop.save_every_minutes,
                             keep_last=loop.keep_last, log_every=max(1, min(50, loop.max_steps // 10)),
                             progress=loop.progress)
        say(f"general distillation on {data_dir}: teacher {parameter_count(teacher)} parameters, student {parameter_count(student)} "
             f"({student_from}); {loop.max_steps} steps -> {out_dir}", verbose)
        result = train(model, batches, run_dir, config, recipe.optim, evaluate=evaluate, resume=True)
        with torch.no_grad():
            student.save_pretrained(out_dir / FINAL_DIR, tokenizer=tokenizer)
        results = {
            "mode": "general", "teacher": str(teacher_dir), "data": str(data_dir), "student": student_from,
            "student_job": job,
            "parameters": {"teacher": parameter_count(teacher), "student": parameter_count(student)},
            "steps": result.step, "start_metrics": start, "final_metrics": result.metrics,
            "final": FINAL_DIR, "wall_s": round(time.perf_counter() - started, 1),
        }
        write_json(out_dir / RESULTS_FILE, results)
        write_student_cards([out_dir / STUDENT_DIR, out_dir / FINAL_DIR], recipe, results)
        return results


def vocab_digest(tokenizer: Any) -> str:
    """SHA-1 of the tokens in id order joined by newlines: what `prepare` records of the data's vocabulary."""
    import hashlib

    vocab = tokenizer.vocab
    return hashlib.sha1("\n".join(sorted(vocab, key=vocab.__getitem__)).encode("utf-8")).hexdigest()


def _validation(loader: Any, max_batches: int) -> Any:
    """Mean of each distillation term over the fixed validation batches (the same ones every time)."""
    import torch

    from bertforge.train.loop import to_device

    def evaluate(model: Any) -> dict[str, float]:
        loader.set_epoch(0)
        device = next(model.parameters()).device
        sums: dict[str, float] = {}
        count = 0
        for number, batch in enumerate(loader):
            if max_batches and number >= max_batches:
                break
            with torch.no_grad():
                out = model(**to_device(batch, device))
            for name, value in {"distill_loss": out.loss, **out.parts}.items():
                sums[name] = sums.get(name, 0.0) + float(value)
            count += 1
        return {name: total / max(count, 1) for name, total in sums.items()}

    return evaluate


def distill(recipe: DistillRecipe, out_dir: str | Path, *, verbose: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Run a task or general distillation recipe into `out_dir` (sentences: `bertforge.distill.sentences`)."""
    if recipe.mode not in ("task", "general"):
        raise ValueError(f"mode {recipe.mode!r}: this runs task and general distillation")
    run = distill_task if recipe.mode == "task" else distill_general
    return run(recipe, out_dir, verbose=verbose, overwrite=overwrite)


__all__ = ["FINAL_DIR", "RESULTS_FILE", "RUN_STATE", "START_FILE", "STUDENT_DIR", "TEACHER_VECTORS",
           "build_student", "check_model_dir", "copy_teacher_weights", "distill", "distill_general", "distill_task",
           "layer_student", "open_run", "parameter_count", "read_unlabelled", "run_settings", "save_layer_student",
           "say", "start_metrics", "student_path", "tokenizer_file", "vocab_digest", "write_json", "write_student"]
