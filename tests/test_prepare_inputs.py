"""`prepare` on the corpora people have: compressed text, JSON lines, Parquet, directories and globs
mixing them, bad records, `--part I/N` and the merge of the parts, bounded memory on Parquet.

Every input is generated here, from the same syllable vocabulary as test_data.py.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import warnings
from pathlib import Path

import numpy as np
import pytest
import zstandard

from bertforge.data import corpus, records, sources
from bertforge.data.corpus import DataError, InputRange, ReadStats
from bertforge.data.prepare import DataWarning, merge_parts, prepare
from bertforge.data.records import RecordError
from bertforge.data.sources import expand_inputs, plan_shards, read_blocks

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du", "xa", "zo", "be", "gi", "hu", "fe"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
            ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}


def _sentence(rng: np.random.Generator) -> str:
    words = ["".join(SYLLABLES[i] for i in rng.integers(len(SYLLABLES), size=int(rng.integers(1, 4))))
             for _ in range(int(rng.integers(4, 14)))]
    return " ".join(words).capitalize() + "."


def _documents(rng: np.random.Generator, n: int) -> list[list[str]]:
    return [[_sentence(rng) for _ in range(int(rng.integers(2, 12)))] for _ in range(n)]


def _bert_layout(docs: list[list[str]]) -> str:
    return "\n\n".join("\n".join(doc) for doc in docs) + "\n"


def _jsonl(docs: list[list[str]], field: str = "text") -> str:
    return "".join(json.dumps({"id": i, field: "\n".join(doc)}) + "\n" for i, doc in enumerate(docs))


def _write_parquet(path: Path, docs: list[list[str]], rows_per_group: int, column: str = "text") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(docs))), column: ["\n".join(doc) for doc in docs]})
    pq.write_table(table, path, row_group_size=rows_per_group)


def _sentences_of(ranges, **options) -> list[str]:
    return [s for r in ranges for b in read_blocks(r, **options) for s in b.sentences]


def _train_valid(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for sub in ("train", "valid") for p in sorted((directory / sub).glob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from bertforge.tokenizer import BertTokenizer

    tokens = SPECIALS + [".", ","] + SYLLABLES + ["##" + s for s in SYLLABLES]
    directory = tmp_path_factory.mktemp("tokenizer")
    BertTokenizer({t: i for i, t in enumerate(tokens)}).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory) -> tuple[Path, list[list[str]]]:
    """A directory of every kind: text, .txt.zst, JSONL, .jsonl.gz, Parquet (4 row groups), and files
    a directory does not contribute (.csv, .json). Returns it and all its documents."""
    directory = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(3)
    docs = [_documents(rng, n) for n in (60, 50, 40, 30, 80)]
    (directory / "a.txt").write_text(_bert_layout(docs[0]), encoding="utf-8")
    (directory / "b.txt.zst").write_bytes(COMPRESS[".zst"](_bert_layout(docs[1]).encode()))
    (directory / "c.jsonl").write_text(_jsonl(docs[2]), encoding="utf-8")
    (directory / "sub").mkdir()
    (directory / "sub" / "d.jsonl.gz").write_bytes(gzip.compress(_jsonl(docs[3]).encode()))
    _write_parquet(directory / "e.parquet", docs[4], rows_per_group=20)
    (directory / "notes.csv").write_text("a,b\n")
    (directory / "meta.json").write_text("{}\n")
    return directory, [doc for group in docs for doc in group]


# ---------------------------------------------------------------------------------------------------
# reading each kind
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_compressed_text_reads_as_the_plain_file(tmp_path, suffix, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    text = ("*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n" + _bert_layout(_documents(rng, 40))
            + "\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nLicence.\n")
    plain = tmp_path / "book.txt"
    plain.write_text(text, encoding="utf-8")
    packed = tmp_path / f"book.txt{suffix}"
    packed.write_bytes(COMPRESS[suffix](text.encode()))
    for strip in (False, True):
        want_plan, _ = plan_shards([plain], 1, strip_gutenberg=strip)
        got_plan, _ = plan_shards([packed], 3, strip_gutenberg=strip)
        assert len(got_plan) == 1 and len(got_plan[0]) == 1  # a compressed stream is one piece of work
        got, want = got_plan[0][0], want_plan[0][0]
        assert (got.start, got.first_line) == (want.start, want.first_line)
        blocks = list(read_blocks(got, block_sentences=5))
        assert [b.sentences for b in blocks] == [b.sentences for b in read_blocks(want, block_sentences=5)]
        assert [b.doc_key for b in blocks] == [b.doc_key for b in read_blocks(want, block_sentences=5)]
    # a line longer than the read limit comes in pieces cut at spaces, also from a stream
    monkeypatch.setattr(corpus, "_MAX_LINE_BYTES", 4096)
    words = [_sentence(rng).rstrip(".") for _ in range(3000)]
    huge = tmp_path / f"huge.txt{suffix}"
    huge.write_bytes(COMPRESS[suffix](("Short one.\n" + " ".join(words) + "\nLast one").encode()))
    stats = ReadStats()
    [body], _ = sources.input_bodies([huge])
    pieces = _sentences_of([body], max_line_chars=500, stats=stats)
    assert pieces[0] == "Short one." and pieces[-1] == "Last one" and stats.overlong_lines == 1
    assert " ".join(pieces[1:-1]).split() == " ".join(words).split()


def test_compressed_input_prepares_the_same_shards(tmp_path, tokenizer_dir) -> None:
    rng = np.random.default_rng(2)
    text = _bert_layout(_documents(rng, 120))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "c.txt").write_text(text, encoding="utf-8")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "c.txt.xz").write_bytes(lzma.compress(text.encode()))
    options = dict(objective="sop", dupe_factor=2, validation_fraction=0.05, progress=False)
    a = prepare([tmp_path / "plain"], tokenizer_dir, tmp_path / "a", **options)
    b = prepare([tmp_path / "packed"], tokenizer_dir, tmp_path / "b", **options)
    assert a["documents"] == b["documents"] == 120
    assert _train_valid(tmp_path / "a") == _train_valid(tmp_path / "b")


def test_jsonl_plain_and_compressed_one_document_per_record(tmp_path) -> None:
    rng = np.random.default_rng(4)
    docs = _documents(rng, 200)
    plain = tmp_path / "c.jsonl"
    plain.write_text(_jsonl(docs, field="body"), encoding="utf-8")
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    want = [s for doc in docs for s in doc]
    plan, _ = plan_shards([plain], 4)
    assert len(plan) == 4  # plain JSON lines are cut between lines
    data = plain.read_bytes()
    for shard in plan:
        for r in shard:
            assert r.kind == "jsonl" and (r.start == 0 or data[r.start - 1:r.start] == b"\n")
            assert r.first_line == data[:r.start].count(b"\n") + 1
    stats = ReadStats()
    assert _sentences_of([r for shard in plan for r in shard], field="body", stats=stats) == want
    assert stats.documents == 200 and stats.bad_records == 0
    [body], _ = sources.input_bodies([packed])
    blocks = list(read_blocks(body, field="body", block_sentences=4))
    assert [s for b in blocks for s in b.sentences] == want
    assert sum(b.new_document for b in blocks) == 200  # records never merge: one document each
    assert blocks[0].location == f"{packed}:1"
    # running prose in a record: --plain-text splits it into sentences
    prose = tmp_path / "prose.jsonl"
    prose.write_text(json.dumps({"text": "First one here. Second one there.\n\nA new paragraph."}) + "\n")
    [body], _ = sources.input_bodies([prose])
    assert _sentences_of([body], plain_text=True) == ["First one here.", "Second one there.", "A new paragraph."]


@pytest.mark.slow
def test_parquet_row_groups_are_the_unit_and_memory_stays_bounded(tmp_path, monkeypatch) -> None:
    import pyarrow as pa

    rng = np.random.default_rng(5)
    docs = [[_sentence(rng) for _ in range(30)] for _ in range(3200)]  # ~4 MB of text, 32 row groups
    path = tmp_path / "big.parquet"
    _write_parquet(path, docs, rows_per_group=100)
    text_bytes = sum(len("\n".join(d).encode()) for d in docs)
    plan, _ = plan_shards([path], 5)
    pieces = [r for shard in plan for r in shard]
    assert len(plan) == 5 and all(r.kind == "parquet" for r in pieces)
    assert [(r.start, r.end) for r in pieces] == sorted((r.start, r.end) for r in pieces)
    assert pieces[0].start == 0 and pieces[-1].end == 32
    assert all(a.end == b.start and b.first_line == 1 + 100 * b.start for a, b in zip(pieces, pieces[1:], strict=False))

    real = records._parquet_batches
    seen = {"rows": [], "allocated": []}

    def watched(path_, groups, column):
        for batch in real(path_, groups, column):
            seen["rows"].append(batch.num_rows)
            seen["allocated"].append(pa.total_allocated_bytes())
            yield batch

    monkeypatch.setattr(records, "_parquet_batches", watched)
    stats = ReadStats()
    before = pa.total_allocated_bytes()
    got = _sentences_of(pieces, block_sentences=64, stats=stats)
    assert got == [s for doc in docs for s in doc] and stats.documents == 3200
    assert len(seen["rows"]) == 32 and max(seen["rows"]) <= 100  # batches never span row groups
    # about one row group in Arrow memory at a time (a group's text is 1/32 of the file's; reading it
    # takes a few times that: the compressed chunk, its pages, the array), never the file
    peak = max(seen["allocated"]) - before
    assert peak < text_bytes / 6, (peak, text_bytes)
    assert max(seen["allocated"][16:]) < 1.5 * max(seen["allocated"][:16])  # flat from half the file to all


def test_directories_and_globs_mix_every_kind(mixed_dir, tokenizer_dir, tmp_path) -> None:
    directory, docs = mixed_dir
    files = expand_inputs([directory])
    assert [p.name for p in files] == ["a.txt", "b.txt.zst", "c.jsonl", "e.parquet", "d.jsonl.gz"]
    assert [p.name for p in expand_inputs([str(directory / "**" / "*.jsonl*")])] == ["c.jsonl", "d.jsonl.gz"]
    assert [p.name for p in expand_inputs([str(directory / "*.t?t*"), directory / "a.txt"])] == [
        "a.txt", "b.txt.zst"]
    with pytest.raises(DataError, match="matches no file"):
        expand_inputs([str(directory / "*.nothing")])
    stats = prepare([directory], tokenizer_dir, tmp_path / "out", dupe_factor=1, workers=2, shard_mb=0.02,
                    progress=False)
    assert stats["documents"] == len(docs) and stats["sentences"] == sum(map(len, docs))
    assert stats["warnings"] == [] and len(stats["per_shard"]) > 3
    with pytest.raises(DataError, match="no column 'body'"):
        prepare([directory / "e.parquet"], tokenizer_dir, tmp_path / "nope", text_column="body", progress=False)


# ---------------------------------------------------------------------------------------------------
# bad records
# ---------------------------------------------------------------------------------------------------


def test_bad_records_are_counted_or_stop_the_run(tmp_path, tokenizer_dir) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(6)
    good = [json.dumps({"text": "\n".join(doc)}) for doc in _documents(rng, 30)]
    bad_lines = [b'{"text": "Ka lo.\\nMi ne."', b'{"title": "no text"}', b'{"text": 42}', b'{"text": null}',
                 b'["text"]', b'{"text": "Caf\xe9 au lait."}']
    lines = [g.encode() for g in good[:10]] + bad_lines[:3] + [g.encode() for g in good[10:]] + bad_lines[3:]
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n\n")
    table = pa.table({"text": ["\n".join(doc) for doc in _documents(rng, 12)]})
    texts = table.column("text").to_pylist()
    texts[7] = None
    pq.write_table(pa.table({"text": texts}), inputs / "rows.parquet", row_group_size=5)

    with pytest.warns(DataWarning) as caught:
        stats = prepare([inputs], tokenizer_dir, tmp_path / "skip", dupe_factor=1, progress=False)
    assert stats["skipped"]["bad_records"] == 7 and stats["documents"] == 30 + 11
    message = next(str(w.message) for w in caught if "record(s)" in str(w.message))
    assert "skipped 7 record(s) without usable text in field 'text'" in message
    assert f"{inputs / 'bad.jsonl'}:11 (invalid JSON" in message
    assert f"{inputs / 'bad.jsonl'}:12 (no field 'text'" in message
    assert f"{inputs / 'bad.jsonl'}:13 (field 'text' is int, not a string)" in message

    with pytest.raises(RecordError, match=r"bad\.jsonl:11: text: invalid JSON") as error:
        prepare([inputs], tokenizer_dir, tmp_path / "error", dupe_factor=1, bad_records="error", progress=False)
    assert (error.value.line, error.value.field) == (11, "text")
    out = tmp_path / "error"
    assert not list(out.rglob("*.tmp")) and not list(out.glob("train/*")) and not (out / "stats.json").exists()
    with pytest.raises(RecordError, match=r"rows\.parquet:8: text: column 'text' is null"):
        prepare([inputs / "rows.parquet"], tokenizer_dir, tmp_path / "error2", bad_records="error", progress=False)
    [body], _ = sources.input_bodies([inputs / "bad.jsonl"])
    with pytest.raises(RecordError, match=r"bad\.jsonl:35: text: not UTF-8 \(b'\\xe9'"):
        list(read_blocks(InputRange(body.path, 0, body.start + len(b"\n".join(lines[:-1])) + 1, body.end, 35,
                                    "jsonl"), bad_records="error"))

    from typer.testing import CliRunner

    from bertforge.cli import app

    result = CliRunner().invoke(app, ["prepare", "--input", str(inputs / "bad.jsonl"), "--tokenizer", str(tokenizer_dir),
                                      "--out", str(tmp_path / "cli"), "--bad-records", "error", "--quiet"])
    assert result.exit_code == 2 and "bad.jsonl:11: text: invalid JSON" in result.output


# ---------------------------------------------------------------------------------------------------
# parts
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_parts_together_are_the_whole(mixed_dir, tokenizer_dir, tmp_path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app
    from bertforge.data.loader import PretrainingDataset, PretrainingLoader

    directory, docs = mixed_dir
    options = dict(dupe_factor=1, masking="dynamic", validation_fraction=0.05, progress=False)
    whole = prepare([directory], tokenizer_dir, tmp_path / "whole", **options)
    out = tmp_path / "parts"
    with pytest.raises(DataError, match="no part directories"):
        merge_parts(out)
    parts = []
    for i in (0, 2, 1):  # in any order, on any machine
        parts.append(prepare([directory], tokenizer_dir, out, part=f"{i}/3", workers=2 - i % 2, shard_mb=0.01,
                             **options))
        assert (out / f"part-{i:05d}-of-00003" / "stats.json").is_file()
        if i == 2:
            with pytest.raises(DataError, match=r"part\(s\) 1/3 missing"):
                merge_parts(out)
    parts = [parts[0], parts[2], parts[1]]
    with pytest.raises(DataError, match="parts of different splits"):
        (out / "part-00003-of-00004").mkdir()
        merge_parts(out)
    (out / "part-00003-of-00004").rmdir()

    # the same documents, none twice: the parts' pieces tile the files, their sentences are the whole's
    pieces = [InputRange.from_json(r) for i in range(3)
              for shard in json.loads((out / f"part-{i:05d}-of-00003" / "dataset.json").read_text())["shards"]
              for r in shard]
    by_part = _sentences_of(pieces)
    assert sorted(by_part) == sorted(s for doc in docs for s in doc) and len(by_part) == sum(map(len, docs))
    assert all(p["documents"] > 0 for p in parts)
    for key in ("documents", "sentences", "tokens"):
        assert sum(p[key] for p in parts) == whole[key]

    # deterministic: a part made again on a machine with another number of workers is the same
    again = prepare([directory], tokenizer_dir, tmp_path / "again", part="1/3", workers=1, shard_mb=0.01,
                    **options)
    assert len(again["per_shard"]) > 1
    assert again["instances"] == parts[1]["instances"]
    assert _train_valid(tmp_path / "again" / "part-00001-of-00003") == _train_valid(out / "part-00001-of-00003")

    result = CliRunner().invoke(app, ["prepare-merge", "--data", str(out)])
    assert result.exit_code == 0, result.output
    merged = json.loads((out / "stats.json").read_text())
    assert merged["parts"] == 3 and merged["documents"] == whole["documents"]
    assert merged["instances"] == sum(p["instances"] for p in parts)
    dataset = PretrainingDataset(out)
    assert len(dataset) == merged["instances"] and not dataset.static
    assert len(PretrainingDataset(out, "valid")) == merged["validation_instances"] > 0
    batches = list(PretrainingLoader(out, 64, seed=1))
    assert sum(len(b["input_ids"]) for b in batches) == merged["instances"]
    from bertforge.pretrain import pretrain  # pretrain reads the merged parts as one dataset

    result = pretrain("tiny", out, tmp_path / "run", max_steps=2, max_position_embeddings=128, batch_size=8,
                      eval_every=2, eval_max_batches=1, progress=False)
    assert (result.final / "vocab.txt").read_text() == (tokenizer_dir / "vocab.txt").read_text()

    # parts of another run (other options) do not merge
    prepare([directory], tokenizer_dir, tmp_path / "mixed", part="0/2", **options)
    prepare([directory], tokenizer_dir, tmp_path / "mixed", part="1/2", **{**options, "seed": 99})
    with pytest.raises(DataError, match="other options"):
        merge_parts(tmp_path / "mixed")
    with pytest.raises(ValueError, match=r"I must be in \[0, N\)"):
        prepare([directory], tokenizer_dir, tmp_path / "bad", part="3/3", **options)
    with pytest.raises(DataError, match="only splits into"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        prepare([directory / "b.txt.zst"], tokenizer_dir, tmp_path / "one", part="1/2", **options)
