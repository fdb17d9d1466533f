"""Pre-training from shards: a recipe (model + data + optimiser + loop settings) -> a run directory.

    from bertforge.pretrain import pretrain
    result = pretrain("recipes/tiny-cpu.yaml", "data/gutenberg128", "runs/tiny", max_steps=200)
    result.final   # runs/tiny/final: Hugging Face layout, loads in transformers.BertForPreTraining

A recipe (`Recipe`) is a YAML or JSON file with four sections, each optional:

    model: {preset: tiny, hidden_dropout_prob: 0.1}   # or {config: path/config.json, ...}, or a full config
    data:  {batch_size: 32, ...}                       # DataOptions below
    optim: {optimizer: adamw, lr: 1e-4, ...}           # bertforge.train.OptimConfig
    train: {max_steps: 1000, precision: bf16, ...}     # bertforge.train.TrainConfig

A preset name, a config.json or a checkpoint directory is accepted in place of a recipe (defaults for
the rest). It resolves like every job's recipe (`bertforge.recipe.resolve(Recipe, config, settings,
assignments)`): settings are named by their own name in any section (`lr=3e-4`, `batch_size=64`), and
the model section's config fields too (`hidden_dropout_prob=0.0`); the names are unique across
sections. The run directory receives `run_config.yaml`, the resolved recipe, which is itself a
recipe: `pretrain("RUN/run_config.yaml", ...)` repeats the run. Vocabulary size and special ids always
come from the data's tokenizer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from bertforge.config import ModelConfig
from bertforge.fileio import run_lock, write_text_atomic
from bertforge.model.registry import config_from_dict, model_class, resolve_config
from bertforge.pretrain.card import write_run_card
from bertforge.pretrain.metrics import (  # re-exported: the evaluation's public names
    CONTEXT_VARIANTS,
    context_variants,
    mlm_context_probe,
    pretraining_metrics,
)
from bertforge.pretrain.rules import dropout_rates, freeze_all_but_heads, restore_dropout, training_config
from bertforge.recipe import (
    RUN_CONFIG_FILE,
    RecipeError,
    override,
    read_mapping,
    resolve,
    setting,
    setting_names,
)
from bertforge.train.config import OptimConfig, TrainConfig
from bertforge.train.rundir import (
    RECORD_FILE,
    RunInput,
    check_run_record,
    clear_run,
    directory_input,
    read_run_record,
    write_run_record,
)

if TYPE_CHECKING:  # torch is imported where it is used: the command line builds its options from Recipe
    from torch import nn

    from bertforge.train import TrainResult
    from bertforge.train.distributed import DistContext
    from bertforge.train.loop import Batch, EvalFn

log = logging.getLogger(__name__)


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


@dataclass
class PretrainResult:
    final: Path | None  # RUN/final (None on ranks other than 0)
    train: TrainResult


# ------------------------------------------------------------------------------------------------
# recipes
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------
class ShardBatches:
    """A `PretrainingLoader` as the loop's `ResumableBatches`, whose position survives a new world size.

    The loader deals each epoch's permutation round-robin to the ranks, so after every rank took `o`
    instances the first `o x W` of the permutation are used, whatever W was. On another world size W'
    a rank therefore continues at offset `o x W / W'` (exact when it divides).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        world = self.loader.world_size
        saved_world = state.get("world_size", world)
        if saved_world != world:
            state = {**state, "offset": state["offset"] * saved_world // world, "world_size": world,
                     "rank": self.loader.rank}
        self.loader.load_state_dict(state)


class PhasedBatches:
    """BERT's schedule of sequence lengths: `first` for `switch_at` micro-batches, then `second`."""

    def __init__(self, first: Any, second: Any, switch_at: int) -> None:
        self.first, self.second, self.switch_at = first, second, switch_at
        self.fetched = 0

    def __iter__(self) -> Iterator[Batch]:
        if self.fetched < self.switch_at:
            for batch in self.first:
                self.fetched += 1
                yield batch
                if self.fetched >= self.switch_at:
                    return  # the loop asks again, and gets the second phase
        else:
            for batch in self.second:
                self.fetched += 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"fetched": self.fetched, "first": self.first.state_dict(), "second": self.second.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fetched = state["fetched"]
        self.first.load_state_dict(state["first"])
        self.second.load_state_dict(state["second"])


