"""Reading pre-training text: documents, sentences, Gutenberg headers, and the split of the input into shards.

Input files, told apart by their names (:func:`bertforge.data.sources.input_kind`):

* **text** (`.txt`, or any name not listed below), read as a stream of lines;
* **compressed text** (`.txt.gz`, `.bz2`, `.xz`, `.zst`), decompressed as it is read
  (`fileio.open_binary`);
* **records**: JSON lines (`.jsonl`, `.ndjson`, `.json`, plain or compressed) and Parquet (`.parquet`),
  one document per record, read by :mod:`bertforge.data.records`.

Two layouts of the text (of a text file, or of each record):

* **BERT layout** (the default): one sentence per line, a blank line between documents, as the
  paper's pre-training data was prepared.
* **plain text** (`plain_text=True`): running prose. Lines are joined into paragraphs (a blank line
  ends a paragraph) and paragraphs are split into sentences by :func:`split_sentences`. A run of
  `SECTION_BLANK_LINES` (3) or more blank lines ends a *document*: books set chapters and sections
  apart that way (Project Gutenberg's layout), so a single book still has documents to draw NotNext
  partners from; a file without such breaks is one document.

Everything streams: a file is read line by line and handed on in *blocks* of at most
`block_sentences` sentences, so memory stays bounded by the block size whatever the size of a file
or of the corpus. A long document is several blocks that share one `doc_key`.

Which files, and the cut of the input into shards and parts, are :mod:`bertforge.data.sources`' part.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.fileio import (
    NotUtf8Error,
    compression_of,
    decode_utf8,
    open_binary,
)

__all__ = [
    "DataError",
    "InputRange",
    "ReadStats",
    "TextBlock",
    "find_gutenberg_body",
    "next_blank_line",
    "next_document_start",
    "next_line_start",
    "count_newlines",
    "hard_split",
    "read_blocks",
    "split_sentences",
]

BAD_BYTES_POLICIES = ("skip", "replace", "error")
_READ_CHUNK = 1 << 20  # bytes per read when scanning for newlines or cut points
SECTION_BLANK_LINES = 3  # plain text: this many blank lines in a row start a new document
_MAX_PARAGRAPH_CHARS = 200_000  # a "paragraph" longer than this (no blank line for pages) is flushed early
MAX_LOCATIONS = 5  # how many file:line examples each warning keeps
_MAX_LINE_BYTES = 1 << 20  # a longer line is read in pieces (cut at spaces), so memory stays bounded


class DataError(ValueError):
    """Bad input that stops `prepare`: the message names the file (and line when there is one)."""


# ---------------------------------------------------------------------------------------------------
# sentence splitting
# ---------------------------------------------------------------------------------------------------

# Words that end with a full stop inside a sentence. Lower-case, without the stop.
_ABBREVIATION_TEXT = """mr mrs ms messrs mme mlle dr prof rev hon st sr jr gen col maj capt cpt lt sgt cmdr adm gov pres
    sen rep fr br mt ft vs viz cf al approx dept est fig figs vol vols ch chap sec pp ed eds trans
    co corp inc ltd bros jan feb mar apr jun jul aug sep sept oct nov dec e.g i.e a.m p.m u.s u.k"""
_ABBREVIATIONS = frozenset(_ABBREVIATION_TEXT.split())
# "No. 5", "Art. 3": abbreviations only when a number follows.
_NUMBER_ABBREVIATIONS = frozenset(("no", "nos", "art", "p", "op"))

# A candidate boundary: sentence-final punctuation, any closing quotes/brackets/underscores, then space.
_BOUNDARY = re.compile(r"[.!?…]+[\"'”’)\]_*]*\s+")
_WORD_BEFORE = re.compile(r"([\w.]+)[.]$")
_OPENERS = "\"'“‘([_*¿¡"


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences with a small rule set.

    A sentence ends at `.`, `!`, `?` or `…` (then any closing quotes or brackets) followed by white
    space and a capital letter, a digit or an opening quote. Known abbreviations ("Mr.", "Dr.",
    "e.g.", "No. 5") and single-letter initials ("J. R. Tolkien") do not end a sentence. Good enough
    for books and encyclopaedic prose; it errs towards longer sentences, which only costs the NSP
    task a few split points.
    """
    text = " ".join(text.split())
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end()
        if end >= len(text):
            break
        nxt = text[end:end + 3].lstrip(_OPENERS)
        if not nxt or not (nxt[0].isupper() or nxt[0].isdigit()):
            continue
        punct = match.group().rstrip()
        if punct.startswith(".") and not punct.startswith(".."):
            word = _WORD_BEFORE.search(text, max(start, match.start() - 40), match.start() + 1)
            if word is not None:
                token = word.group(1).lower()
                if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                    continue
                if token in _NUMBER_ABBREVIATIONS and nxt[0].isdigit():
                    continue
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def hard_split(text: str, max_chars: int) -> list[str]:
    """Cut an overlong piece of text at white space into pieces of at most `max_chars` characters."""
    pieces = []
    while len(text) > max_chars:
        cut = text.rfind(" ", 0, max_chars)
        if cut <= 0:
            cut = max_chars
        pieces.append(text[:cut].strip())
        text = text[cut:].strip()
    if text:
        pieces.append(text)
    return [p for p in pieces if p]


