"""A pre-training run: a recipe and prepared shards -> a run directory (checkpoints, metrics.jsonl,
run_config.yaml, final/), through the one training loop; what a resumed run must keep the same."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bertforge.config import ModelConfig
from bertforge.fileio import run_lock, write_text_atomic
from bertforge.pretrain.card import write_run_card
from bertforge.pretrain.models import export_final, initialise_from, objective_config, pretraining_model
from bertforge.pretrain.recipe import Recipe, model_config
from bertforge.pretrain.rules import freeze_all_but_heads, restore_dropout, training_config
from bertforge.pretrain.shards import (
    find_tokenizer,
    path_beside,
    read_dataset_info,
    training_batches,
    validation_evaluator,
)
from bertforge.recipe import RUN_CONFIG_FILE, resolve
from bertforge.train.rundir import (
    RECORD_FILE,
    RunInput,
    check_run_record,
    clear_run,
    directory_input,
    read_run_record,
    write_run_record,
)

if TYPE_CHECKING:
    from bertforge.train import TrainResult
    from bertforge.train.distributed import DistContext


log = logging.getLogger("bertforge.pretrain")  # the package's name, which users filter logs by


@dataclass
class PretrainResult:
    final: Path | None  # RUN/final (None on ranks other than 0)
    train: TrainResult


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
    name recipe fields (see `bertforge.pretrain.recipe`). Under torchrun every rank calls this.
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
        max_len = max(max_len, read_dataset_info(path_beside(data_dir, recipe.data.long_data))["options"]["max_seq_length"])
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
        inputs.append(directory_input("long_data", path_beside(data_dir, recipe.data.long_data), ("dataset.json",)))
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
