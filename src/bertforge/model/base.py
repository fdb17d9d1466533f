"""What every model family shares: the base class of its models (initialisation, Hugging Face-layout
save and load, the facts checkpoints and generic code need, declared as class attributes), the
output records, and the task labels kept in config.json.

The file format itself lives below the model, in `bertforge.checkpoint`, which knows no model class:
the classes declare what a load needs to know about them (`config_class`, `key_layout`,
`base_model_prefix`, `head_prefixes`, the `keys_*_on_load` patterns) and hand themselves to it.
Each class that declares a `job` registers itself in `bertforge.model.registry`, so that generic
code asks for "the token-classification model of this checkpoint's family" and never names a class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

import bertforge.checkpoint as hf_checkpoint
from bertforge.checkpoint import KeyLayout, LoadReport
from bertforge.config import IGNORE_INDEX, ModelConfig
from bertforge.model import registry
from bertforge.model.task_heads import (
    TASK_HEAD_KEY,
    TASK_HEAD_PREFIX,
    TaskHead,
    default_lstm_size,
    input_width,
    layer_indices,
)

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H): T_i, the final token vectors
    pooled_output: torch.Tensor | None  # (B, H): tanh(W C + b) over the final [CLS] vector C
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 tensors (B, T, H): embeddings, then each layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): attention probabilities

    @property
    def pooler_output(self) -> torch.Tensor | None:
        """`pooled_output` under transformers' name, so code written for it reads the same vector."""
        return self.pooled_output


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None  # mlm_loss + nsp_loss + sbo_loss (whichever there are)
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    # (B, T, V) without labels; with labels, (N, V) for the N predicted positions only (row-major order
    # of `labels != -100`), because the vocabulary projection is the costliest part of pre-training.
    mlm_logits: torch.Tensor | None
    nsp_logits: torch.Tensor | None  # (B, 2); None without a next-sentence head
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    sbo_loss: torch.Tensor | None = None  # span-boundary objective, with labels and `span_boundary_objective`


@dataclass
class TaskOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels) sentence tasks, (B, T, num_labels) tagging, (B, C) multiple choice
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class SpanOutput:
    loss: torch.Tensor | None  # mean of the start and end cross-entropies
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def label_maps(labels: list[str] | int) -> dict[str, dict]:
    """id2label and label2id as Hugging Face writes them in config.json ("LABEL_i" for unnamed outputs)."""
    names = [f"LABEL_{i}" for i in range(labels)] if isinstance(labels, int) else list(labels)
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


def set_labels(config: ModelConfig, labels: list[str] | int) -> ModelConfig:
    """Record a task's labels in the config the way Hugging Face does (id2label / label2id)."""
    config.extra.update(label_maps(labels))
    return config


def label_names(config: ModelConfig) -> list[str]:
    """The task's label names in id order, from id2label (keys as in config.json, or ints); [] without one."""
    id2label = config.extra.get("id2label") or {}
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(len(id2label))]


def label_names_of(model: Any) -> list[str]:
    """The model's output labels in id order: config.json's id2label, else "LABEL_i" for each output of
    a classifier without names (as transformers names them); [] for a model without labels."""
    names = label_names(model.config)
    if not names and hasattr(model, "num_labels"):
        names = [f"LABEL_{i}" for i in range(int(model.num_labels))]
    return names


def num_labels(config: ModelConfig) -> int:
    """How many outputs the task head has: from id2label when present, else `num_labels`, else 2."""
    if "id2label" in config.extra:
        return len(config.extra["id2label"])
    return int(config.extra.get("num_labels", 2))


# config.json's `problem_type` for sequence classification, as transformers names them.
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def problem_type_of(config: ModelConfig) -> str | None:
    """config.json's `problem_type`, checked; None when unset (the loss then infers it from the labels)."""
    problem = config.extra.get("problem_type")
    if problem is not None and problem not in PROBLEM_TYPES:
        raise ValueError(f"config.json problem_type {problem!r} is not one of {', '.join(PROBLEM_TYPES)}")
    return problem