# ---------------------------------------------------------------------------------------------------
# Project Gutenberg headers and footers
# ---------------------------------------------------------------------------------------------------

_GUTENBERG_START = re.compile(rb"^[ \t]*\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*\n", re.I | re.M)
_GUTENBERG_END = re.compile(rb"^[ \t]*\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG", re.I | re.M)
# The line "End of the Project Gutenberg EBook of ..." that many books carry just before the marker.
_GUTENBERG_END_NOTE = re.compile(rb"^[ \t]*End of (?:the )?Project Gutenberg", re.I | re.M)
_GUTENBERG_SCAN = 1 << 20  # the markers sit in the first and last few kilobytes; look in the first/last MiB


def find_gutenberg_body(path: str | os.PathLike[str]) -> tuple[int, int, list[str]]:
    """Byte range `(start, end)` of a Project Gutenberg book's text without its header and licence.

    The body starts after the `*** START OF THE/THIS PROJECT GUTENBERG EBOOK ... ***` line and ends
    before `*** END OF ...` (or before the "End of the Project Gutenberg EBook of ..." line just above
    it). A missing marker is not an error: the file is used from its start / to its end, with a warning.
    """
    path = Path(path)
    warnings: list[str] = []
    head, tail, tail_start, size = _head_and_tail(path)
    start = 0
    match = _GUTENBERG_START.search(head)
    if match is None:
        warnings.append(f"{path}: no Project Gutenberg START marker found; reading from the first line")
    else:
        start = match.end()
    end = size
    match = _GUTENBERG_END.search(tail)
    if match is None:
        warnings.append(f"{path}: no Project Gutenberg END marker found; reading to the last line")
    else:
        end = tail_start + match.start()
        # the "End of the Project Gutenberg EBook" note a few lines above the marker
        notes = [m for m in _GUTENBERG_END_NOTE.finditer(tail, 0, match.start())
                 if match.start() - m.start() < 2048]
        if notes:
            end = tail_start + notes[0].start()
    if end < start:  # markers in a strange order: take the file whole rather than nothing
        warnings.append(f"{path}: Project Gutenberg END marker before START; reading the whole file")
        start, end = 0, size
    return start, end, warnings


def _head_and_tail(path: Path) -> tuple[bytes, bytes, int, int]:
    """The first and last `_GUTENBERG_SCAN` bytes of a file's (decompressed) text, where the last start,
    and the text's size. A compressed file is decompressed once, as a stream, to find its end."""
    if not compression_of(path):
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(_GUTENBERG_SCAN)
            tail_start = max(0, size - _GUTENBERG_SCAN)
            handle.seek(tail_start)
            return head, handle.read(), tail_start, size
    with open_binary(path) as handle:
        head = handle.read(_GUTENBERG_SCAN)
        previous, last, size = b"", head, len(head)
        while chunk := handle.read(_GUTENBERG_SCAN):
            previous, last, size = last, chunk, size + len(chunk)
    window = (previous + last)[-_GUTENBERG_SCAN:]
    return head, window, size - len(window), size


