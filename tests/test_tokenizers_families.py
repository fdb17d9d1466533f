"""Every tokenizer file layout the model families ship, against transformers' fast tokenizer for it.

Each tokenizer is built here from a small real model: a byte-level BPE trained with `tokenizers` and
saved as vocab.json + merges.txt (RoBERTa), and SentencePiece unigram and BPE models trained with
`sentencepiece` under each family's file name and special-piece layout (XLM-RoBERTa's and
CamemBERT's sentencepiece.bpe.model, ALBERT's spiece.model, DeBERTa-v2's spm.model). transformers
loads each folder with the family's fast class, bertforge with `BertTokenizer.from_pretrained`, and
ids, pair ids, segment ids and character offsets must agree on every line of a generated corpus of
more than 5,000 lines: book text (the fixture and the bundled novels), accents, CJK, emoji, URLs,
very long words, odd whitespace and special tokens typed in the text. Then the tokenizer.json of
each (as transformers saves it) against PreTrainedTokenizerFast, our save_pretrained read back by
transformers, bad files, and a RoBERTa model fine-tuned and run through the pipeline on the
byte-level BPE tokenizer, where offsets place NER words and QA answers.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
import torch

from bertforge.tokenizer import BertTokenizer, Tokenizer, TokenizerFileError, TokenizerFilesMissing

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
transformers.logging.set_verbosity_error()

from tokenizers import Tokenizer as Backend  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
BOOKS = Path(__file__).resolve().parents[1] / "src" / "bertforge" / "assets" / "gutenberg"

ACCENTED = ["café", "naïve", "résumé", "Ångström", "façade", "jalapeño", "Zürich", "São Paulo", "crème brûlée",
            "Dvořák", "Łódź", "Tiếng Việt", "Ελληνικά", "Москва", "İstanbul", "straße", "ﬁnancial", "Œuvre",
            "e\u0301te\u0301", "n\u0303", "ǅemal", "ΣΟΦΟΣ σοφός", "l'été", "Ｆｕｌｌｗｉｄｔｈ", "ｶﾀｶﾅ", "①②③", "x²"]
CJK = ["東京都に住んでいます。", "我爱北京天安门", "한국어 텍스트입니다", "日本語と中文の混在", "漢字かなカナ",
       "中华人民共和国成立于1949年", "こんにちは、世界！", "「引用」と『二重』"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🎉🎉🎉", "🤖 robots", "☕️", "🏳️‍🌈", "🙂🙃"]
URLS = ["https://example.com/path?query=1&b=two#frag", "http://www.gutenberg.org/ebooks/11",
        "ftp://files.example.org/pub/a_b-c.tar.gz", "mailto:someone@example.co.uk", "www.bertforge.dev/docs/",
        "https://xn--bcher-kva.example/über?q=ä", "user.name+tag@domain.io", "C:\\Users\\name\\file.txt"]
ODD = ["tab\tseparated\twords", "two  spaces   three", "\u00a0non-breaking\u00a0spaces", "zero\u200bwidth",
       "trailing spaces   ", "   leading spaces", "``quoted'' text", "don't won't it's", "3,5 km and 1,000,000",
       "a<mask>b", "<s>inside</s>", "[MASK] and [CLS] typed", "<pad> <unk>", "e.g. i.e. U.S.A.", "#hashtag @user",
       "line\u2028separator", "soft\u00adhyphen", "ÀÉÎÕÜ ÿ", "---- ==== ....", "¿Qué? ¡Sí!"]


def _long_words(rng: random.Random) -> list[str]:
    return ["supercalifragilisticexpialidocious" * rng.randint(2, 6),
            "".join(rng.choice("abcdefghij") for _ in range(rng.randint(60, 260))),
            "9" * rng.randint(30, 120),
            "Pneumonoultramicroscopicsilicovolcanoconiosis-" * rng.randint(1, 4),
            "東" * rng.randint(20, 80)]


def make_corpus(n_lines: int = 5200) -> list[str]:
    """Book lines and mixed lines, deterministic: about half plain prose, the rest prose with accents,
    CJK, emoji, URLs, very long words and odd spacing put in at random places."""
    rng = random.Random(20240607)
    prose = [line for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]
    for book in sorted(BOOKS.glob("*.txt"))[:2]:
        text = book.read_text(encoding="utf-8")
        prose += [line for line in text.splitlines()[400:1400] if line.strip()]
    lines: list[str] = []
    while len(lines) < n_lines:
        line = rng.choice(prose)
        kind = rng.random()
        if kind < 0.5:
            lines.append(line)
            continue
        words = line.split()
        for _ in range(rng.randint(1, 4)):
            pool = rng.choice([ACCENTED, CJK, EMOJI, URLS, ODD, None])
            words.insert(rng.randint(0, len(words)), rng.choice(pool or _long_words(rng)))
        glue = rng.choice([" ", " ", " ", "", "  "])
        lines.append(glue.join(words) if glue else " ".join(words).replace(" ", "", rng.randint(0, 2)))
    return lines


CORPUS = make_corpus()
TRAIN_TEXT = CORPUS[:2000]

# (our name, transformers' fast class, file, config.json model_type)
FAMILIES = {
    "roberta": ("RobertaTokenizerFast", "vocab.json", "roberta"),
    "xlm-roberta": ("XLMRobertaTokenizerFast", "sentencepiece.bpe.model", "xlm-roberta"),
    "camembert": ("CamembertTokenizerFast", "sentencepiece.bpe.model", "camembert"),
    "albert": ("AlbertTokenizerFast", "spiece.model", "albert"),
    "deberta-v2": ("DebertaV2TokenizerFast", "spm.model", "deberta-v2"),
}
# Each family's special pieces as its released models lay them out.
SPM_SPECIALS = {
    "xlm-roberta": {},  # <unk> 0, <s> 1, </s> 2: fairseq's dictionary is put in front when loading
    "camembert": {},
    "albert": dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>", bos_piece="[CLS]", eos_piece="[SEP]",
                   control_symbols=["[MASK]"]),
    "deberta-v2": dict(pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]",
                       eos_piece="[SEP]", unk_piece="[UNK]"),  # [MASK] is not a piece: it is added after them
}
# Every family on the whole corpus, with a unigram model as the released checkpoints have; BPE-type
# SentencePiece models on part of it. (transformers 5 cannot load a BPE-type model as CamemBERT's:
# CamembertTokenizer builds its vocabulary from the pieces as a list, and a BPE model's come as a dict.)
CASES = [("roberta", None), ("xlm-roberta", "unigram"), ("camembert", "unigram"), ("albert", "unigram"),
         ("deberta-v2", "unigram"), ("xlm-roberta", "bpe"), ("albert", "bpe"), ("deberta-v2", "bpe")]


def train_sentencepiece(kind: str, **specials) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TRAIN_TEXT), model_writer=out, vocab_size=1000,
                                   model_type=kind, minloglevel=2, num_threads=2, seed_sentencepiece_size=20000,
                                   user_defined_symbols=["://"], **specials)
    return out.getvalue()


def train_byte_level_bpe(lines: list[str], vocab_size: int = 1200) -> Backend:
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(lines, trainer)
    return backend


def build_folder(directory: Path, family: str, kind: str | None) -> Path:
    """A checkpoint's tokenizer folder: the family's file(s) and a config.json naming its model_type."""
    directory.mkdir(parents=True, exist_ok=True)
    if family == "roberta":
        train_byte_level_bpe(TRAIN_TEXT).model.save(str(directory))
    else:
        (directory / FAMILIES[family][1]).write_bytes(train_sentencepiece(kind, **SPM_SPECIALS[family]))
    (directory / "config.json").write_text(json.dumps({"model_type": FAMILIES[family][2]}))
    return directory


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[tuple[str, str | None], Path]:
    root = tmp_path_factory.mktemp("layouts")
    return {(family, kind): build_folder(root / f"{family}-{kind}", family, kind) for family, kind in CASES}


def hf_class(family: str):
    return getattr(transformers, FAMILIES[family][0])


def mismatches(ours: BertTokenizer, theirs, lines: list[str], *, type_ids: bool = True,
               without_specials: int = 1000) -> list[str]:
    """Every line alone, the lines in pairs (each line once: 0 with 1, 2 with 3, ...) and the first
    `without_specials` lines without special tokens: ids, segment ids and character offsets, ours
    against transformers', each library encoding in batches."""
    problems: list[str] = []
    pairs = list(zip(lines[0::2], lines[1::2], strict=False))
    bare = lines[:without_specials]
    runs = [
        ("single", lines, ours.encode_batch(lines, max_length=10**9)["encodings"],
         theirs(lines, return_offsets_mapping=True, return_token_type_ids=True)),
        ("pair", pairs, ours.encode_batch(pairs, max_length=10**9)["encodings"],
         theirs([a for a, _ in pairs], [b for _, b in pairs], return_offsets_mapping=True,
                return_token_type_ids=True)),
        ("no specials", bare, ours.encode_batch(bare, max_length=10**9, add_special_tokens=False)["encodings"],
         theirs(bare, return_offsets_mapping=True, add_special_tokens=False)),
    ]
    for what, inputs, encodings, reference in runs:
        for i, enc in enumerate(encodings):
            offsets = [tuple(o) for o in reference["offset_mapping"][i]]
            if enc.input_ids != reference["input_ids"][i]:
                problems.append(f"{what} {i} ids: {inputs[i]!r:.100}\n ours {enc.input_ids[:20]}\n "
                                f"theirs {reference['input_ids'][i][:20]}")
            elif enc.offsets != offsets:
                problems.append(f"{what} {i} offsets: {inputs[i]!r:.100}\n ours {enc.offsets[:12]}\n "
                                f"theirs {offsets[:12]}")
            elif type_ids and "token_type_ids" in reference and enc.token_type_ids != reference["token_type_ids"][i]:
                problems.append(f"{what} {i} token_type_ids differ")
    return problems


