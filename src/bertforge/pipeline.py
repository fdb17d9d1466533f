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
    embeddings             "text"                          {"embedding": [...]}  (pooling cls or mean)
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

import dataclasses
import itertools
import logging
import math
import sys
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.fileio import DataFormatError
from bertforge.finetuned import TaskRecord, label_names_of, load_for_inference
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
POOLINGS = ("mean", "cls", "pooler")
# What text classification does with a text longer than max_length: cut it (BERT's way, and what
# fine-tuning trained on), or read it whole in overlapping windows whose logits are averaged.
LONG_TEXT = ("truncate", "windows")


class InputError(ValueError):
    """An input the pipeline cannot use: `index` is its position in the call, `code` a short name
    (empty_text, no_mask, too_long, empty_context, bad_input) that serve returns as the error code."""

    def __init__(self, index: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"input {index}: {message}")
        self.index, self.code, self.detail, self.field = index, code, message, field


@dataclass
class Prepared:
    """What `prepare` made of the inputs: the task's examples and their model rows."""

    examples: list[Any]
    features: list[Feature]
    info: list[dict[str, Any]] = field(default_factory=list)  # per input: truncated, words, ...


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
                 pooling: str = "mean", normalize: bool = False, top_k: int = 5, long_text: str = "truncate",
                 window_stride: int | None = None, all_scores: bool = False) -> None:
        import torch

        task = canonical_task(task)
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.device = torch.device(device) if device else _model_device(model)
        self.batch_size = _positive(batch_size, "batch_size")
        self.config = model.config
        self.labels = label_names_of(model)
        self.spec = spec if spec is not None else default_task_for(task, self.labels, self.config)
        limit = min(self.config.max_tokens, tokenizer.model_max_length)
        # without a saved length: the model's limit, except for QA's windows (384 pieces, as fine-tuned)
        default = self.spec.default_max_length if task == "question-answering" and self.spec else limit
        self.max_length = min(_positive(max_length or default, "max_length"), limit)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.pooling, self.normalize, self.top_k = pooling, normalize, _positive(top_k, "top_k")
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
        self.window_stride = _positive(window_stride or max(body // 2, 1), "window_stride")
        if self.window_stride > body:
            raise ValueError(f"window_stride {self.window_stride} is longer than a window ({body} pieces "
                             f"besides [CLS] and [SEP] at max_length {self.max_length}): pieces would be skipped")
        self.precision = "fp32"  # what `pipeline()` applied (bertforge.precision)
        # None: the model runs itself (torch); else the ONNX Runtime engine runs its rows (bertforge.engine)
        self.engine: OnnxEngine | None = None
        self.engine_choice: EngineChoice | None = None  # which engine `pipeline()` chose, and why
        self.runner: _Runner = _RUNNERS[task](self)

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
        unknown = sorted(set(options) - set(self.runner.call_options))
        if unknown:
            takes = ", ".join(self.runner.call_options) or "none"
            raise TypeError(f"{self.task} pipeline: unknown option(s) {', '.join(unknown)} at call time (it takes: "
                            f"{takes}; the others are set when the pipeline is made)")
        single = not isinstance(inputs, list)
        batch = [inputs] if single else inputs
        if not batch:
            return []
        prepared = self.prepare(batch)
        results = self.finish(prepared, self.run(prepared.features, **options), **options)
        truncated = count_truncated(results)
        if truncated:
            log.warning("%d of %d inputs were longer than %d pieces and were truncated%s", truncated, len(results),
                        self.max_length, _LONG_TEXT_HINT if self.task == "text-classification" else "")
        results = [self.runner.public(r) for r in results]
        return results[0] if single else results

    def prepare(self, inputs: Sequence[Any]) -> Prepared:
        """Examples and features of `inputs` (raises `InputError` naming the input at fault)."""
        return self.runner.prepare(list(inputs))

    def run(self, features: Sequence[Feature], **options: Any) -> list[dict[str, np.ndarray]]:
        """The model's outputs for each feature, in feature order, from length-sorted batches.

        Sorting by length puts rows of similar length in one batch, so little of each batch is padding;
        per-token outputs come back trimmed to the feature's own length.
        """
        was_training = getattr(self.model, "training", False)
        if hasattr(self.model, "eval"):
            self.model.eval()
        try:
            return run_batches(features, lambda batch: self.runner.forward(batch, **options),
                               token_outputs=self.runner.token_outputs, batch_size=self.batch_size,
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
    ("mean", "cls", "pooler") and `normalize` for embeddings, `top_k` for fill-mask, `all_scores` for
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
    model_dir = Path(model)
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
    pipe = Pipeline(loaded, found.tokenizer, chosen, spec=spec, max_length=max_length, batch_size=batch_size,
                    device=device, **options)
    if engine == "torch":
        pipe.precision = found.precision
        pipe.engine_choice = EngineChoice("torch", found.precision, "asked for")
        return pipe
    use_engine(pipe, engine, precision, model_dir=model_dir, device=device, calibrate=engine_calibrate)
    return pipe


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


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _text(value: Any, index: int, what: str = "text") -> str:
    if not isinstance(value, str):
        raise InputError(index, "bad_input", f"{what} must be a string, got {type(value).__name__}", what)
    if not value.strip():
        raise InputError(index, "empty_text", f"{what} is empty", what)
    return value


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------------------------
# one runner per task: inputs -> task examples -> features; outputs -> task predictions -> results
# ------------------------------------------------------------------------------------------------
class _Runner:
    token_outputs: ClassVar[tuple[str, ...]] = ()
    call_options: ClassVar[tuple[str, ...]] = ()  # what a call may change (`pipe(inputs, **options)`)

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe

    @property
    def spec(self) -> Task:
        assert self.pipe.spec is not None
        return self.pipe.spec

    def prepare(self, inputs: list[Any]) -> Prepared:
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor], **options: Any) -> dict[str, torch.Tensor]:
        if self.pipe.engine is not None:  # the head's graph: its outputs under the same names
            found = self.pipe.engine.run(batch)
            return {name: found[name] for name in self.spec.output_names}
        output = self.pipe.model(**batch)
        return {name: getattr(output, name) for name in self.spec.output_names}

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        raise NotImplementedError

    def public(self, result: Any) -> Any:
        """What `Pipeline.__call__` returns for one result (serve and predict may read more of it)."""
        return result


def _top_k(value: Any) -> int | None:
    """A call's top_k for text classification: None (every label, ranked) or a positive count."""
    return None if value is None else _positive(value, "top_k")


class _Classification(_Runner):
    """Sentence (pair) classification, multi-label classification and regression, through the task's
    featurize (BERT's truncation) and postprocess (a GLUE task's argmax, or the classify family's
    softmax, per-label sigmoid thresholds tuned on dev, or value). A call's `top_k` (None: every
    label) answers as transformers' text-classification pipeline does: the ranked labels and scores."""

    call_options = ("top_k",)

    def prepare(self, inputs: list[Any]) -> Prepared:
        pairs = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                text, pair = item.get("text"), item.get("text_pair")
            elif _is_pair(item):
                text, pair = item
            else:
                text, pair = item, None
            pairs.append((_text(text, i), None if pair is None else _text(pair, i, "text_pair")))
        examples = [self.spec.inference_example(i, {"text": text, "text_pair": pair})
                    for i, (text, pair) in enumerate(pairs)]
        if self.pipe.long_text == "windows":
            return self._windows(examples, pairs)
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        return Prepared(examples, features, [{"truncated": self._truncated(pair, f), "windows": 1}
                                             for pair, f in zip(pairs, features, strict=True)])

    def _windows(self, examples: list[Any], pairs: list[tuple[str, str | None]]) -> Prepared:
        """`[CLS] window [SEP]` rows over each whole text, a window starting every `window_stride` pieces
        until one reaches the text's end; a text that fits gives the one row truncation would give."""
        tokenizer, body = self.pipe.tokenizer, self.pipe.max_length - 2
        features, info = [], []
        for i, (text, pair) in enumerate(pairs):
            if pair is not None:
                raise InputError(i, "bad_input", "long_text='windows' reads single texts; this input has a "
                                 "text_pair (use long_text='truncate' for pairs)", "text_pair")
            pieces = tokenizer.encode(text, max_length=10**9, add_special_tokens=False).input_ids
            starts = list(range(0, max(len(pieces) - body, 0) + 1, self.pipe.window_stride))
            if starts[-1] + body < len(pieces):  # the stride stepped past the last full window: add it
                starts.append(len(pieces) - body)
            for start in starts:
                ids = [tokenizer.cls_token_id, *pieces[start:start + body], tokenizer.sep_token_id]
                features.append(Feature({"input_ids": ids, "token_type_ids": [0] * len(ids)}, i))
            info.append({"truncated": False, "windows": len(starts)})
        return Prepared(examples, features, info)

    def _truncated(self, pair: tuple[str, str | None], feature: Feature) -> bool:
        if feature.length < self.pipe.max_length:
            return False  # shorter than the limit: nothing was cut
        # one token more than the row holds is enough to tell, and keeps a 10 MB text from being encoded whole
        longer = self.pipe.tokenizer.encode(*pair, max_length=feature.length + 1, truncation=True)
        return len(longer) > feature.length

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        asked = {"top_k": _top_k(options["top_k"])} if "top_k" in options else {}
        features = prepared.features
        if len(features) != len(prepared.examples):  # windows: one row per example, its windows' mean logits
            features, outputs = _pool_windows(features, outputs, len(prepared.examples))
        predictions = self.spec.postprocess(prepared.examples, features, outputs, label_names=self.pipe.labels)
        return [{**self._result(prediction, output["logits"]), "truncated": info["truncated"],
                 "windows": info["windows"], **asked}
                for prediction, output, info in zip(predictions, outputs, prepared.info, strict=True)]

    def _result(self, prediction: Any, logits: np.ndarray) -> dict[str, Any]:
        if isinstance(prediction, dict):  # the classify family decides labels and scores itself
            scores = prediction.get("scores") or {}
            ranked = [{"label": n, "score": float(p)} for n, p in sorted(scores.items(), key=lambda x: -x[1])]
            if "labels" in prediction:  # multi-label: every label at or above its tuned threshold
                return {"labels": list(prediction["labels"]), "scores": ranked}
            if "label" in prediction:
                return {"label": prediction["label"], "score": float(prediction["score"]), "scores": ranked}
            return {"value": float(prediction["score"])}  # regression
        if logits.shape[-1] == 1:  # a GLUE regression task (STS-B): the predicted value
            return {"value": float(prediction)}
        probabilities = _softmax(logits)
        ranked = sorted(zip(self.pipe.labels, probabilities.tolist(), strict=True), key=lambda x: -x[1])
        return {"label": self.pipe.labels[int(prediction)], "score": float(probabilities[int(prediction)]),
                "scores": [{"label": n, "score": p} for n, p in ranked]}

    def public(self, result: Any) -> Any:
        if "top_k" in result and "scores" in result:  # asked for at call time: the ranked labels, as transformers
            return result["scores"] if result["top_k"] is None else result["scores"][:result["top_k"]]
        return output_row(self.pipe.task, result, all_scores=self.pipe.all_scores)


def _pool_windows(features: Sequence[Feature], outputs: Sequence[dict[str, np.ndarray]],
                  examples: int) -> tuple[list[Feature], list[dict[str, np.ndarray]]]:
    """Per example, its first window's feature and the mean of its windows' logits (pooled logits: the
    class evidence of every part of the text counts alike, wherever it sits)."""
    sums: list[np.ndarray | None] = [None] * examples
    counts = [0] * examples
    first: list[Feature | None] = [None] * examples
    for feature, output in zip(features, outputs, strict=True):
        i = feature.example
        logits = np.asarray(output["logits"], dtype=np.float64)
        sums[i] = logits if sums[i] is None else sums[i] + logits
        counts[i] += 1
        first[i] = first[i] or feature
    pooled = [{"logits": (total / count).astype(np.float32)} for total, count in zip(sums, counts, strict=True)]
    return [f for f in first if f is not None], pooled


class _TokenClassification(_Runner):
    """Words found by BERT's pre-tokeniser (with their characters), tagged by the NER task's word
    windows; entities grouped from the word tags (transformers' aggregation "simple", word level)."""

    token_outputs = ("logits",)

    def prepare(self, inputs: list[Any]) -> Prepared:
        pre_tokenize = self.pipe.tokenizer.words  # words with their characters (byte-level BPE's without the space)
        examples, info = [], []
        for i, item in enumerate(inputs):
            text = _text(item.get("text") if isinstance(item, dict) else item, i)
            words = pre_tokenize(text)  # [(word, (start, end))]
            examples.append(self.spec.inference_example(i, {"words": [w for w, _ in words]}))
            info.append({"text": text, "spans": [span for _, span in words]})
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        return Prepared(examples, features, info)

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        predictions = self.spec.postprocess(prepared.examples, prepared.features, outputs,
                                            label_names=self.pipe.labels)
        tags = [getattr(p, "tags", p) for p in predictions]  # the tag family gives tags with scores
        scores = [[0.0] * len(e.words) for e in prepared.examples]
        for feature, output in zip(prepared.features, outputs, strict=True):
            window = feature.meta  # the word's score comes from the window its tag came from
            probabilities = _softmax(output["logits"])  # (T, num_labels)
            for offset, (position, chosen) in enumerate(zip(window.token_of_word, window.max_context, strict=True)):
                if chosen:
                    scores[feature.example][window.first_word + offset] = float(probabilities[position].max())
        results = []
        for example_tags, example_scores, info in zip(tags, scores, prepared.info, strict=True):
            text = info["text"]
            words = [{"word": text[s:e], "label": tag, "score": score, "start": s, "end": e}
                     for tag, score, (s, e) in zip(example_tags, example_scores, info["spans"], strict=True)]
            results.append({"entities": group_entities(text, words), "words": words})
        return results

    def public(self, result: Any) -> Any:
        return result["entities"]


def split_tag(label: str) -> tuple[str, str | None]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', None); a bare 'PER' (IO tagging) -> ('I', 'PER')."""
    if label == "O" or not label:
        return "O", None
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIESbies":
        return label[0].upper(), label[2:]
    return "I", label


def group_entities(text: str, words: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tagged words -> entities: a B- or S- tag (or a change of type) starts one, I- and E- of the same
    type continue it; the score is the mean of its words' scores (transformers' "simple" aggregation)."""
    entities: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            start, end = current["start"], current["end"]
            entities.append({"label": current["label"], "text": text[start:end], "start": start, "end": end,
                             "score": sum(current["scores"]) / len(current["scores"])})

    for word in words:
        tag, kind = split_tag(word["label"])
        if kind is None:
            close()
            current = None
        elif current is not None and tag in ("I", "E") and kind == current["label"]:
            current["end"] = word["end"]
            current["scores"].append(word["score"])
        else:
            close()
            current = {"label": kind, "start": word["start"], "end": word["end"], "scores": [word["score"]]}
    close()
    return entities


class _QuestionAnswering(_Runner):
    """SQuAD's windows and answer search (tasks/squad.py) with the model's saved settings: doc stride,
    max query length and, for a SQuAD v2.0 model, the null threshold tuned on dev."""

    call_options = ("allow_no_answer", "max_answer_tokens")

    token_outputs = ("start_logits", "end_logits")

    def prepare(self, inputs: list[Any]) -> Prepared:
        examples = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                question, context = item.get("question"), item.get("context")
            elif isinstance(item, tuple | list) and len(item) == 2:
                question, context = item
            else:
                raise InputError(i, "bad_input", "a question-answering input is {'question': ..., 'context': ...} "
                                                 "or a (question, context) pair")
            examples.append(self.spec.inference_example(i, {"question": _text(question, i, "question"),
                                                             "context": _text(context, i, "context")}))
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        for feature in features:
            if feature.meta.length == 0:
                raise InputError(feature.example, "empty_context",
                                 "the context has no tokens (only control or unknown characters?)", "context")
        return Prepared(examples, features, [{} for _ in examples])

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *,
               allow_no_answer: bool | None = None, max_answer_tokens: int | None = None, **options: Any) -> list[Any]:
        spec = self._variant(allow_no_answer, max_answer_tokens)
        predictions = spec.postprocess(prepared.examples, prepared.features, outputs)
        return [self._result(p, spec.version == "2.0" and allow_no_answer is not False) for p in predictions]

    def _variant(self, allow_no_answer: bool | None, max_answer_tokens: int | None) -> Task:
        """The task with this call's answer rules: a v1.1 model asked to allow no answer is read as a
        v2.0 one with threshold 0 (no answer when [CLS] outscores the best span)."""
        changes: dict[str, Any] = {}
        if max_answer_tokens is not None:
            changes["max_answer_length"] = _positive(max_answer_tokens, "max_answer_tokens")
        if allow_no_answer and self.spec.version != "2.0":
            changes.update(version="2.0", null_threshold=0.0)
        if not changes:
            return self.spec
        return dataclasses.replace(self.spec, settings={**self.spec.settings, **changes})

    @staticmethod
    def _result(prediction: Any, may_abstain: bool) -> dict[str, Any]:
        """The answer with the softmax probability of its span among the n-best; with no answer, the
        probability of [CLS] among [CLS] and those spans."""
        best = prediction.nbest[0] if prediction.nbest else None
        null_odds = prediction.null_odds
        if best is None or (may_abstain and prediction.text == "" and null_odds is not None):
            score = 1.0
            if best is not None and null_odds is not None:  # null score = best span score + odds
                spans = np.array([c["score"] for c in prediction.nbest]) - best["score"] - null_odds
                score = float(1.0 / (1.0 + np.exp(spans).sum()))
            return {"answer": "", "score": score, "start": None, "end": None, "no_answer": True,
                    "null_odds": null_odds}
        return {"answer": best["text"], "score": float(best["probability"]), "start": best["start"],
                "end": best["end"], "no_answer": False, "null_odds": null_odds}

    def public(self, result: Any) -> Any:
        return {k: v for k, v in result.items() if k != "null_odds" or v is not None}


class _FillMask(_Runner):
    """The top-k tokens for every [MASK] of a text (special tokens never predicted)."""

    token_outputs = ("mask_scores", "mask_ids")
    call_options = ("top_k",)

    def prepare(self, inputs: list[Any]) -> Prepared:
        tok = self.pipe.tokenizer
        features, info = [], []
        for i, item in enumerate(inputs):
            text = _text(item.get("text") if isinstance(item, dict) else item, i)
            encoding = tok.encode(text, max_length=10**9)
            if len(encoding) > self.pipe.max_length:
                raise InputError(i, "too_long", f"the text is {len(encoding)} tokens (special tokens included); "
                                                f"at most {self.pipe.max_length}", "text")
            masks = [(p, *encoding.offsets[p]) for p, t in enumerate(encoding.input_ids) if t == tok.mask_token_id]
            if not masks:
                raise InputError(i, "no_mask", f"the text has no {tok.mask_token} token; put {tok.mask_token} "
                                               f"where a word should be predicted", "text")
            features.append(Feature({"input_ids": encoding.input_ids, "token_type_ids": encoding.token_type_ids}, i))
            info.append({"text": text, "masks": masks})
        return Prepared(list(inputs), features, info)

    def forward(self, batch: dict[str, torch.Tensor], *, top_k: int | None = None,
                **options: Any) -> dict[str, torch.Tensor]:
        import torch

        model = self.pipe.model
        k = min(top_k or self.pipe.top_k, self.pipe.config.vocab_size)
        if self.pipe.engine is not None:  # the graph's top tokens at every position; the masks' are read
            return self._from_graph(batch, k)
        hidden = model.base_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        masked = batch["input_ids"] == self.pipe.tokenizer.mask_token_id  # (B, T)
        # only the masked positions go through the vocabulary projection: (N, H) -> (N, V)
        logits = model.masked_lm_logits(hidden[masked]).float()
        logits[:, sorted(set(self.pipe.tokenizer.all_special_ids))] = -math.inf
        top = logits.softmax(-1).topk(k, dim=-1)
        shape = (*masked.shape, k)
        scores = torch.zeros(shape, device=logits.device)
        ids = torch.zeros(shape, dtype=torch.long, device=logits.device)
        scores[masked], ids[masked] = top.values, top.indices
        return {"mask_scores": scores, "mask_ids": ids}  # (B, T, k) each; zero off the masks

    def _from_graph(self, batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        from bertforge.engine import FILL_MASK_TOP_K

        assert self.pipe.engine is not None
        if k > FILL_MASK_TOP_K:
            raise ValueError(f"top_k {k}: the onnxruntime engine gives at most {FILL_MASK_TOP_K} tokens per "
                             "[MASK]; use the torch engine for more")
        found = self.pipe.engine.run(batch)
        masked = (batch["input_ids"] == self.pipe.tokenizer.mask_token_id).unsqueeze(-1).cpu()  # (B, T, 1)
        return {"mask_scores": found["mask_scores"][..., :k] * masked,
                "mask_ids": found["mask_ids"][..., :k] * masked}

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *, top_k: int | None = None,
               **options: Any) -> list[Any]:
        tok, k = self.pipe.tokenizer, top_k or self.pipe.top_k
        results = []
        for output, info in zip(outputs, prepared.info, strict=True):
            text, found = info["text"], []
            for position, start, end in info["masks"]:
                predictions = []
                for score, token_id in zip(output["mask_scores"][position][:k].tolist(),
                                           output["mask_ids"][position][:k].astype(int).tolist(), strict=True):
                    token = tok.convert_ids_to_tokens(token_id)
                    word = token[2:] if token.startswith("##") else token
                    predictions.append({"token": token, "token_id": token_id, "score": score,
                                        "sequence": text[:start] + word + text[end:]})
                found.append({"position": position, "start": start, "end": end, "predictions": predictions})
            results.append(found)
        return results

    def public(self, result: Any) -> Any:
        return [mask["predictions"] for mask in result]


class _Embeddings(_Runner):
    """One vector per text from the final layer: the [CLS] vector, the mean of the real tokens
    (specials included, as sentence-transformers does), or the pooler's output."""

    call_options = ("pooling", "normalize")

    def prepare(self, inputs: list[Any]) -> Prepared:
        texts = [_text(item.get("text") if isinstance(item, dict) else item, i) for i, item in enumerate(inputs)]
        encoded = self.pipe.tokenizer.encode_batch(texts, max_length=10**9)
        features, info = [], []
        for i, encoding in enumerate(encoded["encodings"]):
            ids, types = encoding.input_ids, encoding.token_type_ids
            truncated = len(ids) > self.pipe.max_length
            if truncated:  # keep the head, end with [SEP]
                ids = ids[:self.pipe.max_length - 1] + [self.pipe.tokenizer.sep_token_id]
                types = types[:self.pipe.max_length]
            features.append(Feature({"input_ids": ids, "token_type_ids": types}, i))
            info.append({"truncated": truncated, "tokens": len(ids)})
        return Prepared(texts, features, info)

    def forward(self, batch: dict[str, torch.Tensor], **options: Any) -> dict[str, torch.Tensor]:
        if self.pipe.engine is not None:  # the pooled graph: cls, mean (and pooler) computed inside it
            return self.pipe.engine.run(batch)
        backbone = getattr(self.pipe.model, "base_model", self.pipe.model)
        out = backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        hidden = out.last_hidden_state.float()  # (B, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        vectors = {"cls": hidden[:, 0], "mean": (hidden * mask).sum(1) / mask.sum(1)}
        if out.pooled_output is not None:
            vectors["pooler"] = out.pooled_output
        return vectors

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *, pooling: str | None = None,
               normalize: bool | None = None, **options: Any) -> list[Any]:
        pooling = pooling or self.pipe.pooling
        normalize = self.pipe.normalize if normalize is None else normalize
        results = []
        for output, info in zip(outputs, prepared.info, strict=True):
            if pooling not in output:
                raise ValueError("this model has no pooler; use pooling 'mean' or 'cls'")
            vector = output[pooling].astype(np.float64)
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            results.append({"embedding": vector.tolist(), "pooling": pooling, **info})
        return results

    def public(self, result: Any) -> Any:
        return {"embedding": result["embedding"]}


