"""Feature-based BERT: vectors from chosen layers of a frozen encoder, per word, per token or per sentence.

The BERT paper's second way of use (section 5.3): run the pre-trained encoder once, keep the
activations of one or more layers, and train a task model on top without touching BERT. Which
layers, and how they are combined, is a *strategy*. `hidden_states` has L + 1 entries: index 0 is the
embeddings output, index i the output of Transformer layer i, so for a model of L layers:

    embeddings        [0]                   the input embeddings (token + position + segment), no context
    last              [L]
    second_to_last    [L - 1]
    sum_last_four     [L - 3 .. L]  summed   (BERT-base: layers 9-12; MiniLM-L6: layers 3-6)
    concat_last_four  [L - 3 .. L]  concatenated, lowest layer first (4 x H wide)
    sum_all           [1 .. L]      summed   (the paper's "all 12 layers" of BERT-base are its 12
                                             Transformer layers; the embeddings output is not one)

An explicit `layers=[...]` picks indices directly (negative ones count from the end: -1 is layer L)
and `combine` says what to do with them: sum, mean, concat, or none (keep them apart, as Google's
`extract_features.py` does: one vector per layer).

Word alignment. Words are the whitespace-separated words of the input text (a pre-split sentence, like
a CoNLL one, is joined with single spaces), so a word that BERT's pre-tokeniser splits further ("U.S."
-> u . s .,  "don't" -> don ' t) still gets one vector. A token belongs to the word whose characters
contain the token's first character (the tokenizer's offsets point into the original text, also after
lower-casing and accent stripping). A word's vector is its first piece's (the paper's choice for NER)
or the mean of its pieces. Every word gets a row; a word with no piece (only characters the normaliser
deletes, such as a zero-width space, or cut off by truncation) gets zeros, and the index marks inputs
that were truncated.

Pooling (one vector per text) is padding-aware: `cls` takes position 0, `mean` averages the real tokens
only, `max` takes the maximum over real tokens only.

Output files, written as the batches come (never the whole set in memory):
- `.npy` / `.safetensors`: one matrix, rows = the words (tokens, texts) of all inputs one after another,
  shape (N, D) or (N, K, H) for `combine="none"`; the sidecar `<file>.index.json` gives, per input line,
  its rows `[start, end)` and its words (tokens). The .safetensors file also holds the row offsets as an
  int64 tensor `offsets` (n_lines + 1).
- `.jsonl`: Google's `extract_features.py` layout, one line per input:
  `{"linex_index": i, "features": [{"token": ..., "layers": [{"index": ..., "values": [...]}]}]}`
  (with `pool`, `{"linex_index": i, "pooled": "mean", "layers": [...]}`); `index` is our hidden-state
  index (0 = embeddings), or the list of indices a combined vector is made of.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from bertforge.model.base import PreTrainedModel
    from bertforge.tokenizer import BertTokenizer, Encoding

STRATEGIES = ("embeddings", "last", "second_to_last", "sum_last_four", "concat_last_four", "sum_all")
COMBINES = ("sum", "mean", "concat", "none")
POOLS = ("cls", "mean", "max")
ALIGNMENTS = ("first", "mean")
FORMATS = (".npy", ".safetensors", ".jsonl")
_WORD = re.compile(r"\S+")


# ------------------------------------------------------------------------------------------------
# layer strategies
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerSelection:
    """Which hidden states (0 = embeddings, i = layer i) and how they become one vector."""

    layers: tuple[int, ...]
    combine: str  # sum | mean | concat | none
    name: str = ""  # the strategy, or "" for an explicit list

    def dim(self, hidden_size: int) -> int:
        """Width of the combined vector (per layer for combine="none")."""
        return hidden_size * len(self.layers) if self.combine == "concat" else hidden_size

    def describe(self) -> str:
        what = ", ".join(map(str, self.layers))
        label = self.name or "layers"
        return f"{label}: hidden states [{what}]" + (f" ({self.combine})" if len(self.layers) > 1 else "")


def resolve_layers(num_layers: int, strategy: str | None = None, layers: Sequence[int] | None = None,
                   combine: str | None = None) -> LayerSelection:
    """A strategy name, or explicit layer indices, as concrete hidden-state indices for an L-layer model.

    >>> resolve_layers(6, "sum_last_four")
    LayerSelection(layers=(3, 4, 5, 6), combine='sum', name='sum_last_four')
    >>> resolve_layers(6, layers=[-1, -2], combine="concat").layers
    (6, 5)
    """
    if (strategy is None) == (layers is None):
        raise ValueError("give either a strategy or explicit layers, not both (and not neither)")
    if combine is not None and combine not in COMBINES:
        raise ValueError(f"combine {combine!r} is not one of {', '.join(COMBINES)}")
    if strategy is not None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        if combine is not None:
            raise ValueError("a strategy fixes how layers combine; combine goes with explicit layers")
        if strategy in ("sum_last_four", "concat_last_four") and num_layers < 4:
            raise ValueError(f"{strategy} needs at least 4 layers; this model has {num_layers}")
        if strategy == "second_to_last" and num_layers < 2:
            raise ValueError("second_to_last needs at least 2 layers")
        last_four = tuple(range(num_layers - 3, num_layers + 1))
        table = {
            "embeddings": ((0,), "none"),
            "last": ((num_layers,), "none"),
            "second_to_last": ((num_layers - 1,), "none"),
            "sum_last_four": (last_four, "sum"),
            "concat_last_four": (last_four, "concat"),
            "sum_all": (tuple(range(1, num_layers + 1)), "sum"),
        }
        chosen, how = table[strategy]
        return LayerSelection(chosen, how, strategy)
    assert layers is not None
    if not layers:
        raise ValueError("layers must name at least one layer")
    resolved = []
    for index in layers:
        value = index + num_layers + 1 if index < 0 else index
        if not 0 <= value <= num_layers:
            raise ValueError(f"layer {index} is out of range for a {num_layers}-layer model "
                             f"(0 = embeddings .. {num_layers}, or -1 .. -{num_layers + 1})")
        resolved.append(value)
    return LayerSelection(tuple(resolved), combine or "none")


def combine_layers(hidden_states: Sequence[torch.Tensor], selection: LayerSelection) -> torch.Tensor:
    """L + 1 tensors (..., H) -> (..., D), or (..., K, H) for combine="none" with K > 1 layers."""
    import torch

    chosen = [hidden_states[i] for i in selection.layers]
    if len(chosen) == 1:
        return chosen[0]
    if selection.combine == "concat":
        return torch.cat(chosen, dim=-1)  # K x (..., H) -> (..., K*H)
    stacked = torch.stack(chosen, dim=-2)  # K x (..., H) -> (..., K, H)
    if selection.combine == "sum":
        return stacked.sum(dim=-2)
    if selection.combine == "mean":
        return stacked.mean(dim=-2)
    return stacked


# ------------------------------------------------------------------------------------------------
# pooling and word alignment
# ------------------------------------------------------------------------------------------------
def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T, ...) token vectors -> (B, ...) one per text, looking at real tokens only."""
    import torch

    if mode not in POOLS:
        raise ValueError(f"pool {mode!r} is not one of {', '.join(POOLS)}")
    if mode == "cls":
        return hidden[:, 0]
    mask = attention_mask.to(torch.bool).reshape(*attention_mask.shape, *([1] * (hidden.dim() - 2)))  # (B, T, 1..)
    if mode == "mean":
        total = hidden.masked_fill(~mask, 0.0).sum(dim=1)
        count = mask.sum(dim=1).clamp(min=1).to(hidden.dtype)
        return total / count
    lowest = torch.finfo(hidden.dtype).min
    return hidden.masked_fill(~mask, lowest).max(dim=1).values


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) characters of each whitespace-separated word."""
    return [m.span() for m in _WORD.finditer(text)]


def token_word_ids(encoding: Encoding, texts: Sequence[str]) -> list[int | None]:
    """For each token, the index of the input word it belongs to (None for specials and padding).

    Words are counted across the segments: the words of the pair follow those of the first text.
    """
    spans = [word_spans(t) for t in texts]
    starts = [[s for s, _ in seg] for seg in spans]
    first_word = [0]
    for seg in spans:
        first_word.append(first_word[-1] + len(seg))
    out: list[int | None] = []
    for sequence, (start, _) in zip(encoding.sequence_ids, encoding.offsets, strict=True):
        if sequence is None:
            out.append(None)
            continue
        word = bisect.bisect_right(starts[sequence], start) - 1
        out.append(first_word[sequence] + max(word, 0))
    return out


def align_words(hidden: torch.Tensor, word_ids: Sequence[int | None], num_words: int,
                mode: str = "first") -> torch.Tensor:
    """(T, ...) token vectors of one text -> (num_words, ...) word vectors: first piece or mean of pieces.

    A word without any piece gets zeros.
    """
    import torch

    if mode not in ALIGNMENTS:
        raise ValueError(f"word alignment {mode!r} is not one of {', '.join(ALIGNMENTS)}")
    out = hidden.new_zeros((num_words, *hidden.shape[1:]))
    positions = [(t, w) for t, w in enumerate(word_ids) if w is not None and w < num_words]
    if not positions:
        return out
    if mode == "first":
        first: dict[int, int] = {}
        for t, w in positions:
            first.setdefault(w, t)
        out[list(first)] = hidden[list(first.values())]
        return out
    tokens = torch.tensor([t for t, _ in positions], device=hidden.device)
    words = torch.tensor([w for _, w in positions], device=hidden.device)
    out.index_add_(0, words, hidden[tokens])
    counts = torch.bincount(words, minlength=num_words).clamp(min=1).to(hidden.dtype)
    return out / counts.reshape(-1, *([1] * (hidden.dim() - 1)))


# ------------------------------------------------------------------------------------------------
# batched extraction
# ------------------------------------------------------------------------------------------------
@dataclass
class ItemFeatures:
    """The vectors of one input: per word (or token) rows, or one pooled vector."""

    index: int  # position of the input in the stream (its line number from 0)
    units: list[str]  # the words (or tokens) the rows belong to; [] for a pooled vector
    values: np.ndarray  # (n, D) / (n, K, H) per unit, or (D,) / (K, H) pooled
    truncated: bool = False  # the input was longer than max_length: words past the cut have zero vectors


TextInput = str | tuple[str, str] | Sequence[str]


def _as_segments(item: Any) -> tuple[str, str | None]:
    """A text, a (text, pair) tuple, or a list of pre-split words -> (text, pair)."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return item[0], item[1]
    if isinstance(item, list) and all(isinstance(x, str) for x in item):
        if any(_WORD.fullmatch(w) is None for w in item):
            raise ValueError(f"pre-split words must be non-empty and hold no whitespace: {item!r:.120}")
        return " ".join(item), None
    raise TypeError(f"an input must be a str, a (text, pair) tuple or a list of words, got {item!r:.80}")