def assert_no_mismatches(problems: list[str], n_lines: int) -> None:
    assert not problems, f"{len(problems)} mismatches over {n_lines} lines, first:\n" + "\n".join(problems[:5])


# ------------------------------------------------------------------------------------------------
# the corpus
# ------------------------------------------------------------------------------------------------
def test_corpus_is_large_and_mixed() -> None:
    assert len(CORPUS) >= 5000
    joined = "\n".join(CORPUS)
    for needle in ("東京", "😀", "https://", "é", "\t", "supercalifragilistic", "<mask>", "[MASK]", "Москва"):
        assert needle in joined, needle
    assert max(len(word) for line in CORPUS for word in line.split()) >= 120
    assert sum(line.isascii() for line in CORPUS) > len(CORPUS) // 3  # plenty of plain book text too


# ------------------------------------------------------------------------------------------------
# each layout against transformers' class for it
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("family", "kind"), CASES, ids=[f"{f}-{k or 'bytelevel'}" for f, k in CASES])
def test_layout_matches_transformers_fast_tokenizer(folders, family: str, kind: str | None) -> None:
    folder = folders[family, kind]
    ours = BertTokenizer.from_pretrained(folder)
    theirs = hf_class(family).from_pretrained(folder)
    assert ours.vocab == theirs.get_vocab()
    for key in ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token", "bos_token", "eos_token"):
        assert getattr(ours, key) == str(getattr(theirs, key)), key
    assert ours.pad_token_id == theirs.pad_token_id and ours.mask_token_id == theirs.mask_token_id
    lines = CORPUS if kind != "bpe" else CORPUS[:1500]
    assert_no_mismatches(mismatches(ours, theirs, lines), len(lines))
    assert len(ours.encode("hello", "world")) == len(theirs("hello", "world")["input_ids"])


