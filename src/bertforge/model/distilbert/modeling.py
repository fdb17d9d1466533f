"""DistilBERT (Sanh et al., 2019): BERT's post-LN encoder at half the depth, without token types or a
pooler, and its task heads, on the same base class and shared layer as BERT.

    x = Dropout(LN(word(ids) + position(0..T-1)))               learnt positions, or fixed sinusoids
    for each layer i:                                            `bertforge.model.layers.EncoderLayer`
        x = LN(x + Attention(x))                                 no dropout on the attention output
        x = LN(x + Dropout(W2 act(W1 x)))

The heads read the final vectors directly: the sentence heads take the first token's vector
through `pre_classifier` + ReLU (there is no pooler), the masked LM projects onto the word
embeddings. Padding is dropped before the first layer as in BertModel (`run_layers`).

Shapes: B batch, T length, N packed tokens, H hidden (`dim`), I feed-forward (`hidden_dim`), V
vocabulary, C choices.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.checkpoint import KeyLayout
from bertforge.config import IGNORE_INDEX
from bertforge.model.base import (
    EncoderOutput,
    PreTrainedModel,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.distilbert.config import DistilBertConfig
from bertforge.model.distilbert.keys import LAYOUT
from bertforge.model.layers import EncoderLayer, activation, run_layers


def sinusoidal_positions(positions: int, width: int) -> torch.Tensor:  # (P, H)
    """The fixed position table of "Attention is all you need": column 2j is sin(pos / 10000^(2j/H)),
    column 2j + 1 the cosine of the same angle. Computed in float64, as transformers does, then cast."""
    pos = torch.arange(positions, dtype=torch.float64)[:, None]  # (P, 1)
    pair = torch.div(torch.arange(width), 2, rounding_mode="floor").to(torch.float64)  # j for columns 2j and 2j + 1
    angles = pos / torch.pow(10000.0, 2 * pair / width)  # (P, H)
    table = torch.empty(positions, width, dtype=torch.float64)
    table[:, 0::2] = angles[:, 0::2].sin()
    table[:, 1::2] = angles[:, 1::2].cos()
    return table.float()


class DistilEmbeddings(nn.Module):
    """Word + position embeddings, then LayerNorm and dropout. No segment table: DistilBERT dropped
    token types, so [SEP] alone separates the two texts of a pair."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.sinusoidal = config.sinusoidal_pos_embds
        if self.sinusoidal:  # fixed, as in the paper: the optimiser leaves them alone
            self.position_embeddings.weight.requires_grad_(False)

    def reset_positions(self) -> None:
        """Write the sinusoid table (with `sinusoidal_pos_embds`; learnt positions keep their values)."""
        if self.sinusoidal:
            weight = self.position_embeddings.weight
            with torch.no_grad():
                weight.copy_(sinusoidal_positions(weight.shape[0], weight.shape[1]))

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        position_ids: torch.Tensor,  # (B, T) or (1, T)
    ) -> torch.Tensor:  # (B, T, H)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.layer_norm(embeddings))


# ------------------------------------------------------------------------------------------------
# The encoder
# ------------------------------------------------------------------------------------------------
class DistilBertPreTrainedModel(PreTrainedModel):
    """Shared by the DistilBERT models: the family's config, key layout, checkpoint facts and
    initialisation (BERT's, with the sinusoid table written where the config asks for it)."""

    model_type: ClassVar[str] = "distilbert"
    config_class: ClassVar[type[DistilBertConfig]] = DistilBertConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    base_model_prefix: ClassVar[str] = "distilbert"
    # transformers' position-id buffer (in older files), and its copy of the tied projection.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.position_ids$",
                                                         r"^vocab_projector\.weight$")

    config: DistilBertConfig

    def _init_module(self, module: nn.Module) -> None:
        super()._init_module(module)
        if isinstance(module, DistilEmbeddings):  # after its tables (apply visits children first)
            module.reset_positions()


