"""Model cards: the README.md the Hugging Face Hub shows for a model directory, with its metadata.

A card starts with YAML the Hub reads (library_name, tags, pipeline_tag, base_model, datasets, and
the scores as model-index results), then says in prose what the model is and how it was made: what
it started from, the task or the text it learnt, the scores, the command and settings. Every model
directory bertforge makes gets one: fine-tuning's seed directories (settings and dev scores from
task.json), pre-training's `final/` (from scratch or continued), adaptation's `final/` (held-out
scores before and after) and distillation's students (the teacher named); `bertforge push` writes
one into a directory that has none before uploading it.

A card is for other machines: a local directory is named by its folder name, never by its path, and
settings that are absolute paths keep only their last part.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic
from bertforge.finetuned import TaskRecord
from bertforge.hub import MODEL_FILES, is_hub_name, split_revision
from bertforge.sentence_config import SETFIT_CONFIG_FILE, SETFIT_HEAD_FILE
from bertforge.tasks import FAMILIES, inference_task_of
from bertforge.tasks.base import task_title

CARD_FILE = "README.md"
# bertforge's pipeline tasks -> the Hub's pipeline_tag
PIPELINE_TAGS = {"text-classification": "text-classification", "token-classification": "token-classification",
                 "question-answering": "question-answering", "fill-mask": "fill-mask",
                 "multiple-choice": "multiple-choice", "embeddings": "feature-extraction"}
# how a model was made (model_card's `kind`), in the card's first sentence after the shape
KINDS = ("pretrained", "adapted", "distilled")
# folder names that say little alone: the card names them with their parent (sst2/seed-1, tiny/final)
_GENERIC_FOLDERS = re.compile(r"seed-\d+|final|student|best")


@dataclass(frozen=True)
class Base:
    """The model another one started from, as a card names it."""

    repo_id: str | None = None  # a Hub repository: the header's base_model
    name: str | None = None  # how the prose names it: the repository, or a local directory's folder name
    revision: str | None = None  # the commit (or revision) it was at

    @classmethod
    def of(cls, model: str | os.PathLike[str] | None, revision: str | None = None) -> Base:
        """A Hub name (not an existing path), a directory in the Hub's cache (its repository and commit)
        or any other local directory (its folder name only)."""
        if not model:
            return cls()
        text = os.fspath(model)
        snapshot = hub_snapshot(Path(text))
        if snapshot is not None:
            return cls(snapshot[0], snapshot[0], revision or snapshot[1])
        if is_hub_name(text) and not Path(text).expanduser().exists():
            repo_id, asked = split_revision(text)
            return cls(repo_id, repo_id, revision or asked)
        return cls(None, local_name(text), revision)

    def sentence_part(self) -> str:
        return f"`{self.name}`" + (f" at revision `{self.revision}`" if self.revision else "")


def hub_snapshot(path: Path) -> tuple[str, str] | None:
    """(repository, commit) of a directory in huggingface_hub's cache (models--org--name/snapshots/COMMIT)."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/"), parts[-1]
    return None


def local_name(path: str | os.PathLike[str]) -> str:
    """A local directory as a card names it: its folder name, with its parent's where the folder's is generic."""
    path = Path(os.path.normpath(os.fspath(path)))
    name = path.name or os.fspath(path)
    if _GENERIC_FOLDERS.fullmatch(name) and path.parent.name:
        return f"{path.parent.name}/{name}"
    return name


