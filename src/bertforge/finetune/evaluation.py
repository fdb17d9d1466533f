"""How a fine-tuning run scores its eval splits while it trains, and keeps the best evaluation's model.

`Evaluator` is the loop's `evaluate` callback: it predicts every eval split and scores those with
labels (the hold-out split's metrics prefixed `holdout_`). `BestModel` is a seed's `on_improvement`:
it writes the best evaluation's model to `seed-N/best/`, whole at every moment. `main_metric_key`
names the metric that selects it.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.finetune.scores import HOLDOUT_SPLIT, metric_splits, single_class
from bertforge.finetuned import TaskRecord
from bertforge.tasks.base import Task, run_model

BEST_DIR = "best"


class Evaluator:
    """The loop's `evaluate` callback: predicts every eval split and keeps the last outputs."""

    def __init__(self, task: Task, splits: dict[str, tuple[list[Any], list[Any]]], label_names: list[str] | None,
                 batch_size: int, pad_id: int) -> None:
        self.task, self.splits, self.label_names = task, splits, label_names
        self.batch_size, self.pad_id = batch_size, pad_id
        self.outputs: dict[str, list[dict[str, np.ndarray]]] = {}
        self.label = ""  # the name the loop prints before the scores: "dev", or "train" for training rows

    def __call__(self, model: Any) -> dict[str, float]:
        for split, (_, features) in self.splits.items():
            self.outputs[split] = run_model(model, features, self.task.output_names,
                                            token_outputs=self.task.token_outputs, batch_size=self.batch_size,
                                            pad_id=self.pad_id)
        return self.scores()

    def predictions(self, split: str) -> list[Any]:
        examples, features = self.splits[split]
        return self.task.postprocess(examples, features, self.outputs[split], label_names=self.label_names)

    def scores(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for split, (examples, _) in self.splits.items():
            if not self.task.has_labels(examples):
                continue
            scores = self.task.metric(examples, self.predictions(split))
            # the hold-out split is always prefixed, so the dev metrics keep their names beside it
            own = [s for s in self.splits if s != HOLDOUT_SPLIT]
            prefix = f"{split}_" if len(own) > 1 or split == HOLDOUT_SPLIT else ""
            metrics.update({prefix + k: float(v) for k, v in scores.items()})
        return metrics



def main_metric_key(task: Task, chosen: str | None = None) -> str:
    """The key of the evaluation metrics that selects the best model: `chosen` or `task.main_metric`,
    prefixed by the first eval split's name where a task scores several (MNLI: dev_matched_accuracy)."""
    name = chosen or task.main_metric
    splits = task.eval_splits()
    if len(splits) > 1 and not any(name.startswith(f"{split}_") for split in splits):
        return f"{splits[0]}_{name}"
    return name


class BestModel:
    """The `on_improvement` of a seed's `ModelSelection`: writes the best evaluation's model to `directory`.

    Written under a temporary name and swapped in by renames, so `directory` always holds one whole
    model: the previous best until the new one is complete.
    """

    def __init__(self, directory: Path, metric: str, task: Task, evaluator: Evaluator, tokenizer: Any,
                 steps_per_epoch: int, record: TaskRecord) -> None:
        self.directory, self.metric, self.task, self.evaluator = directory, metric, task, evaluator
        self.tokenizer, self.steps_per_epoch, self.record = tokenizer, steps_per_epoch, record
        self.split_report: dict[str, dict[str, Any]] = {}  # which split each score is from (task.json, the card)
        self.metrics: dict[str, float] | None = None  # the best evaluation's metrics
        self.collapsed: tuple[str, str, int] | None = None  # its predictions all one class (`scores.single_class`)
        self.judged = False  # whether `collapsed` was found in this process (not before a resume)
        self.saved = False
        self._staging = directory.with_name(f".{directory.name}.tmp")
        self._previous = directory.with_name(f".{directory.name}.old")
        if not directory.exists() and self._previous.exists():  # a crash between the two renames
            self._previous.rename(directory)

    def clear(self) -> None:
        for path in (self.directory, self._staging, self._previous):
            shutil.rmtree(path, ignore_errors=True)

    def remember(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        self.metrics = dict(metrics)
        self.collapsed, self.judged = single_class(self.task, self.evaluator, self.record.labels), True

    def save(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        self.remember(model, step, metrics)
        # settings tuned on these predictions (SQuAD v2.0's null threshold) go with this model
        settings = {**self.task.settings, **self.task.tune(*first_labelled(self.task, self.evaluator))}
        record = dataclasses.replace(self.record, settings=settings, metrics=dict(metrics), step=step,
                                     epoch=round(step / self.steps_per_epoch, 3), selection_metric=self.metric,
                                     score=float(metrics[self.metric]),
                                     extra={**self.record.extra, "metric_splits": metric_splits([metrics],
                                                                                                self.split_report)})
        staging = self._staging
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, tokenizer=self.tokenizer)
        for split, (examples, _) in self.evaluator.splits.items():
            self.task.write_predictions(examples, self.evaluator.predictions(split), staging, split)
        record.write(staging)
        shutil.rmtree(self._previous, ignore_errors=True)
        if self.directory.exists():
            self.directory.rename(self._previous)
        staging.rename(self.directory)
        shutil.rmtree(self._previous, ignore_errors=True)
        self.saved = True

    def summary(self, selection: Any) -> dict[str, Any] | None:
        """What the final task.json says of the best evaluation (None when there was none)."""
        if selection.best_step is None:
            return None
        on_disk = TaskRecord.read(self.directory)  # best/ of this run, saved before a resume or in this process
        saved_here = on_disk is not None and on_disk.step == selection.best_step
        if self.metrics is None:  # the best came before a resume: its metrics are in best/task.json
            self.metrics = on_disk.metrics if saved_here and on_disk is not None else None
        return {"dir": BEST_DIR if self.saved or saved_here else None, "metric": selection.metric,
                "score": selection.best_score,
                "step": selection.best_step, "epoch": round(selection.best_step / self.steps_per_epoch, 3),
                "metrics": self.metrics}


def first_labelled(task: Task, evaluator: Evaluator) -> tuple[list[Any], list[Any]]:
    """The first eval split with labels and its predictions (what `Task.tune` learns from)."""
    for split, (examples, _) in evaluator.splits.items():
        if task.has_labels(examples) and split in evaluator.outputs:
            return examples, evaluator.predictions(split)
    return [], []
