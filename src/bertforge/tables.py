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
- A TSV file is read as its format (IANA text/tab-separated-values) defines it: a line is a row, a tab
  separates cells, and a `"` is a character like any other, as google-research/bert's GLUE readers
  and pandas' `read_csv(sep="\t", quoting=csv.QUOTE_NONE)` read it. A CSV file is RFC 4180: a quoted
  cell may hold the delimiter, doubled quotes and line breaks, so one record may span lines. A TSV
  whose cells are mostly wrapped in quotes gets a warning naming `--quoting`, which reads TSV files
  with CSV's quoting instead (`table_reading(tsv_quoting=True)`, or `iter_rows(..., quoting=True)`).
- Rows in equals rows out: a reader skips only blank lines, and within `table_reading(notify=...)`
  each file read to its end is reported once as a `TableRead` (rows, records that span lines, blank
  lines skipped), which every command that reads your files prints.
- The parsers are the standard library's `csv` and `json` (exact line numbers) and pyarrow for
  Parquet; a TSV line is cut at its tabs. CSV and TSV values are strings; JSONL and Parquet values keep
  their types.

`write_rows` is the other direction: predictions to .jsonl or .csv, streamed to a temporary file that
replaces the target in one rename when complete, so a crash never leaves half a file.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
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


@dataclass(frozen=True)
class TableRead:
    """What reading one file to its end gave, for the line a command prints about it."""

    path: Path
    fmt: str
    rows: int
    spanning: int = 0  # records over more than one line: quoted line breaks (CSV, or TSV with quoting)
    blank_lines: int = 0  # skipped, the one thing a reader leaves out
    quoting: bool = False  # whether a quote delimits a cell (CSV always, TSV only when asked)

    def describe(self) -> str:
        """`read reviews.tsv: 300 rows (TSV, a quote is a character)`, with what else the reader did."""
        notes = {"tsv": "TSV with CSV quoting" if self.quoting else "TSV, a quote is a character",
                 "csv": "CSV", "jsonl": "JSON lines", "parquet": "Parquet", "lines": "one row per line"}
        parts = [notes[self.fmt]]
        if self.spanning:
            parts.append(f"{self.spanning} {'record spans' if self.spanning == 1 else 'records span'} "
                         "several lines (line breaks inside quotes)")
        if self.blank_lines:
            parts.append(f"{self.blank_lines} blank line{'s' * (self.blank_lines != 1)} skipped")
        return f"read {self.path}: {self.rows} row{'s' * (self.rows != 1)} ({'; '.join(parts)})"


class QuotedTsvWarning(UserWarning):
    """A TSV file whose cells look wrapped in quotes, read with the quotes as characters."""


@dataclass
class _Reading:
    tsv_quoting: bool = False
    notify: Callable[[str], None] | None = None
    reported: set[tuple[str, str]] = field(default_factory=set)


_READING: ContextVar[_Reading | None] = ContextVar("bertforge_table_reading", default=None)


def _reading() -> _Reading:
    return _READING.get() or _Reading()


@contextmanager
def table_reading(*, tsv_quoting: bool = False, notify: Callable[[str], None] | None = None) -> Iterator[None]:
    """How `iter_rows` reads within the block: TSV files with CSV quoting when `tsv_quoting` (the
    `--quoting` option); `notify` receives one line per file read to its end (`TableRead.describe`,
    once per file) and each warning, as `warning: ...` (without `notify` warnings go to `warnings`)."""
    token = _READING.set(_Reading(tsv_quoting, notify))
    try:
        yield
    finally:
        _READING.reset(token)


@contextmanager
def tsv_quoting(on: bool) -> Iterator[None]:
    """Within the block, TSV files are read with CSV quoting when `on` (a run's recorded `quoting`
    setting); what `table_reading` set up around it (who is told of each file) stays."""
    token = _READING.set(replace(_reading(), tsv_quoting=on))
    try:
        yield
    finally:
        _READING.reset(token)


@dataclass
class _Tally:
    spanning: int = 0
    blank_lines: int = 0