def _as_albert_normalises(text: str) -> str:
    """ALBERT's steps before its SentencePiece model: `` and '' to ", accents stripped (NFKD), lower case."""
    text = unicodedata.normalize("NFKD", text.replace("``", '"').replace("''", '"'))
    return "".join(ch for ch in text if unicodedata.category(ch) != "Mn").lower()


# Unigram models, as the released checkpoints have. A BPE-type .model is read as a Unigram model of
# its pieces, as transformers reads it, and does not cut as sentencepiece's BPE does (docs/checkpoints.md).
SPM_CASES = [(f, k) for f, k in CASES if k == "unigram"]
CONTROL_PIECES = ("<s>", "</s>", "<pad>", "<unk>", "<mask>", "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")


@pytest.mark.slow
@pytest.mark.parametrize(("family", "kind"), SPM_CASES, ids=[f"{f}-{k}" for f, k in SPM_CASES])
def test_pieces_match_sentencepiece_itself(folders, family: str, kind: str) -> None:
    """The format's own library is the oracle: every corpus line is cut into the pieces `sentencepiece`
    cuts it into (user-defined pieces such as `://` included), or into another cut of the same total
    score where Viterbi has a tie (runs of one character: `東東東…`, `999…`). Lines with a control piece
    typed in them are left out: those are matched as special tokens, as transformers does, where
    sentencepiece spells them out."""
    folder = folders[family, kind]
    processor = spm.SentencePieceProcessor(model_file=str(folder / FAMILIES[family][1]))
    ours = BertTokenizer.from_pretrained(folder)
    lines = [line for line in CORPUS if not any(piece in line for piece in CONTROL_PIECES)]
    if family == "albert":  # ALBERT's steps before the model, as transformers' fast class runs them, differ
        # from Python's on two scripts: NFKD's Hangul jamo are not put back together by the tokenizers
        # library's precompiled map, and its lower case has no final sigma (ΣΟΦΟΣ -> σοφοσ, not σοφος)
        lines = [line for line in lines if not any("\uac00" <= ch <= "\ud7a3" or ch == "Σ" for ch in line)]
    typed = [_as_albert_normalises(line) if family == "albert" else line for line in lines]
    encodings = ours.encode_batch(lines, max_length=10**9, add_special_tokens=False)["encodings"]

    def score(pieces: list[str]) -> float:
        return sum(processor.get_score(processor.piece_to_id(p)) for p in pieces)

    problems, ties = [], 0
    for line, text, enc in zip(lines, typed, encodings, strict=True):
        expected = [processor.id_to_piece(i) for i in processor.encode(text)]  # unknown text as <unk>
        pieces = ours.convert_ids_to_tokens(enc.input_ids)
        if family == "camembert":  # the fairseq dictionary's own <unk> stands for sentencepiece's
            pieces = [processor.id_to_piece(processor.unk_id()) if p == ours.unk_token else p for p in pieces]
        if pieces == expected:
            continue
        if "".join(pieces) == "".join(expected) and abs(score(pieces) - score(expected)) < 1e-3:
            ties += 1
            continue
        problems.append(f"{line!r:.100}\n ours {pieces[:16]}\n sentencepiece {expected[:16]}")
    assert_no_mismatches(problems, len(lines))
    assert len(lines) > 4000 and ties < len(lines) // 10
    assert "://" in processor.encode("see http://www.example.org", out_type=str)


