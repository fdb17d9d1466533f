"""The fine-tuning run: a recipe, a model and a task's data in; a fine-tuned model per seed and their scores out.

A run is described by a `FinetuneRecipe` (the task, the model and data, the seeds, an optimiser
section and a loop section), read from YAML (`recipes/finetune/*.yaml` hold the paper's settings per
task) or given as keyword settings; where it leaves a setting empty, the task's declaration decides
(learning rate 2e-5 for GLUE and SWAG, 5e-5 for NER and SQuAD, for BERT-base's width and x 768 / H
for a narrower model, `Task.learning_rate_for`; max length 128, 384 for SQuAD; batch
32, 16 for SWAG). `finetune` reads the task's train and dev splits, turns them into features once,
and for each seed loads the pre-trained encoder with the task's new output layer, trains it with
`bertforge.train.train` (AdamW with BERT's weight-decay exclusions, linear warm-up then linear decay
to zero; 3 epochs), scoring the dev split(s) after every epoch (or every `eval_every_steps` steps).
Batches are padded to their longest row and drawn at random, as in BERT's own code and transformers'
Trainer (`group_by_length` draws them from length buckets instead: less padding and faster, at no
quality difference measured on the full STS-B set over 5 seeds, see docs/research/research-log.md).

Model selection: every evaluation is scored by the task's main metric (`Task.main_metric`: MRPC F1,
STS-B Pearson, CoLA Matthews, CoNLL entity F1, SQuAD F1, else accuracy; `selection_metric` picks
another). The best evaluation's model is kept in `seed-N/best/` beside the final one, and with
`patience` N the run stops after N evaluations in a row without improvement. `holdout` N (or a
fraction) keeps a fixed random part of the training set out of training and scores it beside dev as
the split `holdout` (metrics `holdout_<name>`): the same part for any settings, so a configuration
chosen on dev (`bertforge.search`) gets a score that the choosing did not flatter.

Files, per run directory `out_dir`:

    run_config.yaml         the resolved recipe: `bertforge finetune FAMILY --config OUT/run_config.yaml`
                            repeats the run
    seed-N/                 the fine-tuned model in Hugging Face layout (config.json with id2label,
                            model.safetensors, tokenizer files): loads in `transformers` as is
    seed-N/task.json        family, task, max_length, task settings (SQuAD v2.0: the tuned null
                            threshold), label names, final dev metrics, steps, wall time, and the
                            resolved settings (`hyperparameters`)
    seed-N/<dev predictions> the task's prediction files for the dev split(s); for the own-data families
                            also their --test file's, predicted by the final model (`Task.final_splits`)
    seed-N/best/            the model of the best evaluation, laid out like seed-N/ (its task.json
                            says the step, epoch, metric and score it was selected at); when that was
                            the last evaluation, its weights are a hard link to seed-N's (one copy)
    seed-N/run/             the loop's metrics.jsonl (train loss, lr, dev metrics per evaluation) and,
                            while the seed trains, its newest checkpoints (`keep_last`)
    fingerprint.json        the settings and inputs (model files, data) the run was started with
    results.json            hyper-parameters, per-seed metrics, and mean / std / median across seeds
                            (`test_summary`: the same for a labelled --test file)

A seed whose `task.json` already holds metrics for the same settings is reused, not retrained, and a
seed interrupted mid-run continues from its newest checkpoint (`save_every_steps`, and every
`save_every_minutes` of training), so an interrupted run is finished by the same command. A rerun
with other settings or inputs than `OUT/fingerprint.json` records is refused, naming them, unless
`overwrite`; and one run at a time holds `OUT` (docs/guarantees.md). `predict` loads a fine-tuned
`seed-N` directory and writes the task's submission files for its test splits (GLUE leaderboard .tsv
files, SQuAD predictions.json and null_odds.json, CoNLL word/gold/predicted lines, SWAG csv).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

from bertforge.fileio import run_lock
from bertforge.finetune.devsplit import DEV_SPLIT_FILE, held_out_dev, split_holdout, write_dev_split
from bertforge.finetune.evaluation import BEST_DIR, BestModel, Evaluator, first_labelled, main_metric_key
from bertforge.finetune.loading import (
    check_task_head,
    load_for_task,
    model_hidden_size,
    reinitialize_top_layers,
)
from bertforge.finetune.prediction import write_json
from bertforge.finetune.recipe import (
    RESULTS_FILE,
    FinetuneRecipe,
    hyperparameters,
    resolve_dev_fraction,
    summarize,
)
from bertforge.finetune.runrecord import eval_split_report, link_same_weights, run_inputs, save_run_config
from bertforge.finetune.scores import (
    HOLDOUT_SPLIT,
    best_line,
    best_model,
    metric_splits,
    named_scores,
    one_class_warnings,
    overlap_notes,
)
from bertforge.finetune.setfit import body_steps_per_epoch, pair_count, train_setfit
from bertforge.finetuned import TaskRecord, check_max_length, check_tokenizer_fits
from bertforge.hub import resolve_local_or_hub
from bertforge.model.task_heads import TASK_HEAD_KEY
from bertforge.modelcard import command_line, write_model_card
from bertforge.recipe import RUN_CONFIG_FILE
from bertforge.recipe import override as recipe_override
from bertforge.sentence_config import brought_max_length
from bertforge.tables import tsv_quoting
from bertforge.tasks import make_task
from bertforge.tasks.base import Task, TaskBatches, run_model, subsample, task_title
from bertforge.train.config import TrainConfig
from bertforge.train.rundir import (
    RECORD_FILE,
    check_run_record,
    clear_run,
    flat_settings,
    mismatch_error,
    read_run_record,
    same_settings,
    setting_differences,
    write_run_record,
)

# what --overwrite clears in a run directory before starting again
_RUN_STATE = ("seed-*", RESULTS_FILE, RUN_CONFIG_FILE, RECORD_FILE)
# batches per length-sorted group with group_by_length (transformers' LengthGroupedSampler uses 50 too)
LENGTH_GROUP_BATCHES = 50


def _say(message: str, verbose: bool) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


def finetune(
    task_family: str | FinetuneRecipe,
    task: str | None = None,
    model_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    verbose: bool = True,
    overwrite: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune a checkpoint on a task once per seed; returns (and writes) `out_dir/results.json`'s content.

    Either a `FinetuneRecipe` and `out_dir`, or the family ("glue", "ner", "squad", "swag"), the task
    within it ("SST-2", "MNLI", "conll2003", "v1.1", "v2.0", "swag"), the model and data paths, and
    any recipe settings by name (`lr=3e-5`, `epochs=2`, `seeds=(1, 2)`, `task_settings={...}`: see
    `FinetuneRecipe`, `FinetuneOptim`, `FinetuneLoop`). Empty settings take the task's defaults.
    `progress` and `verbose` change what is shown, not what is computed. `overwrite` clears what an
    earlier run left in `out_dir` first (see `run_finetune`).
    """
    if isinstance(task_family, FinetuneRecipe):
        recipe = recipe_override(task_family, settings, source="finetune()") if settings else task_family
    else:
        base = FinetuneRecipe(family=task_family, task=task,
                              model=None if model_dir is None else str(model_dir),
                              data=None if data_dir is None else str(data_dir))
        recipe = recipe_override(base, settings, source="finetune()")
    if out_dir is None:
        raise ValueError("finetune needs an output directory (out_dir)")
    return run_finetune(recipe, Path(out_dir), progress=progress, verbose=verbose, overwrite=overwrite)


