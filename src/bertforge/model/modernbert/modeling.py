"""ModernBERT (Warner et al., 2024): the encoder and its task heads, on the same base class as BERT.

What differs from BERT's layers (see `ModernBertConfig` for the config.json names):

    x = LN(tok_embeddings(ids))                                  no position or segment tables
    for each layer i:                                            pre-norm (layer 0 has no attention norm)
        x = x + Wo(attention(rotary(Wqkv(LN(x)))))               global, or a sliding window of +-w tokens
        x = x + W2(act(W1a LN(x)) * W1b LN(x))                   GeGLU
    T = LN(x)                                                    the final norm

Rotary position embeddings (Su et al., 2021) rotate query and key pairs of dimensions by an angle
proportional to the token's position, with base 160,000 in global layers and 10,000 in local ones.
Linears and norms carry no bias (config switches), except the tied MLM decoder's.

Tokens are packed as in `BertModel` (padding dropped before the first layer, `PackedLayout`), and
each layer type attends within each sequence. A sliding-window layer never builds a T x T mask:
beyond a few windows, queries go in blocks of 2w, each against the 4w keys around it (memory
linear in T; `sliding_window_attention`).

Shapes: B batch, T length, N packed tokens, H hidden, A heads, d = H / A, I feed-forward, V vocab,
w = local_attention / 2 (the half window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.checkpoint import KeyLayout
from bertforge.config import IGNORE_INDEX
from bertforge.model.base import (
    EncoderOutput,
    PreTrainedModel,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    mean_of_real_tokens,
    num_labels,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.layers import PackedLayout, activation
from bertforge.model.modernbert.config import GLOBAL_ATTENTION, ModernBertConfig
from bertforge.model.modernbert.keys import LAYOUT


# ------------------------------------------------------------------------------------------------
# Rotary position embeddings
# ------------------------------------------------------------------------------------------------
def rotary_angles(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (..., d) in float32, for `apply_rotary`.

    Dimension pair (j, j + d/2) turns by position x base^(-2j/d). Computed on the fly (d/2
    frequencies): a buffer would be cast to bf16 with the model and lose the angles' precision.
    """
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inverse_frequency = 1.0 / (base ** exponents)  # (d/2,)
    angles = positions[..., None].float() * inverse_frequency  # (..., d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., d)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., A, d) by the angles cos, sin (..., 1, d), in float32, back in x's dtype."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    rotated_half = torch.cat((-second, first), dim=-1)  # the pair (a, b) -> (-b, a)
    return (x32 * cos + rotated_half * sin).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Sliding-window attention