@dataclass
class FeatureExtractor:
    """Frozen encoder + tokenizer + a layer selection: inputs in, vectors out, batch by batch.

        extractor = FeatureExtractor.from_pretrained("runs/x/final", strategy="sum_last_four")
        for item in extractor.extract(["The U.S. won.", "Hello there"]):
            item.units, item.values.shape          # ['The', 'U.S.', 'won.'] (3, 384)

    `align`: "first" / "mean" gives one row per input word; None gives one row per WordPiece token,
    [CLS] and [SEP] included (Google's layout). `pool` ("cls", "mean", "max") gives one vector per input
    instead. Inputs are sorted by length within chunks of `batch_size * 16` (less padding) and come
    out in input order.
    """

    model: PreTrainedModel  # a bare encoder (the embeddings job) of any family
    tokenizer: BertTokenizer
    selection: LayerSelection
    align: str | None = "first"
    pool: str | None = None
    batch_size: int = 32
    max_length: int | None = None
    dtype: str = "float32"  # of the returned arrays: float32 or float16
    device: str | None = None
    # fp32, bf16, int8 or auto (bertforge.precision); after construction, the precision in use
    precision: str = "fp32"
    truncated: int = field(default=0, init=False)  # inputs that lost tokens to truncation so far

    def __post_init__(self) -> None:
        if self.align is not None and self.align not in ALIGNMENTS:
            raise ValueError(f"align {self.align!r} is not one of {', '.join(ALIGNMENTS)} (or None: per token)")
        if self.pool is not None and self.pool not in POOLS:
            raise ValueError(f"pool {self.pool!r} is not one of {', '.join(POOLS)}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, got {self.dtype!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        from bertforge.precision import apply_precision

        self.model.eval()
        if self.device is not None:
            self.model.to(self.device)
        self.model, self.precision = apply_precision(self.model, self.precision)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], *, strategy: str | None = None,
                        layers: Sequence[int] | None = None, combine: str | None = None,
                        **kwargs: Any) -> FeatureExtractor:
        """Load the encoder (any checkpoint of a registered family: task heads are ignored) and tokenizer
        of `directory`."""
        from bertforge.model.auto import load_for_job
        from bertforge.precision import is_quantized_checkpoint, load_quantized
        from bertforge.tokenizer import BertTokenizer

        if is_quantized_checkpoint(directory):  # a saved int8 copy (of any head): its encoder
            model = load_quantized(directory).base_model
        else:
            model = load_for_job(directory, "embeddings")
        tokenizer = BertTokenizer.from_pretrained(directory)
        if strategy is None and layers is None:
            strategy = "last"
        selection = resolve_layers(model.config.num_hidden_layers, strategy, layers, combine)
        return cls(model, tokenizer, selection, **kwargs)

    @property
    def unit(self) -> str:
        return "text" if self.pool else ("word" if self.align else "token")

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of one output row (one word, token or text)."""
        hidden = self.model.config.hidden_size
        if self.selection.combine == "none" and len(self.selection.layers) > 1:
            return (len(self.selection.layers), hidden)
        return (self.selection.dim(hidden),)

    def extract(self, inputs: Iterable[TextInput]) -> Iterator[ItemFeatures]:
        """Vectors for each input, in input order, computed `batch_size` inputs at a time."""
        chunk: list[tuple[str, str | None]] = []
        start = 0
        for item in inputs:
            chunk.append(_as_segments(item))
            if len(chunk) == self.batch_size * 16:
                yield from self._extract_chunk(chunk, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._extract_chunk(chunk, start)

    def _extract_chunk(self, chunk: list[tuple[str, str | None]], start: int) -> Iterator[ItemFeatures]:
        items = [t if p is None else (t, p) for t, p in chunk]
        limit = self.max_length or self.tokenizer.model_max_length
        # encode in full first (to know what truncation cuts), then again, truncated, only where needed
        encoded = self.tokenizer.encode_batch(items, max_length=1 << 30)["encodings"]
        long = [i for i, enc in enumerate(encoded) if len(enc) > limit]
        if long:
            cut = self.tokenizer.encode_batch([items[i] for i in long], max_length=limit, truncation=True)
            for i, enc in zip(long, cut["encodings"], strict=True):
                encoded[i] = enc
            self.truncated += len(long)
        order = sorted(range(len(chunk)), key=lambda i: len(encoded[i]))
        results: dict[int, ItemFeatures] = {}
        for b in range(0, len(order), self.batch_size):
            rows = order[b:b + self.batch_size]
            for i, item in zip(rows, self._run([encoded[i] for i in rows], [chunk[i] for i in rows]), strict=True):
                item.index = start + i
                item.truncated = i in long
                results[i] = item
        for i in range(len(chunk)):
            yield results[i]

    def _run(self, encodings: list[Encoding], segments: list[tuple[str, str | None]]) -> list[ItemFeatures]:
        import torch

        device = next(self.model.parameters()).device
        length = max(len(e) for e in encodings)
        ids = torch.zeros((len(encodings), length), dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, enc in enumerate(encodings):  # right padding, as BERT
            n = len(enc)
            ids[row, :n] = torch.tensor(enc.input_ids)
            types[row, :n] = torch.tensor(enc.token_type_ids)
            mask[row, :n] = 1
        with torch.inference_mode():
            out = self.model(ids.to(device), mask.to(device), types.to(device), output_hidden_states=True)
            vectors = combine_layers(out.hidden_states, self.selection).float()  # (B, T, D) or (B, T, K, H)
            pooled = pool(vectors, mask.to(device), self.pool) if self.pool else None
        np_dtype = np.float16 if self.dtype == "float16" else np.float32
        items = []
        for row, (enc, (text, pair)) in enumerate(zip(encodings, segments, strict=True)):
            texts = [text] if pair is None else [text, pair]
            words = [t[s:e] for t in texts for s, e in word_spans(t)]
            n = len(enc)
            if pooled is not None:
                values, units = pooled[row], []
            elif self.align is None:
                values, units = vectors[row, :n], list(enc.tokens)
            else:
                values, units = align_words(vectors[row, :n], token_word_ids(enc, texts), len(words), self.align), words
            items.append(ItemFeatures(0, units, values.cpu().numpy().astype(np_dtype)))
        return items


# ------------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------------
class StreamingMatrix:
    """Rows appended one block at a time to a .npy or .safetensors file whose header is written last.

    The header goes in space reserved at the start of the file; both formats allow the header to be
    padded with spaces, so its final size never moves the data.
    """

    RESERVED = 4096

    def __init__(self, path: Path, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path, self.row_shape, self.dtype = path, row_shape, np.dtype(dtype)
        self.rows = 0
        self.tmp = path.with_name(path.name + ".part")
        self.handle = open(self.tmp, "wb")  # noqa: SIM115  (closed in finish / abort)
        self.handle.write(b" " * self.RESERVED)

    def append(self, values: np.ndarray) -> None:
        block = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1, *self.row_shape)
        self.handle.write(block.tobytes())
        self.rows += block.shape[0]

    def finish(self, offsets: Sequence[int], metadata: dict[str, str]) -> None:
        shape = (self.rows, *self.row_shape)
        data_bytes = self.rows * int(np.prod(self.row_shape)) * self.dtype.itemsize
        if self.path.suffix == ".npy":
            header = self._npy_header(shape)
        else:
            offsets_bytes = np.asarray(offsets, dtype="<i8").tobytes()
            self.handle.write(offsets_bytes)
            header = self._safetensors_header(shape, data_bytes, len(offsets), len(offsets_bytes), metadata)
        if len(header) > self.RESERVED:
            raise ValueError(f"feature file header of {len(header)} bytes does not fit the reserved "
                             f"{self.RESERVED}; use shorter metadata")
        self.handle.seek(0)
        self.handle.write(header)
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        self.tmp.unlink(missing_ok=True)

    def _npy_header(self, shape: tuple[int, ...]) -> bytes:
        # NPY 1.0: magic, version, uint16 header length, a Python dict literal padded with spaces, "\n"
        descr = np.lib.format.dtype_to_descr(self.dtype)
        text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
        body_len = self.RESERVED - 10
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + text.ljust(body_len - 1).encode() + b"\n"

    def _safetensors_header(self, shape: tuple[int, ...], data_bytes: int, n_offsets: int, offsets_bytes: int,
                            metadata: dict[str, str]) -> bytes:
        # safetensors: uint64 header length, JSON header (space-padded), then the tensors' bytes
        names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
        header = {
            "__metadata__": metadata,
            "features": {"dtype": names[self.dtype], "shape": list(shape), "data_offsets": [0, data_bytes]},
            "offsets": {"dtype": "I64", "shape": [n_offsets], "data_offsets": [data_bytes, data_bytes + offsets_bytes]},
        }
        text = json.dumps(header, separators=(",", ":"))
        return struct.pack("<Q", self.RESERVED - 8) + text.ljust(self.RESERVED - 8).encode()


def index_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar index of a feature file: `<file>.index.json`."""
    path = Path(path)
    return path.with_name(path.name + ".index.json")


