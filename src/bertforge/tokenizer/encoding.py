"""What encoding gives: one text's `Encoding` (ids, tokens, offsets, word ids), a batch of them as
`BatchEncoding` (the model's inputs as items, as transformers' is), BERT's truncation of a pair, and
the checks on what is given to encode."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Encoding:
    """One encoded text, or text pair, with everything needed to map tokens back to characters."""

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]  # (start, end) chars into the original text of the token's segment
    word_ids: list[int | None]  # word index within the segment; None for special and padding tokens
    sequence_ids: list[int | None]  # 0 = text, 1 = pair; None for special and padding tokens

    def __len__(self) -> int:
        return len(self.input_ids)


class BatchEncoding(dict):
    """What `encode_batch` and a tokenizer call return: the model's inputs (input_ids, token_type_ids,
    attention_mask) as the items, so `model(**batch)` works as with transformers, and one `Encoding` per
    text (tokens, offsets, word ids) as `.encodings`, also read as `batch["encodings"]`."""

    def __init__(self, data: dict[str, Any], encodings: list[Encoding]) -> None:
        super().__init__(data)
        self.encodings = encodings

    def __getitem__(self, key: str) -> Any:
        if key == "encodings" and not dict.__contains__(self, key):
            return self.encodings
        return dict.__getitem__(self, key)

    def to(self, device: Any) -> BatchEncoding:
        """The tensors moved to `device` (torch), as transformers' BatchEncoding.to does."""
        moved = {key: value.to(device) if hasattr(value, "to") else value for key, value in self.items()}
        return BatchEncoding(moved, self.encodings)


def pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of each segment survive BERT's pair truncation to `budget` tokens in all.

    BERT pops one token at a time from the longer segment, from the second on a tie. Written out:
    a segment no longer than half the budget is kept whole and the other gets the rest; otherwise
    both end at half, the first taking the odd token.
    """
    if len_a + len_b <= budget:
        return len_a, len_b
    if 2 * min(len_a, len_b) <= budget:
        return (len_a, budget - len_a) if len_a <= len_b else (budget - len_b, len_b)
    return (budget + 1) // 2, budget // 2


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_text(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"BertTokenizer: {what} must be a str, got {type(value).__name__}: {value!r:.80}")


def surrogate_error(texts: Iterable[str]) -> ValueError:
    # tokenizers refuses lone surrogates (they are not valid Unicode) with a bare "TypeError: ... must be
    # str"; find the culprit so the message says what is actually wrong.
    for text in texts:
        for i, ch in enumerate(text):
            if 0xD800 <= ord(ch) <= 0xDFFF:
                return ValueError(
                    f"BertTokenizer: text contains a lone surrogate {ch!r} at character {i}; "
                    "it is not valid Unicode (decode the source with errors='replace')"
                )
    return ValueError("BertTokenizer: the tokenizers library rejected the input text")