def model_card(directory: str | os.PathLike[str], *, base_model: str | os.PathLike[str] | None = None,
               base_revision: str | None = None, command: str | None = None, kind: str | None = None,
               teacher: str | os.PathLike[str] | None = None, start: str | None = None,
               metrics: dict[str, float] | None = None, baseline: dict[str, float] | None = None,
               data: str | None = None, settings: dict[str, Any] | None = None) -> str:
    """The README.md text for the model in `directory` (its config.json and, when fine-tuned, task.json).

    `base_model` is what it started from: a Hub name or a local directory (`Base.of`). `kind` says how
    it was made (one of KINDS; None: fine-tuned, or unknown); `teacher` is a distilled model's teacher
    and `start` how a student began when not from a checkpoint ("random weights in the shape of
    `mini`"). `metrics` are held-out scores on `data` (with `baseline`, the same before training, for
    an adapted model); `settings` the run's settings that matter (a fine-tuned model's come from its
    task.json, as do its dev scores).
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)} or None, not {kind!r}")
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    record = TaskRecord.read(directory)
    task = inference_task_of(record.family) if record is not None else None
    base = Base.of(base_model, base_revision)
    loader = _loader(directory, config)
    meta = _metadata(config, record, task, base, loader)
    scores, before = _shown_scores(metrics), _shown_scores(baseline)
    index = (_task_index(directory.name, record, task)
             or _held_out_index(directory.name, meta.get("pipeline_tag"), scores, data))
    lines = ["---", *_yaml(meta), *index, "---", ""]
    lines += _intro(config, kind, base, teacher, start, loader)
    lines += _record_lines(record, kind) + _score_lines(scores, before, data)
    lines += _settings_lines(settings) + (["", "Made by:", "", "```bash", command, "```"] if command else [])
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


# what runs a directory as trained (`_loader`): transformers; the setfit package (a generic head on the
# mean token vector, saved with setfit's files); bertforge alone (any other generic head)
LOADERS = ("transformers", "setfit", "bertforge")


def _loader(directory: Path, config: dict[str, Any]) -> str:
    """The library a directory's card names as the one that runs it as trained. A generic head (config.json's
    `task_head`) is no transformers class: transformers would run the family's own head, untrained, in its place."""
    if not config.get("task_head"):
        return "transformers"
    return "setfit" if (directory / SETFIT_HEAD_FILE).is_file() else "bertforge"


def _metadata(config: dict[str, Any], record: TaskRecord | None, task: str | None, base: Base,
              loader: str = "transformers") -> dict[str, Any]:
    family = str(config.get("model_type") or "encoder")  # config.json's own name of the family
    extra = ["setfit", "sentence-transformers"] if loader == "setfit" else []
    meta: dict[str, Any] = {"library_name": loader, "tags": ["bertforge", family, *extra]}
    if task in PIPELINE_TAGS or (task is None and _is_masked_lm(config)):
        meta["pipeline_tag"] = PIPELINE_TAGS.get(task or "fill-mask")
    if base.repo_id:  # the Hub checks base_model against its repositories: a local folder has no place here
        meta["base_model"] = base.repo_id
    dataset = _hub_dataset(record)
    if dataset:
        meta["datasets"] = [dataset]
    return meta


def _yaml(meta: dict[str, Any]) -> list[str]:
    """Flat YAML for the card's header: scalars and lists of scalars, JSON-quoted (valid YAML)."""
    lines = []
    for key, value in meta.items():
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {json.dumps(item)}" for item in value)]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return lines


def _index(name: str, task_type: str, dataset: str, dataset_type: str, split: str,
           metrics: dict[str, float]) -> list[str]:
    """The Hub's model-index block: one result, its metrics on one data set's split."""
    lines = ["model-index:", f"- name: {json.dumps(name)}", "  results:", "  - task:",
             f"      type: {json.dumps(task_type)}", "    dataset:", f"      name: {json.dumps(dataset)}",
             f"      type: {json.dumps(dataset_type)}", f"      split: {json.dumps(split)}", "    metrics:"]
    for metric, value in metrics.items():
        lines += [f"    - type: {json.dumps(metric)}", f"      value: {float(value)!r}"]
    return lines


def _task_index(name: str, record: TaskRecord | None, task: str | None) -> list[str]:
    """The dev scores of a fine-tuned (or task-distilled) model, when it was scored."""
    if record is None or not record.metrics or task not in PIPELINE_TAGS:
        return []
    splits = set((record.extra.get("metric_splits") or {}).values()) or {"dev"}
    return _index(name, PIPELINE_TAGS[task], task_title(record.family or "", record.task or record.family or ""),
                  _hub_dataset(record) or "own data", splits.pop() if len(splits) == 1 else "dev", record.metrics)


