"""Fine-tuning and prediction: a task's declarations (`bertforge.tasks`) driven by THE training loop.

    from bertforge.finetune import finetune, predict
    results = finetune("glue", "RTE", "models/minilm", "data/glue", "runs/rte", seeds=(1, 2, 3), lr=2e-5)
    predict("glue", "RTE", "runs/rte/seed-1", "data/glue", "submission/")

`finetune` reads the task's train and dev splits, turns them into features once, and for each seed
loads the pre-trained encoder with the task's new output layer, trains it with `bertforge.train.train`
(AdamW with BERT's weight-decay exclusions, linear warm-up over `warmup` of the steps, then linear
decay to zero; the paper's batch 32, 3 epochs), scoring the dev split(s) after every epoch. The
defaults are the paper's: lr 2e-5 (GLUE, SWAG), 5e-5 (NER, SQuAD), max length 128 (384 for SQuAD).
Batches are padded to their longest row and drawn from length buckets (`tasks.base.TaskBatches`).

Files, per run directory `out_dir`:

    seed-N/                 the fine-tuned model in Hugging Face layout (config.json with id2label,
                            model.safetensors, tokenizer files): loads in `transformers` as is
    seed-N/task.json        family, task, max_length, task settings (SQuAD v2.0: the tuned null
                            threshold), label names, final dev metrics, steps, wall time
    seed-N/<dev predictions> the task's prediction files for the dev split(s)
    seed-N/run/             the loop's metrics.jsonl (train loss, lr, dev metrics per epoch)
    results.json            hyper-parameters, per-seed metrics, and mean / std / median across seeds

A seed whose `task.json` already holds metrics is reused, not retrained, so an interrupted multi-seed
run can be started again with the same command. `predict` loads a fine-tuned `seed-N` directory and
writes the task's submission files for its test splits (GLUE leaderboard .tsv files, SQuAD
predictions.json and null_odds.json, CoNLL word/gold/predicted lines, SWAG csv).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.tasks import FAMILIES, make_task
from bertforge.tasks.base import Task, TaskBatches, run_model, subsample

TASK_FILE = "task.json"
RESULTS_FILE = "results.json"


def _say(message: str, verbose: bool) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


def summarize(per_seed: Sequence[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation (0 for one seed), median and values of each metric across seeds."""
    summary: dict[str, dict[str, Any]] = {}
    for key in per_seed[0] if per_seed else []:
        values = [float(m[key]) for m in per_seed if key in m and math.isfinite(float(m[key]))]
        if not values:
            continue
        summary[key] = {"mean": statistics.fmean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "median": statistics.median(values), "values": values}
    return summary


class _Evaluator:
    """The loop's `evaluate` callback: predicts every eval split and keeps the last outputs."""

    def __init__(self, task: Task, splits: dict[str, tuple[list[Any], list[Any]]], label_names: list[str] | None,
                 batch_size: int, pad_id: int) -> None:
        self.task, self.splits, self.label_names = task, splits, label_names
        self.batch_size, self.pad_id = batch_size, pad_id
        self.outputs: dict[str, list[dict[str, np.ndarray]]] = {}

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
            prefix = f"{split}_" if len(self.splits) > 1 else ""
            metrics.update({prefix + k: float(v) for k, v in scores.items()})
        return metrics


