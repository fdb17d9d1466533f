"""Pre-training instances: `[CLS] A [SEP] B [SEP]` pairs for NSP or SOP, or packed full sentences.

Ids only: the tokenizer has already turned each block of sentences into a :class:`SentenceBlock`
(a flat id array plus sentence offsets, so a run of sentences is one slice).

The pair recipe follows the BERT paper's implementation description:

* the target length is `max_seq_length - 3` (room for `[CLS]` and two `[SEP]`), but with probability
  `short_seq_prob` a random length in `[2, max]`, so the model also sees the short sequences it will
  meet in fine-tuning;
* whole sentences are gathered until the target is reached; a random number of them (at least one)
  is segment A and the rest is B;
* NSP: half of the time B is replaced by sentences from a **different document** (NotNext, label 1) and
  the sentences that were not used go back to the stream; SOP (ALBERT): half of the time A and B are
  swapped (label 1);
* the pair is then trimmed to fit, always from the longer segment, one token at a time from its front
  or its back at random.

Two deliberate differences from that implementation, both to keep IsNext at 50%: a chunk always holds
at least two sentences (so "actual next" is always possible; a single sentence left at the end of a
block is dropped and counted), and a NotNext draw that finds no other document counts as a fallback
to IsNext rather than silently biasing the label.

`none` (RoBERTa's FULL-SENTENCES) packs whole sentences into `[CLS] ... [SEP]` up to the length,
crossing document boundaries with an extra `[SEP]` between documents; or, `line_by_line`, makes each
sentence (a line of the input) its own `[CLS] ... [SEP]`, cut at the length.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = [
    "OBJECTIVES",
    "BufferedDraws",
    "DocumentPool",
    "Instance",
    "InstanceCounters",
    "InstanceMaker",
    "SentenceBlock",
    "truncate_pair",
]

OBJECTIVES = ("nsp", "sop", "none")
IS_NEXT, NOT_NEXT, NO_LABEL = 0, 1, -1


class SentenceBlock(NamedTuple):
    """Consecutive sentences of one document as token ids: sentence i is `ids[offsets[i]:offsets[i+1]]`."""

    doc_key: tuple
    ids: np.ndarray  # (n_tokens,) int32
    offsets: np.ndarray  # (n_sentences + 1,) int64
    new_document: bool = True

    @classmethod
    def from_sentences(cls, doc_key: tuple, sentences: list, new_document: bool = True) -> SentenceBlock:
        """Build a block from a list of id sequences (empty sentences are dropped)."""
        sentences = [s for s in sentences if len(s)]
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in sentences]) if sentences else np.zeros(0, np.int32)
        return cls(doc_key, ids, offsets, new_document)

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1


class Instance(NamedTuple):
    """One training example; `tokens[:segment_b_start]` has token type 0, the rest type 1."""

    tokens: np.ndarray  # (T,) int32 with [CLS]/[SEP]
    segment_b_start: int  # T when there is no segment B
    label: int  # 0 IsNext / in order, 1 NotNext / swapped, -1 for objective "none"
    # where the segments came from (for tests and statistics): (doc_key, first sentence, end sentence)
    a_source: tuple | None = None
    b_source: tuple | None = None


@dataclass
class InstanceCounters:
    instances: int = 0
    is_next: int = 0
    truncated: int = 0
    one_sentence_documents: int = 0
    dropped_sentences: int = 0  # a lone last sentence of a block, counted in every dupe_factor pass
    random_next_fallbacks: int = 0

    def merge(self, other: InstanceCounters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class BufferedDraws:
    """Scalar random draws served from a buffer of uniforms: numpy's per-call overhead (~1 us per
    `Generator.random()`) is most of the cost of making an instance otherwise. Deterministic for a
    given Generator; offers the few methods instance making needs, with Generator's meaning."""

    def __init__(self, rng: np.random.Generator, size: int = 4096):
        self.rng = rng
        self.size = size
        self._buffer: list[float] = []
        self._next = 0

    def random(self) -> float:
        if self._next >= len(self._buffer):
            self._buffer = self.rng.random(self.size).tolist()
            self._next = 0
        self._next += 1
        return self._buffer[self._next - 1]

    def integers(self, low: int, high: int | None = None) -> int:
        """Uniform in [low, high), or in [0, low) with one argument."""
        if high is None:
            low, high = 0, low
        return low + min(int(self.random() * (high - low)), high - low - 1)

    def binomial(self, n: int, p: float) -> int:
        if p != 0.5:
            raise ValueError("BufferedDraws.binomial only does p=0.5")
        count = 0
        while n > 0:  # 52 fair bits per uniform
            take = min(n, 52)
            count += (int(self.random() * (1 << 52)) & ((1 << take) - 1)).bit_count()
            n -= take
        return count


