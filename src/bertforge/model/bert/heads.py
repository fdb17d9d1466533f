"""Pre-training heads on one BertModel backbone: masked LM (from T_i) and next-sentence prediction (from C),
and optionally SpanBERT's span-boundary objective; the left-to-right LM head (a causal encoder,
`is_decoder`); then the fine-tuning heads.

Losses are computed here when labels are given, so that a training loop only needs
`loss = model(**batch).loss`. Label conventions are Hugging Face's: MLM labels are -100 where a
position is not predicted; next-sentence label 0 = B follows A (IsNext), 1 = B is random (NotNext);
left-to-right LM labels are the input ids themselves (-100 where not predicted), shifted inside the model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
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
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.bert.config import BertConfig
from bertforge.model.bert.modeling import POOLER_KEYS, BertModel, BertPreTrainedModel
from bertforge.model.layers import activation


class MaskedLMHead(nn.Module):
    """dense + activation + LayerNorm, then a decoder tied to the word embeddings, plus a bias.

    The decoder weight is the word-embedding matrix itself, passed in at call time: the tie cannot
    come undone by loading, casting or moving one copy, and the state dict holds the matrix once.
    With factorised embeddings (E < H) the dense layer maps H -> E, as in ALBERT, so that the
    decoder can still be the (V, E) embedding matrix.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.embedding_dim  # E (= H unless factorised)
        self.transform = nn.Sequential()
        self.transform.add_module("dense", nn.Linear(config.hidden_size, width))
        self.transform.add_module("act", activation(config.hidden_act))
        self.transform.add_module("layer_norm", nn.LayerNorm(width, eps=config.layer_norm_eps))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        # (..., H) -> (..., E) -> (..., V)
        return self.decode(self.transform(hidden), word_embeddings)

    def decode(self, vectors: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """The tied output layer alone, (..., E) -> (..., V); the span-boundary head shares it."""
        return F.linear(vectors, word_embeddings, self.bias)


@dataclass
class SpanBoundaries:
    """Where each masked token's span is, for the span-boundary objective (all (B, T), see `span_boundaries`)."""

    valid: torch.Tensor  # bool: a labelled position that gets an SBO term
    left: torch.Tensor  # s - 1: the token just before the span
    right: torch.Tensor  # e + 1: the token just after the span
    offset: torch.Tensor  # i - s: 0 for the span's first token (the paper's relative position i - s + 1, from 0)


def span_boundaries(labels: torch.Tensor, max_span_length: int) -> SpanBoundaries:
    """The spans of a batch's MLM labels: each maximal run of consecutive labelled positions is a span.

    SpanBERT masks contiguous spans and predicts each of their tokens from the two tokens just outside
    (x_{s-1}, x_{e+1}). Rather than carry span ids in the data, spans are read back from the labels
    (`labels != -100`): whatever masker made them, a run of labelled positions is a span. Two masked
    spans that touch therefore merge into one, and unlabelled positions split spans. A labelled
    position gets an SBO term (`valid`) when both boundaries lie inside the sequence and it is fewer
    than `max_span_length` tokens from its span's start (the relative-position table's size); the
    others still count for MLM. No Python loop: cummax / cummin find each run's start and end.
    """
    batch, length = labels.shape
    labelled = labels != IGNORE_INDEX  # (B, T)
    position = torch.arange(length, device=labels.device).expand(batch, length)  # (B, T)
    unlabelled_column = labelled.new_zeros(batch, 1)
    before = torch.cat([unlabelled_column, labelled[:, :-1]], dim=1)  # labelled[t - 1]
    after = torch.cat([labelled[:, 1:], unlabelled_column], dim=1)  # labelled[t + 1]
    # A labelled position's span starts at the latest run start at or before it, and ends at the
    # earliest run end at or after it.
    start = torch.where(labelled & ~before, position, -1).cummax(dim=1).values  # (B, T)
    end = torch.where(labelled & ~after, position, length).flip(1).cummin(dim=1).values.flip(1)  # (B, T)
    left, right, offset = start - 1, end + 1, position - start
    valid = labelled & (left >= 0) & (right < length) & (offset < max_span_length)
    return SpanBoundaries(valid=valid, left=left, right=right, offset=offset)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span-boundary objective (Joshi et al., 2020), up to the shared decoder.

    For a masked token x_i in the span (x_s .. x_e): h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}], with p a
    learned relative-position embedding, then two layers of dense + GELU + LayerNorm (3H -> H -> E)
    give the vector that the MLM head's tied decoder (word embeddings + bias) scores against the
    vocabulary. Its last width is E so that the decoder can be shared with factorised embeddings.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden, width, eps = config.hidden_size, config.embedding_dim, config.layer_norm_eps
        self.position_embeddings = nn.Embedding(config.max_span_length, hidden)
        self.transform = nn.Sequential()
        self.transform.add_module("dense1", nn.Linear(3 * hidden, hidden))
        self.transform.add_module("act1", activation(config.hidden_act))
        self.transform.add_module("layer_norm1", nn.LayerNorm(hidden, eps=eps))
        self.transform.add_module("dense2", nn.Linear(hidden, width))
        self.transform.add_module("act2", activation(config.hidden_act))
        self.transform.add_module("layer_norm2", nn.LayerNorm(width, eps=eps))

    def forward(
        self,
        left: torch.Tensor,  # (M, H): x_{s-1} for each of the M predicted tokens
        right: torch.Tensor,  # (M, H): x_{e+1}
        offset: torch.Tensor,  # (M,): i - s
    ) -> torch.Tensor:  # (M, E)
        return self.transform(torch.cat([left, right, self.position_embeddings(offset)], dim=-1))  # (M, 3H)