# ---------------------------------------------------------------------------------------------------
# planning: which byte ranges go into which shard
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputRange:
    """A piece of one input file, in the unit its kind is cut by.

    * text and JSON lines, plain: bytes `[start, end)`, whose first line is line `first_line` (1-based);
    * compressed text or JSON lines: the whole stream from decompressed byte `start` to `end` (-1: to
      the end of the stream);
    * Parquet: row groups `[start, end)`, whose first row is row `first_line` of the file (1-based).

    `size`: bytes on disk the piece stands for, where `end - start` is not that (compressed, Parquet).
    """

    path: str
    file_index: int
    start: int
    end: int
    first_line: int
    kind: str = "text"
    size: int = 0

    @property
    def compressed(self) -> bool:
        return compression_of(self.path) is not None

    @property
    def weight(self) -> int:
        """Bytes on disk: what shards and parts are balanced by."""
        return self.size if self.kind in ("parquet", "csv", "tsv") or self.compressed else self.end - self.start

    def to_json(self) -> list:
        row = [self.path, self.file_index, self.start, self.end, self.first_line]
        return row if self.kind == "text" and not self.size else [*row, self.kind, self.size]

    @classmethod
    def from_json(cls, row: Sequence) -> InputRange:
        path, file_index, start, end, first_line, *rest = row
        kind, size = (str(rest[0]), int(rest[1])) if rest else ("text", 0)
        return cls(str(path), int(file_index), int(start), int(end), int(first_line), kind, size)


def count_newlines(handle, start: int, end: int) -> int:
    handle.seek(start)
    count, left = 0, end - start
    while left > 0:
        chunk = handle.read(min(_READ_CHUNK, left))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def next_blank_line(handle, offset: int, start: int, end: int) -> int:
    """Offset just after the first blank line at or after `offset` (within `[start, end)`), else `end`."""
    if offset <= start:
        return start
    handle.seek(offset - 1)
    if handle.read(1) != b"\n":  # mid-line: skip to the start of the next line
        handle.seek(offset)
        line = handle.readline()
        offset += len(line)
    handle.seek(offset)
    while offset < end:
        line = handle.readline()
        if not line:
            return end
        offset += len(line)
        if not line.strip():
            return min(offset, end)
    return end


def next_line_start(handle, offset: int, start: int, end: int) -> int:
    """Offset of the first line that starts at or after `offset` (within `[start, end)`), else `end`."""
    if offset <= start:
        return start
    handle.seek(offset - 1)
    if handle.read(1) == b"\n":
        return min(offset, end)
    return min(offset + len(handle.readline()), end)


def next_document_start(handle, offset: int, end: int, *, blank_lines: int = 1) -> int | None:
    """Offset of the first line of the next document at or after `offset`, or None before `end`.

    A document starts at a non-blank line that follows `blank_lines` or more blank lines (1 in the BERT
    layout, SECTION_BLANK_LINES in plain text, 0 in JSON lines where every line is one): the same offset
    `read_blocks` uses in a document's key.
    """
    pos = offset
    if offset > 0:
        handle.seek(offset - 1)
        if handle.read(1) != b"\n":  # mid-line: the line is not a candidate
            pos += len(handle.readline())
    handle.seek(pos)
    run = 0
    while pos < end:
        line = handle.readline()
        if not line:
            return None
        if not line.strip():
            run += 1
        elif run >= blank_lines:
            return pos
        else:
            run = 0
        pos += len(line)
    return None


# ---------------------------------------------------------------------------------------------------
# reading blocks of sentences
# ---------------------------------------------------------------------------------------------------


@dataclass
class TextBlock:
    """Up to `block_sentences` consecutive sentences of one document."""

    doc_key: tuple[int, int]  # (file index, byte offset where the document starts): unique in a shard
    sentences: list[str]
    nbytes: int  # input bytes read since the previous block (for MB/s)
    new_document: bool  # the first block of its document
    location: str  # "file:line" of the block's first sentence, for messages


