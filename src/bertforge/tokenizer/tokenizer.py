"""`BertTokenizer` (also `Tokenizer`): the tokenizer of any checkpoint on the `tokenizers` library:
load, train (WordPiece), encode, save.

The heavy lifting (normalisation, pre-tokenisation, the subword model, offsets) runs in the Rust
`tokenizers` library. This module adds what the models need around it and keeps it in one readable place:

- the vocabulary is checked when it is loaded (special tokens present, no duplicate lines);
- special tokens and truncation follow the original BERT code, not the library's defaults: for a pair
  that is too long the longer segment loses one token at a time, the second segment on a tie
  (google-research/bert `_truncate_seq_pair`). `tokenizers`' own "longest_first" gives the odd token
  to the second segment instead, so we truncate here and never configure truncation on the backend;
- an input that does not fit raises a ValueError at encode time instead of an index error deep
  inside the model;
- `save_pretrained` writes the Hugging Face layout, so transformers loads our files and tokenizes
  identically.

`from_pretrained` reads every layout the families' checkpoints ship. `vocab.txt` is BERT's WordPiece,
built here. Any other `tokenizer.json` (ModernBERT's byte-level BPE, a Unigram model) is wrapped as it
is (`from_tokenizer_json`), with the special tokens its `tokenizer_config.json` names and its own
post-processor placing them. RoBERTa's `vocab.json` + `merges.txt` and the SentencePiece models of
XLM-RoBERTa, CamemBERT (`sentencepiece.bpe.model`), ALBERT (`spiece.model`) and DeBERTa-v2
(`spm.model`) are converted to a `tokenizers` pipeline exactly as transformers' fast tokenizer class
for them converts them (`layouts.py`), and then wrapped the same way. Whatever the layout, the same
encode / encode_batch / offsets / tasks work with it. `Tokenizer` is the same class under a name that
does not say WordPiece.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers import Tokenizer as BackendTokenizer

from bertforge.fileio import write_bytes_atomic, write_text_atomic
from bertforge.tokenizer.encoding import (
    BatchEncoding,
    Encoding,
    check_text,
    is_positive_int,
    pair_lengths,
    surrogate_error,
)
from bertforge.tokenizer.files import (
    model_max_length_of,
    read_backend,
    read_json_object,
    read_vocab_file,
    special_token_value,
    to_json,
)
from bertforge.tokenizer.layouts import (
    EXPECTED,
    FLAVOURS,
    SPECIAL_KEYS,
    TokenizerFileError,
    TokenizerFilesMissing,
    flavour_for,
    flavour_named,
    load_layout,
    model_type_of,
    original_files,
)
from bertforge.tokenizer.train import learn_vocab

_SPECIAL_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json flags of the classes in layouts.FLAVOURS, kept when a tokenizer.json is wrapped
_FLAGS = sorted({key for flavour in FLAVOURS.values() for key in flavour.options})


# A single text longer than this many characters per kept token is truncated from a prefix (`_long_prefix`).
PREFIX_CHARS_PER_TOKEN = 32


class BertTokenizer:
    """A BERT WordPiece tokenizer: `[CLS] text [SEP] pair [SEP]`, Hugging Face-compatible on disk."""

    def __init__(
        self,
        vocab: dict[str, int] | str | Path,
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = 512,
        unk_token: str = "[UNK]",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        mask_token: str = "[MASK]",
        max_input_chars_per_word: int = 100,
    ) -> None:
        if isinstance(vocab, dict):
            source = "the vocab dict"
            vocab = dict(vocab)
            if sorted(vocab.values()) != list(range(len(vocab))):
                raise ValueError(f"{source}: ids must be exactly 0..{len(vocab) - 1}, each used once")
            bad = [t for t in vocab if not isinstance(t, str) or "\n" in t or "\r" in t]
            if bad:
                raise ValueError(f"{source}: tokens must be str without line breaks, got {bad[0]!r}")
        elif isinstance(vocab, (str, Path)):
            source = str(vocab)
            vocab = read_vocab_file(Path(vocab))
        else:
            raise TypeError(f"vocab must be a dict or the path of a vocab.txt, got {type(vocab).__name__}")
        specials = {"unk_token": unk_token, "cls_token": cls_token, "sep_token": sep_token,
                    "pad_token": pad_token, "mask_token": mask_token}
        for key, token in specials.items():
            if token not in vocab:
                raise ValueError(f"{source}: special token {token!r} ({key}) is missing from the vocabulary")
        if not is_positive_int(model_max_length):
            raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")

        # Settings are fixed at construction: the backend below is built from them.
        self.lowercase = lowercase
        self.strip_accents = strip_accents  # None = follow `lowercase`, as in the original BERT
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.max_input_chars_per_word = max_input_chars_per_word
        self.unk_token, self.cls_token, self.sep_token = unk_token, cls_token, sep_token
        self.pad_token, self.mask_token = pad_token, mask_token
        self._vocab = vocab
        self._id_to_token = [""] * len(vocab)
        for token, index in vocab.items():
            self._id_to_token[index] = token

        backend = BackendTokenizer(models.WordPiece(vocab, unk_token=unk_token,
                                             max_input_chars_per_word=max_input_chars_per_word))
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True,  # drop NUL, U+FFFD and control chars; every whitespace becomes a space
            handle_chinese_chars=tokenize_chinese_chars,  # each CJK ideograph is its own word
            strip_accents=lowercase if strip_accents is None else strip_accents,
            lowercase=lowercase,
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # split on whitespace and punctuation
        # encode() assembles specials itself (to truncate BERT's way); the template is here so that
        # `backend` and the saved tokenizer.json produce exactly what encode() produces.
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls_token}:0 $A:0 {sep_token}:0",
            pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
            special_tokens=[(cls_token, vocab[cls_token]), (sep_token, vocab[sep_token])],
        )
        backend.decoder = decoders.WordPiece(prefix="##")
        # Registering the specials as special added tokens makes "[MASK]" typed in a text one token (as
        # in transformers) and lets decode(skip_special_tokens=True) recognise them. They are already
        # in the vocab, so no id changes.
        backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(specials.values())]
        )
        self._backend = backend
        # The backend's own post-processor places the special tokens (a loaded tokenizer.json);
        # False: BERT's template, assembled here (see `_assemble`).
        self._backend_template = False
        self.bos_token = self.eos_token = None  # WordPiece BERT has neither
        self._saved: dict[str, Any] = {}
        self._files: dict[str, bytes] = {}

    @classmethod
    def from_tokenizer_json(cls, path: str | Path, *, model_max_length: int = 512,
                            **special_tokens: str | None) -> BertTokenizer:
        """Any `tokenizers` tokenizer.json (byte-level BPE, Unigram, WordPiece), used as it is.

        `special_tokens`: cls_token, sep_token, pad_token, mask_token, unk_token (and bos_token,
        eos_token, kept for save_pretrained), as tokenizer_config.json names them; each must be in the
        vocabulary (unk_token may be None: a byte-level vocabulary has no unknown piece). Inputs are
        encoded without specials, truncated BERT's way (`_pair_lengths`), and then the file's
        post-processor adds the specials, so the layout is the file's ([CLS] A [SEP] B [SEP] for
        ModernBERT, <s> A </s></s> B </s> for RoBERTa).
        """
        path = Path(path)
        return cls._wrap(read_backend(path), path, model_max_length, special_tokens)

    @classmethod
    def _wrap(cls, backend: BackendTokenizer, source: Path, model_max_length: int,
              special_tokens: dict[str, str | None], saved: dict[str, Any] | None = None,
              files: dict[str, bytes] | None = None) -> BertTokenizer:
        """A tokenizer around a ready backend whose own post-processor places the special tokens.

        `saved`: tokenizer_config.json entries to write back (the transformers class and its flags);
        `files`: original files (vocab.json, a SentencePiece model) to write back beside tokenizer.json.
        """
        backend.no_truncation()  # truncation and padding are ours, as for vocab.txt tokenizers
        backend.no_padding()
        vocab = backend.get_vocab(with_added_tokens=True)
        names = {"unk_token": None, "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                 "mask_token": "[MASK]", "bos_token": None, "eos_token": None, **special_tokens}
        for key, token in names.items():
            if token is not None and token not in vocab:
                raise TokenizerFileError(f"{source}: special token {token!r} ({key}) is not in the vocabulary")
        if not is_positive_int(model_max_length):
            raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")
        tokenizer = cls.__new__(cls)
        tokenizer.lowercase = tokenizer.strip_accents = None
        tokenizer.tokenize_chinese_chars = False
        tokenizer.max_input_chars_per_word = 0
        tokenizer.model_max_length = model_max_length
        for key, token in names.items():
            setattr(tokenizer, key, token)
        tokenizer._vocab = vocab
        tokenizer._id_to_token = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            tokenizer._id_to_token[index] = token
        tokenizer._backend = backend
        tokenizer._backend_template = True
        tokenizer._saved = dict(saved or {"tokenizer_class": "PreTrainedTokenizerFast"})
        tokenizer._files = dict(files or {})
        return tokenizer

    # ----------------------------------------------------------------------------- vocabulary

    @property
    def backend(self) -> BackendTokenizer:
        """The underlying `tokenizers.Tokenizer`; treat it as read-only (it is shared by every call)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Ids run 0..vocab_size-1 (a loaded tokenizer.json may leave some unused)."""
        return len(self._id_to_token)

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def __len__(self) -> int:
        return len(self._vocab)

    @property
    def pad_token_id(self) -> int:
        return self._vocab[self.pad_token]

    @property
    def unk_token_id(self) -> int | None:
        return self._vocab[self.unk_token] if self.unk_token is not None else None

    @property
    def cls_token_id(self) -> int:
        return self._vocab[self.cls_token]

    @property
    def sep_token_id(self) -> int:
        return self._vocab[self.sep_token]

    @property
    def mask_token_id(self) -> int:
        return self._vocab[self.mask_token]

    @property
    def all_special_ids(self) -> list[int]:
        ids = {self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id}
        return sorted(i for i in ids if i is not None)

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token(s) to id(s); a token outside the vocabulary maps to the [UNK] id."""
        if isinstance(tokens, str):
            return self._vocab.get(tokens, self.unk_token_id)  # type: ignore[return-value]
        return [self._vocab.get(t, self.unk_token_id) for t in tokens]  # type: ignore[misc]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self._id_to_token[self._check_id(ids)]
        return [self._id_to_token[self._check_id(i)] for i in self._as_id_list(ids)]

    def _check_id(self, index: int) -> int:
        if not 0 <= index < len(self._id_to_token):
            raise ValueError(f"token id {index} is outside the vocabulary (size {len(self._id_to_token)})")
        return index

    @staticmethod
    def _as_id_list(ids: Iterable[int]) -> list[int]:
        # Accept plain lists as well as torch tensors / numpy arrays (anything with .tolist()).
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return [int(i) for i in ids]

    def __repr__(self) -> str:
        if self._backend_template:
            return (f"BertTokenizer({self._saved.get('tokenizer_class')}, vocab_size={self.vocab_size}, "
                    f"model_max_length={self.model_max_length})")
        return (f"BertTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"strip_accents={self.strip_accents}, model_max_length={self.model_max_length})")

    # ----------------------------------------------------------------------------- encoding

    def tokenize(self, text: str) -> list[str]:
        """WordPiece pieces of `text`, without special tokens and without any length limit."""
        check_text(text, "text")
        return self._encode_segments([text])[0].tokens

    def words(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        """The words of `text` as this tokenizer's pre-tokenizer splits it, each as it stands in the
        text with its (start, end) characters, without the spaces the pre-tokenizer may attach to
        them (byte-level BPE's leading space, SentencePiece's "▁") and never containing whitespace.

        For word-level tasks: encoding these words with `backend.encode_batch(..., is_pretokenized=True)`
        gives each word its own pieces. BERT's pre-tokenizer gives its words and punctuation unchanged.
        """
        check_text(text, "text")
        out = []
        pre_tokenizer = self._backend.pre_tokenizer
        spans = ([span for _, span in pre_tokenizer.pre_tokenize_str(text)] if pre_tokenizer is not None
                 else [(0, len(text))])
        for start, end in spans:
            for match in re.finditer(r"\S+", text[start:end]):
                out.append((match.group(), (start + match.start(), start + match.end())))
        return out

    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        truncation: bool = False,
        add_special_tokens: bool = True,
    ) -> Encoding:
        """Encode a text, or a text pair, as `[CLS] text [SEP] (pair [SEP])`.

        `max_length` (default `model_max_length`) counts the special tokens. Longer inputs raise a
        ValueError unless `truncation=True`, which trims them BERT's way and never drops a special.
        """
        return self._encode_items([(text, pair)], max_length, truncation, add_special_tokens, "encode")[0]

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        """transformers' call: one text (or a text and its pair) gives lists of ids; a list of texts (and
        a list of pairs) gives a batch, padded and stacked as `encode_batch` does. The items are
        input_ids, token_type_ids and attention_mask: `model(**tokenizer(texts, padding=True,
        return_tensors="pt"))` runs the model."""
        single = isinstance(text, str)
        if text_pair is not None and single != isinstance(text_pair, str):
            raise TypeError("text and text_pair must both be one text or both be lists of texts")
        texts = [text] if single else list(text)
        pairs = None if text_pair is None else ([text_pair] if single else list(text_pair))
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        items = texts if pairs is None else list(zip(texts, pairs, strict=True))
        batch = self.encode_batch(items, max_length=max_length, truncation=truncation, padding=padding,
                                  add_special_tokens=add_special_tokens, return_tensors=return_tensors)
        if single and return_tensors is None:  # one text: its lists, without the batch dimension
            return BatchEncoding({key: value[0] for key, value in batch.items()}, batch.encodings)
        return batch

    def encode_batch(
        self,
        texts: Sequence[str] | Sequence[tuple[str, str]],
        *,
        max_length: int | None = None,
        truncation: bool = False,
        padding: bool | str = False,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """Encode many texts (or `(text, pair)` tuples) in parallel, then optionally pad and stack.

        `padding`: False, True / "longest" (to the longest in the batch), or "max_length".
        `return_tensors`: None (lists of lists), "pt" (torch.long) or "np" (int64).
        Returns a `BatchEncoding`: input_ids, token_type_ids and attention_mask as its items (so
        `model(**batch)` works), and one `Encoding` per text (padded) as `.encodings` (also `batch["encodings"]`).
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("encode_batch expects a sequence of texts; for one text use encode()")
        items: list[tuple[str, str | None]] = []
        for i, item in enumerate(texts):
            if isinstance(item, (tuple, list)):
                if len(item) != 2:
                    raise TypeError(f"encode_batch: item {i} must be a str or a (text, pair) tuple, "
                                    f"got a {type(item).__name__} of length {len(item)}")
                items.append((item[0], item[1]))
            else:
                items.append((item, None))
        if padding not in (False, True, "longest", "max_length"):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"return_tensors must be None, 'pt' or 'np', got {return_tensors!r}")

        encodings = self._encode_items(items, max_length, truncation, add_special_tokens, "encode_batch")
        if padding:
            if padding == "max_length":
                target = self._limit(max_length)
            else:  # True / "longest"
                target = max(map(len, encodings), default=0)
            for enc in encodings:
                self._pad(enc, target)

        out: dict[str, Any] = {key: [getattr(e, key) for e in encodings]
                               for key in ("input_ids", "token_type_ids", "attention_mask")}
        if return_tensors is not None:
            lengths = {len(e) for e in encodings}
            if len(lengths) > 1:
                raise ValueError(f"cannot stack sequences of different lengths {sorted(lengths)} into a "
                                 "tensor; pass padding=True (or padding='max_length')")
            for key in ("input_ids", "token_type_ids", "attention_mask"):
                out[key] = self._to_tensor(out[key], return_tensors)
        return BatchEncoding(out, encodings)

    def _limit(self, max_length: int | None) -> int:
        limit = self.model_max_length if max_length is None else max_length
        if not is_positive_int(limit):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        return limit

    def _encode_segments(self, texts: list[str]) -> list[Any]:
        """Each text alone, without specials: the library's (parallel, for batches) encode."""
        try:
            if len(texts) == 1:  # encode() stays off the thread pool; it keeps forked workers happy
                return [self._backend.encode(texts[0], add_special_tokens=False)]
            return self._backend.encode_batch(texts, add_special_tokens=False)
        except TypeError as err:  # the only str the library refuses holds a lone surrogate
            raise surrogate_error(texts) from err

    def _encode_items(
        self,
        items: list[tuple[str, str | None]],
        max_length: int | None,
        truncation: bool,
        add_special_tokens: bool,
        caller: str,
    ) -> list[Encoding]:
        for i, (text, pair) in enumerate(items):
            where = f"item {i}" if caller == "encode_batch" else "text"
            check_text(text, where)
            if pair is not None:
                check_text(pair, f"the pair of {where}" if caller == "encode_batch" else "pair")
        limit = self._limit(max_length)

        # Encode every segment in one (parallel) call, then assemble [CLS] a [SEP] b [SEP] here. A very long
        # single text that will be truncated is encoded from a prefix only (see `_long_prefix`).
        if truncation:
            items = [(self._long_prefix(text, limit) if pair is None else text, pair) for text, pair in items]
        flat = [seg for text, pair in items for seg in ((text,) if pair is None else (text, pair))]
        segments = iter(self._encode_segments(flat))
        out = []
        for i, (_, pair) in enumerate(items):
            a = next(segments)
            b = next(segments) if pair is not None else None
            n_special = self._special_count(b is not None) if add_special_tokens else 0
            len_a, len_b = len(a), 0 if b is None else len(b)
            total = n_special + len_a + len_b
            if total > limit:
                if not truncation:
                    where = f"item {i} of the batch" if caller == "encode_batch" else "the input"
                    raise ValueError(
                        f"{where} is {total} tokens long (special tokens included) but the limit is "
                        f"{limit} (max_length, default model_max_length={self.model_max_length}); "
                        "pass truncation=True to cut it, or a larger max_length"
                    )
                if limit < n_special:
                    raise ValueError(f"max_length={limit} leaves no room for the {n_special} special tokens")
                if b is None:
                    len_a = limit - n_special
                else:
                    len_a, len_b = pair_lengths(len_a, len_b, limit - n_special)
            out.append(self._assemble(a, len_a, b, len_b, add_special_tokens))
        return out

    def _long_prefix(self, text: str, keep: int) -> str:
        """The part of a text that decides its first `keep` tokens, when the text is far longer than that
        (a 10 MB document in one cell): encoding it whole would hold every token's encoding in memory
        only for all but `keep` to be cut. The prefix ends at a whitespace, which no piece crosses, so
        its tokens are the whole text's first tokens; it grows until it has `keep` of them. Texts under
        PREFIX_CHARS_PER_TOKEN characters a token are encoded whole, as always."""
        chars = keep * PREFIX_CHARS_PER_TOKEN
        while chars < len(text):
            cut = max(text.rfind(" ", 0, chars), text.rfind("\n", 0, chars))
            if cut > 0 and len(self._backend.encode(text[:cut], add_special_tokens=False)) >= keep:
                return text[:cut]
            chars *= 4
        return text

    def _special_count(self, pair: bool) -> int:
        if not self._backend_template:
            return 3 if pair else 2
        processor = self._backend.post_processor
        return processor.num_special_tokens_to_add(pair) if processor is not None else 0

    def _assemble(self, a: Any, len_a: int, b: Any | None, len_b: int, add_special_tokens: bool) -> Encoding:
        """BERT's template over the first len_a / len_b tokens of each segment encoding."""
        if self._backend_template:
            return self._assemble_with_backend(a, len_a, b, len_b, add_special_tokens)
        enc = Encoding([], [], [], [], [], [], [])
        segs = [(a, len_a, 0)] + ([] if b is None else [(b, len_b, 1)])
        if add_special_tokens:
            self._push_special(enc, self.cls_token, 0)
        for seg, n, seq_id in segs:
            enc.input_ids += seg.ids[:n]
            enc.token_type_ids += [seq_id] * n
            enc.attention_mask += [1] * n
            enc.tokens += seg.tokens[:n]
            enc.offsets += seg.offsets[:n]
            enc.word_ids += seg.word_ids[:n]
            enc.sequence_ids += [seq_id] * n
            if add_special_tokens:
                self._push_special(enc, self.sep_token, seq_id)
        return enc

    def _assemble_with_backend(self, a: Any, len_a: int, b: Any | None, len_b: int,
                               add_special_tokens: bool) -> Encoding:
        """The file's post-processor over the first len_a / len_b tokens of each segment encoding."""
        a.truncate(len_a)
        if b is not None:
            b.truncate(len_b)
        # Each segment was encoded alone, so the post-processor has already been over it once (the
        # library runs it on every encode, specials or not) and any offset trimming is done; a second
        # pass would trim again (RobertaProcessing moves a piece's start past its "Ġ" each time).
        # The offsets therefore come from the segments, the rest from the post-processed pair.
        offsets = iter(a.offsets if b is None else a.offsets + b.offsets)
        done = self._backend.post_process(a, b, add_special_tokens=add_special_tokens)
        # Segments from the order of the pieces (the library drops the first segment's ids when it
        # post-processes a pair): every template puts $A before $B. Specials: no segment, no word.
        mask = done.special_tokens_mask
        pieces_so_far = accumulate(not special for special in mask)  # pieces up to and including each token
        sequence_ids = [None if special else int(n > len_a) for special, n in zip(mask, pieces_so_far, strict=True)]
        word_ids = [None if seq is None else word for seq, word in zip(sequence_ids, done.word_ids, strict=True)]
        return Encoding(done.ids, done.type_ids, done.attention_mask, done.tokens,
                        [(0, 0) if special else next(offsets) for special in mask], word_ids, sequence_ids)

    def _push_special(self, enc: Encoding, token: str, type_id: int, attention: int = 1) -> None:
        enc.input_ids.append(self._vocab[token])
        enc.token_type_ids.append(type_id)
        enc.attention_mask.append(attention)
        enc.tokens.append(token)
        enc.offsets.append((0, 0))
        enc.word_ids.append(None)
        enc.sequence_ids.append(None)

    def _pad(self, enc: Encoding, length: int) -> None:
        for _ in range(length - len(enc)):  # right padding, masked out, segment 0 as in BERT
            self._push_special(enc, self.pad_token, 0, attention=0)

    @staticmethod
    def _to_tensor(rows: list[list[int]], kind: str) -> Any:
        if kind == "pt":
            import torch  # lazy: tokenizing must not require importing torch

            return torch.tensor(rows, dtype=torch.long)
        import numpy as np

        return np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Ids back to text: pieces joined ("##" glued on), as `transformers` does it."""
        ids = [self._check_id(i) for i in self._as_id_list(ids)]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    # ----------------------------------------------------------------------------- files

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> BertTokenizer:
        """Load a checkpoint's tokenizer from its directory, whichever files it ships.

        - `vocab.txt` (BERT, DistilBERT, ELECTRA): WordPiece with tokenizer_config.json's flags; a
          folder with only vocab.txt gets the defaults. A folder saved by transformers 5 may have no
          vocab.txt; then the vocab and any missing flags come from tokenizer.json's WordPiece model.
        - `tokenizer.json` of any other model (byte-level BPE, Unigram): the file as it is, with the
          special tokens tokenizer_config.json names (or its tokenizer class's defaults).
        - `vocab.json` + `merges.txt` (RoBERTa), `sentencepiece.bpe.model` (XLM-RoBERTa, CamemBERT),
          `spiece.model` (ALBERT), `spm.model` (DeBERTa-v2/v3): converted as transformers' fast
          tokenizer class for them converts them (`layouts.py`), ids and offsets included.

        Missing or unreadable files raise a `TokenizerFileError` (a ValueError; a FileNotFoundError
        too when files are missing) naming the file.
        """
        from bertforge.hub import local_or_hub

        directory = local_or_hub(directory)  # a Hub name (`org/name`): its cached snapshot
        if not directory.is_dir():
            raise TokenizerFilesMissing(f"no tokenizer directory at {directory}")
        config: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
            config.update(read_json_object(directory / name))
        model_type = model_type_of(directory)

        vocab: dict[str, int] | Path = directory / "vocab.txt"
        backend_json: dict[str, Any] = {}
        if not vocab.is_file():
            backend_json = read_json_object(directory / "tokenizer.json")
            model = backend_json.get("model") or {}
            if backend_json and model.get("type") != "WordPiece":  # BPE, Unigram: the file as it is
                return cls._from_backend_file(directory, config, model_type)
            if not backend_json:
                return cls._from_layout(directory, config, model_type)
            vocab = model.get("vocab")
            if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
                raise TokenizerFileError(f"{directory / 'tokenizer.json'}: model.vocab must be an object of "
                                         f"token -> id, got {type(vocab).__name__}")
        elif (directory / "tokenizer.json").is_file():
            backend_json = read_json_object(directory / "tokenizer.json")
        normalizer = backend_json.get("normalizer") or {}
        if normalizer.get("type") != "BertNormalizer":
            normalizer = {}

        kwargs: dict[str, Any] = {
            "lowercase": config.get("do_lower_case", normalizer.get("lowercase", True)),
            "strip_accents": config.get("strip_accents", normalizer.get("strip_accents")),
            "tokenize_chinese_chars": config.get("tokenize_chinese_chars",
                                                 normalizer.get("handle_chinese_chars", True)),
        }
        if config.get("model_max_length") is not None:
            kwargs["model_max_length"] = int(config["model_max_length"])
        for key in _SPECIAL_KEYS:
            if config.get(key) is not None:
                kwargs[key] = special_token_value(config[key])
        if "max_input_chars_per_word" in backend_json.get("model", {}):
            kwargs["max_input_chars_per_word"] = backend_json["model"]["max_input_chars_per_word"]
        return cls(vocab, **kwargs)

    @classmethod
    def _from_layout(cls, directory: Path, config: dict[str, Any], model_type: str | None) -> BertTokenizer:
        """vocab.json + merges.txt or a SentencePiece model, converted as transformers converts them."""
        flavour = flavour_for(directory, config, model_type)
        if flavour is None:
            for have, need in (("vocab.json", "merges.txt"), ("merges.txt", "vocab.json")):
                if (directory / have).is_file():
                    raise TokenizerFilesMissing(f"{directory / need}: missing; a byte-level BPE tokenizer needs "
                                                f"it beside {have}")
            raise TokenizerFilesMissing(f"{directory}: no tokenizer files; expected {EXPECTED}")
        loaded = load_layout(directory, flavour, config)
        return cls._wrap(loaded.backend, directory, model_max_length_of(config), dict(loaded.specials),
                         saved={"tokenizer_class": loaded.tokenizer_class, **loaded.options}, files=loaded.files)

    @classmethod
    def _from_backend_file(cls, directory: Path, config: dict[str, Any], model_type: str | None) -> BertTokenizer:
        """tokenizer.json as it is; special tokens the configs do not name come from the tokenizer
        class they (or config.json's model_type) name, when it is one of `layouts.FLAVOURS`."""
        path = directory / "tokenizer.json"
        backend = read_backend(path)  # a broken file is reported as such before anything it lacks
        flavour = flavour_named(config, model_type) or flavour_for(directory, config, model_type)
        defaults = flavour.specials if flavour is not None else {}
        specials = {key: special_token_value(config[key]) if config.get(key) is not None else defaults.get(key)
                    for key in SPECIAL_KEYS}
        missing = [key for key in ("cls_token", "sep_token", "pad_token", "mask_token") if specials[key] is None]
        if missing:
            raise TokenizerFileError(f"{directory / 'tokenizer_config.json'}: names no {', '.join(missing)} "
                                     "(needed to encode inputs and batches for the model)")
        saved = {"tokenizer_class": config.get("tokenizer_class") or "PreTrainedTokenizerFast",
                 **{key: config[key] for key in _FLAGS if key in config}}
        return cls._wrap(backend, path, model_max_length_of(config), specials, saved=saved,
                         files=original_files(directory, flavour))

    def save_pretrained(self, directory: str | Path) -> None:
        """Write vocab.txt, tokenizer_config.json, special_tokens_map.json and tokenizer.json.

        Each file is replaced atomically, so a crash never leaves a torn vocab next to a new config.
        Any other tokenizer (not WordPiece) writes its tokenizer.json, with tokenizer_config.json
        naming its transformers class, its flags, its special tokens and every added token's
        matching rules (`added_tokens_decoder`), and the original files it came with (vocab.json and
        merges.txt, a SentencePiece model), so that transformers loads the folder to the same ids.
        """
        directory = Path(directory)
        os.makedirs(directory, exist_ok=True)
        if self._backend_template:
            specials = {key: getattr(self, key) for key in SPECIAL_KEYS if getattr(self, key) is not None}
            added = {str(index): {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
                                  "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}
                     for index, token in sorted(self._backend.get_added_tokens_decoder().items())}
            config = {**self._saved, "model_max_length": self.model_max_length, **specials,
                      "added_tokens_decoder": added}
            for name, data in self._files.items():
                write_bytes_atomic(directory / name, data)
            write_text_atomic(directory / "tokenizer_config.json", to_json(config))
            write_text_atomic(directory / "special_tokens_map.json", to_json(specials))
            write_text_atomic(directory / "tokenizer.json", self._backend.to_str(pretty=True))
            return
        specials = {key: getattr(self, key) for key in _SPECIAL_KEYS}
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "model_max_length": self.model_max_length,
            "do_basic_tokenize": True,
            "never_split": None,
            "clean_up_tokenization_spaces": True,
            **specials,
        }
        write_text_atomic(directory / "vocab.txt", "".join(t + "\n" for t in self._id_to_token))
        write_text_atomic(directory / "tokenizer_config.json", to_json(config))
        write_text_atomic(directory / "special_tokens_map.json", to_json(specials))
        write_text_atomic(directory / "tokenizer.json", self._backend.to_str(pretty=True))

    @classmethod
    def train(cls, files: Iterable[str | Path], **options: Any) -> BertTokenizer:
        """Learn a WordPiece vocabulary from text files (BERT's normalisation and word splitting).

        [PAD] [UNK] [CLS] [SEP] [MASK] get ids 0..4; word continuations carry the "##" prefix. Options
        (`tokenizer.train.learn_vocab`): vocab_size (30522), min_frequency (2), lowercase (True), strip_accents (None:
        follow lowercase), tokenize_chinese_chars (True), limit_alphabet (1000), show_progress (True).

        The same text gives the same vocab.txt in every process (see `learn_vocab` for how): the text
        is read twice.
        """
        paths = [str(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
        if not paths:
            raise ValueError("train needs at least one text file")
        for path in paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"training file not found: {path}")
        return cls._learn(lambda probe, trainer: probe.train(paths, trainer), **options)

    @classmethod
    def train_from_texts(cls, texts: Iterable[str], **options: Any) -> BertTokenizer:
        """`train` on texts from anywhere (the rows of a table, the records of a JSON-lines file): the
        same vocabulary as `train` on a file holding those texts, one a line (they are written to a
        temporary file, which training reads twice); the same options."""
        with tempfile.TemporaryDirectory(prefix="bertforge-vocab-") as scratch:
            spooled = Path(scratch) / "texts.txt"
            with spooled.open("w", encoding="utf-8") as handle:
                for text in texts:
                    handle.write(text.replace("\n", " ") + "\n")
            return cls.train([spooled], **options)

    @classmethod
    def _learn(cls, feed: Callable[[BackendTokenizer, Any], None], **options: Any) -> BertTokenizer:
        vocab, normalisation = learn_vocab(feed, **options)
        return cls(vocab, **normalisation)


# The same class under a name that does not suggest WordPiece: it loads every layout above.
Tokenizer = BertTokenizer
