"""The tokenizer files checkpoints ship, and the `tokenizers` pipeline each one stands for.

`BertTokenizer.from_pretrained` reads `vocab.txt` (WordPiece) and `tokenizer.json` itself; this module
builds a `tokenizers.Tokenizer` from the other layouts, exactly as transformers' fast tokenizer class
for that checkpoint builds it (same model, normalizer, pre-tokenizer, post-processor, added tokens, in
the same order), so that ids and character offsets agree:

| files | transformers class | pipeline |
|---|---|---|
| `vocab.json` + `merges.txt` | RobertaTokenizer | byte-level BPE, `<s> A </s></s> B </s>`, offsets trimmed |
| `sentencepiece.bpe.model` | XLMRobertaTokenizer | Unigram, fairseq ids (`<s> <pad> </s> <unk>`, piece i -> i + 1), `<mask>` last |
| `sentencepiece.bpe.model` | CamembertTokenizer | Unigram, `<s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED` first, `<mask>` last |
| `spiece.model` | AlbertTokenizer | Unigram, `` `` ``/`''` to `"`, NFKD + accents stripped, lower-cased, `[CLS] A [SEP] B [SEP]` |
| `spm.model` | DebertaV2Tokenizer | Unigram, whitespace runs to one space, NFC, `[CLS] A [SEP] B [SEP]` |

The layout is picked from the files present; where one file serves two classes
(`sentencepiece.bpe.model`), tokenizer_config.json's `tokenizer_class` or config.json's `model_type`
decides. A SentencePiece `.model` is read with sentencepiece's own protobuf module (`ModelProto`): the
pieces, their scores and types, the trainer's unk id and the normaliser's precompiled character map.
Nothing is unpickled.

Errors are `TokenizerFileError` (a ValueError): one line naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from bertforge.fileio import NotUtf8Error, decode_utf8

# transformers' order of the named special tokens (SPECIAL_TOKENS_ATTRIBUTES): the order they are
# added in, which decides the ids of those the vocabulary lacks.
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spiece.model", "spm.model")
EXPECTED = ("vocab.txt (WordPiece), tokenizer.json, vocab.json with merges.txt (byte-level BPE), "
            "or a SentencePiece model (" + ", ".join(SENTENCEPIECE_FILES) + ")")


class TokenizerFileError(ValueError):
    """A tokenizer file that cannot be used: `path: what is wrong` on one line."""


class TokenizerFilesMissing(TokenizerFileError, FileNotFoundError):
    """No tokenizer directory, or none of the files of a layout in it (also a FileNotFoundError)."""


# ------------------------------------------------------------------------------------------------
# what a layout gives the tokenizer
# ------------------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """A built backend and what `BertTokenizer` needs around it."""

    backend: Backend
    specials: dict[str, str | None]  # SPECIAL_KEYS -> token (None: the layout has none)
    tokenizer_class: str  # transformers' class, written back to tokenizer_config.json
    options: dict[str, Any]  # the class's flags as used (add_prefix_space, do_lower_case, ...)
    files: dict[str, bytes] = field(default_factory=dict)  # the original files, written back by save_pretrained


@dataclass
class Built:
    """What a flavour's builder returns: the backend without added tokens and post-processor, the
    model's own added tokens (SentencePiece control and user-defined pieces), the post-processor
    (made once every token has its id) and the original files."""

    backend: Backend
    pieces: list[AddedToken]
    post_processor: Callable[[Backend], Any]
    files: dict[str, bytes]


@dataclass(frozen=True)
class Flavour:
    """One transformers tokenizer class: its files, default special tokens and flags, and its builder."""

    tokenizer_class: str
    files: tuple[str, ...]
    specials: dict[str, str]
    options: dict[str, Any]
    build: Callable[[Path, dict[str, Any], dict[str, Any]], Built]
    mask_lstrip: bool = False  # the class makes a plain-string mask token strip the space before it

    @property
    def stem(self) -> str:
        """The class name as a model_type is spelt (transformers' convention: XLMRobertaTokenizer is
        the tokenizer of model_type xlm-roberta, hyphens aside)."""
        return self.tokenizer_class.lower().removesuffix("tokenizer")


# ------------------------------------------------------------------------------------------------
# byte-level BPE: vocab.json + merges.txt
# ------------------------------------------------------------------------------------------------
def read_bpe_files(vocab_path: Path, merges_path: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab.json (token -> id) and merges.txt ("a b" per line, `#version` lines skipped), read as the
    `tokenizers` library reads them, each fault reported with its file (and line)."""
    try:
        vocab = json.loads(decode_utf8(vocab_path.read_bytes(), vocab_path))
    except json.JSONDecodeError as exc:
        raise TokenizerFileError(f"{vocab_path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                                 "expected an object of token -> id") from None
    except NotUtf8Error as exc:
        raise TokenizerFileError(str(exc)) from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerFileError(f"{vocab_path}: expected a non-empty JSON object of token -> id, "
                                 f"got {type(vocab).__name__}")
    seen: dict[int, str] = {}
    for token, index in vocab.items():
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise TokenizerFileError(f"{vocab_path}: the id of {token!r} is {index!r}, not an int >= 0")
        if index in seen:
            raise TokenizerFileError(f"{vocab_path}: {seen[index]!r} and {token!r} share the id {index}")
        seen[index] = token
    try:
        text = decode_utf8(merges_path.read_bytes(), merges_path)
    except NotUtf8Error as exc:
        raise TokenizerFileError(str(exc)) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    merges = []
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerFileError(f"{merges_path}:{number}: {line!r:.60} is not a merge (two tokens and one space)")
        left, right = parts
        for token in (left, right, left + right):
            if token not in vocab:
                raise TokenizerFileError(f"{merges_path}:{number}: the merge {line!r:.60} needs {token!r}, "
                                         f"which {vocab_path.name} lacks")
        merges.append((left, right))
    return vocab, merges


def _build_byte_level(directory: Path, options: dict[str, Any], specials: dict[str, Any]) -> Built:
    """RobertaTokenizer: BPE without an unknown piece, ByteLevel pre-tokenizer and decoder,
    RobertaProcessing (`<s> A </s></s> B </s>`, offsets trimmed of the spaces the pieces carry)."""
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    vocab, merges = read_bpe_files(vocab_path, merges_path)
    backend = Backend(models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="",
                                 end_of_word_suffix="", fuse_unk=False))
    add_prefix_space = bool(options["add_prefix_space"])
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    sep, cls = _text(specials["sep_token"]), _text(specials["cls_token"])
    post = lambda b: processors.RobertaProcessing(  # noqa: E731
        (sep, b.token_to_id(sep)), (cls, b.token_to_id(cls)), trim_offsets=bool(options["trim_offsets"]),
        add_prefix_space=add_prefix_space)
    return Built(backend, [], post, {"vocab.json": vocab_path.read_bytes(), "merges.txt": merges_path.read_bytes()})


