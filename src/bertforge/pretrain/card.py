"""The model card of a pre-training run's final model: what it started from, the settings that shaped
it (steps, batch, rate, length, masking) and its scores on the data's held-out split."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bertforge.train import TrainResult


def write_run_card(final: Path, recipe: Any, info: dict[str, Any], data_dir: Path,
                   init_from: str | os.PathLike[str] | None, result: TrainResult, world_size: int) -> Path:
    """README.md in `final`: from scratch or continued from `init_from`, with the run's settings and its
    last evaluation on the held-out split (none when the data has no validation split). `recipe` is the
    run's bertforge.pretrain.Recipe."""
    from bertforge.modelcard import command_line, write_model_card

    return write_model_card(final, kind="pretrained", base_model=init_from, command=command_line(),
                            metrics=result.metrics, data=data_dir.resolve().name,
                            settings=run_card_settings(recipe, info["options"], result, world_size))


def run_card_settings(recipe: Any, options: dict[str, Any], result: TrainResult, world_size: int) -> dict[str, Any]:
    """What a reader of the card needs to judge the model; the whole recipe is in RUN/run_config.yaml."""
    objective = recipe.data.objective or options["objective"]
    settings: dict[str, Any] = {
        "model": recipe.model, "objective": objective, "steps": result.step,
        # sequences per optimiser step, over every process and accumulated micro-batch
        "batch_size": recipe.data.batch_size * recipe.train.grad_accum * world_size,
        "optimizer": recipe.optim.optimizer, "lr": recipe.optim.lr, "schedule": recipe.optim.schedule,
        "max_seq_length": options["max_seq_length"], "precision": recipe.train.precision, "seed": recipe.train.seed,
        "train_minutes": round(result.train_seconds / 60, 2),
    }
    if objective != "ltr":  # a left-to-right LM masks nothing
        settings.update(masking=options.get("masking"), whole_word=options.get("whole_word"), span=options.get("span"),
                        mask_rate=recipe.data.mask_rate or options.get("masked_lm_prob"))
    if recipe.train.budget_minutes > 0:
        settings["budget_minutes"] = recipe.train.budget_minutes
    if recipe.data.long_data and recipe.data.long_fraction > 0:
        settings.update(long_data=recipe.data.long_data, long_fraction=recipe.data.long_fraction)
    return settings


__all__ = ["run_card_settings", "write_run_card"]
