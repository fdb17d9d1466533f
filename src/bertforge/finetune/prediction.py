"""Predictions of a fine-tuned model for a task's splits, written as the task's files with their metrics.

    from bertforge.finetune import predict
    predict("glue", "RTE", "runs/rte/seed-1", "data/glue", "submission/")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bertforge.finetuned import TaskRecord, check_max_length, load_for_inference
from bertforge.tasks import make_task
from bertforge.tasks.base import run_batches, run_model, task_title

if TYPE_CHECKING:
    import torch


class RowEngine(Protocol):
    """What runs a model's rows in its place (`bertforge.engine.OnnxEngine`): a batch of int64
    `input_ids`, `attention_mask`, `token_type_ids` to the head's outputs by name."""

    def run(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class ChosenEngine(Protocol):
    """The engine choice `predict` records (`bertforge.engine.EngineChoice`)."""

    engine: str
    precision: str

    def as_dict(self) -> dict[str, Any]: ...


class PredictEngine(Protocol):
    """An engine asked for by name, made ready for a model `predict` loaded (`bertforge.engine.EngineRequest`).

    Named here by its shape only: finetune sits below the engine layer (tests/test_layering.py), so the
    caller that knows the engines hands one in."""

    def prepare(self, model: Any, precision: str, *, model_dir: Path, batch_size: int, max_length: int,
                device: str) -> tuple[ChosenEngine, RowEngine | None]: ...


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
    precision: str = "fp32",
    engine: PredictEngine | None = None,
) -> dict[str, dict[str, Any]]:
    """Write a fine-tuned model's predictions for `splits` (default: the task's test splits) to `out_dir`.

    Settings saved in the model's `task.json` (max length, SQuAD's doc_stride and tuned null
    threshold) are used unless given here. `precision` is fp32, bf16, int8 or auto
    (`bertforge.precision`). Returns {split: {"files": [...], "metrics": {...}, "precision": ...}},
    with metrics for splits that have labels, and writes the same as `metrics.json` in `out_dir` with
    the CPU it ran on. MNLI's AX split is skipped when the data has no AX file.

    `engine` (`bertforge.engine.EngineRequest("onnxruntime")`, or auto, or torch) runs the model rows
    through the engine it chooses; the task's reader, features, post-processing and metric stay the
    same, and each split and metrics.json also say which engine ran and why. Without it the model runs
    itself at `precision`, as fine-tuning scored it.
    """
    import torch

    from bertforge.model.base import label_names as config_label_names
    from bertforge.precision import cpu_description

    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    saved = TaskRecord.read(model_dir) or TaskRecord()
    spec = make_task(task_family, task, {**saved.settings, **(task_settings or {})})
    if saved.family and (saved.family, saved.task) != (spec.family, spec.name):
        raise ValueError(f"{model_dir} was fine-tuned for {task_title(saved.family, saved.task or '')}, "
                         f"not {task_title(spec.family, spec.name)}")
    max_length = max_length or saved.max_length or spec.default_max_length
    check_max_length(model_dir, max_length)
    choice: ChosenEngine | None = None
    runner: RowEngine | None = None
    if engine is None:
        loaded = load_for_inference(model_dir, precision, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                                    job=spec.job)
        used = loaded.precision
    else:
        # ONNX Runtime exports the fp32 weights and runs on the CPU: load those there, and let the
        # request put the model at the precision its engine runs
        device = device or "cpu"
        loaded = load_for_inference(model_dir, "fp32", device, job=spec.job)
        choice, runner = engine.prepare(loaded.model, precision, model_dir=model_dir, batch_size=batch_size,
                                        max_length=max_length, device=device)
        used = choice.precision
    model, tokenizer = loaded.model, loaded.tokenizer
    label_names = config_label_names(model.config) or None

    def engine_rows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        assert runner is not None
        found = runner.run(batch)
        return {name: found[name] for name in spec.output_names}

    done: dict[str, dict[str, Any]] = {}
    for split in splits or spec.test_splits():
        try:
            examples = spec.read(data_dir, split)
        except FileNotFoundError:
            if split == "ax" and not splits:
                continue
            raise
        features = spec.featurize(examples, tokenizer, max_length, label_names=label_names)
        if runner is None:
            outputs = run_model(model, features, spec.output_names, token_outputs=spec.token_outputs,
                                batch_size=batch_size, pad_id=tokenizer.pad_token_id)
        else:
            outputs = run_batches(features, engine_rows, token_outputs=spec.token_outputs, batch_size=batch_size,
                                  pad_id=tokenizer.pad_token_id)
        predictions = spec.postprocess(examples, features, outputs, label_names=label_names)
        files = spec.write_predictions(examples, predictions, out_dir, split)
        metrics = spec.metric(examples, predictions) if spec.has_labels(examples) else {}
        done[split] = {"files": [str(f) for f in files], "metrics": metrics, "examples": len(examples),
                       "precision": used}
        if choice is not None:
            done[split]["engine"] = choice.engine
    out_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"model": str(model_dir), "task": f"{spec.family} {spec.name}", "precision": used,
                              "precision_requested": precision}
    if choice is not None:
        record["engine"] = choice.as_dict()
    write_json(out_dir / "metrics.json", {**record, **cpu_description(), "splits": done})
    return done


def write_json(path: Path, value: Any) -> None:
    """`value` as indented JSON, written atomically."""
    from bertforge.fileio import write_text_atomic

    write_text_atomic(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")