# ------------------------------------------------------------------------------------------------
# SentencePiece models
# ------------------------------------------------------------------------------------------------
def read_sentencepiece(path: Path) -> Any:
    """The ModelProto of a SentencePiece `.model` file, parsed with sentencepiece's protobuf module."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except Exception as exc:  # not installed, or a protobuf runtime older than its generated code wants
        raise TokenizerFileError(f"{path}: reading a SentencePiece model needs the sentencepiece and protobuf "
                                 f"packages ({type(exc).__name__}: {exc}); pip install -U sentencepiece protobuf"
                                 ) from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # google.protobuf.message.DecodeError; protobuf has no stable public path for it
        raise TokenizerFileError(f"{path}: not a SentencePiece model (the protobuf does not parse: {exc})") from None
    if not proto.pieces:
        raise TokenizerFileError(f"{path}: not a SentencePiece model (no pieces)")
    unk = proto.trainer_spec.unk_id
    if not 0 <= unk < len(proto.pieces):
        raise TokenizerFileError(f"{path}: the unknown piece's id {unk} is outside the {len(proto.pieces)} pieces")
    return proto


def _sentencepiece_added_tokens(proto: Any) -> list[AddedToken]:
    """Control pieces (type 3), matched in the raw text as special tokens.

    User-defined pieces (type 4) stay in the Unigram vocabulary and are not added tokens: sentencepiece
    segments them inside a word (`http://www` -> `▁http`, `://`, `w`), with no `▁` put before what
    follows them, which an added token's split would do."""
    return [AddedToken(p.piece, normalized=False, special=True) for p in proto.pieces if p.type == 3]


