"""Users' files as rows: CSV, TSV, JSONL (each also .gz/.bz2/.xz/.zst), Parquet and plain lines, streamed.

Every reader of a user's file (the own-data fine-tuning families, `predict --input`, the pipeline) goes
through `iter_rows`, so every format behaves the same:

    for row in iter_rows("reviews.csv", columns=["text", "label"]):
        row.number, row.values["text"], row.values["label"]

- The format is decided by `bertforge.formats` (`table_format`): from the file name, .csv, .tsv,
  .jsonl/.ndjson, .parquet, anything else plain lines (one row `{"text": line}` per line), a compression
  suffix looked through; a .json file holding JSON lines is JSON lines, one holding a JSON document (or
  a CSV file given where rows are expected, ...) is refused in one line naming the formats read.
- Rows stream: a text file is read line by line from a decompressing stream, a Parquet file one record
  batch at a time, so a 1 GB input never sits in memory whole.
- `Row.number` locates the row for error messages: the 1-based line where the record starts in a text
  format (the header is line 1 of a CSV), the 1-based row in a Parquet file. Errors are `DataFormatError`
  naming the file, that line and the field: a missing column names the columns found; a non-UTF-8 line,
  bad JSON, a CSV row with the wrong number of fields, an empty file each say so in one line.
- The parsers are the standard library's `csv` and `json` (exact line numbers, nothing hand-written) and
  pyarrow for Parquet. CSV values are strings; JSONL and Parquet values keep their types.

`write_rows` is the other direction: predictions to .jsonl or .csv, streamed to a temporary file that
replaces the target in one rename when complete, so a crash never leaves half a file.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.fileio import (
    DataFormatError,
    NotUtf8Error,
    atomic_path,
    compression_of,
    decode_utf8,
    open_binary,
)
from bertforge.formats import detect_format

TABLE_FORMATS = ("csv", "tsv", "jsonl", "parquet", "lines")  # `bertforge.formats` names
WRITE_FORMATS = ("jsonl", "csv", "tsv")
LINES_COLUMN = "text"  # the one column of a plain-lines file


@dataclass(frozen=True)
class Row:
    """One record: where it is in its file (`number`, see the module docstring) and its values by column."""

    number: int
    values: dict[str, Any]


def table_format(path: str | Path) -> str:
    """"csv", "tsv", "jsonl", "parquet" or "lines": `formats.detect_format` over `TABLE_FORMATS` (the name,
    compression looked through; a .json file's content). Raises `DataFormatError`, one line, for a file
    of another format (a JSON document, a compressed Parquet file)."""
    return detect_format(path, TABLE_FORMATS)


def iter_rows(path: str | Path, columns: Sequence[str] = (), *, fmt: str | None = None,
              batch_rows: int = 1024) -> Iterator[Row]:
    """The rows of `path`, streamed, each checked to have every column in `columns`.

    `fmt` overrides the format `table_format` decides. Raises `DataFormatError` (file, line, field) for a
    missing column, an empty file, bytes that are not UTF-8, bad JSON or a short CSV row; a missing file
    raises FileNotFoundError before anything is read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt = fmt or table_format(path)
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; one of {', '.join(TABLE_FORMATS)}")
    readers: dict[str, Callable[[], Iterator[Row]]] = {
        "csv": lambda: _delimited_rows(path, ","),
        "tsv": lambda: _delimited_rows(path, "\t"),
        "jsonl": lambda: _jsonl_rows(path),
        "parquet": lambda: _parquet_rows(path, batch_rows),
        "lines": lambda: (Row(number, {LINES_COLUMN: text}) for number, text in _text_lines(path)),
    }
    empty = True
    for row in readers[fmt]():
        if empty:
            _check_columns(path, row, columns, fmt)
            empty = False
        elif fmt == "jsonl":  # a JSON record may lack a key its predecessors had
            _check_columns(path, row, columns, fmt)
        yield row
    if empty:
        raise DataFormatError(path, None, None, "empty file: no rows")


def read_rows(path: str | Path, columns: Sequence[str] = (), *, fmt: str | None = None) -> list[Row]:
    """All rows of `path` in a list: for training and dev files, which are read whole anyway."""
    return list(iter_rows(path, columns, fmt=fmt))


def column_names(path: str | Path, *, fmt: str | None = None) -> list[str]:
    """The columns of `path`: the CSV header, the first JSON record's keys, the Parquet schema."""
    fmt = fmt or table_format(Path(path))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(path).schema_arrow.names)
    first = next(iter_rows(path, fmt=fmt))
    return list(first.values)