class _MaskedLMMixin:
    """Masked-LM logits and loss, and the span-boundary loss, shared by BertForPreTraining and BertForMaskedLM."""

    bert: BertModel
    mlm: MaskedLMHead
    sbo: SpanBoundaryHead | None

    # The decoder is the word-embedding matrix (and its bias is `mlm.bias`): a file's copy repeats them.
    keys_redundant_on_load = (*BertPreTrainedModel.keys_redundant_on_load,
                              r"^cls\.predictions\.decoder\.(weight|bias)$")

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:
        """The MLM head on final token vectors, (..., H) -> (..., V) (fill-mask on chosen positions)."""
        return self.mlm(vectors, self.bert.embeddings.word_embeddings.weight)

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

    def _span_boundary_loss(self, sequence: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
        """SpanBERT's SBO loss over the labelled positions inside spans (see `span_boundaries`)."""
        if self.sbo is None or labels is None:
            return None
        spans = span_boundaries(labels, self.sbo.position_embeddings.num_embeddings)
        rows = torch.arange(labels.shape[0], device=labels.device)[:, None].expand_as(labels)[spans.valid]  # (M,)
        left = sequence[rows, spans.left[spans.valid]]  # (M, H)
        right = sequence[rows, spans.right[spans.valid]]  # (M, H)
        vectors = self.sbo(left, right, spans.offset[spans.valid])  # (M, E)
        logits = self.mlm.decode(vectors, self.bert.embeddings.word_embeddings.weight)  # (M, V)
        targets = labels[spans.valid]  # (M,)
        if targets.numel() == 0:  # no span with both boundaries: a zero that still reaches the head
            return logits.sum() * 0.0
        return F.cross_entropy(logits.float(), targets)


class BertForPreTraining(_MaskedLMMixin, BertPreTrainedModel):
    """BERT with both pre-training heads: masked LM on T_i and next-sentence prediction on C.

    Config switches: `next_sentence_head: false` drops the NSP/SOP classifier and the pooler it reads
    (RoBERTa / SpanBERT pre-train without a sentence objective); `span_boundary_objective: true` adds
    SpanBERT's span-boundary head, whose loss joins the total and is reported as `sbo_loss`.
    """

    job: ClassVar[str | None] = "pretraining"
    head_prefixes = ("mlm.", "nsp.", "sbo.")
    keys_to_ignore_on_load_unexpected = (POOLER_KEYS,)  # with next_sentence_head off there is no pooler

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=config.next_sentence_head)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2) if config.next_sentence_head else None
        self.sbo = SpanBoundaryHead(config) if config.span_boundary_objective else None
        # the backbone initialised itself
        self.init_modules(*(head for head in (self.mlm, self.nsp, self.sbo) if head is not None))

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
        nsp_logits = nsp_loss = None
        if self.nsp is not None:
            nsp_logits = self.nsp(encoded.pooled_output)  # (B, H) -> (B, 2)
            if next_sentence_label is not None:
                nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1))
        elif next_sentence_label is not None:
            raise ValueError("this model has no next-sentence head (config next_sentence_head: false) but was "
                             "given next_sentence_label; use data prepared with objective 'none'")
        sbo_loss = self._span_boundary_loss(encoded.last_hidden_state, labels)
        losses = [x for x in (mlm_loss, nsp_loss, sbo_loss) if x is not None]
        return PreTrainingOutput(
            loss=sum(losses) if losses else None,  # type: ignore[arg-type]
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            mlm_logits=mlm_logits,
            nsp_logits=nsp_logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
            sbo_loss=sbo_loss,
        )