def _words_then_metaspace(prepend_scheme: str) -> Any:
    """Split on whitespace, then "▁" before each word (XLM-RoBERTa's, CamemBERT's, ALBERT's classes)."""
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                    pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend_scheme)])


def _template(cls: str, sep: str, *, fairseq: bool, ids_of: tuple[Any, Any] | None = None) -> Callable[[Backend], Any]:
    """`cls A sep B sep` with segment ids 0/1, or fairseq's `cls A sep sep B sep`, all segment 0.

    `ids_of`: the tokens whose ids the template's cls and sep stand for, when they are named otherwise
    (AlbertTokenizer writes [CLS] and [SEP] in its template whatever its cls and sep tokens are).
    """
    def build(backend: Backend) -> Any:
        cls_id, sep_id = (_text(t) for t in ids_of) if ids_of else (cls, sep)
        ids = [(cls, backend.token_to_id(cls_id)), (sep, backend.token_to_id(sep_id))]
        if fairseq:
            return processors.TemplateProcessing(single=[cls, "$A", sep], pair=[cls, "$A", sep, sep, "$B", sep],
                                                 special_tokens=ids)
        return processors.TemplateProcessing(single=f"{cls}:0 $A:0 {sep}:0",
                                             pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1", special_tokens=ids)
    return build


def _unigram(path: Path, vocab: list[tuple[str, float]], unk_id: int) -> Backend:
    try:
        return Backend(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    except Exception as exc:  # the library's errors carry no type of their own
        raise TokenizerFileError(f"{path}: cannot build a Unigram model from its pieces ({exc})") from None


def _build_xlm_roberta(directory: Path, options: dict[str, Any], specials: dict[str, Any]) -> Built:
    """XLMRobertaTokenizer: fairseq's dictionary in front of the pieces (`<s> <pad> </s> <unk>`, then
    piece i at id i + 1 from piece 3 on), `<mask>` after them; the precompiled normaliser only."""
    path = directory / "sentencepiece.bpe.model"
    proto = read_sentencepiece(path)
    head = [_text(specials[key]) for key in ("bos_token", "pad_token", "eos_token", "unk_token")]
    vocab = [(token, 0.0) for token in head] + [(p.piece, p.score) for p in proto.pieces[3:]]
    vocab.append((_text(specials["mask_token"]), 0.0))
    backend = _unigram(path, vocab, 3)
    _fairseq_pipeline(backend, proto, options)
    post = _template(_text(specials["bos_token"]), _text(specials["eos_token"]), fairseq=True)
    return Built(backend, _sentencepiece_added_tokens(proto), post, {path.name: path.read_bytes()})


def _build_camembert(directory: Path, options: dict[str, Any], specials: dict[str, Any]) -> Built:
    """CamembertTokenizer: `<s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED` in front of the pieces
    (piece i at id i + 4 from piece 1 on), `<mask>` after them; `<s>` and `</s>` are the pieces'."""
    path = directory / "sentencepiece.bpe.model"
    proto = read_sentencepiece(path)
    unk = _text(specials["unk_token"])
    vocab = [("<s>NOTUSED", 0.0), (_text(specials["pad_token"]), 0.0), ("</s>NOTUSED", 0.0), (unk, 0.0),
             ("<unk>NOTUSED", -100.0)] + [(p.piece, p.score) for p in proto.pieces[1:]]
    vocab.append((_text(specials["mask_token"]), 0.0))
    backend = _unigram(path, vocab, next((i for i, (token, _) in enumerate(vocab) if token == unk), 0))
    _fairseq_pipeline(backend, proto, options)
    post = _template(_text(specials["bos_token"]), _text(specials["eos_token"]), fairseq=True)
    return Built(backend, _sentencepiece_added_tokens(proto), post, {path.name: path.read_bytes()})


def _build_albert(directory: Path, options: dict[str, Any], specials: dict[str, Any]) -> Built:
    """AlbertTokenizer: the pieces as they are (unknown piece at id 1), `` and '' to ", NFKD and accents
    stripped unless keep_accents, lower case if do_lower_case, then the precompiled normaliser."""
    path = directory / "spiece.model"
    proto = read_sentencepiece(path)
    backend = _unigram(path, [(p.piece, p.score) for p in proto.pieces], 1)
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not options["keep_accents"]:
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if options["do_lower_case"]:
        steps.append(normalizers.Lowercase())
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if options["add_prefix_space"] else "never"
    backend.pre_tokenizer = _words_then_metaspace(prepend)
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    post = _template("[CLS]", "[SEP]", fairseq=False, ids_of=(specials["cls_token"], specials["sep_token"]))
    return Built(backend, _sentencepiece_added_tokens(proto), post, {path.name: path.read_bytes()})


def _build_deberta_v2(directory: Path, options: dict[str, Any], specials: dict[str, Any]) -> Built:
    """DebertaV2Tokenizer: the pieces as they are; lower case if do_lower_case, then the model's
    precompiled normaliser with trailing spaces stripped and space runs made one (a model without one:
    whitespace runs and newlines/tabs to one space, NFC, trailing spaces stripped);
    punctuation split off if split_by_punct; `[CLS] A [SEP] B [SEP]`."""
    path = directory / "spm.model"
    proto = read_sentencepiece(path)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    unk = (_text(specials["unk_token"]), 0.0)
    backend = _unigram(path, vocab, vocab.index(unk) if unk in vocab else proto.trainer_spec.unk_id)
    steps = [normalizers.Lowercase()] if options["do_lower_case"] else []
    if proto.normalizer_spec.precompiled_charsmap:  # the model's own normaliser, as sentencepiece runs it
        steps += [normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                  normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(r" {2,}"), " ")]
    else:
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
    backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if options["add_prefix_space"] else "first"
    splits = [pre_tokenizers.Punctuation(behavior="isolated")] if options["split_by_punct"] else []
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)])
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    post = _template(_text(specials["cls_token"]), _text(specials["sep_token"]), fairseq=False)
    return Built(backend, _sentencepiece_added_tokens(proto), post, {path.name: path.read_bytes()})


