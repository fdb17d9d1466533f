"""A sentence encoder under training: any family's encoder, pooled, with a contrastive loss
(`bertforge finetune embed`, `bertforge.tasks.embed`); saved as the encoder plus sentence-transformers'
module files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.fileio import write_text_atomic


@dataclass
class EmbedderOutput:
    loss: torch.Tensor | None
    embeddings: torch.Tensor  # (B, C, H): each row's texts' vectors, normalised when the model normalises


class SentenceEmbedder(torch.nn.Module):
    """An encoder of any family under pooling and a contrastive loss: what `finetune embed` trains.

    It takes multiple-choice shaped batches, (B, C, T) for the C texts of each row, and saves as the
    bare encoder plus sentence-transformers' module files."""

    def __init__(self, encoder: torch.nn.Module, *, pooling: str, normalize: bool, loss: str, scale: float,
                 score_max: float | None, max_length: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling, self.normalize, self.loss_name, self.scale = pooling, normalize, loss, scale
        self.score_max, self.max_length = score_max, max_length

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N, H) pooled vectors of (N, T) inputs; [CLS] and [SEP] count in the mean, as in sentence-transformers."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state  # (N, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (N, T, 1)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
        else:
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> EmbedderOutput:
        # (B, C, T) in. Each distinct text of the batch is encoded once: SetFit's pairs draw both
        # sides from a few dozen rows, so a batch of 16 pairs holds about 20 distinct texts in its 32
        # places. The texts are encoded column by column, each column's new texts cut to their own
        # longest row: a short question is not padded to the length of the paragraph beside it.
        batch, width = input_ids.shape[:2]
        slot_text, column_rows = _distinct_texts(input_ids, attention_mask, token_type_ids)
        encoded = []
        for c, rows in enumerate(column_rows):
            if not rows:
                continue
            picked = torch.tensor(rows, device=input_ids.device)
            mask = attention_mask[picked, c]  # (R, T)
            length = int(mask.sum(-1).max())
            types = None if token_type_ids is None else token_type_ids[picked, c, :length]
            encoded.append(self.embed(input_ids[picked, c, :length], mask[:, :length], types))
        distinct = torch.cat(encoded)  # (D, H), in the order `_distinct_texts` numbers them
        order = torch.tensor(slot_text, device=distinct.device)  # (C * B,) column by column
        vectors = distinct.index_select(0, order).view(width, batch, -1).transpose(0, 1)  # (B, C, H)
        loss = self._loss(vectors, labels) if self.training or labels is not None else None
        return EmbedderOutput(loss, vectors)

    def _loss(self, vectors: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        unit = F.normalize(vectors.float(), dim=-1)
        if self.loss_name == "mnrl":
            anchors = unit[:, 0]  # (B, H)
            candidates = unit[:, 1:].transpose(0, 1).reshape(-1, unit.shape[-1])  # positives, then negatives
            logits = anchors @ candidates.T * self.scale  # (B, B * (C - 1)); row i's positive is column i
            return F.cross_entropy(logits, torch.arange(len(anchors), device=logits.device))
        if scores is None:
            raise ValueError(f"the {self.loss_name} loss needs a score per pair")
        cosine = (unit[:, 0] * unit[:, 1]).sum(-1)  # (B,)
        if self.loss_name == "cosine":
            return F.mse_loss(cosine, scores.float() / (self.score_max or 1.0))
        # CoSENT: log(1 + sum over pairs (i, j) with score_i > score_j of exp(scale (cos_j - cos_i)))
        differences = (cosine[None, :] - cosine[:, None]) * self.scale  # [i, j] = scale (cos_j - cos_i)
        ordered = scores[:, None] > scores[None, :]
        terms = torch.cat([differences.new_zeros(1), differences[ordered]])
        return torch.logsumexp(terms, dim=0)

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None, **options: Any) -> None:
        """The encoder in the Hugging Face layout, then the module files that make it a sentence-transformers model."""
        directory = Path(directory)
        self.encoder.save_pretrained(directory, tokenizer=tokenizer, **options)  # type: ignore[operator]
        hidden = int(self.encoder.config.hidden_size)  # type: ignore[union-attr]
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if self.normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
            (directory / "2_Normalize").mkdir(exist_ok=True)
        pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": self.pooling == "cls",
                   "pooling_mode_mean_tokens": self.pooling == "mean", "pooling_mode_max_tokens": self.pooling == "max",
                   "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                   "pooling_mode_lasttoken": False, "include_prompt": True}
        (directory / "1_Pooling").mkdir(exist_ok=True)
        write_text_atomic(directory / "1_Pooling" / "config.json", json.dumps(pooling, indent=2) + "\n")
        write_text_atomic(directory / "modules.json", json.dumps(modules, indent=2) + "\n")
        lowercase = bool(getattr(tokenizer, "do_lower_case", False)) if tokenizer is not None else False
        write_text_atomic(directory / "sentence_bert_config.json",
                          json.dumps({"max_seq_length": self.max_length, "do_lower_case": lowercase}, indent=2) + "\n")



def _distinct_texts(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None) -> tuple[list[int], list[list[int]]]:
    """Which places of a (B, C, T) batch hold the same text. Returns, column by column, each place's
    number among the batch's distinct texts (C * B numbers), and for each column the rows whose text
    is first met there, in that order (the distinct texts are numbered column by column, row by row).

    A text met again in its own row (SetFit's pair of a row with itself) is a text of its own: the
    two passes of one row under different dropout are that pair's positive (SimCSE's), which one
    shared pass would reduce to a cosine of exactly 1 and no gradient."""
    lengths = attention_mask.sum(-1).tolist()  # (B, C)
    ids = input_ids.tolist()
    types = token_type_ids.tolist() if token_type_ids is not None else None
    number: dict[Any, int] = {}
    row_texts: list[set[Any]] = [set() for _ in ids]
    slot_text: list[int] = []
    column_rows: list[list[int]] = []
    for c in range(input_ids.shape[1]):
        column_rows.append([])
        for b, row in enumerate(ids):
            real = lengths[b][c]
            key: Any = (tuple(row[c][:real]), tuple(types[b][c][:real]) if types is not None else None)
            if key in row_texts[b]:
                key = ("again", b, c)  # the row paired with itself: its own pass
            row_texts[b].add(key)
            if key not in number:
                number[key] = len(number)
                column_rows[c].append(b)
            slot_text.append(number[key])
    return slot_text, column_rows


__all__ = ["EmbedderOutput", "SentenceEmbedder"]
