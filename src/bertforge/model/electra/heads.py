"""ELECTRA's heads on one ElectraModel backbone, with transformers' module names so that their keys
pass through unchanged: the two pre-training halves and the fine-tuning heads.

- the discriminator (`ElectraForPreTraining`): one logit per token, "was this token replaced?",
  trained by binary cross-entropy against 0/1 labels of the replaced positions;
- the generator (`ElectraForMaskedLM`): a masked LM whose output projection is the word-embedding
  matrix (of width E), so a narrow generator still predicts over the shared vocabulary table.

The joint objective (the generator's samples become the discriminator's input) is built on these two:
`masked_lm_logits`, `replaced_token_logits` and `replaced_token_detection_loss` are its pieces.

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
    EncoderOutput,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    num_labels,
    problem_type_of,
    sequence_classification_loss,
)
from bertforge.model.electra.config import ElectraConfig
from bertforge.model.electra.modeling import ElectraModel, ElectraPreTrainedModel
from bertforge.model.layers import activation


def head_dropout(config: ElectraConfig) -> nn.Dropout:
    """The sentence and token heads' dropout: `classifier_dropout`, or hidden_dropout_prob when it is null."""
    rate = config.classifier_dropout
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


def named_activation(name: str | None) -> nn.Module:
    """The feed-forward's activations, plus tanh and none ("linear" or null), which the summary may name."""
    if name is None or name == "linear":
        return nn.Identity()
    return nn.Tanh() if name == "tanh" else activation(name)


# ------------------------------------------------------------------------------------------------
# The discriminator: replaced-token detection
# ------------------------------------------------------------------------------------------------
def replaced_token_detection_loss(
    logits: torch.Tensor,  # (B, T): one "replaced" logit per token
    labels: torch.Tensor,  # (B, T): 1 replaced, 0 original; -100 not scored
    attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
) -> torch.Tensor:
    """The discriminator's loss: the mean binary cross-entropy over the real tokens, as transformers
    computes it (every real token scored, padding never). Labels of -100 leave a position out as well,
    for an objective that would not score the special tokens."""
    scored = labels != IGNORE_INDEX  # (B, T)
    if attention_mask is not None:
        scored = scored & (attention_mask == 1)
    targets = labels[scored].float()  # (N,)
    if not targets.numel():  # nothing to score: a zero that still has a graph
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[scored].float(), targets)


class DiscriminatorPredictions(nn.Module):
    """dense + the encoder's activation + `dense_prediction`: H -> H -> one logit per token."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (...)
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class ElectraForPreTraining(ElectraPreTrainedModel):
    """The discriminator: for every token, the logit that it was replaced (by the generator's sample).

    With `labels` (B, T) of 1 at replaced and 0 at original tokens, the loss is their binary
    cross-entropy over the real tokens (`replaced_token_detection_loss`). This is the model that
    fine-tuning starts from; its head goes unused under a task head.
    """

    job: ClassVar[str | None] = "pretraining"
    head_prefixes = ("discriminator_predictions.",)
    # ONNX outputs (name, output attribute, per token): not BERT's pre-training pair (mlm_logits,
    # nsp_logits) that export reads for this job, but the one logit per token.
    onnx_outputs: ClassVar[tuple[tuple[str, str, bool], ...]] = (("logits", "logits", True),)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.discriminator_predictions = DiscriminatorPredictions(config)
        self.init_modules(self.discriminator_predictions)

    def replaced_token_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (...)
        """The discriminator head on final token vectors."""
        return self.discriminator_predictions(vectors)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T): the corrupted input (original tokens with some replaced)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T): 1 replaced, 0 original (-100 not scored)
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.replaced_token_logits(encoded.last_hidden_state)  # (B, T)
        loss = None if labels is None else replaced_token_detection_loss(logits, labels, attention_mask)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


# ------------------------------------------------------------------------------------------------
# The generator: a masked LM
# ------------------------------------------------------------------------------------------------
class GeneratorPredictions(nn.Module):
    """dense H -> E, GELU, LayerNorm: the generator's vectors brought to the embedding width. The
    activation is always exact GELU, whatever `hidden_act` says (as in transformers)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.layer_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., E)
        return self.layer_norm(F.gelu(self.dense(hidden)))


class TiedVocabularyProjection(nn.Module):
    """E -> V onto the word-embedding matrix, passed in at call time so that the tie cannot come
    undone and the state dict holds the matrix once; only the bias is this module's own."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, vectors: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., V)
        return F.linear(vectors, word_embeddings, self.bias)


class ElectraForMaskedLM(ElectraPreTrainedModel):
    """The generator: masked LM (fill-mask), its logits projected onto the word embeddings.

    Without labels the logits are (B, T, V); with labels only the N labelled positions go through
    the vocabulary projection, and the logits are (N, V) in row-major order of `labels != -100`.
    """

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("generator_predictions.", "generator_lm_head.")
    # transformers' projection weight is the word-embedding matrix: a file's copy repeats it.
    keys_redundant_on_load = (*ElectraPreTrainedModel.keys_redundant_on_load, r"^generator_lm_head\.weight$")

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.generator_predictions = GeneratorPredictions(config)
        self.generator_lm_head = TiedVocabularyProjection(config)
        self.init_modules(self.generator_predictions)

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The generator head on final token vectors (fill-mask on chosen positions)."""
        word_embeddings = self.electra.embeddings.word_embeddings.weight  # (V, E)
        return self.generator_lm_head(self.generator_predictions(vectors), word_embeddings)

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
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
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


