"""What a user's file holds: the one place that decides a file's format, for every reader of users' files.

Each reader says which formats it reads, in its order of preference, and asks `detect_format`:

    detect_format("train.json", ("json", "jsonl", "parquet"))   # qa: "json" for SQuAD's {"data": [...]}

The answer is one of the formats in `accept`, or a `DataFormatError` of one line that names the file,
what it holds and the formats expected:

    notes.csv: a .csv file is CSV; expected plain lines (.txt or any other name), JSON lines (.jsonl, .ndjson, .json) or Parquet (.parquet)

1. The name. A compression suffix (.gz, .bz2, .xz, .zst) is looked through, as `fileio.strip_compression`
   does, and the suffix left names the formats that claim it (`Format.suffixes`). A name that no format
   claims, or one claimed only by text formats (`.txt`), is text: plain lines, or a column file where the
   caller reads those; a caller that reads no text format looks at the content instead (a SQuAD file
   named `train.txt` is still read as SQuAD JSON).
2. The content, where the name leaves a choice between formats that have a content test
   (`Format.looks_like`): `.json` is a JSON document (SQuAD's `{"data": [...]}`, a list) or JSON lines.
   The first non-blank line tells: a value that goes on below it, or that is the whole file, is a
   document; a complete object followed by more lines is JSON lines. An empty file is (empty) JSON lines.
3. Compression: a format that cannot be read compressed (Parquet, a JSON document, column files) is
   refused when the name says it is compressed.

A new format is one `register(Format(...))` line below, plus a reader in the callers that accept it
(`tables.iter_rows` for rows, `data.sources` for corpora).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bertforge.fileio import (
    DataFormatError,
    NotUtf8Error,
    compression_of,
    decode_utf8,
    open_binary,
    strip_compression,
)

__all__ = ["FORMATS", "Format", "Head", "detect_format", "expected", "named_formats", "read_head", "register"]


@dataclass(frozen=True)
class Head:
    """The start of a file, for content tests: its first non-blank line (a BOM, the line ending and the
    surrounding space dropped; "" for an empty file) and whether another non-blank line follows."""

    first: str
    more: bool


@dataclass(frozen=True)
class Format:
    """One file format: its name (what callers accept), how messages name it, the suffixes that announce it.

    `text`: also what a name no format claims holds (plain text of some kind). `compressible`: the readers
    decompress it on the fly (`fileio.open_binary`); if not, `why_uncompressed` says why, for the error.
    `looks_like`: a test of the file's start, used where the name leaves a choice (`.json`).
    """

    name: str
    label: str
    suffixes: tuple[str, ...] = ()
    text: bool = False
    compressible: bool = True
    why_uncompressed: str = ""
    looks_like: Callable[[Head], bool] | None = None

    def describe(self) -> str:
        """"CSV (.csv)", "plain lines (.txt or any other name)": the label with the names that announce it."""
        names = ", ".join(self.suffixes)
        if self.text:
            names = f"{names} or any other name" if names else "any name"
        return f"{self.label} ({names})" if names else self.label


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add `fmt` to `FORMATS` (the order of registration is the order messages list formats in)."""
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    return fmt


# ------------------------------------------------------------------------------------------------
# content tests
# ------------------------------------------------------------------------------------------------
def _first_value(line: str) -> str:
    """How the JSON on a first line stands: "complete" (one whole value), "continues" (cut off at the line's
    end: a document that goes on below), "broken" (a syntax error inside the line) or "none" (not JSON)."""
    if not line.startswith(("{", "[")):
        return "none"
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return "continues" if exc.pos >= len(line) else "broken"
    except (RecursionError, ValueError):
        return "broken"
    return "complete"


def _is_json_document(head: Head) -> bool:
    state = _first_value(head.first)
    return state == "continues" or (state in ("complete", "broken") and not head.more)


def _is_json_lines(head: Head) -> bool:
    return not head.first or (head.first.startswith("{") and _first_value(head.first) in ("complete", "broken"))


# ------------------------------------------------------------------------------------------------
# the formats: one line each
# ------------------------------------------------------------------------------------------------
register(Format("csv", "CSV", (".csv",)))
register(Format("tsv", "TSV", (".tsv",)))
register(Format("jsonl", "JSON lines", (".jsonl", ".ndjson", ".json"), looks_like=_is_json_lines))
register(Format("json", "a JSON document", (".json",), compressible=False, looks_like=_is_json_document))
register(Format("parquet", "Parquet", (".parquet",), compressible=False,
                why_uncompressed="a Parquet file compresses its own columns"))
