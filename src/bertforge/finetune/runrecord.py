"""What a fine-tuning run records about its inputs: the files and data it read (compared before a
resume, `bertforge.train.rundir`) and run_config.yaml, the resolved recipe with the Hub commits used."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bertforge.fileio import file_fingerprint
from bertforge.finetune.recipe import FinetuneRecipe
from bertforge.recipe import RUN_CONFIG_FILE
from bertforge.recipe import save as save_recipe
from bertforge.tasks.base import Task
from bertforge.train.rundir import RunInput, digest_input, directory_input, file_input


def save_run_config(recipe: FinetuneRecipe, out_dir: Path, family: str, model_source: dict[str, Any],
                     data_source: dict[str, Any]) -> None:
    """OUT/run_config.yaml: the resolved recipe, then the Hub commits its model and data resolved to
    (records, skipped when the file is read back as a recipe)."""
    import yaml

    records = {key: value for key, value in (("model_source", model_source), ("data_source", data_source)) if value}
    header = f"bertforge finetune {family} --config {out_dir / RUN_CONFIG_FILE} repeats this run"
    if records:
        header += "\n(model_source and data_source record the Hub commits used; pin them with NAME@COMMIT)"
    save_recipe(recipe, out_dir / RUN_CONFIG_FILE, header=header,
                records=yaml.safe_dump(records, sort_keys=False) if records else "")


def run_inputs(task: Task, model_dir: Path, data_dir: Path | None, read: list[list[Any]]) -> list[RunInput]:
    """What a fine-tuning run's results depend on besides its settings: the model directory's files,
    and the task's files (own-data families: --train/--dev/--test), or, for a task that reads a data
    directory, a digest of the examples it read there."""
    inputs = [directory_input("model", model_dir)]
    if not task.reads_data_dir:
        inputs += [file_input(f"{split} file", path) for split in ("train", "dev", "test")
                   if (path := task.named_file(split)) is not None and path.is_file()]
    elif data_dir is not None:
        inputs.append(digest_input("data", data_dir, examples_digest(read)))
    return inputs


def examples_digest(splits: Iterable[Sequence[Any]]) -> str:
    """SHA-256 of examples (each split's, in order) as their reprs: the data a task read, whatever its files."""
    digest = hashlib.sha256()
    for examples in splits:
        digest.update(f"{len(examples)}\n".encode())
        for example in examples:
            digest.update(repr(example).encode("utf-8", "backslashreplace"))
            digest.update(b"\n")
    return digest.hexdigest()


# fields that say where an example was read, not what it holds: left out when rows are compared
_WHERE_FIELDS = frozenset({"row", "source", "guid", "id", "first_line", "doc_index", "article"})


def example_content(example: Any) -> Any:
    """A hashable value of what an example holds (texts, labels, scores), without where it was read
    (its row, file, id): two rows with the same texts and label compare equal across files."""
    if dataclasses.is_dataclass(example) and not isinstance(example, type):
        return tuple((f.name, example_content(getattr(example, f.name))) for f in dataclasses.fields(example)
                     if f.name not in _WHERE_FIELDS)
    if isinstance(example, list | tuple):
        return tuple(example_content(v) for v in example)
    if isinstance(example, dict):
        return tuple(sorted((str(k), example_content(v)) for k, v in example.items()))
    return example


def eval_split_report(train_examples: Sequence[Any], eval_sets: dict[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """For each split scored during training: its examples, how many of them are also training examples,
    and the name its scores are reported under: its own, or "train" when every row of it is a
    training row (a dev file that is the training file, or a part of it), since those scores say how
    well the model fits its training data, not how it does on rows it has not seen."""
    training = {example_content(e) for e in train_examples}
    report = {}
    for split, examples in eval_sets.items():
        shared = sum(example_content(e) in training for e in examples)
        named = TRAIN_SCORES if examples and shared == len(examples) else split
        report[split] = {"examples": len(examples), "training_rows": shared, "reported_as": named}
    return report


TRAIN_SCORES = "train"  # the name of a split's scores when all its rows are training rows


def link_same_weights(final: Path, best: Path) -> None:
    """Make best/'s weight files hard links to the final model's when they hold the same bytes (the best
    evaluation was the last): a seed directory then keeps one copy of the weights on disk, and each
    directory still reads (and copies, and uploads) as a whole model. Where links are impossible (another
    file system, one that has none), the copy stays."""
    for weights in best.glob("*.safetensors"):
        twin = final / weights.name
        if not twin.is_file() or twin.stat().st_size != weights.stat().st_size or twin.samefile(weights):
            continue
        if file_fingerprint(twin)["sha256"] != file_fingerprint(weights)["sha256"]:
            continue
        partial = weights.with_name(f".{weights.name}.link")
        try:
            partial.unlink(missing_ok=True)
            os.link(twin, partial)
            partial.replace(weights)
        except OSError:
            partial.unlink(missing_ok=True)


__all__ = ["TRAIN_SCORES", "eval_split_report", "example_content", "examples_digest", "link_same_weights", "run_inputs",
           "save_run_config"]