def _fairseq_pipeline(backend: Backend, proto: Any, options: dict[str, Any]) -> None:
    """XLM-RoBERTa's and CamemBERT's normaliser (the model's precompiled map, if any), pre-tokenizer
    (whitespace split, then ▁ before each word) and decoder."""
    if proto.normalizer_spec.precompiled_charsmap:
        backend.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    prepend = "always" if options["add_prefix_space"] else "never"
    backend.pre_tokenizer = _words_then_metaspace(prepend)
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)


FAIRSEQ = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>",
           "pad_token": "<pad>", "mask_token": "<mask>"}
BERT_LIKE = {"bos_token": "[CLS]", "eos_token": "[SEP]", "sep_token": "[SEP]", "cls_token": "[CLS]",
             "mask_token": "[MASK]"}
FLAVOURS: dict[str, Flavour] = {f.tokenizer_class: f for f in (
    Flavour("RobertaTokenizer", ("vocab.json", "merges.txt"), FAIRSEQ,
            {"add_prefix_space": False, "trim_offsets": True}, _build_byte_level),
    Flavour("XLMRobertaTokenizer", ("sentencepiece.bpe.model",), FAIRSEQ,
            {"add_prefix_space": True}, _build_xlm_roberta),
    Flavour("CamembertTokenizer", ("sentencepiece.bpe.model",), FAIRSEQ,
            {"add_prefix_space": True}, _build_camembert, mask_lstrip=True),
    Flavour("AlbertTokenizer", ("spiece.model",), {**BERT_LIKE, "unk_token": "<unk>", "pad_token": "<pad>"},
            {"do_lower_case": True, "keep_accents": False, "add_prefix_space": True, "trim_offsets": True},
            _build_albert),
    Flavour("DebertaV2Tokenizer", ("spm.model",), {**BERT_LIKE, "unk_token": "[UNK]", "pad_token": "[PAD]"},
            {"do_lower_case": False, "split_by_punct": False, "add_prefix_space": True}, _build_deberta_v2),
)}


