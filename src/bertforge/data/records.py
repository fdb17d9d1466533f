"""Reading pre-training text from records: JSON lines (one object per line), Parquet and CSV/TSV (one
row each).

One record is one document. Its text field (JSONL, `text_field`) or column (Parquet, CSV, TSV: `text_column`)
is read like a small text file of its own: one sentence per line in the BERT layout, or running
prose split into paragraphs (at blank lines) and sentences with `plain_text`. Records never merge.

Memory stays bounded whatever the size of a file:

* JSON lines are read one line at a time (compressed files through a decompressing stream) and
  parsed with the standard `json` module, so an error names its exact line;
* Parquet is read one row group at a time, in batches of `PARQUET_BATCH_ROWS` rows of the text
  column only (`pyarrow.parquet.ParquetFile.iter_batches`), so at most one row group's text column
  is in memory; a file written with huge row groups costs that much memory, and no more;
* CSV and TSV are streamed row by row by `bertforge.tables` (the files `finetune` reads: other
  columns, labels among them, are ignored); a file is never cut, so it is one piece of work.

A record that cannot be used (invalid JSON, not an object, the field missing or null, a value that
is not a string, bytes that are not UTF-8) is a *bad record*: skipped and counted with its location
(`bad_records="skip"`), or the end of the run with a :class:`RecordError` naming file, line (or row)
and field (`bad_records="error"`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

from bertforge.data.corpus import (
    MAX_LOCATIONS,
    DataError,
    InputRange,
    ReadStats,
    TextBlock,
    hard_split,
    split_sentences,
)
from bertforge.fileio import DataFormatError, NotUtf8Error, decode_utf8, open_binary

__all__ = ["BAD_RECORDS_POLICIES", "PARQUET_BATCH_ROWS", "RecordError", "parquet_layout", "read_record_blocks"]

BAD_RECORDS_POLICIES = ("skip", "error")
PARQUET_BATCH_ROWS = 1024  # rows turned into Python strings at a time
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


class RecordError(DataError, DataFormatError):
    """A record that cannot be used: `file:line: field: what is wrong`, where `line` is the 1-based line
    of a JSON-lines file or the 1-based row of a Parquet file (as `bertforge.tables` counts them)."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        DataFormatError.__init__(self, path, line, field, message)


def _where(path: str, line: int, unit: str) -> str:
    return f"{path}:{line}" if unit == "line" else f"{path}: row {line}"