@dataclass
class ReadStats:
    """What reading saw and skipped; merged over shards for `stats.json` and the warnings."""

    documents: int = 0
    sentences: int = 0
    bytes: int = 0
    bad_lines: int = 0
    overlong_lines: int = 0
    bad_line_locations: list[str] = field(default_factory=list)
    overlong_locations: list[str] = field(default_factory=list)
    sentences_per_file: dict[int, int] = field(default_factory=dict)
    bad_records: int = 0  # JSON lines / Parquet: records skipped (see records.py)
    bad_record_locations: list[str] = field(default_factory=list)

    def merge(self, other: ReadStats) -> None:
        self.documents += other.documents
        self.sentences += other.sentences
        self.bytes += other.bytes
        self.bad_lines += other.bad_lines
        self.overlong_lines += other.overlong_lines
        self.bad_line_locations = (self.bad_line_locations + other.bad_line_locations)[:MAX_LOCATIONS]
        self.overlong_locations = (self.overlong_locations + other.overlong_locations)[:MAX_LOCATIONS]
        self.bad_records += other.bad_records
        self.bad_record_locations = (self.bad_record_locations + other.bad_record_locations)[:MAX_LOCATIONS]
        for key, value in other.sentences_per_file.items():
            self.sentences_per_file[key] = self.sentences_per_file.get(key, 0) + value

    def to_json(self) -> dict:
        return {
            "documents": self.documents, "sentences": self.sentences, "bytes": self.bytes,
            "bad_lines": self.bad_lines, "overlong_lines": self.overlong_lines,
            "bad_line_locations": self.bad_line_locations, "overlong_locations": self.overlong_locations,
            "sentences_per_file": {str(k): v for k, v in self.sentences_per_file.items()},
            "bad_records": self.bad_records, "bad_record_locations": self.bad_record_locations,
        }

    @classmethod
    def from_json(cls, data: dict) -> ReadStats:
        stats = cls(**{k: v for k, v in data.items() if k != "sentences_per_file"})
        stats.sentences_per_file = {int(k): v for k, v in data.get("sentences_per_file", {}).items()}
        return stats


def _iter_lines(rng: InputRange, max_line_bytes: int) -> Iterator[tuple[bytes, int, int, bool]]:
    """Yield (raw line, line number, byte offset, part) over the range; an overlong line comes in pieces
    (`part` is true for each piece of such a line).

    A piece of an overlong line ends at a space, so no word and no UTF-8 character is cut. A compressed
    file is read as a stream from its start (`end` -1: to the end of the stream).
    """
    with open_binary(rng.path) as handle:
        end = rng.end
        if rng.compressed:
            _skip(handle, rng.start)
        else:
            handle.seek(rng.start)
        pos, line_no, continuing = rng.start, rng.first_line, False
        pending = b""  # the rest of a line cut short, read again before the file (streams cannot seek back)
        while end < 0 or pos < end:
            limit = max_line_bytes if end < 0 else min(max_line_bytes, end - pos)
            if pending:
                raw, pending = _take_line(pending, limit)
                if not raw.endswith(b"\n") and len(raw) < limit:
                    raw += handle.readline(limit - len(raw))
            else:
                raw = handle.readline(limit)
            if not raw:
                break
            # short of the limit without "\n": the last line of a stream (a plain file's range ends first)
            complete = raw.endswith(b"\n") or (pos + len(raw) >= end if end >= 0 else len(raw) < limit)
            if not complete:
                cut = raw.rfind(b" ")
                if cut > 0:
                    cut += 1
                else:  # no space at all: back off to a UTF-8 character boundary
                    cut = len(raw)
                    while cut > len(raw) - 4 and cut > 1 and (raw[cut - 1] & 0xC0) == 0x80:
                        cut -= 1
                    if cut > 1 and raw[cut - 1] >= 0xC0:
                        cut -= 1
                if cut < len(raw) or pending:
                    pending = raw[cut:] + pending
                    raw = raw[:cut]
            yield raw, line_no, pos, not complete or continuing
            pos += len(raw)
            continuing = not complete
            if complete:
                line_no += 1


def _take_line(buffer: bytes, limit: int) -> tuple[bytes, bytes]:
    """The first line of `buffer` (at most `limit` bytes) and the rest."""
    stop = buffer.find(b"\n", 0, limit)
    stop = min(len(buffer), limit) if stop < 0 else stop + 1
    return buffer[:stop], buffer[stop:]


def _skip(handle, count: int) -> None:
    """Read past the first `count` bytes of a stream (a compressed file's Gutenberg header)."""
    while count > 0:
        chunk = handle.read(min(_READ_CHUNK, count))
        if not chunk:
            return
        count -= len(chunk)


