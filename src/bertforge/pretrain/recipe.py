"""The pre-training recipe: its settings (`DataOptions`, `Recipe`), reading and overriding it, and the
model config its model section describes.

A recipe is a YAML or JSON file with four sections, each optional:

    model: {preset: tiny, hidden_dropout_prob: 0.1}   # or {config: path/config.json, ...}, or a full config
    data:  {batch_size: 32, ...}                       # DataOptions below
    optim: {optimizer: adamw, lr: 1e-4, ...}           # bertforge.train.OptimConfig
    train: {max_steps: 1000, precision: bf16, ...}     # bertforge.train.TrainConfig

A preset name, a config.json or a checkpoint directory is accepted in place of a recipe (defaults for
the rest). It resolves like every job's recipe (`bertforge.recipe.resolve(Recipe, config, settings,
assignments)`): settings are named by their own name in any section (`lr=3e-4`, `batch_size=64`), and
the model section's config fields too (`hidden_dropout_prob=0.0`); the names are unique across
sections. Vocabulary size and special ids always come from the data's tokenizer (`model_config`).

No torch here: the command line builds its options from `Recipe`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bertforge.config import ModelConfig
from bertforge.model.registry import config_from_dict, resolve_config
from bertforge.recipe import RecipeError, override, read_mapping, resolve, setting, setting_names
from bertforge.train.config import OptimConfig, TrainConfig

# The pre-training objectives: the one the data was prepared for (nsp, sop: masked LM + a sentence task;
# none: masked LM alone), or one the recipe chooses: rtd, on data prepared with objective none, ELECTRA's
# replaced-token detection (a generator fills the masked positions, the discriminator spots them); ltr,
# on any data, a left-to-right LM (the BERT paper's "LTR & No NSP": causal attention, the next token
# predicted at every position, no masking and no sentence task).
OBJECTIVES = ("nsp", "sop", "none", "rtd", "ltr")
TRAIN_DROPOUT = ("auto", "off", "model")


@dataclass
class DataOptions:
    """How the shards are read and what is learnt from them; one section of a recipe."""

    batch_size: int = setting(32, help="Sequences per device per micro-batch.")
    eval_batch_size: int = setting(64, help="Sequences per validation batch.")
    eval_max_batches: int = setting(0, help="Validation batches per evaluation (0: the whole split).")
    num_workers: int = setting(0, help="DataLoader worker processes.")
    pad_to_multiple_of: int | None = setting(8, help="Pad batches to a multiple of this length (tensor-core "
                                                     "friendly on GPU; harmless on CPU).")
    # BERT's two phases: the last `long_fraction` of the steps read `long_data` (shards made with
    # max_seq_length 512); a relative path is taken beside the --data directory
    long_data: str | None = setting(None, help="Shards of long sequences for BERT's second phase (a relative "
                                               "path is taken beside --data).")
    long_fraction: float = setting(0.0, help="Share of the steps, at the end, that read long_data.")
    tokenizer: str | None = setting(None, help="Tokenizer to ship in final/ (default: the data's).")
    mask_rate: float | None = setting(None, help="Share of tokens masked by dynamic masking (default: the "
                                                 "rate the data was prepared with; ModernBERT used 0.30).")
    objective: str | None = setting(None, help="rtd: ELECTRA's replaced-token detection (a generator and the "
                                               "discriminator, trained together) on data prepared with objective "
                                               "none; ltr: a left-to-right LM (causal attention, next-token "
                                               "prediction, no NSP) on any data; default: the data's objective "
                                               "(nsp, sop or none).")
    generator_size: float = setting(0.25, help="rtd: the generator's hidden and feed-forward sizes (and heads) as a "
                                               "fraction of the discriminator's; it shares the embeddings.")
    discriminator_weight: float = setting(50.0, help="rtd: the weight of the discriminator's loss beside the "
                                                     "generator's masked-LM loss.")

    def __post_init__(self) -> None:
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.objective == "ltr" and self.mask_rate is not None:
            raise ValueError("mask_rate is a masked-LM setting; objective ltr predicts every next token and masks none")
        if not 0 < self.generator_size <= 1:
            raise ValueError(f"generator_size must be in (0, 1], got {self.generator_size}")
        if not self.discriminator_weight >= 0:
            raise ValueError(f"discriminator_weight must be 0 or more, got {self.discriminator_weight}")


@dataclass
class Recipe:
    """Everything a pre-training run depends on; RUN/run_config.yaml holds it resolved."""

    model: dict[str, Any] | str | None = setting(
        default_factory=lambda: {"preset": "tiny"}, keys=lambda recipe: _model_settings(recipe.model),
        help="The model: `preset` (tiny, mini, ..., base, large, modern-mini, ...) or `config` (a config.json or "
             "checkpoint directory) and any config fields to change, or a whole config.")
    data: DataOptions = field(default_factory=DataOptions)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    train_dropout: str = setting("auto", help="Dropout while pre-training: auto (off when budget_minutes is set, as "
                                              "budget recipes do; else the model's), off, or model. The saved model "
                                              "keeps the model's rates for fine-tuning either way.")
    train_only: str = setting("all", help="all, or heads: only the pre-training heads train and the encoder stays "
                                          "as loaded (a new head warmed up before the encoder trains under it).")
    source: str | None = setting(None, help="Where the recipe came from (recorded in run_config.yaml).")

    # what run_config.yaml records beside the settings: facts about the run, skipped on reading
    records: ClassVar[tuple[str, ...]] = ("data_dir", "dataset_options", "world_size", "init_from")

    def __post_init__(self) -> None:
        if self.train_only not in ("all", "heads"):
            raise ValueError(f"train_only must be all or heads, not {self.train_only!r}")
        if self.train_dropout not in TRAIN_DROPOUT:
            raise ValueError(f"train_dropout must be one of {', '.join(TRAIN_DROPOUT)}, not {self.train_dropout!r}")
        if self.model is None:
            self.model = {"preset": "tiny"}
        elif isinstance(self.model, str):  # `model: base` in a recipe file
            self.model = {"config" if self.model.endswith(".json") else "preset": self.model}
        _model_config(_model_base(self.model))  # a bad preset or config path fails here, before anything runs

    @classmethod
    def read_config(cls, spec: str | os.PathLike[str]) -> dict[str, Any]:
        """The settings `--config SPEC` stands for: a recipe file's, or a preset name, a config.json or a
        checkpoint directory as the model section (defaults for the rest)."""
        path = Path(spec)
        if path.suffix in (".yaml", ".yml") or (path.suffix == ".json" and path.is_file() and _is_recipe_json(path)):
            return {"source": str(path), **read_mapping(path)}
        key = "preset" if isinstance(spec, str) and not path.exists() else "config"
        return {"model": {key: str(spec)}, "source": str(spec)}

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "data": dataclasses.asdict(self.data), "optim": dataclasses.asdict(self.optim),
                "train": dataclasses.asdict(self.train), "train_dropout": self.train_dropout,
                "train_only": self.train_only, "source": self.source}


def load_recipe(spec: str | os.PathLike[str] | Recipe) -> Recipe:
    """A recipe from a YAML/JSON recipe file, or defaults around a preset / config.json / checkpoint dir
    (`resolve(Recipe, spec)`, which also takes settings and `--set` assignments)."""
    return resolve(Recipe, spec)


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    """A recipe from nested mappings, as a recipe file holds them (`resolve(Recipe, data)`)."""
    for name, section in (("data", DataOptions), ("optim", OptimConfig), ("train", TrainConfig)):
        given, known = data.get(name) or {}, {f.name for f in dataclasses.fields(section)}
        if isinstance(given, dict) and set(given) - known:  # this function's own wording of the error
            raise RecipeError(f"{source}: unknown {name} fields {sorted(set(given) - known)}; known: {sorted(known)}")
    return resolve(Recipe, {**data, "source": data.get("source") or source})


def with_overrides(recipe: Recipe, **overrides: Any) -> Recipe:
    """A copy with settings replaced by name, whichever section holds them (model fields included);
    None leaves a setting as it is (`override(recipe, settings)` from `bertforge.recipe`)."""
    values = {name: value for name, value in overrides.items() if value is not None}
    known = setting_names(recipe)
    for name in values:
        if name not in known:
            raise RecipeError(f"unknown recipe field {name!r}")
    return override(recipe, values, source="recipe override")


def _is_recipe_json(path: Path) -> bool:
    data = read_mapping(path)
    return bool({"model", "train", "optim", "data"} & set(data))


def _model_config(section: dict[str, Any]) -> ModelConfig:
    """The config a recipe's model section describes; the one place here that knows the config classes.

    `preset` or `config` (a preset name, a config.json or a checkpoint directory) with fields replaced
    (a field its family does not have is kept in `extra`, as config.json keeps unknown keys), or the
    fields of a whole config, whose `model_type` picks the family.
    """
    section = dict(section)
    base = section.pop("preset", None) or section.pop("config", None)
    if base is None:
        return config_from_dict(section, source="recipe model section")  # either family, by model_type
    fields = {f.name for f in dataclasses.fields(resolve_config(base))} - {"extra"}  # of its family
    config = resolve_config(base, **{k: v for k, v in section.items() if k in fields})
    config.extra.update({k: v for k, v in section.items() if k not in fields})
    return config


def _checkpoint_config(section: dict[str, Any]) -> ModelConfig | None:
    """The config of the checkpoint directory a model section starts from (`config: DIR`), if it does."""
    base = section.get("config")
    if base is None or not (Path(base) / "config.json").is_file():
        return None
    return resolve_config(base)


def _model_base(section: dict[str, Any]) -> dict[str, Any]:
    """What in a model section picks the family and the config to start from: its `preset` or `config`,
    or all of it when it is a whole config. (The other fields are checked with the data's vocabulary.)"""
    base = {key: section[key] for key in ("preset", "config") if section.get(key) is not None}
    return base or section


def _model_settings(section: dict[str, Any]) -> list[str]:
    """The names the model section takes one at a time: `preset`, `config` and its family's config fields."""
    config = _model_config(_model_base(section))
    return ["preset", "config", *(f.name for f in dataclasses.fields(config) if f.name != "extra")]


def model_config(recipe: Recipe, tokenizer_facts: dict[str, Any], max_seq_length: int) -> ModelConfig:
    """The recipe's model section, with the vocabulary size and padding id of the data's tokenizer."""
    section = dict(recipe.model)
    vocab = tokenizer_facts["vocab_size"]
    if section.get("vocab_size", vocab) != vocab:
        raise ValueError(f"the recipe's vocab_size {section['vocab_size']} differs from the data's tokenizer ({vocab})")
    checkpoint = _checkpoint_config(section)
    if checkpoint is not None and checkpoint.vocab_size >= vocab and "vocab_size" not in section:
        # a released checkpoint keeps its embedding table, which is often wider than its tokenizer's
        # vocabulary (rounded up for speed: DeBERTa-v3, ModernBERT), and its own padding id
        section.update(vocab_size=checkpoint.vocab_size, pad_token_id=checkpoint.pad_token_id)
    else:
        section.update(vocab_size=vocab, pad_token_id=tokenizer_facts["pad_id"])
    config = _model_config(section)
    if config.max_tokens < max_seq_length:
        raise ValueError(f"the data has sequences of {max_seq_length} tokens but the model only "
                         f"{config.max_tokens} positions (max_position_embeddings)")
    return config
