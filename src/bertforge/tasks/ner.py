"""CoNLL-2003 named-entity recognition: the reader.

The English files have one token per line with four space-separated columns, `word POS chunk NER`,
and a blank line between sentences. Documents start with a `-DOCSTART- -X- -X- O` line; some copies
of the data drop it (ours drop the first one of each file), so it is optional: it only ends the
current sentence and starts a new document.

The NER column is IOB1: `I-X` opens an entity unless it directly follows another X entity, where
`B-X` marks the boundary between the two. The reader converts it to IOB2 (every entity starts with
`B-`), the scheme a token classifier is trained on. `metrics.conll_f1` scores either scheme the way
conlleval does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bertforge.tasks.glue import DataFormatError, read_text_lines

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


def read_conll(path: str | Path, *, n_columns: int = 4,
               scheme: Literal["iob2", "keep"] = "iob2") -> list[NerSentence]:
    """Read a CoNLL-2003 file into sentences.

    Each non-blank line must have `n_columns` whitespace-separated fields: the word first, the NER tag
    last (with 4 columns, POS and chunk tags in between; other layouts leave `pos_tags` and
    `chunk_tags` empty). `scheme="iob2"` accepts IOB1 or IOB2 tags
    (O, B-X, I-X) and returns IOB2; `scheme="keep"` returns the tags as written and also allows E-/S-.
    """
    path = Path(path)
    if n_columns < 2:
        raise ValueError(f"n_columns must be at least 2 (word and tag), not {n_columns}")
    valid = _IOB_TAG if scheme == "iob2" else _ANY_TAG
    sentences: list[NerSentence] = []
    rows: list[list[str]] = []
    doc_index = 0

    def flush() -> None:
        if not rows:
            return
        labels = [row[-1] for row in rows]
        sentences.append(NerSentence(
            guid=f"{path.name}-{len(sentences)}",
            words=[row[0] for row in rows],
            labels=iob1_to_iob2(labels) if scheme == "iob2" else labels,
            pos_tags=[row[1] for row in rows] if n_columns == 4 else [],
            chunk_tags=[row[2] for row in rows] if n_columns == 4 else [],
            doc_index=doc_index,
        ))
        rows.clear()

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
        if len(fields) != n_columns:
            raise DataFormatError(path, number, "columns", f"{len(fields)} fields, expected {n_columns} "
                                                           f"(word POS chunk NER): {text!r}")
        if not valid.fullmatch(fields[-1]):
            raise DataFormatError(path, number, "NER tag", f"{fields[-1]!r} is not O, B-TYPE or I-TYPE")
        rows.append(fields)
    flush()
    return sentences


def label_list(sentences: Sequence[NerSentence]) -> list[str]:
    """The labels used in `sentences`, in CoNLL-2003's order when they are its labels, else O then sorted."""
    used = {label for sentence in sentences for label in sentence.labels}
    if used <= set(CONLL2003_LABELS):
        return list(CONLL2003_LABELS)
    return ["O"] + sorted(used - {"O"})
