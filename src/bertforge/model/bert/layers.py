"""The pieces of a BERT encoder: embeddings, self-attention, feed-forward, one post-LN encoder layer.

Shapes in comments: B = batch, T = sequence length, H = hidden size, A = attention heads,
d = H / A (head size), I = intermediate (feed-forward) size, E = embedding size (H unless
ALBERT-factorised).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.bert.config import BertConfig
from bertforge.model.layers import PackedLayout, activation


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
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
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


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection.

    The default path calls `scaled_dot_product_attention` (fused kernels, no (T, T) matrix kept for
    backward where a kernel allows it). When the caller asks for the attention probabilities, the
    explicit softmax(QK^T / sqrt(d)) path runs instead, since SDPA does not return them.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # rows: [query; key; value]
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,  # (B, 1, 1, T) additive: 0 keep, -inf-ish drop; None = no padding
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        qkv = self.qkv(hidden)  # (B, T, 3H) or (N, 3H)
        dropout_p = self.attention_dropout if self.training else 0.0
        if layout is not None and layout.sequence_bounds is not None:
            return self.out(self._attend_per_sequence(qkv, layout.sequence_bounds, dropout_p)), None
        if layout is not None:
            qkv = layout.unpack(qkv)  # (N, 3H) -> (B, T, 3H)
        batch, length, hidden_size = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        # (B, T, 3H) -> (B, T, 3, A, d) -> (3, B, A, T, d)
        qkv = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)  # each (B, A, T, d)

        if output_attentions:
            scores = query @ key.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, A, T, T)
            if attention_bias is not None:
                scores = scores + attention_bias
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ value  # (B, A, T, d)
        else:
            probs = None
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_bias, dropout_p=dropout_p)

        context = context.transpose(1, 2).reshape(batch, length, hidden_size)  # (B, A, T, d) -> (B, T, H)
        if layout is not None:
            context = layout.pack(context)  # (B, T, H) -> (N, H)
        return self.out(context), probs

    def _attend_per_sequence(
        self,
        qkv: torch.Tensor,  # (N, 3H) packed
        bounds: list[tuple[int, int]],  # [start, end) of each sequence in the packed order
        dropout_p: float,
    ) -> torch.Tensor:  # (N, H)
        """Attention within each sequence's real tokens: no mask and no padding to compute or undo."""
        tokens = qkv.shape[0]
        # (N, 3H) -> (N, 3, A, d) -> (3, A, N, d): a sequence is then a slice along N
        qkv = qkv.view(tokens, 3, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        contexts = [
            F.scaled_dot_product_attention(*qkv[:, None, :, start:end].unbind(0), dropout_p=dropout_p)
            for start, end in bounds  # each (1, A, l, d)
        ]
        context = torch.cat(contexts, dim=2)[0]  # (A, N, d)
        return context.transpose(0, 1).reshape(tokens, self.num_heads * self.head_dim)  # (N, H)


class FeedForward(nn.Module):
    """Position-wise H -> I -> H with the config's activation (GELU for BERT)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        return self.down(self.act(self.up(hidden)))


class EncoderLayer(nn.Module):
    """One Transformer block as in BERT: post-LN, x = LN(x + Dropout(Sublayer(x))) twice."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(hidden, attention_bias, output_attentions, layout)
        hidden = self.attention_norm(hidden + self.dropout(attended))
        hidden = self.ffn_norm(hidden + self.dropout(self.ffn(hidden)))
        return hidden, probs
