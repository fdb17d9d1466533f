"""One inference pipeline for every fine-tuned model: Python, `bertforge predict` and `bertforge serve`.

    from bertforge import pipeline
    clf = pipeline("runs/reviews/seed-1")
    clf(["a gripping film", "dull"])   # [{"label": "positive", "score": 0.97}, {"label": "negative", ...}]

The task comes from the model directory: its `task.json` (written by fine-tuning: family, task, max
length, task settings such as SQuAD's doc stride and tuned no-answer threshold) and its config.json
(the head's class, `id2label`). `task=` overrides it ("embeddings" on any model, say). Tasks:

    text-classification    "text" or ("text", "pair")      {"label", "score"}; regression {"value"};
                                                           all_scores=True adds "scores", every label ranked
    token-classification   "text"                          [{"label", "text", "start", "end", "score"}]
    question-answering     {"question", "context"}          {"answer", "score", "start", "end", "no_answer"}
    fill-mask              "text with [MASK]"              [[{"token", "token_id", "score", "sequence"}]]
    embeddings             "text"                          {"embedding": [...]}  (pooling mean, cls, max or pooler)
    multiple-choice        {"context", "start", "endings"}  {"choice", "ending", "score"}  (SWAG's four endings)

Exports `pipeline()` and `use_engine` (pipeline/loading.py: a model directory to a `Pipeline`), the
`Pipeline` class (pipeline/pipe.py: a call's prepare, run and finish steps), `predict_file`
(pipeline/files.py: a table of any size through the pipeline, in chunks) and the per-task inputs and
outputs (pipeline/runners.py). The module itself is callable: `pipeline(path)` is `pipeline.pipeline(path)`.
"""

import sys

from bertforge.pipeline.files import input_columns, predict_file
from bertforge.pipeline.loading import CallableModule, pipeline, read_task_file, task_for, use_engine
from bertforge.pipeline.pipe import TASK_NAMES, Pipeline, canonical_task
from bertforge.pipeline.runners import (
           InputError,
           Prepared,
           count_truncated,
           group_entities,
           output_row,
           split_tag,
)

# `from bertforge import pipeline` gives this module; calling it calls `pipeline()`
sys.modules[__name__].__class__ = CallableModule

__all__ = ["TASK_NAMES", "InputError", "Pipeline", "Prepared", "canonical_task", "group_entities",
           "count_truncated", "input_columns", "output_row", "pipeline", "predict_file", "read_task_file", "split_tag",
           "task_for", "use_engine"]