def _adapted_first(recipe: FinetuneRecipe, spec: Task, out_dir: Path, progress: bool, verbose: bool,
                   overwrite: bool) -> Path:
    """`adapt_on`: the model continued on the text first, in OUT/adapted; returns the adapted model."""
    from bertforge.adapt import adapt_before_finetuning

    data_dir = None if recipe.data is None else Path(recipe.data)
    return adapt_before_finetuning(
        recipe.model, recipe.adapt_on, out_dir, train_examples=lambda: spec.read(data_dir, spec.train_split),
        text_column=spec.settings.get("text_column") or "text", budget_minutes=recipe.adapt_minutes,
        epochs=recipe.adapt_epochs, seed=recipe.seeds[0], overwrite=overwrite, progress=progress,
        echo=print if verbose else None)


def run_finetune(recipe: FinetuneRecipe, out_dir: Path, *, progress: bool = True, verbose: bool = True,
                 overwrite: bool = False) -> dict[str, Any]:
    """Run a fine-tuning recipe into `out_dir` (see the module docstring for the files).

    The run holds `out_dir`'s lock throughout (`bertforge.fileio.run_lock`: a second run on it is
    refused, naming the holder's pid). What `out_dir` already holds is continued (finished seeds
    reused, an interrupted seed resumed from its newest checkpoint) only if it was started with the
    same settings and inputs (`OUT/fingerprint.json`); otherwise a `RunMismatchError` names the
    differences, unless `overwrite`, which clears the earlier run's seeds and records first.
    """
    with run_lock(out_dir, what="fine-tuning run"), tsv_quoting(recipe.quoting):
        return _run_finetune(recipe, out_dir, progress=progress, verbose=verbose, overwrite=overwrite)


