"""ElectraModel = embeddings of width E + a projection to H + N post-LN encoder layers, and the base
class of every ELECTRA model (Clark et al., 2020).

    x = Dropout(LN(word(ids) + position(0..T-1) + segment(types)))   all three tables of width E
    x = W_p x + b_p                                                  `embeddings_project`, only when E != H
    for each layer i:                                                `bertforge.model.layers.EncoderLayer`
        x = LN(x + Dropout(Attention(x)))
        x = LN(x + Dropout(W2 act(W1 x)))

The layers are BERT's; what is ELECTRA's own is the embedding width: the generator of a pre-training
pair is narrower than its discriminator but shares its embedding tables, so the tables have a width
of their own (E) and each model projects them to its hidden size. There is no pooler: the heads read
the final token vectors. Padding is dropped before the first layer (`run_layers`).

Shapes in comments: B = batch, T = sequence length, N = real (unpadded) tokens, E = embedding
width, H = hidden size.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertforge.checkpoint import KeyLayout
from bertforge.model.base import EncoderOutput, PreTrainedModel
from bertforge.model.electra.config import ElectraConfig
from bertforge.model.electra.keys import LAYOUT
from bertforge.model.layers import EncoderLayer, run_layers


class ElectraPreTrainedModel(PreTrainedModel):
    """Shared by the ELECTRA models: the family's config, key layout and checkpoint facts."""

    model_type: ClassVar[str] = "electra"
    config_class: ClassVar[type[ElectraConfig]] = ElectraConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    # The attribute holding the ElectraModel, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = "electra"
    # transformers' position-id and token-type-id buffers (in older files) repeat what the model computes.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.(position_ids|token_type_ids)$",)

    config: ElectraConfig


class ElectraEmbeddings(nn.Module):
    """Token + position + token-type embeddings of width E, then LayerNorm and dropout."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        width = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None,  # (B, T); None: every token is of type 0
        position_ids: torch.Tensor,  # (B, T) or (1, T)
    ) -> torch.Tensor:  # (B, T, E)
        embeddings = self.word_embeddings(input_ids)  # (B, T, E)
        if token_type_ids is None:  # type 0 everywhere: one row, broadcast rather than looked up
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.layer_norm(embeddings))


class ElectraEncoder(nn.Module):
    """The L post-LN layers, under `encoder.layers` as in BERT's key layout."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))


class ElectraModel(ElectraPreTrainedModel):
    """The bidirectional encoder: ids -> final token vectors (no pooled vector: ELECTRA has no pooler)."""

    job: ClassVar[str | None] = "embeddings"
    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.embeddings = ElectraEmbeddings(config)
        # E -> H; transformers' checkpoints have this Linear only when the widths differ
        self.embeddings_project = (nn.Linear(config.embedding_size, config.hidden_size)
                                   if config.embedding_size != config.hidden_size else None)
        self.encoder = ElectraEncoder(config)
        self.pooler = None
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

    def embed(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None = None,  # (B, T)
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
    ) -> torch.Tensor:  # (B, T, H)
        """The layers' input: the embeddings, projected to the hidden size where E != H."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, T)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, E)
        return self.embeddings_project(hidden) if self.embeddings_project is not None else hidden

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # (B, T)
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """Encode a batch. The first hidden state is the layers' input, after the projection to H
        (as transformers reports it)."""
        length = input_ids.shape[1]
        # Under torch.compile / export the length is symbolic: a check would pin the graph to it.
        if not torch.compiler.is_compiling() and length > self.config.max_tokens:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings}); truncate the input (tokenizer truncation=True)")
        hidden = self.embed(input_ids, token_type_ids, position_ids)  # (B, T, H)
        hidden, all_hidden, all_attentions = run_layers(
            self, self.encoder.layers, hidden, attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        return EncoderOutput(last_hidden_state=hidden, pooled_output=None, hidden_states=all_hidden,
                             attentions=all_attentions)


__all__ = ["ElectraEmbeddings", "ElectraEncoder", "ElectraModel", "ElectraPreTrainedModel"]