def iter_rows(path: str | Path, columns: Sequence[str] = (), *, fmt: str | None = None,
              batch_rows: int = 1024, quoting: bool | None = None) -> Iterator[Row]:
    """The rows of `path`, streamed, each checked to have every column in `columns`.

    `fmt` overrides the format `table_format` decides. `quoting` is for TSV files: True reads quoted
    cells as CSV does, False reads a quote as a character; None (the default) takes `table_reading`'s
    setting, off unless asked. Raises `DataFormatError` (file, line, field) for a missing column, an
    empty file, bytes that are not UTF-8, bad JSON or a row with the wrong number of fields; a missing
    file raises FileNotFoundError before anything is read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt = fmt or table_format(path)
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; one of {', '.join(TABLE_FORMATS)}")
    tsv_quoting = _reading().tsv_quoting if quoting is None else quoting
    tally = _Tally()
    readers: dict[str, Callable[[], Iterator[Row]]] = {
        "csv": lambda: _delimited_rows(path, ",", tally),
        "tsv": lambda: _delimited_rows(path, "\t", tally) if tsv_quoting else _tsv_rows(path, tally),
        "jsonl": lambda: _jsonl_rows(path, tally),
        "parquet": lambda: _parquet_rows(path, batch_rows),
        "lines": lambda: (Row(number, {LINES_COLUMN: text}) for number, text in _text_lines(path)),
    }
    rows = 0
    for row in readers[fmt]():
        if not rows or fmt == "jsonl":  # a JSON record may lack a key its predecessors had
            _check_columns(path, row, columns, fmt)
        rows += 1
        yield row
    if not rows:
        raise DataFormatError(path, None, None, "empty file: no rows")
    _report(TableRead(path, fmt, rows, tally.spanning, tally.blank_lines, fmt == "csv" or (fmt == "tsv" and tsv_quoting)))


def _report(read: TableRead) -> None:
    """Tell `table_reading`'s `notify` about a file read to its end, once per file and format."""
    reading = _reading()
    key = (str(read.path), read.fmt)
    if reading.notify is None or key in reading.reported:
        return
    reading.reported.add(key)
    reading.notify(read.describe())


def _warn(message: str) -> None:
    notify = _reading().notify
    if notify is None:
        warnings.warn(message, QuotedTsvWarning, stacklevel=4)
    else:
        notify(f"warning: {message}")


def read_rows(path: str | Path, columns: Sequence[str] = (), *, fmt: str | None = None,
              quoting: bool | None = None) -> list[Row]:
    """All rows of `path` in a list: for training and dev files, which are read whole anyway."""
    return list(iter_rows(path, columns, fmt=fmt, quoting=quoting))


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


def _tsv_rows(path: Path, tally: _Tally) -> Iterator[Row]:
    """A TSV file as its format defines it: each line a row, cut at its tabs; a quote is a character."""
    header: list[str] | None = None
    looks = _QuoteLook(path)
    for number, text in _text_lines(path):
        if not text:  # a blank line, before the header or between rows
            if header is not None:
                tally.blank_lines += 1
            continue
        fields = text.split("\t")
        looks.see(fields)
        if header is None:
            header = _header(path, number, fields)
            continue
        if len(fields) != len(header):
            raise _width_error(path, number, fields, header, "tsv")
        yield Row(number, dict(zip(header, fields, strict=True)))
    looks.decide()


class _QuoteLook:
    """Whether a TSV read without quoting looks written with it: most of its first lines hold a cell
    wrapped in double quotes. Decided once, after `LINES` lines or at the end of the file."""

    LINES = 100

    def __init__(self, path: Path) -> None:
        self.path, self.seen, self.quoted, self.decided = path, 0, 0, False

    def see(self, fields: Sequence[str]) -> None:
        if self.decided:
            return
        self.seen += 1
        self.quoted += any(len(cell) >= 2 and cell[0] == cell[-1] == '"' for cell in fields)
        if self.seen >= self.LINES:
            self.decide()

    def decide(self) -> None:
        if self.decided:
            return
        self.decided = True
        if self.seen and self.quoted * 2 > self.seen:
            _warn(f"{self.path}: {self.quoted} of its first {self.seen} lines have cells wrapped in double quotes; "
                  "a TSV file has no quoting, so the quotes are read as part of the text. If the file was "
                  "written with CSV-style quoting, read it with --quoting")


# csv's default refuses a cell over 128 KiB ("field larger than field limit"); a long document in one
# cell is a normal input, which the task then truncates or reads in windows.
MAX_CELL_CHARS = 2**31 - 1
csv.field_size_limit(MAX_CELL_CHARS)