register(Format("lines", "plain lines", (".txt",), text=True))
register(Format("columns", "column files", (".txt", ".tsv", ".conll"), text=True, compressible=False))


# ------------------------------------------------------------------------------------------------
# deciding
# ------------------------------------------------------------------------------------------------
def named_formats(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The formats whose suffixes `path`'s name carries (compression looked through); () for a name that no
    format claims."""
    suffix = strip_compression(path).suffix.lower()
    return tuple(f.name for f in FORMATS.values() if suffix and suffix in f.suffixes)


def expected(accept: Sequence[str]) -> str:
    """"CSV (.csv), TSV (.tsv) or Parquet (.parquet)": the formats of `accept`, for a message."""
    names = [FORMATS[name].describe() for name in accept]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def detect_format(path: str | os.PathLike[str], accept: Sequence[str], *, read: bool = True) -> str:
    """The format of `path`: the first of `accept` (format names, in the caller's order of preference) that
    its name and, where the name leaves a choice, its content allow (see the module docstring).

    `read=False` decides by the name alone (for a file still to be written, or to pick files by name): a
    name that leaves a choice raises instead. Raises `DataFormatError` (one line: the file, what it holds,
    the formats expected) when no format of `accept` fits, and FileNotFoundError when the content must be
    read and the file does not exist.
    """
    accept = tuple(accept)
    unknown = [name for name in accept if name not in FORMATS]
    if unknown or not accept:
        raise ValueError(f"unknown format {unknown[0] if unknown else None!r}; one of {', '.join(FORMATS)}")

    def fail(found: str, line: int | None = None) -> DataFormatError:
        return DataFormatError(path, line, None, f"{found}; expected {expected(accept)}")

    suffix = strip_compression(path).suffix.lower()
    claimants = [FORMATS[name] for name in named_formats(path)]
    wanted = [FORMATS[name] for name in accept if name in named_formats(path)]
    if not wanted:
        if any(not f.text for f in claimants):
            raise fail(f"a {suffix} file is {' or '.join(f.label for f in claimants)}")
        # the name says text of some kind, or nothing: the caller's text format, else look at the content
        wanted = ([FORMATS[name] for name in accept if FORMATS[name].text]
                  or [FORMATS[name] for name in accept if FORMATS[name].looks_like])
        if not wanted:
            raise fail(f"a {suffix} file is text" if suffix else "a file without a suffix is text")
    decided_by_name = len(wanted) == 1 and [f.name for f in claimants] == [wanted[0].name]
    if not decided_by_name and any(f.looks_like for f in wanted):
        if not read:
            raise fail(f"a {suffix or 'suffix-less'} file may be {' or '.join(f.label for f in wanted)}: "
                       "its name alone does not say which")
        try:
            head = read_head(path)
        except NotUtf8Error as exc:
            raise fail(f"not UTF-8 text ({exc.detail})", exc.line) from None
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such file") from None
        except Exception as exc:  # a corrupt compressed stream, a directory, no permission: unreadable
            raise fail(f"cannot be read ({str(exc) or type(exc).__name__})") from None
        wanted = [f for f in wanted if f.looks_like is None or f.looks_like(head)]
        if not wanted:
            raise fail(_held(head))
    if compression_of(path):
        readable = [f for f in wanted if f.compressible]
        if not readable:
            fmt = wanted[0]
            why = f" ({fmt.why_uncompressed})" if fmt.why_uncompressed else ""
            raise DataFormatError(path, None, None, f"{fmt.label} cannot be read compressed{why}: give the "
                                                    f"{strip_compression(path).name} file itself, not a compressed copy")
        wanted = readable
    return wanted[0].name


def _held(head: Head) -> str:
    """What a file whose start is `head` holds, in words, for a message."""
    if not head.first:
        return "it is empty"
    held = [f.label for f in FORMATS.values() if f.looks_like and f.looks_like(head)]
    if held:
        return f"it holds {' or '.join(held)}"
    tested = [f.label for f in FORMATS.values() if f.looks_like]
    start = head.first if len(head.first) <= 40 else head.first[:40] + "..."
    return f"it starts {start!r}, which is neither {' nor '.join(tested)}"


def read_head(path: str | os.PathLike[str]) -> Head:
    """The first non-blank line of `path` (decompressed; a BOM dropped) and whether another follows.

    Raises `fileio.NotUtf8Error` when that line is not UTF-8, and the opener's errors when the file (or its
    compressed stream) cannot be read.
    """
    first = ""
    with open_binary(Path(path)) as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if first:
                return Head(first, True)
            text = decode_utf8(raw, path, number)
            first = (text.removeprefix("\ufeff") if number == 1 else text).strip()
    return Head(first, False)
