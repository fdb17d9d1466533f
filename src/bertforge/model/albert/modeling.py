"""AlbertModel = factorised embeddings + L post-LN layers sharing G groups' weights + pooler, and the
base class of every ALBERT model (Lan et al., 2020).

    x = Dropout(LN(word(ids) + position(0..T-1) + segment(types)))   E wide
    x = W_in x                                                        E -> H
    for depth i in 0..L-1:                                            layer i // (L / G) of the G stored
        x = LN(x + Dropout(Attention(x)))                             `bertforge.model.layers.EncoderLayer`
        x = LN(x + W2 act(W1 x))                                      no dropout on the feed-forward output
    pooled = tanh(W_p x[:, 0])

Sharing makes the encoder hold G layers' parameters (one, in every released model) for the compute
of L; the same module is simply run at several depths, so gradients from each depth add up in it.
Padding is dropped before the first layer as in every family on the shared layer (`run_layers`).

Shapes in comments: B batch, T length, N real (unpadded) tokens, E embedding size, H hidden size.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertforge.checkpoint import KeyLayout
from bertforge.model.albert.config import AlbertConfig
from bertforge.model.albert.keys import LAYOUT
from bertforge.model.base import EncoderOutput, PreTrainedModel
from bertforge.model.layers import EncoderLayer, run_layers

# Our keys of the pooler, wherever the backbone sits.
ALBERT_POOLER_KEYS = r"(^|\.)pooler\."


class AlbertPreTrainedModel(PreTrainedModel):
    """Shared by the ALBERT models: the family's config, key layout and checkpoint facts."""

    model_type: ClassVar[str] = "albert"
    config_class: ClassVar[type[AlbertConfig]] = AlbertConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    # The attribute holding the AlbertModel, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = "albert"
    # Masked-LM, token-classification and QA checkpoints ship without a pooler.
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = (ALBERT_POOLER_KEYS,)
    # transformers' position-id and token-type-id buffers (older files) repeat what the model computes.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.(position_ids|token_type_ids)$",)

    config: AlbertConfig


class AlbertEmbeddings(nn.Module):
    """Token + position + segment tables E wide, LayerNorm and dropout on E, then the E -> H projection.

    The factorisation: V x E + E x H parameters instead of V x H, since a token's context-free vector
    needs less room than the hidden states built from it (E = 128 against H = 768 in ALBERT-base).
    """

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        width = config.embedding_size  # E
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(width, config.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor,  # (B, T)
        position_ids: torch.Tensor,  # (B, T) or (1, T)
    ) -> torch.Tensor:  # (B, T, H)
        tables = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
                  + self.token_type_embeddings(token_type_ids))  # (B, T, E)
        return self.projection(self.dropout(self.layer_norm(tables)))  # (B, T, E) -> (B, T, H)


class AlbertPooler(nn.Module):
    """dense + tanh on the final [CLS] vector: what the sentence-order and sentence heads read."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class AlbertEncoder(nn.Module):
    """The G distinct layers (`layers`), run L deep: depth i runs `layers[i // (L / G)]`."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        # ALBERT drops the attention probabilities and the attention output, never the feed-forward output.
        self.layers = nn.ModuleList(EncoderLayer(config, dropout_after_ffn=False)
                                    for _ in range(config.num_hidden_groups))
        self.depth = config.num_hidden_layers

    def schedule(self) -> list[EncoderLayer]:
        """The layer run at each depth 0..L-1 (the same module repeats within a group)."""
        repeats = self.depth // len(self.layers)  # L / G: the config checks that G divides L
        return [self.layers[depth // repeats] for depth in range(self.depth)]  # type: ignore[misc]


class AlbertModel(AlbertPreTrainedModel):
    """The ALBERT encoder: ids -> final token vectors and the pooled [CLS] vector."""

    job: ClassVar[str | None] = "embeddings"
    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: AlbertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = AlbertEmbeddings(config)
        self.encoder = AlbertEncoder(config)
        self.pooler = AlbertPooler(config) if add_pooling_layer else None
        # The fast path's switches, read by `run_layers` (see FastPathSwitches): drop padding before
        # the encoder; attend per sequence (True), re-padded (False) or per sequence for CPU inference
        # only (None); recompute activations in backward; build the mask whatever the batch holds.
        self.unpad = True
        self.attention_per_sequence: bool | None = None
        self.gradient_checkpointing = False
        self.always_build_mask = False
        self.init_weights()

    def transformer_layers(self) -> nn.ModuleList:
        return self.encoder.layers  # the G distinct (shared) layers, not the L depths

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # (B, T): 0 segment A, 1 segment B; default 0
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """Encode a batch; hidden states start with the projected (H-wide) embeddings, then one per depth."""
        length = input_ids.shape[1]
        # Under torch.compile / export the length is symbolic: a check would pin the graph to it.
        if not torch.compiler.is_compiling() and length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings}); truncate the input "
                             "(tokenizer truncation=True)")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)

        hidden = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        hidden, all_hidden, all_attentions = run_layers(
            self, self.encoder.schedule(), hidden, attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
        )
        return EncoderOutput(
            last_hidden_state=hidden,
            pooled_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )


__all__ = ["ALBERT_POOLER_KEYS", "AlbertModel", "AlbertPreTrainedModel"]