class _MultipleChoice(_Runner):
    """SWAG's four endings: each `[CLS] context [SEP] start ending [SEP]`, a softmax over their scores."""

    def prepare(self, inputs: list[Any]) -> Prepared:
        choices = self.spec.num_choices  # type: ignore[attr-defined]
        examples = []
        for i, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("endings"), list | tuple):
                raise InputError(i, "bad_input", "a multiple-choice input is {'context': ..., 'start': ... "
                                                 "(optional), 'endings': [four texts]}")
            endings = [_text(e, i, f"ending{k}") for k, e in enumerate(item["endings"])]
            if len(endings) != choices:
                raise InputError(i, "bad_input", f"{len(endings)} endings; the model chooses among {choices}",
                                 "endings")
            examples.append(self.spec.inference_example(i, {"context": _text(item.get("context"), i, "context"),
                                                             "start": item.get("start") or "", "endings": endings}))
        return Prepared(examples, self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length))

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        choices = self.spec.postprocess(prepared.examples, prepared.features, outputs)
        results = []
        for example, choice, output in zip(prepared.examples, choices, outputs, strict=True):
            probabilities = _softmax(output["logits"])
            results.append({"choice": int(choice), "ending": example.endings[choice],
                            "score": float(probabilities[choice]), "scores": probabilities.tolist()})
        return results

    def public(self, result: Any) -> Any:
        return {k: result[k] for k in ("choice", "ending", "score")}


