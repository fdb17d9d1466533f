"""Pre-training data: sentence splitting, instances, masking statistics, shards, prepare, loader.

Everything runs on small generated corpora: words are made of two-letter syllables and the vocabulary
holds each syllable as a word start and as a `##` continuation, so every word is 1-3 WordPiece pieces
and whole-word masking has something to keep together.
"""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from bertforge.data import corpus
from bertforge.data import prepare as prepare_module
from bertforge.data.corpus import DataError, InputRange, ReadStats, read_blocks, split_sentences
from bertforge.data.instances import BufferedDraws, DocumentPool, InstanceMaker, SentenceBlock, truncate_pair
from bertforge.data.masking import IGNORE_INDEX, Masker, span_length_distribution
from bertforge.data.prepare import DataWarning, prepare
from bertforge.data.shards import Shard, ShardWriter, list_shards
from bertforge.data.sources import plan_shards

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du", "xa", "zo", "be", "gi", "hu", "fe"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)


# ---------------------------------------------------------------------------------------------------
# generated corpora and a matching tokenizer
# ---------------------------------------------------------------------------------------------------


def _word(rng: np.random.Generator) -> str:
    return "".join(SYLLABLES[i] for i in rng.integers(len(SYLLABLES), size=int(rng.integers(1, 4))))


def _sentence(rng: np.random.Generator, lo: int = 4, hi: int = 18) -> str:
    words = [_word(rng) for _ in range(int(rng.integers(lo, hi)))]
    return " ".join(words).capitalize() + "."


def _bert_layout(rng: np.random.Generator, docs: int, lo: int = 2, hi: int = 20) -> str:
    return "\n\n".join("\n".join(_sentence(rng) for _ in range(int(rng.integers(lo, hi)))) for _ in range(docs)) + "\n"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from bertforge.tokenizer import BertTokenizer

    tokens = SPECIALS + [".", ","] + SYLLABLES + ["##" + s for s in SYLLABLES]
    directory = tmp_path_factory.mktemp("tokenizer")
    BertTokenizer({t: i for i, t in enumerate(tokens)}).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    """Three BERT-layout files, about 600 documents in all."""
    directory = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i, docs in enumerate((250, 200, 150)):
        (directory / f"part{i}.txt").write_text(_bert_layout(rng, docs), encoding="utf-8")
    return directory


