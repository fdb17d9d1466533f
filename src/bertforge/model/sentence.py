"""A sentence encoder under training: any family's encoder, pooled, with a contrastive loss
(`bertforge finetune embed`, `bertforge.tasks.embed`); saved as the encoder plus sentence-transformers'
module files. Also the setfit package's files of a classifier that reads the mean token vector
(`finetune classify --method setfit` or `--pooling mean`): `SetFitModel.from_pretrained` runs it as trained."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.fileio import write_text_atomic
from bertforge.model.sentence_files import SENTENCE_SETTINGS_FILE, carry_sentence_files
from bertforge.sentence_config import SETFIT_CONFIG_FILE, SETFIT_HEAD_FILE


@dataclass
class EmbedderOutput:
    loss: torch.Tensor | None
    embeddings: torch.Tensor  # (B, C, H): each row's texts' vectors, normalised when the model normalises


class SentenceEmbedder(torch.nn.Module):
    """An encoder of any family under pooling and a contrastive loss: what `finetune embed` trains.

    It takes multiple-choice shaped batches, (B, C, T) for the C texts of each row, and saves as the
    bare encoder plus sentence-transformers' module files."""

    def __init__(self, encoder: torch.nn.Module, *, pooling: str, normalize: bool, loss: str, scale: float,
                 score_max: float | None, max_length: int, source: str | Path | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling, self.normalize, self.loss_name, self.scale = pooling, normalize, loss, scale
        self.score_max, self.max_length = score_max, max_length
        self.source = None if source is None else Path(source)  # the model trained: its prompts are kept

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
        write_sentence_modules(directory, hidden_size=int(self.encoder.config.hidden_size),  # type: ignore[union-attr]
                               pooling=self.pooling, normalize=self.normalize, max_length=self.max_length,
                               lowercase=_lowercases(tokenizer))
        if self.source is not None:  # the prompts and similarity function the model came with
            carry_sentence_files(self.source, directory, files=(SENTENCE_SETTINGS_FILE,))


def write_sentence_modules(directory: Path, *, hidden_size: int, pooling: str, normalize: bool,
                           max_length: int | None, lowercase: bool) -> None:
    """sentence-transformers' module files beside an encoder saved in `directory`: modules.json
    (Transformer, Pooling, and Normalize when `normalize`), the pooling's config and
    sentence_bert_config.json (the pieces an input is cut to; left out when None: the model's limit)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(exist_ok=True)
    flags = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
             "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
             "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
             "pooling_mode_lasttoken": False, "include_prompt": True}
    (directory / "1_Pooling").mkdir(exist_ok=True)
    write_text_atomic(directory / "1_Pooling" / "config.json", json.dumps(flags, indent=2) + "\n")
    write_text_atomic(directory / "modules.json", json.dumps(modules, indent=2) + "\n")
    settings: dict[str, Any] = {"do_lower_case": lowercase}
    if max_length:
        settings = {"max_seq_length": int(max_length), **settings}
    write_text_atomic(directory / "sentence_bert_config.json", json.dumps(settings, indent=2) + "\n")


def _lowercases(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "do_lower_case", False)) if tokenizer is not None else False


# ------------------------------------------------------------------------------------------------
# A mean-pooled classifier in the setfit package's layout
# ------------------------------------------------------------------------------------------------
SETFIT_PROBLEMS = ("single_label_classification", "multi_label_classification")


def setfit_can_run(job: str, head: str, layers: str, pooling: str, problem_type: str | None) -> bool:
    """Whether the setfit package computes what a generic head computes: one linear layer (softmax or,
    multi-label, a sigmoid per label) on the mean of the final token vectors, which a
    sentence-transformers body gives (Transformer, mean Pooling, Normalize when the head normalises)."""
    return (job == "sequence-classification" and head == "linear" and layers == "last" and pooling == "mean"
            and (problem_type or "single_label_classification") in SETFIT_PROBLEMS)


def save_setfit_files(directory: str | Path, *, weight: torch.Tensor, bias: torch.Tensor, labels: list[str],
                      multi_label: bool, normalize: bool, hidden_size: int, max_length: int | None,
                      tokenizer: Any = None) -> None:
    """Make the classifier saved in `directory` (an encoder under a linear head on its mean token vector)
    a setfit model: sentence-transformers' module files for the body, and as the head the estimator
    setfit itself fits, a scikit-learn logistic regression (one per label, one-vs-rest, multi-label)
    holding the head's weights, so that `SetFitModel.from_pretrained` gives the probabilities
    bertforge gives.

    setfit reads its head from a pickle (`model_head.pkl`, joblib). bertforge writes it for setfit and
    never reads it: its own loaders read the head from model.safetensors (`task_head.output.*`)."""
    import joblib

    directory = Path(directory)
    write_sentence_modules(directory, hidden_size=hidden_size, pooling="mean", normalize=normalize,
                           max_length=max_length, lowercase=_lowercases(tokenizer))
    weights, biases = weight.detach().double().cpu().numpy(), bias.detach().double().cpu().numpy()
    head = _one_vs_rest(weights, biases) if multi_label else _logistic_regression(weights, biases)
    joblib.dump(head, directory / SETFIT_HEAD_FILE)
    # the labels in the head's class order (0, 1, ...): SetFitModel.predict answers their names
    write_text_atomic(directory / SETFIT_CONFIG_FILE,
                      json.dumps({"normalize_embeddings": False, "labels": list(labels)}, indent=2) + "\n")


def _logistic_regression(weights: Any, biases: Any) -> Any:
    """A fitted-looking LogisticRegression whose probabilities are softmax(weights x + biases): two
    classes as one row of differences (sigmoid(z1 - z0) is that softmax), more as the rows themselves."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    regression = LogisticRegression()
    if len(weights) == 2:
        weights, biases = weights[1:] - weights[:1], biases[1:] - biases[:1]
    regression.coef_, regression.intercept_ = np.ascontiguousarray(weights), np.ascontiguousarray(biases)
    regression.classes_ = np.arange(max(2, len(biases)))
    regression.n_features_in_ = weights.shape[1]
    regression.n_iter_ = np.zeros(1, dtype=np.int32)
    return regression


def _one_vs_rest(weights: Any, biases: Any) -> Any:
    """setfit's multi-label head (`multi_target_strategy="one-vs-rest"`): a logistic regression per label,
    whose sigmoid is the label's probability."""
    import numpy as np
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import LabelBinarizer

    classifier = OneVsRestClassifier(_logistic_regression(weights[:1], biases[:1]))
    classifier.estimators_ = [_logistic_regression(weights[c:c + 1], biases[c:c + 1]) for c in range(len(biases))]
    binarizer = LabelBinarizer(sparse_output=True).fit(np.eye(len(biases), dtype=int))  # a label-indicator target
    classifier.label_binarizer_, classifier.classes_ = binarizer, binarizer.classes_
    classifier.n_features_in_ = weights.shape[1]
    return classifier


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


__all__ = ["SETFIT_CONFIG_FILE", "SETFIT_HEAD_FILE", "EmbedderOutput", "SentenceEmbedder", "save_setfit_files",
           "setfit_can_run", "write_sentence_modules"]
