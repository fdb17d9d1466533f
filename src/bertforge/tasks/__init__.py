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

from typing import Any

from bertforge.tasks.base import DataFormatError, Task
from bertforge.tasks.classify import Classify
from bertforge.tasks.glue import Glue
from bertforge.tasks.ner import Ner
from bertforge.tasks.qa import Qa
from bertforge.tasks.squad import Squad
from bertforge.tasks.swag import Swag
from bertforge.tasks.tag import Tag

FAMILIES: dict[str, type[Task]] = {"glue": Glue, "ner": Ner, "squad": Squad, "swag": Swag,
                                   "classify": Classify, "tag": Tag, "qa": Qa}


def make_task(family: str, name: str | None = None, settings: dict[str, Any] | None = None) -> Task:
    """The task `name` of `family` ("glue", "SST-2"; "ner", "conll2003"; "squad", "v2.0"; "swag")."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    cls = FAMILIES[family]
    if name is None:
        if family == "glue":
            raise ValueError("a GLUE task needs its name (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI)")
        return cls(settings=dict(settings or {}))  # type: ignore[call-arg]
    return cls(name, dict(settings or {}))  # type: ignore[call-arg]


__all__ = ["FAMILIES", "DataFormatError", "Task", "make_task"]
