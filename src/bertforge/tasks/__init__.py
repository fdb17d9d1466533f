"""Fine-tuning tasks: GLUE, CoNLL-2003 NER, SQuAD v1.1/v2.0 and SWAG; classification, tagging and QA on
the user's own files.

Each task module reads its data files into plain dataclasses and declares, as a `tasks.base.Task`,
the rest of what fine-tuning needs: the head, features and collate, post-processing, the metric and
the prediction files (`glue.Glue`, `ner.Ner`, `squad.Squad`, `swag.Swag`; `classify.Classify`, `tag.Tag`
and `qa.Qa` read the files named by their `train` / `dev` / `test` settings through `bertforge.tables`,
tag and qa reusing the NER and SQuAD code). `metrics` holds the
scores with the official definitions (GLUE, conlleval, the SQuAD scripts). `bertforge.finetune`
drives any of them with the one training loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertforge.tasks.base import DataFormatError, Task
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


__all__ = ["FAMILIES", "DataFormatError", "Task", "default_task_for", "inference_task_of", "make_task", "register"]
