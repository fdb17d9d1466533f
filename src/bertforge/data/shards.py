"""The on-disk format of prepared data: flat binary arrays read with `numpy.memmap`, one small JSON index each.

An output directory::

    dataset.json            options, tokenizer facts, the shard plan (written first)
    continuation.npy        bool over the vocabulary: which pieces continue a word (for dynamic masking)
    train/shard_00000.json  the index of shard 0's training instances (after its arrays)
    train/shard_00000.tokens.bin ...
    valid/shard_00000.json  the same for its validation instances, when it has any
    done/shard_00000.json   shard 0's counts, written after both: a shard is finished when it exists
    stats.json              totals over all shards (written at the end)

A part with no instance writes no file at all, so there are no empty shards on disk.

A shard's arrays (N instances, dtype in the index):

=====================  ==========  ====================================================================
``tokens``             uint16/32   all instances' tokens back to back (`[CLS] A [SEP] B [SEP]`), already
                                   masked when the masking is static
``offsets``            int64       N + 1 starts into ``tokens``
``segment_b``          uint16      where segment B (token type 1) starts in each instance
``nsp_labels``         int8        0 IsNext / in order, 1 NotNext / swapped, -1 none
``mask_offsets``       int64       static only: N + 1 starts into the two arrays below
``mask_positions``     uint16      static only: positions of the predicted tokens
``mask_targets``       uint16/32   static only: the original tokens at those positions
=====================  ==========  ====================================================================

Every file is written to a temporary name, flushed and renamed into place (`os.replace`), and the index
is written after the arrays, so an interrupted writer leaves no file that looks finished.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.fileio import write_text_atomic

__all__ = ["FORMAT", "Shard", "ShardWriter", "list_shards", "read_json", "shard_name", "token_dtype"]

FORMAT = "bertforge-pretraining-shard"
VERSION = 1


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of the vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class ShardWriter:
    """Appends batches of instances to one shard's arrays; `close()` renames them into place, index last.

    Memory stays bounded: each batch is written out as it comes.
    """

    def __init__(self, directory: str | os.PathLike[str], index: int, *, dtype: np.dtype, static: bool):
        self.directory = Path(directory)
        self.name = shard_name(index)
        self.dtype = np.dtype(dtype)
        self.static = static
        self.arrays = {
            "tokens": self.dtype, "offsets": np.dtype(np.int64), "segment_b": np.dtype(np.uint16),
            "nsp_labels": np.dtype(np.int8),
        }
        if static:
            self.arrays.update(mask_offsets=np.dtype(np.int64), mask_positions=np.dtype(np.uint16),
                               mask_targets=self.dtype)
        self.instances = 0
        self.tokens = 0
        self.predictions = 0
        self._handles: dict[str, Any] = {}

    def _path(self, array: str) -> Path:
        return self.directory / f"{self.name}.{array}.bin"

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for array in self.arrays:
            tmp = self._path(array).with_suffix(".bin.tmp")
            self._handles[array] = open(tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._write("offsets", np.zeros(1, np.int64))
        if self.static:
            self._write("mask_offsets", np.zeros(1, np.int64))

    def _write(self, array: str, values: np.ndarray) -> None:
        self._handles[array].write(np.ascontiguousarray(values, dtype=self.arrays[array]).tobytes())

    def add(self, tokens: list[np.ndarray], segment_b: list[int], labels: list[int],
            mask_positions: list[np.ndarray] | None = None, mask_targets: list[np.ndarray] | None = None) -> None:
        """Append instances; for a static shard also the positions and original tokens of each mask."""
        if not tokens:
            return
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        counts = flat_positions = flat_targets = None
        if mask_positions is not None and mask_targets is not None:
            counts = np.fromiter((len(p) for p in mask_positions), dtype=np.int64, count=len(mask_positions))
            flat_positions, flat_targets = np.concatenate(mask_positions), np.concatenate(mask_targets)
        self.add_flat(np.concatenate(tokens), lengths, np.asarray(segment_b), np.asarray(labels),
                      flat_positions, flat_targets, counts)

    def add_flat(self, tokens: np.ndarray, lengths: np.ndarray, segment_b: np.ndarray, labels: np.ndarray,
                 mask_positions: np.ndarray | None = None, mask_targets: np.ndarray | None = None,
                 mask_counts: np.ndarray | None = None) -> None:
        """`add` for instances already laid end to end: `lengths[i]` tokens and `mask_counts[i]` masks each."""
        if not len(lengths):
            return
        if not self._handles:
            self._open()
        self._write("tokens", tokens)
        self._write("offsets", self.tokens + np.cumsum(lengths))
        self._write("segment_b", segment_b)
        self._write("nsp_labels", labels)
        self.tokens += int(lengths.sum())
        if self.static:
            if mask_positions is None or mask_targets is None or mask_counts is None:
                raise ValueError("a static shard needs mask_positions, mask_targets and mask_counts")
            self._write("mask_positions", mask_positions)
            self._write("mask_targets", mask_targets)
            self._write("mask_offsets", self.predictions + np.cumsum(mask_counts))
            self.predictions += int(mask_counts.sum())
        self.instances += len(lengths)

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Finish the shard: rename the arrays into place, then write the index. None if it holds nothing.

        An empty shard writes no file at all (no empty shards on disk).
        """
        if not self.instances:
            self.abort()
            return None
        sizes = {}
        for array, handle in self._handles.items():
            handle.flush()
            os.fsync(handle.fileno())
            sizes[array] = handle.tell() // self.arrays[array].itemsize
            handle.close()
            os.replace(self._path(array).with_suffix(".bin.tmp"), self._path(array))
        self._handles = {}
        index = {
            "format": FORMAT, "version": VERSION, "name": self.name, "instances": self.instances,
            "tokens": self.tokens, "predictions": self.predictions, "static": self.static,
            "arrays": {a: {"file": self._path(a).name, "dtype": self.arrays[a].str, "length": sizes[a]}
                       for a in self.arrays},
        }
        if extra:
            index.update(extra)
        write_text_atomic(self.directory / f"{self.name}.json", json.dumps(index, indent=1) + "\n")
        return index

    def abort(self) -> None:
        """Drop what was written (temporary files only; finished files of a previous run stay)."""
        for array, handle in self._handles.items():
            handle.close()
            self._path(array).with_suffix(".bin.tmp").unlink(missing_ok=True)
        self._handles = {}


