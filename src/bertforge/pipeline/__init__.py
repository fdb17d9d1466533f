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

Every task goes through the fine-tuning task's own code (`bertforge.tasks`): its `featurize` makes the
model rows (GLUE truncation, NER word windows, SQuAD question + context windows) and its
`postprocess` turns outputs into predictions (argmax, the word's max-context window, SQuAD's n-best
span search and null threshold), so a prediction here is exactly what fine-tuning scored.

A call runs in three steps, which `serve` drives separately (tokenising in its event loop, the model
on its model thread, several requests in one batch):

    prepared = pipe.prepare(inputs)            examples and features (model rows); InputError if unusable
    outputs = pipe.run(prepared.features)      length-sorted batches of `batch_size`, outputs in feature order
    results = pipe.finish(prepared, outputs)   one result per input

`predict_file` streams a table (CSV, TSV, JSONL, Parquet, plain lines: `bertforge.tables`) through the
pipeline in chunks of rows, so a file of any size is read, predicted and written with bounded memory,
in input order.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertforge.fileio import DataFormatError
from bertforge.finetuned import TaskRecord, label_names_of, load_for_inference
from bertforge.pipeline.runners import (
    RUNNERS,
    InputError,
    Prepared,
    Runner,
    group_entities,
    output_row,
    positive_int,
    split_tag,
)
from bertforge.tasks import default_task_for, inference_task_of, make_task
from bertforge.tasks.base import Feature, Task, run_batches

if TYPE_CHECKING:
    import torch

    from bertforge.engine import EngineChoice, OnnxEngine
    from bertforge.tokenizer import BertTokenizer

# user-facing task names (and accepted spellings) -> the canonical name
TASK_NAMES = {
    "text-classification": "text-classification", "classification": "text-classification",
    "classify": "text-classification", "sentiment-analysis": "text-classification",
    "token-classification": "token-classification", "ner": "token-classification", "tag": "token-classification",
    "question-answering": "question-answering", "qa": "question-answering",
    "fill-mask": "fill-mask",
    "embeddings": "embeddings", "embed": "embeddings", "feature-extraction": "embeddings",
    "multiple-choice": "multiple-choice", "swag": "multiple-choice",
}
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
log = logging.getLogger(__name__)
POOLINGS = ("mean", "cls", "max", "pooler")
# What text classification does with a text longer than max_length: cut it (BERT's way, and what
# fine-tuning trained on), or read it whole in overlapping windows whose logits are averaged.
LONG_TEXT = ("truncate", "windows")
CALL_OPTIONS = ("batch_size",)  # what any call may change, beside its task's own options


