"""RobertaModel = embeddings + N post-LN encoder layers + pooler, and the base class of every RoBERTa model.

The layers are BERT's (`bertforge.model.layers.EncoderLayer`, fused q/k/v); what is RoBERTa's own is
the embedding: positions are counted from `input_ids` as fairseq does, starting at
padding_idx + 1, with padding tokens at padding_idx (whose row the position table keeps at zero).

Shapes in comments: B = batch, T = sequence length, N = real (unpadded) tokens, H = hidden size.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertforge.checkpoint import KeyLayout
from bertforge.model.base import EncoderOutput, PreTrainedModel
from bertforge.model.layers import EncoderLayer, run_layers
from bertforge.model.roberta.config import RobertaConfig
from bertforge.model.roberta.keys import LAYOUT

# Our keys of the pooler, wherever the backbone sits.
ROBERTA_POOLER_KEYS = r"(^|\.)pooler\."


class RobertaPreTrainedModel(PreTrainedModel):
    """Shared by the RoBERTa models: the family's config, key layout and checkpoint facts."""

    model_type: ClassVar[str] = "roberta"
    config_class: ClassVar[type[RobertaConfig]] = RobertaConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    # The attribute holding the RobertaModel, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = "roberta"
    # Masked-LM checkpoints (roberta-base among them) ship without a pooler.
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = (ROBERTA_POOLER_KEYS,)
    # transformers' position-id and token-type-id buffers repeat what the model computes.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.(position_ids|token_type_ids)$",)

    config: RobertaConfig


def position_ids_from(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:  # (B, T) -> (B, T)
    """fairseq's positions: the k-th non-padding token of a row is at padding_idx + k, padding at
    padding_idx. They follow the ids, not the attention mask, as in every RoBERTa checkpoint's training."""
    real = input_ids.ne(padding_idx).long()  # (B, T) 1 at tokens, 0 at padding
    return real.cumsum(dim=1) * real + padding_idx


class RobertaEmbeddings(nn.Module):
    """Token + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.padding_idx = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden, padding_idx=config.pad_token_id)
        # padding_idx: the row padding positions read starts (and stays, without gradient) at zero
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden,
                                                padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.layer_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None,  # (B, T); None: every token is of type 0
        position_ids: torch.Tensor | None,  # (B, T); None: counted from input_ids
    ) -> torch.Tensor:  # (B, T, H)
        if position_ids is None:
            position_ids = position_ids_from(input_ids, self.padding_idx)
        embeddings = self.word_embeddings(input_ids)  # (B, T, H)
        if token_type_ids is None:  # type 0 everywhere: one row, broadcast rather than looked up
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.layer_norm(embeddings))


class RobertaPooler(nn.Module):
    """dense + tanh on the final <s> vector (transformers' RobertaModel has one; its heads mostly do not)."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class RobertaEncoder(nn.Module):
    """The L post-LN layers, under `encoder.layers` as in BERT's key layout."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))


class RobertaModel(RobertaPreTrainedModel):
    """The bidirectional encoder: ids -> final token vectors and the pooled <s> vector."""

    job: ClassVar[str | None] = "embeddings"
    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: RobertaConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = RobertaEncoder(config)
        self.pooler = RobertaPooler(config) if add_pooling_layer else None
        # The fast path's switches, read by `run_layers` (see FastPathSwitches): drop padding before
        # the encoder; attend per sequence (True), re-padded (False) or per sequence for CPU inference
        # only (None); recompute activations in backward; build the mask whatever the batch holds.
        self.unpad = True
        self.attention_per_sequence: bool | None = None
        self.gradient_checkpointing = False
        self.always_build_mask = False
        self.init_weights()

    def transformer_layers(self) -> nn.ModuleList:
        return self.encoder.layers

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # (B, T); ignored with a single token type
        position_ids: torch.Tensor | None = None,  # (B, T); default counted from input_ids (position_ids_from)
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """Encode a batch. With one token type (the released models) `token_type_ids` are ignored,
        whatever they hold: a WordPiece tokenizer writes 1 for a pair's second segment, which would
        index past the table, and RoBERTa separates segments by </s></s> alone."""
        length = input_ids.shape[1]
        # Under torch.compile / export the length is symbolic: a check would pin the graph to it.
        if not torch.compiler.is_compiling() and length > self.config.max_tokens:
            raise ValueError(
                f"sequence length {length} exceeds the {self.config.max_tokens} token positions of this model "
                f"(max_position_embeddings {self.config.max_position_embeddings} less pad_token_id + 1, where "
                "positions start); truncate the input (tokenizer truncation=True)"
            )
        if self.config.type_vocab_size == 1:
            token_type_ids = None

        hidden = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        hidden, all_hidden, all_attentions = run_layers(
            self, self.encoder.layers, hidden, attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        return EncoderOutput(
            last_hidden_state=hidden,
            pooled_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )
