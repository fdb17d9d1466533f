"""Generic task heads: what a head other than the family's own reads, and how a directory records it.

Two fine-tuning set-ups of the BERT paper need a head that no family's classes have:

- a *frozen* encoder (the feature-based approach, section 5.3): the encoder's weights do not change
  and only the output layer (and any layer-mixing weights) trains, on the hidden states of one or
  more layers chosen by name (`LAYER_CHOICES`, the names of `bertforge.features.STRATEGIES`, plus a
  learnt mix);
- a *BiLSTM head* (Table 5's "+ BiLSTM" row): a randomly initialised one-layer bidirectional LSTM
  over the encoder's token vectors, under the task's usual output layer.

A third reads a sentence's vector differently: *mean pooling*, the average of the real tokens' final
vectors in place of [CLS]'s (what sentence-transformers models are trained with; for a small encoder
whose [CLS] only a sentence-pair task trained, the token vectors are what masked LM shaped).

This module is the head's description, without torch (recipes are built from it before torch is
imported): the names, the `TaskHead` record that config.json keeps under `task_head` so that every
loader builds the same model again, and which hidden states each layer choice reads. The modules
themselves (`TaskHeadModel`, the layer mix, the BiLSTM) are in `bertforge.model.base`, beside the
class every family's models derive from, because its `from_pretrained` builds them when a
directory's config.json names such a head.

transformers has no class for such a head, and config.json's `architectures` names bertforge's
(`BertForSequenceClassificationWithTaskHead`), which transformers does not have: its `AutoModel`
loads the encoder of such a directory, and nothing names a transformers head it would run untrained
in this one's place. bertforge's loaders (`load_any`, `pipeline`, `predict`, `serve`) read
`task_head` and build the head that was trained; a linear head on the mean token vector is also
saved in the setfit package's layout, which `SetFitModel.from_pretrained` runs as trained
(`bertforge.model.sentence.save_setfit_files`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# config.json's key for the record, and the prefix of the head's weights in model.safetensors
TASK_HEAD_KEY = "task_head"
TASK_HEAD_PREFIX = "task_head."

# "linear": the task's usual output layer alone; "bilstm": a BiLSTM under it
HEADS = ("linear", "bilstm")
# The hidden states the head reads. The first six are `bertforge.features.STRATEGIES` (the feature-
# based NER ablation's rows, the paper's Table 7): 0 = the embeddings' output, i = layer i's.
# weighted_sum_all mixes layers 1..L with learnt softmax weights and a learnt scale (ELMo's scalar mix).
LAYER_CHOICES = ("last", "second_to_last", "sum_last_four", "concat_last_four", "sum_all", "weighted_sum_all",
                 "embeddings")
# the jobs a generic head can do
HEAD_JOBS = ("sequence-classification", "token-classification", "question-answering", "multiple-choice")
# how a sentence job's head reads one vector per row: the first token's ([CLS]), or the mean of the real tokens'
POOLINGS = ("cls", "mean")
SENTENCE_JOBS = ("sequence-classification", "multiple-choice")

_NOTE = ("bertforge task head: transformers loads this directory's encoder but not this head "
         "(its task_head.* weights); load it with bertforge (pipeline, predict, serve, load_any), or with "
         "setfit (SetFitModel.from_pretrained) where the directory has model_head.pkl")


def check_head(head: str) -> str:
    """`head` if it is one of HEADS, else a one-line ValueError naming them."""
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    return head


def check_layers(layers: str) -> str:
    """`layers` if it is one of LAYER_CHOICES, else a one-line ValueError naming them."""
    if layers not in LAYER_CHOICES:
        raise ValueError(f"unknown layer choice {layers!r}; choose one of {', '.join(LAYER_CHOICES)}")
    return layers


def layer_indices(layers: str, num_layers: int) -> tuple[tuple[int, ...], str]:
    """The hidden-state indices a layer choice reads in an L-layer encoder (0 = embeddings, i = layer i)
    and how they combine: "one", "sum", "concat" or "weighted" (learnt).

    The same indices as `bertforge.features.resolve_layers` for the six shared names, so a frozen
    head reads exactly what `bertforge extract` and the NER ablation read.
    """
    check_layers(layers)
    if layers in ("sum_last_four", "concat_last_four") and num_layers < 4:
        raise ValueError(f"{layers} needs at least 4 layers; this model has {num_layers}")
    if layers == "second_to_last" and num_layers < 2:
        raise ValueError("second_to_last needs at least 2 layers; this model has 1")
    last_four = tuple(range(num_layers - 3, num_layers + 1))
    every = tuple(range(1, num_layers + 1))
    return {
        "last": ((num_layers,), "one"),
        "second_to_last": ((num_layers - 1,), "one"),
        "embeddings": ((0,), "one"),
        "sum_last_four": (last_four, "sum"),
        "concat_last_four": (last_four, "concat"),
        "sum_all": (every, "sum"),
        "weighted_sum_all": (every, "weighted"),
    }[layers]


def input_width(layers: str, hidden_size: int, num_layers: int) -> int:
    """The width of the vectors a layer choice gives the head: H, or 4H for concat_last_four."""
    indices, combine = layer_indices(layers, num_layers)
    return hidden_size * len(indices) if combine == "concat" else hidden_size


def default_lstm_size(hidden_size: int) -> int:
    """Units per direction of the BiLSTM head when not given: H / 2, so that its two directions
    together are as wide as the encoder (384 for BERT-base's 768): the output layer then has the
    usual head's width, and the LSTM adds about 3 H^2 weights, a third of a Transformer layer's 12 H^2."""
    return max(1, hidden_size // 2)


def check_pooling(pooling: str) -> str:
    """`pooling` if it is one of POOLINGS, else a one-line ValueError naming them."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


def uses_task_head(head: str, frozen: bool, layers: str, pooling: str = "cls") -> bool:
    """Whether these settings need the generic head (else the family's own head, fine-tuned as usual)."""
    return check_head(head) != "linear" or frozen or check_layers(layers) != "last" or check_pooling(pooling) != "cls"


@dataclass(frozen=True)
class TaskHead:
    """config.json's `task_head`: the head a directory's weights belong to.

    `job` is the model job (sequence-classification, token-classification, question-answering,
    multiple-choice); `head` "linear" or "bilstm"; `frozen` whether the encoder was kept as
    loaded; `layers` the hidden states read (LAYER_CHOICES); `lstm_size` the BiLSTM's units per
    direction (None: `default_lstm_size`, filled in when the model is built); `pooling` how a
    sentence job reads one vector per row (POOLINGS; "mean" with the linear head only); `normalize`
    whether that mean is scaled to unit length first (what a sentence-transformers model with a
    Normalize module gives, and what a SetFit head is fitted on).
    """

    job: str
    head: str = "linear"
    frozen: bool = False
    layers: str = "last"
    lstm_size: int | None = None
    pooling: str = "cls"
    normalize: bool = False

    def __post_init__(self) -> None:
        if self.job not in HEAD_JOBS:
            raise ValueError(f"a task head does {', '.join(HEAD_JOBS)}, not {self.job!r}")
        check_head(self.head)
        check_layers(self.layers)
        check_pooling(self.pooling)
        if self.pooling != "cls" and (self.job not in SENTENCE_JOBS or self.head != "linear"):
            raise ValueError(f"pooling {self.pooling} is for sentence jobs ({', '.join(SENTENCE_JOBS)}) under the "
                             f"linear head, not a {self.job} {self.head} head")
        if not isinstance(self.normalize, bool) or (self.normalize and self.pooling != "mean"):
            raise ValueError(f"normalize goes with mean pooling and is true or false, got {self.normalize!r} "
                             f"with {self.pooling} pooling")
        if not isinstance(self.frozen, bool):
            raise ValueError(f"task_head frozen must be true or false, got {self.frozen!r}")
        if self.lstm_size is not None and (isinstance(self.lstm_size, bool) or not isinstance(self.lstm_size, int)
                                           or self.lstm_size < 1):
            raise ValueError(f"lstm_size must be a positive integer, got {self.lstm_size!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config.json") -> TaskHead:
        """The record as config.json holds it; a one-line ValueError naming `source` if it is not one."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: {TASK_HEAD_KEY} must be an object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - {"note"})
        if unknown:
            raise ValueError(f"{source}: {TASK_HEAD_KEY} has unknown keys {', '.join(unknown)}")
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {TASK_HEAD_KEY}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """As config.json keeps it, with a note for whoever opens the file in transformers."""
        return {**dataclasses.asdict(self), "note": _NOTE}

    def describe(self) -> str:
        """One line for messages and reports: "frozen encoder, concat_last_four -> bilstm (192 per direction)"."""
        encoder = "frozen encoder" if self.frozen else "fine-tuned encoder"
        lstm = f" ({self.lstm_size} per direction)" if self.head == "bilstm" and self.lstm_size else ""
        pooled = f", {self.pooling} pooling{' (unit length)' if self.normalize else ''}" if self.pooling != "cls" else ""
        return f"{encoder}, {self.layers}{pooled} -> {self.head}{lstm}"


__all__ = ["HEADS", "HEAD_JOBS", "LAYER_CHOICES", "POOLINGS", "SENTENCE_JOBS", "TASK_HEAD_KEY", "TASK_HEAD_PREFIX",
           "TaskHead", "check_head", "check_layers", "check_pooling", "default_lstm_size", "input_width", "layer_indices",
           "uses_task_head"]