_RUNNERS: dict[str, type[_Runner]] = {
    "text-classification": _Classification, "token-classification": _TokenClassification,
    "question-answering": _QuestionAnswering, "fill-mask": _FillMask, "embeddings": _Embeddings,
    "multiple-choice": _MultipleChoice,
}


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


def output_row(task: str, result: Any, *, all_scores: bool = False) -> dict[str, Any]:
    """The row `predict_file` writes for one result (lists are JSON text in a CSV file)."""
    if task == "text-classification":
        keys = ("label", "labels", "score", "value") + (("scores",) if all_scores else ())
        return {k: result[k] for k in keys if k in result}
    if task == "token-classification":
        return {"entities": result["entities"]}
    if task == "question-answering":
        return {k: result[k] for k in ("answer", "score", "start", "end", "no_answer")}
    if task == "fill-mask":
        return {"predictions": [mask["predictions"] for mask in result]}
    if task == "multiple-choice":
        return {k: result[k] for k in ("choice", "score")}
    return {"embedding": result["embedding"]}


def predict_file(pipe: Pipeline, input_path: str | Path, out_path: str | Path, *, text_column: str = "text",
                 pair_column: str | None = None, question_column: str = "question",
                 context_column: str = "context", keep_columns: Sequence[str] = (), chunk_rows: int = 4096,
                 progress: bool = True, **options: Any) -> dict[str, Any]:
    """Predict every row of a table (any `bertforge.tables` format, decided by `bertforge.formats`; plain
    lines only for a task that reads one text column) into `out_path` (.jsonl, .csv, .tsv).

    Rows are read `chunk_rows` at a time; each chunk is featurised, run in length-sorted batches and
    written in input order before the next chunk is read, so memory does not grow with the file.
    `keep_columns` are copied from the input row in front of the prediction. The output appears only
    when complete (a bad row stops the run with `DataFormatError` naming its line, and nothing is
    written). Returns {"rows", "seconds", "rows_per_second", "out", "truncated" (rows cut to
    max_length), "windowed" (rows read in more than one window)}.
    """
    from bertforge.formats import detect_format
    from bertforge.tables import LINES_COLUMN, TABLE_FORMATS, iter_rows, write_rows

    chunk_rows = _positive(chunk_rows, "chunk_rows")
    input_path = Path(input_path)
    columns = input_columns(pipe.task, text_column=text_column, pair_column=pair_column,
                            question_column=question_column, context_column=context_column)
    wanted = list(dict.fromkeys([*columns.values(), *keep_columns]))
    # plain lines have the one column "text": read a file as lines only when that is all the task needs
    accept = [f for f in TABLE_FORMATS if f != "lines" or set(wanted) <= {LINES_COLUMN}]
    rows = iter_rows(input_path, wanted, fmt=detect_format(input_path, accept))
    started, count, truncated, windowed = time.perf_counter(), 0, 0, 0
    bar = _progress_bar(progress, input_path)
    try:
        with write_rows(out_path) as write:
            for chunk in _chunks(rows, chunk_rows):
                results = _predict_chunk(pipe, input_path, chunk, columns, options)
                truncated += count_truncated(results)
                windowed += sum(1 for r in results if isinstance(r, dict) and r.get("windows", 1) > 1)
                for row, result in zip(chunk, results, strict=True):
                    write({**{name: row.values[name] for name in keep_columns},
                           **output_row(pipe.task, result, all_scores=pipe.all_scores)})
                count += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - started
    return {"rows": count, "seconds": seconds, "rows_per_second": count / seconds if seconds else math.inf,
            "out": str(out_path), "truncated": truncated, "windowed": windowed}


