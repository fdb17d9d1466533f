"""`finetune classify --method setfit`: pairs from the labels train the encoder, a logistic head on
its mean-pooled vectors; the directory predicts like any classifier."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bertforge import pipeline
from bertforge.finetune import finetune
from bertforge.finetune.setfit import sentence_pairs
from tests.tiny_models import save_tiny_encoder

GOOD = ["warm", "bright", "gripping", "clever", "moving", "lovely", "superb", "vivid"]
BAD = ["dull", "slow", "flat", "stale", "clumsy", "bland", "tedious", "weak"]


def test_pairs_follow_the_labels() -> None:
    texts, labels = ["a", "b", "c", "d"], ["x", "x", "y", "y"]
    pairs = sentence_pairs(texts, labels, iterations=5, seed=1)
    assert len(pairs) == 2 * 5 * 4 and Counter(p["score"] for p in pairs) == {1.0: 20, 0.0: 20}
    label_of = dict(zip(texts, labels, strict=True))
    for pair in pairs:
        same = label_of[pair["sentence1"]] == label_of[pair["sentence2"]]
        assert same == (pair["score"] == 1.0)
    with pytest.raises(ValueError, match="two labels"):
        sentence_pairs(texts, ["x"] * 4, 1, 1)


def test_setfit_classifier(tmp_path: Path) -> None:
    encoder = save_tiny_encoder(tmp_path, " ".join(["a", "film", "story", *GOOD, *BAD]), vocab_size=80, hidden_size=32)
    rows = [f"a {w} film,positive" for w in GOOD] + [f"a {w} story,negative" for w in BAD]
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\n" + "\n".join(f"the {w} film,positive" for w in GOOD[:4])
                   + "\n" + "\n".join(f"the {w} story,negative" for w in BAD[:4]) + "\n", encoding="utf-8")
    results = finetune("classify", None, encoder, None, tmp_path / "run", method="setfit", max_length=16,
                       task_settings={"train": str(train), "dev": str(dev)}, progress=False, verbose=False)
    seed = tmp_path / "run" / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["task_head"]["pooling"] == "mean" and config["task_head"]["normalize"] is True
    assert sorted(config["id2label"].values()) == ["negative", "positive"]
    assert results["seeds"][0]["steps"] == 2 * 20 * 16 // 16  # one epoch of 640 pairs, batch 16
    # the records give the settings the encoder trained with: the setfit package's defaults
    used = {name: results["hyperparameters"][name] for name in ("lr", "batch_size", "epochs")}
    assert used == {"lr": 2e-5, "batch_size": 16, "epochs": 1.0}
    assert _setfit_agrees(seed, [f"the {w} film" for w in GOOD[:2]] + [f"the {w} story" for w in BAD[:2]])
    assert results["seeds"][0]["metrics"]["accuracy"] >= 0.75, results["seeds"][0]["metrics"]
    predicted = [r["label"] for r in pipeline(seed)([f"the {w} film" for w in GOOD[:4]] + [f"the {w} story" for w in BAD[:4]])]
    written = [json.loads(line)["label"] for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
    assert predicted == written  # the pipeline runs the saved head as fine-tuning scored it


def test_pairs_list_every_pair_once_then_cycle() -> None:
    texts = [f"t{i}" for i in range(9)]
    labels = ["x"] * 3 + ["y"] * 3 + ["z"] * 3
    pairs = sentence_pairs(texts, labels, iterations=4, seed=3)
    positives = [tuple(sorted((p["sentence1"], p["sentence2"]))) for p in pairs if p["score"] == 1.0]
    negatives = [tuple(sorted((p["sentence1"], p["sentence2"]))) for p in pairs if p["score"] == 0.0]
    assert len(positives) == len(negatives) == 36
    # per class 3 pairs of two rows and 3 of a row with itself: 18 positives, each twice; 27 negatives
    assert len(Counter(positives)) == 18 and set(Counter(positives).values()) == {2}
    assert sum(a == b for a, b in positives) == 18 and not any(a == b for a, b in negatives)
    assert len(set(negatives)) == 27 and set(Counter(negatives).values()) == {1, 2}
    assert [p["score"] for p in pairs[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert sentence_pairs(texts, labels, 4, 3) == pairs and sentence_pairs(texts, labels, 4, 4) != pairs


def test_large_files_draw_partners(monkeypatch: pytest.MonkeyPatch) -> None:
    import bertforge.finetune.setfit as setfit

    monkeypatch.setattr(setfit, "MAX_LISTED_ROWS", 4)
    texts, labels = [f"t{i}" for i in range(7)], ["x", "x", "y", "y", "y", "z", "q"]
    pairs = sentence_pairs(texts, labels, iterations=10, seed=1)
    label_of = dict(zip(texts, labels, strict=True))
    assert len(pairs) == 140
    for pair in pairs:
        assert (label_of[pair["sentence1"]] == label_of[pair["sentence2"]]) == (pair["score"] == 1.0)
    assert Counter(p["sentence1"] for p in pairs if p["score"] == 1.0) == {t: 10 for t in texts}  # every row in turn


def test_one_row_per_label_pairs_each_row_with_itself() -> None:
    pairs = sentence_pairs(["a", "b", "c"], ["x", "y", "z"], 2, 1)
    assert {(p["sentence1"], p["sentence2"]) for p in pairs if p["score"] == 1.0} == {("a", "a"), ("b", "b"), ("c", "c")}


def test_multi_label_rows_pair_by_a_shared_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rows that share a label are a positive pair, two that share none a negative one (the setfit
    package's multi-label pairs); listed for small files, drawn for large ones."""
    import bertforge.finetune.setfit as setfit

    texts = ["a", "b", "c", "d", "e"]
    labels = [["x"], ["x", "y"], ["y"], ["z"], []]
    sets = dict(zip(texts, map(set, labels), strict=True))
    for listed_up_to in (1000, 2):
        monkeypatch.setattr(setfit, "MAX_LISTED_ROWS", listed_up_to)
        pairs = sentence_pairs(texts, labels, iterations=6, seed=2)
        assert Counter(p["score"] for p in pairs) == {1.0: 30, 0.0: 30}
        for p in pairs:
            first, second = p["sentence1"], p["sentence2"]
            shared = first == second or bool(sets[first] & sets[second])
            assert shared == (p["score"] == 1.0), p
    positives = {frozenset((p["sentence1"], p["sentence2"])) for p in pairs if p["score"] == 1.0}
    assert frozenset(("a", "c")) not in positives and {frozenset(("a", "b")), frozenset(("b", "c"))} <= positives
    with pytest.raises(ValueError, match="share no label"):
        sentence_pairs(["a", "b", "c"], [["x", "y"], ["x"], ["y", "x"]], 2, 1)