# ------------------------------------------------------------------------------------------------
# choosing and loading
# ------------------------------------------------------------------------------------------------
def _text(token: Any) -> str:
    return str(token.content) if isinstance(token, AddedToken) else str(token)


def added_token(value: Any, *, special: bool) -> AddedToken:
    """A token from tokenizer_config.json: a string, or a serialised AddedToken with its flags."""
    if isinstance(value, AddedToken):
        return value
    if isinstance(value, dict):
        return AddedToken(str(value["content"]), single_word=bool(value.get("single_word", False)),
                          lstrip=bool(value.get("lstrip", False)), rstrip=bool(value.get("rstrip", False)),
                          normalized=bool(value.get("normalized", not special)),
                          special=bool(value.get("special", special)))
    return AddedToken(str(value), special=special)


def _by_class(config: dict[str, Any]) -> Flavour | None:
    return FLAVOURS.get(str(config.get("tokenizer_class") or "").removesuffix("Fast"))


def _by_model_type(model_type: str | None) -> Flavour | None:
    stem = (model_type or "").replace("-", "").replace("_", "").lower()
    return next((f for f in FLAVOURS.values() if f.stem == stem), None)


def flavour_for(directory: Path, config: dict[str, Any], model_type: str | None) -> Flavour | None:
    """The tokenizer class whose files are in `directory`: the one tokenizer_config.json names, else
    the one of config.json's model_type, else the first whose files are all there."""
    present = [f for f in FLAVOURS.values() if all((directory / name).is_file() for name in f.files)]
    for flavour in (_by_class(config), _by_model_type(model_type)):
        if flavour in present:
            return flavour
    return present[0] if present else None


def flavour_named(config: dict[str, Any], model_type: str | None) -> Flavour | None:
    """The tokenizer class a folder's configs name, whatever files it has (for a tokenizer.json's defaults)."""
    return _by_class(config) or _by_model_type(model_type)


def load_layout(directory: Path, flavour: Flavour, config: dict[str, Any]) -> Loaded:
    """Build `flavour`'s tokenizer from its files, with the special tokens and flags of `config`
    (tokenizer_config.json and special_tokens_map.json), adding tokens in transformers' order: the
    config's added_tokens_decoder, the named special tokens, then the model's control and
    user-defined pieces."""
    options = {key: default if config.get(key) is None else config[key] for key, default in flavour.options.items()}
    specials: dict[str, Any] = {}
    for key in SPECIAL_KEYS:
        value = config.get(key, flavour.specials.get(key))
        if value is None:
            specials[key] = None
            continue
        token = added_token(value, special=True)
        if key == "mask_token" and flavour.mask_lstrip and not isinstance(value, dict):
            token = AddedToken(_text(token), lstrip=True, special=True)
        specials[key] = token
    built = flavour.build(directory, options, specials)
    backend = built.backend

    to_add: list[AddedToken] = []
    declared = config.get("added_tokens_decoder") or {}
    try:
        for _, value in sorted(declared.items(), key=lambda item: int(item[0])):
            to_add.append(added_token(value, special=True))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise TokenizerFileError(f"{directory / 'tokenizer_config.json'}: added_tokens_decoder is not a map of "
                                 f"id -> token ({type(exc).__name__}: {exc})") from None
    for key in SPECIAL_KEYS:
        token = specials[key]
        if token is not None:
            token.special = True
            to_add.append(token)
    to_add += built.pieces
    seen: set[str] = set()
    unique = []
    for token in to_add:
        if _text(token) not in seen:
            seen.add(_text(token))
            unique.append(token)
    backend.add_tokens(unique)
    backend.post_processor = built.post_processor(backend)
    return Loaded(backend, {key: None if token is None else _text(token) for key, token in specials.items()},
                  flavour.tokenizer_class, options, built.files)


def model_type_of(directory: Path) -> str | None:
    """config.json's model_type, if the folder is a checkpoint (a bad config.json is the model loader's
    to report, not the tokenizer's)."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def original_files(directory: Path, flavour: Flavour | None) -> dict[str, bytes]:
    """The flavour's own files, as they are, when a tokenizer.json came with them (written back beside it)."""
    if flavour is None:
        return {}
    return {name: (directory / name).read_bytes() for name in flavour.files if (directory / name).is_file()}
