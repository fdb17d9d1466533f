"""fileio: atomic writes are covered where they are used; here, UTF-8 reading with located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.fileio import NotUtf8Error, decode_utf8, read_utf8_lines
from bertforge.tasks.base import DataFormatError
from bertforge.tasks.squad import load_squad_json
from bertforge.tasks.swag import read_swag


def test_decode_utf8_names_the_file_line_and_byte() -> None:
    with pytest.raises(NotUtf8Error) as caught:
        decode_utf8(b"one\ntwo\nCaf\xe9 au lait\n", "menu.txt")
    error = caught.value
    assert (error.path, error.line, error.byte, error.offset, error.bad) == ("menu.txt", 3, 4, 11, b"\xe9")
    assert str(error) == "menu.txt:3: not UTF-8 text (b'\\xe9' at byte 4 of the line)"
    with pytest.raises(NotUtf8Error, match=r"menu.txt:42: .* at byte 1 of"):  # a piece read from line 42 on
        decode_utf8(b"\xff", "menu.txt", first_line=42)
    assert decode_utf8("\ufeffé".encode(), "x") == "\ufeffé"  # the BOM is the caller's business


def test_read_utf8_lines_splits_on_newlines_only_and_drops_bom_and_cr(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes("\ufeffa\r\nb\x1cc\u2028d\n\ne".encode())
    assert read_utf8_lines(path) == ["a", "b\x1cc\u2028d", "", "e"]
    path.write_bytes(b"")
    assert read_utf8_lines(path) == []


@pytest.mark.parametrize("name, read", [("train.jsonl", read_swag), ("dev.json", load_squad_json)])
def test_json_task_readers_locate_bad_bytes_as_data_format_errors(tmp_path: Path, name: str, read) -> None:
    path = tmp_path / name
    path.write_bytes(b'\xef\xbb\xbf{"data": [],\n "x": "caf\xe9"}\n')
    with pytest.raises(DataFormatError, match=rf"{name}:2: not UTF-8 text \(b'\\xe9' at byte 11 of the line\)"):
        read(path)


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".xz", ".zst"])
def test_open_binary_decompresses_by_suffix(tmp_path, suffix):
    import bz2
    import gzip
    import lzma

    import zstandard

    from bertforge.fileio import open_binary, strip_compression

    writers = {"": open, ".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zst": zstandard.open}
    path = tmp_path / f"corpus.jsonl{suffix}"
    with writers[suffix](path, "wb") as handle:
        handle.write(b'{"text": "caf\xc3\xa9"}\n' * 1000)
    with open_binary(path) as handle:
        assert handle.read() == b'{"text": "caf\xc3\xa9"}\n' * 1000
    assert strip_compression(path).name == "corpus.jsonl"
