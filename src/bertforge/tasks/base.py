"""What a fine-tuning task declares, and the pieces every task shares.

A task is five declarations (docs/architecture.md): reader ▸ head ▸ collate ▸ metric ▸ post-process. Everything
else (the optimiser, the schedule, checkpoints, logging) is the one training loop in `bertforge.train`,
driven by `bertforge.finetune`. A `Task` subclass says:

    read(data_dir, split)            -> examples          the reader (file:line errors: DataFormatError)
    job, label_names(examples)       -> the model job (its class comes from the checkpoint's family), its output labels
    featurize(examples, tokenizer)   -> [Feature]         model inputs + labels + what post-processing needs
    (collate)                        -> batch dict        dynamic padding, shared by every task (`collate` below)
    postprocess(examples, features, outputs) -> predictions, one per example
    metric(examples, predictions)    -> {name: value}     the official definitions (`tasks.metrics`)
    main_metric                      -> name              the one of them that picks the best model
    write_predictions(...)           -> files             leaderboard / official formats

Shared here: `DataFormatError`, `read_text_lines`, `Feature`, `collate` (padding to the longest row of
the batch), `TaskBatches` (shuffled, length-bucketed, resumable batches for the loop), `run_model`
(inference in length-sorted batches, outputs back in feature order) and `max_context_score` (which of
several overlapping windows sees a token with the most context on both sides).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge import threads
from bertforge.config import IGNORE_INDEX
from bertforge.fileio import DataFormatError, NotUtf8Error, read_utf8_lines
from bertforge.hubdata import dataset_name, resolve_split

if TYPE_CHECKING:
    import torch

    from bertforge.tokenizer import BertTokenizer


def read_text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for each line of a UTF-8 file, without its line ending.

    Lines are split on "\\n" only (a stray \\x1c or \\u2028 inside a sentence stays in it); a UTF-8 BOM
    at the start is dropped; bytes that are not UTF-8 raise `DataFormatError` with their line.
    """
    try:
        lines = read_utf8_lines(path)
    except NotUtf8Error as exc:
        raise DataFormatError(path, exc.line, None, f"not UTF-8 text ({exc.detail})") from None
    yield from enumerate(lines, start=1)


def subsample(examples: Sequence[Any], limit: int | None, seed: int = 0) -> list[Any]:
    """A random `limit` of `examples` in file order, the same for every call with one seed: a stated sub-sample.

    `limit` None or 0, or at least the number of examples, keeps them all.
    """
    if not limit or limit >= len(examples):
        return list(examples)
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=limit, replace=False))
    return [examples[i] for i in keep.tolist()]


# ------------------------------------------------------------------------------------------------
# features and batches
# ------------------------------------------------------------------------------------------------
@dataclass
class Feature:
    """One model input row made from an example (an example may give several: windows).

    `inputs` holds exactly what the head's forward takes: `input_ids` and `token_type_ids` as int
    lists ((C, T) lists of lists for multiple choice), plus the label keys when known (`labels`: an int,
    a float, a per-token int list or a multi-label list of 0.0/1.0 floats; `start_positions` / `end_positions`). `example` is the index of the
    source example; `meta` is whatever the task's post-processing needs (offsets, word map, ...).
    """

    inputs: dict[str, Any]
    example: int
    meta: Any = None

    @property
    def length(self) -> int:
        ids = self.inputs["input_ids"]
        return max(map(len, ids)) if ids and isinstance(ids[0], list) else len(ids)


LABEL_KEYS = ("labels", "start_positions", "end_positions")