def _delimited_rows(path: Path, delimiter: str, tally: _Tally) -> Iterator[Row]:
    """A CSV file by RFC 4180 (or a TSV file with `--quoting`): a quoted cell may hold the delimiter, doubled
    quotes and line breaks, so a record may span lines (`Row.number` is the line where it starts)."""
    lines = _text_lines(path)
    numbers: list[int] = []  # the line number of each line handed to the csv reader, in order

    def feed() -> Iterator[str]:
        for number, text in lines:
            numbers.append(number)
            yield text + "\n"

    fmt = "csv" if delimiter == "," else "tsv"
    records = _located(csv.reader(feed(), delimiter=delimiter), path, numbers)
    header: list[str] | None = None
    for fields in records:
        # the record ended on the last line read, and began as many lines before as it holds line breaks
        lines_spanned = _record_lines(fields)
        start = numbers[-1] - lines_spanned + 1
        if not fields:  # a blank line, before the header or between records (`""` is a row: one empty cell)
            tally.blank_lines += header is not None
            continue
        if header is None:
            header = _header(path, start, fields)
            continue
        if len(fields) != len(header):
            raise _width_error(path, start, fields, header, fmt)
        tally.spanning += lines_spanned > 1
        yield Row(start, dict(zip(header, fields, strict=True)))


def _header(path: Path, line: int, fields: Sequence[str]) -> list[str]:
    """The column names of a header line; one named twice is refused (a row could hold only one of its values)."""
    header = [name.strip() for name in fields]
    for position, name in enumerate(header):
        if name in header[:position]:
            raise DataFormatError(path, line, name, f"a column named twice in the header (columns "
                                                    f"{header.index(name) + 1} and {position + 1}); rename one")
    return header


def _width_error(path: Path, line: int, fields: Sequence[str], header: Sequence[str], fmt: str) -> DataFormatError:
    """A row with more or fewer fields than the header, naming the first field missing or extra."""
    width = f"{len(fields)} fields where the header has {len(header)} ({', '.join(header)})"
    if len(fields) < len(header):
        field_name, what = header[len(fields)], f"missing: {width}"
    else:
        extra = fields[len(header)]
        field_name = f"field {len(header) + 1}"
        what = f"one too many ({extra[:40]!r}{'...' if len(extra) > 40 else ''}): {width}"
    if fmt == "csv" and len(fields) == 1 and "\t" in fields[0]:
        what += "; the row holds tabs: a tab-separated file is read as TSV when it is named .tsv"
    elif fmt == "tsv" and any('"' in cell for cell in fields):
        what += "; with --quoting a double quote opens a quoted cell (without it, a quote is a character)"
    return DataFormatError(path, line, field_name, what)


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


def _jsonl_rows(path: Path, tally: _Tally) -> Iterator[Row]:
    for number, text in _text_lines(path):
        if not text.strip():
            tally.blank_lines += 1
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
    """CSV rows by RFC 4180 (quoted where needed); TSV rows without quoting, as TSV is read (`_tsv_rows`)."""
    name = str(getattr(handle, "name", "<rows>"))
    header: list[str] = []
    if delimiter == ",":
        line = csv.writer(handle).writerow
    else:
        def line(values: Sequence[Any]) -> None:
            handle.write("\t".join(_tsv_cell(value, name, header[i] if header else "header")
                                   for i, value in enumerate(values)) + "\n")

    def write(row: dict[str, Any]) -> None:
        if not header:
            names = [*row, *(column for column in always if column not in row)]
            line(names)
            header.extend(names)
        _json_row(row, Path(name))  # the same check: no NaN in a file
        line([_cell(row.get(column)) for column in header])

    return write


def _tsv_cell(value: Any, name: str, column: str) -> str:
    """A value as a TSV cell: its text, quotes included. A tab or line break, which no TSV cell can hold
    (a line is a row, a tab ends a cell), is refused rather than written as another table."""
    text = "" if value is None else str(value)
    if "\t" in text or "\n" in text or "\r" in text:
        raise ValueError(f"{name}: {column}: {text[:40]!r} holds a tab or a line break, which a TSV cell cannot "
                         "(TSV has no quoting); write the rows as .csv or .jsonl instead")
    return text


def _cell(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else value


def write_all(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write every row of `rows` (see `write_rows`)."""
    with write_rows(path) as write:
        for row in rows:
            write(row)
