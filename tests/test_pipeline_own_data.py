"""Models fine-tuned on users' files (`finetune classify`, `tag`, `qa`) through the inference pipeline:
Python `pipeline()`, `bertforge predict --input` and `bertforge serve` give fine-tuning's own predictions.

The models are trained for a few steps from a random one-layer encoder: the predictions are meaningless,
the plumbing (labels, thresholds, tag schemes, windows) is what is checked. Each test needs its family's
task module (`tasks.classify`, `tasks.tag`, `tasks.qa`) and is skipped, saying so, where it is absent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bertforge import pipeline
from bertforge.cli import app
from bertforge.finetune import finetune
from bertforge.model import BertConfig, BertModel
from bertforge.tables import read_rows
from bertforge.tokenizer import BertTokenizer

GOOD = ["a gripping film", "beautifully acted and warm", "a joy to watch", "the best film this year"]
BAD = ["dull and slow", "a terrible ending", "the worst film this year", "boring , flat and long"]
TAGGED = [
    (["anna", "smith", "flew", "from", "paris", "to", "rome", "with", "bob", "."],
     ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-LOC", "O", "B-PER", "O"]),
    (["john", "lives", "in", "new", "york", "and", "works", "for", "acme", "."],
     ["B-PER", "O", "O", "B-LOC", "I-LOC", "O", "O", "O", "O", "O"]),
]
CONTEXT = "Anna Smith flew from Paris to Rome with Bob. She arrived in Rome on Monday."
QA_ROWS = [
    {"id": "q1", "question": "Where did Anna fly from?", "context": CONTEXT,
     "answers": {"text": ["Paris"], "answer_start": [21]}},
    {"id": "q2", "question": "Who flew with Anna?", "context": CONTEXT,
     "answers": {"text": ["Bob"], "answer_start": [40]}},
    {"id": "q3", "question": "What did Anna eat?", "context": CONTEXT, "answers": {"text": [], "answer_start": []}},
]
QUIET = {"progress": False, "verbose": False}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["predict", *map(str, args), "--no-progress"])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("own-data")
    words = " ".join(GOOD + BAD + [" ".join(t) for t, _ in TAGGED] + [CONTEXT, *(r["question"] for r in QA_ROWS)])
    (root / "corpus.txt").write_text((words + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([root / "corpus.txt"], vocab_size=200, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    return root / "encoder"


def _classify(encoder: Path, out: Path, rows: list[dict], **settings: object) -> Path:
    train = _jsonl(out.parent / f"{out.name}.jsonl", rows)
    finetune("classify", None, encoder, None, out, epochs=1, batch_size=4, max_length=24,
             task_settings={"train": str(train), "dev": str(train), **settings}, **QUIET)
    return out / "seed-1"


@pytest.mark.parametrize("kind", ["binary", "multi", "regression", "pairs"])
def test_classify_models_predict_as_fine_tuning_did(encoder: Path, tmp_path: Path, kind: str) -> None:
    pytest.importorskip("bertforge.tasks.classify", reason="the classify family is not in this checkout")
    texts = GOOD + BAD
    if kind == "binary":
        rows = [{"text": t, "label": "positive" if t in GOOD else "negative"} for t in texts]
    elif kind == "multi":
        rows = [{"text": t, "label": ["good" if t in GOOD else "bad"] + (["film"] if "film" in t else [])}
                for t in texts]
    elif kind == "regression":
        rows = [{"text": t, "label": 4.0 - 0.5 * i} for i, t in enumerate(texts)]
    else:
        rows = [{"text": a, "text_b": b, "label": "same" if (a in GOOD) == (b in GOOD) else "different"}
                for a, b in zip(texts, texts[1:] + texts[:1], strict=True)]
    seed = _classify(encoder, tmp_path / kind, rows, **({"pair_column": "text_b"} if kind == "pairs" else {}))
    gold = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
    inputs = [(r["text"], r["text_b"]) if kind == "pairs" else r["text"] for r in rows]
    mine = pipeline(seed)(inputs)
    for expected, result in zip(gold, mine, strict=True):
        if kind == "regression":
            assert math.isclose(result["value"], expected["score"], rel_tol=1e-5, abs_tol=1e-6)
        elif kind == "multi":
            assert result["labels"] == expected["labels"]
            assert "scores" not in result
        else:
            assert result["label"] == expected["label"]
            assert math.isclose(result["score"], expected["score"], rel_tol=1e-5)
    if kind == "multi":  # each label's sigmoid score, on request
        scored = pipeline(seed, all_scores=True)(inputs)
        assert all({s["label"] for s in r["scores"]} == {"good", "bad", "film"} for r in scored)
        assert [r["labels"] for r in scored] == [r["labels"] for r in mine]
    if kind != "binary":
        return
    source = _jsonl(tmp_path / "new.jsonl", [{"review": t} for t in texts])
    code, output = _cli("--model", seed, "--input", source, "--text-column", "review", "--out", tmp_path / "p.csv")
    assert code == 0, output
    assert [row.values["label"] for row in read_rows(tmp_path / "p.csv")] == [r["label"] for r in mine]
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed)) as client:
        served = client.post("/classify", json={"texts": texts}).json()["results"]
    assert [r["label"] for r in served] == [r["label"] for r in mine]
    assert {s["label"] for s in served[0]["scores"]} == {"negative", "positive"}


def test_tag_model_predicts_as_fine_tuning_did(encoder: Path, tmp_path: Path) -> None:
    tag = pytest.importorskip("bertforge.tasks.tag", reason="the tag family is not in this checkout")
    from_iob2 = tag.from_iob2
    bioes = [{"tokens": tokens, "tags": from_iob2(tags, "bioes")} for tokens, tags in TAGGED]
    train = _jsonl(tmp_path / "train.jsonl", bioes * 3)
    finetune("tag", "tag", encoder, None, tmp_path / "tag", epochs=1, batch_size=4, max_length=16,
             task_settings={"train": str(train), "dev": str(train)}, **QUIET)
    seed = tmp_path / "tag" / "seed-1"
    gold = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()][:len(TAGGED)]
    tagger = pipeline(seed)
    assert tagger.task == "token-classification" and tagger.spec.family == "tag"
    texts = [" ".join(tokens) for tokens, _ in TAGGED]
    prepared = tagger.prepare(texts)
    results = tagger.finish(prepared, tagger.run(prepared.features))
    for expected, result in zip(gold, results, strict=True):
        # the model tags in IOB2; fine-tuning writes them in the files' scheme (BIOES here)
        assert from_iob2([w["label"] for w in result["words"]], "bioes") == expected["tags"]
        assert all(math.isclose(w["score"], score, abs_tol=1e-5)
                   for w, score in zip(result["words"], expected["scores"], strict=True))
    code, output = _cli("--model", seed, "--input", _jsonl(tmp_path / "new.jsonl", [{"text": t} for t in texts]),
                        "--out", tmp_path / "p.jsonl")
    assert code == 0, output
    written = [json.loads(line)["entities"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert written == [r["entities"] for r in results]


def test_qa_model_predicts_as_fine_tuning_did(encoder: Path, tmp_path: Path) -> None:
    pytest.importorskip("bertforge.tasks.qa", reason="the qa family is not in this checkout")
    train = _jsonl(tmp_path / "train.jsonl", QA_ROWS)
    finetune("qa", "qa", encoder, None, tmp_path / "qa", epochs=1, batch_size=2, max_length=48,
             task_settings={"train": str(train), "dev": str(train), "doc_stride": 8}, **QUIET)
    seed = tmp_path / "qa" / "seed-1"
    gold = json.loads((seed / "predictions-dev.json").read_text())
    reader = pipeline(seed)
    assert reader.spec.family == "qa" and reader.spec.version == "2.0"
    answers = reader([{"question": r["question"], "context": r["context"]} for r in QA_ROWS])
    assert [a["answer"] for a in answers] == [gold[r["id"]] for r in QA_ROWS]
    source = _jsonl(tmp_path / "new.jsonl", [{k: r[k] for k in ("question", "context")} for r in QA_ROWS])
    code, output = _cli("--model", seed, "--input", source, "--out", tmp_path / "p.jsonl")
    assert code == 0, output
    assert [json.loads(line)["answer"] for line in (tmp_path / "p.jsonl").read_text().splitlines()] == \
        [a["answer"] for a in answers]