# ---------------------------------------------------------------------------------------------------
# Parquet layout: row groups, their sizes and the text column
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def parquet_layout(path: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """(bytes on disk, rows) of each row group of a Parquet file, and its column names, from its footer."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises ArrowInvalid or OSError for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    sizes, rows = [], []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        sizes.append(sum(group.column(c).total_compressed_size for c in range(group.num_columns)))
        rows.append(group.num_rows)
    return tuple(sizes), tuple(rows), tuple(meta.schema.to_arrow_schema().names)


def _parquet_batches(path: str, groups: range, column: str) -> Iterator[Any]:
    """Record batches of the text column, one row group after the other (the unit read from disk)."""
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(path)
    for group in groups:  # one group per call: given several, iter_batches fills batches across them
        yield from handle.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=[column],
                                       use_threads=False)


# ---------------------------------------------------------------------------------------------------
# records: (text or problem, location, document key, bytes)
# ---------------------------------------------------------------------------------------------------


def _iter_jsonl(rng: InputRange, field: str) -> Iterator[tuple[str | None, str, int, int, int]]:
    """(text, problem, line number, byte offset, bytes) for each non-blank line of the range.

    Either `text` is the record's text or `problem` says why there is none. The offset is in the
    decompressed stream for a compressed file (it keys the document, nothing seeks to it).
    """
    with open_binary(rng.path) as handle:
        pos = 0
        if rng.start:
            handle.seek(rng.start)  # plain files only: compressed ones are one range from their start
            pos = rng.start
        line_no = rng.first_line - 1
        end = rng.end
        while end < 0 or pos < end:
            raw = handle.readline()
            if not raw:
                break
            offset, pos = pos, pos + len(raw)
            line_no += 1
            if not raw.strip():
                continue
            try:
                line = decode_utf8(raw, rng.path, first_line=line_no)
            except NotUtf8Error as exc:
                yield None, f"not UTF-8 ({exc.detail})", line_no, offset, len(raw)
                continue
            if offset == 0:
                line = line.lstrip("\ufeff")  # byte-order mark
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield None, f"invalid JSON ({exc.msg} at column {exc.colno})", line_no, offset, len(raw)
                continue
            except RecursionError:
                yield None, "a JSON record nested too deeply to read", line_no, offset, len(raw)
                continue
            yield (*_field_text(record, field), line_no, offset, len(raw))


def _iter_table(rng: InputRange, column: str) -> Iterator[tuple[str | None, str, int, int, int]]:
    """(text, problem, line, line, bytes) for each row of a CSV or TSV file (always read whole); the line
    is where the row starts, as `bertforge.tables` counts it."""
    from bertforge.tables import iter_rows

    try:
        for row in iter_rows(rng.path, (column,), fmt=rng.kind):
            text = row.values[column]
            size = len(text.encode("utf-8")) + 1
            yield (text, "", row.number, row.number, size) if text.strip() else \
                (None, f"column {column!r} is empty", row.number, row.number, size)
    except DataFormatError as exc:  # a missing column, a short row: the file cannot be read on
        raise RecordError(exc.path, exc.line, exc.field, exc.message) from None


def _field_text(record: Any, field: str) -> tuple[str | None, str]:
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object with a {field!r} field"
    if field not in record:
        return None, f"no field {field!r} (fields: {', '.join(map(str, list(record)[:8]))})"
    value = record[field]
    if isinstance(value, str):
        return value, ""
    return None, f"field {field!r} is {'null' if value is None else type(value).__name__}, not a string"


def _iter_parquet(rng: InputRange, column: str) -> Iterator[tuple[str | None, str, int, int, int]]:
    """(text, problem, row, row, bytes) for each row of the range's row groups; rows count from 1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    row = rng.first_line
    for batch in _parquet_batches(rng.path, range(rng.start, rng.end), column):
        values = batch.column(0)
        kind = values.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            sizes = pc.fill_null(pc.binary_length(values), 0).to_pylist()
            texts = values.to_pylist()
            for text, size in zip(texts, sizes, strict=True):
                yield (text, "" if text is not None else f"column {column!r} is null", row, row, size)
                row += 1
        elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            for raw in values.to_pylist():
                if raw is None:
                    yield None, f"column {column!r} is null", row, row, 0
                else:
                    try:
                        yield decode_utf8(raw, rng.path), "", row, row, len(raw)
                    except NotUtf8Error as exc:
                        yield None, f"not UTF-8 ({exc.detail.replace(' of the line', '')})", row, row, len(raw)
                row += 1
        else:
            for _ in range(len(values)):
                yield None, f"column {column!r} holds {kind}, not strings", row, row, 0
                row += 1


# ---------------------------------------------------------------------------------------------------
# records -> blocks of sentences
# ---------------------------------------------------------------------------------------------------


def _sentences(text: str, plain_text: bool, max_line_chars: int) -> tuple[list[str], bool]:
    """The sentences of one record, and whether a line was longer than `max_line_chars`."""
    if plain_text:
        return [piece for paragraph in _PARAGRAPH_BREAK.split(text) for sentence in split_sentences(paragraph)
                for piece in hard_split(sentence, max_line_chars)], False
    sentences: list[str] = []
    overlong = False
    for line in text.split("\n"):
        line = line.strip()
        if len(line) > max_line_chars:
            overlong = True
            sentences.extend(p for s in split_sentences(line) for p in hard_split(s, max_line_chars))
        elif line:
            sentences.append(line)
    return sentences, overlong


def read_record_blocks(
    rng: InputRange,
    *,
    field: str = "text",
    plain_text: bool = False,
    block_sentences: int = 256,
    max_line_chars: int = 10_000,
    bad_records: str = "skip",
    stats: ReadStats | None = None,
) -> Iterator[TextBlock]:
    """Stream the records of one JSONL or Parquet range as blocks of sentences, one document per record.

    `field` is the JSON field or the Parquet column holding the text. See the module docstring for
    bad records; their count and first locations go to `stats` (`bad_records`, `bad_record_locations`).
    """
    if bad_records not in BAD_RECORDS_POLICIES:
        raise ValueError(f"bad_records must be one of {BAD_RECORDS_POLICIES}, not {bad_records!r}")
    stats = stats if stats is not None else ReadStats()
    unit = "row" if rng.kind == "parquet" else "line"
    readers = {"parquet": _iter_parquet, "csv": _iter_table, "tsv": _iter_table}
    records = readers.get(rng.kind, _iter_jsonl)(rng, field)
    nbytes = 0
    per_file = stats.sentences_per_file
    for text, problem, line, key, size in records:
        nbytes += size
        stats.bytes += size
        if text is None:
            if bad_records == "error":
                raise RecordError(rng.path, line, field, problem + "; fix the record or use bad_records='skip'")
            stats.bad_records += 1
            if len(stats.bad_record_locations) < MAX_LOCATIONS:
                stats.bad_record_locations.append(f"{_where(rng.path, line, unit)} ({problem})")
            continue
        sentences, overlong = _sentences(text, plain_text, max_line_chars)
        if overlong:
            stats.overlong_lines += 1
            if len(stats.overlong_locations) < MAX_LOCATIONS:
                stats.overlong_locations.append(_where(rng.path, line, unit))
        if not sentences:
            continue
        stats.documents += 1
        location = _where(rng.path, line, unit)
        for first in range(0, len(sentences), block_sentences):
            chunk = sentences[first:first + block_sentences]
            stats.sentences += len(chunk)
            per_file[rng.file_index] = per_file.get(rng.file_index, 0) + len(chunk)
            yield TextBlock((rng.file_index, key), chunk, nbytes, first == 0, location)
            nbytes = 0
