"""The pre-trained checkpoint a fine-tuning run starts from: loaded under the task's head (`load_for_task`),
its top layers optionally started afresh (`reinitialize_top_layers`), its width and depth read from
config.json before any work (`model_hidden_size`, `check_task_head`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.finetune.recipe import FinetuneLoop
from bertforge.model.task_heads import layer_indices


def model_hidden_size(model_dir: str | Path) -> int | None:
    """The hidden size config.json declares for `model_dir` (None when it cannot be read: loading the
    model reports that better, later)."""
    from bertforge.model.auto import read_config

    try:
        return int(read_config(model_dir).hidden_size)
    except Exception:  # a missing or malformed config.json is refused by name when the model loads
        return None


def check_task_head(loop: FinetuneLoop, job: str, model_dir: Path) -> None:
    """Refuse, before any work, a layer choice the model is too shallow for (sum_last_four on 2 layers)."""
    from bertforge.model.auto import read_config

    head = loop.task_head(job)
    if head is not None:
        layer_indices(head.layers, read_config(model_dir).num_hidden_layers)


def load_for_task(job: str | type, model_dir: str | Path, **config_overrides: Any) -> Any:
    """A checkpoint under the task head of `job` (a job name, or a model class doing that job), built
    as the class of the checkpoint's own family that does it.

    What such a load may find is declared on the head classes and applied by `bertforge.checkpoint`:
    a pooler in the file is fine for a head that has none (token classification and span QA read
    every token, not the pooled [CLS]), as in `transformers`; any other missing or unexpected key
    raises `CheckpointError`.
    """
    from bertforge.model.auto import load_for_job

    return load_for_job(model_dir, job if isinstance(job, str) else job.job, **config_overrides)  # type: ignore[attr-defined]


def reinitialize_top_layers(model: Any, count: int) -> None:
    """Give the top `count` distinct encoder layers, and the pooler if there is one, fresh BERT weights.

    Pre-trained top layers are specialised to the pre-training objective; starting them afresh can
    fine-tune better on small data (Zhang et al. 2021). With ALBERT's sharing the distinct layers are
    the shared groups, so `count` cannot exceed `num_hidden_groups`.
    """
    if count == 0:
        return
    backbone = model.base_model
    layers = model.transformer_layers()  # as its family declares them
    if count > len(layers):
        raise ValueError(f"reinit_layers={count}, but the encoder has {len(layers)} distinct layers")
    modules = list(layers[len(layers) - count:])
    if backbone.pooler is not None:
        modules.append(backbone.pooler)
    model.init_modules(*modules)
