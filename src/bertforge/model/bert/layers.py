"""BERT's embeddings (token + position + segment, LayerNorm, dropout; ALBERT's factorisation).

The post-LN Transformer layer it stacks is shared by the BERT-style families: `bertforge.model.layers`.

Shapes in comments: B = batch, T = sequence length, H = hidden size, A = attention heads,
d = H / A (head size), I = intermediate (feed-forward) size, E = embedding size (H unless
ALBERT-factorised).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.model.bert.config import BertConfig
from bertforge.model.layers import Dropout


class Embeddings(nn.Module):
    """Token + position + segment (token type) embeddings, then LayerNorm and dropout.

    Two family switches change it. `type_vocab_size: 0` drops the segment table (RoBERTa), and
    `embedding_size` E makes the tables E wide, normalises on E and projects E -> H with a Linear
    (ALBERT's factorisation: V x E + E x H parameters instead of V x H, a big saving when V >> H > E).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.embedding_dim  # E (= H unless factorised)
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size > 0 else None
        )
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(width, config.hidden_size) if config.embedding_size is not None else None

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None,  # (B, T); not read when there is no segment table
        position_ids: torch.Tensor,  # (B, T) or (1, T)
    ) -> torch.Tensor:
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, E)
        if self.token_type_embeddings is not None:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = self.dropout(self.layer_norm(embeddings))
        if self.projection is not None:
            embeddings = self.projection(embeddings)  # (B, T, E) -> (B, T, H)
        return embeddings  # (B, T, H)
