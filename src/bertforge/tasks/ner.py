"""CoNLL-2003 named-entity recognition: the reader.

The English files have one token per line with four space-separated columns, `word POS chunk NER`,
and a blank line between sentences. Documents start with a `-DOCSTART- -X- -X- O` line; some copies
of the data drop it (ours drop the first one of each file), so it is optional: it only ends the
current sentence and starts a new document.

The NER column is IOB1: `I-X` opens an entity unless it directly follows another X entity, where
`B-X` marks the boundary between the two. The reader converts it to IOB2 (every entity starts with
`B-`), the scheme a token classifier is trained on. `metrics.conll_f1` scores either scheme the way
conlleval does.

For fine-tuning, `Ner()` declares the rest (`tasks.base.Task`). Each word is split into WordPiece
pieces; its label goes on its first piece and the other pieces get -100 (not scored), as in the BERT
paper. A word that the tokenizer drops entirely (a lone zero-width or control character) becomes
[UNK], so every word gets a prediction. A sentence longer than the window is cut into windows that
start and end on word boundaries and overlap by about half a window (`stride` pieces between window
starts); each word is predicted in the window where it has the most context on both sides
(`base.max_context_score`), and predictions are mapped back to the words of the sentence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from bertforge.hubdata import dataset_name
from bertforge.tasks.base import (
    IGNORE_INDEX,
    DataFormatError,
    Feature,
    Task,
    max_context_score,
    read_text_lines,
)
from bertforge.tasks.metrics import conll_f1

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer

# the label order of the Hugging Face `conll2003` dataset, used for class ids
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

_IOB_TAG = re.compile(r"O|[BI]-\S+")
_ANY_TAG = re.compile(r"O|[BIES]-\S+")


@dataclass
class NerSentence:
    guid: str             # "<file name>-<sentence number>"
    words: list[str]
    labels: list[str]     # NER tags (IOB2 unless read with scheme="keep")
    pos_tags: list[str]
    chunk_tags: list[str]
    doc_index: int        # the document the sentence is in, from 0 (-DOCSTART- lines separate them)
    first_line: int = 0   # the file line of the first word (the sentence's words are on consecutive lines)


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Start every entity with B-: an I-X that does not continue an X entity becomes B-X.

    >>> iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"])
    ['B-PER', 'I-PER', 'B-PER', 'O', 'B-LOC', 'B-ORG']
    """
    out: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            out.append("B-" + tag[2:])
        else:
            out.append(tag)
        previous = tag
    return out


def read_conll(path: str | Path, *, n_columns: int | None = 4,
               scheme: Literal["iob2", "keep"] = "iob2", token_column: int = 0,
               tag_column: int | None = -1) -> list[NerSentence]:
    """Read a CoNLL-2003 file into sentences.

    Each non-blank line must have `n_columns` whitespace-separated fields (None: any number, at least
    enough for the two columns read): the word in `token_column`, the NER tag in `tag_column` (0-based,
    negative from the end; by default first and last; with 4 columns, POS and chunk tags in between;
    other layouts leave `pos_tags` and `chunk_tags` empty). `tag_column=None` reads words only (the
    labels are then empty). `scheme="iob2"` accepts IOB1 or IOB2 tags (O, B-X, I-X) and returns IOB2;
    `scheme="keep"` returns the tags as written and also allows E-/S-.
    """
    path = Path(path)
    if n_columns is not None and n_columns < (2 if tag_column is not None else 1):
        raise ValueError(f"n_columns must be at least 2 (word and tag), not {n_columns}")
    needed = 1 + max(c if c >= 0 else -c - 1 for c in (token_column, tag_column if tag_column is not None else 0))
    valid = _IOB_TAG if scheme == "iob2" else _ANY_TAG
    sentences: list[NerSentence] = []
    rows: list[list[str]] = []
    doc_index = 0

    def flush() -> None:
        if not rows:
            return
        labels = [row[tag_column] for row in rows] if tag_column is not None else []
        sentences.append(NerSentence(
            guid=f"{path.name}-{len(sentences)}",
            words=[row[token_column] for row in rows],
            labels=iob1_to_iob2(labels) if scheme == "iob2" else labels,
            pos_tags=[row[1] for row in rows] if n_columns == 4 else [],
            chunk_tags=[row[2] for row in rows] if n_columns == 4 else [],
            doc_index=doc_index,
            first_line=first_line,
        ))
        rows.clear()

    first_line = 0
    for number, text in read_text_lines(path):
        fields = text.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            if sentences and sentences[-1].doc_index == doc_index:  # the current document is not empty
                doc_index += 1
            continue
        if n_columns is not None and len(fields) != n_columns:
            layout = " (word POS chunk NER)" if n_columns == 4 else ""
            raise DataFormatError(path, number, "columns", f"{len(fields)} fields, expected {n_columns}"
                                                           f"{layout}: {text!r}")
        if len(fields) < needed:
            raise DataFormatError(path, number, "columns", f"{len(fields)} fields, but the token and tag "
                                                           f"columns ask for at least {needed}: {text!r}")
        if tag_column is not None and not valid.fullmatch(fields[tag_column]):
            expected = "O, B-TYPE or I-TYPE" if scheme == "iob2" else "O or B-, I-, E-, S-TYPE"
            raise DataFormatError(path, number, "NER tag", f"{fields[tag_column]!r} is not {expected}")
        if not rows:
            first_line = number
        rows.append(fields)
    flush()
    return sentences


