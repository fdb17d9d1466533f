"""The `Pipeline`: a model, its tokenizer and one task's pre- and post-processing, called on inputs.

Every task goes through the fine-tuning task's own code (`bertforge.tasks`): its `featurize` makes the
model rows (GLUE truncation, NER word windows, SQuAD question + context windows) and its
`postprocess` turns outputs into predictions (argmax, the word's max-context window, SQuAD's n-best
span search and null threshold), so a prediction here is exactly what fine-tuning scored.

A call runs in three steps, which `serve` drives separately (tokenising in its event loop, the model
on its model thread, several requests in one batch):

    prepared = pipe.prepare(inputs)            examples and features (model rows); InputError if unusable
    outputs = pipe.run(prepared.features)      length-sorted batches of `batch_size`, outputs in feature order
    results = pipe.finish(prepared, outputs)   one result per input
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertforge.model.base import label_names_of
from bertforge.pipeline.runners import RUNNERS, Prepared, Runner, count_truncated, positive_int
from bertforge.tasks import default_task_for
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
# the package's name, as before the package was split into modules: what users and serve configure
log = logging.getLogger("bertforge.pipeline")
POOLINGS = ("mean", "cls", "max", "pooler")
# What text classification does with a text longer than max_length: cut it (BERT's way, and what
# fine-tuning trained on), or read it whole in overlapping windows whose logits are averaged.
LONG_TEXT = ("truncate", "windows")
CALL_OPTIONS = ("batch_size",)  # what any call may change, beside its task's own options
_LONG_TEXT_HINT = " (long_text='windows' reads them whole)"


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
        (question, context) tuple, a dict) and gives one result. See `bertforge.pipeline`'s docstring."""
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
        """`predict_file(self, input_path, out_path, ...)`: see `bertforge.pipeline.files.predict_file`."""
        from bertforge.pipeline.files import predict_file

        return predict_file(self, input_path, out_path, **kwargs)


def canonical_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-")
    if key not in TASK_NAMES:
        names = sorted(set(TASK_NAMES.values()))
        raise ValueError(f"unknown pipeline task {task!r}; one of {', '.join(names)}")
    return TASK_NAMES[key]


def _model_device(model: Any) -> torch.device:
    import torch

    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")
