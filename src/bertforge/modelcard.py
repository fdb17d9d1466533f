"""Model cards: the README.md the Hugging Face Hub shows for a model directory, with its metadata.

A card starts with YAML the Hub reads (library_name, tags, pipeline_tag, base_model, datasets, and
the dev scores as model-index results), then says in prose what the model is and how it was made:
the task, the scores, the command and settings (from task.json). Fine-tuning writes one into every
seed directory; `bertforge push` writes one into a directory that has none before uploading it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic
from bertforge.finetuned import TaskRecord
from bertforge.tasks import FAMILIES, inference_task_of

CARD_FILE = "README.md"
# bertforge's pipeline tasks -> the Hub's pipeline_tag
PIPELINE_TAGS = {"text-classification": "text-classification", "token-classification": "token-classification",
                 "question-answering": "question-answering", "fill-mask": "fill-mask",
                 "multiple-choice": "multiple-choice", "embeddings": "feature-extraction"}


def model_card(directory: str | os.PathLike[str], *, base_model: str | None = None,
               base_revision: str | None = None, command: str | None = None) -> str:
    """The README.md text for the model in `directory` (its config.json and, when fine-tuned, task.json)."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    record = TaskRecord.read(directory)
    task = inference_task_of(record.family) if record is not None else None
    family = str(config.get("model_type") or "encoder")  # config.json's own name of the family
    meta: dict[str, Any] = {"library_name": "transformers", "tags": ["bertforge", family]}
    if task in PIPELINE_TAGS or (task is None and _is_masked_lm(config)):
        meta["pipeline_tag"] = PIPELINE_TAGS.get(task or "fill-mask")
    if base_model:
        meta["base_model"] = base_model
    dataset = _hub_dataset(record)
    if dataset:
        meta["datasets"] = [dataset]
    lines = ["---", *_yaml(meta), *_model_index(directory.name, record, task), "---", ""]
    lines += _prose(config, record, base_model, base_revision, command)
    return "\n".join(lines) + "\n"


def command_line() -> str | None:
    """The bertforge command that is running, for a card (None when called from Python)."""
    if not sys.argv or not sys.argv[0].endswith("bertforge"):
        return None
    return " ".join(["bertforge", *sys.argv[1:]])


def write_model_card(directory: str | os.PathLike[str], **details: Any) -> Path:
    """Write `model_card(directory, **details)` to directory/README.md; returns its path."""
    path = Path(directory) / CARD_FILE
    write_text_atomic(path, model_card(directory, **details))
    return path


def _hub_dataset(record: TaskRecord | None) -> str | None:
    """The Hub data set of a benchmark task's family (the own-data families have none)."""
    family = FAMILIES.get(record.family or "") if record is not None else None
    return family.hub_dataset if family is not None else None


def _is_masked_lm(config: dict[str, Any]) -> bool:
    return any(name.endswith(("ForMaskedLM", "ForPreTraining")) for name in config.get("architectures") or [])


def _yaml(meta: dict[str, Any]) -> list[str]:
    """Flat YAML for the card's header: scalars and lists of scalars, JSON-quoted (valid YAML)."""
    lines = []
    for key, value in meta.items():
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {json.dumps(item)}" for item in value)]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return lines


def _model_index(name: str, record: TaskRecord | None, task: str | None) -> list[str]:
    """The Hub's model-index block with the dev scores, when the model was fine-tuned and scored."""
    if record is None or not record.metrics or task not in PIPELINE_TAGS:
        return []
    lines = ["model-index:", f"- name: {json.dumps(name)}", "  results:", "  - task:",
             f"      type: {json.dumps(PIPELINE_TAGS[task])}", "    dataset:",
             f"      name: {json.dumps(f'{record.family} {record.task}')}",
             f"      type: {json.dumps(_hub_dataset(record) or 'own data')}", "      split: dev",
             "    metrics:"]
    for metric, value in record.metrics.items():
        lines += [f"    - type: {json.dumps(metric)}", f"      value: {float(value)!r}"]
    return lines


def _prose(config: dict[str, Any], record: TaskRecord | None, base_model: str | None,
           base_revision: str | None, command: str | None) -> list[str]:
    shape = (f"{config.get('model_type') or 'transformer'} encoder, {config.get('num_hidden_layers')} layers, hidden size "
             f"{config.get('hidden_size')}, {config.get('num_attention_heads')} attention heads")
    lines = ["# Model card", "", f"A {shape}, made with bertforge and loadable by `transformers` "
             "(`AutoModel.from_pretrained`) and by every bertforge command."]
    if base_model:
        at = f" at revision `{base_revision}`" if base_revision else ""
        lines += ["", f"Started from `{base_model}`{at}."]
    if record is not None:
        lines += ["", f"Fine-tuned on {record.family} {record.task} (seed {record.seed}, {record.steps} steps, "
                      f"max length {record.max_length})."]
        if record.labels:
            lines.append(f"Labels: {', '.join(map(str, record.labels))}.")
        if record.metrics:
            lines += ["", "| dev metric | value |", "|---|---|",
                      *(f"| {metric} | {float(value):.4f} |" for metric, value in record.metrics.items())]
        settings = {k: v for k, v in (record.hyperparameters or {}).items() if k not in ("model", "data")}
        if settings:
            lines += ["", "Settings:", "", "```json", json.dumps(settings, indent=2, sort_keys=True), "```"]
    if command:
        lines += ["", "Made by:", "", "```bash", command, "```"]
    return lines


# what a pushed directory leaves out: the loop's resumable checkpoints and run records, locks, hidden files
PUSH_IGNORE = ("run/**", "checkpoints/**", "*.pt", "*.pth", "optimizer*", "*.lock", ".*", "**/.*")


def push_model(directory: str | os.PathLike[str], repo_id: str, *, private: bool = True,
               message: str | None = None) -> str:
    """Upload a model directory to the Hub as `repo_id` (created private unless `private=False`), its
    checkpoints and run records left out; a card (README.md) is written first when it has none.
    Returns the repository's URL. The token is huggingface_hub's (HF_TOKEN or the token file)."""
    from huggingface_hub import HfApi

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: not a model directory (no config.json)")
    if not (directory / CARD_FILE).is_file():
        write_model_card(directory)
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(directory), repo_id=repo_id, ignore_patterns=list(PUSH_IGNORE),
                      commit_message=message or f"Upload {directory.name} with bertforge")
    return str(url)


__all__ = ["CARD_FILE", "PUSH_IGNORE", "command_line", "model_card", "push_model", "write_model_card"]