# ------------------------------------------------------------------------------------------------
def sliding_window_attention(
    query: torch.Tensor,  # (B, A, T, d)
    key: torch.Tensor,  # (B, A, T, d)
    value: torch.Tensor,  # (B, A, T, d)
    half_window: int,  # w: query t sees keys t-w .. t+w
    key_padding: torch.Tensor | None = None,  # (B, T) bool, True at padding; None: no padding
    dropout_p: float = 0.0,
) -> torch.Tensor:  # (B, A, T, d)
    """Each query attends to the keys within `half_window` positions, without a T x T mask.

    Inputs within one window (T <= w + 1) need no band at all; short ones (T <= 3 x 2w) take one SDPA
    call with a banded mask, bounded in size by the window.
    Longer ones are cut into query blocks of Q = 2w; block b sees the keys [bQ - w, bQ + Q + w), a
    strip of Q + 2w, so the scores held are T x 4w, not T x T: memory grows linearly with T.
    """
    length = query.shape[-2]
    block = 2 * half_window
    if length <= half_window + 1:  # every pair is within the window: only padding to mask, if any
        bias = None if key_padding is None else _bias(~key_padding[:, None, None, :], query.dtype)  # (B, 1, 1, T)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout_p)
    if length <= 3 * block:
        positions = torch.arange(length, device=query.device)
        keep = (positions[:, None] - positions[None, :]).abs() <= half_window  # (T, T) band
        if key_padding is not None:
            keep = keep & ~key_padding[:, None, None, :]  # (B, 1, T, T)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=_bias(keep, query.dtype),
                                              dropout_p=dropout_p)
    blocks = -(-length // block)
    extra = blocks * block - length  # query positions added to fill the last block
    strip = block + 2 * half_window
    # (B, A, T, d) -> (B, A, nb, Q, d)
    query_blocks = F.pad(query, (0, 0, 0, extra)).unflatten(2, (blocks, block))

    def strips(x: torch.Tensor) -> torch.Tensor:  # (B, A, T, d) -> (B, A, nb, Q + 2w, d)
        return F.pad(x, (0, 0, half_window, extra + half_window)).unfold(2, strip, block).transpose(-1, -2)

    # Which keys of each strip are real: inside the sequence and not padding.
    real = torch.ones(query.shape[0], length, dtype=torch.bool, device=query.device)  # (B, T)
    if key_padding is not None:
        real = real & ~key_padding
    real = F.pad(real, (half_window, extra + half_window), value=False).unfold(1, strip, block)  # (B, nb, Q + 2w)
    offsets = torch.arange(strip, device=query.device)[None, :] - torch.arange(block, device=query.device)[:, None]
    band = (offsets >= 0) & (offsets <= 2 * half_window)  # (Q, Q + 2w): key j of the strip vs query i of the block
    keep = band & real[:, None, :, None, :]  # (B, 1, nb, Q, Q + 2w)
    context = F.scaled_dot_product_attention(query_blocks, strips(key), strips(value),
                                             attn_mask=_bias(keep, query.dtype), dropout_p=dropout_p)
    return context.flatten(2, 3)[:, :, :length]  # (B, A, nb, Q, d) -> (B, A, T, d)


def _bias(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean keep-mask as an additive bias: 0 kept, the dtype's minimum dropped (finite, so a row
    with nothing to keep, a padding query, gives a uniform average instead of NaN)."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)


# ------------------------------------------------------------------------------------------------
# Layers
# ------------------------------------------------------------------------------------------------
@dataclass
class Rotations:
    """The cos and sin of every token's rotary angles for one attention type: (N, 1, d) packed,
    or (B or 1, T, 1, d) padded."""

    cos: torch.Tensor
    sin: torch.Tensor


class ModernAttention(nn.Module):
    """Self-attention with rotary positions, global or within a sliding window, one fused q/k/v."""

    def __init__(self, config: ModernBertConfig, attention_type: str) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.half_window = None if attention_type == GLOBAL_ATTENTION else config.half_window
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        rotations: Rotations,
        padding: torch.Tensor | None,  # (B, T) bool, True at padding; None: no padding
        layout: PackedLayout | None,
    ) -> torch.Tensor:  # like hidden
        dropout_p = self.dropout_p if self.training else 0.0
        qkv = self.qkv(hidden).unflatten(-1, (3, self.num_heads, self.head_dim))  # (..., 3, A, d)
        query, key, value = qkv.unbind(-3)  # each (..., A, d)
        query = apply_rotary(query, rotations.cos, rotations.sin)
        key = apply_rotary(key, rotations.cos, rotations.sin)
        if layout is not None and layout.sequence_bounds is not None:
            context = self._per_sequence(query, key, value, layout.sequence_bounds, dropout_p)  # (N, A, d)
        else:
            if layout is not None:  # (N, A, d) -> (B, T, A, d)
                query, key, value = (layout.unpack(x) for x in (query, key, value))
            # (B, T, A, d) -> (B, A, T, d)
            context = self._attend(*(x.transpose(1, 2) for x in (query, key, value)), padding, dropout_p)
            context = context.transpose(1, 2)  # (B, T, A, d)
            if layout is not None:
                context = layout.pack(context)  # (N, A, d)
        return F.dropout(self.out(context.flatten(-2)), dropout_p, self.training)

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                padding: torch.Tensor | None, dropout_p: float) -> torch.Tensor:  # (B, A, T, d) each
        if self.half_window is not None:
            return sliding_window_attention(query, key, value, self.half_window, padding, dropout_p)
        bias = None if padding is None else _bias(~padding[:, None, None, :], query.dtype)  # (B, 1, 1, T)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout_p)

    def _per_sequence(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      bounds: list[tuple[int, int]], dropout_p: float) -> torch.Tensor:  # (N, A, d) each
        """Attention within each sequence's real tokens: no padding to mask or undo (see PackedLayout)."""
        # (N, A, d) -> (1, A, N, d): a sequence is a slice along N
        query, key, value = (x.transpose(0, 1)[None] for x in (query, key, value))
        contexts = [self._attend(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], None,
                                 dropout_p) for start, end in bounds]  # each (1, A, l, d)
        return torch.cat(contexts, dim=2)[0].transpose(0, 1)  # (N, A, d)


