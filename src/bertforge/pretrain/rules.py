"""What trains in a pre-training run: dropout off under a time budget (and the model's own rates put back
in the saved config), or the pre-training heads alone with the encoder frozen."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.config import ModelConfig
from bertforge.fileio import write_text_atomic

if TYPE_CHECKING:
    from torch import nn


def freeze_all_but_heads(model: nn.Module) -> list[str]:
    """Keep every parameter but the model's pre-training heads (its class's `head_prefixes`) as it is:
    no gradients, so the optimiser never sees them. A word-embedding matrix tied to a masked-LM decoder
    is the encoder's, and stays. Returns the names of the parameters left to train."""
    prefixes = tuple(getattr(type(model), "head_prefixes", ()))
    if not prefixes:
        raise ValueError(f"train_only heads: {type(model).__name__} declares no heads to train alone")
    trained = []
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(prefixes))
        if parameter.requires_grad:
            trained.append(name)
    if not trained:
        raise ValueError(f"train_only heads: {type(model).__name__} has no parameters under {', '.join(prefixes)}")
    return trained


def dropout_rates(config: ModelConfig) -> dict[str, float]:
    """The config's dropout rates by field name (whatever its family calls them), those above 0."""
    rates = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if "dropout" in f.name}
    return {name: rate for name, rate in rates.items() if isinstance(rate, float) and rate > 0}


def training_config(recipe: Any, config: ModelConfig) -> ModelConfig:
    """The config the run trains with (`recipe`: a `bertforge.pretrain.Recipe`): the model's, without dropout where `train_dropout` says so (off, or
    auto with a time budget: at a small budget the model underfits, and dropout only slows it, as
    Cramming (Geiping & Goldstein 2023) and Izsak et al. (2021) found)."""
    off = recipe.train_dropout == "off" or (recipe.train_dropout == "auto" and recipe.train.budget_minutes > 0)
    return config.with_overrides(**{name: 0.0 for name in dropout_rates(config)}) if off else config


def restore_dropout(directory: Path, config: ModelConfig) -> None:
    """Put the model's own dropout rates back in a saved config.json (trained without them: fine-tuning
    gets them as the model's recipe set them)."""
    path = directory / "config.json"
    rates = dropout_rates(config)
    saved = json.loads(path.read_text(encoding="utf-8"))
    if rates and any(saved.get(name) != rate for name, rate in rates.items()):
        write_text_atomic(path, json.dumps({**saved, **rates}, indent=2, sort_keys=True) + "\n")