def finetune(
    task_family: str,
    task: str,
    model_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    seeds: Sequence[int] = (1,),
    lr: float | None = None,
    batch_size: int = 32,
    epochs: float = 3.0,
    warmup: float = 0.1,
    max_length: int | None = None,
    weight_decay: float = 0.01,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    eval_batch_size: int = 64,
    eval_every_epoch: bool = True,
    task_settings: dict[str, Any] | None = None,
    precision: str = "fp32",
    reinit_layers: int = 0,
    device: str | None = None,
    keep_checkpoints: bool = False,
    progress: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Fine-tune `model_dir` on a task once per seed; returns (and writes) `out_dir/results.json`'s content.

    `task_family` is glue / ner / squad / swag and `task` the task within it ("SST-2", "MNLI",
    "conll2003", "v1.1", "v2.0", "swag"). `lr` and `max_length` default to the family's (see the
    module doc). `max_train_examples` trains on a fixed random sub-sample (the same for every seed);
    `max_eval_examples` scores the first N dev examples. `task_settings` sets task options (SQuAD:
    `doc_stride`, `max_query_length`, `n_best`, `max_answer_length`, `null_threshold`,
    `train_articles`; NER: `stride`). `precision` is the loop's (fp32, bf16, fp16 on GPU).
    `reinit_layers` re-initialises the top N encoder layers (and the pooler) before fine-tuning, as in
    Zhang et al. 2021 ("Revisiting Few-sample BERT Fine-tuning"); N = L keeps only the embeddings.
    """
    from bertforge.tokenizer import BertTokenizer
    from bertforge.train import OptimConfig, TrainConfig, train
    from bertforge.train.state import seed_everything

    started = time.perf_counter()
    spec = make_task(task_family, task, task_settings)
    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    if not seeds:
        raise ValueError("at least one seed is needed")
    if batch_size < 1 or epochs <= 0 or not 0 <= warmup < 1:
        raise ValueError(f"invalid batch_size={batch_size}, epochs={epochs} or warmup={warmup}")
    if reinit_layers < 0:
        raise ValueError(f"reinit_layers must be 0 or more, got {reinit_layers}")
    lr = spec.default_lr if lr is None else lr
    max_length = spec.default_max_length if max_length is None else max_length
    tokenizer = BertTokenizer.from_pretrained(model_dir)

    train_examples = subsample(spec.read(data_dir, spec.train_split), max_train_examples)
    labels = spec.label_names(train_examples)
    label_list = labels if isinstance(labels, list) else None
    train_features = spec.featurize(train_examples, tokenizer, max_length, label_names=label_list)
    if not train_features:
        raise ValueError(f"{data_dir}: no training examples for {spec.family} {spec.name}")
    eval_sets = {}
    for split in spec.eval_splits():
        examples = spec.read(data_dir, split)
        examples = examples[:max_eval_examples] if max_eval_examples else examples
        eval_sets[split] = (examples, spec.featurize(examples, tokenizer, max_length, label_names=label_list))
    _say(f"{spec.family} {spec.name}: {len(train_examples)} training examples -> {len(train_features)} features; "
         + ", ".join(f"{s}: {len(e)} examples" for s, (e, _) in eval_sets.items()), verbose)

    hyper = {"lr": lr, "batch_size": batch_size, "epochs": epochs, "warmup": warmup, "max_length": max_length,
             "weight_decay": weight_decay, "max_train_examples": max_train_examples,
             "max_eval_examples": max_eval_examples, "precision": precision, "schedule": "linear",
             "optimizer": "adamw", "adam_eps": 1e-6, "max_grad_norm": 1.0, "task_settings": spec.settings}
    if reinit_layers:  # only when set, so that earlier runs' saved hyper-parameters still match
        hyper["reinit_layers"] = reinit_layers
    hyper = json.loads(json.dumps(hyper))  # as it reads back from a file, to compare with saved runs
    base_settings = dict(spec.settings)
    runs = []
    for seed in seeds:
        seed_dir = out_dir / f"seed-{seed}"
        spec.settings = dict(base_settings)  # each seed tunes its own (SQuAD v2.0's null threshold)
        saved = _read_json(seed_dir / TASK_FILE)
        if saved.get("metrics") and saved.get("hyperparameters") == hyper:
            _say(f"seed {seed}: already done in {seed_dir}, reusing its metrics", verbose)
            runs.append({"seed": seed, "metrics": saved["metrics"], "steps": saved.get("steps"),
                         "wall_s": saved.get("wall_s"), "dir": seed_dir.name})
            continue
        seed_started = time.perf_counter()
        seed_everything(seed)  # the new output layer's initialisation depends on the seed
        overrides = {}
        if labels is not None:
            names = [f"LABEL_{i}" for i in range(labels)] if isinstance(labels, int) else list(labels)
            overrides = {"id2label": {str(i): n for i, n in enumerate(names)},
                         "label2id": {n: i for i, n in enumerate(names)}}
        model = load_for_task(spec.head, model_dir, **overrides)
        reinitialize_top_layers(model, reinit_layers)
        batches = TaskBatches(train_features, batch_size, seed=seed, pad_id=tokenizer.pad_token_id)
        steps_per_epoch = len(batches)
        max_steps = max(1, math.ceil(steps_per_epoch * epochs))
        evaluator = _Evaluator(spec, eval_sets, label_list, eval_batch_size, tokenizer.pad_token_id)
        loop_config = TrainConfig(max_steps=max_steps, seed=seed, precision=precision, device=device,
                                  eval_every=steps_per_epoch if eval_every_epoch else 0, save_every=0, keep_last=1,
                                  log_every=max(1, min(50, steps_per_epoch // 5)), progress=progress)
        optim = OptimConfig(lr=lr, weight_decay=weight_decay, warmup_ratio=warmup, schedule="linear")
        _say(f"seed {seed}: {max_steps} steps ({steps_per_epoch} per epoch) -> {seed_dir}", verbose)
        result = train(model, batches, seed_dir / "run", loop_config, optim, evaluate=evaluator, resume=True)
        metrics = result.metrics if evaluator.outputs else evaluator(model)

        tuned = spec.tune(*_first_labelled(spec, evaluator))
        if tuned:  # e.g. SQuAD v2.0's null threshold: the dev predictions are made again with it
            spec.settings.update(tuned)
            metrics = {**metrics, **{k: float(v) for k, v in evaluator.scores().items() if not k.startswith("best_")}}
        model.save_pretrained(seed_dir, tokenizer=tokenizer)
        for split, (examples, _) in eval_sets.items():
            spec.write_predictions(examples, evaluator.predictions(split), seed_dir, split)
        wall = time.perf_counter() - seed_started
        record = {"family": spec.family, "task": spec.name, "seed": seed, "max_length": max_length,
                  "settings": dict(spec.settings), "labels": label_list, "metrics": metrics, "steps": result.step,
                  "wall_s": round(wall, 1), "hyperparameters": hyper, "source_model": str(model_dir)}
        _write_json(seed_dir / TASK_FILE, record)
        if not keep_checkpoints:
            shutil.rmtree(seed_dir / "run" / "checkpoints", ignore_errors=True)
        _say(f"seed {seed}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + f"  ({wall:.0f} s)", verbose)
        runs.append({"seed": seed, "metrics": metrics, "steps": result.step, "wall_s": round(wall, 1),
                     "dir": seed_dir.name})
        del model

    results = {
        "family": spec.family, "task": spec.name, "model": str(model_dir), "data": str(data_dir),
        "hyperparameters": hyper, "train_examples": len(train_examples), "train_features": len(train_features),
        "eval_examples": {split: len(e) for split, (e, _) in eval_sets.items()},
        "seeds": runs, "summary": summarize([r["metrics"] for r in runs]),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    _write_json(out_dir / RESULTS_FILE, results)
    return results


def _first_labelled(task: Task, evaluator: _Evaluator) -> tuple[list[Any], list[Any]]:
    """The first eval split with labels and its predictions (what `Task.tune` learns from)."""
    for split, (examples, _) in evaluator.splits.items():
        if task.has_labels(examples) and split in evaluator.outputs:
            return examples, evaluator.predictions(split)
    return [], []


def predict(
    task_family: str,
    task: str,
    model_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    splits: Sequence[str] | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    task_settings: dict[str, Any] | None = None,
    device: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Write a fine-tuned model's predictions for `splits` (default: the task's test splits) to `out_dir`.

    Settings saved in the model's `task.json` (max length, SQuAD's doc_stride and tuned null
    threshold) are used unless given here. Returns {split: {"files": [...], "metrics": {...}}}, with
    metrics for splits that have labels. MNLI's AX split is skipped when the data has no AX file.
    """
    import torch

    from bertforge.tokenizer import BertTokenizer

    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    saved = _read_json(model_dir / TASK_FILE)
    settings = {**saved.get("settings", {}), **(task_settings or {})}
    spec = make_task(task_family, task, settings)
    if saved and (saved.get("family"), saved.get("task")) != (spec.family, spec.name):
        raise ValueError(f"{model_dir} was fine-tuned for {saved.get('family')} {saved.get('task')}, "
                         f"not {spec.family} {spec.name}")
    max_length = max_length or saved.get("max_length") or spec.default_max_length
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    model = load_for_task(spec.head, model_dir)
    if model.load_report is not None and model.load_report.new_heads:
        raise ValueError(f"{model_dir} has no trained {spec.head.__name__} output layer "
                         f"({', '.join(model.load_report.new_heads)} would be random); fine-tune it first")
    model.to(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    id2label = model.config.extra.get("id2label")
    label_names = [id2label[str(i)] for i in range(len(id2label))] if id2label else None

    done: dict[str, dict[str, Any]] = {}
    for split in splits or spec.test_splits():
        try:
            examples = spec.read(data_dir, split)
        except FileNotFoundError:
            if split == "ax" and not splits:
                continue
            raise
        features = spec.featurize(examples, tokenizer, max_length, label_names=label_names)
        outputs = run_model(model, features, spec.output_names, token_outputs=spec.token_outputs,
                            batch_size=batch_size, pad_id=tokenizer.pad_token_id)
        predictions = spec.postprocess(examples, features, outputs, label_names=label_names)
        files = spec.write_predictions(examples, predictions, out_dir, split)
        metrics = spec.metric(examples, predictions) if spec.has_labels(examples) else {}
        done[split] = {"files": [str(f) for f in files], "metrics": metrics, "examples": len(examples)}
    return done


def load_for_task(head: type, model_dir: str | Path, **config_overrides: Any) -> Any:
    """`head.from_pretrained(model_dir, **config_overrides)`: a checkpoint under a task head.

    What such a load may find is declared on the head classes and applied by `bertforge.checkpoint`:
    a pooler in the file is fine for a head that has none (token classification and span QA read
    every token, not the pooled [CLS]), as in `transformers`; any other missing or unexpected key
    raises `CheckpointError`.
    """
    return head.from_pretrained(model_dir, **config_overrides)


def reinitialize_top_layers(model: Any, count: int) -> None:
    """Give the top `count` distinct encoder layers, and the pooler if there is one, fresh BERT weights.

    Pre-trained top layers are specialised to the pre-training objective; starting them afresh can
    fine-tune better on small data (Zhang et al. 2021). With ALBERT's sharing the distinct layers are
    the shared groups, so `count` cannot exceed `num_hidden_groups`.
    """
    if count == 0:
        return
    layers = model.bert.encoder.layers
    if count > len(layers):
        raise ValueError(f"reinit_layers={count}, but the encoder has {len(layers)} distinct layers")
    modules = list(layers[len(layers) - count:])
    if model.bert.pooler is not None:
        modules.append(model.bert.pooler)
    model.init_modules(*modules)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write_json(path: Path, value: Any) -> None:
    from bertforge.fileio import write_text_atomic

    write_text_atomic(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


__all__ = ["FAMILIES", "RESULTS_FILE", "TASK_FILE", "finetune", "load_for_task", "predict",
           "reinitialize_top_layers", "summarize"]
