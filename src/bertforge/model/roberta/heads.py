"""RoBERTa's heads on one RobertaModel backbone: masked LM (its pre-training objective) and the
fine-tuning heads, with transformers' module names (`lm_head`, `classifier`, `qa_outputs`) so that
their keys need no renaming. There is no next-sentence head: RoBERTa dropped NSP.

Losses are computed here when labels are given (`loss = model(**batch).loss`), with Hugging Face's
label conventions (-100 where a position is not scored).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import IGNORE_INDEX
from bertforge.model.base import (
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.roberta.config import RobertaConfig
from bertforge.model.roberta.modeling import ROBERTA_POOLER_KEYS, RobertaModel, RobertaPreTrainedModel


def classifier_dropout(config: RobertaConfig) -> nn.Dropout:
    """The sentence heads' dropout: `classifier_dropout`, or hidden_dropout_prob when it is null."""
    rate = config.classifier_dropout
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


class RobertaLMHead(nn.Module):
    """dense + GELU + LayerNorm, then a decoder tied to the word embeddings, plus a bias.

    The activation is always exact GELU, whatever `hidden_act` says (as in fairseq and transformers).
    The decoder weight is the word-embedding matrix, passed in at call time, so the tie cannot come
    undone and the state dict holds the matrix once.
    """

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        return F.linear(self.layer_norm(F.gelu(self.dense(hidden))), word_embeddings, self.bias)


class RobertaForMaskedLM(RobertaPreTrainedModel):
    """RoBERTa with its masked-LM head (no pooler): pre-training, fill-mask.

    Without labels the logits are (B, T, V); with labels only the N labelled positions go through
    the vocabulary projection, and the logits are (N, V) in row-major order of `labels != -100`.
    """

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("lm_head.",)
    keys_to_ignore_on_load_unexpected = (ROBERTA_POOLER_KEYS,)  # no pooler: a file's is not needed, not wrong
    # transformers' decoder is the word-embedding matrix and `lm_head.bias`: a file's copies repeat them.
    keys_redundant_on_load = (*RobertaPreTrainedModel.keys_redundant_on_load, r"^lm_head\.decoder\.(weight|bias)$")

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config)
        self.roberta = RobertaModel(config, add_pooling_layer=False)
        self.lm_head = RobertaLMHead(config)
        self.init_modules(self.lm_head)

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        return self.lm_head(vectors, self.roberta.embeddings.word_embeddings.weight)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids to predict, -100 elsewhere
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded = self.roberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        sequence = encoded.last_hidden_state  # (B, T, H)
        loss = None
        if labels is None:
            logits = self.masked_lm_logits(sequence)  # (B, T, V)
        else:  # the V-wide projection costs more than a layer: only the labelled positions pay for it
            predicted = labels != IGNORE_INDEX  # (B, T)
            logits = self.masked_lm_logits(sequence[predicted])  # (N, V)
            targets = labels[predicted]  # (N,)
            # nothing masked in this batch: a zero that still has a graph
            loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return PreTrainingOutput(loss=loss, mlm_loss=loss, nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 hidden_states=encoded.hidden_states, attentions=encoded.attentions)


class RobertaClassificationHead(nn.Module):
    """RoBERTa's sentence head: dropout, dense + tanh on the final <s> vector, dropout, out_proj.

    It does the pooler's work itself (the backbone under it has none), so a pre-trained pooler goes unused.
    """

    def __init__(self, config: RobertaConfig, outputs: int) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = classifier_dropout(config)
        self.out_proj = nn.Linear(config.hidden_size, outputs)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, outputs)
        first = self.dropout(sequence[:, 0])  # (B, H): <s>
        return self.out_proj(self.dropout(torch.tanh(self.dense(first))))


class RobertaForSequenceClassification(WeightedClassifier, RobertaPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the final <s> vector.

    The loss follows config.json's `problem_type`, as in `transformers`: "regression" (mean squared
    error), "single_label_classification" (cross-entropy over class ids) or
    "multi_label_classification" (sigmoid + binary cross-entropy over (B, num_labels) 0/1 targets);
    without one it is inferred from the labels the same way. `label_weights` (num_labels,) weighs the
    loss for imbalanced data (a training setting, not saved with the model).
    """

    job: ClassVar[str | None] = "sequence-classification"
    head_prefixes = ("classifier.",)
    keys_to_ignore_on_load_unexpected = (ROBERTA_POOLER_KEYS,)

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        self.roberta = RobertaModel(config, add_pooling_layer=False)
        self.classifier = RobertaClassificationHead(config, self.num_labels)
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
        encoded = self.roberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(encoded.last_hidden_state)  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class RobertaForTokenClassification(RobertaPreTrainedModel):
    """A label per token (NER) from each final token vector; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)
    keys_to_ignore_on_load_unexpected = (ROBERTA_POOLER_KEYS,)  # every token is read, not a pooled <s>

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.roberta = RobertaModel(config, add_pooling_layer=False)
        self.dropout = classifier_dropout(config)
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
        encoded = self.roberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, H) -> (B, T, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class RobertaForQuestionAnswering(RobertaPreTrainedModel):
    """Span QA: a start and an end score for every token."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)
    keys_to_ignore_on_load_unexpected = (ROBERTA_POOLER_KEYS,)

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config)
        self.roberta = RobertaModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # rows: start, end
        self.init_modules(self.qa_outputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # (B,) token index; 0 (<s>) = no answer in window
        end_positions: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> SpanOutput:
        encoded = self.roberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


class RobertaForMultipleChoice(RobertaPreTrainedModel):
    """SWAG-style: score each (context, choice) pair from its pooled <s> vector, softmax over the choices.

    Unlike the other heads this one reads the backbone's pooler, as transformers' does, and its
    dropout is hidden_dropout_prob (transformers ignores classifier_dropout here).
    """

    job: ClassVar[str | None] = "multiple-choice"
    head_prefixes = ("classifier.",)

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config)
        self.roberta = RobertaModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
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

        encoded = self.roberta(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        scores = self.classifier(self.dropout(encoded.pooled_output))  # (B*C, H) -> (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)
