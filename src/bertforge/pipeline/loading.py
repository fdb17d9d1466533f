"""A `Pipeline` from a model directory (`pipeline()`), the engine that runs it (`use_engine`), and the
module object `from bertforge import pipeline` gives, which calls `pipeline()`.

The task comes from the model directory: its `task.json` (written by fine-tuning: family, task, max
length, task settings such as SQuAD's doc stride and tuned no-answer threshold) and its config.json
(the head's class, `id2label`). `task=` overrides it ("embeddings" on any model, say).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.finetuned import TaskRecord, load_for_inference
from bertforge.pipeline.pipe import Pipeline, canonical_task
from bertforge.tasks import inference_task_of, make_task
from bertforge.tasks.base import Task

if TYPE_CHECKING:
    from bertforge.engine import EngineChoice

# the job of the loaded model's class -> the pipeline task (for checkpoints without a task.json)
JOB_TASKS = {
    "sequence-classification": "text-classification", "token-classification": "token-classification",
    "question-answering": "question-answering", "masked-lm": "fill-mask", "pretraining": "fill-mask",
    "embeddings": "embeddings", "multiple-choice": "multiple-choice",
}
# which model jobs have the head each task needs (embeddings read the encoder of any model)
TASK_JOBS = {
    "text-classification": ("sequence-classification",),
    "token-classification": ("token-classification",),
    "question-answering": ("question-answering",),
    "fill-mask": ("masked-lm", "pretraining"),
    "multiple-choice": ("multiple-choice",),
}


def task_for(kind: str, record: TaskRecord | None) -> Task | None:
    """The fine-tuning task a model answers `kind` (a pipeline task) with: the one its task.json names,
    with the saved settings, when that task answers `kind`; None to take the default task for `kind`
    (`tasks.default_task_for`, from the model's head)."""
    if record is not None and record.family and inference_task_of(record.family) == kind:
        return make_task(record.family, record.task, record.settings)
    return None


def read_task_file(model_dir: str | Path) -> dict[str, Any]:
    """The model's task.json as a dict ({} when there is none or it cannot be read)."""
    record = TaskRecord.read(model_dir)
    return record.to_dict() if record is not None else {}


def _predicts_tokens(model: Any) -> bool:
    """Whether the model has a masked-LM head (ELECTRA's pre-training model is a discriminator instead)."""
    return hasattr(model, "masked_lm_logits")


def _task_of(model: Any) -> str | None:
    """The pipeline task of a checkpoint without task.json, from its class's job."""
    task = JOB_TASKS.get(getattr(model, "job", None))
    return "embeddings" if task == "fill-mask" and not _predicts_tokens(model) else task


def _class_names(config: Any, jobs: Sequence[str]) -> list[str]:
    """The classes of `config`'s family that do these jobs, for messages."""
    from bertforge.model.registry import class_names

    return class_names(config.model_type, jobs)


def pipeline(model: str | Path, task: str | None = None, *, batch_size: int = 32, device: str | None = None,
             max_length: int | None = None, precision: str = "fp32", engine: str = "torch",
             engine_calibrate: bool = False, **options: Any) -> Pipeline:
    """A `Pipeline` for the model directory `model` (a fine-tuned seed directory, any BERT checkpoint).

    `task` overrides the task read from the directory (`TASK_NAMES`; "embeddings" works on every
    model). `max_length` defaults to the one the model was fine-tuned with; `options` are `pooling`
    ("mean", "cls", "max", "pooler") and `normalize` for embeddings, `top_k` for fill-mask, `all_scores` for
    text classification (every label's score as well, ranked: what `serve` answers). `precision` is
    fp32 (the default: the numbers fine-tuning scored), bf16, int8 or auto (`bertforge.precision`:
    bf16 where the CPU has native bf16 instructions); a saved int8 copy always runs int8.

    `engine` runs the model rows: torch (the default), onnxruntime (an ONNX graph of the model with its
    head and pooling, exported on first use into a cache; fp32 or int8) or auto (the faster one for the
    precision, this CPU and the batch size, from `bertforge.engine.ENGINE_TABLE`, or timed here with
    `engine_calibrate=True`). The pre- and post-processing are the same whichever runs;
    `pipe.engine_choice` says which engine was chosen and why.
    """
    from bertforge.engine import ENGINES, EngineChoice, EngineError

    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    from bertforge.hub import local_or_hub

    model_dir = local_or_hub(model)  # a Hub name (`org/name@revision`): its cached snapshot
    # an engine other than torch may export the model: load its fp32 weights, and set the precision after
    found = load_for_inference(model_dir, precision if engine == "torch" else "fp32", device)
    loaded, saved = found.model, found.record or TaskRecord()
    kind = type(loaded).__name__
    family = saved.family
    chosen = canonical_task(task) if task else (inference_task_of(family) or _task_of(loaded))
    if chosen is None:
        raise ValueError(f"{model_dir}: cannot tell the task of a {kind} (task.json family {family!r}); "
                         f"pass task=")
    needed = TASK_JOBS.get(chosen)
    if needed and (loaded.job not in needed or (chosen == "fill-mask" and not _predicts_tokens(loaded))):
        raise ValueError(f"{model_dir} holds a {kind}; the {chosen} task needs a "
                         f"{' or '.join(_class_names(loaded.config, needed))}")
    report = getattr(loaded, "load_report", None)
    if report is not None and report.new_heads and needed:
        raise ValueError(f"{model_dir} has no trained {kind} output layer "
                         f"({', '.join(report.new_heads)} would be random); fine-tune it first")
    spec = task_for(chosen, found.record)
    if max_length is None and spec is not None:
        max_length = saved.max_length
    sentence = embedding_defaults(model_dir, options) if chosen == "embeddings" else None
    if sentence is not None:
        options = {**options, "pooling": options.get("pooling") or sentence.pooling,
                   "normalize": sentence.normalize if options.get("normalize") is None else options["normalize"]}
        max_length = max_length or sentence.max_length
    pipe = Pipeline(loaded, found.tokenizer, chosen, spec=spec, max_length=max_length, batch_size=batch_size,
                    device=device, **options)
    if sentence is not None:
        pipe.embedding_source, pipe.lowercase_inputs = sentence.describe(), sentence.lowercase
    if engine == "torch":
        pipe.precision = found.precision
        pipe.engine_choice = EngineChoice("torch", found.precision, "asked for")
        return pipe
    use_engine(pipe, engine, precision, model_dir=model_dir, device=device, calibrate=engine_calibrate)
    return pipe


def embedding_defaults(model_dir: str | Path, options: dict[str, Any]) -> Any:
    """The sentence-transformers embedding `model_dir` defines (`bertforge.sentence_config`), whose
    pooling, normalisation and length are the embeddings' defaults, so that they equal
    `SentenceTransformer.encode`; None for a plain checkpoint. A modules.json bertforge cannot follow
    is an error unless the pooling is given (then the encoder's own vectors are what was asked for)."""
    from bertforge.sentence_config import SentenceConfigError, read_sentence_embedding

    try:
        return read_sentence_embedding(model_dir)
    except SentenceConfigError:
        if options.get("pooling"):
            return None
        raise


def use_engine(pipe: Pipeline, engine: str, precision: str, *, model_dir: str | Path | None = None,
               device: str | None = None, calibrate: bool = False) -> EngineChoice:
    """Choose the engine of a pipeline whose model was loaded at fp32 (or is a saved int8 copy) and make
    it ready (`bertforge.engine.select_engine`): the ONNX Runtime engine of the pipeline's task, or the
    model at the chosen precision."""
    from bertforge.engine import graph_for_task, select_engine
    from bertforge.precision import is_quantized, model_precision

    saved_int8 = is_quantized(pipe.model)
    choice, onnx = select_engine(pipe.model, engine, precision, graph=graph_for_task(pipe.task), model_dir=model_dir,
                                 batch_size=pipe.batch_size, max_length=pipe.max_length, device=device,
                                 saved_int8=saved_int8, calibrate_engines=calibrate,
                                 excluded_ids=sorted(set(pipe.tokenizer.all_special_ids)))
    pipe.engine, pipe.engine_choice = onnx, choice
    pipe.precision = choice.precision if onnx is not None else model_precision(pipe.model)
    return choice


class CallableModule(types.ModuleType):
    """`from bertforge import pipeline` gives this module; calling it calls `pipeline()`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Pipeline:
        return pipeline(*args, **kwargs)