class Shard:
    """Read access to one finished shard through memory maps (opened lazily, so it pickles cheaply)."""

    def __init__(self, index_path: str | os.PathLike[str]):
        self.index_path = Path(index_path)
        self.index = read_json(self.index_path)
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{self.index_path}: not a {FORMAT} index")
        if self.index.get("version", 0) > VERSION:
            raise ValueError(f"{self.index_path}: written by a newer bertforge (format {self.index['version']})")
        self.static = bool(self.index["static"])
        self._maps: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.index["instances"])

    def __getstate__(self) -> dict:
        return {"index_path": self.index_path, "index": self.index, "static": self.static, "_maps": None}

    def array(self, name: str) -> np.ndarray:
        if self._maps is None:
            maps = {}
            for array, spec in self.index["arrays"].items():
                path = self.index_path.parent / spec["file"]
                length = int(spec["length"])
                maps[array] = (np.memmap(path, dtype=np.dtype(spec["dtype"]), mode="r", shape=(length,))
                               if length else np.zeros(0, np.dtype(spec["dtype"])))
            self._maps = maps
        return self._maps[name]

    def instance(self, i: int) -> dict[str, Any]:
        """Instance `i`: tokens (int64), segment_b, nsp_label, and for static shards the mask positions/targets."""
        offsets = self.array("offsets")
        start, end = int(offsets[i]), int(offsets[i + 1])
        item = {
            "input_ids": np.asarray(self.array("tokens")[start:end], dtype=np.int64),
            "segment_b": int(self.array("segment_b")[i]),
            "nsp_label": int(self.array("nsp_labels")[i]),
        }
        if self.static:
            moff = self.array("mask_offsets")
            ms, me = int(moff[i]), int(moff[i + 1])
            item["mask_positions"] = np.asarray(self.array("mask_positions")[ms:me], dtype=np.int64)
            item["mask_targets"] = np.asarray(self.array("mask_targets")[ms:me], dtype=np.int64)
        return item


def list_shards(directory: str | os.PathLike[str]) -> list[Shard]:
    """The finished shards of one split directory (`out/train`, `out/valid`), in shard order."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [Shard(p) for p in sorted(directory.glob("shard_*.json"))]