class DistilBertModel(DistilBertPreTrainedModel):
    """The DistilBERT encoder: ids -> final token vectors. No pooler (`pooled_output` is None)."""

    job: ClassVar[str | None] = "embeddings"
    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config)
        self.embeddings = DistilEmbeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, dropout_after_attention=False)
                                    for _ in range(config.n_layers))
        self.pooler = None
        # The fast path and its switches, as in BertModel (see `run_layers`): drop padding before the
        # first layer; attend per sequence (True), re-padded (False), or per sequence for CPU
        # inference only (None); recompute layers in backward; always build the mask (export).
        self.unpad = True
        self.attention_per_sequence: bool | None = None
        self.gradient_checkpointing = False
        self.always_build_mask = False
        self.init_weights()

    def transformer_layers(self) -> nn.ModuleList:
        return self.layers

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # ignored: DistilBERT has no segment embeddings
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        del token_type_ids  # collators write them for every batch; this model has no way to use them
        length = input_ids.shape[1]
        if length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings}); truncate the input (tokenizer truncation=True)")
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)
        hidden = self.embeddings(input_ids, position_ids)  # (B, T, H)
        hidden, all_hidden, all_attentions = run_layers(
            self, self.layers, hidden, attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        return EncoderOutput(last_hidden_state=hidden, pooled_output=None, hidden_states=all_hidden,
                             attentions=all_attentions)


# ------------------------------------------------------------------------------------------------
# Heads, with transformers' module names so that their keys pass through unchanged
# ------------------------------------------------------------------------------------------------
class DistilBertForMaskedLM(DistilBertPreTrainedModel):
    """Masked LM: `vocab_transform` + activation + `vocab_layer_norm`, then the projection onto the
    word embeddings (passed at call time, so the tie cannot come undone) plus its own bias."""

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("vocab_transform.", "vocab_layer_norm.", "vocab_bias")

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.act = activation(config.activation)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.vocab_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.init_modules(self.vocab_transform, self.vocab_layer_norm)  # the backbone initialised itself

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        transformed = self.vocab_layer_norm(self.act(self.vocab_transform(vectors)))
        return F.linear(transformed, self.distilbert.embeddings.word_embeddings.weight, self.vocab_bias)

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
        encoded = self.distilbert(input_ids, attention_mask, None, position_ids,
                                  output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        sequence = encoded.last_hidden_state  # (B, T, H)
        loss = None
        if labels is None:
            logits = self.masked_lm_logits(sequence)  # (B, T, V)
        else:  # only the labelled positions pay for the V-wide projection
            predicted = labels != IGNORE_INDEX  # (B, T)
            logits = self.masked_lm_logits(sequence[predicted])  # (M, V)
            targets = labels[predicted]  # (M,)
            loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return PreTrainingOutput(loss=loss, mlm_loss=loss, nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 hidden_states=encoded.hidden_states, attentions=encoded.attentions)


class _FirstTokenClassifier(DistilBertPreTrainedModel):
    """Backbone, then the first token's vector through `pre_classifier` + ReLU + dropout
    (`seq_classif_dropout`) into a `classifier` of `outputs` outputs: DistilBERT's sentence head."""

    head_prefixes = ("pre_classifier.", "classifier.")

    def __init__(self, config: DistilBertConfig, outputs: int) -> None:
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.dropout = nn.Dropout(config.seq_classif_dropout)
        self.classifier = nn.Linear(config.dim, outputs)
        self.init_modules(self.pre_classifier, self.classifier)

    def _classify(self, encoded: EncoderOutput) -> torch.Tensor:  # -> (B, outputs)
        first = encoded.last_hidden_state[:, 0]  # (B, T, H) -> (B, H): the [CLS] vector
        return self.classifier(self.dropout(F.relu(self.pre_classifier(first))))


class DistilBertForSequenceClassification(WeightedClassifier, _FirstTokenClassifier):
    """A sentence or sentence-pair label (or a score, with one output) from the [CLS] vector.

    The loss follows config.json's `problem_type` as in transformers ("regression": mean squared
    error; "single_label_classification": cross-entropy; "multi_label_classification": sigmoid +
    binary cross-entropy over (B, num_labels) 0/1 targets), inferred from the labels when unset.
    `label_weights` (num_labels,) weighs the loss for imbalanced data (per-class weights, or each
    label's positive weight); a training setting, not saved with the model.
    """

    job: ClassVar[str | None] = "sequence-classification"

    def __init__(self, config: DistilBertConfig) -> None:
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        super().__init__(config, self.num_labels)
        self.register_buffer("label_weights", None, persistent=False)

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
        encoded = self.distilbert(input_ids, attention_mask, None, position_ids,
                                  output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self._classify(encoded)  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class DistilBertForMultipleChoice(_FirstTokenClassifier):
    """SWAG-style: one score per (context, choice) pair from its [CLS] vector, softmax over the choices."""

    job: ClassVar[str | None] = "multiple-choice"

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config, 1)

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

        encoded = self.distilbert(flat(input_ids), flat(attention_mask), None, flat(position_ids),
                                  output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self._classify(encoded).view(batch, choices)  # (B*C, 1) -> (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class DistilBertForTokenClassification(DistilBertPreTrainedModel):
    """A label per token (NER) from each final vector, after the encoder's dropout; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.distilbert = DistilBertModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.dim, self.num_labels)
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
        encoded = self.distilbert(input_ids, attention_mask, None, position_ids,
                                  output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class DistilBertForQuestionAnswering(DistilBertPreTrainedModel):
    """Span QA: start and end logits per token from `qa_outputs`, after dropout (`qa_dropout`)."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.dropout = nn.Dropout(config.qa_dropout)
        self.qa_outputs = nn.Linear(config.dim, 2)  # rows: start, end
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
        encoded = self.distilbert(input_ids, attention_mask, None, position_ids,
                                  output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(self.dropout(encoded.last_hidden_state))  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


__all__ = ["DistilBertForMaskedLM", "DistilBertForMultipleChoice", "DistilBertForQuestionAnswering",
           "DistilBertForSequenceClassification", "DistilBertForTokenClassification", "DistilBertModel",
           "DistilBertPreTrainedModel", "sinusoidal_positions"]
