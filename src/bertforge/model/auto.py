"""Build whichever model class a checkpoint's config.json names, or the class of its family that
does a given job, through the registry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertforge.checkpoint import LoadReport, read_architectures, read_config_data
from bertforge.config import ModelConfig
from bertforge.model import registry

TASK_HEAD_CLASS_SUFFIX = "WithTaskHead"  # `bertforge.model.base.task_head_class` names its classes so


def read_config(directory: str | os.PathLike[str], **config_overrides: Any) -> ModelConfig:
    """A checkpoint directory's config.json, read by its family's config class (overrides on top)."""
    source = str(Path(directory) / "config.json")
    config = registry.config_from_dict(read_config_data(directory), source=source)
    if config_overrides:
        config = type(config).from_dict({**config.to_dict(), **config_overrides}, source=source)
    return config


def model_class(directory: str | os.PathLike[str]) -> type:
    """The first class config.json's `architectures` names that we have, in the family its
    `model_type` names; the family's bare encoder if it names none."""
    architectures = read_architectures(directory)  # first: its error names a missing config.json
    config = read_config(directory)
    for name in architectures:
        # a generic head's class (BertForSequenceClassificationWithTaskHead): the family's class for
        # the job, which builds the head config.json's task_head describes
        named = registry.class_for_architecture(name.removesuffix(TASK_HEAD_CLASS_SUFFIX))
        if named is not None:
            return named.for_config(config)  # type: ignore[attr-defined]
    return registry.model_class(config.model_type, "embeddings")


def class_for_job(directory: str | os.PathLike[str], job: str) -> type:
    """The class of the checkpoint's family that does `job` (one of registry.JOBS)."""
    return registry.model_class(read_config(directory).model_type, job)


def load_any(directory: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, LoadReport]:
    """Load a checkpoint as the class its config.json names (see `model_class`); also return the report.

    Keyword arguments go to `from_pretrained` (strict, allow_pickle, config overrides).
    """
    model = model_class(directory).from_pretrained(directory, **kwargs)  # type: ignore[attr-defined]
    return model, model.load_report


def load_for_job(directory: str | os.PathLike[str], job: str, **kwargs: Any) -> Any:
    """Load a checkpoint as its family's model for `job` (a bare encoder's weights under a new task
    head, say); `model.load_report` says what was new. Keyword arguments go to `from_pretrained`."""
    return class_for_job(directory, job).from_pretrained(directory, **kwargs)  # type: ignore[attr-defined]
