"""Fine-tuning tasks: GLUE, CoNLL-2003 NER, SQuAD v1.1/v2.0 and SWAG; classification, tagging and QA on
the user's own files.

Each task module reads its data files into plain dataclasses and declares, as a `tasks.base.Task`,
the rest of what fine-tuning needs: the head, features and collate, post-processing, the metric and
the prediction files (`glue.Glue`, `ner.Ner`, `squad.Squad`, `swag.Swag`; `classify.Classify`, `tag.Tag`
and `qa.Qa` read the files named by their `train` / `dev` / `test` settings through `bertforge.tables`,
tag and qa reusing the NER and SQuAD code). `metrics` holds the
scores with the official definitions (GLUE, conlleval, the SQuAD scripts). `bertforge.finetune`
drives any of them with the one training loop. `registry` holds the families: `FAMILIES`,
`register`, `make_task`, `inference_task_of`, `default_task_for` (all exported here).
"""

from bertforge.tasks.base import DataFormatError, Task
from bertforge.tasks.registry import FAMILIES, default_task_for, inference_task_of, make_task, register

__all__ = ["FAMILIES", "DataFormatError", "Task", "default_task_for", "inference_task_of", "make_task", "register"]
