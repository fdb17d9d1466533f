"""Build whichever model class a checkpoint's config.json names, from the registry of the classes."""

from __future__ import annotations

import os
from typing import Any

from bertforge.checkpoint import LoadReport, read_architectures, read_config
from bertforge.model import heads, modern  # noqa: F401  (defining the classes registers them)
from bertforge.model.bert import BertModel, BertPreTrainedModel


def model_class(directory: str | os.PathLike[str]) -> type[BertPreTrainedModel]:
    """The first class config.json's `architectures` names that we have, in the family its
    `model_type` names; the family's bare encoder if it names none."""
    registry = BertPreTrainedModel.registry
    named = next((registry[name] for name in read_architectures(directory) if name in registry), BertModel)
    return named.for_config(read_config(directory))


def load_any(directory: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, LoadReport]:
    """Load a checkpoint as the class its config.json names (see `model_class`); also return the report.

    Keyword arguments go to `from_pretrained` (strict, allow_pickle, config overrides).
    """
    model = model_class(directory).from_pretrained(directory, **kwargs)
    return model, model.load_report