def write_features(extractor: FeatureExtractor, inputs: Iterable[TextInput], out: str | os.PathLike[str], *,
                   progress: Any = None) -> dict[str, Any]:
    """Extract and write features of `inputs` to `out` (.npy, .safetensors or .jsonl) as they come.

    `progress` is anything with `update(n)` (a tqdm bar), called once per input. Returns the summary
    that is also written to the index (`<out>.index.json`, except for .jsonl which is self-describing).
    """
    out = Path(out)
    if out.suffix not in FORMATS:
        raise ValueError(f"{out}: the output must end in {', '.join(FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "format": out.suffix.lstrip("."), "unit": extractor.unit, "strategy": extractor.selection.name or None,
        "layers": list(extractor.selection.layers), "combine": extractor.selection.combine,
        "align": extractor.align if extractor.unit == "word" else None, "pool": extractor.pool,
        "row_shape": list(extractor.row_shape), "dtype": extractor.dtype,
        "num_hidden_layers": extractor.model.config.num_hidden_layers, "precision": extractor.precision,
    }
    if out.suffix == ".jsonl":
        lines, truncated = _write_jsonl(extractor, inputs, out, progress)
        return {**summary, "inputs": lines, "truncated_inputs": truncated}

    matrix = StreamingMatrix(out, extractor.row_shape, np.dtype(extractor.dtype))
    items: list[dict[str, Any]] = []
    offsets = [0]
    truncated = 0
    try:
        for item in extractor.extract(inputs):
            matrix.append(item.values)
            offsets.append(matrix.rows)
            # row: the line number from 1, as `predict` numbers rows; line: the same from 0 (kept for older readers)
            entry: dict[str, Any] = {"row": item.index + 1, "line": item.index, "start": offsets[-2],
                                     "end": offsets[-1]}
            if item.units:
                entry[extractor.unit + "s"] = item.units
            if item.truncated:
                entry["truncated"] = True
                truncated += 1
            items.append(entry)
            if progress is not None:
                progress.update(1)
        summary.update({"rows": matrix.rows, "inputs": len(items), "truncated_inputs": truncated})
        matrix.finish(offsets, {k: json.dumps(v) for k, v in summary.items()})
    except BaseException:
        matrix.abort()
        raise
    from bertforge.fileio import write_text_atomic

    write_text_atomic(index_path(out), json.dumps({**summary, "items": items}, ensure_ascii=False) + "\n")
    return summary


