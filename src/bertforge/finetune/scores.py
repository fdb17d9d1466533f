"""What a fine-tuning run says of its scores: the split each is from (a split of training rows is
named "train"), the best model across seeds by dev, and a warning when a model gives every row one class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.finetune.runrecord import TRAIN_SCORES
from bertforge.tasks.base import Task

HOLDOUT_SPLIT = "holdout"  # the split held out of the training file when no dev file is given


def split_of(key: str, splits: Sequence[str]) -> str:
    """The eval split a metric key is from: its prefix (holdout_accuracy, dev_matched_accuracy), else the
    one split scored without a prefix."""
    for split in sorted(splits, key=len, reverse=True):
        if key.startswith(f"{split}_"):
            return split
    return next((split for split in splits if split != HOLDOUT_SPLIT), splits[0] if splits else "dev")


def metric_splits(per_seed: Sequence[dict[str, float]], split_report: dict[str, dict[str, Any]]) -> dict[str, str]:
    """results.json's `metric_splits`: for each metric of seeds[].metrics, summary and best_summary, the split
    it is scored on, as reported: "train" for a split whose rows are all training rows."""
    keys = dict.fromkeys(key for metrics in per_seed for key in metrics)
    return {key: split_report.get(split := split_of(key, list(split_report)), {}).get("reported_as", split)
            for key in keys}


def named_scores(metrics: dict[str, float], split_report: dict[str, dict[str, Any]]) -> str:
    """"dev accuracy 0.8125  holdout accuracy 0.7900": each score with the split it is from."""
    shown = []
    for key, value in metrics.items():
        split = split_of(key, list(split_report))
        name = key.removeprefix(f"{split}_")
        shown.append(f"{split_report.get(split, {}).get('reported_as', split)} {name} {value:.4f}")
    return "  ".join(shown)


def overlap_notes(split_report: dict[str, dict[str, Any]]) -> list[str]:
    """What the console says of eval splits that share rows with the training examples."""
    notes = []
    for split, found in split_report.items():
        shared, total = found["training_rows"], found["examples"]
        if found["reported_as"] == TRAIN_SCORES:
            notes.append(f"{split}: all {total} rows are training rows, so its scores are reported as {TRAIN_SCORES} "
                         "scores (how well the training rows are fitted), not as held-out ones")
        elif shared:
            notes.append(f"{split}: {shared} of {total} rows are also training rows (repeated rows?); its scores "
                         "are flattered by them")
    return notes


def best_line(best: dict[str, Any] | None, seed_dir: Path, split_report: dict[str, dict[str, Any]]) -> str:
    """"; best by dev accuracy 0.8125 at step 40 (epoch 2): runs/x/seed-1/best" for the console."""
    if not best or best.get("score") is None:
        return ""
    split = split_of(best["metric"], list(split_report))
    named = split_report.get(split, {}).get("reported_as", split)
    where = seed_dir / best["dir"] if best.get("dir") else f"{seed_dir} (best/ not saved)"
    return (f"; best by {named} {best['metric'].removeprefix(f'{split}_')} {best['score']:.4f} at step "
            f"{best['step']} (epoch {best['epoch']:g}): {where}")


def best_model(runs: list[dict[str, Any]], split_report: dict[str, dict[str, Any]],
                selection_metric: str) -> dict[str, Any]:
    """results.json's `best_model`: the model to use, the best evaluation of all seeds by the selection
    metric on its split (seed-N/best, or seed-N where best/ was not kept), not a seed's final model."""
    scored = [r for r in runs if r.get("best") and r["best"].get("score") is not None
              and math.isfinite(r["best"]["score"])]
    if not scored:
        return {}
    top = max(scored, key=lambda r: r["best"]["score"])
    best = top["best"]
    split = split_of(selection_metric, list(split_report))
    directory = f"{top['dir']}/{best['dir']}" if best.get("dir") else top["dir"]
    return {"best_model": {"dir": directory, "seed": top["seed"], "metric": selection_metric,
                           "split": split_report.get(split, {}).get("reported_as", split), "score": best["score"],
                           "step": best["step"], "epoch": best["epoch"]}}


def one_class_warnings(task: Task, evaluator: Any, label_list: list[str] | None, seed: int, steps: int,
                        train_size: int, split_report: dict[str, dict[str, Any]], best: Any) -> list[str]:
    """A warning when the final model gives one class to every row of the first labelled split while its
    gold labels hold several: a collapse to the commonest label, typical of too few steps on a small file."""
    found = single_class(task, evaluator, label_list)
    if found is None:
        return []
    split, label, rows = found
    named = split_report.get(split, {}).get("reported_as", split)
    warning = (f"seed {seed}: the final model predicts one class, {label!r}, for all {rows} {named} rows: it has "
               f"not learned to tell the classes apart. {steps} optimiser steps on {train_size} training examples "
               "may be too few: give more --epochs (or leave --epochs out: a small file then gets at least "
               "--min-steps steps), or another --lr")
    if best.judged and best.collapsed is None:
        warning += f"; the best evaluation's model ({best.directory}) does not, use it rather than the final one"
    elif best.judged:
        warning += "; so does the best evaluation's model"
    return [warning]


def single_class(task: Task, evaluator: Any,
                  label_list: list[str] | None) -> tuple[str, str, int] | None:
    """(split, class, rows) when the latest predictions of the first labelled eval split are all one class
    and its gold labels are not; None otherwise (and for tasks that predict no single class per row)."""
    if not label_list or len(label_list) < 2:
        return None
    for split, (examples, _) in evaluator.splits.items():
        if not task.has_labels(examples) or split not in evaluator.outputs or len(examples) < 2:
            continue
        predicted = [p.get("label") if isinstance(p, dict) else p for p in evaluator.predictions(split)]
        gold = [getattr(e, "label", None) for e in examples]
        if not all(isinstance(v, str | int) for v in predicted + gold):
            return None  # multi-label sets, spans, tags: not one class per row
        if len(set(predicted)) == 1 and len(set(gold)) > 1:
            return split, str(predicted[0]), len(predicted)
        return None
    return None