def read_dataset_info(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "dataset.json"
    if not path.is_file():
        raise ValueError(f"{data_dir}: no dataset.json; make shards with `bertforge prepare` first")
    return json.loads(path.read_text(encoding="utf-8"))


def objective_config(options: DataOptions, config: ModelConfig) -> ModelConfig:
    """The model config the recipe's objective needs: objective ltr makes it causal (`is_decoder: true`,
    transformers' name), so that the saved model is a left-to-right one everywhere it is loaded."""
    if options.objective != "ltr":
        return config
    try:
        model_class(config.model_type, "causal-lm")
    except ValueError as exc:  # UnknownFamilyError
        raise ValueError(f"objective ltr needs a left-to-right LM head, which the {config.model_type!r} family "
                         f"does not have (use a BERT model: preset mini, say): {exc}") from None
    if getattr(config, "span_boundary_objective", False):
        raise ValueError("objective ltr predicts the next token and masks no span: turn span_boundary_objective off")
    return config.with_overrides(is_decoder=True)


def training_batches(data_dir: Path, recipe: Recipe, ctx: DistContext) -> ShardBatches | PhasedBatches:
    from bertforge.data.loader import PretrainingLoader

    def loader(directory: Path) -> ShardBatches:
        # even + drop_last: every rank gets as many batches of the same size, so ranks stay in step
        return ShardBatches(PretrainingLoader(
            directory, recipe.data.batch_size, split="train", seed=recipe.train.seed, rank=ctx.rank,
            world_size=ctx.world_size, drop_last=True, even=True, num_workers=recipe.data.num_workers,
            pad_to_multiple_of=recipe.data.pad_to_multiple_of, pin_memory=ctx.device.type == "cuda",
            mask_rate=recipe.data.mask_rate, next_token=recipe.data.objective == "ltr"))

    first = loader(data_dir)
    if not recipe.data.long_data or recipe.data.long_fraction <= 0:
        return first
    long_dir = _beside(data_dir, recipe.data.long_data)
    switch_step = round((1 - recipe.data.long_fraction) * recipe.train.max_steps)
    return PhasedBatches(first, loader(long_dir), switch_step * recipe.train.grad_accum)


def _beside(data_dir: Path, other: str) -> Path:
    path = Path(other)
    return path if path.is_absolute() else data_dir.parent / path


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------
def validation_evaluator(data_dir: Path, options: DataOptions, objective: str) -> EvalFn | None:
    """Metrics on the fixed, statically masked validation split (None when the data has none); for
    objective ltr on the same sequences with their masks undone, as next-token prediction."""
    from bertforge.data.loader import PretrainingLoader

    if options.objective == "ltr":  # the recipe's choice, whatever the data was prepared for
        objective = "ltr"
    loader = PretrainingLoader(data_dir, options.eval_batch_size, split="valid", shuffle=False,
                               pad_to_multiple_of=options.pad_to_multiple_of, next_token=objective == "ltr")
    if len(loader.dataset) == 0:
        return None

    def evaluate(model: nn.Module) -> dict[str, float]:
        loader.set_epoch(0)  # the same batches every time
        return pretraining_metrics(model, loader, options.eval_max_batches, objective)

    return evaluate


# ------------------------------------------------------------------------------------------------
# the entry point
# ------------------------------------------------------------------------------------------------
def pretrain(
    config: str | os.PathLike[str] | Recipe,
    data_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    max_steps: int | None = None,
    resume: bool = False,
    init_from: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    lock: bool = True,
    **overrides: Any,
) -> PretrainResult:
    """Pre-train a BERT on prepared shards; the run directory gets checkpoints, metrics and `final/`
    (with its model card, README.md: `bertforge.pretrain.card`).

    `config` is a recipe file, a preset name, a config.json or a checkpoint directory; `overrides`
    name recipe fields (see the module docstring). Under torchrun every rank calls this.
    `init_from` starts from a checkpoint directory's weights instead of a random draw (continued
    pre-training, on new data say): the recipe still sets the architecture, and the checkpoint must fit
    it and share the data's vocabulary. The optimiser, schedule and data position start afresh;
    `resume` continues this run's own checkpoints and takes precedence.

    The run holds `out_dir`'s lock throughout (`bertforge.fileio.run_lock`, on rank 0): a second run
    on it is refused, naming the holder's pid. A directory that holds checkpoints is refused without
    `resume`; with it, the run must have the settings and data it was started with
    (`RUN/fingerprint.json`, `bertforge.train.rundir`), else a `RunMismatchError` names what differs.
    `overwrite` clears the directory's checkpoints, metrics and records first, to start again.
    `lock=False` is for a caller that holds `out_dir`'s lock itself (`bertforge.adapt`, around more work).
    """
    if init_from is not None:  # a Hub model name: its cached snapshot
        from bertforge.hub import local_or_hub

        init_from = local_or_hub(init_from)
    settings = {name: value for name, value in {"max_steps": max_steps, **overrides}.items() if value is not None}
    recipe = resolve(Recipe, config, settings, given_as="pretrain(): {name}")
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    info = read_dataset_info(data_dir)
    options = info["options"]
    max_len = options["max_seq_length"]
    if recipe.data.long_data and recipe.data.long_fraction > 0:
        max_len = max(max_len, read_dataset_info(_beside(data_dir, recipe.data.long_data))["options"]["max_seq_length"])
    bert_config = objective_config(recipe.data, model_config(recipe, info["tokenizer"], max_len))
    if options["objective"] != "none" and recipe.data.objective != "ltr" and not bert_config.next_sentence_head:
        raise ValueError(f"the data has a sentence objective ({options['objective']}) but the model has no head "
                         "for it (next_sentence_head: false); prepare the data with objective 'none'")
    pretraining_model(recipe.data, bert_config, options["objective"])  # an objective the model cannot train fails here

    from bertforge.train import distributed

    ctx = distributed.init_distributed(recipe.train.device, recipe.train.dist_timeout_s)
    with contextlib.ExitStack() as held:  # rank 0 holds the run directory's lock till the end
        def open_run() -> None:
            if lock:
                held.enter_context(run_lock(out_dir, what="pre-training run"))
            _open_run_dir(out_dir, recipe, bert_config, data_dir, init_from, resume=resume, overwrite=overwrite)
            record = {**recipe.to_dict(), "model": bert_config.to_dict(), "data_dir": str(data_dir.resolve()),
                      "dataset_options": options, "world_size": ctx.world_size}
            if init_from is not None:
                record["init_from"] = str(Path(init_from).resolve())
            header = (f"bertforge pretrain --config {out_dir / RUN_CONFIG_FILE} --data {data_dir} --out DIR repeats "
                      "this run\n(data_dir, dataset_options, world_size and init_from are records, not settings)")
            write_text_atomic(out_dir / RUN_CONFIG_FILE, "".join(f"# {line}\n" for line in header.splitlines())
                              + yaml.safe_dump(record, sort_keys=False))

        _main_first(ctx, open_run)
        return _pretrain(recipe, bert_config, data_dir, out_dir, info, init_from, resume, ctx)


def _pretrain(recipe: Recipe, bert_config: ModelConfig, data_dir: Path, out_dir: Path, info: dict[str, Any],
              init_from: str | os.PathLike[str] | None, resume: bool, ctx: DistContext) -> PretrainResult:
    """The run itself, once rank 0 holds the run directory and has checked it."""
    import torch

    from bertforge.train import distributed, fsdp, train

    options = info["options"]
    torch.manual_seed(recipe.train.seed)  # the same initial weights on every rank (DDP also broadcasts)
    build = pretraining_model(recipe.data, training_config(recipe, bert_config), options["objective"])
    model = build()
    if init_from is not None:
        initialise_from(model, Path(init_from), info)
    if recipe.train_only == "heads":
        freeze_all_but_heads(model)
    batches = training_batches(data_dir, recipe, ctx)
    evaluate = validation_evaluator(data_dir, recipe.data, options["objective"])
    result = train(model, batches, out_dir, recipe.train, recipe.optim, evaluate=evaluate, resume=resume, ctx=ctx)

    final = None
    # FSDP leaves the model sharded: every rank helps gather it, and rank 0 exports a plain copy
    trained = fsdp.unsharded(model, build)
    if ctx.is_main and trained is not None:
        tokenizer = find_tokenizer(data_dir, info, recipe.data.tokenizer)
        if tokenizer is None:
            log.warning("no tokenizer found for %s (neither data.tokenizer / --tokenizer nor %s): final/ gets "
                        "no vocab.txt", data_dir, data_dir / "tokenizer")
        final = export_final(trained, out_dir / "final", tokenizer)
        restore_dropout(final, bert_config)
        write_run_card(final, recipe, info, data_dir, init_from, result, ctx.world_size)
    distributed.barrier("exporting the final model")
    return PretrainResult(final=final, train=result)


# settings a resumed pre-training run may change: how it runs, logs and checkpoints, not what it computes
# (checkpoints move between DDP and FSDP and to another number of processes; world_size is no setting)
RESUMABLE_CHANGES = ("device", "dist_timeout_s", "progress", "log_every", "save_every", "save_every_minutes",
                     "keep_last", "eval_every", "num_workers", "eval_batch_size", "eval_max_batches", "parallel",
                     "ddp_find_unused", "compile", "max_nonfinite", "tokenizer")
# what --overwrite clears in a run directory before starting again
RUN_STATE = ("checkpoints", "metrics.jsonl", "tensorboard", "final", "curves.png", RUN_CONFIG_FILE, RECORD_FILE)


def run_settings(recipe: Recipe, config: ModelConfig) -> dict[str, Any]:
    """The settings a pre-training run's results depend on, flat by name (the model's config fields
    too, at the rates it trains with): a resume with others is refused."""
    flat = dict(training_config(recipe, config).to_dict())
    for section in (recipe.data, recipe.optim, recipe.train):
        flat.update(dataclasses.asdict(section))
    if recipe.train_only != "all":  # recorded only when set, as runs made before the setting recorded nothing
        flat["train_only"] = recipe.train_only
    return {name: value for name, value in flat.items() if name not in RESUMABLE_CHANGES}


def run_inputs(recipe: Recipe, data_dir: Path, init_from: str | os.PathLike[str] | None) -> list[RunInput]:
    """The inputs a pre-training run depends on: the data's dataset.json (which records its inputs, options
    and shards), the long phase's too, and the --init-from checkpoint's files."""
    inputs = [directory_input("data", data_dir, ("dataset.json",))]
    if recipe.data.long_data and recipe.data.long_fraction > 0:
        inputs.append(directory_input("long_data", _beside(data_dir, recipe.data.long_data), ("dataset.json",)))
    if init_from is not None:
        inputs.append(directory_input("init_from", Path(init_from)))
    return inputs


def _open_run_dir(out_dir: Path, recipe: Recipe, config: ModelConfig, data_dir: Path,
                  init_from: str | os.PathLike[str] | None, *, resume: bool, overwrite: bool) -> None:
    """Rank 0, holding the lock: clear (`overwrite`), refuse (checkpoints without `resume`, or a resume
    with other settings or data), and record what a fresh start starts with."""
    from bertforge.train.state import list_checkpoints

    if overwrite:
        clear_run(out_dir, RUN_STATE)
    checkpoints = list_checkpoints(out_dir)
    settings, inputs = run_settings(recipe, config), run_inputs(recipe, data_dir, init_from)
    if checkpoints and not resume:
        raise FileExistsError(f"{out_dir} already holds checkpoints ({checkpoints[-1].name}): continue them with "
                              "--resume (resume=True), or start again with --overwrite (overwrite=True) or in a "
                              "new --out")
    if checkpoints:
        check_run_record(out_dir, settings, inputs, what="pre-training run", may_omit=("init_from",))
    if not checkpoints or read_run_record(out_dir) is None:
        write_run_record(out_dir, settings, inputs)


def _main_first(ctx: DistContext, action: Callable[[], None]) -> None:
    """Run `action` on rank 0 while the other ranks wait; an error there is raised on every rank."""
    from bertforge.train import distributed

    error: Exception | None = None
    if ctx.is_main:
        try:
            action()
        except Exception as exc:
            error = exc
    if ctx.distributed:
        told = distributed.broadcast_object(None if error is None else (isinstance(error, FileExistsError),
                                                                         isinstance(error, ValueError), str(error)))
        if error is None and told is not None:
            exists, value, message = told
            raise (FileExistsError if exists else ValueError if value else RuntimeError)(message)
    if error is not None:
        raise error


def pretraining_model(options: DataOptions, config: ModelConfig, data_objective: str) -> Callable[[], nn.Module]:
    """What builds the model a run trains, for the data's objective and the recipe's `objective`.

    nsp / sop: the family's pre-training model; none (RoBERTa): its masked-LM model, which carries the
    span-boundary head when the config asks (a family without sentence-pair heads gives its masked-LM
    model for "pretraining" too); rtd: the family's pre-training model (a replaced-token detector) with a
    generator beside it (`with_generator`), which only a family with such a discriminator has; ltr: the
    family's left-to-right LM (job causal-lm) on any data, with the config made causal (`objective_config`).
    """
    objective = options.objective or data_objective
    if objective == "ltr":
        config = objective_config(options, config)
        lm = model_class(config.model_type, "causal-lm")
        return lambda: lm(config)
    if objective == "rtd":
        if data_objective != "none":
            raise ValueError(f"objective rtd trains on masked-LM data, but the data has a sentence objective "
                             f"({data_objective}); prepare it with objective 'none'")
        joint = getattr(model_class(config.model_type, "pretraining"), "with_generator", None)
        if joint is None:
            raise ValueError(f"objective rtd needs a replaced-token detector with a generator beside it, which the "
                             f"{config.model_type!r} family does not have (use an ELECTRA model: preset "
                             "electra-small-discriminator, say)")
        return lambda: joint(config, generator_size=options.generator_size,
                             discriminator_weight=options.discriminator_weight)
    if objective != data_objective:
        raise ValueError(f"objective {objective!r} is not the data's ({data_objective}): a sentence objective is "
                         "chosen when the data is prepared (bertforge prepare --objective)")
    cls = model_class(config.model_type, "masked-lm" if objective == "none" else "pretraining")
    return lambda: cls(config)


def initialise_from(model: nn.Module, checkpoint: Path, info: dict[str, Any]) -> Any:
    """Load `checkpoint`'s weights into `model`, refusing one whose vocabulary is not the data's, and
    return the load report (its `new_heads`: what the checkpoint lacked). A model of several parts (rtd's
    generator and discriminator) loads them itself (`load_weights`); its report is the discriminator's."""
    from bertforge.checkpoint import load_weights_into

    recorded = info.get("tokenizer", {}).get("vocab_sha1")
    if recorded and has_tokenizer(checkpoint) and _vocab_sha1(checkpoint) != recorded:
        raise ValueError(f"{checkpoint}: its tokenizer's vocabulary is not the one the pre-training data was made "
                         "with (token ids would mean different pieces)")
    load = getattr(model, "load_weights", None)
    if load is not None:
        return load(checkpoint)
    return load_weights_into(model, checkpoint)


def random_init_like(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], seed: int = 0) -> Path:
    """A checkpoint with `checkpoint`'s config and tokenizer and BERT's random initialisation instead of
    its weights: the start that shows what pre-training bought when both are fine-tuned alike."""
    import torch

    from bertforge.model.registry import read_config_file
    from bertforge.tokenizer import BertTokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    torch.manual_seed(seed)
    config = read_config_file(checkpoint / "config.json")
    model = model_class(config.model_type, "pretraining")(config)  # its family's pre-training model
    model.save_pretrained(out, tokenizer=BertTokenizer.from_pretrained(checkpoint))
    return out


