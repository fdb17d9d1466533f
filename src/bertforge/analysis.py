"""What the attention heads do: heat maps of one text's attention, and per-head statistics over a corpus.

The statistics follow Clark et al. (2019), "What Does BERT Look At? An Analysis of BERT's Attention":
for each head, averaged over every real (non-padding) query token of every text,

    cls      attention paid to [CLS]
    sep      attention paid to the [SEP] tokens (both of them in a pair)
    punct    attention paid to punctuation tokens (every character a Unicode punctuation mark: . , ; " ( ...)
    next     attention paid to the next token      (queries that have a next real token)
    prev     attention paid to the previous token  (queries that have a previous token)
    entropy  entropy of the query's attention distribution, in nats (ln T for uniform attention over T
             tokens, 0 for attention to one token)

Clark et al. found heads that attend almost entirely to the next or the previous token, heads that
park their attention on [SEP] (a "no-op" when the head's pattern does not apply), broad heads with
high entropy in the lowest layers, and attention to periods and commas. Layers and heads are numbered
from 1 here (layer i = hidden state i in `bertforge.features`), written "L5-H3".
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertforge.plot import save_figure

if TYPE_CHECKING:
    import torch

    from bertforge.model.base import PreTrainedModel
    from bertforge.tokenizer import BertTokenizer

STATS = ("cls", "sep", "punct", "next", "prev", "entropy")
STAT_TITLES = {
    "cls": "attention to [CLS]", "sep": "attention to [SEP]", "punct": "attention to punctuation",
    "next": "attention to the next token", "prev": "attention to the previous token",
    "entropy": "attention entropy (nats)",
}


def is_punctuation(token: str) -> bool:
    """A WordPiece token made only of punctuation characters (Unicode category P*); specials are not."""
    text = token.removeprefix("##")
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


# ------------------------------------------------------------------------------------------------
# per-head statistics
# ------------------------------------------------------------------------------------------------
@dataclass
class HeadStats:
    """Running sums per (layer, head) and the query counts they are averaged over."""

    sums: dict[str, np.ndarray]  # stat -> (L, A)
    counts: dict[str, int]  # stat -> queries it is averaged over (the same for every head)
    texts: int = 0

    @classmethod
    def empty(cls, num_layers: int, num_heads: int) -> HeadStats:
        return cls({s: np.zeros((num_layers, num_heads)) for s in STATS}, dict.fromkeys(STATS, 0))

    @property
    def shape(self) -> tuple[int, int]:
        return self.sums["cls"].shape  # type: ignore[return-value]

    def update(self, attentions: Sequence[torch.Tensor], attention_mask: torch.Tensor, is_cls: torch.Tensor,
               is_sep: torch.Tensor, is_punct: torch.Tensor) -> None:
        """Add a batch: L tensors (B, A, T, T) of probabilities and (B, T) masks of real/[CLS]/[SEP]/punct tokens.

        Padding must be on the right (BERT's layout): then a real query's previous token is real.
        """
        import torch

        real = attention_mask.to(torch.bool)  # (B, T)
        pairs = real[:, :-1] & real[:, 1:]  # (B, T-1): query i and token i+1 both real
        self.counts["next"] += int(pairs.sum())
        self.counts["prev"] += int(pairs.sum())  # query i+1 and token i: the same pairs
        for stat in ("cls", "sep", "punct", "entropy"):
            self.counts[stat] += int(real.sum())
        self.texts += int(real.shape[0])
        keys = {"cls": is_cls, "sep": is_sep, "punct": is_punct}
        queries = real[:, None, :].to(torch.float64)  # (B, 1, T) weights of the query rows
        for layer, probs in enumerate(attentions):
            probs = probs.detach().to(torch.float64)  # (B, A, T, T): query rows, key columns
            for stat, key in keys.items():
                to_key = (probs * key[:, None, None, :].to(probs.dtype)).sum(-1)  # (B, A, T) per query
                self.sums[stat][layer] += (to_key * queries).sum((0, 2)).cpu().numpy()
            entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (B, A, T)
            self.sums["entropy"][layer] += (entropy * queries).sum((0, 2)).cpu().numpy()
            weights = pairs[:, None, :].to(probs.dtype)  # (B, 1, T-1)
            following = torch.diagonal(probs, offset=1, dim1=-2, dim2=-1)  # (B, A, T-1): query i -> i+1
            preceding = torch.diagonal(probs, offset=-1, dim1=-2, dim2=-1)  # (B, A, T-1): query i+1 -> i
            self.sums["next"][layer] += (following * weights).sum((0, 2)).cpu().numpy()
            self.sums["prev"][layer] += (preceding * weights).sum((0, 2)).cpu().numpy()

    def means(self) -> dict[str, np.ndarray]:
        """stat -> (L, A) averages (NaN where nothing was counted)."""
        return {s: self.sums[s] / self.counts[s] if self.counts[s] else np.full(self.shape, np.nan) for s in STATS}

    def top(self, stat: str, k: int = 3) -> list[tuple[int, int, float]]:
        """The k heads with the highest average of `stat`: (layer, head, value), 1-based."""
        values = self.means()[stat]
        flat = np.argsort(values, axis=None)[::-1][:k]
        return [(int(i // values.shape[1]) + 1, int(i % values.shape[1]) + 1, float(values.flat[i])) for i in flat]

    def table(self, digits: int = 3) -> str:
        """Markdown: one row per head, one column per statistic."""
        means = self.means()
        lines = ["| layer | head | " + " | ".join(STATS) + " |", "|---|---|" + "---|" * len(STATS)]
        layers, heads = self.shape
        for layer in range(layers):
            for head in range(heads):
                cells = " | ".join(f"{means[s][layer, head]:.{digits}f}" for s in STATS)
                lines.append(f"| {layer + 1} | {head + 1} | {cells} |")
        return "\n".join(lines) + "\n"

    def layer_table(self, digits: int = 3) -> str:
        """Markdown: per layer, the mean over heads and the highest head of each statistic."""
        means = self.means()
        lines = ["| layer | " + " | ".join(f"{s} mean (max)" for s in STATS) + " |", "|---|" + "---|" * len(STATS)]
        for layer in range(self.shape[0]):
            cells = " | ".join(f"{means[s][layer].mean():.{digits}f} ({means[s][layer].max():.{digits}f})"
                               for s in STATS)
            lines.append(f"| {layer + 1} | {cells} |")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"texts": self.texts, "counts": self.counts,
                "means": {s: np.round(v, 6).tolist() for s, v in self.means().items()}}


def token_masks(tokens: Sequence[Sequence[str]], tokenizer: BertTokenizer) -> dict[str, np.ndarray]:
    """(B, T) boolean masks of [CLS], [SEP] and punctuation tokens for padded token lists."""
    cls = np.array([[t == tokenizer.cls_token for t in row] for row in tokens], dtype=bool)
    sep = np.array([[t == tokenizer.sep_token for t in row] for row in tokens], dtype=bool)
    punct = np.array([[is_punctuation(t) for t in row] for row in tokens], dtype=bool)
    return {"cls": cls, "sep": sep, "punct": punct}


def attention_stats(model: PreTrainedModel, tokenizer: BertTokenizer, texts: Iterable[str | tuple[str, str]], *,
                    batch_size: int = 16, max_length: int = 128, progress: Any = None) -> HeadStats:
    """Clark et al.'s per-head statistics of `model` over `texts` (truncated to `max_length` tokens)."""
    import torch

    config = model.config
    stats = HeadStats.empty(config.num_hidden_layers, config.num_attention_heads)
    model.eval()
    device = next(model.parameters()).device
    batch: list[str | tuple[str, str]] = []

    def run() -> None:
        encoded = tokenizer.encode_batch(batch, max_length=max_length, truncation=True, padding=True,
                                         return_tensors="pt")
        masks = token_masks([e.tokens for e in encoded["encodings"]], tokenizer)
        mask = encoded["attention_mask"]
        with torch.inference_mode():
            out = model(encoded["input_ids"].to(device), mask.to(device), encoded["token_type_ids"].to(device),
                        output_attentions=True)
        stats.update([a.cpu() for a in out.attentions], mask,
                     *(torch.from_numpy(masks[k]) & mask.bool() for k in ("cls", "sep", "punct")))
        if progress is not None:
            progress.update(len(batch))
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            run()
    if batch:
        run()
    return stats


def plot_head_stats(stats: HeadStats, out: str | os.PathLike[str], title: str = "") -> Path:
    """A layers x heads heat map per statistic (2 x 3 panels), values written in the cells."""
    plt = _pyplot()
    means = stats.means()
    layers, heads = stats.shape
    fig, axes = plt.subplots(2, 3, figsize=(3 * (0.45 * heads + 1.2), 2 * (0.4 * layers + 1.0)), squeeze=False)
    for ax, stat in zip(axes.flat, STATS, strict=True):
        values = means[stat]
        vmax = float(np.nanmax(values)) if stat == "entropy" else 1.0
        image = ax.imshow(values, cmap="viridis" if stat == "entropy" else "Blues", vmin=0.0, vmax=vmax,
                          aspect="auto")
        for layer in range(layers):
            for head in range(heads):
                value = values[layer, head]
                dark = value > 0.6 * vmax
                label = f"{value:.2f}" if stat != "entropy" else f"{value:.1f}"
                ax.text(head, layer, label.removeprefix("0"), ha="center", va="center", fontsize=6,
                        color="white" if dark != (stat == "entropy") else "black")
        ax.set_title(STAT_TITLES[stat], fontsize=9)
        ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
        ax.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    fig.suptitle(title or f"per-head attention statistics over {stats.texts} texts")
    fig.tight_layout()
    return save_figure(fig, out)


# ------------------------------------------------------------------------------------------------
# heat maps of one text
# ------------------------------------------------------------------------------------------------
def attention_maps(model: PreTrainedModel, tokenizer: BertTokenizer, text: str, pair: str | None = None, *,
                   max_length: int = 128) -> tuple[list[str], np.ndarray]:
    """The tokens of one text (or pair) and every head's attention: (L, A, T, T), rows = queries."""
    import torch

    encoding = tokenizer.encode(text, pair, max_length=max_length, truncation=True)
    ids = torch.tensor([encoding.input_ids])
    types = torch.tensor([encoding.token_type_ids])
    model.eval()
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(ids.to(device), None, types.to(device), output_attentions=True)
    probs = torch.stack([a[0] for a in out.attentions]).float().cpu().numpy()  # L x (A, T, T) -> (L, A, T, T)
    return encoding.tokens, probs


def plot_attention(tokens: Sequence[str], attentions: np.ndarray, out: str | os.PathLike[str], *,
                   layer: int | None = None, head: int | None = None, title: str = "") -> Path:
    """Heat maps of (L, A, T, T) attention: one head (layer and head given, 1-based), one layer's heads
    (layer only), one head in every layer (head only), or the whole layers x heads grid (neither).

    Rows are the attending (query) tokens, columns the attended ones.
    """
    plt = _pyplot()
    num_layers, num_heads = attentions.shape[:2]
    if layer is not None and not 1 <= layer <= num_layers:
        raise ValueError(f"layer {layer} is out of range 1..{num_layers}")
    if head is not None and not 1 <= head <= num_heads:
        raise ValueError(f"head {head} is out of range 1..{num_heads}")
    chosen = [(lay, hd) for lay in range(1, num_layers + 1) for hd in range(1, num_heads + 1)
              if (layer is None or lay == layer) and (head is None or hd == head)]
    n = len(tokens)
    if len(chosen) == 1:
        lay, hd = chosen[0]
        size = max(4.0, 0.28 * n + 1.5)
        fig, ax = plt.subplots(figsize=(size + 1, size))
        image = ax.imshow(attentions[lay - 1, hd - 1], cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(n), tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(n), tokens, fontsize=8)
        ax.set_xlabel("attended token")
        ax.set_ylabel("attending token")
        ax.set_title(title or f"layer {lay}, head {hd}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    else:
        columns = num_heads if layer is None and head is None else min(len(chosen), 6)
        rows = -(-len(chosen) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(1.6 * columns, 1.6 * rows + 0.6), squeeze=False)
        for ax in axes.flat:
            ax.axis("off")
        for ax, (lay, hd) in zip(axes.flat, chosen, strict=False):
            ax.imshow(attentions[lay - 1, hd - 1], cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_title(f"L{lay}-H{hd}", fontsize=7)
        fig.suptitle(title or " ".join(tokens)[:120], fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


__all__ = [
    "STATS", "STAT_TITLES", "HeadStats", "attention_maps", "attention_stats", "is_punctuation", "plot_attention",
    "plot_head_stats", "token_masks",
]
