"""ALBERT's heads on one AlbertModel backbone: pre-training (masked LM + sentence-order prediction),
masked LM alone, and the fine-tuning heads, with transformers' module names (`predictions`,
`sop_classifier`, `classifier`, `qa_outputs`) so that their keys need (almost) no renaming.

Losses are computed here when labels are given (`loss = model(**batch).loss`), with Hugging Face's
label conventions (-100 where a position is not scored).

Shapes: B batch, T length, E embedding size, H hidden size, V vocabulary, C choices.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import IGNORE_INDEX
from bertforge.model.albert.config import AlbertConfig
from bertforge.model.albert.modeling import ALBERT_POOLER_KEYS, AlbertModel, AlbertPreTrainedModel
from bertforge.model.base import (
    EncoderOutput,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.layers import activation

# transformers' decoder is the word-embedding matrix and `predictions.bias`: a file's copies repeat them.
DECODER_KEYS = r"^predictions\.decoder\.(weight|bias)$"


class AlbertMLMHead(nn.Module):
    """dense H -> E + the config's activation + LayerNorm on E, then the decoder E -> V tied to the word
    embeddings (passed at call time, so the tie cannot come undone) plus its own bias."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.act = activation(config.hidden_act)
        self.layer_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        return F.linear(self.layer_norm(self.act(self.dense(hidden))), word_embeddings, self.bias)


class AlbertSOPHead(nn.Module):
    """Sentence-order prediction: dropout + a 2-way classifier on the pooled [CLS] vector
    (0 in order, 1 swapped)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # (B, H) -> (B, 2)
        return self.classifier(self.dropout(pooled))


def masked_lm(head: AlbertMLMHead, backbone: AlbertModel, sequence: torch.Tensor,
              labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The masked-LM logits and loss. Without labels (B, T, V) logits; with labels only the N labelled
    positions pay for the V-wide projection: (N, V) in row-major order of `labels != -100`."""
    word_embeddings = backbone.embeddings.word_embeddings.weight  # (V, E)
    if labels is None:
        return head(sequence, word_embeddings), None
    predicted = labels != IGNORE_INDEX  # (B, T)
    logits = head(sequence[predicted], word_embeddings)  # (N, V)
    targets = labels[predicted]  # (N,)
    # nothing masked in this batch: a zero that still has a graph
    loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
    return logits, loss


class AlbertForPreTraining(AlbertPreTrainedModel):
    """ALBERT's pre-training: masked LM on every token and sentence-order prediction on the pooled [CLS].

    The loss is the sum of the two, of whichever labels are given. bertforge's loader names the
    sentence labels `next_sentence_label` (0 in order, 1 swapped for SOP data); transformers'
    `sentence_order_label` is the same thing.
    """

    job: ClassVar[str | None] = "pretraining"
    head_prefixes = ("predictions.", "sop_classifier.")
    keys_redundant_on_load = (*AlbertPreTrainedModel.keys_redundant_on_load, DECODER_KEYS)

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.predictions = AlbertMLMHead(config)
        self.sop_classifier = AlbertSOPHead(config)
        self.init_modules(self.predictions, self.sop_classifier)  # the backbone initialised itself

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        return self.predictions(vectors, self.albert.embeddings.word_embeddings.weight)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids to predict, -100 elsewhere
        sentence_order_label: torch.Tensor | None = None,  # (B,) 0 in order, 1 swapped
        next_sentence_label: torch.Tensor | None = None,  # the same, as bertforge's loader names it
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded = self.albert(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        mlm_logits, mlm_loss = masked_lm(self.predictions, self.albert, encoded.last_hidden_state, labels)
        sop_logits = self.sop_classifier(encoded.pooled_output)  # (B, 2)
        order = sentence_order_label if sentence_order_label is not None else next_sentence_label
        sop_loss = None if order is None else F.cross_entropy(sop_logits.float(), order.view(-1))
        losses = [x for x in (mlm_loss, sop_loss) if x is not None]
        # PreTrainingOutput's sentence-pair slots (nsp_*) hold the sentence-order head's loss and logits.
        return PreTrainingOutput(loss=sum(losses) if losses else None,  # type: ignore[arg-type]
                                 mlm_loss=mlm_loss, nsp_loss=sop_loss, mlm_logits=mlm_logits,
                                 nsp_logits=sop_logits, hidden_states=encoded.hidden_states,
                                 attentions=encoded.attentions)


class AlbertForMaskedLM(AlbertPreTrainedModel):
    """ALBERT with the masked-LM head only (no pooler): fill-mask and MLM-only training."""

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("predictions.",)
    keys_to_ignore_on_load_unexpected = (ALBERT_POOLER_KEYS,)  # no pooler: a file's is not needed, not wrong
    keys_redundant_on_load = (*AlbertPreTrainedModel.keys_redundant_on_load, DECODER_KEYS)

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.predictions = AlbertMLMHead(config)
        self.init_modules(self.predictions)

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        return self.predictions(vectors, self.albert.embeddings.word_embeddings.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids to predict, -100 elsewhere
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded = self.albert(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits, loss = masked_lm(self.predictions, self.albert, encoded.last_hidden_state, labels)
        return PreTrainingOutput(loss=loss, mlm_loss=loss, nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 hidden_states=encoded.hidden_states, attentions=encoded.attentions)


class AlbertForSequenceClassification(WeightedClassifier, AlbertPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the pooled [CLS] vector,
    after dropout at `classifier_dropout_prob`.

    The loss follows config.json's `problem_type` as in transformers ("regression": mean squared
    error; "single_label_classification": cross-entropy; "multi_label_classification": sigmoid +
    binary cross-entropy over (B, num_labels) 0/1 targets), inferred from the labels when unset.
    `label_weights` (num_labels,) weighs the loss for imbalanced data (per-class weights, or each
    label's positive weight); a training setting, not saved with the model.
    """

    job: ClassVar[str | None] = "sequence-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.register_buffer("label_weights", None, persistent=False)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) class ids, (B,) floats for regression, (B, L) 0/1 multi-label
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.albert(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.pooled_output))  # (B, H) -> (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class AlbertForTokenClassification(AlbertPreTrainedModel):
    """A label per token (NER) from each final vector, after dropout at `classifier_dropout_prob`;
    labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)
    keys_to_ignore_on_load_unexpected = (ALBERT_POOLER_KEYS,)  # every token is read, not a pooled [CLS]

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.head_dropout)
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
        encoded = self.albert(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, H) -> (B, T, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class AlbertForQuestionAnswering(AlbertPreTrainedModel):
    """Span QA: a start and an end score for every token (`qa_outputs`, no dropout)."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)
    keys_to_ignore_on_load_unexpected = (ALBERT_POOLER_KEYS,)

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # rows: start, end
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
        encoded = self.albert(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


class AlbertForMultipleChoice(AlbertPreTrainedModel):
    """SWAG-style: one score per (context, choice) pair from its pooled [CLS] vector after dropout at
    `classifier_dropout_prob`, softmax over the choices."""

    job: ClassVar[str | None] = "multiple-choice"
    head_prefixes = ("classifier.",)

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(config.head_dropout)
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
            return None if x is None else x.reshape(batch * choices, length)

        encoded: EncoderOutput = self.albert(
            flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        scores = self.classifier(self.dropout(encoded.pooled_output))  # (B*C, H) -> (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


__all__ = ["AlbertForMaskedLM", "AlbertForMultipleChoice", "AlbertForPreTraining", "AlbertForQuestionAnswering",
           "AlbertForSequenceClassification", "AlbertForTokenClassification"]