class GatedFeedForward(nn.Module):
    """GeGLU (Shazeer, 2020): H -> 2I, act(first half) x second half, -> H."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.dropout = nn.Dropout(config.mlp_dropout)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        inputs, gate = self.up(hidden).chunk(2, dim=-1)  # (..., I) each
        return self.down(self.dropout(self.act(inputs) * gate))


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernEncoderLayer(nn.Module):
    """Pre-norm: x + Attention(LN(x)), then x + GeGLU(LN(x)). The first layer's input is already
    normalised (the embedding norm), so it has no attention norm."""

    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.attention_type = config.layer_types[index]  # type: ignore[index]
        self.attention_norm = layer_norm(config) if index > 0 else nn.Identity()
        self.attention = ModernAttention(config, self.attention_type)
        self.ffn_norm = layer_norm(config)
        self.ffn = GatedFeedForward(config)

    def forward(self, hidden: torch.Tensor, rotations: Rotations, padding: torch.Tensor | None,
                layout: PackedLayout | None) -> torch.Tensor:
        hidden = hidden + self.attention(self.attention_norm(hidden), rotations, padding, layout)
        return hidden + self.ffn(self.ffn_norm(hidden))


class ModernEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout: positions enter through the rotary angles instead."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layer_norm = layer_norm(config)
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, H)
        return self.dropout(self.layer_norm(self.word_embeddings(input_ids)))


# ------------------------------------------------------------------------------------------------
# The encoder
# ------------------------------------------------------------------------------------------------
class ModernBertPreTrainedModel(PreTrainedModel):
    """Shared by the ModernBERT models: its config family, checkpoint facts and initialisation."""

    model_type: ClassVar[str] = "modernbert"
    config_class: ClassVar[type[ModernBertConfig]] = ModernBertConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    base_model_prefix: ClassVar[str] = "backbone"
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = ()  # there is no pooler
    # The prediction head and decoder bias of an MLM checkpoint under a model that has no use for them.
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (r"^head\.", r"^decoder_bias$")
    # The decoder weight is the word-embedding matrix (tie_word_embeddings must be true).
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"^decoder\.weight$",)

    config: ModernBertConfig

    def init_weights(self) -> None:
        """ModernBERT's initialisation: truncated normals (cut at `initializer_cutoff_factor` standard
        deviations) with std `initializer_range` for inputs, divided by sqrt(2L) for the projections
        that write into the residual stream; norms 1 and 0, biases 0; classifiers std H^-1/2."""
        self.init_modules(self)

    def _init_module(self, module: nn.Module) -> None:
        config = self.config
        std = config.initializer_range
        residual_std = std / math.sqrt(2.0 * config.num_hidden_layers)
        if isinstance(module, ModernAttention):
            self._truncated_normal(module.qkv, std)
            self._truncated_normal(module.out, residual_std)
        elif isinstance(module, GatedFeedForward):
            self._truncated_normal(module.up, std)
            self._truncated_normal(module.down, residual_std)
        elif isinstance(module, ModernEmbeddings):
            self._truncated_normal(module.word_embeddings, std)
        elif isinstance(module, PredictionHead):
            self._truncated_normal(module.dense, residual_std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def _truncated_normal(self, module: nn.Linear | nn.Embedding, std: float) -> None:
        cutoff = self.config.initializer_cutoff_factor * std
        nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-cutoff, b=cutoff)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _init_classifier(self, classifier: nn.Linear) -> None:
        self._truncated_normal(classifier, self.config.hidden_size ** -0.5)


class ModernBertModel(ModernBertPreTrainedModel):
    """The ModernBERT encoder: ids -> final token vectors (after the final norm). No pooler."""

    job: ClassVar[str | None] = "embeddings"

    base_model_prefix = ""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.embeddings = ModernEmbeddings(config)
        self.layers = nn.ModuleList(ModernEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config)
        self.pooler = None  # none: the sentence heads read [CLS] (or the mean) through their prediction head
        # As in BertModel: drop padding before the first layer; attend per sequence (True), re-padded
        # (False), or per sequence for CPU inference and re-padded otherwise (None).
        self.unpad = True
        self.attention_per_sequence: bool | None = None
        self.gradient_checkpointing = False
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # ignored: ModernBERT has no segment embeddings
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        del token_type_ids  # collators write them for every batch; [SEP] alone separates segments here
        if output_attentions:
            raise ValueError("attention probabilities are not available for ModernBERT models "
                             "(their attention runs in fused kernels only)")
        batch, length = input_ids.shape
        if length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings}); truncate the input")
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)
        position_ids = position_ids.expand(batch, length)

        hidden = self.embeddings(input_ids)  # (B, T, H)
        padding = None  # (B, T) True at padding; None for a batch without any (a compiled model checks none)
        if attention_mask is not None and (torch.compiler.is_compiling() or not bool(attention_mask.all())):
            padding = attention_mask == 0
        layout = None
        if self.unpad and padding is not None and not torch.compiler.is_compiling():
            per_sequence = self.attention_per_sequence
            if per_sequence is None and torch.is_grad_enabled():
                per_sequence = False  # training: backward is faster through one padded call
            layout = PackedLayout.from_mask(attention_mask, per_sequence)  # type: ignore[arg-type]
            hidden = layout.pack(hidden)  # (B, T, H) -> (N, H)
            position_ids = layout.pack(position_ids)  # (N,)
        rotations = self._rotations(position_ids)

        def padded(x: torch.Tensor) -> torch.Tensor:
            return layout.unpack(x) if layout is not None else x

        # As transformers reports them: each layer's input, then the output after the final norm.
        all_hidden = [] if output_hidden_states else None
        for layer in self.layers:
            if all_hidden is not None:
                all_hidden.append(padded(hidden))
            args = (hidden, rotations[layer.attention_type], padding, layout)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden = checkpoint(layer, *args, use_reentrant=False)
            else:
                hidden = layer(*args)
        hidden = padded(self.final_norm(hidden))  # (B, T, H)
        if all_hidden is not None:
            all_hidden.append(hidden)
        return EncoderOutput(last_hidden_state=hidden, pooled_output=None,
                             hidden_states=tuple(all_hidden) if all_hidden is not None else None)

    def _rotations(self, positions: torch.Tensor) -> dict[str, Rotations]:
        """Each attention type's rotary angles, computed once per forward for all its layers.
        positions: (N,) packed or (B, T); the angles get a heads axis to broadcast over A."""
        config = self.config
        bases = {GLOBAL_ATTENTION: config.global_rope_theta, "sliding_attention": config.local_rope_theta}
        rotations = {}
        for kind in set(config.layer_types or ()):
            cos, sin = rotary_angles(positions, config.head_dim, bases[kind])  # (..., d)
            rotations[kind] = Rotations(cos.unsqueeze(-2), sin.unsqueeze(-2))  # (..., 1, d)
        return rotations


# ------------------------------------------------------------------------------------------------
# Heads: every one reads the encoder through ModernBERT's prediction head (dense, act, norm)
# ------------------------------------------------------------------------------------------------
class PredictionHead(nn.Module):
    """dense (bias per `classifier_bias`) + activation + LayerNorm: the transform before every output layer."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.layer_norm = layer_norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        return self.layer_norm(self.act(self.dense(hidden)))