def test_the_released_ids_of_special_tokens(folders) -> None:
    """The fairseq offsets and special pieces land where the released checkpoints have them."""
    def ids(family: str, kind: str = "unigram") -> dict[str, int]:
        tok = BertTokenizer.from_pretrained(folders[family, None if family == "roberta" else kind])
        return {t: tok.convert_tokens_to_ids(t) for t in (tok.cls_token, tok.pad_token, tok.sep_token, tok.unk_token,
                                                          tok.mask_token)}
    assert ids("roberta") == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    xlmr = BertTokenizer.from_pretrained(folders["xlm-roberta", "unigram"])
    assert ids("xlm-roberta") == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": xlmr.vocab_size - 1}
    camembert = BertTokenizer.from_pretrained(folders["camembert", "unigram"])
    assert ids("camembert") == {"<s>": 5, "<pad>": 1, "</s>": 6, "<unk>": 3, "<mask>": camembert.vocab_size - 1}
    assert ids("albert") == {"[CLS]": 2, "<pad>": 0, "[SEP]": 3, "<unk>": 1, "[MASK]": 4}
    deberta = BertTokenizer.from_pretrained(folders["deberta-v2", "unigram"])
    assert ids("deberta-v2") == {"[CLS]": 1, "[PAD]": 0, "[SEP]": 2, "[UNK]": 3, "[MASK]": deberta.vocab_size - 1}
    for tok in (xlmr, BertTokenizer.from_pretrained(folders["roberta", None])):  # <s> A </s></s> B </s>
        enc = tok.encode("a", "b")
        assert [t for t, s in zip(enc.tokens, enc.sequence_ids, strict=True) if s is None] == ["<s>"] + ["</s>"] * 3
        assert [s for s in enc.sequence_ids if s is not None] == sorted(s for s in enc.sequence_ids if s is not None)
        assert enc.tokens[enc.sequence_ids.index(1) - 2:enc.sequence_ids.index(1)] == ["</s>", "</s>"]


FLAG_CASES = [
    ("roberta", None, {"add_prefix_space": True}),
    ("roberta", None, {"trim_offsets": False}),
    ("xlm-roberta", "unigram", {"add_prefix_space": False}),
    ("albert", "unigram", {"do_lower_case": False, "keep_accents": True}),
    ("deberta-v2", "unigram", {"do_lower_case": True, "split_by_punct": True}),
    ("deberta-v2", "bpe", {"add_prefix_space": False}),
    ("roberta", None, {"mask_token": {"content": "<mask>", "lstrip": True, "rstrip": False, "normalized": False,
                                      "single_word": False, "__type": "AddedToken"}}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "kind", "flags"), FLAG_CASES)
def test_tokenizer_config_flags_match_transformers(folders, tmp_path, family, kind, flags) -> None:
    folder = shutil.copytree(folders[family, kind], tmp_path / "tok")
    (folder / "tokenizer_config.json").write_text(json.dumps(flags))
    lines = CORPUS[:600]
    assert_no_mismatches(mismatches(BertTokenizer.from_pretrained(folder), hf_class(family).from_pretrained(folder),
                                    lines), len(lines))