class BertForMaskedLM(_MaskedLMMixin, BertPreTrainedModel):
    """BERT with the masked-LM head only (no pooler, as in Hugging Face): fill-mask and MLM-only training.

    With `span_boundary_objective: true` it also carries SpanBERT's span-boundary head (its loss is
    added, and reported as `sbo_loss`): the model `pretrain` trains on data without a sentence objective.
    """

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("mlm.", "sbo.")
    keys_to_ignore_on_load_unexpected = (POOLER_KEYS,)  # no pooler: a file's is not needed, not wrong

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config)
        self.sbo = SpanBoundaryHead(config) if config.span_boundary_objective else None
        self.init_modules(*(head for head in (self.mlm, self.sbo) if head is not None))

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
        sbo_loss = self._span_boundary_loss(encoded.last_hidden_state, labels)
        return PreTrainingOutput(
            loss=mlm_loss if sbo_loss is None else mlm_loss + sbo_loss, mlm_loss=mlm_loss, nsp_loss=None,
            mlm_logits=mlm_logits, nsp_logits=None, hidden_states=encoded.hidden_states,
            attentions=encoded.attentions, sbo_loss=sbo_loss,
        )


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None  # mean next-token cross-entropy over the positions whose next token is labelled
    # (B, T, V) without labels (position i scores token i + 1); with labels, (N, V) for the N predicted
    # positions only, in the row-major order of `labels[:, 1:] != -100`, as the MLM heads do.
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class BertLMHeadModel(BertPreTrainedModel):
    """A left-to-right language model on a causal BERT (`is_decoder: true`): the BERT paper's "LTR & No
    NSP" ablation, a model like OpenAI GPT trained to predict the next token.

    transformers' class of the same name, key for key: the backbone without a pooler and the masked-LM
    head (`cls.predictions.*`, decoder tied to the word embeddings) applied to every position, so a
    save loads there and gives the same logits. Its loss shifting too: `labels` are aligned with
    `input_ids` (usually the ids themselves, -100 at padding), and position i is scored against
    labels[i + 1], so the last position predicts nothing; nor does a padding position.
    """

    job: ClassVar[str | None] = "causal-lm"
    head_prefixes = ("mlm.",)
    keys_to_ignore_on_load_unexpected = (POOLER_KEYS,)  # no pooler: a file's is not needed, not wrong
    keys_redundant_on_load = _MaskedLMMixin.keys_redundant_on_load  # the tied decoder

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if not config.is_decoder:  # as transformers says: without the causal mask each position sees its target
            warnings.warn("BertLMHeadModel on a config with is_decoder false attends both ways, so every position "
                          "sees the token it predicts; set is_decoder: true", stacklevel=2)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config)
        self.init_modules(self.mlm)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T)
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) aligned with input_ids, -100 where not predicted
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> CausalLMOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        sequence, word_embeddings = encoded.last_hidden_state, self.bert.embeddings.word_embeddings.weight
        if labels is None:
            return CausalLMOutput(None, self.mlm(sequence, word_embeddings), encoded.hidden_states, encoded.attentions)
        targets = labels[:, 1:]  # (B, T - 1): the token after each position but the last
        predicted = targets != IGNORE_INDEX  # (B, T - 1)
        if attention_mask is not None:
            # A padding position predicts nothing, even where the labels would score it: with left
            # padding, the pad just before the first token (transformers scores its meaningless vector).
            predicted = predicted & (attention_mask[:, :-1] != 0)
        # The vocabulary projection only where a next token is scored (not padding, not the last real token)
        logits = self.mlm(sequence[:, :-1][predicted], word_embeddings)  # (N, H) -> (N, V)
        if not predicted.any():  # nothing to predict: a zero that still has a graph
            loss = logits.sum() * 0.0
        else:
            loss = F.cross_entropy(logits.float(), targets[predicted])
        return CausalLMOutput(loss, logits, encoded.hidden_states, encoded.attentions)