def _write_jsonl(extractor: FeatureExtractor, inputs: Iterable[TextInput], out: Path,
                 progress: Any) -> tuple[int, int]:
    selection = extractor.selection
    if selection.combine == "none":
        indices: list[Any] = list(selection.layers)
    else:
        indices = [selection.layers[0] if len(selection.layers) == 1 else list(selection.layers)]

    def layers(values: np.ndarray) -> list[dict[str, Any]]:
        per_layer = values.reshape(len(indices), -1) if selection.combine == "none" else values.reshape(1, -1)
        return [{"index": index, "values": [round(float(x), 6) for x in row]}
                for index, row in zip(indices, per_layer, strict=True)]

    tmp = out.with_name(out.name + ".part")
    count = truncated = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        try:
            for item in extractor.extract(inputs):
                if extractor.pool:
                    record: dict[str, Any] = {"linex_index": item.index, "pooled": extractor.pool,
                                              "layers": layers(item.values)}
                else:
                    record = {"linex_index": item.index,
                              "features": [{"token": unit, "layers": layers(row)}
                                           for unit, row in zip(item.units, item.values, strict=True)]}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
                truncated += item.truncated
                if progress is not None:
                    progress.update(1)
        except BaseException:
            handle.close()
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, out)
    return count, truncated


