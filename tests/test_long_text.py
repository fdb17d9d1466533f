"""Texts longer than a 512-position BERT model reads: truncated (the default, and reported) or classified
by overlapping windows whose logits are averaged (`long_text="windows"`, `predict --long-text windows`)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.model import BertConfig, BertForSequenceClassification
from bertforge.pipeline import InputError, pipeline
from bertforge.tokenizer import BertTokenizer

SENTENCES = ["the film was a gripping and beautifully acted story with a terrible ending but not dull at all",
             "zurich is the largest city in switzerland its airport opened in 1948",
             "and the normans gave their name to normandy"]
WORDS = [word for sentence in SENTENCES for word in sentence.split()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 512-position BERT classifier (two labels) with a small WordPiece vocabulary."""
    root = tmp_path_factory.mktemp("long-text")
    corpus = root / "corpus.txt"
    corpus.write_text(" ".join(WORDS) * 20 + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, extra={"num_labels": 2})
    BertForSequenceClassification(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def long_text(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def window_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    """The classifier's logits for one `[CLS] window [SEP]` row, run directly."""
    model = BertForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def test_windows_cover_the_whole_text_and_the_logits_are_their_mean(model_dir: Path) -> None:
    pipe = pipeline(model_dir, long_text="windows")
    assert pipe.max_length == 512 and pipe.window_stride == 255  # half of the 510 pieces a window holds
    text = long_text(900)
    pieces = pipe.tokenizer.encode(text, max_length=10**9, add_special_tokens=False).input_ids
    assert len(pieces) > 1000
    prepared = pipe.prepare([text])
    rows = [f.inputs["input_ids"] for f in prepared.features]
    assert prepared.info == [{"truncated": False, "windows": len(rows)}]
    cls_id, sep_id = pipe.tokenizer.cls_token_id, pipe.tokenizer.sep_token_id
    starts = [0]
    for row in rows:
        assert len(row) <= 512 and row[0] == cls_id and row[-1] == sep_id
    # every window is a run of the text's pieces; together they cover it, the last ending at its end
    for k, row in enumerate(rows):
        body = row[1:-1]
        start = starts[k] if k < len(starts) else None
        if start is None:
            start = len(pieces) - len(body) if k == len(rows) - 1 else k * 255
            starts.append(start)
        assert body == pieces[start:start + len(body)]
    assert starts[-1] + len(rows[-1]) - 2 == len(pieces)
    covered = set().union(*(range(s, s + len(r) - 2) for s, r in zip(starts, rows, strict=True)))
    assert covered == set(range(len(pieces)))

    expected = np.mean([window_logits(model_dir, row) for row in rows], axis=0)
    result = pipe.finish(prepared, pipe.run(prepared.features))[0]
    probabilities = np.exp(expected - expected.max()) / np.exp(expected - expected.max()).sum()
    assert result["windows"] == len(rows) and result["truncated"] is False
    assert result["label"] == f"LABEL_{int(np.argmax(expected))}"
    assert result["score"] == pytest.approx(float(probabilities.max()), abs=1e-5)


def test_a_text_that_fits_gets_the_same_answer_either_way(model_dir: Path) -> None:
    short = [long_text(40, seed=1), long_text(300, seed=2)]
    windows = pipeline(model_dir, long_text="windows")(short)
    truncate = pipeline(model_dir)(short)
    for a, b in zip(windows, truncate, strict=True):
        assert a["label"] == b["label"] and a["score"] == pytest.approx(b["score"], abs=1e-6)


def test_truncation_stays_the_default_and_is_reported(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    pipe = pipeline(model_dir)
    text = long_text(900)
    prepared = pipe.prepare([text, "a short one"])
    assert [i["truncated"] for i in prepared.info] == [True, False]
    assert len(prepared.features) == 2 and prepared.features[0].length == 512
    with caplog.at_level(logging.WARNING, logger="bertforge.pipeline"):
        pipe([text, "a short one"])
    assert "1 of 2 inputs were longer than 512 pieces and were truncated" in caplog.text
    assert "long_text='windows'" in caplog.text


def test_predict_counts_truncated_rows_and_reads_them_whole_with_windows(model_dir: Path, tmp_path: Path) -> None:
    texts = [long_text(900, seed=3), "not dull at all", long_text(700, seed=4)]
    source = tmp_path / "long.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    runner = CliRunner()
    cut = runner.invoke(app, ["predict", "--model", str(model_dir), "--input", str(source), "--out",
                              str(tmp_path / "cut.jsonl"), "--no-progress"])
    assert cut.exit_code == 0, cut.output
    assert "warning: 2 rows were longer than 512 pieces and were truncated (--long-text windows" in cut.output
    whole = runner.invoke(app, ["predict", "--model", str(model_dir), "--input", str(source), "--out",
                                str(tmp_path / "whole.jsonl"), "--no-progress", "--long-text", "windows",
                                "--window-stride", "400"])
    assert whole.exit_code == 0, whole.output
    assert "2 rows were longer than 512 pieces and were read in windows (stride 400)" in whole.output
    assert "were truncated" not in whole.output
    rows = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    expected = pipeline(model_dir, long_text="windows", window_stride=400)(texts)
    assert [r["label"] for r in rows] == [e["label"] for e in expected]
    assert [r["score"] for r in rows] == pytest.approx([e["score"] for e in expected], abs=1e-6)


def test_windows_refuse_what_they_cannot_do(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="long_text must be one of truncate, windows"):
        pipeline(model_dir, long_text="chunks")
    with pytest.raises(ValueError, match="window_stride 600 is longer than a window"):
        pipeline(model_dir, long_text="windows", window_stride=600)
    with pytest.raises(ValueError, match="is for text-classification"):
        pipeline(model_dir, task="embeddings", long_text="windows")
    with pytest.raises(InputError, match="reads single texts; this input has a text_pair"):
        pipeline(model_dir, long_text="windows")([("a text", "and its pair")])


def test_serve_classifies_long_texts_as_predict_does(model_dir: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    texts = [long_text(900, seed=5), "not dull at all"]
    expected = {mode: pipeline(model_dir, long_text=mode)(texts) for mode in ("truncate", "windows")}
    for mode in ("truncate", "windows"):
        with TestClient(create_app(model_dir, long_text=mode)) as client:
            response = client.post("/classify", json={"texts": texts})
        assert response.status_code == 200, response.text
        served = response.json()["results"]
        assert [r["truncated"] for r in served] == ([True, False] if mode == "truncate" else [False, False])
        assert [r["label"] for r in served] == [e["label"] for e in expected[mode]]
        assert [r["score"] for r in served] == pytest.approx([e["score"] for e in expected[mode]], abs=1e-6)
