"""Pre-training data: text files -> instances -> masked shards on disk -> batches.

    corpus.py     reading documents (BERT layout or plain text), sentence splitting, Gutenberg headers
    records.py    reading documents from JSON lines and Parquet, one per record
    sources.py    which files make the corpus (directories, globs, kinds); its cut into shards and parts
    instances.py  NSP / SOP segment pairs and RoBERTa-style packing, truncation
    masking.py    15% / 80-10-10, whole-word and span masking, vectorised with numpy
    shards.py     the on-disk format (memmap arrays + a JSON index per shard)
    prepare.py    `prepare(...)`: parallel, streaming, resumable shard making, stats.json
    loader.py     Dataset, collator, rank split and resumable position for training

Names are imported lazily: `prepare`'s worker processes must not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "DataError": "bertforge.data.corpus",
    "split_sentences": "bertforge.data.corpus",
    "Masker": "bertforge.data.masking",
    "prepare": "bertforge.data.prepare",
    "DataWarning": "bertforge.data.prepare",
    "PretrainingDataset": "bertforge.data.loader",
    "PretrainingCollator": "bertforge.data.loader",
    "PretrainingLoader": "bertforge.data.loader",
}

__all__ = [
    "DataError", "DataWarning", "Masker", "PretrainingCollator", "PretrainingDataset", "PretrainingLoader",
    "prepare", "split_sentences",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'bertforge.data' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from bertforge.data.corpus import DataError, split_sentences
    from bertforge.data.loader import PretrainingCollator, PretrainingDataset, PretrainingLoader
    from bertforge.data.masking import Masker
    from bertforge.data.prepare import DataWarning, prepare