def collate(features: Sequence[Feature], pad_id: int = 0, *, with_labels: bool = True) -> dict[str, torch.Tensor]:
    """Stack features into a batch padded to its longest row (dynamic padding).

    input_ids are padded with `pad_id`, token_type_ids with 0, per-token labels with -100;
    `attention_mask` is 1 on real tokens. Multiple-choice rows (C, T) give (B, C, T) tensors.
    """
    import torch

    length = max(f.length for f in features)
    first = features[0].inputs

    def pad(rows: list[list[int]], value: int) -> list[list[int]]:
        return [row + [value] * (length - len(row)) for row in rows]

    def stack(key: str, value: int) -> torch.Tensor:
        if isinstance(first["input_ids"][0], list):  # (B, C, T)
            return torch.tensor([pad(f.inputs[key], value) for f in features], dtype=torch.long)
        return torch.tensor(pad([f.inputs[key] for f in features], value), dtype=torch.long)

    batch = {"input_ids": stack("input_ids", pad_id), "token_type_ids": stack("token_type_ids", 0)}
    if isinstance(first["input_ids"][0], list):
        batch["attention_mask"] = torch.tensor(
            [pad([[1] * len(row) for row in f.inputs["input_ids"]], 0) for f in features], dtype=torch.long)
    else:
        batch["attention_mask"] = torch.tensor(pad([[1] * len(f.inputs["input_ids"]) for f in features], 0),
                                               dtype=torch.long)
    if with_labels:
        for key in LABEL_KEYS:
            if key not in first or first[key] is None:
                continue
            values = [f.inputs[key] for f in features]
            if isinstance(values[0], list) and values[0] and isinstance(values[0][0], float):
                batch[key] = torch.tensor(values, dtype=torch.float32)  # (B, L) multi-label 0/1 targets
            elif isinstance(values[0], list):  # per-token labels
                batch[key] = torch.tensor(pad(values, IGNORE_INDEX), dtype=torch.long)
            elif isinstance(values[0], float):  # regression targets
                batch[key] = torch.tensor(values, dtype=torch.float32)
            else:
                batch[key] = torch.tensor(values, dtype=torch.long)
    return batch


class TaskBatches:
    """Training batches for the loop: shuffled each epoch, bucketed by length, padded per batch.

    Per epoch (seeded by `seed` and the epoch number) the features are shuffled, cut into groups of
    `bucket_batches` batches, each group sorted by length and cut into batches, and the batch order
    shuffled again. Rows of similar length share a batch, so little of it is padding, while every
    batch still comes from a random part of the data. Only the last batch of an epoch can be short;
    there are `ceil(len / batch_size)` batches per epoch. The position is (epoch, batch index):
    `state_dict` / `load_state_dict` resume exactly, as `bertforge.train.ResumableBatches` asks.
    """

    def __init__(self, features: Sequence[Feature], batch_size: int, *, seed: int = 0, pad_id: int = 0,
                 bucket_batches: int = 50) -> None:
        if not features:
            raise ValueError("no training features")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.features, self.batch_size, self.seed, self.pad_id = list(features), batch_size, seed, pad_id
        self.bucket_batches = max(1, bucket_batches)
        self.lengths = np.array([f.length for f in self.features])
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return math.ceil(len(self.features) / self.batch_size)

    def order(self, epoch: int) -> list[np.ndarray]:
        """The batches of `epoch` as arrays of feature indices."""
        rng = np.random.default_rng([self.seed, epoch])
        shuffled = rng.permutation(len(self.features))
        group = self.batch_size * self.bucket_batches
        batches = []
        for start in range(0, len(shuffled), group):
            chunk = shuffled[start:start + group]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = self.order(self.epoch)
        while self.position < len(batches):
            indices = batches[self.position]
            self.position += 1  # the position after this batch: what state_dict() must report now
            yield collate([self.features[i] for i in indices], self.pad_id)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def run_batches(features: Sequence[Feature], forward: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
                *, token_outputs: Sequence[str] = (), batch_size: int = 64, pad_id: int = 0,
                device: torch.device | str | None = None) -> list[dict[str, np.ndarray]]:
    """`forward`'s outputs for every feature, in feature order: the one batching helper of evaluation
    and inference (the pipeline, serve).

    Batches are formed in length order (rows of similar length together, little padding), collated
    without labels, moved to `device` and run without gradients. Outputs named in `token_outputs` are
    one value per token and come back trimmed to the feature's own length T ((T,) or (T, num_labels));
    the others as the head gives them per row ((num_labels,), (C,)).
    """
    import torch

    order = sorted(range(len(features)), key=lambda i: features[i].length)
    results: list[dict[str, np.ndarray]] = [{} for _ in features]
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            threads.tick()
            indices = order[start:start + batch_size]
            batch = collate([features[i] for i in indices], pad_id, with_labels=False)
            outputs = forward({k: v.to(device) for k, v in batch.items()} if device is not None else batch)
            for name, tensor in outputs.items():
                values = tensor.float().cpu().numpy()
                for row, i in enumerate(indices):
                    value = values[row]
                    results[i][name] = value[:features[i].length] if name in token_outputs else value
    return results