# ------------------------------------------------------------------------------------------------
# Fine-tuning heads: one new output layer on the backbone (plus dropout), Hugging Face's names
# (`classifier`, `qa_outputs`) so that checkpoints move between the two libraries unchanged.
# ------------------------------------------------------------------------------------------------
def _classifier_dropout(config: BertConfig) -> nn.Dropout:
    rate = config.extra.get("classifier_dropout")
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


def last_token_positions(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """(B,) the position of each row's last real token (T - 1 without a mask), whatever the padding side."""
    batch, length = input_ids.shape
    if attention_mask is None:
        return torch.full((batch,), length - 1, dtype=torch.long, device=input_ids.device)
    index = torch.arange(length, device=attention_mask.device)  # (T,)
    return (attention_mask.long() * index).argmax(dim=-1)  # (B,); 0 for a row of padding alone


def sentence_vector(bert: BertModel, encoded: EncoderOutput, attention_mask: torch.Tensor | None,
                    input_ids: torch.Tensor) -> torch.Tensor:  # (B, H)
    """The vector a sentence head (classification, multiple choice) reads: the pooled [CLS] vector, or,
    for a causal model (`is_decoder`), the pooler on the LAST real token's vector.

    Under a causal mask [CLS] at position 0 attends to itself alone, so its vector knows nothing of the
    sentence; the last real token is the one that has seen every token, which is what OpenAI GPT's
    classifier reads. The pooler (dense + tanh) stays, so the head's weights and keys are BERT's.
    """
    if not bert.config.is_decoder:
        return encoded.pooled_output  # type: ignore[return-value]
    positions = last_token_positions(attention_mask, input_ids)  # (B,)
    return bert.pooler(encoded.last_hidden_state, positions)  # type: ignore[misc]


class BertForSequenceClassification(WeightedClassifier, BertPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the pooled [CLS] vector (the
    last real token's for a causal model, `is_decoder`: see `sentence_vector`).

    The loss follows config.json's `problem_type`, as in `transformers`: "regression" (mean squared
    error), "single_label_classification" (cross-entropy over class ids) or
    "multi_label_classification" (sigmoid + binary cross-entropy over (B, num_labels) 0/1 targets).
    Without one it is inferred the same way: one output is regression, integer labels single-label,
    float label vectors multi-label. `label_weights` (num_labels,) weighs the loss for imbalanced data:
    per-class weights of the cross-entropy, or the positive weight of each label's binary
    cross-entropy; it is a training setting, not saved with the model.
    """

    job: ClassVar[str | None] = "sequence-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
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
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        # [CLS]'s pooled vector; the last real token's for a causal (left-to-right) model
        pooled = sentence_vector(self.bert, encoded, attention_mask, input_ids)  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, H) -> (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (NER) from each final token vector T_i; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)
    # Every token's vector is read, not the pooled [CLS]: a pre-trained encoder's pooler goes unused.
    keys_to_ignore_on_load_unexpected = (POOLER_KEYS,)

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
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span QA as in the paper: a start vector S and an end vector E dotted with every T_i."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)
    keys_to_ignore_on_load_unexpected = (POOLER_KEYS,)  # spans are read from every token, not [CLS]

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
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


class BertForMultipleChoice(BertPreTrainedModel):
    """SWAG-style: score each (context, choice) pair from its pooled vector (see `sentence_vector`),
    softmax over the choices."""

    job: ClassVar[str | None] = "multiple-choice"
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
        # each pair's [CLS] pooled vector; its last real token's for a causal model (see sentence_vector)
        pooled = sentence_vector(self.bert, encoded, flat(attention_mask), flat(input_ids))  # (B*C, H)
        scores = self.classifier(self.dropout(pooled))  # (B*C, H) -> (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)
