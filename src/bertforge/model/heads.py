"""Pre-training heads on one BertModel backbone: masked LM (from T_i) and next-sentence prediction (from C).

Losses are computed here when labels are given, so that a training loop only needs
`loss = model(**batch).loss`. Label conventions are Hugging Face's: MLM labels are -100 where a
position is not predicted; next-sentence label 0 = B follows A (IsNext), 1 = B is random (NotNext).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import BertConfig
from bertforge.model.bert import BertModel, BertPreTrainedModel, EncoderOutput
from bertforge.model.layers import activation

IGNORE_INDEX = -100  # label value for positions that are not predicted (F.cross_entropy's default)


class MaskedLMHead(nn.Module):
    """dense + activation + LayerNorm, then a decoder tied to the word embeddings, plus a bias.

    The decoder weight is the word-embedding matrix itself, passed in at call time: the tie cannot
    come undone by loading, casting or moving one copy, and the state dict holds the matrix once.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = nn.Sequential()
        self.transform.add_module("dense", nn.Linear(config.hidden_size, config.hidden_size))
        self.transform.add_module("act", activation(config.hidden_act))
        self.transform.add_module("layer_norm", nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        # (..., H) -> (..., V)
        return F.linear(self.transform(hidden), word_embeddings, self.bias)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None  # mlm_loss + nsp_loss (whichever labels were given)
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    # (B, T, V) without labels; with labels, (N, V) for the N predicted positions only (row-major order
    # of `labels != -100`), because the vocabulary projection is the costliest part of pre-training.
    mlm_logits: torch.Tensor | None
    nsp_logits: torch.Tensor | None  # (B, 2)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class _MaskedLMMixin:
    """Masked-LM logits and loss, shared by BertForPreTraining and BertForMaskedLM."""

    bert: BertModel
    mlm: MaskedLMHead

    def _masked_lm(
        self, sequence: torch.Tensor, labels: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        word_embeddings = self.bert.embeddings.word_embeddings.weight
        if labels is None:
            return self.mlm(sequence, word_embeddings), None  # (B, T, V)
        predicted = labels != IGNORE_INDEX  # (B, T)
        logits = self.mlm(sequence[predicted], word_embeddings)  # (N, H) -> (N, V)
        targets = labels[predicted]  # (N,)
        if targets.numel() == 0:  # nothing masked in this batch: a zero that still has a graph
            return logits, logits.sum() * 0.0
        return logits, F.cross_entropy(logits.float(), targets)


class BertForPreTraining(_MaskedLMMixin, BertPreTrainedModel):
    """BERT with both pre-training heads: masked LM on T_i and next-sentence prediction on C."""

    head_prefixes = ("mlm.", "nsp.")

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self.init_modules(self.mlm, self.nsp)  # the backbone initialised itself

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids to predict, -100 elsewhere
        next_sentence_label: torch.Tensor | None = None,  # (B,) 0 IsNext, 1 NotNext
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded: EncoderOutput = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        mlm_logits, mlm_loss = self._masked_lm(encoded.last_hidden_state, labels)
        nsp_logits = self.nsp(encoded.pooled_output)  # (B, H) -> (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1))
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return PreTrainingOutput(
            loss=sum(losses) if losses else None,  # type: ignore[arg-type]
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            mlm_logits=mlm_logits,
            nsp_logits=nsp_logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )


class BertForMaskedLM(_MaskedLMMixin, BertPreTrainedModel):
    """BERT with the masked-LM head only (no pooler, as in Hugging Face): fill-mask and MLM-only training."""

    head_prefixes = ("mlm.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config)
        self.init_modules(self.mlm)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        mlm_logits, mlm_loss = self._masked_lm(encoded.last_hidden_state, labels)
        return PreTrainingOutput(
            loss=mlm_loss, mlm_loss=mlm_loss, nsp_loss=None, mlm_logits=mlm_logits, nsp_logits=None,
            hidden_states=encoded.hidden_states, attentions=encoded.attentions,
        )


# ------------------------------------------------------------------------------------------------
# Fine-tuning heads: one new output layer on the backbone (plus dropout), Hugging Face's names
# (`classifier`, `qa_outputs`) so that checkpoints move between the two libraries unchanged.
# ------------------------------------------------------------------------------------------------
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


def set_labels(config: BertConfig, labels: list[str] | int) -> BertConfig:
    """Record a task's labels in the config the way Hugging Face does (id2label / label2id)."""
    names = [f"LABEL_{i}" for i in range(labels)] if isinstance(labels, int) else list(labels)
    config.extra["id2label"] = {str(i): name for i, name in enumerate(names)}
    config.extra["label2id"] = {name: i for i, name in enumerate(names)}
    return config


def num_labels(config: BertConfig) -> int:
    """How many outputs the task head has: from id2label when present, else `num_labels`, else 2."""
    if "id2label" in config.extra:
        return len(config.extra["id2label"])
    return int(config.extra.get("num_labels", 2))


def _classifier_dropout(config: BertConfig) -> nn.Dropout:
    rate = config.extra.get("classifier_dropout")
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


class BertForSequenceClassification(BertPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the pooled [CLS] vector."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) class ids, or (B,) floats when num_labels == 1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.pooled_output))  # (B, H) -> (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:  # regression (STS-B): mean squared error on the single output
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (NER) from each final token vector T_i; labels -100 are not scored."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T), -100 for sub-word continuations, specials, padding
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, H) -> (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span QA as in the paper: a start vector S and an end vector E dotted with every T_i."""

    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # rows: S, E
        self.init_modules(self.qa_outputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # (B,) token index; 0 ([CLS]) = no answer in window
        end_positions: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> SpanOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits = (x.squeeze(-1) for x in logits.split(1, dim=-1))  # (B, T) each
        if attention_mask is not None:  # a span never starts or ends on padding
            padding = attention_mask == 0
            start_logits = start_logits.masked_fill(padding, torch.finfo(start_logits.dtype).min)
            end_logits = end_logits.masked_fill(padding, torch.finfo(end_logits.dtype).min)
        loss = None
        if start_positions is not None and end_positions is not None:
            length = start_logits.size(1)  # positions outside the window are clamped out and ignored
            start = start_positions.clamp(0, length).masked_fill(start_positions >= length, IGNORE_INDEX)
            end = end_positions.clamp(0, length).masked_fill(end_positions >= length, IGNORE_INDEX)
            loss = (F.cross_entropy(start_logits.float(), start) + F.cross_entropy(end_logits.float(), end)) / 2
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


class BertForMultipleChoice(BertPreTrainedModel):
    """SWAG-style: score each (context, choice) pair from its pooled vector, softmax over the choices."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, C, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) index of the right choice
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        batch, choices, length = input_ids.shape

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:  # (B, C, T) -> (B*C, T)
            return None if x is None else x.reshape(batch * choices, -1)

        encoded = self.bert(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        scores = self.classifier(self.dropout(encoded.pooled_output))  # (B*C, H) -> (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)
