"""Masked-LM masking on whole batches with numpy: token, whole-word and span (SpanBERT) selection.

Used twice: by `prepare` for static masking (each instance masked `dupe_factor` times when written)
and by the loader's collator for dynamic masking (RoBERTa: a fresh mask every epoch).

The recipe (BERT paper, section 3.1 and appendix A.1): choose 15% of the tokens that are not special
tokens; of the chosen, replace 80% with `[MASK]`, 10% with a random token and leave 10% unchanged, so
that the model cannot rely on `[MASK]` being present at fine-tuning time; predict all chosen tokens.

Selection works on *units*: a token (default), a whole word (`whole_word`: a word and its `##`
continuation pieces are chosen together), or a span of whole words (`span`: SpanBERT, span lengths
in words drawn from a geometric law with p=0.2 clipped at 10). Units are chosen in random order until
the row's budget is reached; the unit that would cross the budget is taken with the probability that
makes the expected number of chosen tokens exactly the budget. The budget of a row with n maskable
tokens is `floor(0.15 * n + u)`, u uniform in [0, 1): exactly 15% in expectation, however short the row.
The 80/10/10 decision is made once per unit, so a whole word or span is `[MASK]`ed together.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from bertforge.config import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "Masker", "MaskResult", "continuation_flags", "span_length_distribution"]

# How a vocabulary marks where words begin: WordPiece marks the pieces that continue a word ("##"),
# byte-level BPE (RoBERTa, ModernBERT) and SentencePiece (XLM-R, ALBERT, DeBERTa) the pieces that start
# one (a "Ġ" for the space before it, or "▁").
CONTINUATION_PREFIX = "##"
WORD_START_PREFIXES = ("\u0120", "\u2581")


def continuation_flags(vocab: dict[str, int], vocab_size: int, special_ids: tuple[int, ...] = ()) -> np.ndarray:
    """(vocab_size,) bool: which pieces continue the word before them, for whole-word and span masking.

    A vocabulary with "##" pieces is WordPiece: those continue a word. Otherwise, where pieces carry a
    word-start mark ("\u0120" in byte-level BPE, "\u2581" in SentencePiece), the unmarked pieces continue
    a word, special tokens excepted. A vocabulary with neither mark has no words to follow: every piece
    starts one (whole-word masking is then token masking).
    """
    flags = np.zeros(vocab_size, dtype=bool)
    pieces = [(token, index) for token, index in vocab.items() if 0 <= index < vocab_size]
    if any(token.startswith(CONTINUATION_PREFIX) for token, _ in pieces):
        for token, index in pieces:
            flags[index] = token.startswith(CONTINUATION_PREFIX)
        return flags
    for mark in WORD_START_PREFIXES:
        if sum(token.startswith(mark) for token, _ in pieces) > len(pieces) // 10:  # the vocabulary's own mark
            for token, index in pieces:
                flags[index] = not token.startswith(mark)
            flags[list(special_ids)] = False
            return flags
    return flags


def span_length_distribution(p: float = 0.2, max_length: int = 10) -> np.ndarray:
    """P(length = 1..max_length) for SpanBERT spans: geometric(p) clipped (renormalised) at max_length.

    With p=0.2 and 10 the mean length is 3.8 words, as in the SpanBERT paper.
    """
    lengths = np.arange(1, max_length + 1)
    probs = p * (1 - p) ** (lengths - 1)
    return probs / probs.sum()


class MaskResult(NamedTuple):
    input_ids: np.ndarray  # (B, T) with [MASK] / random / kept tokens at the chosen positions
    labels: np.ndarray  # (B, T) the original token where chosen, IGNORE_INDEX elsewhere
    capped: int  # rows whose budget was cut by max_predictions
    span_lengths: np.ndarray | None = None  # span mode: length in words of each span as drawn


@dataclass
class Masker:
    """Masks batches of token ids. Build it once (it holds lookup tables over the vocabulary).

    `special_ids` are never chosen (`[CLS]`, `[SEP]`, `[PAD]`, `[MASK]`); `exclude_from_random` are never
    used as random replacements (all special tokens, `[UNK]` included). `is_continuation[id]` tells
    whether a piece continues a word (WordPiece `##`), needed for `whole_word` and `span`.
    """

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    exclude_from_random: tuple[int, ...] = ()
    is_continuation: np.ndarray | None = None
    prob: float = 0.15
    max_predictions: int | None = None
    whole_word: bool = False
    span: bool = False
    span_p: float = 0.2
    span_max: int = 10
    warn: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.prob < 1.0:
            raise ValueError(f"masking probability must be in (0, 1), not {self.prob}")
        if (self.whole_word or self.span) and self.is_continuation is None:
            raise ValueError("whole-word and span masking need is_continuation (which pieces start with ##)")
        self._special = np.zeros(self.vocab_size, dtype=bool)
        self._special[list(self.special_ids)] = True
        excluded = np.zeros(self.vocab_size, dtype=bool)
        excluded[list(set(self.special_ids) | set(self.exclude_from_random))] = True
        self._random_pool = np.flatnonzero(~excluded).astype(np.int64)
        if self.is_continuation is not None:
            self._continuation = np.asarray(self.is_continuation, dtype=bool)
            if len(self._continuation) != self.vocab_size:
                raise ValueError(f"is_continuation has {len(self._continuation)} entries for a vocabulary "
                                 f"of {self.vocab_size}")
        self._span_probs = span_length_distribution(self.span_p, self.span_max)
        self.capped_rows = 0  # running count, for the caller's report
        self._warned = False

    @classmethod
    def from_tokenizer(cls, tokenizer, **options) -> Masker:
        """A Masker for a `BertTokenizer` of any family: its special ids, and its word marks
        (`continuation_flags`)."""
        continuation = continuation_flags(tokenizer.vocab, tokenizer.vocab_size, tuple(tokenizer.all_special_ids))
        never = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id)
        return cls(vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_token_id, special_ids=never,
                   exclude_from_random=tuple(tokenizer.all_special_ids), is_continuation=continuation, **options)

    # -----------------------------------------------------------------------------------------------

    def maskable(self, input_ids: np.ndarray) -> np.ndarray:
        """Which positions may be chosen (not a special token, not padding)."""
        return ~self._special[np.asarray(input_ids)]

    def __call__(self, input_ids: np.ndarray, rng: np.random.Generator) -> MaskResult:
        """Mask a (B, T) batch; padding must use a special id (so it is never chosen)."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {ids.shape}")
        B, T = ids.shape
        maskable = self.maskable(ids)  # (B, T)
        n = maskable.sum(axis=1)  # (B,)
        budget = np.floor(self.prob * n + rng.random(B)).astype(np.int64)
        cap = self.max_predictions if self.max_predictions is not None else T
        capped = int((budget > cap).sum())
        budget = np.minimum(budget, cap)
        if capped:
            self.capped_rows += capped
            if self.warn and not self._warned:
                self._warned = True
                warnings.warn(
                    f"max_predictions={cap} caps the number of masked tokens of {capped} of {B} sequences "
                    f"(15% of their tokens is more); raise it to ceil(0.15 x max_seq_length) = "
                    f"{math.ceil(self.prob * T)} or more for the usual 15%", stacklevel=2)

        spans = None
        if self.span:
            chosen, unit_u, spans = self._select_spans(ids, maskable, budget, cap, rng)
        else:
            units = self._word_ids(ids, maskable) if self.whole_word else None
            chosen, unit_u = self._select_units(maskable, units, budget, cap, rng)

        labels = np.where(chosen, ids, IGNORE_INDEX).astype(np.int64)
        out = ids.copy()
        # 80% [MASK], 10% a random token, 10% unchanged; one draw per unit
        out[chosen & (unit_u < 0.8)] = self.mask_id
        to_random = chosen & (unit_u >= 0.8) & (unit_u < 0.9)
        n_random = int(to_random.sum())
        if n_random:
            out[to_random] = self._random_pool[rng.integers(len(self._random_pool), size=n_random)]
        return MaskResult(out, labels, capped, spans)

    # -- units -------------------------------------------------------------------------------------

    def _word_ids(self, ids: np.ndarray, maskable: np.ndarray) -> np.ndarray:
        """(B, T) word number of each token (1-based within the row); a `##` piece shares its word's number.

        A continuation piece right after a special token (a segment trimmed from the front) starts a word.
        """
        prev_maskable = np.zeros_like(maskable)
        prev_maskable[:, 1:] = maskable[:, :-1]
        starts = maskable & (~self._continuation[ids] | ~prev_maskable)
        return np.cumsum(starts, axis=1)

    def _select_units(self, maskable: np.ndarray, units: np.ndarray | None, budget: np.ndarray, cap: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Choose whole units in random order up to each row's budget. Returns (chosen, per-token unit draw)."""
        B, T = maskable.shape
        rows = np.arange(B)[:, None]
        if units is None:  # every token is its own unit: the first `budget` tokens of a random order
            key = np.where(maskable, rng.random((B, T)), 2.0)
            ranks = np.empty((B, T), dtype=np.int64)
            np.put_along_axis(ranks, np.argsort(key, axis=1), np.arange(T)[None, :], axis=1)
            return ranks < budget[:, None], rng.random((B, T))
        # one random key per unit; tokens of a unit share it, non-maskable tokens sort last
        unit_key = rng.random((B, T + 1))
        unit_u = rng.random((B, T + 1))
        key = np.where(maskable, unit_key[rows, units], 2.0)
        order = np.argsort(key, axis=1, kind="stable")  # units contiguous, tokens in text order
        sorted_units = units[rows, order]
        sorted_maskable = maskable[rows, order]
        count_after = np.cumsum(sorted_maskable, axis=1)  # maskable tokens up to and including this one
        # unit size and the count before the unit, scattered back to token positions
        flat_units = (rows * (T + 1) + units).ravel()
        size = np.bincount(flat_units, weights=maskable.ravel(), minlength=B * (T + 1))
        size = size.reshape(B, T + 1).astype(np.int64)
        first_in_unit = np.ones((B, T), dtype=bool)
        first_in_unit[:, 1:] = sorted_units[:, 1:] != sorted_units[:, :-1]
        before = np.zeros((B, T + 1), dtype=np.int64)
        r, c = np.nonzero(first_in_unit & sorted_maskable)
        before[r, sorted_units[r, c]] = count_after[r, c] - 1
        tok_before = before[rows, units]
        tok_size = size[rows, units]
        b = budget[:, None]
        fits = tok_before + tok_size <= b
        crossing = (tok_before < b) & ~fits & (tok_before + tok_size <= cap)
        cross_u = rng.random((B, T + 1))[rows, units]
        accept_p = (b - tok_before) / np.maximum(tok_size, 1)
        chosen = maskable & (fits | (crossing & (cross_u < accept_p)))
        return chosen, unit_u[rows, units]

    def _select_spans(self, ids: np.ndarray, maskable: np.ndarray, budget: np.ndarray, cap: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SpanBERT: repeatedly draw a length (in words) and a start word not yet masked, mask the span.

        A span stops at a special token (it never crosses `[SEP]`). Vectorised over rows; the loop runs
        once per span, at most budget + 1 times.
        """
        B, T = ids.shape
        rows = np.arange(B)
        words = self._word_ids(ids, maskable)
        starts = maskable & (np.diff(words, axis=1, prepend=0) > 0)
        runs = np.cumsum(~maskable, axis=1)  # stretches between special tokens
        chosen = np.zeros((B, T), dtype=bool)
        unit_u = np.zeros((B, T))
        count = np.zeros(B, dtype=np.int64)
        active = budget > 0
        lengths_drawn: list[np.ndarray] = []
        while active.any():
            length = rng.choice(len(self._span_probs), size=B, p=self._span_probs) + 1
            candidates = starts & ~chosen
            active &= candidates.any(axis=1)
            if not active.any():
                break
            score = np.where(candidates, rng.random((B, T)), -1.0)
            start = score.argmax(axis=1)
            w0, run0 = words[rows, start], runs[rows, start]
            new = (maskable & ~chosen & (words >= w0[:, None]) & (words < (w0 + length)[:, None])
                   & (runs == run0[:, None]) & active[:, None])
            n_new = new.sum(axis=1)
            fits = count + n_new <= budget
            crossing = ~fits & (count < budget) & (count + n_new <= cap)
            accept = active & (fits | (crossing & (rng.random(B) < (budget - count) / np.maximum(n_new, 1))))
            take = new & accept[:, None]
            chosen |= take
            unit_u = np.where(take, rng.random(B)[:, None], unit_u)
            count += n_new * accept
            lengths_drawn.append(length[accept])
            active &= fits & (count < budget)
        spans = np.concatenate(lengths_drawn) if lengths_drawn else np.zeros(0, dtype=np.int64)
        return chosen, unit_u, spans
