"""The fine-tuned model directory: its `task.json` record, and loading it for inference.

A directory written by `bertforge finetune` (`OUT/seed-N/`, `OUT/seed-N/best/`) is a Hugging Face
checkpoint (config.json with the head and `id2label`, model.safetensors, the tokenizer's files) plus
`task.json`: which task family and task it was fine-tuned for, at which max length, with which task
settings (SQuAD's doc stride and tuned null threshold, classify's thresholds), and what fine-tuning
measured. `TaskRecord` reads and writes that file; `load_for_inference` is the one way every reader
of such a directory (predict, the pipeline, serve, leaderboard predictions) loads it: the model at a
precision on a device, its tokenizer and its record.

Any checkpoint without a task.json loads too (record None): the head's class decides what it can do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic
from bertforge.hub import local_or_hub

TASK_FILE = "task.json"


@dataclass
class TaskRecord:
    """task.json: what a fine-tuned model is for and how it was made.

    `family`, `task`, `max_length` and `settings` are what inference needs; the rest records the run
    (seed, metrics, steps, the best evaluation, the hyper-parameters a rerun is compared against).
    Keys this class does not know are kept in `extra` and written back.
    """

    family: str | None = None
    task: str | None = None
    max_length: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    labels: list[str] | int | None = None
    seed: int | None = None
    metrics: dict[str, float] | None = None
    test_metrics: dict[str, dict[str, float]] | None = None
    steps: int | None = None
    step: int | None = None  # best/: the step of the evaluation that chose this model
    epoch: float | None = None
    stopped_early: bool | None = None
    best: dict[str, Any] | None = None
    selection_metric: str | None = None
    score: float | None = None
    wall_s: float | None = None
    hyperparameters: dict[str, Any] | None = None
    source_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        """As task.json holds it: the fields that are set, in a stable order, then the kept extras."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out = {k: v for k, v in values.items() if v is not None or k in ("family", "task", "labels", "best")}
        return {**out, **self.extra}

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> TaskRecord | None:
        """The record of a model directory; None when it has no task.json or one that cannot be read
        (a checkpoint that was not fine-tuned here: its head's class says what it does)."""
        try:
            data = json.loads((Path(directory) / TASK_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_dict(data) if isinstance(data, dict) else None

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write task.json into `directory` (atomically)."""
        path = Path(directory) / TASK_FILE
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")
        return path


@dataclass
class LoadedModel:
    """What `load_for_inference` gives: the model (eval mode, on its device, at its precision), the
    tokenizer, the task.json record (None without one) and the precision used."""

    model: Any
    tokenizer: Any
    record: TaskRecord | None
    precision: str
    directory: Path

    @property
    def job(self) -> str | None:
        return getattr(self.model, "job", None)


def load_for_inference(directory: str | os.PathLike[str], precision: str = "fp32", device: str | None = None, *,
                       job: str | None = None) -> LoadedModel:
    """Load a model directory to predict with: the class its config.json names (or, with `job`, its
    family's class for that job, which must have a trained head), at `precision` (fp32, bf16, int8,
    auto: `bertforge.precision`; a saved int8 copy always runs int8), on `device` (default: where
    torch puts tensors), with its tokenizer and task.json record."""
    from bertforge.checkpoint import CheckpointError
    from bertforge.devices import check_device
    from bertforge.model.auto import load_any, load_for_job
    from bertforge.precision import apply_precision, choose_precision, is_quantized_checkpoint, load_quantized
    from bertforge.tokenizer import BertTokenizer

    directory = local_or_hub(directory)  # a Hub name (`org/name@revision`): its cached snapshot
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such model directory")
    choose_precision(precision)  # an unknown name fails before anything loads
    check_device(device)  # so does a device torch cannot use here
    if is_quantized_checkpoint(directory):
        model = load_quantized(directory)  # its head is the trained one
    elif job is not None:
        model = load_for_job(directory, job)
    else:
        model, _ = load_any(directory)
    report = getattr(model, "load_report", None)
    if job is not None and report is not None and report.new_heads:
        raise CheckpointError(f"{directory} has no trained {job} output layer "
                              f"({', '.join(report.new_heads)} would be random); fine-tune it first")
    tokenizer = BertTokenizer.from_pretrained(directory)
    check_tokenizer_fits(tokenizer, directory, model.config)
    if device:
        model.to(device)
    model.eval()
    from bertforge.quantization_report import fp32_copy_to_measure, report_int8

    fp32 = fp32_copy_to_measure(model, directory, precision, device)
    model, used = apply_precision(model, precision)
    if fp32 is not None and used == "int8":
        report_int8(fp32, model, directory, tokenizer)
    return LoadedModel(model, tokenizer, TaskRecord.read(directory), used, directory)


def check_tokenizer_fits(tokenizer: Any, directory: str | os.PathLike[str], config: Any = None) -> None:
    """Refuse a tokenizer whose ids run past the model's embedding table (an id >= vocab_size has no
    embedding: an index error deep in the model, or a silently wrong row on some devices)."""
    from bertforge.checkpoint import CheckpointError

    if config is None:
        from bertforge.model.registry import read_config_file

        config = read_config_file(Path(directory) / "config.json")
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"{directory}: its tokenizer has {tokenizer.vocab_size} pieces but config.json's "
                              f"vocab_size is {config.vocab_size}: the tokenizer files do not belong to this model")


def check_max_length(directory: str | os.PathLike[str], max_length: int) -> None:
    """Refuse, before any work, inputs longer than the model has positions for: 512 for BERT's learnt
    table; for a rotary model the config's max_position_embeddings (8,192 for modern-base)."""
    from bertforge.model.registry import read_config_file

    path = Path(directory) / "config.json"
    config = read_config_file(path)
    if max_length > config.max_tokens:
        raise ValueError(f"max_length {max_length} exceeds the {config.max_tokens} positions of "
                         f"{path} (max_position_embeddings); use --max-length {config.max_tokens} or less")


__all__ = ["TASK_FILE", "LoadedModel", "TaskRecord", "check_max_length", "check_tokenizer_fits", "load_for_inference"]
