"""Which files make the corpus, and its cut into shards and parts; reading any kind of input range.

Input files are told apart by :func:`input_kind`, through `bertforge.formats`: text (`.txt`, or any
name no format claims; compressed `.txt.gz`, `.bz2`, `.xz`, `.zst` too), JSON lines (`.jsonl`, `.ndjson`,
or `.json` holding JSON lines, plain or compressed), Parquet (`.parquet`) and CSV/TSV (`.csv`, `.tsv`, plain
or compressed: the files `finetune` reads, one document per row of their text column); any other format
(a JSON document, a compressed Parquet file) is refused in one line. :func:`read_blocks` reads a range
of any of them: text with :func:`bertforge.data.corpus.read_blocks`, records with
:func:`bertforge.data.records.read_record_blocks`.

The input is cut into shards (:func:`plan_shards`): the concatenated files are cut into `num_shards`
pieces of about equal size on disk, each cut moved forward to the next place a piece may start: the
next blank line in a text file (a document boundary in the BERT layout, a paragraph boundary in plain
text), so no sentence is cut in two; the next line of a JSON-lines file; the next row group of a
Parquet file. A compressed file cannot be entered in the middle of its stream, so it is never cut: it
is one piece of work, whatever its size; so is a CSV or TSV file (a quoted cell may hold line breaks). The same rule (:func:`cut_ranges`) cuts the corpus into the
parts of `prepare --part I/N`, and each part into its shards.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from bertforge.data.corpus import (
    DataError,
    InputRange,
    ReadStats,
    TextBlock,
    count_newlines,
    find_gutenberg_body,
    next_blank_line,
    next_line_start,
)
from bertforge.data.corpus import read_blocks as read_text_blocks
from bertforge.data.records import RecordError, parquet_layout, read_record_blocks
from bertforge.fileio import COMPRESSED_SUFFIXES, DataFormatError, compression_of, open_binary
from bertforge.formats import detect_format, named_formats

__all__ = ["cut_ranges", "expand_inputs", "input_bodies", "input_kind", "iter_texts", "plan_shards", "read_blocks"]

TEXT_KINDS = ("text", "jsonl", "parquet", "csv", "tsv")
WHOLE_KINDS = ("csv", "tsv")  # read whole, never cut into pieces
_FORMAT_KINDS = {"lines": "text", "jsonl": "jsonl", "parquet": "parquet", "csv": "csv", "tsv": "tsv"}  # `bertforge.formats` name: kind
_GLOB_CHARS = re.compile(r"[*?\[]")


def input_kind(path: str | os.PathLike[str]) -> str:
    """What a file holds (`bertforge.formats.detect_format`): "jsonl" (`.jsonl`, `.ndjson`, or `.json`
    holding JSON lines; maybe compressed), "parquet" (`.parquet`), "csv" / "tsv" (`.csv`, `.tsv`) or "text"
    (`.txt` or any name no format claims, compressed `.txt.gz` ... included). A file of another format (a JSON document such as
    SQuAD's, a compressed Parquet file) raises `RecordError`: one line naming it and the kinds read."""
    try:
        return _FORMAT_KINDS[detect_format(path, tuple(_FORMAT_KINDS))]
    except RecordError:
        raise
    except DataFormatError as exc:
        raise RecordError(exc.path, exc.line, exc.field, exc.message) from None


def _found_in_directory(path: Path) -> bool:
    """Files a directory contributes: those whose name alone says a kind it reads: text (`.txt`), JSON
    lines (`.jsonl`, `.ndjson`; not `.json`, which may hold any JSON document: too often metadata) and
    Parquet (not compressed). Not CSV or TSV, too often a table of something else: those are read
    where named (a file or a pattern)."""
    kinds = tuple(kind for kind in _FORMAT_KINDS if kind not in WHOLE_KINDS)
    if not set(named_formats(path)) & set(kinds):
        return False
    try:
        detect_format(path, kinds, read=False)
    except DataFormatError:
        return False
    return True



def expand_inputs(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files named by `inputs`: files as given; directories by their text, JSON-lines and Parquet files,
    compressed or not (recursively); glob patterns (`corpus/*.jsonl.gz`, `**` for any depth) by what they
    match. Sorted within each directory or pattern; a file named twice counts once.

    Raises DataError for a path that does not exist, a pattern that matches nothing, or a directory
    without input files.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if not path.exists() and _GLOB_CHARS.search(str(item)):
            matches = sorted(Path(p) for p in glob.glob(str(item), recursive=True))
            if not matches:
                raise DataError(f"{item}: the pattern matches no file")
            for match in matches:
                files.extend(_directory_files(match) if match.is_dir() else [match])
        elif path.is_dir():
            files.extend(_directory_files(path))
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or directory")
    if not files:
        raise DataError("no input files given")
    seen: set[Path] = set()
    unique = []
    for path in files:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def _directory_files(path: Path) -> list[Path]:
    found = sorted(p for p in path.rglob("*") if p.is_file() and _found_in_directory(p))
    if not found:
        raise DataError(f"{path}: directory holds no input files (.txt, .jsonl, .ndjson, .parquet, or those "
                        f"compressed: {', '.join(COMPRESSED_SUFFIXES)})")
    return found



def input_bodies(
    files: Sequence[str | os.PathLike[str]],
    *,
    strip_gutenberg: bool = False,
    text_column: str = "text",
) -> tuple[list[InputRange], list[str]]:
    """One range per input file with something in it (its whole body), and warnings (empty files,
    missing Gutenberg markers). Parquet files are checked for `text_column` here, before any work."""
    from bertforge.data.records import parquet_layout

    warnings: list[str] = []
    bodies: list[InputRange] = []
    for index, file in enumerate(files):
        path = Path(file)
        size = path.stat().st_size
        if size == 0:
            warnings.append(f"{path}: empty file, skipped")
            continue
        kind = input_kind(path)
        if kind == "parquet":
            sizes, _rows, names = parquet_layout(str(path))
            if text_column not in names:
                raise DataError(f"{path}: no column {text_column!r} (columns: {', '.join(names)}); choose one with "
                                "text_column (--text-column)")
            if sizes:
                bodies.append(InputRange(str(path), index, 0, len(sizes), 1, kind, sum(sizes)))
            else:
                warnings.append(f"{path}: no rows, skipped")
            continue
        if kind in WHOLE_KINDS:
            from bertforge.tables import column_names

            names = column_names(path, fmt=kind)
            if text_column not in names:
                raise DataError(f"{path}: no column {text_column!r} (columns: {', '.join(names)}); choose one with "
                                "text_column (--text-column)")
            bodies.append(InputRange(str(path), index, 0, -1, 1, kind, size))
            continue
        start, end, first_line = 0, size, 1
        if strip_gutenberg and kind == "text":
            start, end, notes = find_gutenberg_body(path)
            warnings.extend(notes)
            if end <= start:
                continue
            if not compression_of(path):
                with open(path, "rb") as handle:
                    first_line = 1 + count_newlines(handle, 0, start)
        if compression_of(path):
            if strip_gutenberg and kind == "text":
                with open_binary(path) as handle:
                    first_line = 1 + handle.read(start).count(b"\n")
            else:
                start, end = 0, -1
            bodies.append(InputRange(str(path), index, start, end, first_line, kind, size))
        elif end > start:
            bodies.append(InputRange(str(path), index, start, end, first_line, kind))
    return bodies, warnings


def _snap(body: InputRange, offset: int) -> int:
    """The first place at or after `offset` (bytes into `body`'s weight) where a new piece may start."""
    if body.compressed or body.kind in WHOLE_KINDS:
        return body.weight
    if body.kind == "parquet":
        bounds = _group_bounds(body)
        return next((b for b in bounds if b >= offset), body.weight)
    with open(body.path, "rb") as handle:
        find = next_blank_line if body.kind == "text" else next_line_start
        return find(handle, body.start + offset, body.start, body.end) - body.start


def _group_bounds(body: InputRange) -> list[int]:
    """Cumulative sizes of a Parquet range's row groups: [0, size of the first, ..., weight]."""
    from bertforge.data.records import parquet_layout

    sizes = parquet_layout(body.path)[0][body.start:body.end]
    return [sum(sizes[:k]) for k in range(len(sizes) + 1)]


def cut_ranges(bodies: Sequence[InputRange], num_pieces: int) -> list[list[InputRange]]:
    """Cut `bodies` (whole files, or pieces of them) into at most `num_pieces` runs of about equal weight.

    The concatenated weight is cut at `num_pieces - 1` even targets, each moved forward to where a
    piece may start (`_snap`); a cut that falls at the end of a file moves to the start of the next.
    Returns the runs in input order, none empty. Deterministic: it reads the files, never the clock.
    """
    total = sum(b.weight for b in bodies)
    if total == 0:
        return []
    num_pieces = max(1, num_pieces)
    cuts: set[tuple[int, int]] = set()  # (position in `bodies`, offset into that body's weight)
    targets = [total * k // num_pieces for k in range(1, num_pieces)]
    base, body_i = 0, 0
    for target in targets:
        while body_i < len(bodies) and base + bodies[body_i].weight <= target:
            base += bodies[body_i].weight
            body_i += 1
        if body_i >= len(bodies):
            break
        weight = bodies[body_i].weight
        offset = _snap(bodies[body_i], target - base)
        if 0 < offset < weight:
            cuts.add((body_i, offset))
        elif offset >= weight and body_i + 1 < len(bodies):
            cuts.add((body_i + 1, 0))

    # walk the bodies, starting a new run at each cut
    runs: list[list[InputRange]] = [[]]
    for i, body in enumerate(bodies):
        offsets = sorted(off for (b, off) in cuts if b == i)
        if offsets and offsets[0] == 0 and runs[-1]:
            runs.append([])
            offsets = offsets[1:]
        piece_start, line = 0, body.first_line
        for off in [*offsets, body.weight]:
            if off > piece_start:
                runs[-1].append(_piece(body, piece_start, off, line))
                if off != body.weight and body.kind != "parquet":  # lines counted piece by piece, once
                    with open(body.path, "rb") as handle:
                        line += count_newlines(handle, body.start + piece_start, body.start + off)
            if off != body.weight:
                runs.append([])
            piece_start = off
    return [run for run in runs if run]


def _piece(body: InputRange, start: int, end: int, first_line: int) -> InputRange:
    """The piece `[start, end)` (bytes into the weight) of `body`, as a range of its own kind; for text and
    JSON lines `first_line` is the line number at `start`."""
    if start == 0 and end == body.weight:
        return body
    if body.kind == "parquet":
        sizes, rows, _ = parquet_layout(body.path)
        bounds = _group_bounds(body)
        first, last = body.start + bounds.index(start), body.start + bounds.index(end)
        first_row = body.first_line + sum(rows[body.start:first])
        return InputRange(body.path, body.file_index, first, last, first_row, "parquet", sum(sizes[first:last]))
    return InputRange(body.path, body.file_index, body.start + start, body.start + end, first_line, body.kind)


def plan_shards(
    files: Sequence[str | os.PathLike[str]],
    num_shards: int,
    *,
    strip_gutenberg: bool = False,
    text_column: str = "text",
) -> tuple[list[list[InputRange]], list[str]]:
    """Cut the input into at most `num_shards` shards of about equal size on disk (see the module docstring).

    Returns the shards (each a list of InputRange, in input order, none empty) and warnings (empty
    files, missing Gutenberg markers). Deterministic: the same files and `num_shards` give the same plan.
    """
    bodies, warnings = input_bodies(files, strip_gutenberg=strip_gutenberg, text_column=text_column)
    return cut_ranges(bodies, num_shards), warnings


def read_blocks(
    rng: InputRange,
    *,
    plain_text: bool = False,
    block_sentences: int = 256,
    max_line_chars: int = 10_000,
    bad_bytes: str = "skip",
    stats: ReadStats | None = None,
    field: str = "text",
    bad_records: str = "skip",
) -> Iterator[TextBlock]:
    """Stream one input range of any kind as blocks of sentences.

    Text: :func:`bertforge.data.corpus.read_blocks` (`bad_bytes` says what a line that is not UTF-8
    does). JSON lines, Parquet, CSV and TSV: :func:`bertforge.data.records.read_record_blocks`, one document
    per record; `field` names the JSON field or the column of the text, `bad_records` what a record
    without usable text does.
    """
    if rng.kind == "text":
        return read_text_blocks(rng, plain_text=plain_text, block_sentences=block_sentences,
                                max_line_chars=max_line_chars, bad_bytes=bad_bytes, stats=stats)
    return read_record_blocks(rng, field=field, plain_text=plain_text, block_sentences=block_sentences,
                              max_line_chars=max_line_chars, bad_records=bad_records, stats=stats)


def iter_texts(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    text_column: str = "text",
    plain_text: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[str]:
    """Every line (sentence) of the inputs, whatever their kind, as `prepare` reads them: text files,
    and the `text_column` of JSON lines, Parquet, CSV and TSV (a record's text split at its lines, or
    into sentences with `plain_text`). For training a vocabulary on the same text a model is trained on."""
    bodies, _warnings = input_bodies(expand_inputs(inputs), text_column=text_column)
    for body in bodies:
        for block in read_blocks(body, plain_text=plain_text, field=text_column, stats=stats):
            yield from block.sentences
