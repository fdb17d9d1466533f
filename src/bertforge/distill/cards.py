"""Model cards of distillation's students: the teacher named, what the student started from, and its
scores. A task student is a fine-tuned model directory, so its task.json gives the card its task, dev
scores and settings; a general student's card gets the run's validation losses, before and after."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bertforge.distill.recipe import DistillRecipe
from bertforge.modelcard import command_line, write_model_card


def write_student_cards(directories: Iterable[Path], recipe: DistillRecipe, results: dict[str, Any]) -> list[Path]:
    """README.md in each of `directories` that holds a model (a run that never scored writes no best
    student); `results` is the run's results.json content."""
    details: dict[str, Any] = {"kind": "distilled", "teacher": recipe.teacher, "command": command_line(),
                               **student_origin(recipe, results)}
    if results["mode"] in ("general", "sentences"):
        settings = general_settings(recipe, results) if results["mode"] == "general" else {
            "steps": results["steps"], "batch_size": recipe.train.batch_size, "lr": recipe.optim.lr,
            "precision": recipe.train.precision, "loss": "1 - cosine with the teacher's sentence vectors",
            "texts": results["texts"]["train"]}
        details.update(metrics=results.get("final_metrics"), baseline=results.get("start_metrics"),
                       data=Path(str(recipe.data)).resolve().name, settings=settings)
    return [write_model_card(directory, **details) for directory in directories
            if (directory / "config.json").is_file()]


def student_origin(recipe: DistillRecipe, results: dict[str, Any]) -> dict[str, Any]:
    """The card's base_model and start: the checkpoint the student was loaded from, the teacher whose
    layers it was cut from, or none (random weights in a preset's or config's shape)."""
    if recipe.student_layers_from_teacher is not None:
        return {"base_model": recipe.teacher, "start": str(results["student"])}  # "teacher layers [0, 2]"
    if recipe.student is not None and Path(recipe.student).is_dir():
        return {"base_model": recipe.student}
    shape = Path(str(recipe.student)).name  # a preset's name, or a config.json's file name only
    return {"start": f"random weights in the shape of `{shape}`"}


def general_settings(recipe: DistillRecipe, results: dict[str, Any]) -> dict[str, Any]:
    """What shaped a general student: steps, batch, rate and the weights of the losses it learnt by."""
    losses = {name: value for name, value in dataclasses.asdict(recipe.losses).items()
              if name != "alpha" and value}  # alpha weighs task labels, which general distillation has none of
    return {"steps": results["steps"], "batch_size": recipe.train.batch_size, "lr": recipe.optim.lr,
            "student_job": results.get("student_job"), "precision": recipe.train.precision, **losses}


__all__ = ["general_settings", "student_origin", "write_student_cards"]
