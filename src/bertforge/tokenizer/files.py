"""Reading a tokenizer's files: vocab.txt, the JSON configuration files and tokenizer.json, each failure
one line naming the file (and the line where there is one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from bertforge.tokenizer.layouts import TokenizerFileError


def read_vocab_file(path: Path) -> dict[str, int]:
    """vocab.txt: one token per line, the id is the line number (0-based), as Hugging Face reads it."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise TokenizerFileError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); "
                                 "a vocab.txt holds one token per line") from None
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    vocab: dict[str, int] = {}
    for index, token in enumerate(lines):
        if token in vocab:
            raise ValueError(
                f"{path}:{index + 1}: duplicate token {token!r} (first seen on line {vocab[token] + 1}); "
                "every line of a vocab file must be a distinct token"
            )
        vocab[token] = index
    return vocab


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a tokenizer file, {} when the file is absent; anything else is one line
    naming the file."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise TokenizerFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TokenizerFileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(value, dict):
        raise TokenizerFileError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_backend(path: Path) -> BackendTokenizer:
    try:
        return BackendTokenizer.from_file(str(path))
    except Exception as exc:  # the library's errors carry no type of their own
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerFileError(f"{path}: not a tokenizers tokenizer.json ({first})") from None


def model_max_length_of(config: dict[str, Any]) -> int:
    limit = config.get("model_max_length")
    # transformers writes a huge sentinel when the limit is unknown: keep BERT's 512 then
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else 512


def to_json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def special_token_value(value: Any) -> str:
    # tokenizer_config.json stores special tokens either as plain strings or as serialised AddedTokens.
    return value["content"] if isinstance(value, dict) else str(value)