def test_the_class_is_chosen_by_tokenizer_config_then_model_type_then_file(folders, tmp_path) -> None:
    model = folders["camembert", "unigram"] / "sentencepiece.bpe.model"
    folder = tmp_path / "spm"
    folder.mkdir()
    shutil.copy(model, folder)
    assert BertTokenizer.from_pretrained(folder).cls_token_id == 0  # the file alone: XLM-RoBERTa's layout
    (folder / "config.json").write_text(json.dumps({"model_type": "camembert"}))
    assert BertTokenizer.from_pretrained(folder).cls_token_id == 5
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizerFast"}))
    assert BertTokenizer.from_pretrained(folder).cls_token_id == 0
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    assert BertTokenizer.from_pretrained(folder).cls_token_id == 5  # not a layout: model_type decides


# ------------------------------------------------------------------------------------------------
# tokenizer.json, and what we save
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokenizer_json_matches_pretrained_tokenizer_fast(folders, tmp_path, family: str) -> None:
    """The folder as transformers saves it (tokenizer.json and its config) is read as it is."""
    kind = None if family == "roberta" else "unigram"
    hf_class(family).from_pretrained(folders[family, kind]).save_pretrained(str(tmp_path))
    for name in ("vocab.json", "merges.txt", FAMILIES[family][1]):
        (tmp_path / name).unlink(missing_ok=True)  # tokenizer.json alone
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert (ours.cls_token, ours.sep_token, ours.mask_token) == (theirs.cls_token, theirs.sep_token, theirs.mask_token)
    lines = CORPUS[:1000]
    assert_no_mismatches(mismatches(ours, theirs, lines), len(lines))


@pytest.mark.slow
def test_any_other_tokenizer_json_with_its_configs_special_tokens(tmp_path) -> None:
    """A Unigram tokenizer.json made with `tokenizers` alone (NFKC, whitespace and punctuation split,
    a BERT-style template), its special tokens named only in tokenizer_config.json."""
    backend = Backend(models.Unigram())
    backend.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Metaspace()])
    backend.decoder = decoders.Metaspace()
    specials = ["<cls>", "<sep>", "<pad>", "<unk>", "<mask>"]
    backend.train_from_iterator(TRAIN_TEXT[:1000], trainers.UnigramTrainer(vocab_size=800, special_tokens=specials,
                                                                     unk_token="<unk>", show_progress=False))
    backend.post_processor = processors.TemplateProcessing(
        single="<cls> $A <sep>", pair="<cls> $A <sep> $B:1 <sep>:1",
        special_tokens=[("<cls>", backend.token_to_id("<cls>")), ("<sep>", backend.token_to_id("<sep>"))])
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"cls_token": "<cls>", "sep_token": "<sep>", "pad_token": "<pad>", "unk_token": "<unk>",
              "mask_token": "<mask>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert_no_mismatches(mismatches(ours, theirs, CORPUS), len(CORPUS))
    assert ours.encode("A b", "c").token_type_ids == [0, 0, 0, 0, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_pretrained_loads_in_transformers_to_the_same_ids(folders, tmp_path, family: str) -> None:
    kind = {"roberta": None, "camembert": "unigram"}.get(family, "bpe")
    ours = BertTokenizer.from_pretrained(folders[family, kind])
    ours.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == FAMILIES[family][0].removesuffix("Fast")
    originals = ["vocab.json", "merges.txt"] if family == "roberta" else [FAMILIES[family][1]]
    for name in originals:  # the original files come along, byte for byte
        assert (tmp_path / name).read_bytes() == (folders[family, kind] / name).read_bytes()
    lines = CORPUS[:400]
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(auto).__name__ == FAMILIES[family][0].removesuffix("Fast")  # the family's class, rebuilt by it
    for theirs in (auto, transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))):  # tokenizer.json as is
        assert_no_mismatches(mismatches(ours, theirs, lines, type_ids=False, without_specials=100), len(lines))
    again = BertTokenizer.from_pretrained(tmp_path)
    assert again.vocab == ours.vocab and again.model_max_length == ours.model_max_length
    assert [e.input_ids for e in again.encode_batch(lines)["encodings"]] == \
        [e.input_ids for e in ours.encode_batch(lines)["encodings"]]