def _pool(config: ModernBertConfig, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, H) -> (B, H): the first real token's vector ("cls"), or the mean over real tokens ("mean")."""
    if config.classifier_pooling == "mean":
        return mean_of_real_tokens(hidden, attention_mask)
    first = attention_mask.argmax(dim=-1) if attention_mask is not None else torch.zeros(
        hidden.shape[0], dtype=torch.long, device=hidden.device)  # left padding: [CLS] is the first real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """Masked LM: prediction head, then the decoder tied to the word embeddings (+ its bias)."""

    job: ClassVar[str | None] = "masked-lm"

    head_prefixes = ("head.", "decoder_bias")
    keys_to_ignore_on_load_unexpected = ()

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.backbone = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None
        self.init_modules(self.head)

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
        encoded = self.backbone(input_ids, attention_mask, token_type_ids, position_ids,
                                output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        sequence = encoded.last_hidden_state  # (B, T, H)
        loss = None
        if labels is None:
            logits = self.masked_lm_logits(sequence)  # (B, T, V)
        else:  # only the labelled positions pay for the V-wide output layer
            predicted = labels != IGNORE_INDEX
            logits = self.masked_lm_logits(sequence[predicted])  # (M, V)
            targets = labels[predicted]
            loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return PreTrainingOutput(loss=loss, mlm_loss=loss, nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 hidden_states=encoded.hidden_states)

    def masked_lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        return F.linear(self.head(hidden), self.backbone.embeddings.word_embeddings.weight, self.decoder_bias)


class _ClassifierModel(ModernBertPreTrainedModel):
    """Backbone + prediction head + dropout + a `classifier` Linear of `outputs` outputs."""

    head_prefixes = ("head.", "classifier.")
    keys_to_ignore_on_load_unexpected = (r"^decoder_bias$",)

    def __init__(self, config: ModernBertConfig, outputs: int) -> None:
        super().__init__(config)
        self.backbone = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_modules(self.head)
        self._init_classifier(self.classifier)

    def _encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, output_hidden_states: bool,
                output_attentions: bool) -> EncoderOutput:
        return self.backbone(input_ids, attention_mask, None, position_ids,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions)

    def _classify(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., outputs)
        return self.classifier(self.dropout(self.head(vectors)))