def _held_out_index(name: str, pipeline_tag: str | None, scores: dict[str, float], data: str | None) -> list[str]:
    """The held-out accuracy and perplexity of a pre-trained or adapted model (its losses stay in the prose)."""
    shown = {metric: value for metric, value in scores.items() if "accuracy" in metric or "perplexity" in metric}
    if not shown or pipeline_tag is None:
        return []
    return _index(name, pipeline_tag, f"held-out text of {data}" if data else "held-out text", "own data",
                  "validation", shown)


def _shown_scores(metrics: dict[str, float] | None) -> dict[str, float]:
    """The finite scores, with the masked-LM perplexity (exp of its loss) where the loss is known."""
    scores = {name: float(value) for name, value in (metrics or {}).items()
              if isinstance(value, int | float) and math.isfinite(value)}
    if "mlm_loss" in scores and "mlm_perplexity" not in scores:
        scores["mlm_perplexity"] = math.exp(min(scores["mlm_loss"], 700.0))
    return scores


def _intro(config: dict[str, Any], kind: str | None, base: Base, teacher: str | os.PathLike[str] | None,
           start: str | None, loader: str = "transformers") -> list[str]:
    shape = (f"{config.get('model_type') or 'transformer'} encoder, {config.get('num_hidden_layers')} layers, hidden size "
             f"{config.get('hidden_size')}, {config.get('num_attention_heads')} attention heads")
    lines = ["# Model card", "", f"A {shape}, made with bertforge and {_loads_with(loader)}"]
    origin = _origin(kind, base, teacher, start)
    return lines + (["", origin] if origin else [])


def _loads_with(loader: str) -> str:
    """The sentence that says which libraries run the directory as trained, and what the others see."""
    if loader == "setfit":
        return ("loadable as trained by `setfit` (`SetFitModel.from_pretrained`) and by every bertforge command; "
                "`sentence-transformers` loads its encoder with the mean pooling the classifier reads. Its head "
                "is no transformers class: `transformers` loads the encoder alone (`AutoModel.from_pretrained`).")
    if loader == "bertforge":
        return ("loadable as trained by every bertforge command (`pipeline`, `predict`, `serve`). Its head "
                "(config.json's `task_head`) is no transformers class: `transformers` loads the encoder alone "
                "(`AutoModel.from_pretrained`).")
    return "loadable by `transformers` (`AutoModel.from_pretrained`) and by every bertforge command."


def _origin(kind: str | None, base: Base, teacher: str | os.PathLike[str] | None, start: str | None) -> str | None:
    """The sentence that says how the weights came to be."""
    started = base.sentence_part() if base.name else start
    if kind == "pretrained":
        return (f"Pre-trained with `bertforge pretrain`, continuing from {started}." if base.name else
                "Pre-trained from scratch (random initial weights) with `bertforge pretrain`.")
    if kind == "adapted":
        return (f"Adapted with `bertforge adapt`: {started or 'a checkpoint'} with its masked-LM pre-training "
                "continued on new, unlabelled text.")
    if kind == "distilled":
        sentence = f"Distilled with `bertforge distill` from the teacher `{Base.of(teacher).name or 'unnamed'}`."
        return sentence + (f" The student started from {started}." if started else "")
    return f"Started from {started}." if base.name else None