# ------------------------------------------------------------------------------------------------
# encoding around the backend: truncation, words
# ------------------------------------------------------------------------------------------------
def test_pair_truncation_keeps_the_family_template(folders) -> None:
    tok = BertTokenizer.from_pretrained(folders["roberta", None])
    prose = [line for line in CORPUS if line.isascii() and len(line) > 50]
    text, pair = " ".join(prose[:3]), " ".join(prose[3:6])
    enc = tok.encode(text, pair, max_length=40, truncation=True)
    assert len(enc) == 40
    assert [enc.tokens[i] for i in (0, enc.tokens.index("</s>"), enc.tokens.index("</s>") + 1, -1)] == \
        ["<s>", "</s>", "</s>", "</s>"]
    for token, (start, end), seq in zip(enc.tokens, enc.offsets, enc.sequence_ids, strict=True):
        if seq is not None:  # every piece's span is its text, without the space it carries
            assert (text, pair)[seq][start:end] == tok.backend.decode([tok.convert_tokens_to_ids(token)]).lstrip(" ")
    with pytest.raises(ValueError, match="limit is 40"):
        tok.encode(text, pair, max_length=40)


@pytest.mark.parametrize(("family", "kind"), [("roberta", None), ("xlm-roberta", "unigram"), ("albert", "bpe")])
def test_words_are_the_texts_words_with_their_spans(folders, family, kind) -> None:
    tok = BertTokenizer.from_pretrained(folders[family, kind])
    for line in CORPUS[:300]:
        words = tok.words(line)
        assert all(line[start:end] == word and word.strip() == word and word for word, (start, end) in words)
        assert "".join(w for w, _ in words) == "".join(line.split())


# ------------------------------------------------------------------------------------------------
# bad files: one line naming the file, a ValueError
# ------------------------------------------------------------------------------------------------
def _error(folder: Path) -> TokenizerFileError:
    with pytest.raises(TokenizerFileError) as info:
        BertTokenizer.from_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    return info.value


def test_missing_files(tmp_path) -> None:
    error = _error(tmp_path)
    assert str(tmp_path) in str(error) and "vocab.json with merges.txt" in str(error) and "spiece.model" in str(error)
    assert isinstance(error, FileNotFoundError)
    assert isinstance(_error(tmp_path / "nowhere"), FileNotFoundError)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    assert str(tmp_path / "merges.txt") in str(_error(tmp_path))