def truncate_pair(len_a: int, len_b: int, max_tokens: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """How many tokens to cut from (front of A, back of A, front of B, back of B) to fit `max_tokens`.

    Equivalent to removing one token at a time from the longer segment (B on a tie), each time from
    its front or its back with probability 1/2, but computed in O(1).
    """
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    cut_a = cut_b = 0
    longer_gap = abs(len_a - len_b)
    first = min(excess, longer_gap)  # the longer one alone until the two are level
    if len_a > len_b:
        cut_a += first
    else:
        cut_b += first
    rest = excess - first
    # level: the pops alternate, B first on a tie
    cut_b += (rest + 1) // 2
    cut_a += rest // 2
    front_a = int(rng.binomial(cut_a, 0.5)) if cut_a else 0
    front_b = int(rng.binomial(cut_b, 0.5)) if cut_b else 0
    return front_a, cut_a - front_a, front_b, cut_b - front_b


class DocumentPool:
    """Recent blocks of recent documents, where NotNext segments are drawn from.

    A streaming worker cannot pick "a random document of the corpus" as the original implementation
    does with the whole corpus in memory. Instead it keeps up to `max_documents` documents, each with up
    to `blocks_per_document` of its blocks (a random one replaced when full). When full, the oldest
    document of the file with the most documents in the pool leaves, so a long file does not push the
    other files out. A draw picks a document uniformly among those of *other files* (`doc_key[0]`
    names the file) or, when there are none, among the other documents of the same file; then one of
    its blocks, then a random starting sentence, as in the paper's implementation.
    """

    def __init__(self, rng: np.random.Generator, max_documents: int = 64, blocks_per_document: int = 2):
        self.rng = rng
        self.max_documents = max_documents
        self.blocks_per_document = blocks_per_document
        self._docs: OrderedDict[tuple, list[SentenceBlock]] = OrderedDict()
        self._per_file: dict = {}
        self._candidates: dict = {}  # excluded file -> keys of the other files (cleared when docs change)

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, block: SentenceBlock) -> None:
        if block.num_sentences == 0:
            return
        key = block.doc_key
        blocks = self._docs.get(key)
        if blocks is not None:
            if len(blocks) < self.blocks_per_document:
                blocks.append(block)
            else:
                blocks[int(self.rng.integers(len(blocks)))] = block
            return
        self._candidates.clear()
        if len(self._docs) >= self.max_documents:
            crowded = max(self._per_file, key=self._per_file.__getitem__)
            oldest = next(k for k in self._docs if k[0] == crowded)
            del self._docs[oldest]
            self._per_file[crowded] -= 1
            if not self._per_file[crowded]:
                del self._per_file[crowded]
        self._docs[key] = [block]
        self._per_file[key[0]] = self._per_file.get(key[0], 0) + 1

    def draw(self, exclude: tuple, rng: np.random.Generator) -> SentenceBlock | None:
        """A block of a document other than `exclude` (of another file if possible), or None."""
        keys = self._candidates.get(exclude[0])
        if keys is None:
            keys = self._candidates[exclude[0]] = [k for k in self._docs if k[0] != exclude[0]]
        if not keys:  # no other file: another document of this one
            keys = [k for k in self._docs if k != exclude]
        if not keys:
            return None
        blocks = self._docs[keys[int(rng.integers(len(keys)))]]
        return blocks[int(rng.integers(len(blocks)))]