def test_multi_label_setfit_classifier(tmp_path: Path) -> None:
    """A set of labels per row: one-vs-rest logistic heads, thresholds tuned on dev, label sets out of
    the pipeline as fine-tuning scored them."""
    words = GOOD + BAD
    encoder = save_tiny_encoder(tmp_path, " ".join(["a", "film", "story", "long", "short", *words]), vocab_size=90,
                                hidden_size=32)

    def rows(prefix: str, picked: list[str]) -> list[dict]:
        out = []
        for i, word in enumerate(picked):
            length = "long" if i % 2 else "short"
            tone = "good" if word in GOOD else "bad"
            out.append({"text": f"{prefix} {length} {word} film", "labels": [tone, length] if i % 3 else [tone]})
        return out

    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows("a", words)), encoding="utf-8")
    dev_rows = rows("the", GOOD[:4] + BAD[:4])
    dev.write_text("".join(json.dumps(r) + "\n" for r in dev_rows), encoding="utf-8")
    results = finetune("classify", None, encoder, None, tmp_path / "run", method="setfit", max_length=16,
                       task_settings={"train": str(train), "dev": str(dev), "label_column": "labels"},
                       progress=False, verbose=False)
    seed = tmp_path / "run" / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert sorted(config["id2label"].values()) == ["bad", "good", "long", "short"]
    metrics = results["seeds"][0]["metrics"]
    assert "micro_f1" in metrics and metrics["micro_f1"] >= 0.6, metrics
    predicted = [sorted(r["labels"]) for r in pipeline(seed)([r["text"] for r in dev_rows])]
    written = [sorted(json.loads(line)["labels"]) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
    assert predicted == written


def _setfit_agrees(directory: Path, texts: list[str]) -> bool:
    """The setfit package runs the directory to bertforge's labels and probabilities (the round-trip
    matrix, tests/test_roundtrip_matrix.py, holds this for every kind of directory)."""
    import numpy as np

    setfit = pytest.importorskip("setfit")
    model = setfit.SetFitModel.from_pretrained(str(directory), device="cpu")
    ours = pipeline(directory)(texts)
    top = np.asarray(model.predict_proba(texts, as_numpy=True)).max(axis=1)
    return model.predict(texts) == [r["label"] for r in ours] and bool(
        np.abs(top - np.array([r["score"] for r in ours])).max() <= 1e-4)


def test_setfit_records_the_settings_its_encoder_trained_with(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A given --lr and --batch-size are what the encoder trains on its pairs with, and what the console,
    run_config.yaml, results.json, task.json and the model card say; the card names the task once."""
    import yaml

    encoder = save_tiny_encoder(tmp_path, " ".join(["a", "film", "story", *GOOD, *BAD]), vocab_size=80, hidden_size=32)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "\n".join([f"a {w} film,positive" for w in GOOD[:4]]
                                                 + [f"a {w} story,negative" for w in BAD[:4]]) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    results = finetune("classify", None, encoder, None, out, method="setfit", max_length=16, lr=1e-4, batch_size=8,
                       task_settings={"train": str(train), "dev": str(train)}, progress=False, verbose=True)
    steps = 2 * 20 * 8 // 8  # one pass over 320 pairs (20 rounds of a positive and a negative per row), 8 a batch
    console = capsys.readouterr().err
    assert f"seed 1: {steps} steps ({steps} per epoch)" in console, console
    assert "setfit: the encoder on 320 pairs, batch 8, lr 0.0001" in console
    recorded = yaml.safe_load((out / "run_config.yaml").read_text(encoding="utf-8"))
    assert (recorded["optim"]["lr"], recorded["train"]["batch_size"], recorded["train"]["epochs"]) == (1e-4, 8, 1.0)
    for hyper in (results["hyperparameters"], json.loads((out / "seed-1" / "task.json").read_text())["hyperparameters"]):
        assert (hyper["lr"], hyper["batch_size"], hyper["epochs"]) == (1e-4, 8, 1.0)
    assert results["seeds"][0]["steps"] == steps
    body = json.loads((out / "seed-1" / "setfit-body" / "run" / "results.json").read_text())  # what ran
    assert (body["hyperparameters"]["lr"], body["hyperparameters"]["batch_size"]) == (1e-4, 8)
    assert body["seeds"][0]["steps"] == steps
    card = (out / "seed-1" / "README.md").read_text(encoding="utf-8")
    assert f"{steps} steps of the encoder on label pairs (batch 8, lr 0.0001)" in card, card
    assert "classify classify" not in card and "Fine-tuned on classify (own data, `bertforge finetune classify " \
                                                "--method setfit`)" in card
    assert 'library_name: "setfit"' in card