def test_malformed_vocab_json_and_merges_txt(folders, tmp_path) -> None:
    folder = shutil.copytree(folders["roberta", None], tmp_path / "bpe")
    vocab_text = (folder / "vocab.json").read_text()
    (folder / "vocab.json").write_text(vocab_text[: len(vocab_text) // 2])
    assert str(folder / "vocab.json") in str(_error(folder)) and "not JSON" in str(_error(folder))
    (folder / "vocab.json").write_text(json.dumps(["a", "b"]))
    assert "expected a non-empty JSON object" in str(_error(folder))
    (folder / "vocab.json").write_text(json.dumps({"a": 0, "b": "1"}))
    assert "'b'" in str(_error(folder))
    (folder / "vocab.json").write_text(vocab_text)

    merges = (folder / "merges.txt").read_text().split("\n")
    (folder / "merges.txt").write_text("\n".join(merges[:5] + ["three tokens here"] + merges[5:]))
    assert f"{folder / 'merges.txt'}:6:" in str(_error(folder))
    (folder / "merges.txt").write_text("\n".join(merges[:3] + ["zzz qqq"] + merges[3:]))
    assert "'zzz'" in str(_error(folder)) and ":4:" in str(_error(folder))
    (folder / "merges.txt").write_bytes(b"#version: 0.2\n\xff\xfe\n")
    assert "merges.txt:2" in str(_error(folder))


@pytest.mark.parametrize("family", ["xlm-roberta", "albert", "deberta-v2"])
def test_a_sentencepiece_file_that_is_not_one(tmp_path, family) -> None:
    path = tmp_path / FAMILIES[family][1]
    for data in (os.urandom(4096), b"", b"plain text, not a model\n" * 20):
        path.write_bytes(data)
        error = _error(tmp_path)
        assert str(path) in str(error) and "not a SentencePiece model" in str(error)


def test_a_broken_tokenizer_json_and_config(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"')
    assert str(tmp_path / "tokenizer.json") in str(_error(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    assert "not a tokenizers tokenizer.json" in str(_error(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text("[1, 2")
    assert str(tmp_path / "tokenizer_config.json") in str(_error(tmp_path))


def test_the_cli_turns_a_bad_tokenizer_into_one_line_and_exit_2(tmp_path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    result = CliRunner().invoke(app, ["tokenizer", "encode", str(tmp_path), "hello"])
    assert result.exit_code == 2 and "not a tokenizers tokenizer.json" in result.output
    assert "Traceback" not in result.output


def test_the_neutral_name_is_the_same_class() -> None:
    assert Tokenizer is BertTokenizer and issubclass(TokenizerFilesMissing, TokenizerFileError)


# ------------------------------------------------------------------------------------------------
# a RoBERTa model on the byte-level BPE tokenizer: fine-tune, pipeline, NER words and QA answers
# ------------------------------------------------------------------------------------------------
SENTENCES = [
    (["anna", "smith", "flew", "from", "paris", "to", "rome", "with", "bob", "."],
     ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-LOC", "O", "B-PER", "O"]),
    (["the", "mayor", "of", "berlin", "met", "maria", "lopez", "in", "madrid", "on", "monday", "."],
     ["O", "O", "O", "B-LOC", "O", "B-PER", "I-PER", "O", "B-LOC", "O", "O", "O"]),
    (["john", "lives", "in", "new", "york", "and", "works", "for", "acme", "."],
     ["B-PER", "O", "O", "B-LOC", "I-LOC", "O", "O", "O", "O", "O"]),
]
CONTEXTS = ["Anna Smith flew from Paris to Rome with Bob in 1948, arriving at dawn.",
            "The Eiffel Tower is in Paris, and John lives in New York."]
QUESTIONS = [("Where did Anna fly to?", 0, "Rome"), ("Who flew with Anna?", 0, "Bob"),
             ("When did she fly?", 0, "1948"), ("Where is the Eiffel Tower?", 1, "Paris"),
             ("Where does John live?", 1, "New York")]
CLASSIFY = Path(__file__).parent / "fixtures" / "classify"


@pytest.fixture(scope="module")
def roberta_bpe(tmp_path_factory) -> Path:
    """A random roberta-tiny whose tokenizer is a byte-level BPE (vocab.json + merges.txt) trained on
    the fixtures' words, saved with the model."""
    from bertforge.model import RobertaForMaskedLM, registry

    root = tmp_path_factory.mktemp("roberta_bpe")
    text = [line for name in ("reviews.csv", "reviews-dev.csv", "new.csv")
            for line in (CLASSIFY / name).read_text(encoding="utf-8").splitlines()[1:]]
    text += [" ".join(words) for words, _ in SENTENCES] + CONTEXTS + [q for q, _, _ in QUESTIONS]
    train_byte_level_bpe(text * 5, vocab_size=400).model.save(str(root))
    tokenizer = BertTokenizer.from_pretrained(root)
    torch.manual_seed(0)
    config = registry.from_preset("roberta-tiny", vocab_size=tokenizer.vocab_size,
                                  pad_token_id=tokenizer.pad_token_id, max_position_embeddings=130)
    RobertaForMaskedLM(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    return root / "encoder"


def test_the_checkpoint_carries_the_byte_level_files(roberta_bpe: Path) -> None:
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= {p.name for p in roberta_bpe.iterdir()}
    theirs = transformers.AutoTokenizer.from_pretrained(str(roberta_bpe))
    ours = BertTokenizer.from_pretrained(roberta_bpe)
    assert type(theirs).__name__.startswith("Roberta")
    assert_no_mismatches(mismatches(ours, theirs, CONTEXTS + CORPUS[:200], type_ids=False), 202)


def test_classification_fine_tunes_and_predicts_through_the_pipeline(roberta_bpe: Path, tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.finetune import finetune

    settings = {"train": str(CLASSIFY / "reviews.csv"), "dev": str(CLASSIFY / "reviews-dev.csv"),
                "test": str(CLASSIFY / "new.csv")}
    finetune("classify", None, roberta_bpe, None, tmp_path / "run", epochs=2, batch_size=4, max_length=32,
             task_settings=settings, progress=False, verbose=False)
    seed = tmp_path / "run" / "seed-1"
    rows = [json.loads(line) for line in (seed / "predictions-test.jsonl").read_text().splitlines()]
    classify = pipeline(str(seed))
    assert classify.tokenizer.cls_token == "<s>" and classify.tokenizer.backend.model.__class__.__name__ == "BPE"
    answers = classify([row["text"] for row in rows])
    assert [a["label"] for a in answers] == [row["label"] for row in rows]
    for answer, row in zip(answers, rows, strict=True):
        assert answer["score"] == pytest.approx(row["score"], abs=1e-5)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tagger(roberta_bpe: Path, tmp_path_factory) -> Path:
    """The RoBERTa model fine-tuned (to memorisation) on the tagged sentences."""
    from bertforge.finetune import finetune

    root = tmp_path_factory.mktemp("tagger")
    train = _jsonl(root / "tags.jsonl", [{"tokens": w, "tags": t} for w, t in SENTENCES])
    finetune("tag", None, roberta_bpe, None, root / "run", epochs=20, batch_size=4, max_length=32, lr=5e-3,
             task_settings={"train": str(train), "dev": str(train)}, progress=False, verbose=False)
    return root / "run" / "seed-1"


def _gold_entities(text: str, words: list[str], tags: list[str]) -> list[list]:
    gold: list[list] = []
    for word, label, start in zip(words, tags, _starts(text, words), strict=True):
        if label.startswith("B-"):
            gold.append([label[2:], start, start + len(word)])
        elif label.startswith("I-"):
            gold[-1][2] = start + len(word)
    return gold


def test_ner_tags_the_words_the_tokenizer_finds(tagger: Path) -> None:
    """Raw text -> `words()` (each word's characters) -> the tag task's features -> tags per word."""
    from bertforge.finetune import load_for_task
    from bertforge.tasks import make_task
    from bertforge.tasks.base import run_model

    tokenizer = BertTokenizer.from_pretrained(tagger)
    task = make_task("tag", "tag", {})
    labels = list(json.loads((tagger / "config.json").read_text())["id2label"].values())
    texts = ["  ".join(words) for words, _ in SENTENCES]  # two spaces: spans must still be exact
    found = [tokenizer.words(text) for text in texts]
    for text, (words, _), spans in zip(texts, SENTENCES, found, strict=True):
        assert [w for w, _ in spans] == words
        assert [text[start:end] for _, (start, end) in spans] == words
    examples = [task.inference_example(i, {"words": [w for w, _ in spans]}) for i, spans in enumerate(found)]
    features = task.featurize(examples, tokenizer, 32)
    outputs = run_model(load_for_task(task.job, tagger), features, task.output_names, token_outputs=task.token_outputs)
    predictions = task.postprocess(examples, features, outputs, label_names=labels)
    assert [getattr(p, "tags", p) for p in predictions] == [tags for _, tags in SENTENCES]


def test_ner_pipeline_entities_are_characters_of_the_text(tagger: Path) -> None:
    from bertforge import pipeline

    tag = pipeline(str(tagger))
    assert tag.task == "token-classification"
    texts = ["  ".join(words) for words, _ in SENTENCES]
    for text, (words, tags), entities in zip(texts, SENTENCES, tag(texts), strict=True):
        for entity in entities:
            assert text[entity["start"]:entity["end"]] == entity["text"] == entity["text"].strip()
        assert [[e["label"], e["start"], e["end"]] for e in entities] == _gold_entities(text, words, tags)


def _starts(text: str, words: list[str]) -> list[int]:
    starts, position = [], 0
    for word in words:
        position = text.index(word, position)
        starts.append(position)
        position += len(word)
    return starts


@pytest.mark.slow
def test_qa_answers_are_spans_of_the_context(roberta_bpe: Path, tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.finetune import finetune
    from bertforge.tasks import make_task

    rows = [{"id": f"q{i}", "question": q, "context": CONTEXTS[c],
             "answers": {"text": [a], "answer_start": [CONTEXTS[c].index(a)]}}
            for i, (q, c, a) in enumerate(QUESTIONS)]
    train = _jsonl(tmp_path / "qa.jsonl", rows)
    # every gold answer is exactly the characters of its pieces (offsets trimmed of the "Ġ" space once)
    task = make_task("qa", "qa", {"dev": str(train), "version": "1.1"})
    tokenizer = BertTokenizer.from_pretrained(roberta_bpe)
    features = task.featurize(task.read(None, "dev"), tokenizer, 64)
    for feature, (_, c, answer) in zip(features, QUESTIONS, strict=True):
        window = feature.meta
        first = feature.inputs["start_positions"] - window.context_start + window.first_piece
        last = feature.inputs["end_positions"] - window.context_start + window.first_piece
        assert CONTEXTS[c][window.offsets[first][0]:window.offsets[last][1]] == answer

    finetune("qa", None, roberta_bpe, None, tmp_path / "run", epochs=80, batch_size=5, max_length=64, lr=3e-3,
             task_settings={"train": str(train), "dev": str(train), "version": "1.1"}, progress=False, verbose=False)
    qa = pipeline(str(tmp_path / "run" / "seed-1"))
    answers = qa([{"question": q, "context": CONTEXTS[c]} for q, c, _ in QUESTIONS])
    for answer, (_, c, _) in zip(answers, QUESTIONS, strict=True):
        assert CONTEXTS[c][answer["start"]:answer["end"]] == answer["answer"] == answer["answer"].strip()
    assert sum(a["answer"] == gold for a, (_, _, gold) in zip(answers, QUESTIONS, strict=True)) >= 4