@dataclass
class InstanceMaker:
    """Turns sentence blocks into instances for one objective. One maker per stream (shard x split)."""

    max_seq_length: int
    cls_id: int
    sep_id: int
    objective: str = "nsp"
    short_seq_prob: float = 0.1
    line_by_line: bool = False  # "none": each sentence (a line of the input) its own instance, unpacked
    counters: InstanceCounters = field(default_factory=InstanceCounters)
    # "none": the packing buffer, carried from block to block
    _pack: list = field(default_factory=list)
    _pack_len: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, not {self.objective!r}")
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8, not {self.max_seq_length}")

    # -- pairs (nsp / sop) -----------------------------------------------------------------------------

    def pairs(self, block: SentenceBlock, rng: np.random.Generator | BufferedDraws,
              pool: DocumentPool | None = None, *, first_pass: bool = True) -> list[Instance]:
        """All instances of one pass over `block` (call it `dupe_factor` times for static masking).

        `rng`: a Generator, or for speed a BufferedDraws over one (what `prepare` passes).
        `first_pass=False` for the repeats, so that a skipped document is counted once.
        """
        max_tokens = self.max_seq_length - 3
        ids, offsets = block.ids, block.offsets
        lengths = np.diff(offsets).tolist()
        n = len(lengths)
        counters = self.counters
        out: list[Instance] = []
        if n < 2:
            if n == 1 and block.new_document and first_pass:
                counters.one_sentence_documents += 1
            counters.dropped_sentences += n
            return out
        target = self._target(max_tokens, rng)
        start = i = 0
        length = 0
        while i < n:
            length += lengths[i]
            if (length < target or i == start) and i + 1 < n:  # a chunk has at least 2 sentences
                i += 1
                continue
            end = i + 1  # chunk = sentences [start, end)
            if end - start < 2:  # the last sentence of the block, alone
                counters.dropped_sentences += 1
                break
            a_end = int(rng.integers(start + 1, end))  # A = [start, a_end), at least one sentence each
            label = IS_NEXT
            b_source: tuple = (block.doc_key, a_end, end)
            a_tokens = ids[offsets[start]:offsets[a_end]]
            if self.objective == "nsp" and rng.random() < 0.5:
                other = pool.draw(block.doc_key, rng) if pool is not None else None
                if other is None:
                    counters.random_next_fallbacks += 1
                    b_tokens = ids[offsets[a_end]:offsets[end]]
                else:
                    label = NOT_NEXT
                    b_tokens, b_source = self._random_segment(other, max(1, target - len(a_tokens)), rng)
                    end = a_end  # the sentences not used go back to the stream
            else:
                b_tokens = ids[offsets[a_end]:offsets[end]]
            a_source = (block.doc_key, start, a_end)
            if self.objective == "sop" and rng.random() < 0.5:
                a_tokens, b_tokens = b_tokens, a_tokens
                a_source, b_source = b_source, a_source
                label = NOT_NEXT
            out.append(self._pair(a_tokens, b_tokens, label, max_tokens, rng, a_source, b_source))
            start = i = end
            length = 0
            target = self._target(max_tokens, rng)
        return out

    def _target(self, max_tokens: int, rng: np.random.Generator) -> int:
        # Mostly full-length sequences; sometimes a short one, so that pre-training is not only long inputs.
        if rng.random() < self.short_seq_prob:
            return int(rng.integers(2, max_tokens + 1))
        return max_tokens

    @staticmethod
    def _random_segment(block: SentenceBlock, target: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple]:
        offsets = block.offsets
        n = block.num_sentences
        first = int(rng.integers(n))
        # sentences from `first` until the target length is reached (or the block ends)
        stop = int(np.searchsorted(offsets, offsets[first] + target, side="left"))
        stop = min(max(stop, first + 1), n)
        return block.ids[offsets[first]:offsets[stop]], (block.doc_key, first, stop)

    def _pair(self, a: np.ndarray, b: np.ndarray, label: int, max_tokens: int, rng: np.random.Generator,
              a_source: tuple, b_source: tuple) -> Instance:
        fa, ba, fb, bb = truncate_pair(len(a), len(b), max_tokens, rng)
        if fa or ba or fb or bb:
            self.counters.truncated += 1
            a = a[fa:len(a) - ba]
            b = b[fb:len(b) - bb]
        tokens = np.empty(len(a) + len(b) + 3, dtype=np.int32)
        tokens[0] = self.cls_id
        tokens[1:1 + len(a)] = a
        tokens[1 + len(a)] = self.sep_id
        tokens[2 + len(a):-1] = b
        tokens[-1] = self.sep_id
        self.counters.instances += 1
        self.counters.is_next += label == IS_NEXT
        return Instance(tokens, len(a) + 2, label, a_source, b_source)

    # -- packing (none) --------------------------------------------------------------------------------

    def pack(self, block: SentenceBlock) -> list[Instance]:
        """Full sentences packed into `[CLS] ... [SEP]` up to the length; the remainder waits for the next block.

        A new document is preceded by an extra `[SEP]`; a sentence longer than the whole body is cut
        into body-sized pieces.
        """
        body = self.max_seq_length - 2
        out: list[Instance] = []
        ids, offsets = block.ids, block.offsets
        if self.line_by_line:  # transformers' run_mlm --line_by_line: no packing, a line is a sequence
            for i in range(block.num_sentences):
                sentence = ids[offsets[i]:offsets[i + 1]]
                for start in range(0, len(sentence), body):
                    self._pack, self._pack_len = [sentence[start:start + body]], min(body, len(sentence) - start)
                    out.append(self._flush())
            return out
        if block.new_document and self._pack_len:
            if self._pack_len + 1 >= body:
                out.append(self._flush())
            else:
                self._pack.append(np.array([self.sep_id], dtype=np.int32))
                self._pack_len += 1
        for i in range(block.num_sentences):
            sentence = ids[offsets[i]:offsets[i + 1]]
            while len(sentence):
                if self._pack_len + len(sentence) > body:
                    if self._pack_len:
                        out.append(self._flush())
                        continue
                    piece, sentence = sentence[:body], sentence[body:]
                else:
                    piece, sentence = sentence, sentence[:0]
                self._pack.append(piece)
                self._pack_len += len(piece)
        return out

    def flush(self) -> list[Instance]:
        """The partly filled last packed instance, if any (call at the end of the stream)."""
        return [self._flush()] if self._pack_len else []

    def _flush(self) -> Instance:
        parts = self._pack
        while parts and len(parts[-1]) == 1 and parts[-1][0] == self.sep_id:
            parts.pop()  # never end on a document separator: [SEP] closes the sequence anyway
        tokens = np.concatenate([np.array([self.cls_id], np.int32), *parts, np.array([self.sep_id], np.int32)])
        self._pack, self._pack_len = [], 0
        self.counters.instances += 1
        return Instance(tokens, len(tokens), NO_LABEL)
