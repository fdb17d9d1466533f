"""DeBERTa-v2/v3 (He et al., 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention";
DeBERTaV3, 2023): the encoder with disentangled attention and its task heads, on the same base class
as BERT.

    x = LN(word(ids) [+ position(0..T-1)] [+ type(types)]) * mask     absolute positions only with
                                                                      `position_biased_input`
    R = LN(rel_embeddings)                                            (2S, H): relative distances -S .. S-1
    for each layer i:                                                 post-LN, as BERT
        scores = Q K^T + c2p + p2c, all / sqrt(d * (1 + #terms))
            c2p[q, k] = Q_q . Kr[δ(q, k)]                             content to position
            p2c[q, k] = K_k . Qr[δ(q, k)]                             position to content
            δ(q, k) = clamp(bucket(q - k) + S, 0, 2S - 1)             log buckets past S / 2
        x = LN(x + Dropout(W_o softmax(scores) V))
        x = LN(x + Dropout(W2 act(W1 x)))
        (layer 0 only, with `conv_kernel_size`: x = LN(x + act(conv(embeddings))) * mask)

Kr and Qr are R through the layer's own key and query projections (`share_att_key`, v3) or through
projections of their own. transformers' `z_steps` (always 0) and the enhanced mask decoder of
pre-training are not modelled: the masked LM is transformers' DebertaV2ForMaskedLM.

The padded layout in attention: the relative scores index every (query, key) pair by the two tokens'
distance in the padded (B, T) batch, so attention always runs on the re-padded batch with a mask (one
SDPA call with the relative scores and the padding as its additive mask; the explicit softmax when
attention probabilities are asked for). The per-token layers around it (q/k/v, output projection,
feed-forward, norms) run on the packed real tokens (`PackedLayout`), which changes no number: they
treat each token alone. `unpad = False` keeps the whole encoder padded (export, reference checks).

Shapes: B batch, T length, N packed tokens, H hidden, A heads, d = H / A, I feed-forward, V
vocabulary, S half the relative-position table, C choices.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

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
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.deberta.config import DebertaV2Config
from bertforge.model.deberta.keys import LAYOUT, MLM_LAYOUT
from bertforge.model.layers import FeedForward, PackedLayout, activation, padding_bias


# ------------------------------------------------------------------------------------------------
# Relative positions
# ------------------------------------------------------------------------------------------------
def log_buckets(distances: torch.Tensor, buckets: int, span: int) -> torch.Tensor:
    """Signed distances (int) -> their buckets: exact within +-buckets/2, then logarithmic up to
    +-span, so that far tokens share rows of the table (DeBERTa-v2's `make_log_bucket_position`).

    The logarithm runs in float32 on the same values as transformers', since `ceil` would put a
    distance that falls a rounding error from a bucket edge into the other bucket.
    """
    middle = buckets // 2
    near = (distances < middle) & (distances > -middle)
    magnitude = torch.where(near, torch.full_like(distances, middle - 1), distances.abs())
    growth = torch.log(torch.tensor((span - 1) / middle, dtype=torch.float32, device=distances.device))
    far = torch.ceil(torch.log(magnitude / middle) / growth * (middle - 1)) + middle  # float32
    return torch.where(magnitude <= middle, distances.to(far.dtype), far * torch.sign(distances)).long()


def relative_index(length: int, config: DebertaV2Config, device: torch.device) -> torch.Tensor:  # (T, T)
    """δ(q, k): the row of the relative-position table for each (query, key) pair of a length-T batch."""
    positions = torch.arange(length, device=device)
    distances = positions[:, None] - positions[None, :]  # (T, T): q - k
    if config.position_buckets > 0:
        distances = log_buckets(distances, config.position_buckets, config.relative_span)
    half = config.position_table_half
    return (distances + half).clamp(0, 2 * half - 1)


class RelativePositions(NamedTuple):
    """What every layer's attention reads of the relative positions, computed once per forward."""

    table: torch.Tensor  # (2S, H): the relative-position embeddings (normalised with `norm_rel_ebd`)
    index: torch.Tensor  # (T, T): δ(q, k), the table row of each (query, key) pair


# ------------------------------------------------------------------------------------------------
# Embeddings, attention, layers
# ------------------------------------------------------------------------------------------------
class DebertaEmbeddings(nn.Module):
    """Word embeddings (+ absolute positions with `position_biased_input`, + token types when there
    is a type table), LayerNorm, zeros at padding, dropout."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden, padding_idx=config.pad_token_id)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, hidden)
                                    if config.position_biased_input else None)
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, hidden)
                                      if config.type_vocab_size > 0 else None)
        self.layer_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        token_type_ids: torch.Tensor | None,  # (B, T) or None: all segment 0
        position_ids: torch.Tensor,  # (B, T) or (1, T)
        attention_mask: torch.Tensor,  # (B, T): 1 real token, 0 padding
    ) -> torch.Tensor:  # (B, T, H)
        embedded = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            embedded = embedded + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            embedded = embedded + self.token_type_embeddings(types)
        # zeros at padding: the convolution beside the first layer reads the padded embeddings
        embedded = self.layer_norm(embedded) * attention_mask.unsqueeze(-1).to(embedded.dtype)
        return self.dropout(embedded)


class DisentangledAttention(nn.Module):
    """Self-attention whose scores add, to content-to-content, the content-to-position and
    position-to-content terms of `pos_att_type` over the relative-position table.

    q/k/v are one fused projection (rows query; key; value). With `share_att_key` the table goes
    through that same projection (its value third unused: 2S rows, cheaper than slicing the weight,
    which also keeps an int8-quantized projection whole); otherwise through `pos_key` (c2p) and
    `pos_query` (p2c). Every term is divided by sqrt(d * (1 + number of terms)), as in the paper.
    """

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(hidden, 3 * hidden)  # rows: [query; key; value]
        self.out = nn.Linear(hidden, hidden)
        # transformers counts the terms for the scale whether or not relative attention is on
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + len(config.attention_terms)))
        self.terms = config.attention_terms if config.relative_attention else []
        self.share_keys = config.share_att_key
        separate = config.relative_attention and not config.share_att_key
        self.pos_key = nn.Linear(hidden, hidden) if separate and "c2p" in self.terms else None
        self.pos_query = nn.Linear(hidden, hidden) if separate and "p2c" in self.terms else None
        self.position_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,  # (B, 1, 1, T) additive padding bias; None = no padding
        positions: RelativePositions | None,  # None without relative attention
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        qkv = self.qkv(hidden)  # (B, T, 3H) or (N, 3H)
        if layout is not None:
            qkv = layout.unpack(qkv)  # (N, 3H) -> (B, T, 3H): relative scores need the padded positions
        batch, length, hidden_size = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        # (B, T, 3H) -> (B, T, 3, A, d) -> (3, B, A, T, d)
        query, key, value = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        bias = attention_bias
        if positions is not None and self.terms:
            relative = self._relative_scores(query, key, positions)  # (B, A, T, T), scaled
            bias = relative if bias is None else relative + bias
        dropout_p = self.attention_dropout if self.training else 0.0
        if output_attentions:
            scores = query @ key.transpose(-2, -1) * self.scale  # (B, A, T, T)
            if bias is not None:
                scores = scores + bias
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ value  # (B, A, T, d)
        else:
            probs = None
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout_p,
                                                     scale=self.scale)
        context = context.transpose(1, 2).reshape(batch, length, hidden_size)  # (B, A, T, d) -> (B, T, H)
        if layout is not None:
            context = layout.pack(context)  # (B, T, H) -> (N, H)
        return self.out(context), probs

    def _relative_scores(self, query: torch.Tensor, key: torch.Tensor,  # (B, A, T, d) each
                         positions: RelativePositions) -> torch.Tensor:  # (B, A, T, T)
        table = self.position_dropout(positions.table)  # (2S, H)
        if self.share_keys:
            table_query, table_key, _ = self.qkv(table).chunk(3, dim=-1)  # (2S, H) each
        else:
            table_query = self.pos_query(table) if self.pos_query is not None else None
            table_key = self.pos_key(table) if self.pos_key is not None else None
        rows = table.shape[0]

        def heads(x: torch.Tensor) -> torch.Tensor:  # (2S, H) -> (A, 2S, d)
            return x.view(rows, self.num_heads, self.head_dim).transpose(0, 1)

        batch, _, length, _ = query.shape
        index = positions.index.expand(batch, self.num_heads, length, length)  # (B, A, T, T)
        scores = torch.zeros((), dtype=query.dtype, device=query.device)
        if "c2p" in self.terms:  # each query against the table row of its distance to each key
            by_distance = query @ heads(table_key).transpose(-1, -2)  # (B, A, T, 2S)
            scores = scores + by_distance.gather(-1, index)
        if "p2c" in self.terms:  # each key against the table row of the same distance, through the query side
            by_distance = key @ heads(table_query).transpose(-1, -2)  # (B, A, T_k, 2S)
            scores = scores + by_distance.gather(-1, index.transpose(-1, -2)).transpose(-1, -2)
        return scores * self.scale


class DebertaLayer(nn.Module):
    """One post-LN block: x = LN(x + Dropout(Attention(x))), x = LN(x + Dropout(FFN(x)))."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.attention = DisentangledAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,
        positions: RelativePositions | None,
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(hidden, attention_bias, positions, output_attentions, layout)
        hidden = self.attention_norm(hidden + self.dropout(attended))
        hidden = self.ffn_norm(hidden + self.dropout(self.ffn(hidden)))
        return hidden, probs


class DebertaConv(nn.Module):
    """DeBERTa-v2's convolution beside the first layer (`conv_kernel_size` > 0): the embeddings
    through a 1-D convolution over the sequence, added to the first layer's output before a LayerNorm."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2,
                              groups=config.conv_groups)
        self.act = nn.Tanh() if config.conv_act == "tanh" else activation(config.conv_act)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        embedded: torch.Tensor,  # (B, T, H): the padded embeddings (zeros at padding)
        layer_output: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_mask: torch.Tensor,  # (B, T)
        layout: PackedLayout | None,
    ) -> torch.Tensor:
        keep = attention_mask.unsqueeze(-1).to(embedded.dtype)  # (B, T, 1)
        convolved = self.conv(embedded.transpose(1, 2)).transpose(1, 2) * keep  # (B, T, H), zeros at padding
        convolved = self.act(self.dropout(convolved))
        if layout is not None:
            return self.layer_norm(layer_output + layout.pack(convolved))  # (N, H)
        return self.layer_norm(layer_output + convolved) * keep


# ------------------------------------------------------------------------------------------------
# The encoder
# ------------------------------------------------------------------------------------------------
class DebertaV2PreTrainedModel(PreTrainedModel):
    """What every DeBERTa-v2 model shares: the config family, the key layout, where the backbone sits."""

    model_type: ClassVar[str] = DebertaV2Config.model_type
    config_class: ClassVar[type[DebertaV2Config]] = DebertaV2Config
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    packed_attention: ClassVar[bool] = False  # relative positions need the (B, T) layout; dense layers pack
    base_model_prefix: ClassVar[str] = "deberta"
    # transformers' position-id buffer, and older files' copy of the tied legacy decoder.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.position_ids$",
                                                         r"^cls\.predictions\.decoder\.(weight|bias)$")
    # An absolute-position table in a file whose config says position_biased_input false (transformers
    # skips it too), and v3's replaced-token-detection head.
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.position_embeddings\.",
                                                                    r"^mask_predictions\.")

    config: DebertaV2Config


class DebertaV2Model(DebertaV2PreTrainedModel):
    """The DeBERTa-v2/v3 encoder: ids -> final token vectors. No pooler (`pooled_output` is None):
    the sentence heads carry their own (`pooler.dense`)."""

    job: ClassVar[str | None] = "embeddings"
    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.embeddings = DebertaEmbeddings(config)
        self.layers = nn.ModuleList(DebertaLayer(config) for _ in range(config.num_hidden_layers))
        self.rel_embeddings = (nn.Embedding(2 * config.position_table_half, config.hidden_size)
                               if config.relative_attention else None)
        # transformers builds the norm whenever norm_rel_ebd names it, so its file has the weights
        self.rel_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                         if config.relative_norm else None)
        self.conv = DebertaConv(config) if config.conv_kernel_size > 0 else None
        self.pooler = None
        # Switches, as on BertModel: drop padding around the per-token layers (attention re-pads);
        # recompute layers in backward; always build the mask (graph export).
        self.unpad = True
        self.gradient_checkpointing = False
        self.always_build_mask = False
        self.init_weights()

    def transformer_layers(self) -> nn.ModuleList:
        return self.layers

    def relative_positions(self, length: int, device: torch.device) -> RelativePositions | None:
        """The (normalised) relative-position table and δ for a length-T batch; None without relative attention."""
        if self.rel_embeddings is None:
            return None
        table = self.rel_embeddings.weight  # (2S, H)
        if self.rel_norm is not None:
            table = self.rel_norm(table)
        return RelativePositions(table, relative_index(length, self.config, device))

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # (B, T); ignored without a type table
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1 (absolute positions only)
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        length = input_ids.shape[1]
        if self.config.position_biased_input and length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings}); truncate the input (tokenizer truncation=True)")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)
        embedded = self.embeddings(input_ids, token_type_ids, position_ids, attention_mask)  # (B, T, H)
        positions = self.relative_positions(length, input_ids.device)
        bias = padding_bias(attention_mask, embedded.dtype, always=self.always_build_mask)  # (B, 1, 1, T) or None

        # Pack only when there is padding to drop; attention probabilities and compiled graphs stay padded.
        layout = None
        if self.unpad and bias is not None and not output_attentions and not torch.compiler.is_compiling():
            layout = PackedLayout.from_mask(attention_mask, per_sequence=False)
        hidden = layout.pack(embedded) if layout is not None else embedded  # (N, H) or (B, T, H)

        def padded(x: torch.Tensor) -> torch.Tensor:
            return layout.unpack(x) if layout is not None else x

        all_hidden = [embedded] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        for index, layer in enumerate(self.layers):
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden, probs = checkpoint(layer, hidden, bias, positions, output_attentions, layout,
                                           use_reentrant=False)
            else:
                hidden, probs = layer(hidden, bias, positions, output_attentions, layout)
            if index == 0 and self.conv is not None:
                hidden = self.conv(embedded, hidden, attention_mask, layout)
            if all_hidden is not None:
                all_hidden.append(padded(hidden))
            if all_attentions is not None:
                all_attentions.append(probs)
        hidden = all_hidden[-1] if all_hidden is not None else padded(hidden)  # (B, T, H)
        return EncoderOutput(last_hidden_state=hidden, pooled_output=None,
                             hidden_states=tuple(all_hidden) if all_hidden is not None else None,
                             attentions=tuple(all_attentions) if all_attentions is not None else None)


# ------------------------------------------------------------------------------------------------
# Heads, with transformers' module names (the masked LM's renamed by the key layout)
# ------------------------------------------------------------------------------------------------
class DebertaMaskedLMHead(nn.Module):
    """dense + activation + LayerNorm, then the word embeddings (passed at call time, so the tie
    cannot come undone) plus a bias of its own."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, vectors: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        return F.linear(self.layer_norm(self.act(self.dense(vectors))), word_embeddings, self.bias)


class DebertaV2ForMaskedLM(DebertaV2PreTrainedModel):
    """Masked LM. The head is `legacy_head` (transformers' `cls.predictions.*`) or `lm_head`
    (`lm_predictions.lm_head.*`) as config.json's `legacy` says; either loads from a file in the other
    layout (see `keys.MLM_LAYOUT`)."""

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("lm_head.", "legacy_head.")
    key_layout: ClassVar[KeyLayout] = MLM_LAYOUT
    # The file's head under the other layout's name: read through the fallbacks, or a copy they made.
    keys_redundant_on_load = (*DebertaV2PreTrainedModel.keys_redundant_on_load, r"^(lm_head|legacy_head)\.")

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
        head = DebertaMaskedLMHead(config)
        if config.legacy:
            self.legacy_head = head
        else:
            self.lm_head = head
        self.init_modules(head)  # the backbone initialised itself; the head's bias starts at zero

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The MLM head on final token vectors (fill-mask on chosen positions)."""
        head = self.legacy_head if self.config.legacy else self.lm_head
        return head(vectors, self.deberta.embeddings.word_embeddings.weight)

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
        encoded = self.deberta(input_ids, attention_mask, token_type_ids, position_ids,
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


class DebertaContextPooler(nn.Module):
    """The first token's vector through dropout (`pooler_dropout`), `dense` and `pooler_hidden_act`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.pooler_hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        return self.act(self.dense(self.dropout(hidden[:, 0])))


class _PooledClassifier(DebertaV2PreTrainedModel):
    """Backbone, the context pooler, dropout (`cls_dropout`, else hidden_dropout_prob) and a
    `classifier` of `outputs` outputs: DeBERTa's sentence head."""

    head_prefixes = ("pooler.", "classifier.")

    def __init__(self, config: DebertaV2Config, outputs: int) -> None:
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
        self.pooler = DebertaContextPooler(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_modules(self.pooler, self.classifier)

    def _classify(self, encoded: EncoderOutput) -> torch.Tensor:  # -> (B, outputs)
        return self.classifier(self.dropout(self.pooler(encoded.last_hidden_state)))


class DebertaV2ForSequenceClassification(WeightedClassifier, _PooledClassifier):
    """A sentence or sentence-pair label (or a score, with one output) from the pooled first token.

    The loss follows config.json's `problem_type` ("regression", "single_label_classification",
    "multi_label_classification"), inferred from the labels when unset (model/base.py's rule, shared
    by every family: float label vectors are multi-label sigmoid targets, where transformers' DeBERTa
    reads them as soft class distributions). `label_weights` (num_labels,) weighs the loss for
    imbalanced data; a training setting, not saved with the model.
    """

    job: ClassVar[str | None] = "sequence-classification"

    def __init__(self, config: DebertaV2Config) -> None:
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
        encoded = self.deberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self._classify(encoded)  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class DebertaV2ForMultipleChoice(_PooledClassifier):
    """SWAG-style: one score per (context, choice) pair from its pooled first token, softmax over the choices."""

    job: ClassVar[str | None] = "multiple-choice"

    def __init__(self, config: DebertaV2Config) -> None:
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

        encoded = self.deberta(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self._classify(encoded).view(batch, choices)  # (B*C, 1) -> (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class DebertaV2ForTokenClassification(DebertaV2PreTrainedModel):
    """A label per token (NER) from each final vector after dropout; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.deberta = DebertaV2Model(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
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
        encoded = self.deberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class DebertaV2ForQuestionAnswering(DebertaV2PreTrainedModel):
    """Span QA: start and end logits per token from `qa_outputs` (no dropout, as transformers)."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
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
        encoded = self.deberta(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


__all__ = ["DebertaV2ForMaskedLM", "DebertaV2ForMultipleChoice", "DebertaV2ForQuestionAnswering",
           "DebertaV2ForSequenceClassification", "DebertaV2ForTokenClassification", "DebertaV2Model",
           "DebertaV2PreTrainedModel", "log_buckets", "relative_index"]
