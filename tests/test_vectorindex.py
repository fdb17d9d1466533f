"""Semantic search (`bertforge.vectorindex`, `bertforge index` / `bertforge query`) on a tiny random encoder:
exact search finds a text's own row first and equals brute-force cosine; ids and texts round-trip; bad
input is one located line with exit status 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.vectorindex import VectorIndex, VectorIndexError, build_file, exact_search, top_k_of
from tests.hub_server import loopback_hub_fixture  # noqa: F401  (the `loopback_hub` fixture)
from tests.tiny_models import save_tiny_encoder

TEXTS = ["the cat sat on the mat", "dogs bark at night", "stock prices fell sharply", "a bird sings in the tree",
         "rain falls on the city", "the market rallied today", "", "über café naïve"]
runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("vi"), " ".join(TEXTS), vocab_size=200, hidden_size=32)


@pytest.fixture(scope="module")
def index(model: Path) -> VectorIndex:
    return VectorIndex.build(model, TEXTS, ids=[f"doc-{i}" for i in range(len(TEXTS))])


def brute_force(model: Path, texts: list[str], vectors: np.ndarray) -> np.ndarray:
    """Cosine of each text's embedding (the pipeline's own, in float64) with every row of `vectors`."""
    from bertforge import pipeline

    embedded = np.array([r["embedding"] for r in pipeline(model, task="embeddings")(texts)], dtype=np.float64)
    embedded /= np.linalg.norm(embedded, axis=1, keepdims=True)
    rows = vectors.astype(np.float64)
    return embedded @ (rows / np.linalg.norm(rows, axis=1, keepdims=True)).T


def test_a_corpus_text_finds_its_own_row_first(index: VectorIndex) -> None:
    for i, hits in enumerate(index.search(TEXTS, top_k=3)):
        assert hits[0].id == f"doc-{i}" and hits[0].text == TEXTS[i] and hits[0].rank == 1
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [hit.rank for hit in hits] == [1, 2, 3] and hits[0].score >= hits[1].score >= hits[2].score
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, rtol=1e-5)
    assert index.vectors.dtype == np.float32 and len(index) == len(TEXTS) == index.info.count


def test_search_equals_brute_force_cosine(model: Path, index: VectorIndex) -> None:
    queries = ["a cat in the rain", "prices", "", "night birds"]
    cosine = brute_force(model, queries, index.vectors)
    for row, hits in zip(cosine, index.search(queries, top_k=5), strict=True):
        best = np.argsort(-row, kind="stable")[:5]
        assert [hit.id for hit in hits] == [f"doc-{i}" for i in best]
        np.testing.assert_allclose([hit.score for hit in hits], row[best], atol=1e-5)


def test_top_k_of_matches_a_full_sort() -> None:
    scores = np.random.default_rng(0).standard_normal((7, 50)).astype(np.float32)
    for k in (1, 5, 50, 80):
        indices, top = top_k_of(scores, min(k, 50))
        np.testing.assert_array_equal(indices, np.argsort(-scores, axis=1)[:, :min(k, 50)])
        np.testing.assert_array_equal(top, np.take_along_axis(scores, indices, 1))
    vectors = scores / np.linalg.norm(scores, axis=1, keepdims=True)
    indices, _ = exact_search(vectors, vectors[:3], 100, block=2)  # k above the row count: every row, ranked
    assert indices.shape == (3, 7) and list(indices[:, 0]) == [0, 1, 2]


def test_save_and_load_round_trip(tmp_path: Path, index: VectorIndex) -> None:
    index.save(tmp_path / "idx")
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == ["index.json", "rows.jsonl", "vectors.npy"]
    back = VectorIndex.load(tmp_path / "idx")
    assert back.ids == index.ids and back.texts == TEXTS
    np.testing.assert_array_equal(back.vectors, index.vectors)
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert info["count"] == len(TEXTS) and info["dimension"] == 32 and info["pooling"] == "mean"
    assert info["weights"]["file"] == "model.safetensors" and info["bertforge_version"]
    assert back.search("dogs bark at night", top_k=1)[0][0].id == "doc-1"  # the recorded model, reloaded
    mapped = VectorIndex.load(tmp_path / "idx", mmap=True)
    assert isinstance(mapped.vectors, np.memmap) and mapped.search_vectors(index.vectors[2], 1)[0][0].id == "doc-2"


def test_build_file_streams_in_chunks_with_ids(tmp_path: Path, model: Path, index: VectorIndex) -> None:
    rows = [{"key": f"k{i}", "body": text} for i, text in enumerate(TEXTS)]
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    info = build_file(model, source, tmp_path / "idx", text_column="body", id_column="key", chunk_rows=3)
    assert info.count == len(TEXTS) and info.input == str(source)
    back = VectorIndex.load(tmp_path / "idx")
    assert back.ids == [f"k{i}" for i in range(len(TEXTS))] and back.texts == TEXTS
    np.testing.assert_allclose(back.vectors, index.vectors, atol=1e-6)  # chunks change nothing


def test_cli_index_and_query(tmp_path: Path, model: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "idx"
    made = runner.invoke(app, ["index", "--model", str(model), "--input", str(corpus), "--out", str(out), "--quiet"])
    assert made.exit_code == 0, made.output
    assert f"{len(TEXTS)} rows" in made.output
    shown = runner.invoke(app, ["query", "--index", str(out), "--query", "stock prices fell sharply", "--top-k", "2"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "query: stock prices fell sharply" and lines[1].split() == ["rank", "score", "id", "text"]
    assert lines[2].split()[:3] == ["1", "1.0000", "3"] and lines[2].endswith("stock prices fell sharply")
    assert len(lines) == 4
    queries = tmp_path / "queries.txt"
    queries.write_text("a cat in the rain\n\nprices\n", encoding="utf-8")
    found = runner.invoke(app, ["query", "--index", str(out), "--input", str(queries), "--out", str(tmp_path / "r.jsonl"),
                                "--top-k", "3"])
    assert found.exit_code == 0, found.output
    results = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["query"] for r in results] == ["a cat in the rain", "", "prices"]
    cosine = brute_force(model, ["a cat in the rain", "", "prices"], VectorIndex.load(out).vectors)
    for row, result in zip(cosine, results, strict=True):
        best = np.argsort(-row, kind="stable")[:3]
        assert [hit["id"] for hit in result["results"]] == [int(i) + 1 for i in best]  # ids are line numbers
        assert [hit["rank"] for hit in result["results"]] == [1, 2, 3]
        np.testing.assert_allclose([hit["score"] for hit in result["results"]], row[best], atol=1e-5)
        assert result["results"][0]["text"] == TEXTS[best[0]]


def failure(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and message.startswith("error: "), message
    return message


def test_bad_inputs_are_one_located_line(tmp_path: Path, model: Path) -> None:
    index_args = ["index", "--model", str(model), "--out", str(tmp_path / "idx"), "--quiet", "--input"]
    assert "missing.csv: no such file" in failure([*index_args, str(tmp_path / "missing.csv")])
    table = tmp_path / "t.csv"
    table.write_text("id,body\n1,hello\n", encoding="utf-8")
    assert "t.csv:2: text: no such column" in failure([*index_args, str(table)])
    nulls = tmp_path / "n.jsonl"
    nulls.write_text('{"text": "fine"}\n{"text": null}\n', encoding="utf-8")
    assert "n.jsonl:2: text: must be text, got null" in failure([*index_args, str(nulls)])
    no_ids = tmp_path / "i.csv"
    no_ids.write_text("text,id\nhello,\n", encoding="utf-8")
    assert "i.csv:2: id: an id must be" in failure([*index_args, str(no_ids), "--id-column", "id"])
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob(".idx*"))  # nothing half-written
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert "holds other files" in failure(["index", "--model", str(model), "--input", str(table), "--out",
                                           str(tmp_path / "mine"), "--text-column", "body"])
    assert "local directory" in failure([*index_args, str(table), "--revision", "v1"])
    assert "no such index directory" in failure(["query", "--index", str(tmp_path / "none"), "--query", "x"])
    assert "not both" in failure(["query", "--index", str(tmp_path), "--query", "x", "--input", str(table)])


def test_an_empty_text_row_is_embedded(tmp_path: Path, model: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text('text\nhello\n""\nworld\n', encoding="utf-8")
    info = build_file(model, table, tmp_path / "idx")
    assert info.count == 3 and VectorIndex.load(tmp_path / "idx").texts == ["hello", "", "world"]


def test_a_changed_model_or_format_is_refused(tmp_path: Path, model: Path, index: VectorIndex) -> None:
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    VectorIndex.build(copy, TEXTS[:3]).save(tmp_path / "idx")
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # another version of the model: the same size, other bytes
    weights.write_bytes(bytes(data))
    message = failure(["query", "--index", str(tmp_path / "idx"), "--query", "x"])
    assert "index.json: weights: built with model.safetensors" in message and "another version" in message
    with pytest.raises(VectorIndexError, match="weights"):
        VectorIndex.load(tmp_path / "idx").search("x")
    assert VectorIndex.load(tmp_path / "idx").search("x", model=model)[0]  # the original weights: accepted
    info_file = tmp_path / "idx" / "index.json"
    info = json.loads(info_file.read_text())
    info_file.write_text(json.dumps({**info, "format": 99}))
    assert "index.json: format: 99: written by a newer bertforge" in failure(
        ["query", "--index", str(tmp_path / "idx"), "--query", "x"])
    info_file.write_text(json.dumps({**info, "count": 5}))
    assert "vectors.npy: holds float32 (3, 32)" in failure(["query", "--index", str(tmp_path / "idx"), "--query", "x"])


def test_a_failed_build_keeps_the_old_index(tmp_path: Path, model: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\n", encoding="utf-8")
    build_file(model, good, tmp_path / "idx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\n{"text": 3}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:3: text: must be text"):
        build_file(model, bad, tmp_path / "idx", chunk_rows=2)  # fails in its second chunk
    assert VectorIndex.load(tmp_path / "idx").texts == ["one", "two"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.txt", "idx"]


def test_a_hub_model_is_queried_at_its_recorded_commit(tmp_path: Path, model: Path, loopback_hub) -> None:
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    first = loopback_hub.commit("org/tiny-encoder", files)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS[:4]) + "\n", encoding="utf-8")
    made = runner.invoke(app, ["index", "--model", "org/tiny-encoder", "--input", str(corpus), "--out",
                               str(tmp_path / "idx"), "--quiet"])
    assert made.exit_code == 0, made.output
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert (info["model"], info["repo_id"], info["commit"]) == ("org/tiny-encoder", "org/tiny-encoder", first)
    weights = bytearray(files["model.safetensors"])
    weights[-1] ^= 1
    loopback_hub.commit("org/tiny-encoder", {"model.safetensors": bytes(weights)})  # main moves on
    hits = VectorIndex.load(tmp_path / "idx").search(TEXTS[2], top_k=1)[0]
    assert hits[0].id == 3 and hits[0].score == pytest.approx(1.0, abs=1e-5)  # the indexed commit embedded it