class FeatureFile:
    """A feature file written by `write_features` (.npy or .safetensors), memory-mapped.

        features = FeatureFile("dev.npy")
        words, vectors = features[0]             # the first input: its words and (n, D) rows
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.index = json.loads(index_path(self.path).read_text(encoding="utf-8"))
        if self.path.suffix == ".npy":
            self.matrix = np.load(self.path, mmap_mode="r")
        elif self.path.suffix == ".safetensors":
            with open(self.path, "rb") as handle:
                (header_len,) = struct.unpack("<Q", handle.read(8))
                spec = json.loads(handle.read(header_len))["features"]
            dtype = {"F32": np.float32, "F16": np.float16}[spec["dtype"]]
            self.matrix = np.memmap(self.path, dtype=dtype, mode="r", offset=8 + header_len + spec["data_offsets"][0],
                                    shape=tuple(spec["shape"]))
        else:
            raise ValueError(f"{self.path}: FeatureFile reads .npy or .safetensors")
        self.items = self.index["items"]

    def __len__(self) -> int:
        return len(self.items)

    def rows(self, i: int) -> slice:
        return slice(self.items[i]["start"], self.items[i]["end"])

    def __getitem__(self, i: int) -> tuple[list[str], np.ndarray]:
        item = self.items[i]
        units = item.get("words") or item.get("tokens") or []
        return units, np.asarray(self.matrix[item["start"]:item["end"]])


__all__ = [
    "ALIGNMENTS", "COMBINES", "FORMATS", "POOLS", "STRATEGIES", "FeatureExtractor", "FeatureFile", "ItemFeatures",
    "LayerSelection", "align_words", "combine_layers", "index_path", "pool", "resolve_layers", "token_word_ids",
    "word_spans", "write_features",
]