def _predict_chunk(pipe: Pipeline, path: Path, chunk: list[Any], columns: dict[str, str],
                   options: dict[str, Any]) -> list[Any]:
    inputs = [_row_input(path, row, columns) for row in chunk]
    if pipe.task == "multiple-choice":
        inputs = [{"context": v["context"], "start": v["start"], "endings": [v[f"ending{k}"] for k in range(4)]}
                  for v in inputs]
    try:
        prepared = pipe.prepare(inputs)
    except InputError as exc:  # locate it in the file
        raise DataFormatError(path, chunk[exc.index].number, columns.get(exc.field or "", exc.field),
                              exc.detail) from None
    return pipe.finish(prepared, pipe.run(prepared.features, **options), **options)


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Lists of at most `size` items, pulled from `rows` only as each list is asked for."""
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _row_input(path: Path, row: Any, columns: dict[str, str]) -> dict[str, Any]:
    values = {}
    for name, column in columns.items():
        value = row.values.get(column)
        if not isinstance(value, str):
            what = "empty" if value is None else (f"not text ({type(value).__name__}); name the column that "
                                                  "holds the text")
            raise DataFormatError(path, row.number, column, what)
        if not value.strip():
            raise DataFormatError(path, row.number, column, "empty text")
        values[name] = value
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