def read_blocks(
    rng: InputRange,
    *,
    plain_text: bool = False,
    block_sentences: int = 256,
    max_line_chars: int = 10_000,
    bad_bytes: str = "skip",
    stats: ReadStats | None = None,
) -> Iterator[TextBlock]:
    """Stream one text range as blocks of sentences (`sources.read_blocks` reads every kind of input).

    Blocks never mix documents. Lines with bytes that are not UTF-8 are skipped (`bad_bytes="skip"`,
    counted with their file:line in `stats`), decoded with U+FFFD (`"replace"`), or stop the run with a
    DataError naming file and line (`"error"`). A line longer than `max_line_chars` (in the BERT layout
    a "sentence" that long means the file is not in that layout) is split into sentences and, if
    still too long, at spaces; it is counted and its location kept.
    """
    if bad_bytes not in BAD_BYTES_POLICIES:
        raise ValueError(f"bad_bytes must be one of {BAD_BYTES_POLICIES}, not {bad_bytes!r}")
    stats = stats if stats is not None else ReadStats()
    if rng.kind != "text":
        raise ValueError(f"{rng.path}: a {rng.kind} range; read it with bertforge.data.sources.read_blocks")
    sentences: list[str] = []
    doc_key = (rng.file_index, rng.start)
    location = f"{rng.path}:{rng.first_line}"
    nbytes = 0
    new_document = True  # the next block is the first of its document
    doc_has_text = False  # the current document has a sentence (counted in stats.documents)
    paragraph: list[str] = []
    paragraph_chars = 0
    paragraph_line = rng.first_line

    def emit() -> TextBlock:
        nonlocal sentences, nbytes, new_document
        block = TextBlock(doc_key, sentences, nbytes, new_document, location)
        stats.sentences += len(sentences)
        per_file = stats.sentences_per_file
        per_file[rng.file_index] = per_file.get(rng.file_index, 0) + len(sentences)
        sentences, nbytes, new_document = [], 0, False
        return block

    def add(new: list[str], line_no: int) -> Iterator[TextBlock]:
        nonlocal location, doc_has_text
        for sentence in new:
            if not sentences:
                location = f"{rng.path}:{line_no}"
            sentences.append(sentence)
            if not doc_has_text:
                doc_has_text = True
                stats.documents += 1
            if len(sentences) >= block_sentences:
                yield emit()

    def flush_paragraph() -> Iterator[TextBlock]:
        nonlocal paragraph, paragraph_chars
        if paragraph:
            text = " ".join(paragraph)
            paragraph, paragraph_chars = [], 0
            yield from add([p for sent in split_sentences(text) for p in hard_split(sent, max_line_chars)],
                           paragraph_line)

    overlong_line_no = bad_line_no = -1
    blank_run = 0  # blank lines in a row just before this line
    for raw, line_no, offset, part in _iter_lines(rng, _MAX_LINE_BYTES):
        nbytes += len(raw)
        stats.bytes += len(raw)
        try:
            line = decode_utf8(raw, rng.path, first_line=line_no)
        except NotUtf8Error as exc:
            if bad_bytes == "error":
                raise DataError(
                    f"{exc.path}:{exc.line}: bytes that are not UTF-8 ({exc.detail}); re-encode the file as "
                    f"UTF-8, or use bad_bytes='skip' or 'replace'"
                ) from None
            if bad_bytes == "replace":
                line = raw.decode("utf-8", errors="replace")
            else:
                if bad_line_no != line_no:
                    bad_line_no = line_no
                    stats.bad_lines += 1
                    if len(stats.bad_line_locations) < MAX_LOCATIONS:
                        stats.bad_line_locations.append(f"{rng.path}:{line_no}")
                continue
        if offset == 0:
            line = line.lstrip("\ufeff")  # byte-order mark
        text = line.strip()
        too_long = part or len(text) > max_line_chars
        if too_long and overlong_line_no != line_no:
            overlong_line_no = line_no
            stats.overlong_lines += 1
            if len(stats.overlong_locations) < MAX_LOCATIONS:
                stats.overlong_locations.append(f"{rng.path}:{line_no}")

        if plain_text:
            if not text:  # a blank line ends a paragraph; several in a row end a document
                yield from flush_paragraph()
                blank_run += 1
                continue
            if blank_run >= SECTION_BLANK_LINES and doc_has_text:
                if sentences:
                    yield emit()
                doc_has_text = False
                new_document = True
                doc_key = (rng.file_index, offset)
            blank_run = 0
            if not paragraph:
                paragraph_line = line_no
            paragraph.append(text)
            paragraph_chars += len(text)
            if paragraph_chars > _MAX_PARAGRAPH_CHARS:
                yield from flush_paragraph()
            continue

        if not text:  # BERT layout: a blank line ends the document
            if sentences:
                yield emit()
            doc_has_text = False
            new_document = True
            continue
        if not doc_has_text:
            doc_key = (rng.file_index, offset)
        if too_long:
            pieces = [p for sent in split_sentences(text) for p in hard_split(sent, max_line_chars)]
            yield from add(pieces, line_no)
        else:
            yield from add([text], line_no)
    if plain_text:
        yield from flush_paragraph()
    if sentences:
        yield emit()
