"""Sentence-embedding training on the user's files: an encoder whose pooled vectors put related texts
together, for search, deduplication, clustering and few-shot classification (sentence-transformers'
recipe, Reimers & Gurevych 2019).

A row holds two texts that belong together (anchor, positive), optionally a third that does not
(a hard negative), or two texts and a similarity score. The columns are found by name unless given:
anchor `anchor`, `sentence1`, `query`, `question` or `text`; positive `positive`, `sentence2`,
`document`, `passage` or `text_pair`; negative `negative`; score `score`, `similarity` or `label`.

Losses (`loss`, by default from the data): pairs and triplets train with in-batch negatives
(multiple-negatives ranking: each anchor's positive is to score above every other positive and
negative of the batch, cosine x `scale`, cross-entropy; Henderson et al. 2017); scored pairs with
CoSENT (every pair ordered by score is to be ordered so by cosine; Su 2022) or `cosine` (the squared
error between the cosine and the score over the training file's highest score). The vector is the
mean of the final token vectors (`pool` cls or max instead), normalised (`normalize`).

Scored pairs are evaluated by the Spearman correlation of cosine and score (STS's metric); pairs
and triplets by retrieval: each dev anchor ranks every dev positive (and negative), MRR@10 and
recall@1 / @10. The directory written is a plain encoder in the Hugging Face layout plus
sentence-transformers' module files (modules.json, 1_Pooling/config.json, 2_Normalize,
sentence_bert_config.json), so `SentenceTransformer(DIR)` loads it and gives the vectors
`pipeline(DIR)`, `predict` and `serve` give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.fileio import write_text_atomic
from bertforge.tasks.base import DataFormatError, Feature, Task

if TYPE_CHECKING:
    import torch

    from bertforge.tokenizer import BertTokenizer

ANCHOR_COLUMNS = ("anchor", "sentence1", "query", "question", "text")
POSITIVE_COLUMNS = ("positive", "sentence2", "document", "passage", "text_pair")
NEGATIVE_COLUMNS = ("negative",)
SCORE_COLUMNS = ("score", "similarity", "label")
LOSSES = ("auto", "mnrl", "cosent", "cosine")
POOLINGS = ("mean", "cls", "max")
RETRIEVAL_DEPTH = 10  # MRR@10 and recall@10, as MS MARCO and sentence-transformers' evaluators report
EMBED_SETTINGS: dict[str, Any] = {
    "train": None, "dev": None, "test": None,
    "anchor_column": None, "positive_column": None, "negative_column": None, "score_column": None,
    "loss": "auto", "pool": "mean", "normalize": True, "scale": 20.0, "score_max": None,
}


@dataclass
class EmbedExample:
    texts: list[str]  # anchor, positive[, negative]
    score: float | None  # the pair's similarity (scored pairs), else None
    row: int  # the row's number in its file
    source: str


@dataclass
class Embed(Task):
    """Sentence-embedding training on the user's files (see the module docstring)."""

    name: str = "embed"
    settings: dict[str, Any] = field(default_factory=dict)
    source_model: Path | None = field(default=None, repr=False, compare=False)  # set by `model_settings`

    family: ClassVar[str] = "embed"
    command_help: ClassVar[str] = """Train sentence embeddings on your own pairs, triplets or scored pairs (CSV / TSV / JSONL /
    Parquet): in-batch negatives for pairs and triplets, CoSENT for scored pairs; mean pooling, normalised.
    Scored on dev by Spearman (scored pairs) or retrieval MRR@10; the model loads in sentence-transformers.

    Example: `bertforge finetune embed --model models/minilm --train pairs.csv --dev pairs-dev.csv --out runs/embed`
    Scored pairs: `bertforge finetune embed --model models/minilm --train sts.csv --dev sts-dev.csv --score-column score --out runs/sts`
    """
    reads_data_dir: ClassVar[bool] = False
    single_task: ClassVar[bool] = True
    default_batch_size: ClassVar[int] = 32  # the in-batch negatives: more is harder, and better
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "train": (str, "Training file of pairs, triplets or scored pairs: .csv, .tsv, .jsonl or .parquet. Or a Hub "
                       "data set: org/name[@revision][:config][:split]."),
        "dev": (str, "Dev file, same columns: scored every epoch (Spearman, or retrieval MRR@10). Or a Hub data set."),
        "test": (str, "Optional test file, scored by the final model. Or a Hub data set."),
        "anchor_column": (str, "The first text (default: anchor, sentence1, query, question or text)."),
        "positive_column": (str, "The text that goes with it (default: positive, sentence2, document, passage "
                                 "or text_pair)."),
        "negative_column": (str, "A hard negative (default: negative, when there)."),
        "score_column": (str, "A similarity score, for scored pairs (default: score, similarity or label, when "
                              "there)."),
        "loss": (str, "auto, mnrl (in-batch negatives), cosent or cosine (scored pairs); default auto: cosent "
                      "with scores, else mnrl."),
        "pool": (str, "How a text's vector is made from its token vectors: mean, cls or max (default mean)."),
        "scale": (float, "The cosine's scale in mnrl and cosent (default 20)."),
    }
    job = "embeddings"  # the bare encoder; `wrap_model` puts the pooling and the loss around it
    inference_task = "embeddings"
    output_names = ("embeddings",)

    def __post_init__(self) -> None:
        unknown = set(self.settings) - set(EMBED_SETTINGS)
        if unknown:
            raise ValueError(f"unknown embed setting(s): {', '.join(sorted(unknown))}; known: {', '.join(EMBED_SETTINGS)}")
        self.settings = {**EMBED_SETTINGS, **{k: v for k, v in self.settings.items() if v is not None}}
        if self.settings["loss"] not in LOSSES:
            raise ValueError(f"loss {self.settings['loss']!r} is not one of {', '.join(LOSSES)}")
        if self.settings["pool"] not in POOLINGS:
            raise ValueError(f"pool {self.settings['pool']!r} is not one of {', '.join(POOLINGS)}")

    # ---- reader
    def read(self, data_dir: str | Path | None, split: str) -> list[EmbedExample]:
        """The rows of the `split` file; the training file settles the columns and the loss."""
        from bertforge.tables import column_names, iter_rows

        if not self.settings.get(split):
            raise ValueError(f"embed needs a {split} file (--{split} FILE)")
        path = self.file_of(None, split)
        if split == self.train_split or not self.settings["anchor_column"]:
            self._settle_columns(path, column_names(path))
        columns = [self.settings[k] for k in ("anchor_column", "positive_column", "negative_column", "score_column")]
        graded = self._ranking_scores_column(path) if self.settings["loss"] == "mnrl" else None
        examples, grades = [], []
        for row in iter_rows(path, [c for c in [*columns, graded] if c]):
            texts = [_text(row.values[c], path, row.number, c) for c in columns[:3] if c]
            score = None if not columns[3] else _score(row.values[columns[3]], path, row.number, columns[3])
            examples.append(EmbedExample(texts, score, row.number, str(path)))
            if graded:
                grades.append(_score(row.values[graded], path, row.number, graded))
        if graded:
            examples = _positive_pairs(examples, grades, path, graded)
        if split == self.train_split and self.settings["loss"] == "cosine" and examples:
            self.settings["score_max"] = max(abs(e.score or 0.0) for e in examples) or 1.0
        return examples

    def _settle_columns(self, path: Path, present: Sequence[str]) -> None:
        def pick(key: str, candidates: Sequence[str], taken: Sequence[str] = ()) -> str | None:
            named = self.settings[key]
            if named:
                if named not in present:
                    raise DataFormatError(path, 1, named, f"no such column; the columns are: {', '.join(present)}")
                return str(named)
            return next((c for c in candidates if c in present and c not in taken), None)

        anchor = pick("anchor_column", ANCHOR_COLUMNS)
        positive = pick("positive_column", POSITIVE_COLUMNS, [anchor] if anchor else [])
        if anchor is None or positive is None:
            raise DataFormatError(path, 1, None, "no two text columns (anchor and positive, sentence1 and sentence2, "
                                                 f"...); the columns are: {', '.join(present)}; name them with "
                                                 "--anchor-column and --positive-column")
        taken = [anchor, positive]
        negative, score = pick("negative_column", NEGATIVE_COLUMNS, taken), pick("score_column", SCORE_COLUMNS, taken)
        loss = self.settings["loss"]
        if loss == "auto":
            loss = "cosent" if score else "mnrl"
        if loss in ("cosent", "cosine") and not score:
            raise DataFormatError(path, 1, None, f"the {loss} loss needs a score column (--score-column)")
        if loss == "mnrl":
            score = None  # ranking pairs: a label column is not a similarity
        self.settings.update(anchor_column=anchor, positive_column=positive, negative_column=negative,
                             score_column=score, loss=loss)

    def _ranking_scores_column(self, path: Path) -> str | None:
        """With mnrl, the file's score column (score, similarity or label), if it has one: mnrl trains every
        row as a positive pair, so rows scored as negatives must not reach it (`_positive_pairs`)."""
        from bertforge.tables import column_names

        taken = [self.settings[k] for k in ("anchor_column", "positive_column", "negative_column")]
        return next((c for c in SCORE_COLUMNS if c in column_names(path) and c not in taken), None)

    def dev_split_keys(self, examples: Sequence[EmbedExample]) -> tuple[list[Any] | None, list[Any] | None]:
        return None, [e.texts[0] for e in examples]  # an anchor's rows stay on one side

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples)

    # ---- model
    def model_settings(self, model_dir: Path) -> dict[str, Any]:
        """A sentence-transformers model's `max_length` (sentence_bert_config.json's max_seq_length: 256 for
        all-MiniLM-L6-v2), kept unless the run sets one; the model is remembered, so the directory written
        keeps its prompts (config_sentence_transformers.json)."""
        from bertforge.sentence_config import brought_max_length

        self.source_model = Path(model_dir)
        length = brought_max_length(model_dir)
        return {"max_length": length} if length else {}

    def wrap_model(self, model: torch.nn.Module, max_length: int) -> torch.nn.Module:
        from bertforge.model.sentence import SentenceEmbedder

        s = self.settings
        return SentenceEmbedder(model, pooling=s["pool"], normalize=bool(s["normalize"]), loss=s["loss"],
                                scale=float(s["scale"]), score_max=s["score_max"], max_length=max_length,
                                source=self.source_model)

    # ---- features
    def featurize(self, examples: Sequence[EmbedExample], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        flat = [text for e in examples for text in e.texts]
        encoded = tokenizer.encode_batch(flat, max_length=max_length, truncation=True) if flat else {}
        features, start = [], 0
        for i, example in enumerate(examples):
            rows = slice(start, start + len(example.texts))
            start += len(example.texts)
            inputs: dict[str, Any] = {"input_ids": encoded["input_ids"][rows], "token_type_ids": encoded["token_type_ids"][rows]}
            if example.score is not None:
                inputs["labels"] = float(example.score)
            features.append(Feature(inputs, i))
        return features

    # ---- predictions and metrics
    def postprocess(self, examples: Sequence[EmbedExample], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *, label_names: Sequence[str] | None = None) -> list[Any]:
        """Scored pairs: each pair's cosine. Pairs and triplets: the rank (from 1) of each anchor's own
        positive among all the split's positives and negatives."""
        vectors = np.stack([o["embeddings"] for o in outputs]).astype(np.float64)  # (N, C, H)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        if self.settings["score_column"]:
            return [float(c) for c in (vectors[:, 0] * vectors[:, 1]).sum(-1)]
        candidates = vectors[:, 1:].transpose(1, 0, 2).reshape(-1, vectors.shape[-1])  # positives, then negatives
        similarities = vectors[:, 0] @ candidates.T  # (N, N * (C - 1))
        own = similarities[np.arange(len(vectors)), np.arange(len(vectors))]
        return [int(r) for r in (similarities > own[:, None]).sum(1) + 1]

    def metric(self, examples: Sequence[EmbedExample], predictions: Sequence[Any]) -> dict[str, float]:
        if self.settings["score_column"]:
            from scipy.stats import pearsonr, spearmanr

            gold = [e.score for e in examples]
            return {"spearman": float(spearmanr(predictions, gold).statistic),
                    "pearson": float(pearsonr(predictions, gold).statistic)}
        ranks = np.asarray(predictions, dtype=np.float64)
        return {f"mrr@{RETRIEVAL_DEPTH}": float(np.where(ranks <= RETRIEVAL_DEPTH, 1.0 / ranks, 0.0).mean()),
                "recall@1": float((ranks <= 1).mean()), f"recall@{RETRIEVAL_DEPTH}": float((ranks <= RETRIEVAL_DEPTH).mean())}

    @property
    def main_metric(self) -> str:
        return "spearman" if self.settings["score_column"] else f"mrr@{RETRIEVAL_DEPTH}"

    def eval_splits(self) -> tuple[str, ...]:
        return ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        return ("test",)

    def final_splits(self) -> tuple[str, ...]:
        return ("test",) if self.settings.get("test") else ()

    def write_predictions(self, examples: Sequence[EmbedExample], predictions: Sequence[Any], out_dir: Path,
                          split: str) -> list[Path]:
        """`predictions-<split>.jsonl`: each row's number, its texts and its cosine (scored pairs) or rank."""
        key = "cosine" if self.settings["score_column"] else "rank"
        path = Path(out_dir) / f"predictions-{split}.jsonl"
        lines = [json.dumps({"row": e.row, "texts": e.texts, key: p, **({"score": e.score} if e.score is not None else {})},
                            ensure_ascii=False) for e, p in zip(examples, predictions, strict=True)]
        write_text_atomic(path, "".join(line + "\n" for line in lines))
        return [path]


def _positive_pairs(examples: list[EmbedExample], grades: Sequence[float], path: Path,
                    column: str) -> list[EmbedExample]:
    """The rows mnrl may train on from a file whose `column` scores its pairs. Two values (0/1 labels):
    the rows with the higher one are the positives, and the others are left out with a warning that
    counts them. One positive value: every row. Graded scores (more than two values), or one value of
    0 or less: refused, since which pairs are positives is not the file's to say (cosent trains on
    the scores themselves)."""
    import warnings

    values = sorted(set(grades))
    if len(values) == 1 and values[0] > 0:
        return examples
    if len(values) != 2:
        what = f"only {values[0]:g}" if len(values) == 1 else \
            f"graded scores ({len(values)} values from {values[0]:g} to {values[-1]:g})"
        raise DataFormatError(path, 1, column, f"--loss mnrl trains every row as a positive pair, but the column "
                                               f"holds {what}: use --loss cosent (or cosine) to train on the "
                                               "scores, or keep only the positive pairs in the file")
    kept = [e for e, grade in zip(examples, grades, strict=True) if grade == values[1]]
    warnings.warn(f"{path}: --loss mnrl trains on positive pairs only: kept the {len(kept)} rows with {column} "
                  f"{values[1]:g}, left out {len(examples) - len(kept)} with {column} {values[0]:g}",
                  UserWarning, stacklevel=3)
    return kept


def _text(value: Any, path: Path, row: int, column: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(path, row, column, "empty" if value is None or isinstance(value, str)
                              else f"not text ({type(value).__name__})")
    return value


def _score(value: Any, path: Path, row: int, column: str) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DataFormatError(path, row, column, f"{value!r:.40} is not a number") from None
    if not np.isfinite(score):
        raise DataFormatError(path, row, column, f"{score} is not a finite number")
    return score


__all__ = ["EMBED_SETTINGS", "Embed", "EmbedExample"]
