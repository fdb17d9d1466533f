"""The models: one folder per family (`bert/`, `modernbert/`, ...), each registered in `registry`;
what every family shares in `base` (the model base class, outputs, labels) and `layers` (packing,
activations); `auto` loads whichever class a checkpoint names, or its family's class for a job.

Every family's public names are importable from here (`from bertforge.model import BertModel,
ModernBertForMaskedLM`): they are looked up in the registered families on first use, so this
package names no family and imports no torch until a model is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

# Names every family shares: name -> the module that defines it.
_SHARED = {
    "PreTrainedModel": "bertforge.model.base",
    "EncoderOutput": "bertforge.model.base",
    "PreTrainingOutput": "bertforge.model.base",
    "TaskOutput": "bertforge.model.base",
    "SpanOutput": "bertforge.model.base",
    "label_maps": "bertforge.model.base",
    "label_names": "bertforge.model.base",
    "num_labels": "bertforge.model.base",
    "set_labels": "bertforge.model.base",
    "load_any": "bertforge.model.auto",
    "load_for_job": "bertforge.model.auto",
    "class_for_job": "bertforge.model.auto",
    "model_class": "bertforge.model.auto",
    "read_config": "bertforge.model.auto",
    "resolve_config": "bertforge.model.registry",
    "config_from_dict": "bertforge.model.registry",
    "read_config_file": "bertforge.model.registry",
    "preset_names": "bertforge.model.registry",
}


def __getattr__(name: str) -> Any:
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: `from bertforge.model import registry`
        return importlib.import_module(f"{__name__}.{name}")
    if name in _SHARED:
        return getattr(importlib.import_module(_SHARED[name]), name)
    if not name.startswith("_"):
        found = importlib.import_module("bertforge.model.registry").public_name(name)
        if found is not None:
            return found
    raise AttributeError(f"module 'bertforge.model' has no attribute {name!r}")