def export_final(model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> Path:
    """The model in Hugging Face layout (config.json + model.safetensors), with the tokenizer's files."""
    tokenizer = None
    if tokenizer_dir is not None:
        from bertforge.tokenizer import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    model.save_pretrained(directory, tokenizer=tokenizer)  # each file written atomically
    return directory


def find_tokenizer(data_dir: Path, info: dict[str, Any], explicit: str | None) -> Path | None:
    """The tokenizer the shards were made with: given, recorded in dataset.json, or DATA/tokenizer.

    A candidate whose vocabulary differs from the one the data records (by SHA-1) is refused.
    """
    candidates = [explicit, info.get("tokenizer_dir"), info.get("tokenizer", {}).get("directory"),
                  str(data_dir / "tokenizer")]
    for candidate in candidates:
        if candidate and has_tokenizer(Path(candidate)):
            path = Path(candidate)
            recorded = info.get("tokenizer", {}).get("vocab_sha1")
            if recorded and _vocab_sha1(path) != recorded:
                if candidate == explicit:
                    raise ValueError(f"{path}: its vocabulary is not the one the data in {data_dir} was made with")
                continue
            return path
    return None


# the files a tokenizer directory of some family holds (WordPiece, byte-level BPE, SentencePiece, any tokenizer.json)
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json", "sentencepiece.bpe.model", "spiece.model", "spm.model")


def has_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer's files, of any family."""
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def _vocab_sha1(directory: Path) -> str:
    """The digest `prepare` records: the tokens in id order, joined by newlines."""
    from bertforge.tokenizer import BertTokenizer

    vocab = BertTokenizer.from_pretrained(directory).vocab
    return hashlib.sha1("\n".join(sorted(vocab, key=vocab.__getitem__)).encode("utf-8")).hexdigest()


__all__ = ["CONTEXT_VARIANTS", "DataOptions", "PretrainResult", "Recipe", "context_variants", "dropout_rates",
           "freeze_all_but_heads", "load_recipe", "mlm_context_probe", "pretrain", "pretraining_metrics",
           "random_init_like", "restore_dropout", "training_config", "validation_evaluator"]
