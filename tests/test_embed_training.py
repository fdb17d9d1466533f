"""`finetune embed`: sentence-embedding training on pairs, triplets and scored pairs; the directory it
writes gives the same vectors in sentence-transformers, transformers and every bertforge command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge import pipeline
from bertforge.cli import app
from bertforge.finetune import finetune
from bertforge.model.sentence import SentenceEmbedder
from tests.tiny_models import save_tiny_encoder

SYNONYMS = [("cat", "kitten"), ("film", "movie"), ("car", "truck"), ("happy", "glad"), ("fast", "quick"),
            ("house", "home"), ("big", "large"), ("small", "tiny"), ("road", "street"), ("sea", "ocean")]
WORDS = " ".join(w for pair in SYNONYMS for w in pair) + " the a one some"


def _csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embed")
    encoder = save_tiny_encoder(root, WORDS, vocab_size=90, hidden_size=32)
    pairs = [{"anchor": f"the {a}", "positive": f"a {b}"} for a, b in SYNONYMS]
    triplets = [{**row, "negative": f"one {SYNONYMS[(i + 5) % len(SYNONYMS)][1]}"} for i, row in enumerate(pairs)]
    scored = [{"sentence1": f"the {a}", "sentence2": f"a {b}", "score": 5.0} for a, b in SYNONYMS]
    scored += [{"sentence1": f"the {a}", "sentence2": f"some {SYNONYMS[(i + 3) % len(SYNONYMS)][1]}", "score": 1.0}
               for i, (a, _) in enumerate(SYNONYMS)]
    return {"encoder": encoder, "pairs": _csv(root / "pairs.csv", pairs * 3),
            "triplets": _csv(root / "triplets.csv", triplets * 3), "scored": _csv(root / "sts.csv", scored * 2),
            "root": root}


def _train(files: dict[str, Path], kind: str, out: Path, **settings: object) -> dict:
    return finetune("embed", None, files["encoder"], None, out, epochs=6, batch_size=10, lr=1e-3, max_length=16,
                    task_settings={"train": str(files[kind]), "dev": str(files[kind]), **settings},
                    progress=False, verbose=False)


def test_pairs_train_retrieval_and_load_as_sentence_transformers(files: dict[str, Path], tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    results = _train(files, "pairs", tmp_path / "pairs")
    seed = tmp_path / "pairs" / "seed-1"
    history = [json.loads(line) for line in (seed / "run" / "metrics.jsonl").read_text().splitlines()]
    scores = [r["mrr@10"] for r in history if "mrr@10" in r]
    assert scores[-1] > scores[0] and results["seeds"][0]["metrics"]["mrr@10"] >= 0.9, scores
    task = json.loads((seed / "task.json").read_text())
    assert task["settings"]["loss"] == "mnrl" and task["settings"]["anchor_column"] == "anchor"

    texts = ["the cat", "a movie about a big car on the road", ""]
    ours = np.array([r["embedding"] for r in pipeline(seed)(texts)])
    theirs = SentenceTransformer(str(seed), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # normalised, as modules.json says
    AutoModel.from_pretrained(seed)  # the encoder itself, in the Hugging Face layout
    card = (seed / "README.md").read_text()
    assert "pipeline_tag: \"feature-extraction\"" in card or "pipeline_tag: feature-extraction" in card


def test_triplets_and_scored_pairs(files: dict[str, Path], tmp_path: Path) -> None:
    triplets = _train(files, "triplets", tmp_path / "triplets")
    assert triplets["seeds"][0]["metrics"]["recall@10"] >= 0.9  # 10 anchors among 20 candidates (10 by chance: 0.5)
    scored = _train(files, "scored", tmp_path / "sts")
    task = json.loads((tmp_path / "sts" / "seed-1" / "task.json").read_text())
    assert task["settings"]["loss"] == "cosent" and task["settings"]["score_column"] == "score"
    assert scored["seeds"][0]["metrics"]["spearman"] > 0.5
    cosine = _train(files, "scored", tmp_path / "cos", loss="cosine")
    assert cosine["seeds"][0]["metrics"]["spearman"] > 0.5
    _train(files, "pairs", tmp_path / "cls", pool="cls")
    modules = json.loads((tmp_path / "cls" / "seed-1" / "1_Pooling" / "config.json").read_text())
    assert modules["pooling_mode_cls_token"] and not modules["pooling_mode_mean_tokens"]


def test_losses_by_hand() -> None:
    """In-batch negatives: cross-entropy over scaled cosines, each anchor's own positive the target;
    CoSENT: log(1 + sum of exp(scale (cos_j - cos_i))) over pairs with score_i > score_j."""
    embedder = SentenceEmbedder(torch.nn.Identity(), pooling="mean", normalize=True, loss="mnrl", scale=20.0,
                                score_max=None, max_length=8)
    vectors = torch.nn.functional.normalize(torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    logits = vectors[:, 0] @ vectors[:, 1].T * 20
    expected = -torch.log_softmax(logits, dim=1).diagonal().mean()
    torch.testing.assert_close(embedder._loss(vectors, None), expected)
    embedder.loss_name = "cosent"
    scores = torch.tensor([3.0, 1.0, 2.0])
    cosine = (vectors[:, 0] * vectors[:, 1]).sum(-1)
    terms = [20 * (cosine[j] - cosine[i]) for i in range(3) for j in range(3) if scores[i] > scores[j]]
    torch.testing.assert_close(embedder._loss(vectors, scores), torch.log1p(torch.exp(torch.stack(terms)).sum()))


def test_each_distinct_text_is_encoded_once(files: dict[str, Path]) -> None:
    """A batch's repeated texts go through the encoder once and get the vectors their own passes give;
    a row paired with itself (SetFit's self pair) is encoded twice, so dropout can tell the two apart."""
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(files["encoder"])
    encoder = load_for_job(files["encoder"], "embeddings").eval()
    seen: list[int] = []
    encoder.register_forward_hook(lambda module, args, kwargs, out: seen.append(kwargs["input_ids"].shape[0]),
                                  with_kwargs=True)
    embedder = SentenceEmbedder(encoder, pooling="mean", normalize=True, loss="cosine", scale=20.0, score_max=1.0,
                                max_length=16).eval()
    rows = [("the cat", "a kitten"), ("a kitten", "the big sea"), ("the cat", "the cat"), ("the road", "the cat")]
    flat = [t for row in rows for t in row]
    encoded = tokenizer.encode_batch(flat, max_length=16, truncation=True)
    width = max(len(ids) for ids in encoded["input_ids"])

    def padded(key: str) -> torch.Tensor:
        return torch.tensor([ids + [0] * (width - len(ids)) for ids in encoded[key]]).view(len(rows), 2, width)

    input_ids, types = padded("input_ids"), padded("token_type_ids")
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in encoded["input_ids"]]).view(len(rows), 2, width)
    with torch.no_grad():
        vectors = embedder(input_ids, mask, types).embeddings  # (4, 2, H)
        assert seen == [3, 2]  # column 0: cat, kitten, road; column 1: big sea, and "the cat" again in row 2
        seen.clear()
        one_by_one = torch.stack([embedder.embed(input_ids[b, c:c + 1, :int(mask[b, c].sum())],
                                                 mask[b, c:c + 1, :int(mask[b, c].sum())],
                                                 types[b, c:c + 1, :int(mask[b, c].sum())])[0]
                                  for b in range(len(rows)) for c in range(2)]).view(len(rows), 2, -1)
    torch.testing.assert_close(vectors, one_by_one, atol=1e-5, rtol=1e-5)
    embedder.train()  # with dropout on, the self pair's two passes differ; the other repeats share one
    loss = embedder(input_ids, mask, types, labels=torch.ones(len(rows))).loss
    loss.backward()
    with torch.no_grad():
        trained = embedder(input_ids, mask, types, labels=torch.ones(len(rows))).embeddings
    assert not torch.equal(trained[2, 0], trained[2, 1]) and torch.equal(trained[0, 0], trained[3, 1])
    assert torch.equal(trained[0, 1], trained[1, 0])


def test_cli_and_bad_files(files: dict[str, Path], tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "embed", "--model", str(files["encoder"]), "--train", str(files["pairs"]),
                                 "--epochs", "1", "--batch-size", "10", "--max-length", "16", "--out",
                                 str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "seed-1" / "modules.json").is_file()  # no --dev: a part of the pairs held out
    one_column = _csv(tmp_path / "one.csv", [{"text": "the cat"}] * 4)
    bad = runner.invoke(app, ["finetune", "embed", "--model", str(files["encoder"]), "--train", str(one_column),
                              "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "one.csv:1" in bad.output and "two text columns" in " ".join(bad.output.split())
    no_score = runner.invoke(app, ["finetune", "embed", "--model", str(files["encoder"]), "--train", str(files["pairs"]),
                                   "--loss", "cosent", "--out", str(tmp_path / "bad2")])
    assert no_score.exit_code == 2 and "needs a score column" in " ".join(no_score.output.split())