def _files(directory: Path) -> dict[str, bytes]:
    """Every data file under train/ and valid/ (the parts that must be reproducible), by relative path."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for sub in ("train", "valid") for p in sorted((directory / sub).glob("*")) if p.is_file()}


def _stable_stats(directory: Path) -> dict:
    stats = json.loads((directory / "stats.json").read_text())
    stats.pop("run")
    for shard in stats["per_shard"]:
        shard.pop("wall_s")
    return stats


# ---------------------------------------------------------------------------------------------------
# corpus: sentences, Gutenberg, blocks, bad input
# ---------------------------------------------------------------------------------------------------


def test_split_sentences_rules() -> None:
    text = ("Mr. Smith met Dr. Watson in St. Louis. They talked. \u201cReally?\u201d she asked. "
            "\u201cYes!\u201d J. R. R. Tolkien wrote it. See No. 5 and e.g. this. It ended... and went on. Done")
    assert split_sentences(text) == [
        "Mr. Smith met Dr. Watson in St. Louis.", "They talked.", "\u201cReally?\u201d she asked.",
        "\u201cYes!\u201d", "J. R. R. Tolkien wrote it.", "See No. 5 and e.g. this.",
        "It ended... and went on.", "Done",
    ]
    assert split_sentences("  \n ") == []
    assert split_sentences("one line\nwrapped here. Next") == ["one line wrapped here.", "Next"]


def test_gutenberg_header_and_footer_are_stripped(tmp_path) -> None:
    body = "First real line.\n\nSecond paragraph here.\n"
    text = ("\ufeffThe Project Gutenberg EBook of Test\r\n\r\n*** START OF THIS PROJECT GUTENBERG EBOOK TEST ***\r\n"
            + body + "\nEnd of the Project Gutenberg EBook of Test\n\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK TEST ***\nLicence text.\n")
    path = tmp_path / "book.txt"
    path.write_text(text, encoding="utf-8")
    start, end, notes = corpus.find_gutenberg_body(path)
    assert notes == []
    assert path.read_bytes()[start:end].decode() == body + "\n"
    plan, _ = plan_shards([path], 1, strip_gutenberg=True)
    assert plan[0][0].first_line == 4
    blocks = list(read_blocks(plan[0][0], plain_text=True))
    assert [s for b in blocks for s in b.sentences] == ["First real line.", "Second paragraph here."]
    plain = tmp_path / "plain.txt"
    plain.write_text(body, encoding="utf-8")
    _, _, notes = corpus.find_gutenberg_body(plain)
    assert any("no Project Gutenberg START marker" in n for n in notes)


def test_read_blocks_bert_layout_documents_and_blocks(tmp_path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("a one.\na two.\n\n\nb one.\nb two.\nb three.\nb four.\nb five.\n   \nc one.\n", encoding="utf-8")
    rng = InputRange(str(path), 0, 0, path.stat().st_size, 1)
    stats = ReadStats()
    blocks = list(read_blocks(rng, block_sentences=3, stats=stats))
    assert [b.sentences for b in blocks] == [
        ["a one.", "a two."], ["b one.", "b two.", "b three."], ["b four.", "b five."], ["c one."]]
    assert [b.new_document for b in blocks] == [True, True, False, True]
    keys = [b.doc_key for b in blocks]
    assert keys[1] == keys[2] and len({keys[0], keys[1], keys[3]}) == 3
    assert blocks[1].location == f"{path}:5" and blocks[3].location == f"{path}:11"
    assert (stats.documents, stats.sentences) == (3, 8)


def test_plain_text_sections_are_documents(tmp_path) -> None:
    path = tmp_path / "book.txt"
    path.write_text("CHAPTER I.\n\nIt was a\ndark night. It rained.\n\nThen it stopped.\n\n\n\n"
                    "CHAPTER II.\n\nMorning came.\n", encoding="utf-8")
    stats = ReadStats()
    blocks = list(read_blocks(InputRange(str(path), 0, 0, path.stat().st_size, 1), plain_text=True, stats=stats))
    assert [b.sentences for b in blocks] == [
        ["CHAPTER I.", "It was a dark night.", "It rained.", "Then it stopped."], ["CHAPTER II.", "Morning came."]]
    assert blocks[1].doc_key == (0, path.read_bytes().index(b"CHAPTER II")) and stats.documents == 2
    with open(path, "rb") as handle:  # where prepare's NotNext prefill finds the same document
        assert corpus.next_document_start(handle, 12, path.stat().st_size, blank_lines=3) == blocks[1].doc_key[1]


def test_document_pool_prefers_other_files_and_keeps_them() -> None:
    rng = np.random.default_rng(0)
    pool = DocumentPool(rng, max_documents=8)
    block = _synthetic_blocks(1)[0]
    for d in range(3):
        pool.add(block._replace(doc_key=(1, d)))
    for d in range(20):  # a long file with many documents does not push file 1 out
        pool.add(block._replace(doc_key=(0, d)))
    assert len(pool) == 8 and sum(k[0] == 1 for k in pool._docs) >= 2
    assert {pool.draw((0, 19), rng).doc_key[0] for _ in range(50)} == {1}  # another file first
    alone = DocumentPool(rng)
    for d in range(3):
        alone.add(block._replace(doc_key=(5, d)))
    assert {alone.draw((5, 1), rng).doc_key for _ in range(50)} == {(5, 0), (5, 2)}
    assert DocumentPool(rng).draw((0, 0), rng) is None


def test_plan_cuts_at_blank_lines_and_is_complete(corpus_dir) -> None:
    files = sorted(corpus_dir.glob("*.txt"))
    plan, _ = plan_shards(files, 5)
    assert len(plan) == 5
    pieces = [r for shard in plan for r in shard]
    for path in files:  # the pieces of each file tile it exactly, and every cut follows a blank line
        mine = [r for r in pieces if r.path == str(path)]
        data = path.read_bytes()
        assert mine[0].start == 0 and mine[-1].end == len(data)
        for left, right in zip(mine, mine[1:], strict=False):
            assert left.end == right.start and data[:right.start].endswith(b"\n\n")
            assert right.first_line == data[:right.start].count(b"\n") + 1
    # sentences read through the plan = sentences of the files
    got = [s for r in pieces for b in read_blocks(r) for s in b.sentences]
    want = [line for p in files for line in p.read_text().splitlines() if line.strip()]
    assert got == want


def test_bad_bytes_skip_replace_error(tmp_path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"Good line one.\nGood line two.\nCaf\xe9 au lait.\nLast one.\n")
    rng = InputRange(str(path), 0, 0, path.stat().st_size, 1)
    stats = ReadStats()
    assert [s for b in read_blocks(rng, stats=stats) for s in b.sentences] == [
        "Good line one.", "Good line two.", "Last one."]
    assert stats.bad_lines == 1 and stats.bad_line_locations == [f"{path}:3"]
    replaced = [s for b in read_blocks(rng, bad_bytes="replace") for s in b.sentences]
    assert replaced[2] == "Caf\ufffd au lait."
    with pytest.raises(DataError, match=rf"{path.name}:3: bytes that are not UTF-8"):
        list(read_blocks(rng, bad_bytes="error"))


def test_overlong_line_is_split_and_reported(tmp_path, monkeypatch) -> None:
    rng_ = np.random.default_rng(1)
    long_line = " ".join(_sentence(rng_, 30, 40) for _ in range(60))  # a paragraph on one line
    path = tmp_path / "long.txt"
    path.write_text(f"Short one.\nShort two.\n{long_line}\n", encoding="utf-8")
    stats = ReadStats()
    sentences = [s for b in read_blocks(InputRange(str(path), 0, 0, path.stat().st_size, 1),
                                        max_line_chars=1000, stats=stats) for s in b.sentences]
    assert stats.overlong_lines == 1 and stats.overlong_locations == [f"{path}:3"]
    assert len(sentences) == 62 and max(map(len, sentences)) <= 1000
    # a line longer than the read limit arrives in pieces, cut at spaces; nothing is lost
    monkeypatch.setattr(corpus, "_MAX_LINE_BYTES", 4096)
    huge = tmp_path / "huge.txt"
    words = [_word(rng_) for _ in range(20000)]
    huge.write_text(" ".join(words) + "\n", encoding="utf-8")
    stats = ReadStats()
    pieces = [s for b in read_blocks(InputRange(str(huge), 0, 0, huge.stat().st_size, 1), max_line_chars=500,
                                     stats=stats) for s in b.sentences]
    assert stats.overlong_lines == 1 and " ".join(pieces).split() == words


# ---------------------------------------------------------------------------------------------------
# instances
# ---------------------------------------------------------------------------------------------------


def _synthetic_blocks(n_docs: int, seed: int = 0) -> list[SentenceBlock]:
    rng = np.random.default_rng(seed)
    blocks = []
    for d in range(n_docs):
        n = int(rng.integers(1, 40))
        sentences = [rng.integers(10, 1000, size=int(rng.integers(3, 40))) for _ in range(n)]
        blocks.append(SentenceBlock.from_sentences(("doc", d), sentences))
    return blocks


def _source_tokens(block_by_key: dict, source: tuple) -> np.ndarray:
    block = block_by_key[source[0]]
    return block.ids[block.offsets[source[1]]:block.offsets[source[2]]]


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    n = len(needle)
    windows = np.lib.stride_tricks.sliding_window_view(haystack, n)
    return bool((windows == needle).all(axis=1).any())


def test_nsp_pairs_statistics_and_sources() -> None:
    blocks = _synthetic_blocks(2500)
    by_key = {b.doc_key: b for b in blocks}
    maker = InstanceMaker(128, CLS, SEP, "nsp", short_seq_prob=0.1)
    pool = DocumentPool(np.random.default_rng(1))
    for block in blocks[:16]:  # like prepare's prefill
        pool.add(block)
    rng = np.random.default_rng(2)
    instances = []
    for block in blocks:
        pool.add(block)
        instances += maker.pairs(block, rng, pool)
    assert len(instances) >= 10_000
    labels = np.array([inst.label for inst in instances])
    assert abs((labels == 0).mean() - 0.5) < 0.02
    assert maker.counters.random_next_fallbacks == 0
    assert maker.counters.one_sentence_documents == sum(b.num_sentences == 1 for b in blocks)
    short = 0
    for inst in instances:
        tokens, b_start = inst.tokens, inst.segment_b_start
        assert len(tokens) <= 128 and tokens[0] == CLS and tokens[b_start - 1] == SEP and tokens[-1] == SEP
        assert (tokens[1:b_start - 1] != SEP).all() and (tokens[b_start:-1] != SEP).all()
        assert b_start - 2 >= 1 and len(tokens) - b_start - 1 >= 1  # both segments non-empty
        a_key, a_first, a_end = inst.a_source
        b_key = inst.b_source[0]
        if inst.label == 0:  # IsNext: B is what follows A in the same document
            assert b_key == a_key and inst.b_source[1] == a_end
        else:  # NotNext: B from another document
            assert b_key != a_key
        assert _contains(_source_tokens(by_key, inst.a_source), tokens[1:b_start - 1])
        assert _contains(_source_tokens(by_key, inst.b_source), tokens[b_start:-1])
        short += len(tokens) < 64
    assert 0.02 < short / len(instances) < 0.2  # short_seq_prob makes some short ones


def test_sop_swaps_consecutive_segments() -> None:
    blocks = _synthetic_blocks(600, seed=3)
    maker = InstanceMaker(64, CLS, SEP, "sop")
    rng = np.random.default_rng(4)
    instances = [inst for block in blocks for inst in maker.pairs(block, rng)]
    labels = np.array([inst.label for inst in instances])
    assert abs(labels.mean() - 0.5) < 0.05
    for inst in instances:
        assert inst.a_source[0] == inst.b_source[0]  # always one document
        if inst.label == 0:
            assert inst.b_source[1] == inst.a_source[2]
        else:  # swapped: the first segment is the one that came second
            assert inst.a_source[1] == inst.b_source[2]


def test_truncation_trims_the_longer_segment_first() -> None:
    rng = np.random.default_rng(0)

    def one_at_a_time(a: int, b: int, limit: int) -> tuple[int, int]:
        while a + b > limit:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b

    for _ in range(2000):
        la, lb, limit = (int(x) for x in rng.integers(1, 200, size=3))
        fa, ba, fb, bb = truncate_pair(la, lb, limit, rng)
        assert (la - fa - ba, lb - fb - bb) == (one_at_a_time(la, lb, limit) if la + lb > limit else (la, lb))
        assert min(fa, ba, fb, bb) >= 0
    # front or back at random: about half the cut tokens come from each end (also with prepare's draws)
    for draws in (rng, BufferedDraws(np.random.default_rng(1))):
        cuts = np.array([truncate_pair(300, 10, 100, draws)[:2] for _ in range(2000)])
        assert abs(cuts[:, 0].mean() / 210 - 0.5) < 0.01 and abs(cuts[:, 0].std() - np.sqrt(210 / 4)) < 0.5
    draws = BufferedDraws(np.random.default_rng(2), size=100)
    values = np.array([draws.integers(3, 7) for _ in range(4000)])
    assert set(values.tolist()) == {3, 4, 5, 6} and abs(values.mean() - 4.5) < 0.05


def test_none_objective_packs_full_sentences() -> None:
    blocks = _synthetic_blocks(300, seed=5)
    maker = InstanceMaker(128, CLS, SEP, "none")
    instances = [inst for block in blocks for inst in maker.pack(block)] + maker.flush()
    lengths = np.array([len(inst.tokens) for inst in instances])
    # full: no instance but the last had room for one more sentence (they are 3..39 tokens, +1 for a [SEP])
    assert lengths.max() <= 128 and lengths[:-1].min() > 128 - 40
    assert all(inst.label == -1 and inst.segment_b_start == len(inst.tokens) for inst in instances)
    # the concatenated content is the sentence stream, documents separated by [SEP]
    body = np.concatenate([inst.tokens[1:-1] for inst in instances])
    stream = np.concatenate([b.ids for b in blocks])
    assert np.array_equal(body[body != SEP], stream)
    assert (body == SEP).sum() + len(instances) - 1 >= len(blocks) - 1 - len(instances)


# ---------------------------------------------------------------------------------------------------
# masking
# ---------------------------------------------------------------------------------------------------

VOCAB = 1000
CONTINUATION = np.zeros(VOCAB, dtype=bool)
CONTINUATION[700:] = True  # ids 700.. are "##" pieces


def _masker(**options) -> Masker:
    return Masker(vocab_size=VOCAB, mask_id=MASK, special_ids=(CLS, SEP, PAD, MASK),
                  exclude_from_random=tuple(range(5)), is_continuation=CONTINUATION, **options)


def _batch(rows: int = 12_000, seed: int = 0, high: int = VOCAB) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, high, size=(rows, 128))
    lengths = rng.integers(12, 129, size=rows)
    ids[:, 0] = CLS
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
        ids[row, n - 1] = SEP
        ids[row, rng.integers(2, n - 2)] = SEP
    return ids


@pytest.mark.parametrize("mode", ["token", "whole_word", "span"])
def test_masking_statistics(mode: str) -> None:
    ids = _batch()
    masker = _masker(whole_word=mode == "whole_word", span=mode == "span")
    result = masker(ids, np.random.default_rng(1))
    chosen = result.labels != IGNORE_INDEX
    maskable = masker.maskable(ids)
    assert not (chosen & ~maskable).any()  # [CLS], [SEP], [PAD] never
    assert (result.labels[chosen] == ids[chosen]).all()
    assert (result.input_ids[~chosen] == ids[~chosen]).all()
    assert abs(chosen.sum() / maskable.sum() - 0.15) < 0.005
    out = result.input_ids[chosen]
    as_mask = (out == MASK).mean()
    kept = (out == ids[chosen]).mean()
    assert abs(as_mask - 0.8) < 0.015 and abs(kept - 0.1) < 0.015 and abs(1 - as_mask - kept - 0.1) < 0.015
    assert not np.isin(out[out != MASK], [PAD, UNK, CLS, SEP]).any()  # random tokens are never specials
    if mode != "token":  # a word is masked whole or not at all
        words = masker._word_ids(ids, maskable)
        keys = (np.arange(len(ids))[:, None] * 1000 + words)[maskable]
        _, group = np.unique(keys, return_inverse=True)
        n_chosen = np.bincount(group, weights=chosen[maskable])
        n_tokens = np.bincount(group)
        assert ((n_chosen == 0) | (n_chosen == n_tokens)).all()
        assert (n_tokens[n_chosen > 0] > 1).any()  # multi-piece words were masked


def test_span_lengths_follow_the_clipped_geometric_law() -> None:
    law = span_length_distribution(0.2, 10)
    assert abs((law * np.arange(1, 11)).sum() - 3.8) < 0.01  # SpanBERT's mean span length
    ids = _batch(8000, seed=2, high=700)  # no "##" pieces: every word is one token
    result = _masker(span=True)(ids, np.random.default_rng(3))
    freq = np.bincount(result.span_lengths, minlength=11)[1:] / len(result.span_lengths)
    assert len(result.span_lengths) > 20_000
    # the last span of a row is kept with probability room/size (so that 15% holds exactly), which
    # shortens spans slightly on average: within 0.03 of the law in every bin, mean within 0.4
    assert np.abs(freq - law).max() < 0.03
    assert 3.4 < result.span_lengths.mean() <= 3.85


def test_max_predictions_caps_with_a_warning() -> None:
    masker = _masker(max_predictions=5)
    with pytest.warns(UserWarning, match="max_predictions=5 caps"):
        result = masker(_batch(200), np.random.default_rng(0))
    assert ((result.labels != IGNORE_INDEX).sum(axis=1) <= 5).all()
    assert masker.capped_rows > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default cap (ceil(0.15 x 128) = 20) never bites
        _masker(max_predictions=20)(_batch(2000), np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------------
# shards
# ---------------------------------------------------------------------------------------------------


def test_shard_round_trip_and_no_empty_shard(tmp_path) -> None:
    writer = ShardWriter(tmp_path, 3, dtype=np.dtype(np.uint16), static=True)
    tokens = [np.array([CLS, 7, 8, SEP, 9, SEP]), np.array([CLS, 5, SEP, 6, 6, 6, SEP])]
    writer.add(tokens, [4, 3], [0, 1], [np.array([1]), np.array([4, 5])], [np.array([70]), np.array([60, 61])])
    writer.add(tokens[:1], [4], [1], [np.array([], dtype=np.int64)], [np.array([], dtype=np.int64)])
    index = writer.close({"note": "x"})
    assert index["instances"] == 3 and index["note"] == "x"
    assert not list(tmp_path.glob("*.tmp"))
    shard = list_shards(tmp_path)[0]
    assert isinstance(shard, Shard) and len(shard) == 3
    item = shard.instance(1)
    assert item["input_ids"].tolist() == tokens[1].tolist() and item["segment_b"] == 3 and item["nsp_label"] == 1
    assert item["mask_positions"].tolist() == [4, 5] and item["mask_targets"].tolist() == [60, 61]
    assert shard.instance(2)["mask_positions"].tolist() == []
    empty = ShardWriter(tmp_path / "empty", 0, dtype=np.dtype(np.uint16), static=False)
    assert empty.close() is None and not (tmp_path / "empty").exists()


# ---------------------------------------------------------------------------------------------------
# prepare, end to end
# ---------------------------------------------------------------------------------------------------


def test_prepare_two_workers_is_deterministic(corpus_dir, tokenizer_dir, tmp_path) -> None:
    options = dict(workers=2, seed=7, dupe_factor=2, validation_fraction=0.05, progress=False)
    first = prepare([corpus_dir], tokenizer_dir, tmp_path / "a", **options)
    prepare([corpus_dir], tokenizer_dir, tmp_path / "b", **options)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _stable_stats(tmp_path / "a") == _stable_stats(tmp_path / "b")
    assert len(first["per_shard"]) == 2 and all(s["instances"] > 0 for s in first["per_shard"])
    assert first["documents"] == 600 and first["warnings"] == []
    assert abs(first["masked_fraction"] - 0.15) < 0.01 and abs(first["is_next_fraction"] - 0.5) < 0.05
    assert first["validation_instances"] > 0 and first["skipped"]["random_next_fallbacks"] == 0
    for shard in list_shards(tmp_path / "a" / "train"):  # no empty shards, no leftovers
        assert len(shard) > 0
    assert not list((tmp_path / "a").rglob("*.tmp"))
    other = prepare([corpus_dir], tokenizer_dir, tmp_path / "c", **{**options, "seed": 8})
    assert _files(tmp_path / "c") != _files(tmp_path / "a")
    # validation does not depend on the seed: comparable losses between runs
    valid = {k: v for k, v in _files(tmp_path / "a").items() if k.startswith("valid")}
    assert valid and valid == {k: v for k, v in _files(tmp_path / "c").items() if k.startswith("valid")}
    assert other["validation_instances"] == first["validation_instances"]


def test_prepare_resumes_after_an_interruption(corpus_dir, tokenizer_dir, tmp_path, monkeypatch) -> None:
    options = dict(workers=1, seed=3, dupe_factor=1, shard_mb=0.03, progress=False)
    monkeypatch.setattr(prepare_module, "_BATCH", 64)  # several writes per shard (masks depend on it too)
    clean = prepare([corpus_dir], tokenizer_dir, tmp_path / "clean", **options)
    assert len(clean["per_shard"]) >= 4

    real_flush = prepare_module._Split.flush
    calls = {"n": 0}

    def crashing_flush(self) -> None:  # dies in the middle of shard 2, after writing some of it
        if self.writer.name == "shard_00002":
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
        real_flush(self)

    monkeypatch.setattr(prepare_module._Split, "flush", crashing_flush)
    with pytest.raises(KeyboardInterrupt):
        prepare([corpus_dir], tokenizer_dir, tmp_path / "run", **options)
    monkeypatch.setattr(prepare_module._Split, "flush", real_flush)
    done = tmp_path / "run" / "done"
    assert sorted(p.name for p in done.iterdir()) == ["shard_00000.json", "shard_00001.json"]
    # a hard kill could also leave a renamed array without its index: it must be rewritten
    (tmp_path / "run" / "train" / "shard_00003.tokens.bin").write_bytes(b"junk")
    (tmp_path / "run" / "train" / "shard_00004.offsets.bin.tmp").write_bytes(b"junk")
    before = {p.name: p.stat().st_mtime_ns for p in done.iterdir()}

    built = []
    real_build = prepare_module._build_shard
    monkeypatch.setattr(prepare_module, "_build_shard", lambda job, cb=None: built.append(job["shard"]) or
                        real_build(job, cb))
    resumed = prepare([corpus_dir], tokenizer_dir, tmp_path / "run", **options)
    assert built == list(range(2, len(clean["per_shard"])))  # only the unfinished shards
    assert {p: done.joinpath(p).stat().st_mtime_ns for p in before} == before
    assert _files(tmp_path / "run") == _files(tmp_path / "clean")
    assert not list((tmp_path / "run").rglob("*.tmp"))
    assert resumed["instances"] == clean["instances"]
    again = prepare([corpus_dir], tokenizer_dir, tmp_path / "run", **{**options, "workers": 2})  # same plan
    assert again["run"]["shards_made"] == 0 and _stable_stats(tmp_path / "run") == _stable_stats(tmp_path / "clean")
    # other arguments on the same directory: refused, not mixed
    with pytest.raises(DataError, match="other options"):
        prepare([corpus_dir], tokenizer_dir, tmp_path / "run", **{**options, "seed": 4})


def test_prepare_plain_text_gutenberg_and_bad_input(tokenizer_dir, tmp_path) -> None:
    rng = np.random.default_rng(9)
    books = tmp_path / "books"
    books.mkdir()
    n_sentences = 0
    for i in range(3):
        paragraphs = []
        for _ in range(60):  # paragraphs of 2-5 sentences, wrapped at 70 columns as Gutenberg books are
            n = int(rng.integers(2, 6))
            n_sentences += n
            paragraphs.append(textwrap.fill(" ".join(_sentence(rng) for _ in range(n)), 70))
        (books / f"book{i}.txt").write_text(
            "The Project Gutenberg EBook of Something\n\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n"
            + "\n\n".join(paragraphs) + "\n\nEnd of the Project Gutenberg EBook\n\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nLicence with words outside the vocabulary.\n",
            encoding="utf-8")
    (books / "empty.txt").write_bytes(b"")
    with pytest.warns(DataWarning, match="empty.txt: empty file, skipped"):
        stats = prepare([books], tokenizer_dir, tmp_path / "out", plain_text=True, strip_gutenberg=True,
                        dupe_factor=1, progress=False)
    assert stats["documents"] == 3 and stats["skipped"]["empty_files"] == 1
    assert stats["sentences"] == n_sentences and stats["instances"] > 50
    assert stats["skipped"]["random_next_fallbacks"] == 0 and abs(stats["is_next_fraction"] - 0.5) < 0.15
    for shard in list_shards(tmp_path / "out" / "train"):  # header and licence words would be [UNK]
        assert not (shard.array("tokens") == UNK).any() and not (shard.array("mask_targets") == UNK).any()
    # one real book (chapters set apart by blank lines): NotNext partners from other chapters
    book = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
    if book.is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)  # a one-sentence section or two
            stats = prepare([book], tokenizer_dir, tmp_path / "book", plain_text=True, dupe_factor=1,
                            progress=False)
        assert stats["documents"] >= 10 and stats["skipped"]["random_next_fallbacks"] == 0
        assert abs(stats["is_next_fraction"] - 0.5) < 0.1

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ok.txt").write_text(_bert_layout(rng, 20), encoding="utf-8")
    (bad / "latin1.txt").write_bytes(b"Kalo mi.\nSu \xe9ta.\nRipo.\n\nVe du.\nXa zo.\n")
    (bad / "single.txt").write_text("Ka lo.\n\nMi ne.\n\nSu ta.\n", encoding="utf-8")
    with pytest.warns(DataWarning) as caught:
        stats = prepare([bad], tokenizer_dir, tmp_path / "out2", dupe_factor=3, progress=False)
    messages = "\n".join(str(w.message) for w in caught)
    assert f"{bad / 'latin1.txt'}:2" in messages and "not UTF-8" in messages
    assert f"3 document(s) of a single sentence (a pair needs two), first at {bad / 'single.txt'}:1, " in messages
    assert stats["skipped"]["bad_lines"] == 1 and stats["skipped"]["one_sentence_documents"] == 3
    with pytest.raises(DataError, match=r"latin1.txt:2: bytes that are not UTF-8"):
        prepare([bad], tokenizer_dir, tmp_path / "out3", dupe_factor=1, bad_bytes="error", progress=False)
    (tmp_path / "void").mkdir()
    (tmp_path / "void" / "a.txt").write_bytes(b"")
    with pytest.raises(DataError, match="all 1 input files are empty"):
        prepare([tmp_path / "void"], tokenizer_dir, tmp_path / "out4", progress=False)
    with pytest.raises(DataError, match="no training instances"), pytest.warns(DataWarning):
        prepare([bad / "single.txt"], tokenizer_dir, tmp_path / "out5", progress=False)
    with pytest.raises(DataError, match="no such file"):
        prepare([tmp_path / "missing.txt"], tokenizer_dir, tmp_path / "out6", progress=False)


# ---------------------------------------------------------------------------------------------------
# loader
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamic_data(corpus_dir, tokenizer_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dynamic")
    prepare([corpus_dir], tokenizer_dir, out, masking="dynamic", whole_word=True, validation_fraction=0.05,
            progress=False)
    return out


def test_rank_split_covers_every_instance_once() -> None:
    from bertforge.data.loader import rank_indices

    for n, world in ((103, 4), (100, 3), (5, 8)):
        parts = [rank_indices(n, epoch=2, seed=1, rank=r, world_size=world) for r in range(world)]
        assert sorted(np.concatenate(parts).tolist()) == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        even = [rank_indices(n, epoch=2, seed=1, rank=r, world_size=world, even=True) for r in range(world)]
        assert len({len(p) for p in even}) == 1
    assert not np.array_equal(rank_indices(50, epoch=0, seed=1, rank=0, world_size=1),
                              rank_indices(50, epoch=1, seed=1, rank=0, world_size=1))


def test_loader_batches_ranks_and_resume(dynamic_data) -> None:
    import torch

    from bertforge.data.loader import PretrainingLoader

    def rows(batches) -> list[tuple]:
        return [tuple(r[r != PAD].tolist()) for b in batches for r in b["input_ids"]]

    full = PretrainingLoader(dynamic_data, 32, seed=5)
    epoch0 = list(full)
    n = len(full.dataset)
    assert len(epoch0) == len(full) == -(-n // 32) and full.state_dict()["epoch"] == 1
    batch = epoch0[0]
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    assert all(v.dtype == torch.long for v in batch.values())
    chosen = batch["labels"] != IGNORE_INDEX
    assert chosen.any() and not (chosen & (batch["attention_mask"] == 0)).any()
    assert ((batch["token_type_ids"] == 1) <= (batch["attention_mask"] == 1)).all()
    epoch1 = list(full)  # a new order and new masks
    assert not torch.equal(epoch0[0]["input_ids"], epoch1[0]["input_ids"])

    # resume: 3 batches, save, a fresh loader goes on: the same batches as without the interruption
    first = PretrainingLoader(dynamic_data, 32, seed=5)
    taken = []
    for b in first:
        taken.append(b)
        if len(taken) == 3:
            break
    state = json.loads(json.dumps(first.state_dict()))
    assert state["offset"] == 96 and state["epoch"] == 0
    second = PretrainingLoader(dynamic_data, 32, seed=5, num_workers=1)
    second.load_state_dict(state)
    rest = list(second)
    for a, b in zip(taken + rest, epoch0, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(next(iter(second))["labels"], epoch1[0]["labels"])  # and on into epoch 1
    with pytest.raises(ValueError, match="world_size"):
        PretrainingLoader(dynamic_data, 32, seed=5, world_size=2).load_state_dict(state)

    # two ranks: each instance exactly once
    ranks = [PretrainingLoader(dynamic_data, 16, seed=5, rank=r, world_size=2) for r in range(2)]
    seen = rows(list(ranks[0])) + rows(list(ranks[1]))
    assert len(seen) == n

    # the validation split is statically masked: the same every time
    valid = PretrainingLoader(dynamic_data, 64, split="valid")
    a, b = list(valid), list(valid)
    assert len(a) > 0 and all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))
    assert abs(float(torch.cat([x["labels"].ne(IGNORE_INDEX).flatten() for x in a]).sum()) /
               float(sum(int(((x["attention_mask"] == 1) & (x["input_ids"] != CLS) & (x["input_ids"] != SEP)).sum())
                         for x in a)) - 0.15) < 0.03


def test_prepared_batches_feed_the_model(dynamic_data) -> None:
    from bertforge import BertConfig, BertForPreTraining
    from bertforge.data.loader import PretrainingLoader

    batch = next(iter(PretrainingLoader(dynamic_data, 4, seed=0)))
    config = BertConfig(vocab_size=39, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    out = BertForPreTraining(config)(**batch)
    assert out.loss is not None and out.loss.isfinite()


def test_cli_prepare(corpus_dir, tokenizer_dir, tmp_path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["prepare", "--input", str(corpus_dir / "part2.txt"), "--tokenizer",
                                 str(tokenizer_dir), "--out", str(tmp_path / "o"), "--objective", "sop",
                                 "--dupe-factor", "1", "--span", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "150 documents" in result.output and (tmp_path / "o" / "stats.json").is_file()
    result = runner.invoke(app, ["prepare", "--input", str(tmp_path / "nope.txt"), "--tokenizer",
                                 str(tokenizer_dir), "--out", str(tmp_path / "p"), "--quiet"])
    assert result.exit_code == 2 and "no such file" in result.output
    result = runner.invoke(app, ["prepare", "--input", str(corpus_dir), "--tokenizer", str(tokenizer_dir),
                                 "--out", str(tmp_path / "q"), "--objective", "mlm", "--quiet"])
    assert result.exit_code == 2 and "objective must be one of" in result.output


def test_prepared_data_carries_its_tokenizer(tmp_path) -> None:
    """The data directory is self-contained: pretrain finds DATA/tokenizer and exports it with final/."""
    from bertforge.pretrain import find_tokenizer, read_dataset_info
    from bertforge.tokenizer import BertTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence number {i} of document {d} is here.\n" + ("\n" if i == 5 else "")
                              for d in range(6) for i in range(6)))
    BertTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False).save_pretrained(tmp_path / "tok")
    prepare([corpus], tmp_path / "tok", tmp_path / "data", max_seq_length=32, progress=False, dupe_factor=1)
    assert (tmp_path / "data" / "tokenizer" / "vocab.txt").read_text() == (tmp_path / "tok" / "vocab.txt").read_text()
    data = tmp_path / "data"
    assert find_tokenizer(data, read_dataset_info(data), None) == data / "tokenizer"


def test_validation_inputs_are_held_out_whole(tmp_path, tokenizer_dir, corpus_dir) -> None:
    """A held-out file (a corpus's test split) goes to valid/ entirely and never reaches training,
    not even as a NotNext partner. Its sentences carry commas, which the training files never do."""
    rng = np.random.default_rng(7)
    held = tmp_path / "test_split.txt"
    held.write_text("\n\n".join("\n".join(_sentence(rng)[:-1] + ", " + _sentence(rng) for _ in range(6))
                                for _ in range(40)) + "\n", encoding="utf-8")
    stats = prepare([corpus_dir], tokenizer_dir, tmp_path / "out", masking="dynamic", validation_fraction=0.0,
                    validation_inputs=[held], progress=False)
    comma = SPECIALS.__len__() + 1  # the id of "," in the fixture vocabulary
    train_tokens = np.concatenate([s.array("tokens") for s in list_shards(tmp_path / "out" / "train")])
    valid_tokens = np.concatenate([s.array("tokens") for s in list_shards(tmp_path / "out" / "valid")])
    assert stats["validation_instances"] > 0 and stats["instances"] > 0
    assert not (train_tokens == comma).any()
    assert (valid_tokens == comma).sum() > 100
