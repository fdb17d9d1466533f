"""Building blocks families share: the activation by config name, the packed layout of a padded
batch (the "unpadding" fast path), the additive padding bias, BERT's post-LN Transformer layer
(fused q/k/v self-attention, feed-forward), which BERT's descendants stack too, and the loop that runs
a stack of such layers on the fast path (`run_layers`), bidirectional or causal (left to right).

Shapes in comments: B = batch, T = sequence length, N = real (unpadded) tokens, H = hidden size,
A = attention heads, d = H / A (head size), I = intermediate (feed-forward) size.

The layer reads these config fields (under these names, as properties where a family's config.json
spells them otherwise): hidden_size, num_attention_heads, head_dim, intermediate_size, hidden_act,
hidden_dropout_prob, attention_probs_dropout_prob, layer_norm_eps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def activation(name: str) -> nn.Module:
    """The feed-forward non-linearity. BERT's "gelu" is the exact (erf) form; "gelu_new" the tanh one."""
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    raise ValueError(f"unsupported activation {name!r}")


# Below this fraction of padding a CPU batch attends re-padded in one call rather than per sequence.
PER_SEQUENCE_MIN_PADDING = 0.1


@dataclass
class PackedLayout:
    """Where the real tokens of a padded (B, T) batch are, to run the dense layers on them alone.

    Packing drops padding before the encoder (N = number of real tokens): every Linear, LayerNorm
    and GELU then costs N rather than B x T rows. Only attention needs the (B, T) shape back, for
    the duration of one SDPA call. This is the "unpadding" of MosaicBERT and ModernBERT.
    """

    token_index: torch.Tensor  # (N,) positions of real tokens in the flattened (B*T,) batch
    batch: int
    length: int
    # [start, end) of each row's tokens in the packed (N,) order, for attention one sequence at a
    # time; None to attend over the re-padded (B, T) batch with a mask instead.
    sequence_bounds: list[tuple[int, int]] | None = None

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, per_sequence: bool | None = None) -> PackedLayout:  # (B, T)
        """The layout of a padded batch. Packing goes row by row, so each row's real tokens are one
        contiguous run of the packed order, whatever the pattern of its mask.

        On the CPU, attention then runs per sequence on exactly its real tokens (sum of l_i^2 rather
        than B x T^2 scores, and no re-padding): 2.4x less attention time on the SST-2 and MRPC dev
        batches in file order. A batch with little padding (sorted by length, as `predict` batches)
        saves little that way and pays one call per sequence: 9% slower than one re-padded call on
        bucketed SST-2 dev batches (4% padding), so below PER_SEQUENCE_MIN_PADDING it re-pads. On a
        GPU one kernel launch per sequence would cost more than it saves, so the fused kernels take
        the re-padded batch with its mask there. `per_sequence` overrides that choice (`BertModel`
        passes False while training: backward is faster through one padded call).
        """
        batch, length = attention_mask.shape
        token_index = attention_mask.flatten().nonzero().squeeze(1)
        bounds = None
        if per_sequence is None:
            padding = 1.0 - token_index.numel() / max(batch * length, 1)
            per_sequence = attention_mask.device.type == "cpu" and padding >= PER_SEQUENCE_MIN_PADDING
        if per_sequence:
            ends = attention_mask.sum(dim=1).cumsum(0).tolist()
            bounds = [(start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True) if end > start]
        return cls(token_index, batch, length, bounds)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:  # (B, T, ...) -> (N, ...)
        return padded.flatten(0, 1).index_select(0, self.token_index)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:  # (N, ...) -> (B, T, ...), zeros at padding
        padded = packed.new_zeros(self.batch * self.length, *packed.shape[1:])
        return padded.index_copy(0, self.token_index, packed).unflatten(0, (self.batch, self.length))


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype, *,
                 always: bool = False) -> torch.Tensor | None:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive bias for the keys; None when nothing is padded.

    A large negative number rather than -inf keeps a row whose keys are all padding finite
    (softmax gives it a uniform distribution instead of NaN). Returning None for an unpadded batch
    lets SDPA pick its mask-free kernels. Under `torch.compile` (and with `always`, for export) the
    bias is always built: the data-dependent check would break the graph.
    """
    if attention_mask is None:
        return None
    if not always and not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return None
    keep = attention_mask[:, None, None, :].to(dtype)  # (B, 1, 1, T)
    return (1.0 - keep) * torch.finfo(dtype).min


def causal_bias(attention_mask: torch.Tensor | None, length: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """The additive bias of causal attention: query i sees key j only when j <= i and j is a real
    token. (B, 1, T, T) with a (B, T) mask, (1, 1, T, T) without one.

    One boolean "keep" is turned into one bias, rather than adding a causal bias to the padding
    bias: two large negatives would sum to -inf. Key 0 is never in a query's future, so no row is
    all -inf (as in `padding_bias`, softmax stays finite).
    """
    keep = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, T, T)
    if attention_mask is not None:
        keep = keep & attention_mask[:, None, None, :].bool()  # (B, 1, T, T)
    return (~keep).to(dtype) * torch.finfo(dtype).min


# False: dropout on the CPU draws its masks the faster way below. True: exactly as torch's F.dropout and
# SDPA draw them, so that a training-mode forward pass can be compared with transformers' draw for draw.
DROPOUT_DRAWS_AS_TORCH = False


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, faster on the CPU in fp32: the keep mask is drawn as uniform floats compared with p,
    which costs about two thirds of torch's CPU Bernoulli sampler on activation-sized tensors. The same
    distribution: each element kept with probability 1 - p and scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if DROPOUT_DRAWS_AS_TORCH or x.device.type != "cpu" or x.dtype != torch.float32 or not 0.0 < p < 1.0 or \
            torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    keep = torch.empty_like(x).uniform_().ge_(p).mul_(1.0 / (1.0 - p))  # 0 or 1 / (1 - p) per element
    return x * keep


class Dropout(nn.Dropout):
    """`nn.Dropout` (so code that finds dropout modules by type still finds it) through `dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
           dropout_p: float, is_causal: bool) -> torch.Tensor:  # each (B, A, T, d) -> (B, A, T, d)
    """softmax(QK^T / sqrt(d) + bias) V with the probabilities dropped at `dropout_p`: SDPA, except while
    training in fp32 on the CPU. There SDPA has no fused kernel with dropout and falls back to a math
    path (a "safe" softmax, Bernoulli sampling) that took about 1.8x the time of the explicit product
    below in a forward and backward pass of BERT-sized heads."""
    if dropout_p == 0.0 or DROPOUT_DRAWS_AS_TORCH or query.device.type != "cpu" or query.dtype != torch.float32 or \
            torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout_p,
                                              is_causal=is_causal)
    scores = (query * (1.0 / math.sqrt(query.shape[-1]))) @ key.transpose(-2, -1)  # (B, A, T, T)
    if bias is not None:
        scores = scores + bias
    if is_causal:
        scores = scores + causal_bias(None, scores.shape[-1], scores.dtype, scores.device)
    return dropout(scores.softmax(dim=-1), dropout_p, True) @ value


def right_padded(attention_mask: torch.Tensor) -> bool:  # (B, T)
    """Whether every row's real tokens come first (1...1 0...0), as the collators and tokenizers pad:
    then a causal query never meets padding among the keys it may see."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection.

    The default path calls `scaled_dot_product_attention` (fused kernels, no (T, T) matrix kept for
    backward where a kernel allows it). When the caller asks for the attention probabilities, the
    explicit softmax(QK^T / sqrt(d)) path runs instead, since SDPA does not return them.

    `is_causal` has SDPA's meaning: mask the keys after each query here, because `attention_bias` does
    not (`run_layers` passes either a bias that holds the causal mask already, or no bias and
    is_causal, which lets SDPA use its causal kernels without a (T, T) mask in memory).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # rows: [query; key; value]
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_probs_dropout_prob
        self.export_projections: nn.ModuleList | None = None  # see split_for_export

    def split_for_export(self) -> None:
        """Separate q, k and v projections and the textbook attention, for the duration of a graph
        export: ONNX Runtime's transformer optimizer fuses attention written that way (three MatMul +
        Add, QK^T / sqrt(d) + mask, Softmax, x V) into one Attention op, and one fused q/k/v matrix is not
        a pattern it knows. `join_after_export` drops the copies."""
        width = self.qkv.out_features // 3
        weights = self.qkv.weight.detach().split(width)  # the query, key and value rows
        biases = self.qkv.bias.detach().split(width) if self.qkv.bias is not None else (None, None, None)
        self.export_projections = nn.ModuleList()
        for weight, bias in zip(weights, biases, strict=True):
            linear = nn.Linear(self.qkv.in_features, width, bias=bias is not None, device=weight.device,
                               dtype=weight.dtype)
            linear.weight = nn.Parameter(weight.clone())
            if bias is not None:
                linear.bias = nn.Parameter(bias.clone())
            self.export_projections.append(linear)

    def join_after_export(self) -> None:
        self.export_projections = None

    def _textbook_attention(self, hidden: torch.Tensor, attention_bias: torch.Tensor | None) -> torch.Tensor:
        batch, length, _ = hidden.shape  # (B, T, H)

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, A, T, d)
            return x.view(batch, length, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

        query, key, value = (heads(projection(hidden)) for projection in self.export_projections)  # type: ignore[union-attr]
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, A, T, T)
        if attention_bias is not None:
            scores = scores + attention_bias
        context = torch.matmul(scores.softmax(dim=-1), value)  # (B, A, T, d)
        return self.out(context.permute(0, 2, 1, 3).reshape(batch, length, self.num_heads * self.head_dim))

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,  # (B, 1, 1, T) additive: 0 keep, -inf-ish drop; None = no padding
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
        is_causal: bool = False,  # mask future keys here (the bias does not): see the class docstring
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.export_projections is not None and layout is None and not output_attentions and not is_causal:
            return self._textbook_attention(hidden, attention_bias), None
        qkv = self.qkv(hidden)  # (B, T, 3H) or (N, 3H)
        dropout_p = self.attention_dropout if self.training else 0.0
        if layout is not None and layout.sequence_bounds is not None:
            return self.out(self._attend_per_sequence(qkv, layout.sequence_bounds, dropout_p, is_causal)), None
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
            if is_causal:
                scores = scores + causal_bias(None, length, scores.dtype, scores.device)  # (1, 1, T, T)
            probs = scores.softmax(dim=-1)
            context = dropout(probs, dropout_p, self.training) @ value  # (B, A, T, d)
        else:
            probs = None
            # SDPA takes a mask or is_causal, not both: with a bias, the bias carries causality
            context = attend(query, key, value, attention_bias, dropout_p, is_causal and attention_bias is None)

        context = context.transpose(1, 2).reshape(batch, length, hidden_size)  # (B, A, T, d) -> (B, T, H)
        if layout is not None:
            context = layout.pack(context)  # (B, T, H) -> (N, H)
        return self.out(context), probs

    def _attend_per_sequence(
        self,
        qkv: torch.Tensor,  # (N, 3H) packed
        bounds: list[tuple[int, int]],  # [start, end) of each sequence in the packed order
        dropout_p: float,
        is_causal: bool = False,
    ) -> torch.Tensor:  # (N, H)
        """Attention within each sequence's real tokens: no mask and no padding to compute or undo.
        A sequence's slice holds its real tokens in order, so causal attention is SDPA's is_causal on
        the slice, whatever the padding pattern of its row was."""
        tokens = qkv.shape[0]
        # (N, 3H) -> (N, 3, A, d) -> (3, A, N, d): a sequence is then a slice along N
        qkv = qkv.view(tokens, 3, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        contexts = [
            attend(*qkv[:, None, :, start:end].unbind(0), None, dropout_p, is_causal)
            for start, end in bounds  # each (1, A, l, d)
        ]
        context = torch.cat(contexts, dim=2)[0]  # (A, N, d)
        return context.transpose(0, 1).reshape(tokens, self.num_heads * self.head_dim)  # (N, H)


class FeedForward(nn.Module):
    """Position-wise H -> I -> H with the config's activation (GELU for BERT)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        return self.down(self.act(self.up(hidden)))


class EncoderLayer(nn.Module):
    """One Transformer block as in BERT: post-LN, x = LN(x + Dropout(Sublayer(x))) twice.

    `dropout_after_attention=False` leaves the attention output undropped (DistilBERT drops only
    the attention probabilities and the feed-forward output), `dropout_after_ffn=False` the
    feed-forward output (ALBERT drops only the attention probabilities and the attention output);
    the same at inference either way.
    """

    def __init__(self, config: Any, *, dropout_after_attention: bool = True,
                 dropout_after_ffn: bool = True) -> None:
        super().__init__()
        self.dropout_after_attention = dropout_after_attention
        self.dropout_after_ffn = dropout_after_ffn
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden: torch.Tensor,  # (B, T, H), or (N, H) packed when `layout` is given
        attention_bias: torch.Tensor | None,
        output_attentions: bool = False,
        layout: PackedLayout | None = None,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(hidden, attention_bias, output_attentions, layout, is_causal)
        if self.dropout_after_attention:
            attended = self.dropout(attended)
        hidden = self.attention_norm(hidden + attended)
        transformed = self.ffn(hidden)
        if self.dropout_after_ffn:
            transformed = self.dropout(transformed)
        hidden = self.ffn_norm(hidden + transformed)
        return hidden, probs


class FastPathSwitches(Protocol):
    """What `run_layers` reads of the encoder that calls it (its attributes, so that tests and export
    can flip them on the model)."""

    training: bool
    unpad: bool  # drop padding before the first layer (PackedLayout); off for reference comparisons
    attention_per_sequence: bool | None  # True / False; None: per sequence for CPU inference only
    gradient_checkpointing: bool  # recompute each layer in backward instead of storing its activations
    always_build_mask: bool  # build the bias whatever the batch holds (graph export)


def run_layers(
    switches: FastPathSwitches,
    layers: Iterable[nn.Module],  # each (hidden, bias, output_attentions, layout, is_causal) -> (hidden, probs)
    hidden: torch.Tensor,  # (B, T, H): the embeddings
    attention_mask: torch.Tensor | None,  # (B, T): 1 real token, 0 padding
    *,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    causal: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor | None, ...] | None]:
    """Run post-LN layers (`EncoderLayer`) over embedded tokens on the fast path: padding is packed
    away before the first layer and restored after the last; returns the final (B, T, H) vectors and,
    on request, every hidden state (embeddings first) and every layer's attention probabilities.
    `causal`: each token attends to itself and the real tokens before it (a left-to-right model)."""
    attention_bias = padding_bias(attention_mask, hidden.dtype, always=switches.always_build_mask)
    # Pack only when there is padding to drop; attention probabilities need the padded path.
    # A compiled model stays padded: packing's shapes depend on the data (one graph break per
    # batch shape), while the padded graph compiles once and fuses the element-wise work.
    layout = None
    if switches.unpad and attention_bias is not None and not output_attentions and not torch.compiler.is_compiling():
        per_sequence = switches.attention_per_sequence
        if per_sequence is None and torch.is_grad_enabled():
            # Training: backward through one padded SDPA call beats backward through one call per
            # sequence (a BERT-tiny pre-training step measured 20% slower per sequence).
            per_sequence = False
        layout = PackedLayout.from_mask(attention_mask, per_sequence)  # type: ignore[arg-type]
        hidden = layout.pack(hidden)  # (B, T, H) -> (N, H)

    # Causal attention, on whichever path the batch takes; SDPA's is_causal (no (T, T) mask built, and
    # its causal kernels) wherever it is exact, a causal + padding bias elsewhere:
    # - packed, one sequence at a time: a sequence's slice holds only its real tokens, in order, so
    #   is_causal on the slice is exact whatever the padding pattern was.
    # - packed, re-padded for one call: with right padding, the keys a real query may see (j <= i) are
    #   all real, so is_causal alone is exact for real tokens, and padded queries' outputs are dropped
    #   when re-packing. Left or gapped padding needs the bias.
    # - nothing padded: is_causal. Attention probabilities (explicit softmax) and the padded path with
    #   padding (unpad off, compiled, exported): the (B, 1, T, T) bias, exact at every position.
    is_causal = False
    if causal:
        per_sequence_path = layout is not None and layout.sequence_bounds is not None
        if per_sequence_path or (layout is not None and right_padded(attention_mask)):  # type: ignore[arg-type]
            attention_bias, is_causal = None, True
        elif attention_bias is None and not output_attentions:
            is_causal = True
        else:
            attention_bias = causal_bias(attention_mask, hidden.shape[1] if layout is None else layout.length,
                                         hidden.dtype, hidden.device)

    def padded(x: torch.Tensor) -> torch.Tensor:
        return layout.unpack(x) if layout is not None else x

    all_hidden = [padded(hidden)] if output_hidden_states else None
    all_attentions = [] if output_attentions else None
    for layer in layers:
        if switches.gradient_checkpointing and switches.training and torch.is_grad_enabled():
            hidden, probs = checkpoint(layer, hidden, attention_bias, output_attentions, layout, is_causal,
                                       use_reentrant=False)
        else:
            hidden, probs = layer(hidden, attention_bias, output_attentions, layout, is_causal)
        if all_hidden is not None:
            all_hidden.append(padded(hidden))
        if all_attentions is not None:
            all_attentions.append(probs)
    hidden = all_hidden[-1] if all_hidden is not None else padded(hidden)  # (B, T, H)
    return (hidden, tuple(all_hidden) if all_hidden is not None else None,
            tuple(all_attentions) if all_attentions is not None else None)
