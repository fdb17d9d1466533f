"""Small file helpers shared by every module: atomic writes, so a crash never leaves half a file; UTF-8
decoding whose error names the file, the line and the byte, which every reader turns into its own error type;
`DataFormatError`, the located error of every reader of users' files; and streaming decompression by suffix.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file so that a crash leaves either the old file or the new one, never half of one."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename.

    For writers that want a file name rather than bytes (safetensors, torch.save, numpy).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DataFormatError(ValueError):
    """Input that a reader cannot use, located as `file:line: field: what is wrong`.

    `line` is 1-based (None when the problem is not on one line); `field` names the column, key or
    JSON path concerned (None when the whole line is at fault).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


# ------------------------------------------------------------------------------------------------
# reading UTF-8
# ------------------------------------------------------------------------------------------------
class NotUtf8Error(ValueError):
    """Bytes that are not UTF-8, located: `path:line: not UTF-8 text (b'\\xe9' at byte 4 of the line)`.

    `line` is 1-based, `byte` the 1-based position in that line, `offset` the 0-based position in the
    bytes decoded, `bad` the offending bytes; `detail` is the parenthesised part, for callers that word
    their own message around it.
    """

    def __init__(self, path: str | os.PathLike[str], line: int, byte: int, offset: int, bad: bytes) -> None:
        self.path, self.line, self.byte, self.offset, self.bad = str(path), line, byte, offset, bad
        self.detail = f"{bad!r} at byte {byte} of the line"
        super().__init__(f"{self.path}:{line}: not UTF-8 text ({self.detail})")


def decode_utf8(data: bytes, path: str | os.PathLike[str], first_line: int = 1) -> str:
    """`data`, read from `path` and starting at its line `first_line`, as text (a BOM stays: U+FEFF).

    Bytes that are not UTF-8 raise `NotUtf8Error` naming the file, the line and the byte.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise NotUtf8Error(path, first_line + data.count(b"\n", 0, exc.start), exc.start - line_start + 1,
                           exc.start, data[exc.start:exc.end]) from None


def read_utf8_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a UTF-8 file without their endings, split on "\\n" only (a stray \\x1c or \\u2028 inside
    a sentence stays in it) and without a trailing "\\r"; a BOM at the start is dropped. Bytes that are
    not UTF-8 raise `NotUtf8Error`, located."""
    lines = decode_utf8(Path(path).read_bytes(), path).removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# ------------------------------------------------------------------------------------------------
# compressed inputs
# ------------------------------------------------------------------------------------------------
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def compression_of(path: str | os.PathLike[str]) -> str | None:
    """The compression a file's name announces ("gz", "bz2", "xz", "zst") or None for a plain file."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in COMPRESSED_SUFFIXES else None


def strip_compression(path: str | os.PathLike[str]) -> Path:
    """`corpus.jsonl.gz` -> `corpus.jsonl`: the name whose suffix says the format inside."""
    path = Path(path)
    return path.with_suffix("") if compression_of(path) else path


def open_binary(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading bytes, decompressed on the fly when its suffix says so (.gz, .bz2, .xz,
    .zst); a streaming reader, so a large file is never held whole in memory."""
    kind = compression_of(path)
    if kind == "gz":
        import gzip
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "bz2":
        import bz2
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if kind == "xz":
        import lzma
        return lzma.open(path, "rb")  # type: ignore[return-value]
    if kind == "zst":
        import io

        import zstandard
        # zstandard's reader has no readline: buffer it as the standard library's readers are
        return io.BufferedReader(zstandard.open(path, "rb"), 1 << 16)  # type: ignore[arg-type]
    return open(path, "rb")