def _record_lines(record: TaskRecord | None, kind: str | None) -> list[str]:
    """The task a fine-tuned (or task-distilled) model learnt, its labels, dev scores and settings."""
    if record is None:
        return []
    verb = "Distilled on" if kind == "distilled" else "Fine-tuned on"
    settings = record.hyperparameters or {}
    setfit = settings.get("method") == "setfit"
    # a best-evaluation directory knows the step that chose it rather than the run's length
    length = (f"{record.steps} steps" if record.steps is not None else
              f"chosen at step {record.step}" if record.step is not None else None)
    if setfit and length:  # its steps are the encoder's, on pairs made from the labels
        length += f" of the encoder on label pairs (batch {settings.get('batch_size')}, lr {settings.get('lr')})"
    facts = [f"seed {record.seed}", length, f"max length {record.max_length}"]
    command = f"bertforge finetune {record.family}" + (" --method setfit" if setfit else "")
    # an own-data family's one task is the family itself: "classify", not "classify classify"
    made_by = "" if kind == "distilled" else f", `{command}`"
    what = (f"{record.family} (own data{made_by})" if record.task in (None, record.family) else
            f"{record.family} {record.task}" + (" with SetFit" if setfit else ""))
    lines = ["", f"{verb} {what}: {', '.join(fact for fact in facts if fact)}."]
    if record.labels:
        lines.append(f"Labels: {', '.join(map(str, record.labels))}.")
    if record.metrics:  # each score with the split it is from: "train" where the dev rows were training rows
        splits = record.extra.get("metric_splits") or {}
        lines += ["", "| metric | split | value |", "|---|---|---|",
                  *(f"| {metric} | {splits.get(metric, 'dev')} | {float(value):.4f} |"
                    for metric, value in record.metrics.items())]
    return lines + _settings_lines({k: v for k, v in settings.items() if k not in ("model", "data")})


def _score_lines(scores: dict[str, float], before: dict[str, float], data: str | None) -> list[str]:
    """Held-out scores as a table; beside the scores before training where those are known."""
    if not scores:
        return []
    where = f"the held-out text of `{data}`" if data else "held-out text"
    if before:
        rows = ["| held-out metric | before | after |", "|---|---|---|",
                *(f"| {name} | {_number(before.get(name))} | {_number(value)} |" for name, value in scores.items())]
    else:
        rows = ["| held-out metric | value |", "|---|---|", *(f"| {name} | {_number(value)} |"
                                                            for name, value in scores.items())]
    return ["", f"Scores on {where}, never trained on:", "", *rows]


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _settings_lines(settings: dict[str, Any] | None) -> list[str]:
    if not settings:
        return []
    return ["", "Settings:", "", "```json", json.dumps(_portable(settings), indent=2, sort_keys=True, default=str),
            "```"]


def _portable(value: Any) -> Any:
    """`value` with every absolute path cut to the name a card gives it (`Base.of`): never the user's folders."""
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_portable(item) for item in value]
    if isinstance(value, str) and (os.path.isabs(value) or value.startswith("~")):
        return Base.of(value).name
    return value


# what a pushed directory leaves out: the loop's resumable checkpoints and run records, locks, hidden files
PUSH_IGNORE = ("run/**", "checkpoints/**", "*.pt", "*.pth", "optimizer*", "*.lock", ".*", "**/.*")


def push_model(directory: str | os.PathLike[str], repo_id: str, *, private: bool = True,
               message: str | None = None) -> str:
    """Upload a model directory to the Hub as `repo_id` (created private unless `private=False`): the
    files a model directory is read by (`hub.MODEL_FILES`: config, weights, tokenizer, task.json) and its
    card; checkpoints, run records, predictions and plots are left out; a card (README.md) is written first when it has none.
    Returns the repository's URL. The token is huggingface_hub's (HF_TOKEN or the token file)."""
    from huggingface_hub import HfApi

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: not a model directory (no config.json)")
    if not (directory / CARD_FILE).is_file():
        write_model_card(directory)
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    # a classifier saved in setfit's layout too: its head and labels, without which setfit would start a random head
    setfit = [SETFIT_HEAD_FILE, SETFIT_CONFIG_FILE, "2_Normalize/*"]
    api.upload_folder(folder_path=str(directory), repo_id=repo_id, allow_patterns=[*MODEL_FILES, CARD_FILE, *setfit],
                      ignore_patterns=list(PUSH_IGNORE),
                      commit_message=message or f"Upload {directory.name} with bertforge")
    return str(url)


__all__ = ["CARD_FILE", "KINDS", "LOADERS", "PUSH_IGNORE", "Base", "command_line", "hub_snapshot", "local_name",
           "model_card", "push_model", "write_model_card"]