def run_model(model: torch.nn.Module, features: Sequence[Feature], output_names: Sequence[str], *,
              token_outputs: Sequence[str] = (), batch_size: int = 64,
              pad_id: int = 0) -> list[dict[str, np.ndarray]]:
    """The head's outputs `output_names` for every feature, in feature order (see `run_batches`), in
    eval mode; the caller's train/eval mode is restored."""
    was_training = model.training
    model.eval()
    try:
        return run_batches(features, lambda batch: {name: getattr(model(**batch), name) for name in output_names},
                           token_outputs=token_outputs, batch_size=batch_size, pad_id=pad_id,
                           device=next(model.parameters()).device)
    finally:
        model.train(was_training)


def max_context_score(position: int, window_start: int, window_length: int) -> float:
    """How well a window of `window_length` tokens starting at `window_start` surrounds `position`.

    A token seen in several overlapping windows is predicted from the one where it has the most
    context on its poorer side: score = min(tokens to its left, tokens to its right) in the window,
    plus a hundredth of the window length to prefer longer windows on ties (the rule of the original
    BERT SQuAD code). Positions outside the window score -inf.
    """
    end = window_start + window_length - 1
    if not window_start <= position <= end:
        return -math.inf
    return min(position - window_start, end - position) + 0.01 * window_length


# ------------------------------------------------------------------------------------------------
# the declaration
# ------------------------------------------------------------------------------------------------
# the width the paper's fine-tuning learning rates were chosen for (BERT-base), and the most a
# narrower model's default rate is scaled up by (`Task.learning_rate_for`)
REFERENCE_HIDDEN_SIZE = 768
MAX_LR_SCALE = 16.0


def task_title(family: str, name: str) -> str:
    """How messages name a task: "glue sst2", and just "classify" for the own-data families (their
    task name is the family's)."""
    return family if name == family else f"{family} {name}"


