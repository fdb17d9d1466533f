"""The task-family registry: `FAMILIES` (family name -> its Task class), `register` (one line per
family, or a plug-in's own call), and the questions asked of it by name: `make_task`,
`inference_task_of` (the pipeline task a family answers) and `default_task_for` (the task a checkpoint
without task.json is run as). The built-in families are registered here, in the loop below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertforge.tasks.base import Task
from bertforge.tasks.classify import Classify
from bertforge.tasks.embed import Embed
from bertforge.tasks.glue import Glue
from bertforge.tasks.ner import Ner
from bertforge.tasks.qa import Qa
from bertforge.tasks.squad import Squad
from bertforge.tasks.swag import Swag
from bertforge.tasks.tag import Tag

# task family name -> its Task class; `register` adds one (a plug-in, or a test's toy family)
FAMILIES: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    """Add a task family: it then appears in `bertforge finetune`, `predict`, the pipeline and serve
    (through its `inference_task`). Usable as a class decorator."""
    FAMILIES[cls.family] = cls
    return cls


for _family in (Glue, Ner, Squad, Swag, Classify, Tag, Qa, Embed):  # the built-in families, one registration each
    register(_family)


def make_task(family: str, name: str | None = None, settings: dict[str, Any] | None = None) -> Task:
    """The task `name` of `family` ("glue", "SST-2"; "ner", "conll2003"; "squad", "v2.0"; "swag")."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    cls = FAMILIES[family]
    if name is None:
        if cls.requires_name:
            raise ValueError(cls.requires_name)
        return cls(settings=dict(settings or {}))  # type: ignore[call-arg]
    return cls(name, dict(settings or {}))  # type: ignore[call-arg]


def inference_task_of(family: str | None) -> str | None:
    """The pipeline task a fine-tuned model of `family` answers (None for an unknown family)."""
    cls = FAMILIES.get(family or "")
    return cls.inference_task if cls is not None else None


def default_task_for(inference_task: str, labels: Sequence[str], config: Any) -> Task | None:
    """The task whose pre- and post-processing run a checkpoint of `inference_task` without a task.json."""
    for cls in FAMILIES.values():
        if cls.inference_default and cls.inference_task == inference_task:
            return cls.for_inference(labels, config)
    return None