def _run_finetune(recipe: FinetuneRecipe, out_dir: Path, *, progress: bool, verbose: bool,
                  overwrite: bool) -> dict[str, Any]:
    from bertforge.model import label_maps
    from bertforge.tokenizer import BertTokenizer
    from bertforge.train import ModelSelection, train
    from bertforge.train.state import latest_checkpoint, seed_everything

    started = time.perf_counter()
    spec = make_task(recipe.family, recipe.task, recipe.task_settings)
    if recipe.model is None or (recipe.data is None and spec.reads_data_dir):
        raise ValueError(f"the recipe names no {'model' if recipe.model is None else 'data'} "
                         "(give --model and --data, or model: and data: in the recipe)")
    if not spec.reads_data_dir and not spec.settings.get("train"):
        raise ValueError(f"finetune {spec.family} needs a training file: give --train FILE (and --dev FILE, or a "
                         "part of the training file is held out as the dev split)")
    resolve_dev_fraction(spec, recipe.train.dev_fraction)  # a dev file and --dev-fraction together: refused now
    # adapt_on: the model fine-tuned is the adapted one; the recipe keeps naming the one it started from
    adapted = _adapted_first(recipe, spec, out_dir, progress, verbose, overwrite) if recipe.adapt_on else None
    resolved = resolve_local_or_hub(recipe.model)  # a Hub name: its snapshot, repository and commit
    source = resolved.provenance()
    model_dir = adapted if adapted is not None else resolved.path
    recipe, length_from = _with_model_settings(recipe, spec, model_dir)
    recipe = recipe.resolved(spec, model_hidden_size(model_dir))
    loop, optim = recipe.train, recipe.optim
    data_dir = None if recipe.data is None else Path(recipe.data)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    check_tokenizer_fits(tokenizer, model_dir)

    train_examples, dev_split = held_out_dev(spec, spec.read(data_dir, spec.train_split), loop)
    train_examples, held_out = split_holdout(train_examples, loop.holdout)
    train_examples = subsample(train_examples, loop.max_train_examples)
    labels = spec.label_names(train_examples)
    label_list = labels if isinstance(labels, list) else None
    train_features = spec.featurize(train_examples, tokenizer, loop.max_length, label_names=label_list)
    if not train_features:
        raise ValueError(f"{data_dir}: no training examples for {task_title(spec.family, spec.name)}")
    eval_sets = {}
    for split in spec.eval_splits():
        examples = dev_split if split == "dev" and dev_split is not None else spec.read(data_dir, split)
        examples = examples[:loop.max_eval_examples] if loop.max_eval_examples else examples
        eval_sets[split] = (examples, spec.featurize(examples, tokenizer, loop.max_length, label_names=label_list))
    if held_out:
        eval_sets[HOLDOUT_SPLIT] = (held_out, spec.featurize(held_out, tokenizer, loop.max_length,
                                                             label_names=label_list))
    final_sets = {}  # read (and so checked) now, predicted by the final model
    for split in spec.final_splits():
        examples = spec.read(data_dir, split)
        final_sets[split] = (examples, spec.featurize(examples, tokenizer, loop.max_length, label_names=label_list))
    check_max_length(model_dir, loop.max_length)  # after the data's own checks, before any training
    check_task_head(loop, spec.job, model_dir)
    _say(f"max_length {loop.max_length} pieces per input: {length_from}", verbose)
    split_report = eval_split_report(train_examples, {split: e for split, (e, _) in eval_sets.items()})
    for line in overlap_notes(split_report):
        _say(line, verbose)
    _say(f"{task_title(spec.family, spec.name)}: {len(train_examples)} training examples -> {len(train_features)} features; "
         + ", ".join(f"{s}: {len(e)} examples" for s, (e, _) in {**eval_sets, **final_sets}.items()), verbose)
    if dev_split is not None:
        _say(f"no dev file: dev is {loop.dev_fraction:g} of the training file ({len(dev_split)} examples, "
             f"dev_seed {loop.dev_seed}), held out of training; written to {out_dir / DEV_SPLIT_FILE}", verbose)

    recipe = dataclasses.replace(recipe, task_settings=dict(spec.settings))  # as the reader completed them
    hyper = hyperparameters(recipe)
    inputs = run_inputs(spec, model_dir, data_dir, [train_examples, *(e for e, _ in eval_sets.values()),
                                                     *(e for e, _ in final_sets.values())])
    if overwrite:
        clear_run(out_dir, _RUN_STATE)
    else:
        check_run_record(out_dir, hyper, inputs, what="fine-tuning run")
        for seed in recipe.seeds:  # a finished seed is reused with the same settings, and never retrained over
            saved = TaskRecord.read(out_dir / f"seed-{seed}")
            if saved is not None and saved.metrics and not same_settings(saved.hyperparameters or {}, hyper):
                # (a directory from before fingerprint.json: its seeds' task.json still say their settings)
                differ = setting_differences(flat_settings(saved.hyperparameters or {}), flat_settings(hyper))
                raise mismatch_error(out_dir / f"seed-{seed}", differ, "fine-tuned seed")
    if read_run_record(out_dir) is None:
        write_run_record(out_dir, hyper, inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    if dev_split is not None:  # the rows scored as dev, for the user to look at (or give as --dev later)
        write_dev_split(out_dir / DEV_SPLIT_FILE, dev_split)
    data_source = spec.data_sources()  # the Hub data sets read, with their commits
    save_run_config(recipe, out_dir, spec.family, source, data_source)
    base_settings = dict(spec.settings)
    selection_metric = main_metric_key(spec, loop.selection_metric)
    runs = []
    for seed in recipe.seeds:
        seed_dir = out_dir / f"seed-{seed}"
        spec.settings = dict(base_settings)  # each seed tunes its own (SQuAD v2.0's null threshold)
        saved = TaskRecord.read(seed_dir)
        if saved is not None and saved.metrics and same_settings(saved.hyperparameters or {}, hyper):
            _say(f"seed {seed}: already done in {seed_dir}, reusing its metrics", verbose)
            runs.append({"seed": seed, "metrics": saved.metrics, "steps": saved.steps,
                         "wall_s": saved.wall_s, "dir": seed_dir.name, "best": saved.best,
                         **({"test_metrics": saved.test_metrics} if saved.test_metrics else {})})
            continue
        seed_started = time.perf_counter()
        seed_everything(seed)  # the new output layer's initialisation depends on the seed
        overrides = {**(label_maps(labels) if labels is not None else {}), **spec.config_overrides()}
        head = loop.task_head(spec.job)  # None: the family's own head (also over a saved generic one)
        overrides[TASK_HEAD_KEY] = None if head is None else head.to_dict()
        model = load_for_task(spec.job, model_dir, **overrides)
        reinitialize_top_layers(model, loop.reinit_layers)
        spec.configure_model(model, train_examples, label_list)
        model = spec.wrap_model(model, loop.max_length)
        batches = TaskBatches(train_features, loop.batch_size, seed=seed, pad_id=tokenizer.pad_token_id,
                              bucket_batches=LENGTH_GROUP_BATCHES if loop.group_by_length else 1)
        # setfit's steps are its encoder's, on the pairs it makes of the rows
        steps_per_epoch = body_steps_per_epoch(len(train_examples), loop.batch_size) if loop.method == "setfit" \
            else len(batches)
        max_steps = max(1, math.ceil(steps_per_epoch * loop.epochs_for(steps_per_epoch)))
        evaluator = Evaluator(spec, eval_sets, label_list, loop.eval_batch_size, tokenizer.pad_token_id)
        own_splits = [split for split in eval_sets if split != HOLDOUT_SPLIT]
        evaluator.label = split_report[own_splits[0]]["reported_as"] if len(eval_sets) == 1 else ""
        eval_every = loop.eval_every_steps or (steps_per_epoch if loop.eval_every_epoch else 0)
        loop_config = TrainConfig(max_steps=max_steps, seed=seed, precision=loop.precision, device=loop.device,
                                  max_grad_norm=loop.max_grad_norm, eval_every=eval_every,
                                  save_every=loop.save_every_steps, save_every_minutes=loop.save_every_minutes,
                                  keep_last=loop.keep_last, log_every=max(1, min(50, steps_per_epoch // 5)),
                                  progress=progress)
        best = BestModel(seed_dir / BEST_DIR, selection_metric, spec, evaluator, tokenizer, steps_per_epoch,
                          TaskRecord(spec.family, spec.name, seed=seed, max_length=loop.max_length, labels=label_list,
                                     hyperparameters=hyper, source_model=str(model_dir)))
        best.split_report = split_report
        if latest_checkpoint(seed_dir / "run") is None:
            best.clear()  # a fresh start: a best/ left by an unfinished earlier run is not this run's
        selection = ModelSelection(selection_metric, patience=loop.patience,
                                   on_improvement=best.save if loop.save_best else best.remember)
        _say(f"seed {seed}: {max_steps} steps ({steps_per_epoch} per epoch) -> {seed_dir}"
             + (f"; head: {model.spec.describe()}" if head is not None else "")
             + (f"; setfit: the encoder on {pair_count(len(train_examples))} pairs, batch {loop.batch_size}, "
                f"lr {optim.lr:g}" if loop.method == "setfit" else ""), verbose)
        if loop.method == "setfit":  # few labels: pairs -> the encoder -> a logistic head (finetune.setfit)
            model, body_steps = train_setfit(train_examples, label_list or [], model_dir, seed_dir, seed=seed,
                                             max_length=loop.max_length, overwrite=overwrite, progress=progress,
                                             verbose=verbose, finetune=finetune, config=spec.config_overrides(),
                                             settings={**hyper, "device": loop.device})
            result = types.SimpleNamespace(step=body_steps, stopped_early=False, metrics={})
        else:
            result = train(model, batches, seed_dir / "run", loop_config, optim, evaluate=evaluator, resume=True,
                           selection=selection)
        metrics = result.metrics if evaluator.outputs else evaluator(model)
        if result.stopped_early:
            _say(f"seed {seed}: stopped early at step {result.step}: {selection_metric} did not improve in "
                 f"{loop.patience} evaluations", verbose)

        tuned = spec.tune(*first_labelled(spec, evaluator))
        if tuned:  # e.g. SQuAD v2.0's null threshold: the dev predictions are made again with it
            spec.settings.update(tuned)
            metrics = {**metrics, **{k: float(v) for k, v in evaluator.scores().items() if not k.startswith("best_")}}
        model.save_pretrained(seed_dir, tokenizer=tokenizer)
        for split, (examples, _) in eval_sets.items():
            spec.write_predictions(examples, evaluator.predictions(split), seed_dir, split)
        test_metrics = _predict_final(spec, model, final_sets, label_list, seed_dir, loop.eval_batch_size,
                                      tokenizer.pad_token_id)
        wall = time.perf_counter() - seed_started
        record = TaskRecord(spec.family, spec.name, seed=seed, max_length=loop.max_length,
                            settings=dict(spec.settings), labels=label_list, metrics=metrics, steps=result.step,
                            epoch=round(result.step / steps_per_epoch, 3), stopped_early=result.stopped_early,
                            best=best.summary(selection), wall_s=round(wall, 1), hyperparameters=hyper,
                            source_model=str(model_dir), test_metrics=test_metrics or None,
                            extra={"metric_splits": metric_splits([metrics], split_report)})
        record.write(seed_dir)
        if record.best and record.best.get("dir") and record.best.get("step") == result.step:
            link_same_weights(seed_dir, seed_dir / BEST_DIR)  # the final model is the best: one copy on disk
        write_model_card(seed_dir, base_model=source.get("repo_id") or str(recipe.model),
                         base_revision=source.get("commit"), command=command_line())
        if not loop.keep_checkpoints:
            shutil.rmtree(seed_dir / "run" / "checkpoints", ignore_errors=True)
        _say(f"seed {seed}, final model: {named_scores(metrics, split_report)}  ({wall:.0f} s)"
             + best_line(record.best, seed_dir, split_report), verbose)
        seed_warnings = one_class_warnings(spec, evaluator, label_list, seed, result.step, len(train_examples),
                                            split_report, best)
        for warning in seed_warnings:
            _say(f"warning: {warning}", verbose)
        runs.append({"seed": seed, "metrics": metrics, "steps": result.step, "wall_s": round(wall, 1),
                     "dir": seed_dir.name, "best": record.best,
                     **({"test_metrics": test_metrics} if test_metrics else {}),
                     **({"warnings": seed_warnings} if seed_warnings else {})})
        del model

    results = {
        "family": spec.family, "task": spec.name, "model": str(model_dir), **({"model_source": source} if source else {}),
        "data": str(data_dir) if data_dir is not None else {s: spec.settings[s] for s in ("train", "dev", "test")
                                                            if spec.settings.get(s)},
        **({"data_source": data_source} if data_source else {}),
        "hyperparameters": hyper, "train_examples": len(train_examples), "train_features": len(train_features),
        "eval_examples": {split: len(e) for split, (e, _) in eval_sets.items()},
        "eval_splits": split_report, "metric_splits": metric_splits([r["metrics"] for r in runs], split_report),
        "seeds": runs, "summary": summarize([r["metrics"] for r in runs]), "selection_metric": selection_metric,
        "best_summary": summarize([r["best"]["metrics"] for r in runs if r.get("best")]),
        **_test_summary(runs),
        **best_model(runs, split_report, selection_metric),
        **({"warnings": found} if (found := [w for r in runs for w in r.get("warnings", [])]) else {}),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_json(out_dir / RESULTS_FILE, results)
    return results


def _with_model_settings(recipe: FinetuneRecipe, spec: Task, model_dir: Path) -> tuple[FinetuneRecipe, str]:
    """The recipe with the settings the model brings where it leaves them empty (a sentence-transformers
    model's max_seq_length for embed), and where its max_length comes from, in words."""
    brought = spec.model_settings(model_dir)
    if recipe.train.method == "setfit" and not brought.get("max_length"):  # its body is the model's encoder
        brought = {"max_length": brought_max_length(model_dir)}
    if recipe.train.max_length:
        return recipe, "as given"
    if brought.get("max_length"):
        loop = dataclasses.replace(recipe.train, max_length=int(brought["max_length"]))
        return dataclasses.replace(recipe, train=loop), "the model's own (its sentence_bert_config.json); " \
                                                        "--max-length sets another"
    return recipe, f"{task_title(spec.family, spec.name)}'s default; --max-length sets another"



def _predict_final(task: Task, model: Any, final_sets: dict[str, tuple[list[Any], list[Any]]],
                   label_names: list[str] | None, seed_dir: Path, batch_size: int,
                   pad_id: int) -> dict[str, dict[str, float]]:
    """Predict the task's final splits (classify's --test file) with the trained model into `seed_dir`;
    returns {split: metrics} for those with labels."""
    scores = {}
    for split, (examples, features) in final_sets.items():
        outputs = run_model(model, features, task.output_names, token_outputs=task.token_outputs,
                            batch_size=batch_size, pad_id=pad_id)
        predictions = task.postprocess(examples, features, outputs, label_names=label_names)
        task.write_predictions(examples, predictions, seed_dir, split)
        if task.has_labels(examples):
            scores[split] = {k: float(v) for k, v in task.metric(examples, predictions).items()}
    return scores


def _test_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """results.json's `test_summary`: {split: summary across seeds} when the seeds scored a test file."""
    splits = {split for r in runs for split in r.get("test_metrics", {})}
    summary = {split: summarize([r["test_metrics"][split] for r in runs if split in r.get("test_metrics", {})])
               for split in sorted(splits)}
    return {"test_summary": summary} if summary else {}