def label_list(sentences: Sequence[NerSentence]) -> list[str]:
    """The labels used in `sentences`, in CoNLL-2003's order when they are its labels, else O then sorted."""
    used = {label for sentence in sentences for label in sentence.labels}
    if used <= set(CONLL2003_LABELS):
        return list(CONLL2003_LABELS)
    return ["O"] + sorted(used - {"O"})


def conll_hub_sentences(found: Any, split: str) -> list[NerSentence]:
    """Sentences from a Hub data set's split (`hubdata.DatasetSplit`) in the layout of eriktks/conll2003:
    `tokens` and `ner_tags` (ClassLabel ids, or tag names), and `pos_tags` / `chunk_tags` when there;
    the tags converted to IOB2 as the file reader does."""
    def names_of(column: str, fallback: Sequence[str] = ()) -> list[str]:
        return found.class_names(column) or list(fallback)

    tag_names, pos_names, chunk_names = names_of("ner_tags", CONLL2003_LABELS), names_of("pos_tags"), names_of("chunk_tags")

    def as_names(values: Sequence[Any] | None, names: Sequence[str], number: int, column: str) -> list[str]:
        if values is None:
            return []
        try:
            return [names[v] if isinstance(v, int) and names else str(v) for v in values]
        except IndexError:
            raise DataFormatError(str(found.name), number, column, f"a tag id beyond the {len(names)} names") from None

    sentences = []
    for number, row in enumerate(found.rows(), start=1):
        if "tokens" not in row or "ner_tags" not in row:
            raise DataFormatError(str(found.name), number, "tokens", f"not CoNLL rows: columns are {', '.join(row)}")
        words = [str(w) for w in row["tokens"]]
        if not words:
            continue
        tags = iob1_to_iob2(as_names(row["ner_tags"], tag_names, number, "ner_tags"))
        sentences.append(NerSentence(f"{split}-{row.get('id', number - 1)}", words, tags,
                                     as_names(row.get("pos_tags"), pos_names, number, "pos_tags"),
                                     as_names(row.get("chunk_tags"), chunk_names, number, "chunk_tags"), 0, number))
    return sentences


# ------------------------------------------------------------------------------------------------
# fine-tuning: what the NER task declares
# ------------------------------------------------------------------------------------------------
# split -> file names tried in the data directory (CoNLL-2003's own names first)
NER_FILES = {
    "train": ("eng.train", "train.txt", "train"),
    "dev": ("eng.testa", "dev.txt", "valid.txt", "testa"),
    "test": ("eng.testb", "test.txt", "testb"),
}


