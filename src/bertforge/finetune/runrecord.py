"""What a fine-tuning run records about its inputs: the files and data it read (compared before a
resume, `bertforge.train.rundir`) and run_config.yaml, the resolved recipe with the Hub commits used."""

from __future__ import annotations

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


__all__ = ["examples_digest", "link_same_weights", "run_inputs", "save_run_config"]
