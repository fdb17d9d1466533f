"""Pre-training from shards: a recipe (model + data + optimiser + loop settings) -> a run directory.

    from bertforge.pretrain import pretrain
    result = pretrain("recipes/tiny-cpu.yaml", "data/gutenberg128", "runs/tiny", max_steps=200)
    result.final   # runs/tiny/final: Hugging Face layout, loads in transformers.BertForPreTraining

A recipe (`Recipe`) is a YAML or JSON file with four sections, each optional (model, data, optim,
train), or a preset name, a config.json or a checkpoint directory (defaults for the rest); settings
are named by their own name in any section (`lr=3e-4`, `batch_size=64`, `hidden_dropout_prob=0.0`).
The run directory receives `run_config.yaml`, the resolved recipe, which is itself a recipe:
`pretrain("RUN/run_config.yaml", ...)` repeats the run.

`recipe.py` holds the settings, `run.py` the run, `shards.py` the data it reads, `models.py` the model
it trains and saves, `rules.py` what trains (dropout, heads only), `metrics.py` the evaluation and
`card.py` final/'s model card.
"""

from __future__ import annotations

from bertforge.pretrain.metrics import (
    CONTEXT_VARIANTS,
    context_variants,
    mlm_context_probe,
    pretraining_metrics,
)
from bertforge.pretrain.models import initialise_from, pretraining_model, random_init_like
from bertforge.pretrain.recipe import (
    DataOptions,
    Recipe,
    load_recipe,
    model_config,
    recipe_from_dict,
    with_overrides,
)
from bertforge.pretrain.rules import dropout_rates, freeze_all_but_heads, restore_dropout, training_config
from bertforge.pretrain.run import PretrainResult, pretrain, run_settings
from bertforge.pretrain.shards import (
    PhasedBatches,
    ShardBatches,
    find_tokenizer,
    read_dataset_info,
    validation_evaluator,
)

__all__ = [
    "CONTEXT_VARIANTS", "DataOptions", "PhasedBatches", "PretrainResult", "Recipe", "ShardBatches", "context_variants",
    "dropout_rates", "find_tokenizer", "freeze_all_but_heads", "initialise_from", "load_recipe", "mlm_context_probe",
    "model_config", "pretrain", "pretraining_metrics", "pretraining_model", "random_init_like", "read_dataset_info",
    "recipe_from_dict", "restore_dropout", "run_settings", "training_config", "validation_evaluator", "with_overrides",
]