def word_windows(piece_counts: Sequence[int], budget: int, stride: int) -> list[tuple[int, int]]:
    """Cut a sentence into windows of whole words, each at most `budget` pieces: [(first, end), ...].

    A window takes as many words as fit. The next one starts at the first word at least `stride`
    pieces after the current start (always at least one word later, never after the current end, so
    no word is skipped); the last window ends at the sentence's end. A single word longer than
    `budget` makes a window of its own (its pieces are then cut to the budget).
    """
    if budget < 1 or stride < 1:
        raise ValueError(f"budget and stride must be positive, got {budget} and {stride}")
    n = len(piece_counts)
    offsets = np.concatenate([[0], np.cumsum(piece_counts)]).tolist()  # piece offset of each word
    if offsets[-1] <= budget:
        return [(0, n)]
    windows = []
    start = 0
    while True:
        end = start
        while end < n and offsets[end + 1] - offsets[start] <= budget:
            end += 1
        end = max(end, start + 1)
        windows.append((start, end))
        if end >= n:
            return windows
        following = start + 1
        while following < end and offsets[following] < offsets[start] + stride:
            following += 1
        start = following


@dataclass
class NerWindow:
    """Which words a feature holds and where: what post-processing needs to map tokens back to words."""

    first_word: int             # index in the sentence of the window's first word
    token_of_word: list[int]    # token position of each window word's first piece
    max_context: list[bool]     # whether this window is where the word is predicted