def sequence_classification_loss(
    logits: torch.Tensor,  # (B, L)
    labels: torch.Tensor,  # (B,) class ids, (B,) floats for regression, (B, L) 0/1 multi-label
    problem_type: str | None,
    label_weights: torch.Tensor | None = None,  # (L,): per-class weights, or each label's positive weight
) -> torch.Tensor:
    """The loss of `problem_type`, as in transformers: mean squared error ("regression"), cross-entropy
    over class ids ("single_label_classification"), or sigmoid + binary cross-entropy per label
    ("multi_label_classification"). Unset, it is inferred the same way: one output is regression,
    integer labels single-label, float label vectors multi-label."""
    problem = problem_type
    if problem is None:
        if logits.shape[-1] == 1:
            problem = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem = "single_label_classification"
        else:
            problem = "multi_label_classification"
    if problem == "regression":  # (STS-B): mean squared error on the single output
        return F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1))
    if problem == "single_label_classification":
        return F.cross_entropy(logits.float(), labels.view(-1), weight=label_weights)
    # (B, L) logits against (B, L) 0/1 targets, each label its own yes/no
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), pos_weight=label_weights)



def span_logits_and_loss(
    logits: torch.Tensor,  # (B, T, 2): the start and end scores of every token
    attention_mask: torch.Tensor | None,  # (B, T)
    start_positions: torch.Tensor | None,  # (B,) token index; 0 ([CLS]) = no answer in the window
    end_positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Span QA's start and end logits (B, T) each, padding scored out (a span never starts or ends
    there), and with positions the mean of the two cross-entropies; positions outside the window are
    clamped out and ignored, as in transformers."""
    start_logits, end_logits = (x.squeeze(-1) for x in logits.split(1, dim=-1))  # (B, T) each
    if attention_mask is not None:
        padding = attention_mask == 0
        start_logits = start_logits.masked_fill(padding, torch.finfo(start_logits.dtype).min)
        end_logits = end_logits.masked_fill(padding, torch.finfo(end_logits.dtype).min)
    if start_positions is None or end_positions is None:
        return start_logits, end_logits, None
    length = start_logits.size(1)
    start = start_positions.clamp(0, length).masked_fill(start_positions >= length, IGNORE_INDEX)
    end = end_positions.clamp(0, length).masked_fill(end_positions >= length, IGNORE_INDEX)
    loss = (F.cross_entropy(start_logits.float(), start) + F.cross_entropy(end_logits.float(), end)) / 2
    return start_logits, end_logits, loss


def token_classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every labelled token of (B, T, num_labels) logits; labels -100 are not scored."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


class WeightedClassifier:
    """What every family's sequence classifier shares (mixed in before the family's base class): loss
    weights per class, a training setting that is not saved with the model, and the loss of config.json's
    `problem_type`. The class sets `num_labels`, `problem_type` and a `label_weights` buffer."""

    num_labels: int
    problem_type: str | None
    label_weights: torch.Tensor | None

    def set_label_weights(self, weights: torch.Tensor | None) -> None:
        """Weigh the loss per class (or per label's positives); None removes the weights."""
        if weights is not None and tuple(weights.shape) != (self.num_labels,):
            raise ValueError(f"label weights of shape {tuple(weights.shape)} for {self.num_labels} outputs")
        device = next(self.parameters()).device  # type: ignore[attr-defined]
        self.label_weights = None if weights is None else weights.to(device=device, dtype=torch.float32)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of `problem_type` (inferred from the labels as transformers does when unset)."""
        return sequence_classification_loss(logits, labels, self.problem_type, self.label_weights)


class PreTrainedModel(nn.Module):
    """Shared by every model of every family: config, initialisation, checkpoint save/load, and the
    facts generic code reads instead of asking for a class by name."""

    # The config family (config.json's model_type) this class implements, and its config class.
    model_type: ClassVar[str]
    config_class: ClassVar[type[ModelConfig]]
    # The job this class does (one of registry.JOBS); None for a family's shared base class.
    job: ClassVar[str | None] = None
    # The family's file layout: the key renames between our names and transformers'.
    key_layout: ClassVar[KeyLayout]
    # Whether `output_attentions=True` returns attention probabilities (attention maps, analysis).
    supports_attention_maps: ClassVar[bool] = False
    # Whether attention itself runs on the packed (unpadded) tokens, one sequence at a time; False where
    # the family's attention needs the padded (B, T) layout (DeBERTa's relative positions).
    packed_attention: ClassVar[bool] = True

    # What loading a checkpoint needs to know of a class (see bertforge.checkpoint.Checkpointable).
    # The attribute holding the backbone, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = ""
    # Our module names that are task heads (not the backbone): missing ones are "new", not errors.
    head_prefixes: ClassVar[tuple[str, ...]] = ()
    # Patterns of our keys a file may lack (a pooler many encoders ship without, say).
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = ()
    # Patterns of keys a file may carry that this model does not use (reported as unused).
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ()
    # Patterns of keys that repeat what this model computes (transformers' position-id buffer).
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = ()

    # What `from_pretrained` found in the file; None for a model built any other way.
    load_report: LoadReport | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "job" in cls.__dict__ and cls.job is not None:
            registry.register_model(cls)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

    @classmethod
    def for_config(cls, config: ModelConfig) -> type[PreTrainedModel]:
        """This class, or the class doing its job in `config`'s family (the sequence classifier of
        BERT asked for with a ModernBERT config gives ModernBERT's sequence classifier)."""
        if config.model_type == cls.model_type:
            return cls
        if cls.job is None:
            raise ValueError(f"{cls.__name__} does no job that another family could do")
        return registry.model_class(config.model_type, cls.job)

    def init_weights(self) -> None:
        """The family's initialisation of every module (BERT's unless the family overrides `_init_module`)."""
        self.init_modules(self)

    def init_modules(self, *modules: nn.Module) -> None:
        """Initialise just these modules (a head added on top of an initialised backbone)."""
        for module in modules:
            module.apply(self._init_module)

    def _init_module(self, module: nn.Module) -> None:
        """BERT's initialisation: weights ~ N(0, initializer_range), biases 0, LayerNorm 1 and 0."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def base_model(self) -> Any:
        """The backbone inside (the model itself for a bare encoder), found through `base_model_prefix`."""
        return getattr(self, self.base_model_prefix) if self.base_model_prefix else self

    def transformer_layers(self) -> nn.ModuleList:
        """The distinct Transformer layers of the backbone, bottom to top (re-initialising the top
        ones, int8 quantization). Each family's bare encoder defines `layers` or overrides this."""
        backbone = self.base_model
        if backbone is not self:
            return backbone.transformer_layers()
        return self.layers  # type: ignore[return-value]

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: BertTokenizer | None = None) -> None:
        """Write `config.json` + `model.safetensors` (+ the tokenizer's files) in Hugging Face layout."""
        hf_checkpoint.save_pretrained(self, directory, tokenizer=tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike[str],
        *,
        strict: bool = True,
        allow_pickle: bool = False,
        **config_overrides: Any,
    ) -> Any:
        """Load a Hugging Face-layout directory (ours or `transformers`'), heads included.

        The directory's `model_type` picks the family: a ModernBERT checkpoint loaded through a BERT
        class comes back as the ModernBERT class doing the same job (see `for_config`), so every
        caller of `BertForSequenceClassification.from_pretrained` also takes other families' checkpoints.

        config.json is checked against the weights' shapes before anything is allocated: a field that
        disagrees, a truncated file or an absurd size raise a one-line `CheckpointError`. Keys the
        target lacks or the file lacks are sorted into expected (a new task head, pre-training heads a
        bare encoder does not use) and errors, as this class declares; errors raise `CheckpointError`
        unless `strict=False`. The sorted lists are kept on `model.load_report`. Pickle files
        (`pytorch_model.bin`) are refused unless `allow_pickle=True`, and then read with `weights_only=True`.
        `directory` may also name a Hugging Face Hub model (`org/name`, `org/name@revision`: `bertforge.hub`).
        """
        from bertforge.hub import local_or_hub

        directory = local_or_hub(directory, allow_pickle=allow_pickle)  # a Hub name: its cached snapshot
        source = str(os.path.join(directory, "config.json"))
        config = registry.config_from_dict(hf_checkpoint.read_config_data(directory), source=source)
        target = cls.for_config(config)
        # A generic task head (config.json's `task_head`, or one asked for by an override; an override of
        # None asks for the family's own head): built for the job it was trained for, so that every
        # loader asking for that job, or for whatever the directory holds, gets the head that was trained.
        record = config_overrides.pop(TASK_HEAD_KEY, config.extra.get(TASK_HEAD_KEY))
        if isinstance(target, type) and issubclass(target, TaskHeadModel):
            target = target.family_class
        # (checked only where it is used: the bare encoder of such a directory loads whatever its head)
        if record is not None and (not isinstance(record, dict) or record.get("job") == target.job):
            head = TaskHead.from_dict(record, source=source)
            target = task_head_class(config.model_type, head.job)
            config_overrides[TASK_HEAD_KEY] = head.to_dict()
        model, report = hf_checkpoint.load_pretrained(target, directory, strict=strict, allow_pickle=allow_pickle,
                                                      **config_overrides)
        if not isinstance(model, TaskHeadModel):  # (a bare encoder read from such a directory has no such head)
            model.config.extra.pop(TASK_HEAD_KEY, None)
        model.load_report = report
        return model


