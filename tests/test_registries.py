"""A model family and a task family added through the registries alone (tests/fixtures/toy_registries.py)
fine-tune, predict, run in the pipeline and serve, with no edit anywhere else in bertforge."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.finetune import finetune, predict
from bertforge.model import load_any, registry
from bertforge.tasks import FAMILIES, make_task
from bertforge.tokenizer import BertTokenizer
from tests.fixtures import toy_registries as toys

GOOD = ["good", "great", "fine", "lovely", "superb"]
BAD = ["bad", "awful", "poor", "dull", "boring"]


def _rows(seed: int, count: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        words = GOOD if i % 2 else BAD
        picks = torch.randint(len(words), (3,), generator=generator).tolist()
        rows.append(f"{'pos' if i % 2 else 'neg'}\tthe film was {' '.join(words[p] for p in picks)}")
    return rows


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    toys.register_toys()
    root = tmp_path_factory.mktemp("toys")
    data = root / "data"
    data.mkdir()
    for split, seed, count in (("train", 0, 64), ("dev", 1, 16), ("test", 2, 8)):
        (data / f"{split}.tsv").write_text("\n".join(_rows(seed, count)) + "\n", encoding="utf-8")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join([*GOOD, *BAD, "the film was"]) for _ in range(20)) + "\n")
    tokenizer = BertTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    encoder = toys.ToyModel(registry.from_preset("toy-small", vocab_size=tokenizer.vocab_size))
    encoder.save_pretrained(root / "encoder", tokenizer=tokenizer)
    yield {"root": root, "data": data, "encoder": root / "encoder"}
    toys.unregister_toys()


def test_the_registries_know_the_toys(toy: dict[str, Path]) -> None:
    assert registry.jobs_of("toy") == ["embeddings", "sequence-classification"]
    assert "toy-small" in registry.preset_names()
    assert FAMILIES["toy-sentiment"] is toys.ToySentiment and make_task("toy-sentiment").name == "reviews"
    model, report = load_any(toy["encoder"])
    assert isinstance(model, toys.ToyModel) and report.ok
    # any family's class asked for a job builds the toy family's class for a toy checkpoint
    from bertforge.model import BertForSequenceClassification

    assert type(BertForSequenceClassification.from_pretrained(toy["encoder"])) is toys.ToyForSequenceClassification


def test_finetune_predict_pipeline_and_serve_a_toy_family(toy: dict[str, Path]) -> None:
    out = toy["root"] / "run"
    results = finetune("toy-sentiment", None, toy["encoder"], toy["data"], out, epochs=8, batch_size=8,
                       lr=1e-2, progress=False, verbose=False)
    assert results["family"] == "toy-sentiment" and results["seeds"][0]["metrics"]["accuracy"] >= 0.9
    seed_dir = out / "seed-1"
    model, _ = load_any(seed_dir)
    assert isinstance(model, toys.ToyForSequenceClassification)

    done = predict("toy-sentiment", "reviews", seed_dir, toy["data"], toy["root"] / "pred")
    assert len((toy["root"] / "pred" / "test.txt").read_text().split()) == 8 and done["test"]["examples"] == 8

    from bertforge import pipeline

    classify = pipeline(str(seed_dir))
    assert classify.task == "text-classification" and classify.spec.family == "toy-sentiment"
    answers = classify(["the film was superb great", "the film was awful dull"])
    assert [a["label"] for a in answers] == ["pos", "neg"]

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed_dir)) as client:
        answer = client.post("/classify", json={"text": "the film was lovely fine"})
        assert answer.status_code == 200 and answer.json()["label"] == "pos"
        assert client.post("/embed", json={"text": "the film"}).status_code == 200
        assert client.get("/health").json()["family"] == "toy"  # the page shows it beside the class
        refused = client.post("/fill-mask", json={"text": "the [MASK] was good"})
        assert refused.status_code == 400 and "has no" in refused.json()["message"]