def _check_columns(path: Path, row: Row, columns: Sequence[str], fmt: str) -> None:
    missing = [name for name in columns if name not in row.values]
    if missing:
        found = ", ".join(row.values) or "none"
        hint = " (a plain-lines file has the one column 'text')" if fmt == "lines" else ""
        raise DataFormatError(path, row.number, missing[0],
                              f"no such column; the columns are: {found}{hint}")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line ending) of a UTF-8 text file, streamed."""
    with open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = decode_utf8(raw, path, number)
            except NotUtf8Error as exc:
                raise DataFormatError(path, exc.line, None, f"not UTF-8 text ({exc.detail})") from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            yield number, text.rstrip("\n").removesuffix("\r")


# csv's default refuses a cell over 128 KiB ("field larger than field limit"); a long document in one
# cell is a normal input, which the task then truncates or reads in windows.
MAX_CELL_CHARS = 2**31 - 1
csv.field_size_limit(MAX_CELL_CHARS)


def _delimited_rows(path: Path, delimiter: str) -> Iterator[Row]:
    lines = _text_lines(path)
    numbers: list[int] = []  # the line number of each line handed to the csv reader, in order

    def feed() -> Iterator[str]:
        for number, text in lines:
            numbers.append(number)
            yield text + "\n"

    reader = csv.reader(feed(), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        raise DataFormatError(path, numbers[-1] if numbers else 1, None, f"not a readable header ({exc})") from None
    header = [name.strip() for name in header]
    for fields in _located(reader, path, numbers):
        # reader.line_num counts the lines consumed so far: the record began after the previous one ended
        start = numbers[-1] - _record_lines(fields) + 1 if numbers else 0
        if not fields or (len(fields) == 1 and not fields[0] and len(header) > 1):
            continue  # a blank line between records
        if len(fields) != len(header):
            raise DataFormatError(path, start, None, f"{len(fields)} fields where the header has "
                                                     f"{len(header)} ({', '.join(header)})")
        yield Row(start, dict(zip(header, fields, strict=True)))


def _located(reader: Iterator[list[str]], path: Path, numbers: list[int]) -> Iterator[list[str]]:
    """The csv reader's records, its errors (an unclosed quote, a cell past the size limit) as
    `DataFormatError`s naming the line."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataFormatError(path, numbers[-1] if numbers else None, None, f"not readable CSV ({exc})") from None


def _record_lines(fields: Sequence[str]) -> int:
    """How many physical lines a parsed CSV record spanned (quoted fields may hold line breaks)."""
    return 1 + sum(field.count("\n") for field in fields)


def _jsonl_rows(path: Path) -> Iterator[Row]:
    for number, text in _text_lines(path):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, number, None, f"not a JSON record ({exc.msg} at column {exc.colno})") \
                from None
        except RecursionError:
            raise DataFormatError(path, number, None, "a JSON record nested too deeply to read") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, number, None,
                                  f"a JSONL row must be a JSON object, not {type(record).__name__}")
        yield Row(number, record)


def _parquet_rows(path: Path, batch_rows: int) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFormatError(path, None, None, f"not a Parquet file ({exc})") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=batch_rows):
        for values in batch.to_pylist():
            number += 1
            yield Row(number, values)


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
@contextmanager
def write_rows(path: str | Path, always: Sequence[str] = ()) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A function that writes one row to `path` (.jsonl, or .csv/.tsv whose header is the first row's keys,
    then the `always` columns it lacks: a column only some rows have, such as an error message).

    Rows stream to a temporary file beside `path`, which replaces `path` only when the block completes.
    In CSV a list or dict value is written as its JSON text.
    """
    path = Path(path)
    try:
        fmt: str | None = detect_format(path, WRITE_FORMATS, read=False)
    except DataFormatError:
        fmt = None
    if fmt is None or compression_of(path):
        raise ValueError(f"{path}: predictions are written as .jsonl, .csv or .tsv")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
        if fmt == "jsonl":
            yield lambda row: handle.write(_json_row(row, path) + "\n")
        else:
            yield _csv_writer(handle, "," if fmt == "csv" else "\t", always)


def _json_row(row: dict[str, Any], path: Path) -> str:
    """A row as JSON; a NaN or infinity (a model whose weights or config went wrong) is refused rather
    than written as JSON no reader accepts."""
    try:
        return json.dumps(row, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise ValueError(f"{path}: a prediction is not a finite number ({row}); the model's outputs are NaN or "
                         "infinite: check its config.json (layer_norm_eps, ...) and weights") from None


def _csv_writer(handle: io.TextIOBase, delimiter: str, always: Sequence[str] = ()) -> Callable[[dict[str, Any]], None]:
    writer = csv.writer(handle, delimiter=delimiter)
    header: list[str] = []

    def write(row: dict[str, Any]) -> None:
        if not header:
            header.extend([*row, *(name for name in always if name not in row)])
            writer.writerow(header)
        _json_row(row, Path(getattr(handle, "name", "<rows>")))  # the same check: no NaN in a file
        writer.writerow([_cell(row.get(name)) for name in header])

    return write


def _cell(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else value


def write_all(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write every row of `rows` (see `write_rows`)."""
    with write_rows(path) as write:
        for row in rows:
            write(row)