# ------------------------------------------------------------------------------------------------
# generic task heads: a frozen encoder's chosen layers, a BiLSTM head (see bertforge.model.task_heads)
# ------------------------------------------------------------------------------------------------
class LayerMix(nn.Module):
    """The hidden states a layer choice reads, as one vector per token.

    "one" passes a hidden state through, "sum" adds them, "concat" lays them side by side (lowest layer
    first: K x H wide), "weighted" is ELMo's scalar mix, scale * sum_k softmax(w)_k h_k, whose weights
    start equal (the mean of the layers) and train with the head.
    """

    def __init__(self, indices: Sequence[int], combine: str) -> None:
        super().__init__()
        self.indices, self.combine = tuple(indices), combine
        if combine == "weighted":
            self.weights = nn.Parameter(torch.zeros(len(self.indices)))  # (K,)
            self.scale = nn.Parameter(torch.ones(()))

    def forward(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:  # L + 1 x (N, T, H) -> (N, T, D)
        chosen = [hidden_states[i] for i in self.indices]
        if len(chosen) == 1:
            return chosen[0]
        if self.combine == "concat":
            return torch.cat(chosen, dim=-1)  # (N, T, K*H)
        stacked = torch.stack(chosen, dim=-2)  # (N, T, K, H)
        if self.combine == "sum":
            return stacked.sum(dim=-2)
        mix = torch.softmax(self.weights.float(), dim=0).to(stacked.dtype)  # (K,)
        return self.scale.to(stacked.dtype) * torch.einsum("ntkh,k->nth", stacked, mix)


class BiLstm(nn.Module):
    """One bidirectional LSTM layer over right-padded rows: (N, T, D) -> (N, T, 2h) and (N, 2h).

    The two directions are two LSTMs (`left_to_right`, `right_to_left`). The backward one reads each
    row's real tokens reversed in place (a gather by the mask's lengths), so it starts at the row's
    last real token, never on padding, as a packed sequence would; unlike packing, every shape stays
    static, so the head exports to ONNX and compiles. Rows must be real tokens then padding (what
    `collate` makes).
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.left_to_right = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.right_to_left = nn.LSTM(input_size, hidden_size, batch_first=True)

    def forward(self, vectors: torch.Tensor,  # (N, T, D)
                attention_mask: torch.Tensor | None,  # (N, T), 1 on the real tokens, which come first
                ) -> tuple[torch.Tensor, torch.Tensor]:  # (N, T, 2h) every position (0 at padding), (N, 2h) final
        rows, length, _ = vectors.shape
        positions = torch.arange(length, device=vectors.device).unsqueeze(0)  # (1, T)
        if attention_mask is None:
            lengths = torch.full((rows, 1), length, dtype=torch.long, device=vectors.device)
        else:
            lengths = attention_mask.long().sum(dim=1, keepdim=True)  # (N, 1)
        real = positions < lengths  # (N, T)
        # position t of row i reads position len_i - 1 - t within the real tokens, itself on padding:
        # its own inverse, so the same gather puts the backward outputs back in place
        flip = torch.where(real, lengths - 1 - positions, positions).unsqueeze(-1)  # (N, T, 1)
        forward, _ = self.left_to_right(vectors)  # (N, T, h); padding comes after every real token
        backward, _ = self.right_to_left(vectors.gather(1, flip.expand(-1, -1, vectors.shape[-1])))
        backward = backward.gather(1, flip.expand(-1, -1, self.hidden_size))  # (N, T, h), back in place
        tokens = torch.cat([forward, backward], dim=-1) * real.unsqueeze(-1).to(forward.dtype)  # (N, T, 2h)
        last = (lengths - 1).clamp(min=0).unsqueeze(-1).expand(-1, -1, self.hidden_size)  # (N, 1, h)
        # the forward state at the last real token and the backward state at the first: each read it all
        final = torch.cat([forward.gather(1, last).squeeze(1), backward[:, 0]], dim=-1)  # (N, 2h)
        return tokens, final


class GenericHead(nn.Module):
    """Token vectors (the chosen layers) -> [BiLSTM] -> dropout -> the task's output layer.

    Sentence jobs (sequence classification, multiple choice) read one vector per row: without the
    BiLSTM the first token's ([CLS], as in the paper's C), or the last real token's for a causal
    (left-to-right) encoder, whose first token has seen nothing else, or with `pooling` mean the
    average of the real tokens' vectors; with the BiLSTM its two final
    states side by side, the forward one at the last real token and the backward one at the first, so
    each has read the whole input whichever way the encoder's attention runs. Tagging and span QA read
    every position.
    """

    def __init__(self, spec: TaskHead, hidden_size: int, num_layers: int, outputs: int, dropout: float,
                 causal: bool = False) -> None:
        super().__init__()
        self.causal = causal
        indices, combine = layer_indices(spec.layers, num_layers)
        self.reads_last = spec.layers == "last"  # the encoder's own final vectors (no hidden states needed)
        self.sentence = spec.job in ("sequence-classification", "multiple-choice")
        self.mean_pooling = spec.pooling == "mean"
        self.normalize = spec.normalize
        self.layer_mix = LayerMix(indices, combine)
        width = input_width(spec.layers, hidden_size, num_layers)  # H, or 4H for concat_last_four
        self.dropout = nn.Dropout(dropout)
        self.bilstm: BiLstm | None = None
        if spec.head == "bilstm":
            size = spec.lstm_size or default_lstm_size(hidden_size)
            self.bilstm = BiLstm(width, size)
            width = 2 * size
        self.output = nn.Linear(width, outputs)

    def forward(self, encoded: EncoderOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if self.reads_last:
            vectors = encoded.last_hidden_state  # (N, T, H)
        else:
            assert encoded.hidden_states is not None
            vectors = self.layer_mix(encoded.hidden_states)  # (N, T, D)
        vectors = self.dropout(vectors)
        if self.bilstm is None:
            if not self.sentence:
                return self.output(vectors)  # (N, T, D) -> (N, T, outputs)
            if self.mean_pooling:
                pooled = mean_of_real_tokens(vectors, attention_mask)  # (N, D)
                if self.normalize:
                    pooled = F.normalize(pooled, dim=-1)
                return self.output(pooled)  # (N, D) -> (N, outputs)
            if self.causal and attention_mask is not None:
                last = (attention_mask.long() * torch.arange(vectors.shape[1], device=vectors.device)).argmax(-1)  # (N,)
                return self.output(vectors[torch.arange(vectors.shape[0], device=vectors.device), last])
            if self.causal:
                return self.output(vectors[:, -1])  # (N, D) -> (N, outputs)
            return self.output(vectors[:, 0])  # (N, D) -> (N, outputs)
        if not self.sentence and torch.compiler.is_exporting():
            # the exporter unrolls the LSTM over the example's length, which would fix every input's length
            raise ValueError("a BiLSTM head over every position (tagging, QA) does not export to ONNX: the "
                             "exporter unrolls the LSTM over one sequence length; run it with torch")
        tokens, final = self.bilstm(vectors, attention_mask)  # (N, T, 2h), (N, 2h)
        return self.output(self.dropout(final if self.sentence else tokens))


def mean_of_real_tokens(vectors: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(N, T, D) -> (N, D): each row's average over its real tokens (all of them without a mask)."""
    if attention_mask is None:
        return vectors.mean(dim=1)
    weights = attention_mask.to(vectors.dtype).unsqueeze(-1)  # (N, T, 1)
    return (vectors * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def head_dropout(config: ModelConfig) -> float:
    """The dropout before a generic head's output layer: the family's classifier dropout where its
    config has one, else its hidden dropout, else BERT's 0.1."""
    for name in ("classifier_dropout", "classifier_dropout_prob", "hidden_dropout_prob", "dropout"):
        rate = getattr(config, name, None)
        rate = config.extra.get(name) if rate is None else rate
        if isinstance(rate, (int, float)) and not isinstance(rate, bool):
            return float(rate)
    return 0.1


class TaskHeadModel(WeightedClassifier, PreTrainedModel):
    """A family's encoder under a generic task head (`GenericHead`), described by config.json's
    `task_head` (`bertforge.model.task_heads.TaskHead`).

    Built per family and job by `task_head_class` (it declares the family's checkpoint facts, those
    of the family's token classifier, whose encoder has no pooler: every head here reads token
    vectors). The encoder's weights are saved where the family's own heads keep them, so transformers
    and any bertforge class load the encoder from such a directory; the head's weights sit under
    `task_head.` (`task_head.bilstm.*`, `task_head.layer_mix.*`, `task_head.output.*`), which only
    this class reads. config.json's `architectures` names this class, which transformers does not have.

    With `frozen` the encoder's parameters do not train (requires_grad False) and it always runs in
    eval mode without gradients: no dropout, the vectors the features of `bertforge extract` are.
    """

    # The family's own class for this job (set by `task_head_class`): what a directory without a
    # task_head record loads as.
    family_class: ClassVar[type[PreTrainedModel]]
    head_prefixes: ClassVar[tuple[str, ...]] = (TASK_HEAD_PREFIX,)
    # the pieces inputs were cut to in training (set by fine-tuning): a setfit body's max_seq_length
    max_length: int | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        record = config.extra.get(TASK_HEAD_KEY)
        if record is None:
            raise ValueError(f"{type(self).__name__} needs config.json's {TASK_HEAD_KEY}")
        spec = TaskHead.from_dict(record)
        if spec.job != self.job:
            raise ValueError(f"config.json's {TASK_HEAD_KEY} is a {spec.job} head, not {self.job}")
        if spec.head == "bilstm" and spec.lstm_size is None:  # recorded as built, not as a default that may move
            spec = dataclasses.replace(spec, lstm_size=default_lstm_size(config.hidden_size))
        config.extra[TASK_HEAD_KEY] = spec.to_dict()
        self.spec = spec
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config) if self.job == "sequence-classification" else None
        self.register_buffer("label_weights", None, persistent=False)
        # the encoder as the family's token classifier builds it (no pooler), at the family's key prefix
        setattr(self, self.base_model_prefix, self.encoder_source(config).base_model)
        outputs = {"question-answering": 2, "multiple-choice": 1}.get(self.job, self.num_labels)
        self.task_head = GenericHead(spec, config.hidden_size, config.num_hidden_layers, outputs, head_dropout(config),
                                     causal=bool(getattr(config, "is_decoder", False)))
        self.init_modules(self.task_head)  # the Linear as the family starts heads; the LSTM keeps torch's init
        if spec.frozen:
            for parameter in self.base_model.parameters():
                parameter.requires_grad_(False)
            self.base_model.eval()

    @classmethod
    def encoder_source(cls, config: ModelConfig) -> PreTrainedModel:
        """A model of the family whose encoder this head reads: its token classifier (built without a pooler)."""
        return registry.model_class(config.model_type, "token-classification")(config)  # type: ignore[no-any-return]

    def _init_module(self, module: nn.Module) -> None:
        # the family's initialisation (its encoder's), for the head's Linear and for re-initialised layers
        self.base_model._init_module(module)

    @property
    def frozen(self) -> bool:
        return self.spec.frozen

    def train(self, mode: bool = True) -> TaskHeadModel:
        super().train(mode)
        if self.spec.frozen:  # a frozen encoder never drops out: the head learns on the vectors it will see
            self.base_model.eval()
        return self

    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: BertTokenizer | None = None) -> None:
        """As every model saves, config.json's `architectures` naming this class
        (BertForSequenceClassificationWithTaskHead), which transformers does not have: no loader can take
        the directory for the family's own head (which would run a fresh output layer on [CLS]).
        A head the setfit package computes (`setfit_can_run`: linear on the mean token vector) also gets
        setfit's files, so that `SetFitModel.from_pretrained` runs the classifier as trained."""
        from bertforge.model.sentence import save_setfit_files, setfit_can_run

        hf_checkpoint.save_pretrained(self, directory, tokenizer=tokenizer)
        spec = self.spec
        problem = self.problem_type or ("regression" if self.num_labels == 1 else None)
        if setfit_can_run(spec.job, spec.head, spec.layers, spec.pooling, problem):
            save_setfit_files(directory, weight=self.task_head.output.weight, bias=self.task_head.output.bias,
                              labels=label_names(self.config), multi_label=problem == "multi_label_classification",
                              normalize=spec.normalize, hidden_size=self.config.hidden_size,
                              max_length=self.max_length, tokenizer=tokenizer)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T), or (B, C, T) for multiple choice
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) sentence jobs (class ids, floats, (B, L) multi-label); (B, T) tags
        start_positions: torch.Tensor | None = None,  # (B,) span QA
        end_positions: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput | SpanOutput:
        choices = input_ids.shape[1] if self.job == "multiple-choice" else 0

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:  # (B, C, T) -> (B*C, T)
            return x.reshape(-1, x.shape[-1]) if x is not None and choices else x

        input_ids, attention_mask = flat(input_ids), flat(attention_mask)  # type: ignore[assignment]
        token_type_ids, position_ids = flat(token_type_ids), flat(position_ids)
        quiet = torch.no_grad() if self.spec.frozen else contextlib.nullcontext()
        with quiet:
            encoded = self.base_model(input_ids, attention_mask, token_type_ids, position_ids,
                                      output_hidden_states=output_hidden_states or not self.task_head.reads_last,
                                      output_attentions=output_attentions)
        logits = self.task_head(encoded, attention_mask)
        hidden = encoded.hidden_states if output_hidden_states else None
        if self.job == "question-answering":  # (B, T, 2) -> start, end (B, T)
            start, end, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
            return SpanOutput(loss, start, end, hidden, encoded.attentions)
        if self.job == "token-classification":  # (B, T, num_labels)
            loss = None if labels is None else token_classification_loss(logits, labels)
        elif choices:  # (B*C, 1) -> (B, C)
            logits = logits.view(-1, choices)
            loss = None if labels is None else F.cross_entropy(logits.float(), labels.view(-1))
        else:  # (B, num_labels)
            loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, hidden, encoded.attentions)


_task_head_classes: dict[tuple[type, type, str], type[TaskHeadModel]] = {}


def task_head_class(model_type: str, job: str) -> type[TaskHeadModel]:
    """The `TaskHeadModel` of `model_type`'s family for `job` (one class per family and job, made once)."""
    family_class = registry.model_class(model_type, job)
    encoder_class = registry.model_class(model_type, "token-classification")
    key = (family_class, encoder_class, job)
    if key not in _task_head_classes:
        facts = {name: getattr(encoder_class, name) for name in (
            "model_type", "config_class", "key_layout", "base_model_prefix", "supports_attention_maps",
            "packed_attention", "keys_to_ignore_on_load_missing", "keys_to_ignore_on_load_unexpected",
            "keys_redundant_on_load")}
        made = type(f"{family_class.__name__}WithTaskHead", (TaskHeadModel,),
                    {**facts, "family_class": family_class, "__module__": __name__,
                     "__doc__": f"{family_class.__name__}'s encoder under a generic task head."})
        # set after the class exists: a `job` in its body would register it as the family's class for the job
        made.job = job
        _task_head_classes[key] = made
    return _task_head_classes[key]