# ------------------------------------------------------------------------------------------------
# the pipeline
# ------------------------------------------------------------------------------------------------
class Pipeline:
    """A model, its tokenizer and one task's pre- and post-processing. Build it with `pipeline(path)`.

    `spec` is the fine-tuning task (`bertforge.tasks.Task`) whose featurize/postprocess are used, made
    from task.json's family, task and settings (or a default one for the head when there is none).
    """

    def __init__(self, model: Any, tokenizer: BertTokenizer, task: str, *, spec: Task | None = None,
                 max_length: int | None = None, batch_size: int = 32, device: str | None = None,
                 pooling: str | None = None, normalize: bool | None = None, top_k: int = 5, long_text: str = "truncate",
                 window_stride: int | None = None, all_scores: bool = False) -> None:
        import torch

        task = canonical_task(task)
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.device = torch.device(device) if device else _model_device(model)
        self.batch_size = positive_int(batch_size, "batch_size")
        self.config = model.config
        self.labels = label_names_of(model)
        self.spec = spec if spec is not None else default_task_for(task, self.labels, self.config)
        limit = min(self.config.max_tokens, tokenizer.model_max_length)
        # without a saved length: the model's limit, except for QA's windows (384 pieces, as fine-tuned)
        default = self.spec.default_max_length if task == "question-answering" and self.spec else limit
        self.max_length = min(positive_int(max_length or default, "max_length"), limit)
        # embeddings: what decided the pooling (pipeline() names a sentence-transformers modules.json)
        self.embedding_source = "asked for" if pooling else "default"
        pooling = pooling or "mean"
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.pooling, self.normalize, self.top_k = pooling, bool(normalize), positive_int(top_k, "top_k")
        self.lowercase_inputs = False  # a sentence-transformers model with do_lower_case
        if long_text not in LONG_TEXT:
            raise ValueError(f"long_text must be one of {', '.join(LONG_TEXT)}, got {long_text!r}")
        if long_text == "windows" and task != "text-classification":
            raise ValueError(f"long_text='windows' is for text-classification; {task} has its own handling "
                             "of long inputs")
        self.long_text = long_text
        if all_scores and task != "text-classification":
            raise ValueError(f"all_scores is for text-classification, not {task}")
        self.all_scores = all_scores  # text-classification: every label's score too, as serve answers
        # windows start every `window_stride` pieces: by default half a window, so each piece is read
        # twice (once near the middle of some window) and no window starts or ends a text's context blind
        body = self.max_length - 2  # pieces per window besides [CLS] and [SEP]
        self.window_stride = positive_int(window_stride or max(body // 2, 1), "window_stride")
        if self.window_stride > body:
            raise ValueError(f"window_stride {self.window_stride} is longer than a window ({body} pieces "
                             f"besides [CLS] and [SEP] at max_length {self.max_length}): pieces would be skipped")
        self.precision = "fp32"  # what `pipeline()` applied (bertforge.precision)
        # None: the model runs itself (torch); else the ONNX Runtime engine runs its rows (bertforge.engine)
        self.engine: OnnxEngine | None = None
        self.engine_choice: EngineChoice | None = None  # which engine `pipeline()` chose, and why
        self.runner: Runner = RUNNERS[task](self)

    def __repr__(self) -> str:
        windows = f", long_text='windows', window_stride={self.window_stride}" if self.long_text == "windows" else ""
        return (f"Pipeline(task={self.task!r}, model={type(self.model).__name__}, max_length={self.max_length}{windows}, "
                f"batch_size={self.batch_size}, device={str(self.device)!r}, engine={self.engine_name!r})")

    @property
    def engine_name(self) -> str:
        return "onnxruntime" if self.engine is not None else "torch"

    def __call__(self, inputs: Any, **options: Any) -> Any:
        """A list of inputs gives a list of results; anything else is one input (a text, a (text, pair) or
        (question, context) tuple, a dict) and gives one result. See the module docstring."""
        unknown = sorted(set(options) - set(self.runner.call_options) - set(CALL_OPTIONS))
        if unknown:
            takes = ", ".join((*self.runner.call_options, *CALL_OPTIONS))
            raise TypeError(f"{self.task} pipeline: unknown option(s) {', '.join(unknown)} at call time (it takes: "
                            f"{takes}; the others are set when the pipeline is made)")
        single = not isinstance(inputs, list)
        batch = [inputs] if single else inputs
        if not batch:
            return []
        batch_size = options.pop("batch_size", None)
        prepared = self.prepare(batch)
        results = self.finish(prepared, self.run(prepared.features, batch_size=batch_size, **options), **options)
        truncated = count_truncated(results)
        if truncated:
            log.warning("%d of %d inputs were longer than %d pieces and were truncated%s", truncated, len(results),
                        self.max_length, _LONG_TEXT_HINT if self.task == "text-classification" else "")
        results = [self.runner.public(r) for r in results]
        return results[0] if single else results

    def prepare(self, inputs: Sequence[Any]) -> Prepared:
        """Examples and features of `inputs` (raises `InputError` naming the input at fault)."""
        return self.runner.prepare(list(inputs))

    def run(self, features: Sequence[Feature], batch_size: int | None = None,
            **options: Any) -> list[dict[str, np.ndarray]]:
        """The model's outputs for each feature, in feature order, from length-sorted batches (of
        `batch_size` rows, by default the pipeline's).

        Sorting by length puts rows of similar length in one batch, so little of each batch is padding;
        per-token outputs come back trimmed to the feature's own length.
        """
        was_training = getattr(self.model, "training", False)
        if hasattr(self.model, "eval"):
            self.model.eval()
        try:
            return run_batches(features, lambda batch: self.runner.forward(batch, **options),
                               token_outputs=self.runner.token_outputs,
                               batch_size=self.batch_size if batch_size is None else positive_int(batch_size, "batch_size"),
                               pad_id=self.tokenizer.pad_token_id, device=self.device)
        finally:
            if was_training and hasattr(self.model, "train"):
                self.model.train(True)

    def finish(self, prepared: Prepared, outputs: Sequence[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        """One result per input of `prepared`, from the outputs of its features."""
        return self.runner.finish(prepared, list(outputs), **options)

    def predict_file(self, input_path: str | Path, out_path: str | Path, **kwargs: Any) -> dict[str, Any]:
        """`predict_file(self, input_path, out_path, ...)`: see the module-level function."""
        return predict_file(self, input_path, out_path, **kwargs)


ON_ERROR = ("record", "skip", "stop")  # what predict_file does with a row the task cannot answer
_LONG_TEXT_HINT = " (long_text='windows' reads them whole)"


def count_truncated(results: Sequence[Any]) -> int:
    """How many results say their input was cut to max_length."""
    return sum(1 for r in results if isinstance(r, dict) and r.get("truncated"))


def canonical_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-")
    if key not in TASK_NAMES:
        names = sorted(set(TASK_NAMES.values()))
        raise ValueError(f"unknown pipeline task {task!r}; one of {', '.join(names)}")
    return TASK_NAMES[key]


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


def _model_device(model: Any) -> torch.device:
    import torch

    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# files in, files out: `bertforge predict --input`
# ------------------------------------------------------------------------------------------------
def input_columns(task: str, *, text_column: str = "text", pair_column: str | None = None,
                  question_column: str = "question", context_column: str = "context") -> dict[str, str]:
    """The input fields of `task` -> the file's column holding each."""
    if task == "question-answering":
        return {"question": question_column, "context": context_column}
    if task == "multiple-choice":  # SWAG's own columns
        return {"context": "sent1", "start": "sent2", **{f"ending{k}": f"ending{k}" for k in range(4)}}
    columns = {"text": text_column}
    if pair_column:
        if task != "text-classification":
            raise ValueError(f"a pair column goes with text-classification, not {task}")
        columns["text_pair"] = pair_column
    return columns


def predict_file(pipe: Pipeline, input_path: str | Path, out_path: str | Path, *, text_column: str = "text",
                 pair_column: str | None = None, question_column: str = "question",
                 context_column: str = "context", keep_columns: Sequence[str] = (), chunk_rows: int = 4096,
                 progress: bool = True, on_error: str = "record", keep_input: bool = True,
                 vector_dtype: str = "float32", **options: Any) -> dict[str, Any]:
    """Predict every row of a table (any `bertforge.tables` format, decided by `bertforge.formats`; plain
    lines only for a task that reads one text column) into `out_path` (.jsonl, .csv, .tsv).

    Rows are read `chunk_rows` at a time; each chunk is featurised, run in length-sorted batches and
    written in input order before the next chunk is read, so memory does not grow with the file.
    Each output row starts with where its input is and what it read (`keep_input`, the default): `row`
    (the input's line, or row in a Parquet file, as error messages count them and as fine-tuning's
    prediction files name it), the file's `id` column
    when it has one, and the text read (the text and pair columns; QA's question; nothing for multiple
    choice), so a row can be read on its own; `keep_columns` are copied after them. The output appears only
    when complete. An empty text is an input like any other where the task answers it (classification,
    tagging, embeddings, as transformers' pipelines do). A row the task cannot answer (a fill-mask text
    without [MASK], an empty question or context, an empty cell, a cell that is not text) is decided by `on_error`: "record" (the
    default) writes the row with `error` saying what is wrong, where it is ("FILE:LINE: COLUMN: ...")
    instead of a prediction, and goes on; "skip" leaves it out and goes on; "stop" ends the run with
    `DataFormatError` naming its line, and nothing is written. Returns {"rows", "seconds",
    "rows_per_second", "out", "truncated" (rows cut to max_length), "windowed" (rows read in more than
    one window), "errors" (rows recorded or skipped), "first_error"}.
    """
    from bertforge.formats import detect_format
    from bertforge.tables import LINES_COLUMN, TABLE_FORMATS, iter_rows, write_rows

    chunk_rows = positive_int(chunk_rows, "chunk_rows")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    input_path = Path(input_path)
    columns = input_columns(pipe.task, text_column=text_column, pair_column=pair_column,
                            question_column=question_column, context_column=context_column)
    echoed = echoed_columns(pipe.task, input_path, columns) if keep_input else []
    keep_columns = list(dict.fromkeys([*echoed, *keep_columns]))
    wanted = list(dict.fromkeys([*columns.values(), *keep_columns]))
    # plain lines have the one column "text": read a file as lines only when that is all the task needs
    accept = [f for f in TABLE_FORMATS if f != "lines" or set(wanted) <= {LINES_COLUMN}]
    rows = iter_rows(input_path, wanted, fmt=detect_format(input_path, accept))
    started, count, truncated, windowed, errors = time.perf_counter(), 0, 0, 0, []
    bar = _progress_bar(progress, input_path)
    try:
        writer = (embedding_matrix(out_path, vector_dtype, pipe.pooling) if Path(out_path).suffix == ".npy" and pipe.task == "embeddings"
                  else write_rows(out_path, always=("error",) if on_error == "record" else ()))
        with writer as write:
            for chunk in _chunks(rows, chunk_rows):
                results, failed = _predict_chunk(pipe, input_path, chunk, columns, options, stop=on_error == "stop")
                truncated += count_truncated(results)
                windowed += sum(1 for r in results if isinstance(r, dict) and r.get("windows", 1) > 1)
                answers = iter(results)
                for position, row in enumerate(chunk):
                    kept = {**({"row": row.number} if keep_input else {}),
                            **{name: row.values.get(name) for name in keep_columns}}
                    if position in failed:
                        errors.append(failed[position])
                        if on_error == "record":
                            write({**kept, "error": failed[position]})
                        continue
                    write({**kept, **output_row(pipe.task, next(answers), all_scores=pipe.all_scores)})
                count += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - started
    return {"rows": count, "seconds": seconds, "rows_per_second": count / seconds if seconds else math.inf,
            "out": str(out_path), "truncated": truncated, "windowed": windowed, "errors": len(errors),
            "first_error": errors[0] if errors else None}


@contextmanager
def embedding_matrix(path: str | Path, dtype: str = "float32",
                     pipe_pooling: str | None = None) -> Iterator[Callable[[dict[str, Any]], None]]:
    """The embeddings task's rows into a .npy matrix, one row per written row, streamed; beside it
    `<file>.index.json` (`bertforge.features.FeatureFile` reads the pair) keeps each row's other
    fields (its input row, id, text, error). A row recorded as an error is a row of NaN, so matrix row i
    is always item i of the index."""
    from bertforge.features import StreamingMatrix, index_path
    from bertforge.fileio import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    matrix: StreamingMatrix | None = None
    pending: list[dict[str, Any]] = []  # error rows before the first vector says the width
    index: list[dict[str, Any]] = []

    def write(row: dict[str, Any]) -> None:
        nonlocal matrix
        vector = row.pop("embedding", None)
        index.append({**row, "start": len(index), "end": len(index) + 1})  # FeatureFile's items
        if vector is None:
            if matrix is None:
                pending.append(row)
            else:
                matrix.append(np.full((1, matrix.row_shape[0]), np.nan))
            return
        if matrix is None:
            matrix = StreamingMatrix(path, (len(vector),), np.dtype(dtype))
            for _ in pending:
                matrix.append(np.full((1, len(vector)), np.nan))
        matrix.append(np.asarray(vector, dtype=np.float32)[None, :])

    try:
        yield write
    except BaseException:
        if matrix is not None:
            matrix.abort()
        raise
    if matrix is None:
        raise ValueError(f"{path}: no row could be embedded, so the vectors' width is unknown and no .npy was written")
    matrix.finish([], {})
    summary = {"format": "npy", "unit": "line", "pool": pipe_pooling, "row_shape": list(matrix.row_shape),
               "dtype": dtype, "rows": matrix.rows, "inputs": len(index)}
    write_text_atomic(index_path(path), json.dumps({**summary, "items": index}, ensure_ascii=False) + "\n")


def echoed_columns(task: str, path: Path, columns: dict[str, str]) -> list[str]:
    """The input columns an output row repeats: the file's `id` column if it has one, and the text read
    (a QA context and multiple choice's fields are left out: long, or several)."""
    from bertforge.tables import column_names, table_format

    try:  # a plain-lines file has the one column; a table's first record is read once more for its names
        found = [] if table_format(path) == "lines" else column_names(path)
    except (StopIteration, DataFormatError, OSError):
        found = []  # an empty or unreadable file: the reader says so in its own words
    texts = [] if task == "multiple-choice" else [c for field, c in columns.items() if field != "context"]
    return (["id"] if "id" in found and "id" not in texts else []) + texts


def _predict_chunk(pipe: Pipeline, path: Path, chunk: list[Any], columns: dict[str, str],
                   options: dict[str, Any], *, stop: bool) -> tuple[list[Any], dict[int, str]]:
    """(the results of the chunk's answerable rows, in order; {position in the chunk: what is wrong}
    for the others). With `stop` the first bad row raises `DataFormatError` instead."""
    failed: dict[int, str] = {}
    inputs: dict[int, Any] = {}
    for position, row in enumerate(chunk):
        try:
            inputs[position] = _row_input(path, row, columns, words=pipe.task == "token-classification")
        except DataFormatError as exc:
            if stop:
                raise
            failed[position] = str(exc)
    if pipe.task == "multiple-choice":
        inputs = {i: {"context": v["context"], "start": v["start"], "endings": [v[f"ending{k}"] for k in range(4)]}
                  for i, v in inputs.items()}
    while inputs:
        order = list(inputs)
        try:
            prepared = pipe.prepare([inputs[i] for i in order])
            break
        except InputError as exc:  # locate it in the file; without `stop`, set the row aside and go on
            position = order[exc.index]
            error = DataFormatError(path, chunk[position].number, columns.get(exc.field or "", exc.field), exc.detail)
            if stop:
                raise error from None
            failed[position] = str(error)
            del inputs[position]
    else:
        return [], failed  # no row of the chunk was answerable
    return pipe.finish(prepared, pipe.run(prepared.features, **options), **options), failed


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Lists of at most `size` items, pulled from `rows` only as each list is asked for."""
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _row_input(path: Path, row: Any, columns: dict[str, str], *, words: bool = False) -> dict[str, Any]:
    """The task's inputs of one row; with `words` (tagging) a list of words stands for a text split already."""
    values = {}
    for name, column in columns.items():
        value = row.values.get(column)
        if words and isinstance(value, list) and value:
            values[name] = value  # the runner checks each word
            continue
        if not isinstance(value, str):
            what = "empty" if value is None else (f"not text ({type(value).__name__}); name the column that "
                                                  "holds the text")
            raise DataFormatError(path, row.number, column, what)
        values[name] = value  # an empty text too: the task answers it, or says why not (InputError)
    return values


def _progress_bar(progress: bool, path: Path) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=f"predict {path.name}", unit=" rows", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


class _CallableModule(types.ModuleType):
    """`from bertforge import pipeline` gives this module; calling it calls `pipeline()`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Pipeline:
        return pipeline(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["TASK_NAMES", "InputError", "Pipeline", "Prepared", "canonical_task", "group_entities",
           "count_truncated", "input_columns", "output_row", "pipeline", "predict_file", "read_task_file", "split_tag",
           "use_engine"]