@dataclass
class Ner(Task):
    """Token classification (CoNLL-2003 by default): one IOB2 tag per word, from its first piece."""

    name: str = "conll2003"
    family: ClassVar[str] = "ner"
    command_help: ClassVar[str] = """Fine-tune token classification on CoNLL-2003 (IOB2 tags, first sub-token labelled) and report
    conlleval's entity-level F1 on the dev set. With --frozen only the head trains on the frozen encoder's
    --frozen-layers; with --frozen --strategy S, the paper's feature-based tagger (cached features) instead.

    Example: `bertforge finetune ner --model models/minilm --data data/conll2003 --out runs/ner`
    Feature-based: `bertforge finetune ner --frozen --strategy sum_last_four --model models/minilm --data data/conll2003 --out runs/ner-frozen`
    """
    default_lr: ClassVar[float] = 5e-5
    token_outputs: ClassVar[tuple[str, ...]] = ("logits",)
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "stride": (int, "Pieces between the starts of two windows of a long sentence (default: half a window)."),
    }

    job = "token-classification"  # the model the task fine-tunes: the encoder plus this job's output layer
    inference_task = "token-classification"
    hub_dataset = "eriktks/conll2003"
    inference_default = True

    def inference_example(self, index: int, fields: dict[str, Any]) -> NerSentence:
        return NerSentence(str(index), list(fields["words"]), [], [], [], 0)

    def inference_fields(self, example: NerSentence) -> dict[str, Any]:
        return {"words": list(example.words)}

    def read(self, data_dir: str | Path, split: str) -> list[NerSentence]:
        hub = dataset_name(data_dir)
        if hub is not None:
            return conll_hub_sentences(self.hub_split(hub, split), split)
        root = Path(data_dir)
        names = NER_FILES.get(split, (split,))
        for name in names:
            if (root / name).is_file():
                return read_conll(root / name)
        raise FileNotFoundError(f"{root}: no {split} file (looked for {', '.join(names)})")

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples)

    def label_names(self, train_examples: Sequence[NerSentence]) -> list[str]:
        return label_list(train_examples)

    def featurize(self, examples: Sequence[NerSentence], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        budget = max_length - 2
        stride = int(self.settings.get("stride") or max(1, budget // 2))
        label_ids = {name: i for i, name in enumerate(label_names or [])}
        encoded = tokenizer.backend.encode_batch([list(s.words) for s in examples], is_pretokenized=True,
                                                 add_special_tokens=False) if examples else []
        cls_id, sep_id, unk_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.unk_token_id
        features = []
        for index, (sentence, encoding) in enumerate(zip(examples, encoded, strict=True)):
            pieces: list[list[int]] = [[] for _ in sentence.words]
            for token_id, word in zip(encoding.ids, encoding.word_ids, strict=True):
                if word is not None:
                    pieces[word].append(token_id)
            pieces = [(p or [unk_id])[:budget] for p in pieces]
            windows = word_windows([len(p) for p in pieces], budget, stride)
            best = self._best_windows(windows, [len(p) for p in pieces])
            for k, (first, end) in enumerate(windows):
                ids, labels, token_of_word = [cls_id], [IGNORE_INDEX], []
                for w in range(first, end):
                    token_of_word.append(len(ids))
                    ids += pieces[w]
                    if label_names is not None:
                        tag = sentence.labels[w]
                        if tag not in label_ids:
                            raise ValueError(f"{sentence.guid}: label {tag!r} of word {w} is not one of the "
                                             f"model's labels ({', '.join(label_names)})")
                        labels += [label_ids[tag]] + [IGNORE_INDEX] * (len(pieces[w]) - 1)
                ids.append(sep_id)
                labels.append(IGNORE_INDEX)
                inputs: dict[str, Any] = {"input_ids": ids, "token_type_ids": [0] * len(ids)}
                if label_names is not None:
                    inputs["labels"] = labels
                meta = NerWindow(first, token_of_word, [best[w] == k for w in range(first, end)])
                features.append(Feature(inputs, index, meta))
        return features

    @staticmethod
    def _best_windows(windows: list[tuple[int, int]], piece_counts: list[int]) -> list[int]:
        """For each word, the window (index) where its first piece has the most context."""
        offsets = np.concatenate([[0], np.cumsum(piece_counts)]).tolist()
        best = [-1] * len(piece_counts)
        best_score = [-np.inf] * len(piece_counts)
        for k, (first, end) in enumerate(windows):
            length = offsets[end] - offsets[first]
            for w in range(first, end):
                score = max_context_score(offsets[w] - offsets[first], 0, length)
                if score > best_score[w]:
                    best[w], best_score[w] = k, score
        return best

    def postprocess(self, examples: Sequence[NerSentence], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[list[str]]:
        """One tag per word of each sentence, each from the window where the word has the most context."""
        if label_names is None:
            raise ValueError("NER post-processing needs the model's label names")
        return [[label_names[i] for i in np.argmax(logits, axis=-1).tolist()]
                for logits in self.word_logits(examples, features, outputs)]

    @staticmethod
    def word_logits(examples: Sequence[NerSentence], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """Per sentence, the (n_words, num_labels) logits of each word's first piece, taken from the
        window where the word has the most context."""
        num_labels = outputs[0]["logits"].shape[-1] if outputs else 0
        words: list[np.ndarray] = [np.zeros((len(e.words), num_labels), dtype=np.float32) for e in examples]
        for feature, output in zip(features, outputs, strict=True):
            window: NerWindow = feature.meta
            logits = output["logits"]  # (T, num_labels)
            for offset, (position, chosen) in enumerate(zip(window.token_of_word, window.max_context,
                                                             strict=True)):
                if chosen:
                    words[feature.example][window.first_word + offset] = logits[position]
        return words

    @property
    def main_metric(self) -> str:
        return "f1"  # entity-level, conlleval's

    def metric(self, examples: Sequence[NerSentence], predictions: Sequence[list[str]]) -> dict[str, float]:
        """Entity-level precision, recall and F1 (conlleval), and token accuracy."""
        result = conll_f1([e.labels for e in examples], list(predictions))
        return {key: float(result[key]) for key in ("precision", "recall", "f1", "accuracy")}

    def write_predictions(self, examples: Sequence[NerSentence], predictions: Sequence[list[str]],
                          out_dir: Path, split: str) -> list[Path]:
        """`predictions-<split>.txt`: `word gold predicted` per line (conlleval's input), a blank line
        between sentences."""
        from bertforge.fileio import write_text_atomic

        lines = []
        for example, tags in zip(examples, predictions, strict=True):
            for word, gold, tag in zip(example.words, example.labels, tags, strict=True):
                lines.append(f"{word} {gold} {tag}")
            lines.append("")
        path = Path(out_dir) / f"predictions-{split}.txt"
        write_text_atomic(path, "\n".join(lines))
        return [path]