@dataclass
class Task(ABC):
    """One fine-tuning task. Subclasses fill in the class attributes and the abstract methods."""

    name: str  # the task within its family: "sst2", "conll2003", "squad-v1.1", "swag"
    settings: dict[str, Any] = field(default_factory=dict)  # task options (doc_stride, ...), saved in task.json

    family: ClassVar[str]
    job: ClassVar[str]  # the model job it fine-tunes (bertforge.model.registry.JOBS): the encoder plus one new output layer
    output_names: ClassVar[tuple[str, ...]] = ("logits",)  # the head outputs post-processing reads
    token_outputs: ClassVar[tuple[str, ...]] = ()  # those of them with one value per token
    # the fine-tuning defaults a recipe falls back on where it leaves a setting empty (the paper's)
    default_max_length: ClassVar[int] = 128
    default_lr: ClassVar[float] = 2e-5  # for BERT-base's width; see learning_rate_for
    default_batch_size: ClassVar[int] = 32
    train_split: ClassVar[str] = "train"
    # False for families whose files are task settings (classify's --train/--dev/--test), not a data directory
    reads_data_dir: ClassVar[bool] = True
    # task settings offered as command-line options: name -> (type, help); their defaults are the task's
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {}
    single_task: ClassVar[bool] = False  # True: the family is one task, named after it (no task to choose)
    command_help: ClassVar[str] = ""  # `bertforge finetune FAMILY --help` (empty: the class's docstring)

    # ---- inference: what the pipeline, `predict --input` and `serve` ask of a task
    # The pipeline task this family answers (text-classification, token-classification,
    # question-answering, multiple-choice); None for a family that only fine-tunes and evaluates.
    inference_task: ClassVar[str | None] = None
    hub_dataset: ClassVar[str | None] = None  # the benchmark's data set on the Hugging Face Hub (model cards name it)
    # The family whose pre- and post-processing run a checkpoint of that pipeline task that has no
    # task.json (one family per pipeline task).
    inference_default: ClassVar[bool] = False
    # The message for a task asked for without its name (a family of several named tasks); None: the
    # family's default task
    requires_name: ClassVar[str | None] = None

    @classmethod
    def for_inference(cls, labels: Sequence[str], config: Any) -> Task:
        """The task a checkpoint without task.json is run as, from its head's labels and config.json."""
        return cls(settings={})  # type: ignore[call-arg]

    def inference_example(self, index: int, fields: dict[str, Any]) -> Any:
        """One input of the pipeline as this task's example. `fields` are what the pipeline task's
        inputs hold: text and text_pair; words; question and context; context, start and endings."""
        raise NotImplementedError(f"the {self.family} task family does not run in the pipeline")

    def inference_fields(self, example: Any) -> dict[str, Any]:
        """The pipeline's fields of one of this task's examples, its label left out: the inverse of
        `inference_example` (distillation perturbs them to make inputs the teacher labels)."""
        raise NotImplementedError(f"the {self.family} task family does not give its examples as pipeline inputs")

    @classmethod
    def learning_rate_for(cls, hidden_size: int | None) -> float:
        """The default peak learning rate for an encoder of width `hidden_size` (None: unknown).

        The paper's rates (`default_lr`) were tuned on BERT-base, H = 768, and are kept for it and
        for wider models. A narrower model gets `default_lr` x 768 / H, at most x16: under Adam every
        weight moves about the learning rate per step, so a layer's output moves in proportion to
        its fan-in, and a model half as wide needs twice the rate to change as much in the same steps
        (the 1/width rule of muP). Measured on 800 SST-2 reviews from all-MiniLM-L6-v2 (H = 384, 75
        steps): 2e-5 stays near chance, 4e-5 learns (docs/results-finetuning.md, small-file defaults).
        """
        if not hidden_size or hidden_size >= REFERENCE_HIDDEN_SIZE:
            return cls.default_lr
        return cls.default_lr * min(REFERENCE_HIDDEN_SIZE / hidden_size, MAX_LR_SCALE)

    # ---- reader
    @abstractmethod
    def read(self, data_dir: str | Path, split: str) -> list[Any]:
        """Examples of `split` ("train", an eval split, a test split) from the task's data layout."""

    def eval_splits(self) -> tuple[str, ...]:
        """The labelled splits scored during and after fine-tuning (MNLI has two)."""
        return ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        """The splits `predict` writes by default."""
        return ("test",)

    def final_splits(self) -> tuple[str, ...]:
        """Splits fine-tuning itself predicts with the final model (and scores when labelled): none for
        the benchmarks, whose test labels are hidden; the own-data families' --test file."""
        return ()

    def dev_split_keys(self, examples: Sequence[Any]) -> tuple[list[Any] | None, list[Any] | None]:
        """(strata, groups) for drawing a dev split from training `examples` (`--dev-fraction`): one key
        per example, or None. Strata keep each key's share (classes); groups stay on one side (rows
        that share an input). Neither: plain random rows."""
        return None, None

    def hub_split(self, name: Any, split: str, config: str | None = None) -> Any:
        """`hubdata.resolve_split(name, split, config=config)`, once per task: the split of a Hub data set
        (`hubdata.DatasetSplit`), downloaded, its commit kept for `data_sources`."""
        resolved = self.__dict__.setdefault("_hub_splits", {})
        key = (str(name), split, config)
        if key not in resolved:
            resolved[key] = resolve_split(name, split, config=config)
        return resolved[key]

    def data_sources(self) -> dict[str, dict[str, Any]]:
        """The Hub data sets read so far, by split, with their resolved commits (run records keep them)."""
        return {split: found.provenance() for (_, split, _), found in self.__dict__.get("_hub_splits", {}).items()}

    def file_of(self, data_dir: str | Path | None, split: str) -> Path:
        """For the families that read the user's files (`--train` / `--dev` / `--test`): the file of `split`: `data_dir` when it is a file (`predict --data FILE`), else the one the
        settings name."""
        if data_dir is not None and Path(data_dir).is_file():
            return Path(data_dir)
        named = self.named_file(split)
        if named is not None:
            return named
        raise FileNotFoundError(f"no {split} file: give --{split} FILE")

    def named_file(self, split: str) -> Path | None:
        """The local file the `split` setting names (None: unset). A Hub data set's name
        (`org/name[:config][:split]`, `bertforge.hubdata`) is its split downloaded as one Parquet file,
        once per task."""
        named = self.settings.get(split)
        hub = dataset_name(named)
        if hub is None:
            return Path(named) if named else None
        return self.dataset_split(split).local_file()

    def dataset_split(self, split: str) -> Any:
        """The Hub data set split (`hubdata.DatasetSplit`) the `split` setting names."""
        return self.hub_split(str(self.settings.get(split)), split)

    # ---- head
    def label_names(self, train_examples: Sequence[Any]) -> list[str] | int | None:
        """The head's output labels (stored as id2label), an int for unnamed outputs, None for none."""
        return None

    def config_overrides(self) -> dict[str, Any]:
        """config.json fields the head needs beside the labels (classify: `problem_type`)."""
        return {}

    def model_settings(self, model_dir: Path) -> dict[str, Any]:
        """Settings the model in `model_dir` brings for this task, used where the run leaves them empty
        (embed: the `max_length` of its sentence-transformers files); none by default."""
        return {}

    def wrap_model(self, model: torch.nn.Module, max_length: int) -> torch.nn.Module:
        """The module fine-tuning trains and saves around the loaded model: the model itself, or one that
        adds what the task needs and the job's class lacks (embed: pooling and a contrastive loss)."""
        if hasattr(model, "max_length"):  # a generic head writes it into the setfit body it saves
            model.max_length = max_length
        return model

    def configure_model(self, model: torch.nn.Module, train_examples: Sequence[Any],
                        label_names: Sequence[str] | None) -> None:
        """Training-only settings of a freshly loaded model (classify: the loss's class weights)."""
        return None

    # ---- collate
    @abstractmethod
    def featurize(self, examples: Sequence[Any], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        """Model inputs for `examples`; labels included when the examples have them."""

    # ---- post-process and metric
    @abstractmethod
    def postprocess(self, examples: Sequence[Any], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[Any]:
        """One prediction per example from the head's outputs per feature."""

    @abstractmethod
    def metric(self, examples: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
        """Scores with the official definitions (`tasks.metrics`)."""

    @property
    def main_metric(self) -> str:
        """The key of `metric`'s result that model selection and early stopping follow; higher is better.

        Accuracy unless a task says otherwise (GLUE's MRPC F1, STS-B Pearson, CoLA Matthews; NER and
        SQuAD F1). A task whose metrics have no "accuracy" must override this.
        """
        return "accuracy"

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples) and all(getattr(e, "label", None) is not None for e in examples)

    @abstractmethod
    def write_predictions(self, examples: Sequence[Any], predictions: Sequence[Any], out_dir: Path,
                          split: str) -> list[Path]:
        """Write the predictions of `split` in the task's submission format; returns the files."""

    def tune(self, examples: Sequence[Any], predictions: Sequence[Any]) -> dict[str, Any]:
        """Settings learnt on the dev set and saved with the model (SQuAD v2.0's null threshold)."""
        return {}


class OwnFiles:
    """For task families that read the user's files named by their `train` / `dev` / `test` settings
    (mixed in before the benchmark task they build on: `class Tag(OwnFiles, Ner)`)."""

    reads_data_dir: ClassVar[bool] = False
    single_task: ClassVar[bool] = True
    hub_dataset: ClassVar[str | None] = None  # the user's own data, not the benchmark the task builds on
    settings: dict[str, Any]

    def eval_splits(self) -> tuple[str, ...]:
        return ("dev", "test") if self.settings.get("test") else ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        return ("test",)


__all__ = [
    "IGNORE_INDEX", "LABEL_KEYS", "DataFormatError", "Feature", "OwnFiles", "Task", "TaskBatches", "collate",
    "max_context_score", "read_text_lines", "run_batches", "run_model", "subsample",
]