class ModernBertForSequenceClassification(_ClassifierModel):
    """A label (or a score, with one output) from the pooled sequence (`classifier_pooling`)."""

    job: ClassVar[str | None] = "sequence-classification"

    def __init__(self, config: ModernBertConfig) -> None:
        self.num_labels = num_labels(config)
        super().__init__(config, self.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, *, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        encoded = self._encode(input_ids, attention_mask, position_ids, output_hidden_states, output_attentions)
        logits = self._classify(_pool(self.config, encoded.last_hidden_state, attention_mask))  # (B, labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:  # regression (STS-B)
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        return TaskOutput(loss, logits, encoded.hidden_states)


class ModernBertForTokenClassification(_ClassifierModel):
    """A label per token (NER); labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"

    def __init__(self, config: ModernBertConfig) -> None:
        self.num_labels = num_labels(config)
        super().__init__(config, self.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, *, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        encoded = self._encode(input_ids, attention_mask, position_ids, output_hidden_states, output_attentions)
        logits = self._classify(encoded.last_hidden_state)  # (B, T, labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states)


class ModernBertForQuestionAnswering(_ClassifierModel):
    """Span QA: start and end logits per token (transformers names the output layer `classifier`)."""

    job: ClassVar[str | None] = "question-answering"

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None, end_positions: torch.Tensor | None = None, *,
                output_hidden_states: bool = False, output_attentions: bool = False) -> SpanOutput:
        encoded = self._encode(input_ids, attention_mask, position_ids, output_hidden_states, output_attentions)
        logits = self._classify(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states)


class ModernBertForMultipleChoice(_ClassifierModel):
    """SWAG-style: one score per (context, choice) pair from its pooled vector, softmax over choices."""

    job: ClassVar[str | None] = "multiple-choice"

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, *, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        batch, choices, length = input_ids.shape

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:  # (B, C, T) -> (B*C, T)
            return None if x is None else x.reshape(batch * choices, length)

        mask = flat(attention_mask)
        encoded = self._encode(flat(input_ids), mask, flat(position_ids),  # type: ignore[arg-type]
                               output_hidden_states, output_attentions)
        logits = self._classify(_pool(self.config, encoded.last_hidden_state, mask)).view(batch, choices)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states)