# ------------------------------------------------------------------------------------------------
# Fine-tuning heads
# ------------------------------------------------------------------------------------------------
class ElectraClassificationHead(nn.Module):
    """ELECTRA's sentence head on the first token's vector: dropout, dense + GELU, dropout, out_proj.
    GELU rather than BERT's pooler tanh, as the ELECTRA authors fine-tuned."""

    def __init__(self, config: ElectraConfig, outputs: int) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = head_dropout(config)
        self.out_proj = nn.Linear(config.hidden_size, outputs)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, outputs)
        first = self.dropout(sequence[:, 0])  # (B, H): [CLS]
        return self.out_proj(self.dropout(F.gelu(self.dense(first))))


class ElectraForSequenceClassification(ElectraPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the final [CLS] vector.

    The loss follows config.json's `problem_type`, as in `transformers`: "regression" (mean squared
    error), "single_label_classification" (cross-entropy over class ids) or
    "multi_label_classification" (sigmoid + binary cross-entropy over (B, num_labels) 0/1 targets);
    without one it is inferred from the labels the same way. `label_weights` (num_labels,) weighs the
    loss for imbalanced data (a training setting, not saved with the model).
    """

    job: ClassVar[str | None] = "sequence-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        self.electra = ElectraModel(config)
        self.classifier = ElectraClassificationHead(config, self.num_labels)
        self.register_buffer("label_weights", None, persistent=False)
        self.init_modules(self.classifier)

    def set_label_weights(self, weights: torch.Tensor | None) -> None:
        """Weigh the loss per class (or per label's positives); None removes the weights."""
        if weights is not None and tuple(weights.shape) != (self.num_labels,):
            raise ValueError(f"label weights of shape {tuple(weights.shape)} for {self.num_labels} outputs")
        device = self.classifier.out_proj.weight.device
        self.label_weights = None if weights is None else weights.to(device=device, dtype=torch.float32)

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
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(encoded.last_hidden_state)  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of `problem_type` (inferred from the labels as `transformers` does when unset)."""
        return sequence_classification_loss(logits, labels, self.problem_type, self.label_weights)


class ElectraForTokenClassification(ElectraPreTrainedModel):
    """A label per token (NER) from each final token vector after dropout; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.electra = ElectraModel(config)
        self.dropout = head_dropout(config)
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
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, H) -> (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class ElectraForQuestionAnswering(ElectraPreTrainedModel):
    """Span QA: a start and an end score for every token."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
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
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits = (x.squeeze(-1) for x in logits.split(1, dim=-1))  # (B, T) each
        if attention_mask is not None:  # a span never starts or ends on padding (transformers lets it compete)
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


class SequenceSummary(nn.Module):
    """The multiple-choice summary of a sequence: its first token's vector, through an optional H -> H
    projection (`summary_use_proj`) and activation (`summary_activation`), between dropouts
    (`summary_first_dropout`, a key transformers reads when config.json has it, and
    `summary_last_dropout`)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        first_rate = float(config.extra.get("summary_first_dropout", 0.0))
        self.first_dropout = nn.Dropout(first_rate) if first_rate > 0 else nn.Identity()
        self.summary = nn.Linear(config.hidden_size, config.hidden_size) if config.summary_use_proj else nn.Identity()
        self.act = named_activation(config.summary_activation)
        rate = config.summary_last_dropout
        self.last_dropout = nn.Dropout(rate) if rate > 0 else nn.Identity()

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        first = self.first_dropout(sequence[:, 0])  # (B, H): [CLS]
        return self.last_dropout(self.act(self.summary(first)))


class ElectraForMultipleChoice(ElectraPreTrainedModel):
    """SWAG-style: score each (context, choice) pair from the summary of its [CLS] vector, softmax
    over the choices."""

    job: ClassVar[str | None] = "multiple-choice"
    head_prefixes = ("sequence_summary.", "classifier.")

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.sequence_summary = SequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_modules(self.sequence_summary, self.classifier)

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

        encoded: EncoderOutput = self.electra(
            flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        scores = self.classifier(self.sequence_summary(encoded.last_hidden_state))  # (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


__all__ = ["DiscriminatorPredictions", "ElectraClassificationHead", "ElectraForMaskedLM",
           "ElectraForMultipleChoice", "ElectraForPreTraining", "ElectraForQuestionAnswering",
           "ElectraForSequenceClassification", "ElectraForTokenClassification", "GeneratorPredictions",
           "SequenceSummary", "TiedVocabularyProjection", "replaced_token_detection_loss"]
